"""The shared perception models: one detector and one emotion classifier, each behind a BatchedModel.

Both the daemon (all cameras) and `analyze` build them here, so there is exactly one way to load a model.
`load_perception` picks the frame path (inference.frame_path): `Perception` (OpenCV letterbox and crops on the host
around the two models) or `FramePerception` (inference.frames: whole frames through the frame graphs).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline.core.types import Detection, FrameImage
from pipeline.inference.backend import (
    BackendError,
    ModelRuntime,
    create_backend,
    runner_health,
)
from pipeline.inference.batching import BatchedModel
from pipeline.inference.classifier import EmotionClassifier, followed_read, mirror_images
from pipeline.inference.detector import FaceDetector
from pipeline.inference.frames import FramePerception, load_frame_perception
from pipeline.inference.pending import Analysis, PendingAnalysis, finished
from pipeline.inference.settings import DetectorConfig, EmotionConfig, FlipFollowed, InferenceConfig
from pipeline.modelprep.manifest import ModelManifest, load_manifest
from pipeline.modelprep.prepare import ensure_model
from pipeline.vision.follow import FaceTemplate

log = logging.getLogger(__name__)

RESULT_TIMEOUT_S = 10.0
WARM_UP_FRAME = (1920, 1080)  # width, height of the frame whose detector input warm_up runs (input_size auto)


class PerceptionSettings(Protocol):
    """The sections Perception reads; the whole configuration (`AppConfig`) is one, without this wing importing it."""

    @property
    def detector(self) -> DetectorConfig: ...

    @property
    def emotion(self) -> EmotionConfig: ...

    @property
    def inference(self) -> InferenceConfig: ...


class Analyzer(Protocol):
    """What a camera worker needs: one frame in, its faces and emotions out (both frame paths provide it), either at
    once (analyze) or begun now and collected later (begin), up to `frames_in_flight` frames per camera."""

    frames_in_flight: int
    interval: int  # the detector runs on every Nth frame of a camera (detector.interval), on both frame paths

    @property
    def searches_in_batches(self) -> bool:
        """Whether followed faces given with templates are found by their look in the engine's batches."""
        ...

    def analyze(self, image: FrameImage) -> Analysis: ...

    def begin(self, image: FrameImage, templates: bool = False) -> PendingAnalysis: ...

    def begin_tracked(self, image: FrameImage, faces: list[Detection], turn: int = 0,
                      templates: list[FaceTemplate | None] | None = None) -> PendingAnalysis: ...

    def models(self) -> list[tuple[str, BatchedModel]]: ...

    def warm_up(self) -> None: ...

    def close(self) -> None: ...


def load_perception(cfg: PerceptionSettings, auto_prepare: bool = True) -> Perception | FramePerception:
    """The configured frame path's perception (not yet warmed)."""
    if not cfg.inference.graph_frames:
        return Perception.from_config(cfg, auto_prepare)
    det_manifest = load_manifest(cfg.detector.model)
    emo_manifest = load_manifest(cfg.emotion.model)
    det_path, precision = _prepared(det_manifest, cfg.inference, auto_prepare)
    emo_path, _ = _prepared(emo_manifest, cfg.inference, auto_prepare)
    perception = load_frame_perception(det_path, emo_path, cfg.detector, cfg.emotion, emo_manifest, cfg.inference,
                                       precision)
    log.info("frames: %s", ", ".join(f"{k}={v}" for k, v in perception.engine.describe().items()))
    return perception


def _prepared(manifest: ModelManifest, cfg: InferenceConfig, auto_prepare: bool) -> tuple[Path, str]:
    """The model file in the precision it will run in (a refused precision falls back, with a warning)."""
    precision = manifest.effective_precision(cfg.precision)
    if precision != cfg.precision:
        log.warning("%s: %s refused (%s); running it in %s", manifest.name, cfg.precision,
                    manifest.refused_precisions[cfg.precision], precision)
    return ensure_model(manifest, precision, auto_prepare=auto_prepare), precision


def load_batched_model(manifest: ModelManifest, cfg: InferenceConfig, auto_prepare: bool = True,
                       input_size: tuple[int, int] | None = None) -> BatchedModel:
    """Prepare (if needed), verify and load one model, wrapped in its dynamic batcher.

    input_size: (width, height) when the configuration fixes the model's input size (the detector's
    detector.input_size; None with auto). The backend is told it because a TensorRT engine is built for one size; a
    model whose manifest fixes its size ignores it."""
    path, precision = _prepared(manifest, cfg, auto_prepare)
    size = None if manifest.input.size is not None else input_size
    backend = create_backend(ModelRuntime.from_config(cfg, precision=precision, input_size=size), manifest, path)
    log.info("%s: %s", manifest.name, ", ".join(f"{k}={v}" for k, v in backend.describe().items()))
    return BatchedModel(backend, manifest.name, cfg.max_batch, cfg.max_delay_ms, cfg.queue_size)


