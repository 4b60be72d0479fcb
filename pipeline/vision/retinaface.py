"""RetinaFace's pre- and post-processing: letterbox to the detector input (one size, or one per camera shape with
`detector.input_size: auto`: frames of one input size batch together), vectorised decode of the candidates the
graph keeps, NMS, and the size/count filter. Pure functions on arrays.

The prepared model takes uint8 BGR NHWC pixels; mean subtraction happens inside the graph (modelprep.graph_edit).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np

from pipeline.core.types import Detection
from pipeline.vision.track import box_iou

STRIDES = (8, 16, 32)
ANCHOR_SIZES = ((16, 32), (64, 128), (256, 512))
CENTER_VARIANCE = 0.1
SIZE_VARIANCE = 0.2
# Padding colour = the model's training mean (BGR), so padded pixels are zero after normalisation.
PAD_BGR = (104, 117, 123)
# Each side of the detector input divides by the largest feature stride.
INPUT_STEP = STRIDES[-1]


@dataclass(frozen=True)
class Letterbox:
    """How a frame was fitted into the detector input: scaled by `scale`, placed at the top-left corner."""

    scale: float
    frame_size: tuple[int, int]  # width, height of the original frame


def fit_size(frame_size: tuple[int, int], size: tuple[int, int]) -> tuple[float, tuple[int, int]]:
    """The letterbox geometry of a frame of `frame_size` (width, height) in `size`: its scale and resized size.

    The scale is capped at 1: a frame smaller than the input is padded, never enlarged (upscaling invents no detail
    and costs the detector the same as a real large frame). One definition, used by `letterbox` here and by the
    frame graphs (modelprep.frame_graphs)."""
    width, height = frame_size
    target_w, target_h = size
    scale = min(target_w / width, target_h / height, 1.0)
    return scale, (min(target_w, max(1, round(width * scale))), min(target_h, max(1, round(height * scale))))


def _round_up(value: int, step: int = INPUT_STEP) -> int:
    return max(step, -(-value // step) * step)


@lru_cache(maxsize=256)
def auto_input_size(frame_size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """The detector input (width, height) that follows a frame's aspect ratio (`detector.input_size: auto`).

    A fixed 640x480 input spends a quarter of its pixels on padding for a 16:9 camera. Here the input's long side
    is `max_side` and the other side the multiple of 32 nearest to the frame's proportion of it (at least 32):
    1920x1080 and 1280x720 → 640x352, 640x480 → 640x480, portrait 1080x1920 → 352x640. A frame whose long side
    fits within `max_side` is not enlarged (fit_size never upscales): its input is the frame rounded up to
    multiples of 32, so 596x336 → 608x352 at scale 1. Cached: called for every frame, with few distinct sizes."""
    width, height = int(frame_size[0]), int(frame_size[1])
    if max(width, height) <= max_side:
        return _round_up(width), _round_up(height)
    nearest = int(max_side * min(width, height) / max(width, height) / INPUT_STEP + 0.5)  # halves round up
    short = max(INPUT_STEP, nearest * INPUT_STEP)
    return (max_side, short) if width >= height else (short, max_side)


def halvings(size: tuple[int, int], target: tuple[int, int]) -> int:
    """How many exact 2x2 halvings `shrink` applies before its last bilinear step."""
    (width, height), (target_w, target_h) = size, target
    count = 0
    while width >= 2 * target_w and height >= 2 * target_h:
        width, height, count = width // 2, height // 2, count + 1
    return count


def letterbox(image: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, Letterbox]:
    """Resize `image` (H x W x 3 BGR) to fit `size` (width, height) keeping its aspect ratio; pad bottom/right."""
    height, width = image.shape[:2]
    target_w, target_h = size
    scale, (new_w, new_h) = fit_size((width, height), size)
    resized = image if (new_w, new_h) == (width, height) else shrink(image, (new_w, new_h))
    canvas = cv2.copyMakeBorder(resized, 0, target_h - new_h, 0, target_w - new_w, cv2.BORDER_CONSTANT,
                                value=PAD_BGR)
    return canvas, Letterbox(scale, (width, height))


def shrink(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize to `size` (width, height) without aliasing, cheaply.

    Bilinear alone aliases below half size; INTER_AREA does not, but at a non-integer factor it is slow (1080p to
    626x352, one thread on dev-2c: 11.2 ms). So: halve with INTER_AREA (its fast path for a factor of exactly 2)
    while the image is still at least twice the target, then bilinear for the last factor below 2: 1.2 ms, within
    0.56 grey levels on average of INTER_AREA on group_1080p.mp4 frames (tests/test_detect.py checks the faces)."""
    target_w, target_h = size
    height, width = image.shape[:2]
    for _ in range(halvings((width, height), size)):
        width, height = width // 2, height // 2
        image = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    if (width, height) == (target_w, target_h):
        return image
    return cv2.resize(image, (target_w, target_h), interpolation=cv2.INTER_LINEAR)


