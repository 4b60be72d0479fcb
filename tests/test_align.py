"""Five-point alignment and box crops (pipeline/vision/align.py), on synthetic images and on the real FER2013 crops."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pipeline.vision.align import (
    FER_TEMPLATE,
    align_face,
    box_crop,
    similarity_transform,
)
from tests.conftest import data_path


def _similarity(angle_deg: float, scale: float, tx: float, ty: float) -> np.ndarray:
    a = np.deg2rad(angle_deg)
    rotation = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    return np.hstack([scale * rotation, [[tx], [ty]]])


def _apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    return points @ matrix[:, :2].T + matrix[:, 2]


SRC = np.array([[38.3, 51.7], [73.5, 51.5], [56.0, 71.7], [41.5, 92.4], [70.7, 92.2]])  # ArcFace-like 5 points


@pytest.mark.parametrize(("angle", "scale", "tx", "ty"), [(30.0, 1.7, 12.0, -5.0), (-75.0, 0.35, -140.0, 260.0),
                                                          (0.0, 1.0, 0.0, 0.0), (179.0, 2.5, 3.0, 4.0)])
def test_similarity_transform_recovers_a_known_transform(angle: float, scale: float, tx: float, ty: float) -> None:
    truth = _similarity(angle, scale, tx, ty)
    found = similarity_transform(SRC, _apply(truth, SRC))
    assert found.shape == (2, 3)
    np.testing.assert_allclose(found, truth, atol=1e-9)
    assert np.linalg.det(found[:, :2]) > 0


def test_similarity_transform_never_reflects() -> None:
    mirrored = SRC * np.array([-1.0, 1.0]) + np.array([200.0, 0.0])  # a reflection cannot be a similarity
    found = similarity_transform(SRC, mirrored)
    assert np.linalg.det(found[:, :2]) > 0
    # it is still a rotation + uniform scale: the 2x2 part is s * orthonormal
    part = found[:, :2]
    s2 = np.linalg.det(part)
    np.testing.assert_allclose(part @ part.T, s2 * np.eye(2), atol=1e-9)
    # and it is the best such map: no rotation on a fine grid (with its optimal scale and shift) fits better
    src_c, dst_c = SRC - SRC.mean(axis=0), mirrored - mirrored.mean(axis=0)
    residual = np.sum((_apply(found, SRC) - mirrored) ** 2)
    best = np.inf
    for angle in np.linspace(0.0, 360.0, 7200, endpoint=False):
        rotated = src_c @ _similarity(angle, 1.0, 0.0, 0.0)[:, :2].T
        scale = max(0.0, np.sum(dst_c * rotated) / np.sum(rotated**2))
        best = min(best, np.sum((dst_c - scale * rotated) ** 2))
    assert residual <= best + 1e-6


def test_similarity_transform_least_squares_with_noise() -> None:
    rng = np.random.default_rng(0)
    truth = _similarity(12.0, 0.8, 30.0, 40.0)
    noisy = _apply(truth, SRC) + rng.normal(0, 0.5, SRC.shape)
    found = similarity_transform(SRC, noisy)
    np.testing.assert_allclose(found[:, :2], truth[:, :2], atol=0.02)
    np.testing.assert_allclose(_apply(found, SRC), _apply(truth, SRC), atol=1.0)
    # least squares: the fit's residual is no worse than the true transform's
    assert np.sum((_apply(found, SRC) - noisy) ** 2) <= np.sum((_apply(truth, SRC) - noisy) ** 2) + 1e-9


# BGR colours, pairwise far apart in direction (so blurred edges are still attributable)
COLOURS = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [0, 255, 255], [255, 0, 255]], dtype=np.float64)


def _dot_centres(image: np.ndarray) -> np.ndarray:
    """Intensity-weighted centroid of each colour's pixels (assigned by colour direction)."""
    pixels = image.reshape(-1, 3).astype(np.float64)
    norm = np.linalg.norm(pixels, axis=1)
    lit = norm > 30
    unit = COLOURS / np.linalg.norm(COLOURS, axis=1, keepdims=True)
    cosine = (pixels[lit] @ unit.T) / norm[lit, None]
    label = np.argmax(cosine, axis=1)
    good = cosine[np.arange(len(label)), label] > 0.95
    ys, xs = np.divmod(np.flatnonzero(lit), image.shape[1])
    centres = np.full((len(COLOURS), 2), np.nan)
    for k in range(len(COLOURS)):
        sel = good & (label == k)
        if sel.any():
            w = norm[lit][sel]
            centres[k] = [np.sum(xs[sel] * w) / w.sum(), np.sum(ys[sel] * w) / w.sum()]
    return centres


