"""Train the project's own emotion classifier on FER2013's training split and export it to ONNX (issue 13).

Runs where PyTorch is (the GPU machine; `pip install -r requirements-train.txt` elsewhere):

    python tools/train_emotion.py --data ../shared/data/train/fer2013_train_jpeg.npz --out runs/resnet_s \\
        --arch resnet_s --epochs 60

What it does, and why:

* **Data**: the whole FER2013 *training* split (28,709 48x48 grey crops). A fixed, stratified validation hold-out
  (`--val-fraction`, default 10 %, chosen by `--split-seed`) is carved from it and never trained on; it is what
  architectures, epochs and the temperature are chosen on. FER2013's test split is not read here, ever.
* **Augmentation on the GPU, mimicking what the pipeline feeds the model**: our box crop of a RetinaFace box varies
  in scale and position from frame to frame, faces tilt, cameras blur and expose differently, and people face both
  ways. So: random scale 0.85-1.15, shift up to 8 % of the side, rotation up to 10 degrees, horizontal flip, brightness
  and contrast 0.7-1.3, a light blur on a fifth of the images. All of it is one `affine_grid` + `grid_sample` and a
  few tensor ops per batch, so the whole split lives in GPU memory and no data loader workers are needed.
* **Class balance**: disgust has 436 images against happy's 7,215. Batches are drawn with weights proportional to
  1/sqrt(class count) (full inverse frequency over-fits disgust's 436 faces), plus label smoothing.
* **Selection**: the checkpoint with the best validation accuracy (flip-averaged, as the pipeline will run it).
* **Calibration**: a temperature fitted on the validation hold-out (minimum NLL), baked into the exported graph
  (softmax(logits / T)), so the behaviour mapper's min_confidence means the same for any model; the expected
  calibration error before and after goes into the model card.
* **Export**: `model.onnx` and `model.fp16w.onnx` (the same network with its weights stored in float16: the file
  committed under models/weights/, see tools/onnx_fp16_weights.py), ONNX taking float NCHW [N, 1, S, S] normalised
  as (x/255 - 0.5)/0.5 and giving probabilities in FER2013's label order, exactly the contract of raw_input in
  `models/<name>.yaml`; prepare-models bakes the uint8 input and normalisation in, as for the other models.

Everything random is seeded (`--seed`); `model_card.json` next to the ONNX records the command, data hash, figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx_fp16_weights import store_weights_fp16  # tools/ beside this script
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for the shared hold-out split
from pipeline.tools.fer_npz import (  # noqa: E402 - after the path that makes it importable
    HOLDOUT_FRACTION,
    HOLDOUT_SEED,
    BundleError,
    load_bundle,
    stratified_split,
)

log = logging.getLogger("train_emotion")

LABELS = ("angry", "disgust", "fear", "happy", "sad", "surprise", "neutral")


# ----------------------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Split:
    """Decoded images (uint8 [N, 48, 48]) and labels (int64 [N]) of one part of the training split."""

    images: np.ndarray
    labels: np.ndarray


def load_fer_train(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """All images of the npz (JPEG bytes + offsets, see ../shared/data/README.md), decoded, with labels."""
    try:
        bundle = load_bundle(path)
    except BundleError as exc:
        raise SystemExit(str(exc)) from exc
    if bundle.label_names != LABELS:
        raise SystemExit(f"{path}: label_names {list(bundle.label_names)} are not {list(LABELS)}")
    if bundle.images.shape[1:] != (48, 48):
        raise SystemExit(f"{path}: images are {bundle.images.shape[1:]}, not 48x48 grey")
    return bundle.images, bundle.labels, list(bundle.label_names)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------------- augmentation
def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """uint8-valued float pixels → the network's input, (x/255 - 0.5)/0.5 (what the manifest's raw_input says)."""
    return (pixels / 255.0 - 0.5) / 0.5


def resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """[B, 48, 48] uint8 → [B, 1, size, size] float pixels, bilinear (as the pipeline resizes its crops)."""
    x = images.unsqueeze(1).float()
    return x if size == x.shape[-1] else F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)


def augment(images: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """A batch of [B, 48, 48] uint8 images → randomly framed, tilted, flipped, lit and blurred float pixels."""
    batch, device = images.shape[0], images.device

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.rand(batch, device=device, generator=generator) * (high - low) + low

    scale, angle = uniform(0.85, 1.15), uniform(-10.0, 10.0) * math.pi / 180
    shift_x, shift_y = uniform(-0.08, 0.08) * 2, uniform(-0.08, 0.08) * 2  # affine_grid works in [-1, 1]
    flip = torch.where(torch.rand(batch, device=device, generator=generator) < 0.5, -1.0, 1.0)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos * flip, -sin, shift_x], 1), torch.stack([sin * flip, cos, shift_y], 1)], 1)
    grid = F.affine_grid(theta, [batch, 1, size, size], align_corners=False)
    x = F.grid_sample(images.unsqueeze(1).float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = (x - mean) * uniform(0.7, 1.3).view(-1, 1, 1, 1) + mean * uniform(0.7, 1.3).view(-1, 1, 1, 1)
    blur = torch.rand(batch, device=device, generator=generator) < 0.2
    if bool(blur.any()):
        kernel = torch.tensor([1.0, 2.0, 1.0], device=device)
        kernel = (kernel[:, None] * kernel[None, :] / 16.0).view(1, 1, 3, 3)
        x = torch.where(blur.view(-1, 1, 1, 1), F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), kernel), x)
    return x.clamp(0.0, 255.0)


def erase(x: torch.Tensor, probability: float, generator: torch.Generator) -> torch.Tensor:
    """Random erasing: on a share of the images, one rectangle (2-25 % of the area, aspect 1:3 to 3:1) filled with
    one random grey. A hand, a microphone or a shadow hides part of a visitor's face; FER2013 rarely shows that."""
    batch, size, device = x.shape[0], x.shape[-1], x.device

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.rand(batch, device=device, generator=generator) * (high - low) + low

    area, aspect = uniform(0.02, 0.25), torch.exp(uniform(math.log(1 / 3), math.log(3)))
    height = (torch.sqrt(area * aspect) * size).clamp(1, size)
    width = (torch.sqrt(area / aspect) * size).clamp(1, size)
    top, left = uniform(0, 1) * (size - height), uniform(0, 1) * (size - width)
    rows = torch.arange(size, device=device).view(1, size, 1)
    cols = torch.arange(size, device=device).view(1, 1, size)
    inside = ((rows >= top.view(-1, 1, 1)) & (rows < (top + height).view(-1, 1, 1))
              & (cols >= left.view(-1, 1, 1)) & (cols < (left + width).view(-1, 1, 1)))
    chosen = (torch.rand(batch, device=device, generator=generator) < probability).view(-1, 1, 1)
    fill = uniform(0.0, 255.0).view(-1, 1, 1, 1)
    return torch.where((inside & chosen).unsqueeze(1), fill, x)


