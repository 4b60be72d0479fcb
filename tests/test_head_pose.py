"""Head pose from the five landmarks (issue 27 item 3), checked without labels on real photos: a mirrored photo's
yaw is the opposite and its pitch the same, and faces whose landmarks are symmetric come out frontal. The detector
runs on each photo and on its mirror image, so the check includes the detector's own landmark noise (BENCHMARKS.md
has the full figures on all 171 photos: without detector.flip the issue's ±3° for every face is not met; with it, it
is, exactly, and the test below checks that)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import data_path, load_tool

PHOTOS = 60  # of faces/wild, sorted by name (keeps the suite short; tools/lookat_check.py runs them all)


@pytest.fixture(scope="module")
def poses(prepared_models: None, perception: Any) -> list[tuple[Any, Any, bool]]:
    """(pose of the photo's largest face, pose of the mirrored photo's, whether its landmarks are symmetric), as
    tools/lookat_check.py finds them."""
    photos = sorted(Path(data_path("faces", "wild")).rglob("*.*"))[:PHOTOS]
    return [(m.pose, m.mirrored, m.symmetric) for m in load_tool("lookat_check").mirrored_poses(perception, photos)]


def test_a_mirrored_photo_turns_the_other_way_and_nods_the_same(poses: list) -> None:
    pairs = [(a, b) for a, b, _ in poses if a is not None and b is not None]
    assert len(pairs) >= 40
    yaw = np.array([abs(a.yaw + b.yaw) for a, b in pairs])
    pitch = np.array([abs(a.pitch - b.pitch) for a, b in pairs])
    roll = np.array([abs(a.roll + b.roll) for a, b in pairs])
    # measured on all 165 pairs: yaw median 1.5°, 75 % within 3°; pitch median 2.1°, 61 % within 3°
    assert np.median(yaw) <= 3.0 and (yaw <= 6.0).mean() >= 0.8, np.round(np.sort(yaw), 1)
    assert np.median(pitch) <= 3.0 and (pitch <= 8.0).mean() >= 0.8, np.round(np.sort(pitch), 1)
    assert np.median(roll) <= 3.0
    assert any(abs(a.yaw) > 10 for a, _ in pairs)  # the set has turned heads: the check is not all frontal faces


def test_faces_with_symmetric_landmarks_are_frontal(poses: list) -> None:
    frontal = [abs(a.yaw) < 10.0 for a, _, symmetric in poses if symmetric and a is not None]
    assert len(frontal) >= 10 and np.mean(frontal) >= 0.9  # measured 0.98 on all photos


def test_landmarks_too_close_together_give_no_pose_instead_of_an_error(poses: list, perception: Any) -> None:
    """A real face's five points shrunk towards their centre, as a distant face or a heaped profile gives them: past
    what SQPnP accepts the face has no pose (None), never an exception (one ended camera workers on the H200)."""
    from pipeline.vision.head_pose import head_pose

    photo = sorted(Path(data_path("faces", "wild")).rglob("*.*"))[0]
    import cv2

    face = max(perception.detector.detect(cv2.imread(str(photo)), 30), key=lambda d: d.area)
    points = np.asarray(face.landmarks, np.float64)
    centre = points.mean(axis=0)
    results = {}
    for spread_px in (40.0, 4.0, 0.0):
        scale = spread_px / max(float(np.ptp(points[:, 0])), 1e-6)
        shrunk = (centre + (points - centre) * scale + (400.0, 300.0)).astype(np.float32)
        results[spread_px] = head_pose(shrunk, (1920, 1080))
    assert results[40.0] is not None
    assert results[4.0] is None and results[0.0] is None
    assert head_pose(np.full((5, 2), np.nan, np.float32), (1920, 1080)) is None


@pytest.fixture(scope="module")
def flipped_poses(prepared_models: None, perception: Any, app_config: Any) -> list[Any]:
    """The same photos and mirrors as `poses`, with detector.flip: the detector also run on each image's mirror."""
    from types import SimpleNamespace

    from pipeline.inference.detector import FaceDetector

    detector = FaceDetector(perception.detector.model, app_config.detector.model_copy(update={"flip": True}))
    photos = sorted(Path(data_path("faces", "wild")).rglob("*.*"))[:PHOTOS]
    return load_tool("lookat_check").mirrored_poses(SimpleNamespace(detector=detector), photos)


def test_with_detector_flip_every_mirrored_photo_gives_the_mirrored_pose(flipped_poses: list) -> None:
    """Issue 27's target, every face within 3°: averaged with its mirror twin, a face's five points on the mirror
    image are the mirror of its points on the photo (up to rounding), so yaw and roll change sign and pitch stays.
    An unmirrored twin with its eyes not swapped, or mirrored about the wrong axis, fails this by tens of degrees."""
    pairs = [(m.pose, m.mirrored) for m in flipped_poses if m.pose is not None and m.mirrored is not None]
    assert len(pairs) >= 40
    yaw = np.array([abs(a.yaw + b.yaw) for a, b in pairs])
    pitch = np.array([abs(a.pitch - b.pitch) for a, b in pairs])
    assert yaw.max() <= 3.0 and pitch.max() <= 3.0, (np.round(np.sort(yaw)[-5:], 2), np.round(np.sort(pitch)[-5:], 2))
    assert any(abs(a.yaw) > 10 for a, _ in pairs)
    frontal = [abs(m.pose.yaw) < 10.0 for m in flipped_poses if m.symmetric and m.pose is not None]
    assert len(frontal) >= 10 and np.mean(frontal) >= 0.9


def test_detector_flip_is_refused_on_the_frame_graphs_path() -> None:
    """The flip averages two detector runs on the host: the frame graphs path, which detects inside its graph,
    refuses it at its line rather than ignoring it."""
    from pipeline.config.app import parse_config
    from pipeline.config.loader import ConfigError

    text = "cameras:\n  - {name: lobby, source: demo}\ndetector:\n  flip: true\ninference:\n  frame_path: graph\n"
    with pytest.raises(ConfigError, match=r"4: detector\.flip: .*OpenCV frame path only"):
        parse_config(text, "flip.yaml", env={})
    assert parse_config(text.replace("graph", "opencv"), "flip.yaml", env={}).detector.flip is True


def test_rotation_matrix_is_cv2_rodrigues() -> None:
    """The pose's rotation in plain Python (no second OpenCV call per fit) is cv2.Rodrigues' matrix, for rotations up
    to a half turn, a tiny one and none (measured: within 7e-16; all 117 faces of 120 photos got the same pose)."""
    import cv2

    from pipeline.vision.head_pose import rotation_matrix

    rng = np.random.default_rng(7)
    vectors = [np.zeros(3), np.array([1e-14, 0.0, 0.0]), np.array([0.0, 0.0, np.pi])]
    vectors += [rng.normal(size=3) * rng.uniform(0.0, np.pi) / 1.8 for _ in range(500)]
    for rvec in vectors:
        expected, _ = cv2.Rodrigues(rvec.reshape(3, 1))
        np.testing.assert_allclose(rotation_matrix([float(v) for v in rvec]), expected, atol=1e-12)