@pytest.mark.parametrize("size", [(64, 64), (96, 80)])
def test_align_face_puts_the_landmarks_on_the_template(size: tuple[int, int]) -> None:
    # a face rotated by 20 degrees at 3x the template scale of a 64-px crop, centred in a 400x300 frame
    pose = _similarity(20.0, 3.0, 0.0, 0.0)
    placed = _apply(pose, FER_TEMPLATE * 64)
    landmarks = np.round(placed - placed.mean(axis=0) + np.array([200.0, 150.0]))  # integer pixels for the dots
    assert landmarks.min() > 40 and landmarks[:, 0].max() < 360 and landmarks[:, 1].max() < 260
    image = np.zeros((300, 400, 3), np.uint8)
    for (x, y), colour in zip(landmarks.astype(int), COLOURS):
        cv2.circle(image, (int(x), int(y)), 7, tuple(int(c) for c in colour), thickness=-1)
    # Detector landmarks use pixel-edge coordinates (pixel i spans [i, i+1), its centre is i + 0.5): a dot drawn
    # at pixel index x is at landmark x + 0.5, and a dot found at index x in the crop is at template x + 0.5.
    edge_landmarks = landmarks + 0.5
    crop = align_face(image, edge_landmarks.astype(np.float32), size)
    width, height = size
    assert crop.shape == (height, width, 3)
    found = _dot_centres(crop) + 0.5
    assert not np.isnan(found).any(), found
    # where the least-squares similarity sends the landmarks (align_face returns only the image), derived here without
    # similarity_transform: a similarity without reflection is z -> a z + b on complex numbers, and its least-squares
    # fit is linear regression: a = sum(conj(src_c) dst_c) / sum(|src_c|^2), b = mean(dst) - a mean(src)
    target = FER_TEMPLATE * np.array([width, height])
    src, dst = edge_landmarks @ np.array([1.0, 1.0j]), target @ np.array([1.0, 1.0j])
    src_c, dst_c = src - src.mean(), dst - dst.mean()
    a = np.sum(np.conj(src_c) * dst_c) / np.sum(np.abs(src_c) ** 2)
    mapped = a * src_c + dst.mean()
    expected = np.stack([mapped.real, mapped.imag], axis=1)
    # each coloured dot is found, in its own place, where the transform sends it (within a fraction of a pixel)
    np.testing.assert_allclose(found, expected, atol=0.6)
    if width == height:
        # square crop: the template is reachable by a similarity, so the dots sit on the template itself
        np.testing.assert_allclose(expected, target, atol=0.25)  # landmarks were rounded to whole source pixels (/3)
        np.testing.assert_allclose(found, target, atol=0.6)
    else:
        # a non-square output stretches the template: no similarity fits it exactly, the fit is a compromise
        assert np.abs(found - target).max() < 3.0


def test_align_face_keeps_grey_images_grey_and_template_is_respected() -> None:
    image = np.zeros((120, 120), np.uint8)
    cv2.circle(image, (60, 40), 3, 255, -1)
    template = np.array([[0.3, 0.3], [0.7, 0.3], [0.5, 0.5], [0.35, 0.7], [0.65, 0.7]])
    landmarks = template * 120  # already on this template at 120 px -> a pure 1/2.5 scaling to 48 px
    crop = align_face(image, landmarks, (48, 48), template=template)
    assert crop.shape == (48, 48)
    y, x = np.unravel_index(np.argmax(cv2.GaussianBlur(crop.astype(np.float32), (5, 5), 0)), crop.shape)
    assert abs(x - 60 / 2.5) <= 1 and abs(y - 40 / 2.5) <= 1


def _centroid(grey: np.ndarray) -> tuple[float, float]:
    ys, xs = np.mgrid[0:grey.shape[0], 0:grey.shape[1]]
    return float((grey * xs).sum() / grey.sum()), float((grey * ys).sum() / grey.sum())


