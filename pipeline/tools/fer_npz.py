"""FER2013's training split as an .npz of JPEG crops (../shared/data/README.md: `jpeg`, `offsets`, `labels`,
`label_names`), and the validation hold-out that `tools/train_emotion.py` keeps out of training.

Why one module for both: the hold-out figures of a model (issue 13's first target) are only honest if `analyze
--holdout` scores exactly the crops the training never saw. Training imports `stratified_split` and the hold-out's
constants from here, so the two cannot drift apart.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

HOLDOUT_FRACTION = 0.1  # of every class
HOLDOUT_SEED = 20261201  # keep it fixed: the published hold-out figures are on this split


class BundleError(ValueError):
    """An .npz that is not a bundle of face crops in this layout; the message names the file and what is wrong."""


@dataclass(frozen=True)
class CropBundle:
    """Grey face crops with their labels (indices into `label_names`) and their positions in the file."""

    images: np.ndarray  # [N, H, W] uint8
    labels: np.ndarray  # [N] int64
    label_names: tuple[str, ...]
    positions: np.ndarray  # [N] int64: where each crop is in the .npz (a subset keeps them)

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: np.ndarray) -> CropBundle:
        return CropBundle(self.images[indices], self.labels[indices], self.label_names, self.positions[indices])


def load_bundle(path: Path) -> CropBundle:
    """Every crop of the .npz, decoded to grey; all of one size (FER2013's are 48x48)."""
    try:
        data = np.load(path)
        jpeg, offsets, labels = data["jpeg"], data["offsets"], data["labels"]
        names = tuple(str(n) for n in data["label_names"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise BundleError(f"{path}: not an .npz of face crops with jpeg, offsets, labels and label_names "
                          f"({type(exc).__name__}: {exc})") from exc
    if len(labels) == 0:
        raise BundleError(f"{path}: holds no crops")
    if len(offsets) != len(labels) + 1:
        raise BundleError(f"{path}: {len(labels)} labels but {len(offsets) - 1} images")
    decoded: list[np.ndarray] = []
    for i in range(len(labels)):
        image = cv2.imdecode(jpeg[offsets[i]:offsets[i + 1]], cv2.IMREAD_GRAYSCALE)
        if image is None:
            raise BundleError(f"{path}: image {i} does not decode as JPEG")
        decoded.append(image)
    shapes = {image.shape for image in decoded}
    if len(shapes) != 1:
        raise BundleError(f"{path}: crops of several sizes {sorted(shapes)[:3]}; expected one")
    return CropBundle(np.stack(decoded), labels.astype(np.int64), names, np.arange(len(labels)))


def stratified_split(labels: np.ndarray, fraction: float, seed: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, validation): `fraction` of each of `classes` classes, chosen by `seed` (the same on every
    machine)."""
    rng = np.random.RandomState(seed)
    val = [np.zeros(0, np.int64)]
    for label in range(classes):
        members = np.flatnonzero(labels == label)
        val.append(rng.permutation(members)[: int(round(len(members) * fraction))])
    val_idx = np.sort(np.concatenate(val))
    train_idx = np.setdiff1d(np.arange(len(labels)), val_idx)
    return train_idx, val_idx


def holdout(bundle: CropBundle) -> CropBundle:
    """The crops `tools/train_emotion.py` holds out with its default --val-fraction and --split-seed."""
    _, held_out = stratified_split(bundle.labels, HOLDOUT_FRACTION, HOLDOUT_SEED, len(bundle.label_names))
    return bundle.subset(held_out)
