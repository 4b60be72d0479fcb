"""The emotion classifier: the model behind the shared BatchedModel, fed by vision's FaceCropper, both configured
by the model's manifest (input size, colour, label order)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Literal

import numpy as np

from pipeline.core.types import Detection, EmotionScores
from pipeline.inference.batching import BatchedModel
from pipeline.inference.settings import FlipFollowed
from pipeline.modelprep.manifest import ModelManifest
from pipeline.vision.faces import FaceCropper


class EmotionClassifier:
    """Cuts faces as the manifest says and reads the seven canonical emotions through a shared BatchedModel."""

    def __init__(self, model: BatchedModel, manifest: ModelManifest, crop: str = "box", box_margin: float = 0.0,
                 flip: bool = False):
        if manifest.input.size is None:
            raise ValueError(f"emotion model {manifest.name}: manifest input.size is required")
        self.model = model
        self.cropper = FaceCropper(manifest.input.size, manifest.input.color, crop, box_margin)
        self.size: tuple[int, int] = manifest.input.size
        self._order = np.asarray(manifest.canonical_order())
        self._output = manifest.outputs[0]
        self.flip = flip

    @property
    def channels(self) -> int:
        return self.cropper.channels

    def face_crop(self, image: np.ndarray, face: Detection) -> np.ndarray:
        """The classifier's input for one face of a BGR frame: H x W x C uint8."""
        return self.cropper.face_crop(image, face)

    def crop_from_still(self, image: np.ndarray, stored_margin: float | None = None) -> np.ndarray:
        """An image that is already one face crop: resize to the model's input (`FaceCropper.crop_from_still`)."""
        return self.cropper.crop_from_still(image, stored_margin)

    def submit(self, crops: Sequence[np.ndarray]) -> list[Future[dict[str, np.ndarray]]]:
        return [self.model.submit(crop) for crop in crops]

    def scores(self, outputs: dict[str, np.ndarray]) -> EmotionScores:
        return EmotionScores(normalised(outputs[self._output][None], self._order)[0])

    def classify(self, crops: Sequence[np.ndarray], timeout: float = 10.0,
                 flip: bool | None = None) -> list[EmotionScores]:
        """Submit every crop at once (they batch together) and wait for all; with flip (the classifier's own unless
        `flip` says), each crop's mirror image goes in the same batch and the two probability vectors are averaged."""
        flip = self.flip if flip is None else flip
        mirrors = mirror_images(crops) if flip else []
        rows = [f.result(timeout=timeout)[self._output] for f in self.submit([*crops, *mirrors])]
        if not rows:
            return []
        return [EmotionScores(row) for row in normalised(np.stack(rows), self._order, len(mirrors))]


def mirror_images(crops: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each crop flipped left to right (contiguous, as the batcher stacks them): the flip's second view."""
    return [np.ascontiguousarray(crop[:, ::-1]) for crop in crops]


FollowedRead = Literal["both", "once", "mirror"]


def followed_read(flip: bool, flip_followed: FlipFollowed, turn: int) -> FollowedRead:
    """How the faces of a camera's `turn`th frame without detection are read (emotion.flip, emotion.flip_followed):
    with their mirror images and averaged (both), once as they are, or once mirrored.

    Why alternate: a track's smoothing averages its reads over ~300 ms, so reading the faces as they are on one
    followed frame and mirrored on the next gives the smoothed emotion both views for the cost of one read a frame
    (bench interval: the same agreement with every-frame detection as `both` on one face, BENCHMARKS.md)."""
    if not flip:
        return "once"
    if flip_followed is True:
        return "both"
    return "mirror" if flip_followed == "alternate" and turn % 2 else "once"


# Rows normalised per numpy call: 64 rows of 7 emotions are loops of 448 elements, which numpy runs holding the GIL
# (it gives the GIL away in loops of more than 500: NPY_BEGIN_THREADS_THRESHOLDED). On the frame graphs path this runs
# on the lane's thread, and each time the GIL is given away, taking it back can wait a switch interval (5 ms) for a
# camera thread (deploy/gil_release_probe.py).
ROWS_PER_CALL = 64


def normalised(probs: np.ndarray, order: np.ndarray, mirrored: int = 0) -> np.ndarray:
    """Classifier rows → probabilities in EMOTIONS order, each row summing to 1. `mirrored`: the last that many rows
    are the mirror images of the first that many (emotion.flip), averaged with them and dropped. One formula for
    both frame paths (the frame graphs path normalises a whole batch at once, where only some faces may be mirrored:
    emotion.flip_followed)."""
    rows = np.asarray(probs, np.float32)
    count = len(rows) - mirrored
    columns = order.tolist()
    out = np.empty((count, len(columns)), np.float32)
    for start in range(0, count, ROWS_PER_CALL):
        stop = min(start + ROWS_PER_CALL, count)
        part = np.stack([rows[start:stop, column] for column in columns], axis=1)  # views, no fancy indexing
        twins = min(stop, mirrored) - start
        if twins > 0:  # these rows' mirror images, averaged in: exact, as / 2, float32
            mirror = rows[count + start:count + start + twins]
            part[:twins] = (part[:twins] + np.stack([mirror[:, column] for column in columns], axis=1)) \
                * np.float32(0.5)
        out[start:stop] = part / np.maximum(part.sum(axis=1, keepdims=True), 1e-9)
    return out
