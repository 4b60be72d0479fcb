"""The face detector: RetinaFace behind the shared BatchedModel, with vision's letterbox and decode around it."""

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
)


class FaceDetector:
    """RetinaFace behind a shared BatchedModel: `submit` a frame, then `finish` its outputs into detections."""

    def __init__(self, model: BatchedModel, cfg: DetectorConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.input_size: tuple[int, int] = (int(cfg.input_size[0]), int(cfg.input_size[1]))
        anchor_grid(self.input_size)  # build the cache once, before the first frame

    def submit(self, image: np.ndarray) -> tuple[Future[dict[str, np.ndarray]], Letterbox]:
        canvas, fit = letterbox(image, self.input_size)
        return self.model.submit(canvas), fit

    def finish(self, outputs: dict[str, np.ndarray], fit: Letterbox) -> list[Detection]:
        faces = decode(outputs, self.input_size, fit, self.cfg.score_threshold, self.cfg.nms_threshold)
        return filter_faces(faces, self.cfg.min_face_px, self.cfg.max_faces)

    def detect(self, image: np.ndarray, timeout: float = 10.0) -> list[Detection]:
        future, fit = self.submit(image)
        return self.finish(future.result(timeout=timeout), fit)
