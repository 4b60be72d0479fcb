"""Test-time flip (`emotion.flip`): each face and its mirror image classified in the same batch, probabilities
averaged, on both analysis paths, with the real models on real frames."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from pipeline.inference.frames import FramePerception, mirrored
from pipeline.inference.perception import Perception, load_perception
from pipeline.modelprep.frame_graphs import (
    CROP_OUTPUT,
    FRAME_INDEX_INPUT,
    FRAME_INPUT,
    MATRIX_INPUT,
    FrameFormat,
    crop_graph,
)
from pipeline.vision.align import box_crop_matrices, inverse_affine
from tests.conftest import data_path
from tests.test_frames_path import _frames


def _with_flip(app_config: Any, flip: bool = True, **inference: Any) -> Any:
    emotion = app_config.emotion.model_copy(update={"flip": flip})
    settings = app_config.inference.model_copy(update={"max_batch": 8, "max_delay_ms": 20.0, **inference})
    return app_config.model_copy(update={"emotion": emotion, "inference": settings})


def _opencv_perception(app_config: Any, flip: bool) -> Perception:
    perception = load_perception(_with_flip(app_config, flip, frame_path="opencv"))
    if not isinstance(perception, Perception):
        raise TypeError(f"frame_path opencv gave {type(perception).__name__}")
    return perception


@pytest.fixture(scope="module")
def flipped(prepared_models: None, app_config: Any) -> Iterator[Perception]:
    perception = _opencv_perception(app_config, True)
    yield perception
    perception.close()


@pytest.fixture(scope="module")
def unflipped(prepared_models: None, app_config: Any) -> Iterator[Perception]:
    perception = _opencv_perception(app_config, False)
    yield perception
    perception.close()


def test_flip_is_on_by_default(app_config: Any) -> None:
    assert app_config.emotion.flip is True  # measured better on faces/wild (BENCHMARKS.md)


def test_opencv_path_averages_each_face_with_its_mirror(flipped: Perception, unflipped: Perception) -> None:
    frames = _frames(data_path("video", "group_1080p.mp4"), 3, 20)
    changed = 0
    for frame in frames:
        faces, scores, _ = flipped.analyze(frame)
        assert faces and len(scores) == len(faces)
        plain_faces, plain_scores, _ = unflipped.analyze(frame)
        assert [f.box for f in faces] == [f.box for f in plain_faces]  # flip changes emotions only
        classifier = flipped.classifier
        for face, got, plain in zip(faces, scores, plain_scores):
            crop = classifier.face_crop(frame, face)
            direct = classifier.scores(classifier.model.infer(crop)).probs
            mirror = classifier.scores(classifier.model.infer(np.ascontiguousarray(crop[:, ::-1]))).probs
            expected = (direct + mirror) / 2
            assert np.abs(got.probs - expected / expected.sum()).max() < 1e-5
            assert np.abs(plain.probs - direct).max() < 1e-5  # without flip: the crop alone
            changed += float(np.abs(got.probs - plain.probs).max()) > 1e-3
    assert changed > 0  # mirror images read differently: the averaging is not a no-op on these faces


def test_mirrored_crop_matrices_give_mirror_images(prepared_models: None) -> None:
    """The frame graphs path mirrors a crop through its matrix: the crop graph's output equals crop[:, ::-1]."""
    frame = _frames(data_path("video", "woman2.mp4"), 1, 1)[0]
    fmt = FrameFormat(frame.shape[1], frame.shape[0], "bgr")
    session = ort.InferenceSession(crop_graph(fmt, (64, 64), "gray").SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    boxes = np.array([[200.0, 60.0, 330.0, 220.0], [10.5, 20.25, 90.0, 130.0]])
    inverse = inverse_affine(box_crop_matrices(boxes, (64, 64), 0.0)).astype(np.float32)

    def crops(matrices: np.ndarray) -> np.ndarray:
        feeds = {FRAME_INPUT: frame[None], MATRIX_INPUT: matrices, FRAME_INDEX_INPUT: np.zeros(len(matrices), np.int64)}
        return np.asarray(session.run([CROP_OUTPUT], feeds)[0])

    plain, mirror = crops(inverse), crops(mirrored(inverse, 64))
    assert plain.std() > 5  # real face pixels, not a flat border
    assert np.abs(mirror.astype(np.int16) - plain[:, :, ::-1].astype(np.int16)).max() <= 1


def test_graph_path_flip_agrees_with_the_opencv_path(flipped: Perception, app_config: Any) -> None:
    graph = load_perception(_with_flip(app_config, frame_path="graph"))
    if not isinstance(graph, FramePerception):
        raise TypeError(f"frame_path graph gave {type(graph).__name__}")
    try:
        for frame in _frames(data_path("video", "woman2.mp4"), 6, 9):
            ref_faces, ref_scores, _ = flipped.analyze(frame)
            faces, scores, _ = graph.analyze(frame)
            assert len(faces) == len(ref_faces) >= 1
            for a, b in zip(ref_scores, scores):
                assert np.abs(a.probs - b.probs).max() <= 0.01  # the paths' crops differ by < 1 grey level
    finally:
        graph.close()