@dataclass
class Perception:
    """The shared models, used by every camera worker and by `analyze`."""

    detector: FaceDetector
    classifier: EmotionClassifier
    frames_in_flight: int = 1  # a frame is analysed on the camera's thread, detector then classifier
    interval: int = 1  # detector.interval: the frames between take their faces from the camera's tracker
    flip_followed: FlipFollowed = "alternate"  # emotion.flip_followed: how faces of frames without detection are read
    searches_in_batches = False  # the tracker finds followed faces by their look itself (vision.follow)

    @classmethod
    def from_config(cls, cfg: PerceptionSettings, auto_prepare: bool = True) -> Perception:
        det_manifest = load_manifest(cfg.detector.model)
        emo_manifest = load_manifest(cfg.emotion.model)
        detector_model = load_batched_model(det_manifest, cfg.inference, auto_prepare, cfg.detector.fixed_input_size)
        emotion_model = load_batched_model(emo_manifest, cfg.inference, auto_prepare)
        return cls(FaceDetector(detector_model, cfg.detector),
                   EmotionClassifier(emotion_model, emo_manifest, cfg.emotion.crop, cfg.emotion.box_margin,
                                     cfg.emotion.flip), interval=cfg.detector.interval,
                   flip_followed=cfg.emotion.flip_followed)

    def models(self) -> list[tuple[str, BatchedModel]]:
        """Each shared model by role, for status and metrics."""
        return [("detector", self.detector.model), ("emotion", self.classifier.model)]

    def warm_up(self) -> None:
        """One run of each model, so the first camera frame does not pay for lazy initialisation (with input_size
        auto, at the input of a 16:9 frame, the commonest camera shape; the cameras' sizes are not known yet)."""
        width, height = self.detector.input_for(WARM_UP_FRAME)
        self.detector.model.warm_up((height, width, 3), np.dtype(np.uint8))
        w, h = self.classifier.size
        channels = self.classifier.channels
        self.classifier.model.warm_up((h, w, channels), np.dtype(np.uint8))
        try:
            self.detector.detect(np.zeros((height, width, 3), np.uint8), RESULT_TIMEOUT_S)
            self.classifier.classify([self.classifier.crop_from_still(np.zeros((h, w, 3), np.uint8))],
                                     RESULT_TIMEOUT_S)
        except BackendError as exc:
            # A remote server (backend triton) that is down must not stop the daemon from starting: its cameras
            # run, their batches fail until it answers, and /healthz says so. An in-process failure is real.
            if all(runner_health(model.backend).up for _, model in self.models()):
                raise
            log.warning("warm-up skipped, a model server is unreachable: %s", exc)

    def close(self) -> None:
        self.detector.model.close()
        self.classifier.model.close()

    def begin(self, image: FrameImage, templates: bool = False) -> PendingAnalysis:
        """The OpenCV path analyses the frame now (its letterbox and crops run on the calling thread); it never
        searches in batches, so `templates` is not asked of it."""
        return finished(self.analyze(image))

    def begin_tracked(self, image: FrameImage, faces: list[Detection], turn: int = 0,
                      templates: list[FaceTemplate | None] | None = None) -> PendingAnalysis:
        """A frame without detection (detector.interval): the emotions of the faces the tracker expects, now.
        `turn`: how many frames without detection the camera had before this one (emotion.flip_followed)."""
        return finished(self.classify_faces(_on_host(image), faces, 0.0, followed=True, turn=turn))

    def analyze(self, image: FrameImage) -> Analysis:
        """Faces and their emotions in one BGR image, with per-stage times in ms (queue time included)."""
        host = _on_host(image)
        t0 = time.monotonic()
        faces = self.detector.detect(host, RESULT_TIMEOUT_S)
        return self.classify_faces(host, faces, (time.monotonic() - t0) * 1e3)

    def classify_faces(self, image: np.ndarray, faces: list[Detection], detect_ms: float,
                       followed: bool = False, turn: int = 0) -> Analysis:
        """Crop and classify `faces` of `image`; the timings with the detector's `detect_ms`. `followed`: a frame
        without detection (its camera's `turn`th), whose faces are read as emotion.flip_followed says."""
        t1 = time.monotonic()
        crops = [self.classifier.face_crop(image, face) for face in faces]
        t2 = time.monotonic()
        read = followed_read(self.classifier.flip, self.flip_followed, turn) if followed else None
        if read == "mirror":
            crops = mirror_images(crops)
        flip = self.classifier.flip if read is None else read == "both"
        scores = self.classifier.classify(crops, RESULT_TIMEOUT_S, flip) if crops else []
        t3 = time.monotonic()
        timings = {"detect": detect_ms, "crop": (t2 - t1) * 1e3, "emotion": (t3 - t2) * 1e3}
        return faces, scores, timings


def _on_host(image: FrameImage) -> np.ndarray:
    """A host frame as it is; a camera still on the GPU path after a reload: copied down."""
    return image if isinstance(image, np.ndarray) else image.to_host()
