"""emotion.flip_followed: with test-time flip, how the faces of frames without detection (detector.interval) are read:
true = with their mirror images and averaged, false = once as they are, alternate (the default) = once, as they are
and mirrored on alternate followed frames of a camera; detection frames always read both. Real models on real
frames, on both frame paths (the frame graphs on ONNX Runtime's CPU provider) and through a real camera worker."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pipeline.capture.settings import CameraConfig
from pipeline.capture.thread import CaptureThread
from pipeline.core.types import Frame
from pipeline.inference.classifier import followed_read
from pipeline.inference.frames import FramePerception, frame_format
from pipeline.inference.perception import Perception, load_perception
from pipeline.service.worker import CameraWorker
from pipeline.vision.track import IouTracker
from tests.conftest import data_path
from tests.test_frames_path import _frames, _graph_config, _prepared_gpu, needs_cuda


def _flip_followed(config: Any, value: bool | str) -> Any:
    return config.model_copy(update={"emotion": config.emotion.model_copy(update={"flip_followed": value})})


def _probs(scores: list[Any]) -> np.ndarray:
    return np.array([s.probs for s in scores])


@pytest.fixture(scope="module")
def frame() -> Any:
    return _frames(data_path("video", "group_1080p.mp4"), 1, 1)[0]


@pytest.fixture(scope="module")
def reads(perception: Perception, frame: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """The frame's faces, and each face read once, read as its mirror image only, and read both ways (averaged),
    by the OpenCV path's classifier."""
    faces, _, _ = perception.analyze(frame)
    crops = [perception.classifier.face_crop(frame, face) for face in faces]
    once = _probs(perception.classifier.classify(crops, flip=False))
    mirror = _probs(perception.classifier.classify([np.ascontiguousarray(c[:, ::-1]) for c in crops], flip=False))
    both = _probs(perception.classifier.classify(crops, flip=True))
    assert len(faces) >= 3 and np.abs(once - both).max() > 0.05  # mirroring changes these faces' reads
    np.testing.assert_allclose(both, (once + mirror) / 2, atol=1e-5)
    return faces, once, mirror, both


def test_followed_read_by_setting_and_turn() -> None:
    assert [followed_read(True, "alternate", turn) for turn in range(4)] == ["once", "mirror", "once", "mirror"]
    assert {followed_read(True, True, turn) for turn in range(3)} == {"both"}
    assert {followed_read(True, False, turn) for turn in range(3)} == {"once"}
    assert {followed_read(False, value, 1) for value in (True, False, "alternate")} == {"once"}


def test_config_accepts_true_false_and_alternate(app_config: Any) -> None:
    from pipeline.config.app import AppConfig

    assert app_config.emotion.flip and app_config.emotion.flip_followed == "alternate"  # the default
    data = app_config.model_dump()
    for value in (True, False, "alternate"):
        data["emotion"]["flip_followed"] = value
        assert AppConfig.model_validate(data).emotion.flip_followed == value
    data["emotion"]["flip_followed"] = "sometimes"
    with pytest.raises(ValueError, match="flip_followed"):
        AppConfig.model_validate(data)


def test_opencv_path_alternates_followed_reads_by_default(perception: Perception, frame: Any, reads: Any) -> None:
    faces, once, mirror, both = reads
    for turn, expected in ((0, once), (1, mirror), (2, once), (3, mirror)):
        np.testing.assert_allclose(_probs(perception.begin_tracked(frame, faces, turn).result()[1]), expected,
                                   atol=1e-5)
    np.testing.assert_allclose(_probs(perception.analyze(frame)[1]), both, atol=1e-5)  # detection: both ways


@pytest.mark.parametrize("value", [True, False])
def test_opencv_path_reads_followed_faces_as_set(prepared_models: None, app_config: Any, frame: Any, reads: Any,
                                                 value: bool) -> None:
    faces, once, _, both = reads
    other = Perception.from_config(_flip_followed(app_config, value))
    try:
        followed = [_probs(other.begin_tracked(frame, faces, turn).result()[1]) for turn in (0, 1)]
        detected = _probs(other.analyze(frame)[1])
    finally:
        other.close()
    for probs in followed:
        np.testing.assert_allclose(probs, both if value else once, atol=1e-5)
    np.testing.assert_allclose(detected, both, atol=1e-5)


def _prepared_graph(config: Any, frame: Any) -> FramePerception:
    perception = load_perception(_graph_config(config))
    if not isinstance(perception, FramePerception):
        raise TypeError(f"frame_path graph gave {type(perception).__name__}")
    perception.prepare(frame_format(frame))
    return perception


