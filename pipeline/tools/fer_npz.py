"""Bundles of labelled face crops as .npz files of JPEG bytes (../shared/data/README.md: `jpeg`, `offsets`, `labels`,
`label_names`, and for photos `sources`): FER2013's training split and the muxspace photos, and the validation
hold-out of each that `tools/train_emotion.py` keeps out of training.

Why one module for both: the hold-out figures of a model are only honest if `analyze --holdout` scores exactly the
crops the training never saw. Training imports the split functions and the hold-out's constants from here, so the
two cannot drift apart.

Two kinds of hold-out, because the two kinds of bundle differ:
* FER2013's crops are anonymous: 10 % of each class, stratified (`stratified_split`).
* The photo bundles name their source files, and many people appear in several photos (one politician in 142):
  10 % of the *people* are held out with every photo of them (`person_split`), so a model is never scored on a face
  it has trained on.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

HOLDOUT_FRACTION = 0.1  # of every class
HOLDOUT_SEED = 20261201  # keep it fixed: the published hold-out figures are on this split
# How wide each known bundle's crops are cut, as the pipeline's emotion.box_margin (a bundle may also say so itself,
# in a `box_margin` array): the photo bundle was cut at 0.25 (../shared/data/README.md), so the default crop (margin
# 0) is its central 1/1.5. FER2013's crops have their own framing, which the pipeline's box crop at margin 0 matches:
# they are used whole.
BUNDLE_BOX_MARGINS = {"mux_dwdii_112.npz": 0.25}


class BundleError(ValueError):
    """An .npz that is not a bundle of face crops in this layout; the message names the file and what is wrong."""


@dataclass(frozen=True)
class CropBundle:
    """Grey face crops with their labels (indices into `label_names`) and their positions in the file."""

    images: np.ndarray  # [N, H, W] uint8
    labels: np.ndarray  # [N] int64
    label_names: tuple[str, ...]
    positions: np.ndarray  # [N] int64: where each crop is in the .npz (a subset keeps them)
    sources: np.ndarray | None = None  # [N] str: each crop's original file (photo bundles), else None
    box_margin: float | None = None  # the box margin the crops were cut with (BUNDLE_BOX_MARGINS), None: whole

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: np.ndarray) -> CropBundle:
        sources = None if self.sources is None else self.sources[indices]
        return CropBundle(self.images[indices], self.labels[indices], self.label_names, self.positions[indices],
                          sources, self.box_margin)


def load_bundle(path: Path) -> CropBundle:
    """Every crop of the .npz, decoded to grey; all of one size (FER2013's are 48x48)."""
    try:
        data = np.load(path)
        jpeg, offsets, labels = data["jpeg"], data["offsets"], data["labels"]
        names = tuple(str(n) for n in data["label_names"])
        sources = data["sources"].astype(str) if "sources" in data.files else None
        margin = float(data["box_margin"]) if "box_margin" in data.files else BUNDLE_BOX_MARGINS.get(Path(path).name)
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
    if sources is not None and len(sources) != len(labels):
        raise BundleError(f"{path}: {len(labels)} labels but {len(sources)} sources")
    return CropBundle(np.stack(decoded), labels.astype(np.int64), names, np.arange(len(labels)), sources, margin)


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


def person_of(source: str) -> str:
    """The person a photo shows, from its file name (`Tony_Blair_0042.jpg` → `Tony_Blair`)."""
    stem = Path(source).stem
    head, _, number = stem.rpartition("_")
    return head if head and number.isdigit() else stem


def person_split(sources: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, validation): every photo of `fraction` of the people (sorted names, shuffled by `seed`)."""
    people = np.array([person_of(str(s)) for s in sources])
    names = np.unique(people)
    chosen = np.random.RandomState(seed).permutation(names)[: int(round(len(names) * fraction))]
    is_val = np.isin(people, chosen)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def split_bundle(bundle: CropBundle, fraction: float = HOLDOUT_FRACTION,
                 seed: int = HOLDOUT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, validation) of a bundle: by person where it names its photos, else stratified by class."""
    if bundle.sources is not None:
        return person_split(bundle.sources, fraction, seed)
    return stratified_split(bundle.labels, fraction, seed, len(bundle.label_names))


def holdout(bundle: CropBundle) -> CropBundle:
    """The crops `tools/train_emotion.py` holds out with its default --val-fraction and --split-seed."""
    _, held_out = split_bundle(bundle)
    return bundle.subset(held_out)
