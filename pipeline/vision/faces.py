"""The emotion classifier's input: a face cut from a frame (box crop or five-point alignment), in the model's size and
colour. Pure: the inference wing builds a `FaceCropper` from the model's manifest and owns the model itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

from pipeline.core.types import Detection
from pipeline.vision.align import align_face, box_crop

Colour = Literal["gray", "rgb", "bgr"]


@dataclass(frozen=True)
class FaceCropper:
    """Cuts faces `size` (width, height) in `colour`, by `crop` (box: the detection box plus `box_margin`, align:
    similarity transform of the five landmarks onto the training framing)."""

    size: tuple[int, int]
    colour: Colour
    crop: str = "box"
    box_margin: float = 0.0

    @property
    def channels(self) -> int:
        return 1 if self.colour == "gray" else 3

    def face_crop(self, image: np.ndarray, face: Detection) -> np.ndarray:
        """The classifier's input for one face of a BGR frame: H x W x C uint8."""
        if self.crop == "align":
            patch = align_face(image, face.landmarks, self.size)
        else:
            patch = box_crop(image, face.box, self.size, self.box_margin)
        return self.from_bgr(patch)

    def from_bgr(self, patch: np.ndarray) -> np.ndarray:
        """Convert a BGR patch already of the right size to the model's colour; always returns H x W x C."""
        if self.colour == "gray":
            return cv2.cvtColor(patch, cv2.COLOR_BGR2GRAY)[:, :, None]
        if self.colour == "rgb":
            return np.ascontiguousarray(patch[:, :, ::-1])
        return patch

    def crop_from_still(self, image: np.ndarray, stored_margin: float | None = None) -> np.ndarray:
        """An image that is already one face crop: resize to the model's input. FER2013-style crops
        (`stored_margin` None) are used whole; a crop cut around a detector box with `stored_margin` (a photo
        bundle) is cut again around that box with this cropper's `box_margin`, as the pipeline frames a face."""
        if image.ndim == 2:
            image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
        if stored_margin is None:
            return self.from_bgr(cv2.resize(image, self.size, interpolation=cv2.INTER_LINEAR))
        height, width = image.shape[:2]
        half = min(width, height) / (1.0 + 2.0 * stored_margin) / 2.0
        box = (width / 2.0 - half, height / 2.0 - half, width / 2.0 + half, height / 2.0 + half)
        return self.from_bgr(box_crop(image, box, self.size, self.box_margin))
