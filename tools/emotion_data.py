"""Training data for tools/train_emotion.py: bundles of labelled grey face crops on the GPU, their hold-outs, and the
augmentation that makes them look like what the pipeline feeds the model.

Two kinds of bundle (../shared/data/train/, both read by `pipeline.tools.fer_npz`):

* FER2013's training split: 48x48 web crops whose framing is the pipeline's box crop at margin 0; used whole.
* photo bundles (`mux_dwdii_112.npz`): 112x112 crops cut by the pipeline's own detector with box margin 0.25, so the
  face box is their central 1/1.5. The network sees that central part (the pipeline's default crop), and the extra
  border gives the random framing real pixels where FER2013's crops can only repeat their edge.

Each bundle keeps its own hold-out (`fer_npz.split_bundle`: by class for FER2013, by person for photos), the one
`run_pipeline.py analyze --cropped --holdout` scores, and is validated on separately: one figure per kind of face.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root: the pipeline's own split functions
from pipeline.core.types import EMOTIONS as LABELS  # noqa: E402 - FER2013's order, the networks' outputs
from pipeline.tools.fer_npz import BundleError, CropBundle, load_bundle, split_bundle  # noqa: E402


@dataclass(frozen=True)
class Split:
    """Decoded crops (uint8 [N, H, W]) and labels (int64 [N]) of one part of one bundle, and `framing`: the share of
    the crop's side that is the pipeline's crop (1 for FER2013, 1/1.5 for photos cut at margin 0.25)."""

    images: np.ndarray
    labels: np.ndarray
    framing: float = 1.0
    name: str = "fer2013"


@dataclass(frozen=True)
class Bundle:
    """One training bundle, split: what is trained on and what is held out."""

    train: Split
    val: Split


def framing_of(bundle: CropBundle, box_margin: float = 0.0) -> float:
    """The share of a stored crop's side that the pipeline's box crop at `box_margin` takes."""
    if bundle.box_margin is None:
        return 1.0
    return (1.0 + 2.0 * box_margin) / (1.0 + 2.0 * bundle.box_margin)


def load_split_bundle(path: Path, val_fraction: float, split_seed: int, limit: int = 0) -> Bundle:
    """A bundle decoded and split into training and hold-out parts (`limit`: N random crops, a smoke test)."""
    try:
        bundle = load_bundle(path)
    except BundleError as exc:
        raise SystemExit(str(exc)) from exc
    if bundle.label_names != LABELS:
        raise SystemExit(f"{path}: label_names {list(bundle.label_names)} are not {list(LABELS)}")
    if limit:  # a random subset: the files are ordered by class or by name, so their first N crops are not a sample
        bundle = bundle.subset(np.sort(np.random.RandomState(split_seed).permutation(len(bundle))[:limit]))
    train_idx, val_idx = split_bundle(bundle, val_fraction, split_seed)
    framing, name = framing_of(bundle), "fer2013" if bundle.sources is None else Path(path).stem
    return Bundle(Split(bundle.images[train_idx], bundle.labels[train_idx], framing, name),
                  Split(bundle.images[val_idx], bundle.labels[val_idx], framing, name))


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """uint8-valued float pixels → the network's input, (x/255 - 0.5)/0.5 (what the manifest's raw_input says)."""
    return (pixels / 255.0 - 0.5) / 0.5


def view(images: torch.Tensor, size: int, framing: float = 1.0) -> torch.Tensor:
    """[B, H, W] uint8 crops → [B, 1, size, size] float pixels as the pipeline frames them, bilinear: the whole crop
    (framing 1), or its central `framing` share."""
    x = images.unsqueeze(1).float()
    if framing == 1.0:
        return x if size == x.shape[-1] else F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    theta = torch.tensor([[framing, 0.0, 0.0], [0.0, framing, 0.0]], device=x.device).expand(len(x), 2, 3)
    grid = F.affine_grid(theta, [len(x), 1, size, size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def augment(images: torch.Tensor, size: int, generator: torch.Generator, framing: float = 1.0) -> torch.Tensor:
    """A batch of [B, H, W] uint8 crops → randomly framed, tilted, flipped, lit and blurred float pixels.

    Why these: our box crop of a RetinaFace box varies in scale and position from frame to frame, faces tilt,
    cameras blur and expose differently, and people face both ways. `framing` scales the whole sampling window
    (the pipeline's crop is the central `framing` share of a photo crop)."""
    batch, device = images.shape[0], images.device

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.rand(batch, device=device, generator=generator) * (high - low) + low

    scale, angle = uniform(0.85, 1.15), uniform(-10.0, 10.0) * math.pi / 180
    shift_x, shift_y = uniform(-0.08, 0.08) * 2, uniform(-0.08, 0.08) * 2  # affine_grid works in [-1, 1]
    flip = torch.where(torch.rand(batch, device=device, generator=generator) < 0.5, -1.0, 1.0)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos * flip, -sin, shift_x], 1), torch.stack([sin * flip, cos, shift_y], 1)], 1)
    if framing != 1.0:
        theta = theta * framing
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