def _mixed_batch(perception: FramePerception, frame: Any, faces: list[Any]) -> tuple[np.ndarray, ...]:
    """The emotions of one batch: `frame` detected, then followed twice with `faces` (turns 0 and 1)."""
    pending = [perception.begin(frame), perception.begin_tracked(frame, faces, 0),
               perception.begin_tracked(frame, faces, 1)]
    return tuple(_probs(p.result()[1]) for p in pending)


@pytest.fixture(scope="module")
def graph(prepared_models: None, app_config: Any, frame: Any) -> Iterator[FramePerception]:
    perception = _prepared_graph(app_config, frame)
    yield perception
    perception.close()


def test_graph_path_alternates_followed_reads_in_a_mixed_batch(graph: FramePerception, frame: Any,
                                                               reads: Any) -> None:
    """A detected frame and two followed ones (turns 0 and 1) in the same batch: the detected faces are read both
    ways, the first followed frame's as they are, the second's mirrored; all agree with the OpenCV path's reads."""
    faces, once, mirror, both = reads
    detected, first, second = _mixed_batch(graph, frame, faces)
    np.testing.assert_allclose(first, once, atol=0.02)
    np.testing.assert_allclose(second, mirror, atol=0.02)
    np.testing.assert_allclose(detected, both, atol=0.02)
    assert np.abs(first - second).max() > 0.05


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_followed_frames_alternate_in_a_mixed_batch(prepared_models: None, app_config: Any, frame: Any,
                                                            reads: Any) -> None:
    """The same on the CUDA lane (fp32 models, two lanes): the followed faces' mirrored crops are the mirrored
    inverse affines of the frame on the GPU, read in the batch's one classifier run."""
    faces, once, mirror, both = reads
    gpu = _prepared_gpu(app_config, frame)
    try:
        detected, first, second = _mixed_batch(gpu, frame, faces)
    finally:
        gpu.close()
    np.testing.assert_allclose(first, once, atol=0.02)
    np.testing.assert_allclose(second, mirror, atol=0.02)
    np.testing.assert_allclose(detected, both, atol=0.02)


@pytest.fixture(scope="module")
def lean_graph(prepared_models: None, app_config: Any, frame: Any) -> Iterator[FramePerception]:
    perception = _prepared_graph(_flip_followed(app_config, False), frame)
    yield perception
    perception.close()


def test_graph_path_reads_followed_faces_once_in_a_mixed_batch(lean_graph: FramePerception, frame: Any,
                                                               reads: Any) -> None:
    """flip_followed false: a detected frame and followed ones in the same batch: the detected faces are mirrored,
    the followed ones (given the same faces) are not, whatever their turn."""
    faces, once, _, both = reads
    detected, first, second = _mixed_batch(lean_graph, frame, faces)
    np.testing.assert_allclose(first, once, atol=0.02)
    np.testing.assert_allclose(second, once, atol=0.02)
    np.testing.assert_allclose(detected, both, atol=0.02)


def test_a_camera_worker_alternates_its_followed_frames(perception: Perception) -> None:
    """The worker counts its camera's frames without detection and hands each its turn: on real consecutive frames
    at interval 3 each followed frame's emotions are those of its turn's read, not of the next turn's."""
    images = _frames(data_path("video", "group_1080p.mp4"), 8, 1)
    every_third = dataclasses.replace(perception, interval=3)  # the same models
    stop = threading.Event()
    capture = CaptureThread(CameraConfig(name="lobby", source="demo"), stop, lambda _event: None)
    worker = CameraWorker(capture, every_third, IouTracker(follow=True), lambda _obs: None, stop)
    turn = 0
    for index, image in enumerate(images):
        frame = Frame("lobby", index, image, index * 0.04, 0.0)
        pending, tracked = worker._begin(frame)
        assert pending is not None
        faces, scores, timings = pending.result()
        if tracked is not None and faces:
            own = every_third.classify_faces(image, faces, 0.0, followed=True, turn=turn)[1]
            next_turn = every_third.classify_faces(image, faces, 0.0, followed=True, turn=turn + 1)[1]
            np.testing.assert_allclose(_probs(scores), _probs(own), atol=1e-5)
            assert np.abs(_probs(scores) - _probs(next_turn)).max() > 1e-3
        turn += tracked is not None
        worker.observe(frame, faces, scores, timings, tracked)
    assert turn >= 4
