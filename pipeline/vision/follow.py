"""Following a face between detections by its look: the face as last detected, shrunk to a small grey template,
found again near where its track's motion puts it (normalised cross-correlation, `cv2.matchTemplate`).

Why: with `detector.interval` the frames between detections take their faces from the tracker. A constant velocity
alone misses a camera that pans unevenly or a visitor who stops (group_1080p.mp4: faces moving 35 px a frame); the
face's own pixels say where it went, for well under a millisecond per face at template scale.

A frame that stays on the GPU (NVDEC) is read the same way: only the window around the face is copied to the host
(`DeviceImage.window`), never the whole frame (`tracking.follow_by`).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from pipeline.core.types import FrameImage

Box = tuple[float, float, float, float]

TEMPLATE_WIDTH = 24  # pixels: a face is matched at this width (small: fast, and blind to expression detail)
SEARCH = 0.6  # the search window reaches this share of the face's size beyond the expected box on each side
MIN_SCORE = 0.5  # below this correlation the template is not trusted and the motion's guess stands


@dataclass(frozen=True)
class FaceTemplate:
    """A face's grey pixels at `scale` (template pixels per frame pixel) and the box they were cut from."""

    pixels: np.ndarray
    scale: float
    box: Box


def _grey_region(frame: FrameImage, box: Box, scale: float) -> tuple[np.ndarray, tuple[int, int]] | None:
    """The frame's pixels inside `box` (clipped to the frame), grey, resized by `scale`; and the region's top-left.
    A frame on the GPU gives only that region's pixels to the host."""
    height, width = frame.shape[:2]
    x1, y1 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    if x2 - x1 < 4 or y2 - y1 < 4:
        return None
    region = frame[y1:y2, x1:x2] if isinstance(frame, np.ndarray) else frame.window(x1, y1, x2, y2)
    grey = cv2.cvtColor(region, cv2.COLOR_BGR2GRAY) if region.ndim == 3 else region
    size = (max(1, round((x2 - x1) * scale)), max(1, round((y2 - y1) * scale)))
    return cv2.resize(grey, size, interpolation=cv2.INTER_AREA), (x1, y1)


def face_template(frame: FrameImage, box: Box) -> FaceTemplate | None:
    """The template of the face in `box` of a BGR (or grey) frame, on the host or the GPU; None for a face too small
    or off the frame."""
    scale = min(1.0, TEMPLATE_WIDTH / max(box[2] - box[0], 1e-6))
    cut = _grey_region(frame, box, scale)
    if cut is None:
        return None
    pixels, (x1, y1) = cut
    # the template covers what was inside the frame: its box is the clipped one
    clipped = (float(x1), float(y1), x1 + pixels.shape[1] / scale, y1 + pixels.shape[0] / scale)
    return FaceTemplate(pixels, scale, clipped)


def _peak_offset(before: float, at: float, after: float) -> float:
    """Where a parabola through three neighbouring scores peaks, relative to the middle one (-0.5 to 0.5)."""
    curvature = before - 2.0 * at + after
    if not np.isfinite(curvature) or curvature >= 0:  # flat or undefined (a flat patch scores NaN): stay put
        return 0.0
    return float(np.clip(0.5 * (before - after) / curvature, -0.5, 0.5))


def _subpixel(scores: np.ndarray, bx: int, by: int) -> tuple[float, float]:
    """The best match's position within its template pixel. Why: one template pixel is 4 frame pixels of a 100 px
    face, and a box off by that much changes the emotion read from it (BENCHMARKS.md, "Followed faces placed between
    template pixels")."""
    row, col = scores[by], scores[:, bx]
    dx = _peak_offset(row[bx - 1], row[bx], row[bx + 1]) if 0 < bx < len(row) - 1 else 0.0
    dy = _peak_offset(col[by - 1], col[by], col[by + 1]) if 0 < by < len(col) - 1 else 0.0
    return dx, dy


def locate(frame: FrameImage, template: FaceTemplate, expected: Box) -> Box | None:
    """Where the template's face is in `frame`, searched around `expected` (its size kept); None when the best
    match is weak or the search window is too small."""
    width, height = expected[2] - expected[0], expected[3] - expected[1]
    window = (expected[0] - SEARCH * width, expected[1] - SEARCH * height,
              expected[2] + SEARCH * width, expected[3] + SEARCH * height)
    cut = _grey_region(frame, window, template.scale)
    if cut is None:
        return None
    pixels, (x1, y1) = cut
    if pixels.shape[0] < template.pixels.shape[0] or pixels.shape[1] < template.pixels.shape[1]:
        return None
    scores = cv2.matchTemplate(pixels, template.pixels, cv2.TM_CCOEFF_NORMED)
    _, best, _, (bx, by) = cv2.minMaxLoc(scores)
    if not np.isfinite(best) or best < MIN_SCORE:
        return None
    dx, dy = _subpixel(scores, bx, by)
    left, top = x1 + (bx + dx) / template.scale, y1 + (by + dy) / template.scale
    box_w, box_h = template.box[2] - template.box[0], template.box[3] - template.box[1]
    return (left, top, left + box_w, top + box_h)
