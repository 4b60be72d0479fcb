"""Cutting a face out of a frame for the classifier: five-point similarity alignment, or a square margin box.

Alignment follows insightface's `face_align`: a least-squares similarity transform (Umeyama) maps the detector's five
landmarks onto a template, and one warpAffine produces the crop. The template here is not ArcFace's: it is the mean
landmark position of the classifier's own training crops (FER2013), so aligned faces are framed the way the
classifier saw faces during training. `tests/test_align.py` re-derives it from the data.
"""

from __future__ import annotations

import cv2
import numpy as np

# Median RetinaFace landmarks on 733 FER2013 training crops (mirror-symmetrised), as fractions of the crop side:
# right eye, left eye, nose tip, right mouth corner, left mouth corner (image left/right).
FER_TEMPLATE = np.array(
    [[0.3167, 0.3802], [0.6833, 0.3802], [0.5000, 0.5854], [0.3458, 0.7677], [0.6542, 0.7677]], dtype=np.float64
)


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """2 x 3 matrix of the rotation+uniform scale+translation that best maps `src` points onto `dst` (Umeyama 1991)."""
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_c, dst_c = src - src_mean, dst - dst_mean
    covariance = dst_c.T @ src_c / len(src)
    u, singular, vt = np.linalg.svd(covariance)
    sign = np.ones(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[1] = -1.0
    rotation = u @ np.diag(sign) @ vt
    variance = (src_c**2).sum() / len(src)
    scale = (singular * sign).sum() / variance if variance > 0 else 1.0
    translation = dst_mean - scale * rotation @ src_mean
    return np.hstack([scale * rotation, translation[:, None]])


def _pixel_centres(matrix: np.ndarray) -> np.ndarray:
    """Adjust a transform (or a stack [..., 2, 3]) written in pixel-edge coordinates (detector boxes) to warpAffine's
    pixel-centre ones."""
    adjusted = matrix.astype(np.float64).copy()
    adjusted[..., :, 2] += adjusted[..., :, :2] @ np.array([0.5, 0.5]) - 0.5
    return adjusted


def align_matrix(landmarks: np.ndarray, size: tuple[int, int], template: np.ndarray = FER_TEMPLATE) -> np.ndarray:
    """The 2 x 3 float64 frame → crop matrix (pixel centres, as warpAffine takes it) that puts the five `landmarks` on
    `template` (fractions of `size`). One definition for the host crop and the GPU crop graph (modelprep.frame_graphs),
    so both paths frame a face identically."""
    width, height = size
    return _pixel_centres(similarity_transform(landmarks, template * np.array([width, height])))


def box_crop_matrix(box: tuple[float, float, float, float], size: tuple[int, int], margin: float = 0.1) -> np.ndarray:
    """The 2 x 3 float64 frame → crop matrix (pixel centres) of a square crop centred on `box`, enlarged by `margin`
    of its long side; shared by `box_crop` and the GPU crop graph for the same reason as `align_matrix`."""
    return box_crop_matrices(np.asarray([box], dtype=np.float64), size, margin)[0]


def box_crop_matrices(boxes: np.ndarray, size: tuple[int, int], margin: float = 0.1) -> np.ndarray:
    """`box_crop_matrix` for a stack of boxes [F, 4] at once → [F, 2, 3] (the frame graphs path crops every face of
    a batch together; one face at a time cost ~50 µs of Python each, 24 ms for a batch of 64 1080p frames)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    side = np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]) * (1.0 + 2.0 * margin)
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2.0, (boxes[:, 1] + boxes[:, 3]) / 2.0
    width, height = size
    scale = width / np.maximum(side, 1.0)
    matrices = np.zeros((len(boxes), 2, 3))
    matrices[:, 0, 0] = matrices[:, 1, 1] = scale
    matrices[:, 0, 2] = width / 2.0 - scale * cx
    matrices[:, 1, 2] = height / 2.0 - scale * cy
    return _pixel_centres(matrices)


def inverse_affine(matrix: np.ndarray) -> np.ndarray:
    """Invert 2 x 3 affine matrices (one, or a stack [..., 2, 3]): crop pixel centre → frame pixel centre.

    The GPU crop graph samples the frame at the inverse map of each crop pixel, as warpAffine does internally; this is
    cv2.invertAffineTransform's formula (a singular matrix gives zeros rather than an error), vectorised so a whole
    batch of faces is inverted at once."""
    m = np.asarray(matrix, dtype=np.float64)
    a, b, tx = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    c, d, ty = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    det = a * d - b * c
    inv_det = np.divide(1.0, det, out=np.zeros_like(det), where=det != 0)
    a_i, b_i, c_i, d_i = d * inv_det, -b * inv_det, -c * inv_det, a * inv_det
    rows = [[a_i, b_i, -a_i * tx - b_i * ty], [c_i, d_i, -c_i * tx - d_i * ty]]
    return np.stack([np.stack(row, axis=-1) for row in rows], axis=-2)


def align_face(image: np.ndarray, landmarks: np.ndarray, size: tuple[int, int],
               template: np.ndarray = FER_TEMPLATE) -> np.ndarray:
    """Warp the face so its landmarks land on `template` (fractions of `size`); returns size[1] x size[0] x C."""
    width, height = size
    matrix = align_matrix(landmarks, (width, height), template)
    return cv2.warpAffine(image, matrix, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def box_crop(image: np.ndarray, box: tuple[float, float, float, float], size: tuple[int, int],
             margin: float = 0.1) -> np.ndarray:
    """A square crop centred on `box`, enlarged by `margin` of its long side, resized to `size`."""
    width, height = size
    matrix = box_crop_matrix(box, (width, height), margin)
    return cv2.warpAffine(image, matrix, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