# ---------------------------------------------------------------------------------------------------- networks
class Block(nn.Module):
    """A ResNet basic block (two 3x3 convolutions, batch norm, identity or 1x1 shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential() if stride == 1 and cin == cout else
                      nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNetS(nn.Module):
    """A small ResNet for 48-64 px grey faces: a 3x3 stem (stride 2 halves every later cost), four stages of
    `depth` blocks, global pooling, dropout."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256), classes: int = len(LABELS), stem_stride: int = 1,
                 depth: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, stem_stride, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        stages, cin = [], widths[0]
        for index, width in enumerate(widths):
            stride = 1 if index == 0 else 2
            stages += [Block(cin, width, stride), *[Block(width, width, 1) for _ in range(depth - 1)]]
            cin = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(cin, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


class VggS(nn.Module):
    """VGG-style: four stages of two 3x3 conv + BN + ReLU and a max pool, then a small classifier."""

    def __init__(self, widths: tuple[int, ...] = (48, 96, 192, 384), classes: int = len(LABELS)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 1
        for width in widths:
            for _ in range(2):
                layers += [nn.Conv2d(cin, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
                cin = width
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.4), nn.Linear(cin, 256),
                                  nn.ReLU(), nn.Dropout(0.4), nn.Linear(256, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


ARCHITECTURES = {
    "resnet_t": lambda: ResNetS((32, 64, 128, 256), stem_stride=2),
    "resnet_t1": lambda: ResNetS((32, 64, 128, 256), stem_stride=2, depth=1),
    "resnet_s": lambda: ResNetS((32, 64, 128, 256)),
    "resnet_m": lambda: ResNetS((48, 96, 192, 384)),
    "vgg_s": lambda: VggS((48, 96, 192, 384)),
}


class Exported(nn.Module):
    """What goes into the ONNX file: the network, its calibration temperature, and a softmax."""

    def __init__(self, net: nn.Module, temperature: float) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("inv_temperature", torch.tensor(1.0 / temperature))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(x) * self.inv_temperature, dim=1)


# ------------------------------------------------------------------------------------------------- training
@dataclass
class Settings:
    arch: str
    size: int
    epochs: int
    batch: int
    lr: float
    weight_decay: float
    smoothing: float
    seed: int
    distill_weight: float = 0.0
    distill_temperature: float = 4.0
    ema: float = 0.0  # decay of an exponential moving average of the weights (0: none); the average is what is kept
    mixup: float = 0.0  # alpha of mixup's Beta(alpha, alpha) blend of image pairs (0: none)
    erase: float = 0.0  # share of training images with one random rectangle erased (0: none)


def sampling_weights(labels: np.ndarray) -> np.ndarray:
    """Per-image draw weights ∝ 1/sqrt(class count): rare classes seen more often, not as often as common ones."""
    counts = np.bincount(labels, minlength=len(LABELS)).astype(np.float64)
    weights = 1.0 / np.sqrt(counts[labels])
    return weights / weights.sum()


def logits_of(net: nn.Module, images: torch.Tensor, size: int, flip: bool, batch: int = 1024) -> torch.Tensor:
    """Logits of uint8 images [N, 48, 48] (no augmentation), averaged with the mirror image's when `flip`."""
    net.eval()
    outputs = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            x = normalise(resize_batch(images[start:start + batch], size))
            logits = net(x).float()
            if flip:
                logits = (logits + net(torch.flip(x, dims=[3])).float()) / 2
            outputs.append(logits)
    return torch.cat(outputs)


@dataclass(frozen=True)
class Teacher:
    """Trained networks whose averaged softened probabilities the student also learns from (knowledge distillation):
    a small network that must run in 2 ms on a CPU learns more from soft labels than from hard ones, and an ensemble
    of several runs gives better soft labels than any one of them."""

    nets: tuple[nn.Module, ...]
    sizes: tuple[int, ...]

    def log_probs(self, x: torch.Tensor, temperature: float) -> torch.Tensor:
        """log of the members' mean softmax(logits / temperature) for a batch the student sees (each member gets it
        resized to its own input side)."""
        logits = []
        with torch.no_grad():
            for net, size in zip(self.nets, self.sizes):
                seen = x if x.shape[-1] == size else F.interpolate(x, size=(size, size), mode="bilinear",
                                                                   align_corners=False)
                logits.append(net(seen).float() / temperature)
        if len(logits) == 1:  # one teacher: exactly what the runs distilled from one network computed
            return F.log_softmax(logits[0], 1)
        return torch.log(torch.stack([F.softmax(z, 1) for z in logits]).mean(0).clamp_min(1e-8))

    def accuracy(self, val_set: Split, device: torch.device) -> float:
        """The ensemble's own flip-averaged hold-out accuracy (mean of the members' probabilities)."""
        images = torch.from_numpy(val_set.images).to(device)
        probs = sum(F.softmax(logits_of(net, images, size, True), 1) for net, size in zip(self.nets, self.sizes))
        labels = torch.from_numpy(val_set.labels).to(device)
        return float((probs.argmax(1) == labels).float().mean())


def load_teacher(folders: list[Path], device: torch.device) -> Teacher:
    """The networks saved by earlier runs in `folders` (each one's checkpoint.pt), frozen."""
    nets, sizes = [], []
    for folder in folders:
        checkpoint = torch.load(folder / "checkpoint.pt", map_location=device)
        net = ARCHITECTURES[checkpoint["arch"]]().to(device)
        net.load_state_dict(checkpoint["state"])
        nets.append(net.eval())
        sizes.append(int(checkpoint["size"]))
    return Teacher(tuple(nets), tuple(sizes))


def mixed(x: torch.Tensor, labels: torch.Tensor, alpha: float, generator: torch.Generator,
          rng: np.random.RandomState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """mixup: each image blended with another of the batch, lam ~ Beta(alpha, alpha) (seeded); the loss weighs both
    labels by lam and 1 - lam. Returns (images, labels, partner labels, lam)."""
    lam = float(rng.beta(alpha, alpha))
    partner = torch.randperm(len(x), generator=generator, device=x.device)
    return lam * x + (1 - lam) * x[partner], labels, labels[partner], lam


def batch_loss(net: nn.Module, x: torch.Tensor, labels: torch.Tensor, settings: Settings,
               teacher: Teacher | None, partner: torch.Tensor | None = None, lam: float = 1.0) -> torch.Tensor:
    """Label-smoothed cross-entropy (of both labels, weighed by lam, under mixup), blended with the KL divergence to
    the teacher's softened output if any."""
    logits = net(x).float()
    loss = F.cross_entropy(logits, labels, label_smoothing=settings.smoothing)
    if partner is not None:
        loss = lam * loss + (1 - lam) * F.cross_entropy(logits, partner, label_smoothing=settings.smoothing)
    if teacher is None or settings.distill_weight <= 0:
        return loss
    t = settings.distill_temperature
    soft = F.kl_div(F.log_softmax(logits / t, 1), teacher.log_probs(x, t), reduction="batchmean",
                    log_target=True) * t * t
    return (1 - settings.distill_weight) * loss + settings.distill_weight * soft


def train(settings: Settings, train_set: Split, val_set: Split, device: torch.device,
          teacher: Teacher | None = None) -> tuple[nn.Module, dict]:
    """Train with SGD + one-cycle schedule; keep the state with the best flip-averaged validation accuracy."""
    torch.manual_seed(settings.seed)
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    net = ARCHITECTURES[settings.arch]().to(device)
    images = torch.from_numpy(train_set.images).to(device)
    labels = torch.from_numpy(train_set.labels).to(device)
    val_images = torch.from_numpy(val_set.images).to(device)
    val_labels = torch.from_numpy(val_set.labels).to(device)
    weights = torch.from_numpy(sampling_weights(train_set.labels)).to(device)
    steps = max(1, len(images) // settings.batch)
    optimiser = torch.optim.SGD(net.parameters(), lr=settings.lr, momentum=0.9, nesterov=True,
                                weight_decay=settings.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, settings.lr, total_steps=settings.epochs * steps,
                                                   pct_start=0.15)
    kept = averaged(net, settings.ema)  # what is evaluated and exported: the net, or its moving average
    mix_rng = np.random.RandomState(settings.seed)
    best: dict = {"val_acc": -1.0}
    for epoch in range(settings.epochs):
        net.train()
        started, total = time.monotonic(), 0.0
        for _ in range(steps):
            pick = torch.multinomial(weights, settings.batch, replacement=True, generator=generator)
            x = augment(images[pick], settings.size, generator)
            if settings.erase > 0:
                x = erase(x, settings.erase, generator)
            x, y, partner, lam = normalise(x), labels[pick], None, 1.0
            if settings.mixup > 0:
                x, y, partner, lam = mixed(x, y, settings.mixup, generator, mix_rng)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = batch_loss(net, x, y, settings, teacher, partner, lam)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            if kept is not net:
                kept.update_parameters(net)  # type: ignore[operator]
            total += float(loss.detach())
        model = kept.module if kept is not net else net
        accuracy = float((logits_of(model, val_images, settings.size, True).argmax(1) == val_labels).float().mean())
        log.info("epoch %d/%d: loss %.4f, validation %.2f %% (flip), %.1f s", epoch + 1, settings.epochs,
                 total / steps, 100 * accuracy, time.monotonic() - started)
        if accuracy > best["val_acc"]:
            best = {"val_acc": accuracy, "epoch": epoch + 1,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    net.load_state_dict(best.pop("state"))
    return net, best


def averaged(net: nn.Module, decay: float) -> nn.Module:
    """An exponential moving average of `net`'s weights and BatchNorm statistics (decay per step), or `net` itself
    when decay is 0. The average of the last few thousand steps usually generalises better than the last step."""
    if decay <= 0:
        return net
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    return AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


# ----------------------------------------------------------------------------------------------- calibration
def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    """ECE: the gap between confidence and accuracy, averaged over equal-width confidence bins by their size."""
    confidence, predicted = probs.max(1)
    correct = (predicted == labels).float()
    edges = torch.linspace(0, 1, bins + 1, device=probs.device)
    error = torch.zeros((), device=probs.device)
    for low, high in zip(edges[:-1], edges[1:]):
        inside = (confidence > low) & (confidence <= high)
        if bool(inside.any()):
            error += inside.float().mean() * (confidence[inside].mean() - correct[inside].mean()).abs()
    return float(error)


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature T minimising the validation NLL of softmax(logits / T) (LBFGS on log T)."""
    log_t = torch.zeros(1, device=logits.device, requires_grad=True)
    optimiser = torch.optim.LBFGS([log_t], lr=0.1, max_iter=100)

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss
    optimiser.step(closure)
    return float(log_t.exp())


def per_class_recall(predicted: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    return {name: round(float((predicted[labels == k] == k).float().mean()), 4)
            for k, name in enumerate(LABELS) if bool((labels == k).any())}


def evaluate(net: nn.Module, val_set: Split, size: int, device: torch.device) -> tuple[float, dict]:
    """Temperature and the validation figures for the model card (with and without flip, ECE before/after)."""
    images = torch.from_numpy(val_set.images).to(device)
    labels = torch.from_numpy(val_set.labels).to(device)
    plain, flipped = logits_of(net, images, size, False), logits_of(net, images, size, True)
    temperature = fit_temperature(flipped, labels)
    figures = {
        "val_images": len(labels),
        "val_acc": round(float((plain.argmax(1) == labels).float().mean()), 4),
        "val_acc_flip": round(float((flipped.argmax(1) == labels).float().mean()), 4),
        "recall_flip": per_class_recall(flipped.argmax(1), labels),
        "temperature": round(temperature, 4),
        "ece_before": round(expected_calibration_error(torch.softmax(flipped, 1), labels), 4),
        "ece_after": round(expected_calibration_error(torch.softmax(flipped / temperature, 1), labels), 4),
    }
    return temperature, figures


# ---------------------------------------------------------------------------------------------------- export
def export_onnx(net: nn.Module, temperature: float, size: int, path: Path) -> None:
    """ONNX (opset 17) with a dynamic batch: float NCHW [N, 1, size, size] in, probabilities [N, 7] out."""
    model = Exported(net.float().cpu().eval(), temperature).eval()
    example = torch.zeros(1, 1, size, size)
    torch.onnx.export(model, (example,), str(path), input_names=["input"], output_names=["probs"], opset_version=17,
                      dynamic_axes={"input": {0: "batch"}, "probs": {0: "batch"}}, dynamo=False)


def check_export(net: nn.Module, temperature: float, size: int, path: Path, val_set: Split) -> float:
    """Largest difference between ONNX Runtime's probabilities and PyTorch's on 256 validation images."""
    import onnxruntime as ort

    images = torch.from_numpy(val_set.images[:256])
    x = normalise(resize_batch(images, size))
    with torch.no_grad():
        expected = Exported(net.float().cpu().eval(), temperature).eval()(x).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["probs"], {"input": x.numpy()})[0]
    return float(np.abs(got - expected).max())


# ------------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="fer2013_train_jpeg.npz (FER2013's training split)")
    parser.add_argument("--out", type=Path, required=True, help="folder for model.onnx and model_card.json")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="resnet_s", help="network (default resnet_s)")
    parser.add_argument("--size", type=int, default=48, help="input side in pixels (default 48)")
    parser.add_argument("--epochs", type=int, default=60, help="training epochs (default 60)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--lr", type=float, default=0.1, help="peak learning rate of the one-cycle schedule")
    parser.add_argument("--weight-decay", type=float, default=5e-4, help="SGD weight decay (default 5e-4)")
    parser.add_argument("--smoothing", type=float, default=0.1, help="label smoothing (default 0.1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation, sampling and augmentation")
    parser.add_argument("--teacher", type=Path, nargs="+", help="earlier runs' --out folders to distil from (each "
                        "one's checkpoint.pt; several: their averaged probabilities, an ensemble)")
    parser.add_argument("--distill-weight", type=float, default=0.5, help="share of the teacher's loss (0.5)")
    parser.add_argument("--distill-temperature", type=float, default=4.0, help="softening of both outputs (4)")
    parser.add_argument("--ema", type=float, default=0.0, help="keep an exponential moving average of the weights "
                        "with this decay per step, e.g. 0.999 (default 0: the weights themselves)")
    parser.add_argument("--mixup", type=float, default=0.0, help="mixup alpha, e.g. 0.2 (default 0: no mixup)")
    parser.add_argument("--erase", type=float, default=0.0, help="share of images with a random rectangle erased, "
                        "e.g. 0.5 (default 0: none)")
    parser.add_argument("--val-fraction", type=float, default=HOLDOUT_FRACTION,
                        help=f"validation hold-out per class ({HOLDOUT_FRACTION}; `analyze --holdout` scores it)")
    parser.add_argument("--split-seed", type=int, default=HOLDOUT_SEED,
                        help=f"seed of the hold-out ({HOLDOUT_SEED}; keep it fixed)")
    parser.add_argument("--limit", type=int, default=0, help="use only N random images (a smoke test)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    images, labels, _ = load_fer_train(args.data)
    if args.limit:  # a random subset: the file is ordered by class, so its first N images are all one emotion
        keep = np.sort(np.random.RandomState(args.split_seed).permutation(len(labels))[: args.limit])
        images, labels = images[keep], labels[keep]
    train_idx, val_idx = stratified_split(labels, args.val_fraction, args.split_seed, len(LABELS))
    train_set, val_set = Split(images[train_idx], labels[train_idx]), Split(images[val_idx], labels[val_idx])
    log.info("%d training images, %d held out for validation", len(train_idx), len(val_idx))
    settings = Settings(args.arch, args.size, args.epochs, args.batch, args.lr, args.weight_decay, args.smoothing,
                        args.seed, args.distill_weight if args.teacher else 0.0, args.distill_temperature,
                        args.ema, args.mixup, args.erase)
    device = torch.device(args.device)
    teacher = load_teacher(args.teacher, device) if args.teacher else None
    if teacher is not None:
        log.info("teacher: %d network(s), hold-out %.2f %% (flip)", len(teacher.nets),
                 100 * teacher.accuracy(val_set, device))
    started = time.monotonic()
    net, best = train(settings, train_set, val_set, device, teacher)
    temperature, figures = evaluate(net, val_set, args.size, device)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save({"arch": args.arch, "size": args.size, "temperature": temperature, "state": net.state_dict()},
               args.out / "checkpoint.pt")  # first, so that a failed export loses no training
    onnx_path = args.out / "model.onnx"
    export_onnx(net, temperature, args.size, onnx_path)
    card = {"command": " ".join(["python", "tools/train_emotion.py", *(sys.argv[1:] if argv is None else argv)]),
            "settings": vars(settings), "teacher": [str(t) for t in args.teacher or []],
            "best_epoch": best["epoch"], "figures": figures,
            "parameters": sum(p.numel() for p in net.parameters()),
            "data": {"file": args.data.name, "sha256": file_sha256(args.data), "split_seed": args.split_seed,
                     "val_fraction": args.val_fraction, "limit": args.limit},
            "onnx_sha256": file_sha256(onnx_path), "onnx_max_abs_diff": check_export(net, temperature, args.size,
                                                                                     onnx_path, val_set),
            "torch": torch.__version__, "device": str(device), "train_s": round(time.monotonic() - started, 1),
            "date": time.strftime("%Y-%m-%d")}
    (args.out / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    onnx.save(store_weights_fp16(onnx.load(str(onnx_path))), str(args.out / "model.fp16w.onnx"))  # what is committed
    log.info("validation %.2f %% (flip %.2f %%), T %.3f, ECE %.4f -> %.4f; %s", 100 * figures["val_acc"],
             100 * figures["val_acc_flip"], temperature, figures["ece_before"], figures["ece_after"], onnx_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
