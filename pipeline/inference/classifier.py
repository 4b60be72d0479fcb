"""Emotion classifier pre/post-processing, driven by the model manifest (size, colour, labels)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

import cv2
import numpy as np

from pipeline.vision.align import align_face, box_crop
from pipeline.inference.batching import BatchedModel
from pipeline.modelprep.manifest import ModelManifest
from pipeline.core.types import Detection, EmotionScores


class EmotionClassifier:
    """Cuts faces as the manifest says and reads the seven canonical emotions through a shared BatchedModel."""

    def __init__(self, model: BatchedModel, manifest: ModelManifest, crop: str = "box", box_margin: float = 0.0):
        if manifest.input.size is None:
            raise ValueError(f"emotion model {manifest.name}: manifest input.size is required")
        self.model = model
        self.size: tuple[int, int] = manifest.input.size
        self.gray = manifest.input.color == "gray"
        self.rgb = manifest.input.color == "rgb"
        self.crop = crop
        self.box_margin = box_margin
        self._order = np.asarray(manifest.canonical_order())
        self._output = manifest.outputs[0]

    def face_crop(self, image: np.ndarray, face: Detection) -> np.ndarray:
        """The classifier's input for one face of a BGR frame: H x W x C uint8."""
        if self.crop == "align":
            patch = align_face(image, face.landmarks, self.size)
        else:
            patch = box_crop(image, face.box, self.size, self.box_margin)
        return self.from_bgr(patch)

    def from_bgr(self, patch: np.ndarray) -> np.ndarray:
        """Convert a BGR patch already of the right size to the model's colour; always returns H x W x C."""
        if self.gray:
            return cv2.cvtColor(patch, cv2.COLOR_BGR2GRAY)[:, :, None]
        if self.rgb:
            return np.ascontiguousarray(patch[:, :, ::-1])
        return patch

    def crop_from_still(self, image: np.ndarray) -> np.ndarray:
        """An image that is already one face crop (FER2013-style datasets): resize to the model's input."""
        if image.ndim == 2:
            image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
        return self.from_bgr(cv2.resize(image, self.size, interpolation=cv2.INTER_LINEAR))

    def submit(self, crops: Sequence[np.ndarray]) -> list[Future[dict[str, np.ndarray]]]:
        return [self.model.submit(crop) for crop in crops]

    def scores(self, outputs: dict[str, np.ndarray]) -> EmotionScores:
        probs = np.asarray(outputs[self._output], dtype=np.float32)[self._order]
        return EmotionScores(probs / max(float(probs.sum()), 1e-9))

    def classify(self, crops: Sequence[np.ndarray], timeout: float = 10.0) -> list[EmotionScores]:
        """Submit every crop at once (they batch together) and wait for all."""
        return [self.scores(f.result(timeout=timeout)) for f in self.submit(crops)]
