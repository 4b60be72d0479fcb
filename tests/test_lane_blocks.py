"""The frame lane's array work runs in blocks so that numpy keeps the GIL on the lane's thread
(classifier.normalised: ROWS_PER_CALL rows; FrameEngine.faces_and_crops: FACES_PER_CALL faces): the results must be
the whole-batch formulas', bit for bit, whatever the batch size, across block boundaries too."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config.app import load_config
from pipeline.core.types import Detection
from pipeline.inference.classifier import ROWS_PER_CALL, normalised
from pipeline.inference.frame_faces import given_faces, joined, kept_faces
from pipeline.inference.frames import FACES_PER_CALL, FrameEngine, TrackedFrame, mirrored
from pipeline.modelprep.frame_graphs import FACE_BOX, FACE_LANDMARKS, FACE_SCORE, FrameFormat
from pipeline.modelprep.manifest import load_manifest
from pipeline.vision.align import box_crop_matrices, inverse_affine
from tests.conftest import ROOT


def _whole_batch(probs: np.ndarray, order: np.ndarray, mirrored: int) -> np.ndarray:
    ordered = probs[:, order]
    if mirrored:
        body = ordered[:-mirrored].copy()
        body[:mirrored] = (body[:mirrored] + ordered[-mirrored:]) * np.float32(0.5)
        ordered = body
    return ordered / np.maximum(ordered.sum(axis=1, keepdims=True), 1e-9)


@pytest.mark.parametrize("faces, mirrored", [(0, 0), (1, 0), (1, 1), (5, 3), (ROWS_PER_CALL, ROWS_PER_CALL),
                                             (ROWS_PER_CALL + 1, 2), (3 * ROWS_PER_CALL + 7, 2 * ROWS_PER_CALL + 5),
                                             (300, 0)])
def test_blocks_give_the_whole_batch_formula(faces: int, mirrored: int) -> None:
    rng = np.random.default_rng(faces)
    probs = rng.dirichlet(np.ones(7), faces + mirrored).astype(np.float32)
    order = np.array([6, 0, 1, 2, 3, 4, 5])
    got = normalised(probs, order, mirrored)
    assert got.shape == (faces, 7) and got.dtype == np.float32
    np.testing.assert_array_equal(got, _whole_batch(probs, order, mirrored))


def _detector_rows(frames: int, faces: int) -> dict[str, np.ndarray]:
    """The detector graph's outputs for `frames` 1080p frames with `faces` faces each (best first, -1 after)."""
    rng = np.random.default_rng(frames)
    score = np.full((frames, 64), -1.0, np.float32)
    score[:, :faces] = np.sort(rng.uniform(0.8, 1.0, (frames, faces)), axis=1)[:, ::-1]
    corner = rng.uniform(0, 1700, (frames, 64, 2))
    box = np.concatenate([corner, corner + rng.uniform(40, 200, (frames, 64, 1))], axis=2).astype(np.float32)
    return {FACE_SCORE: score, FACE_BOX: box, FACE_LANDMARKS: rng.uniform(0, 1900, (frames, 64, 5, 2)).astype(np.float32)}


@pytest.mark.parametrize("flip_followed", [True, "alternate"])
def test_crop_matrices_in_blocks_are_the_whole_batch_s(flip_followed: bool | str) -> None:
    """More faces than FACES_PER_CALL, detected and followed (turns 0 and 1): each face's crop matrix is its box's
    inverse affine, mirrored for a followed face read as its mirror image, and the mirrored reads' twins come last."""
    config = load_config(ROOT / "config" / "default.yaml")
    emotion = config.emotion.model_copy(update={"flip_followed": flip_followed})
    engine = FrameEngine([], config.detector, emotion, load_manifest("dlibface_student64"), 64, {})
    outputs = _detector_rows(20, 10)
    given = [Detection((50.0 * i, 60.0, 50.0 * i + 90, 150.0), 0.9, np.zeros((5, 2), np.float32)) for i in range(8)]
    tracked = [TrackedFrame(np.zeros((1, 1, 3), np.uint8), given, turn) for turn in range(4)]
    kept, matrices, frame_index, flips = engine.faces_and_crops(outputs, FrameFormat(1920, 1080, "rgb"), tracked, 20)

    detected = kept_faces(outputs[FACE_SCORE], outputs[FACE_BOX], outputs[FACE_LANDMARKS], (1920, 1080),
                          config.detector.min_face_px, config.detector.max_faces)
    whole = joined(detected, given_faces([frame.faces for frame in tracked]))
    assert len(kept.frame) == len(whole.frame) > 2 * FACES_PER_CALL
    expected = inverse_affine(box_crop_matrices(whole.boxes, (64, 64), config.emotion.box_margin)).astype(np.float32)
    alone = np.zeros(len(expected), bool)
    if flip_followed == "alternate":
        for position in (1, 3):  # the followed frames of odd turns
            alone[whole.rows(20 + position)] = True
    expected[alone] = mirrored(expected[alone], 64)
    twins = len(whole.frame) if flip_followed is True else len(detected.frame)
    expected = np.concatenate([expected, mirrored(expected[:twins], 64)])
    assert flips == twins
    np.testing.assert_array_equal(matrices, expected)
    np.testing.assert_array_equal(frame_index, np.concatenate([whole.frame, whole.frame[:twins]]))