@lru_cache(maxsize=32)  # one per input size in use: with input_size auto, one per camera shape
def anchor_grid(size: tuple[int, int]) -> np.ndarray:
    """Anchors (cx, cy, w, h) in input pixels for an input of `size`, in the network's output order.

    Order: per stride, row-major cells, the stride's two sizes per cell."""
    width, height = size
    grids = []
    for stride, sizes in zip(STRIDES, ANCHOR_SIZES):
        cols, rows = -(-width // stride), -(-height // stride)
        ys, xs = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        centers = (np.stack([xs.ravel(), ys.ravel()], axis=1) + 0.5) * stride
        centers = np.repeat(centers, len(sizes), axis=0)
        wh = np.tile(np.array([[s, s] for s in sizes], dtype=np.float64), (rows * cols, 1))
        grids.append(np.hstack([centers, wh]))
    grid = np.vstack(grids).astype(np.float32)
    grid.setflags(write=False)
    return grid


def decode(outputs: dict[str, np.ndarray], input_size: tuple[int, int], box: Letterbox, score_threshold: float,
           nms_threshold: float) -> list[Detection]:
    """Turn one image's candidates into detections in frame pixels.

    The prepared graph already kept the best anchors, best first (see graph_edit.add_top_candidates): `top_score`
    K, `top_anchor` K (index into the anchor grid), `top_loc` K x 4 and `top_landmarks` K x 10."""
    scores = outputs["top_score"]
    keep = np.flatnonzero(scores > score_threshold)
    if keep.size == 0:
        return []
    anc = anchor_grid(input_size)[outputs["top_anchor"][keep]]
    loc = outputs["top_loc"][keep]
    centers = anc[:, :2] + loc[:, :2] * CENTER_VARIANCE * anc[:, 2:]
    sizes = anc[:, 2:] * np.exp(loc[:, 2:] * SIZE_VARIANCE)
    boxes = np.hstack([centers - sizes / 2, centers + sizes / 2])
    points = outputs["top_landmarks"][keep].reshape(-1, 5, 2)
    points = anc[:, None, :2] + points * CENTER_VARIANCE * anc[:, None, 2:]
    selected = _nms(boxes, scores[keep], score_threshold, nms_threshold)
    return [_to_frame(boxes[i], float(scores[keep][i]), points[i], box) for i in selected]


def _nms(boxes: np.ndarray, scores: np.ndarray, score_threshold: float, nms_threshold: float) -> list[int]:
    xywh = np.hstack([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]]).tolist()
    picked = cv2.dnn.NMSBoxes(xywh, scores.tolist(), score_threshold, nms_threshold)
    return [int(i) for i in np.asarray(picked).reshape(-1)]


def _to_frame(box: np.ndarray, score: float, points: np.ndarray, fit: Letterbox) -> Detection:
    width, height = fit.frame_size
    x1, y1, x2, y2 = (box / fit.scale).tolist()
    clipped = (max(0.0, x1), max(0.0, y1), min(float(width), x2), min(float(height), y2))
    return Detection(box=clipped, score=score, landmarks=(points / fit.scale).astype(np.float32))


def filter_faces(faces: list[Detection], min_face_px: int, max_faces: int) -> list[Detection]:
    """Drop faces smaller than `min_face_px` on their short side; keep the `max_faces` largest."""
    kept = [f for f in faces if min(f.width, f.height) >= min_face_px]
    kept.sort(key=lambda f: f.area, reverse=True)
    return kept[:max_faces]


MIRROR_ORDER = [1, 0, 2, 4, 3]  # a mirrored face's points in the detector's order: eyes and mouth corners swap
TWIN_IOU = 0.5  # a face and its mirror twin (unmirrored) overlap at least this much


def unmirror(face: Detection, width: int) -> Detection:
    """A detection made on the mirror image of a frame `width` pixels wide, in the frame's own coordinates."""
    x1, y1, x2, y2 = face.box
    points = np.asarray(face.landmarks, np.float32)[MIRROR_ORDER].copy()
    points[:, 0] = width - points[:, 0]
    return Detection(box=(width - x2, y1, width - x1, y2), score=face.score, landmarks=points)


def merge_mirrored(faces: list[Detection], mirrored: list[Detection], width: int) -> list[Detection]:
    """The faces of a frame from the detector's run on it and on its mirror image (detector.flip): each face and
    its twin (most overlap first, IoU >= TWIN_IOU) averaged, box, score and landmarks; a face found in one run only
    kept as found.

    Why: the detector is not mirror-symmetric, so a photo and its mirror get landmarks that disagree by more than the
    head pose can bear (faces/wild: mirrored yaw within 3° for 75 % of faces). Averaged with its twin, a face's
    result for the mirror image is exactly the mirror of its result for the photo, whatever the network's bias."""
    twins = [unmirror(face, width) for face in mirrored]
    pairs = sorted(((box_iou(a.box, b.box), i, j) for i, a in enumerate(faces) for j, b in enumerate(twins)),
                   reverse=True)
    matched: dict[int, int] = {}
    taken: set[int] = set()
    for overlap, i, j in pairs:
        if overlap < TWIN_IOU:
            break
        if i not in matched and j not in taken:
            matched[i] = j
            taken.add(j)
    merged = [_average(face, twins[matched[i]]) if i in matched else face for i, face in enumerate(faces)]
    return merged + [twin for j, twin in enumerate(twins) if j not in taken]


def _average(a: Detection, b: Detection) -> Detection:
    box = tuple((u + v) / 2.0 for u, v in zip(a.box, b.box))
    points = ((np.asarray(a.landmarks, np.float64) + np.asarray(b.landmarks, np.float64)) / 2.0).astype(np.float32)
    return Detection(box=box, score=(a.score + b.score) / 2.0, landmarks=points)  # type: ignore[arg-type]
