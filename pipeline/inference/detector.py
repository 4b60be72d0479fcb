"""The face detector: RetinaFace behind the shared BatchedModel, with vision's letterbox and decode around it.

The input size is the configuration's fixed one, or with `detector.input_size: auto` one per frame shape
(DetectorConfig.input_for): cameras of different shapes then send the shared model inputs of different shapes, which
the backend runs as one group per shape (Backend.run_items)."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from pipeline.core.types import Detection
from pipeline.inference.batching import BatchedModel
from pipeline.inference.settings import DetectorConfig
from pipeline.vision.retinaface import (
    Letterbox,
    anchor_grid,
    decode,
    filter_faces,
    letterbox,
    merge_mirrored,
)


class FaceDetector:
    """RetinaFace behind a shared BatchedModel: `submit` a frame, then `finish` its outputs into detections."""

    def __init__(self, model: BatchedModel, cfg: DetectorConfig) -> None:
        self.model = model
        self.cfg = cfg
        if cfg.fixed_input_size is not None:
            anchor_grid(cfg.fixed_input_size)  # build the cache once, before the first frame

    def input_for(self, frame_size: tuple[int, int]) -> tuple[int, int]:
        """The detector input (width, height) a frame of `frame_size` (width, height) is letterboxed into."""
        return self.cfg.input_for(frame_size)

    def submit(self, image: np.ndarray) -> tuple[Future[dict[str, np.ndarray]], Letterbox]:
        height, width = image.shape[:2]
        canvas, fit = letterbox(image, self.input_for((width, height)))
        return self.model.submit(canvas), fit

    def finish(self, outputs: dict[str, np.ndarray], fit: Letterbox) -> list[Detection]:
        """Detections in frame pixels; the input size is found again from the frame size (the same cached rule)."""
        return filter_faces(self._decode(outputs, fit), self.cfg.min_face_px, self.cfg.max_faces)

    def _decode(self, outputs: dict[str, np.ndarray], fit: Letterbox) -> list[Detection]:
        return decode(outputs, self.input_for(fit.frame_size), fit, self.cfg.score_threshold, self.cfg.nms_threshold)

    def detect(self, image: np.ndarray, timeout: float = 10.0) -> list[Detection]:
        """The faces of a BGR image; with detector.flip, averaged with those of its mirror image (both runs are
        submitted at once, so they share a batch)."""
        future, fit = self.submit(image)
        if not self.cfg.flip:
            return self.finish(future.result(timeout=timeout), fit)
        mirrored, mirrored_fit = self.submit(np.ascontiguousarray(image[:, ::-1]))
        faces = self._decode(future.result(timeout=timeout), fit)
        twins = self._decode(mirrored.result(timeout=timeout), mirrored_fit)
        merged = merge_mirrored(faces, twins, image.shape[1])
        return filter_faces(merged, self.cfg.min_face_px, self.cfg.max_faces)