def sampling_weights(labels: np.ndarray, sources: np.ndarray | None = None,
                     source_weights: tuple[float, ...] = (), per_bundle: bool = False) -> np.ndarray:
    """Per-image draw weights ∝ 1/sqrt(class count) (rare classes seen more often, not as often as common ones),
    times each image's bundle weight (`source_weights[sources[i]]`) when several bundles are mixed.

    The class counts are pooled over the bundles, or (`per_bundle`) each bundle's own: then a bundle whose crops
    are mostly one class (the photos: half neutral) does not teach that its kind of picture means that class."""
    if per_bundle and sources is not None:
        keys = sources * len(LABELS) + labels
        counts = np.bincount(keys, minlength=(sources.max() + 1) * len(LABELS)).astype(np.float64)
        weights = 1.0 / np.sqrt(counts[keys])
    else:
        counts = np.bincount(labels, minlength=len(LABELS)).astype(np.float64)
        weights = 1.0 / np.sqrt(counts[labels])
    if sources is not None and source_weights:
        weights = weights * np.asarray(source_weights, np.float64)[sources]
    return weights / weights.sum()


class TrainingSet:
    """Every bundle's training crops on one device, drawn together by `sampling_weights`, each augmented with its
    own framing. With one bundle a draw is exactly what the FER2013-only recipe drew."""

    def __init__(self, splits: list[Split], device: torch.device, source_weights: tuple[float, ...] = (),
                 per_bundle: bool = False) -> None:
        self.framings = [split.framing for split in splits]
        self.images = [torch.from_numpy(split.images).to(device) for split in splits]
        labels = np.concatenate([split.labels for split in splits])
        sources = np.concatenate([np.full(len(split.labels), k) for k, split in enumerate(splits)])
        self.labels = torch.from_numpy(labels).to(device)
        self.sources = torch.from_numpy(sources).to(device)
        self.starts = np.cumsum([0, *[len(split.labels) for split in splits]])
        self.weights = torch.from_numpy(sampling_weights(labels, sources, source_weights, per_bundle)).to(device)

    def __len__(self) -> int:
        return len(self.labels)

    def draw(self, batch: int, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of augmented float pixels [B, 1, size, size] and its labels."""
        pick = torch.multinomial(self.weights, batch, replacement=True, generator=generator)
        if len(self.images) == 1:
            return augment(self.images[0][pick], size, generator, self.framings[0]), self.labels[pick]
        pick = pick.sort().values  # grouped by bundle (the concatenation's order)
        parts = []
        for k, images in enumerate(self.images):
            mine = pick[self.sources[pick] == k]
            if len(mine):
                parts.append(augment(images[mine - int(self.starts[k])], size, generator, self.framings[k]))
        return torch.cat(parts), self.labels[pick]
