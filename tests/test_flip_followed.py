"""emotion.flip_followed: with test-time flip, faces on frames without detection (detector.interval) are read once
when it is false, mirrored and averaged when it is true; detection frames always read both. Real models on real
frames, on both frame paths (the frame graphs on ONNX Runtime's CPU provider)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pipeline.inference.frames import FramePerception, frame_format
from pipeline.inference.perception import Perception, load_perception
from tests.conftest import data_path
from tests.test_frames_path import _frames, _graph_config


def _without_flip_followed(config: Any) -> Any:
    return config.model_copy(update={"emotion": config.emotion.model_copy(update={"flip_followed": False})})


@pytest.fixture(scope="module")
def frame() -> Any:
    return _frames(data_path("video", "group_1080p.mp4"), 1, 1)[0]


@pytest.fixture(scope="module")
def reads(perception: Perception, frame: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """The frame's faces, and each face read once and read with its mirror (the OpenCV path's classifier)."""
    faces, _, _ = perception.analyze(frame)
    crops = [perception.classifier.face_crop(frame, face) for face in faces]
    once = np.array([s.probs for s in perception.classifier.classify(crops, flip=False)])
    both = np.array([s.probs for s in perception.classifier.classify(crops, flip=True)])
    assert len(faces) >= 3 and np.abs(once - both).max() > 0.05  # mirroring changes these faces' reads
    return faces, once, both


def test_opencv_path_reads_followed_faces_once_without_flip_followed(prepared_models: None, app_config: Any,
                                                                     frame: Any, reads: Any) -> None:
    faces, once, both = reads
    assert app_config.emotion.flip and app_config.emotion.flip_followed
    lean = Perception.from_config(_without_flip_followed(app_config))
    try:
        followed = lean.begin_tracked(frame, faces).result()[1]
        detected = lean.analyze(frame)[1]
    finally:
        lean.close()
    np.testing.assert_allclose([s.probs for s in followed], once, atol=1e-5)
    np.testing.assert_allclose([s.probs for s in detected], both, atol=1e-5)


def test_opencv_path_mirrors_followed_faces_by_default(perception: Perception, frame: Any, reads: Any) -> None:
    faces, _, both = reads
    np.testing.assert_allclose([s.probs for s in perception.begin_tracked(frame, faces).result()[1]], both,
                               atol=1e-5)


@pytest.fixture(scope="module")
def lean_graph(prepared_models: None, app_config: Any, frame: Any) -> Iterator[FramePerception]:
    perception = load_perception(_graph_config(_without_flip_followed(app_config)))
    if not isinstance(perception, FramePerception):
        raise TypeError(f"frame_path graph gave {type(perception).__name__}")
    perception.prepare(frame_format(frame))
    yield perception
    perception.close()


def test_graph_path_reads_followed_faces_once_in_a_mixed_batch(lean_graph: FramePerception, frame: Any,
                                                               reads: Any) -> None:
    """A detected frame and a followed one in the same batch: the detected faces are mirrored, the followed ones
    (given the same faces) are not; both agree with the OpenCV path's reads."""
    faces, once, both = reads
    detected_pending = lean_graph.begin(frame)
    followed_pending = lean_graph.begin_tracked(frame, faces)
    detected = np.array([s.probs for s in detected_pending.result()[1]])
    followed = np.array([s.probs for s in followed_pending.result()[1]])
    np.testing.assert_allclose(followed, once, atol=0.02)
    np.testing.assert_allclose(detected, both, atol=0.02)
    assert np.abs(followed - detected).max() > 0.05