def test_box_crop_shape_and_centring() -> None:
    image = np.zeros((200, 300, 3), np.uint8)
    image[60:100, 150:190] = 255  # white 40x40 square: box (150, 60, 190, 100) in pixel-edge coordinates
    crop = box_crop(image, (150.0, 60.0, 190.0, 100.0), (64, 64), margin=0.1)
    assert crop.shape == (64, 64, 3)
    grey = crop[:, :, 0].astype(np.float64) / 255.0
    cx, cy = _centroid(grey)
    # centred to within half an output pixel (the centre of a 64-px image is 31.5 in pixel-centre coordinates)
    assert abs(cx - 31.5) <= 0.5 and abs(cy - 31.5) <= 0.5
    # margin 0.1 on each side: the square fills 1/1.2 of the crop -> 53.3 of 64 pixels, with black all around
    assert grey.sum(axis=1).max() == pytest.approx(64 / 1.2, abs=1.0)
    assert grey.sum(axis=0).max() == pytest.approx(64 / 1.2, abs=1.0)
    assert grey[:4].max() == 0 and grey[-4:].max() == 0 and grey[:, :4].max() == 0 and grey[:, -4:].max() == 0


def test_box_crop_non_square_box_and_size() -> None:
    image = np.zeros((200, 300), np.uint8)
    image[50:150, 100:140] = 255  # tall 40x100 rectangle
    crop = box_crop(image, (100.0, 50.0, 140.0, 150.0), (32, 48), margin=0.0)
    assert crop.shape == (48, 32)
    # the square side is the box's long side (100 px) -> scale 0.32: the rectangle is 12.8 x 32 pixels, centred
    cx, cy = _centroid(crop.astype(np.float64) / 255.0)
    assert abs(cx - 15.5) <= 0.6 and abs(cy - 23.5) <= 0.6
    assert (crop > 127).any(axis=1).sum() == pytest.approx(32, abs=1)
    assert (crop > 127).any(axis=0).sum() == pytest.approx(12.8, abs=1.5)


@pytest.mark.parametrize(("x0", "side"), [(150, 40), (100, 160)])  # scale 1.33 (upsampling) and 0.33 (downsampling)
def test_box_crop_is_exactly_centred(x0: int, side: int) -> None:
    image = np.zeros((300, 400), np.uint8)
    image[20:20 + side, x0:x0 + side] = 255
    crop = box_crop(image, (float(x0), 20.0, float(x0 + side), float(20 + side)), (64, 64), margin=0.1)
    grey = crop.astype(np.float64) / 255.0
    cx, cy = _centroid(grey)
    assert abs(cx - 31.5) < 0.02 and abs(cy - 31.5) < 0.02
    # a centred square gives mirror-symmetric row and column profiles
    np.testing.assert_allclose(grey.sum(axis=0), grey.sum(axis=0)[::-1], atol=0.05)
    np.testing.assert_allclose(grey.sum(axis=1), grey.sum(axis=1)[::-1], atol=0.05)


def test_fer_template_rederived_from_fer2013_detections(perception) -> None:  # type: ignore[no-untyped-def]
    """Median RetinaFace landmarks on the FER2013 crops, mirror-symmetrised, reproduce FER_TEMPLATE."""
    root = data_path("faces", "fer2013")
    files = sorted(root.glob("*/*.jpg"))
    assert len(files) == 350
    detector = perception.detector
    images = [cv2.imread(str(f), cv2.IMREAD_COLOR) for f in files]
    assert all(im is not None and im.shape == (48, 48, 3) for im in images)
    # The detector never enlarges a frame (and finds few 48-px faces at scale 1): enlarge the crops 10x here, as its
    # letterbox into 640x480 once did.
    images = [cv2.resize(im, (480, 480), interpolation=cv2.INTER_LINEAR) for im in images]
    singles = []
    chunk = 64  # stay below the model's request queue size; the chunk batches together
    for start in range(0, len(images), chunk):
        pending = [detector.submit(im) for im in images[start:start + chunk]]
        for future, fit in pending:
            faces = detector.finish(future.result(timeout=60), fit)
            if len(faces) == 1:
                singles.append(faces[0].landmarks / 480.0)
    assert len(singles) >= 200, f"only {len(singles)} of 350 crops have exactly one face"
    points = np.array(singles)  # N x 5 x 2
    mirrored = points.copy()
    mirrored[:, :, 0] = 1.0 - mirrored[:, :, 0]
    mirrored = mirrored[:, [1, 0, 2, 4, 3]]  # the image's right eye becomes its left eye, and so on
    median = np.median(np.concatenate([points, mirrored]), axis=0)
    np.testing.assert_allclose(median, FER_TEMPLATE, atol=0.03)
    # the data is what it claims to be: eyes above nose above mouth, right features left of left features
    assert median[0, 1] < median[2, 1] < median[3, 1]
    assert median[0, 0] < median[2, 0] < median[1, 0] and median[3, 0] < median[4, 0]
