"""Following a face between detections by its look: the face as last detected, shrunk to a small grey template,
found again near where its track's motion puts it (normalised cross-correlation, `cv2.matchTemplate`).

Why: with `detector.interval` the frames between detections take their faces from the tracker. A constant velocity
alone misses a camera that pans unevenly or a visitor who stops (group_1080p.mp4: faces moving 35 px a frame); the
face's own pixels say where it went, for well under a millisecond per face at template scale.

A frame that stays on the GPU (NVDEC) is read the same way by `HostFollower`: only the window around the face is
copied to the host (`DeviceImage.windows`: every face of the frame in one round trip), never the whole frame
(`tracking.follow_by`). A `Follower` may also search on the GPU (inference.following.GraphFollower, the same formula
as ONNX: measured, not used by the daemon).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import cv2
import numpy as np

from pipeline.core.types import FrameImage

Box = tuple[float, float, float, float]

TEMPLATE_WIDTH = 24  # pixels: a face is matched at this width (small: fast, and blind to expression detail)
SEARCH = 0.6  # the search window reaches this share of the face's size beyond the expected box on each side
MIN_SCORE = 0.5  # below this correlation the template is not trusted and the motion's guess stands
MIN_FACE_PX = 4  # a face (or its part inside the frame) narrower or lower than this has no template


@dataclass(frozen=True)
class FaceTemplate:
    """A face's grey pixels at `scale` (template pixels per frame pixel) and the box they were cut from."""

    pixels: np.ndarray
    scale: float
    box: Box


Window = tuple[int, int, int, int]  # whole pixels x1, y1, x2, y2 (end excluded) inside the frame


def _clipped(frame: FrameImage, box: Box) -> Window | None:
    """`box` rounded outwards to whole pixels and clipped to the frame; None when under 4 pixels either way."""
    height, width = frame.shape[:2]
    x1, y1 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    return (x1, y1, x2, y2) if x2 - x1 >= MIN_FACE_PX and y2 - y1 >= MIN_FACE_PX else None


def _grey_regions(frame: FrameImage, boxes: Sequence[Box], scales: Sequence[float]
                  ) -> list[tuple[np.ndarray, tuple[int, int]] | None]:
    """The frame's pixels inside each box (clipped to the frame), grey, resized by its scale, with the region's
    top-left. A frame on the GPU brings all the regions to the host in one round trip (`DeviceImage.windows`)."""
    windows = [_clipped(frame, box) for box in boxes]
    wanted = [window for window in windows if window is not None]
    if isinstance(frame, np.ndarray):
        pixels = [frame[y1:y2, x1:x2] for x1, y1, x2, y2 in wanted]
    else:
        pixels = frame.windows(wanted) if wanted else []
    fetched = iter(pixels)
    regions: list[tuple[np.ndarray, tuple[int, int]] | None] = []
    for window, factor in zip(windows, scales):
        if window is None:
            regions.append(None)
            continue
        region, (x1, y1, x2, y2) = next(fetched), window
        grey = cv2.cvtColor(region, cv2.COLOR_BGR2GRAY) if region.ndim == 3 else region
        size = (max(1, round((x2 - x1) * factor)), max(1, round((y2 - y1) * factor)))
        regions.append((cv2.resize(grey, size, interpolation=cv2.INTER_AREA), (x1, y1)))
    return regions


def face_templates(frame: FrameImage, boxes: Sequence[Box]) -> list[FaceTemplate | None]:
    """The template of the face in each box of a BGR (or grey) frame, on the host or the GPU; None for a face too
    small or off the frame."""
    scales = [min(1.0, TEMPLATE_WIDTH / max(box[2] - box[0], 1e-6)) for box in boxes]
    templates: list[FaceTemplate | None] = []
    for cut, scale in zip(_grey_regions(frame, boxes, scales), scales):
        if cut is None:
            templates.append(None)
            continue
        pixels, (x1, y1) = cut
        # the template covers what was inside the frame: its box is the clipped one
        clipped = (float(x1), float(y1), x1 + pixels.shape[1] / scale, y1 + pixels.shape[0] / scale)
        templates.append(FaceTemplate(pixels, scale, clipped))
    return templates


def templates_from(pixels: np.ndarray, boxes: Sequence[Sequence[float]] | np.ndarray) -> list[FaceTemplate | None]:
    """Templates of a fixed size cut elsewhere (the follow graphs: `pixels` [n, h, w], one row per box), each with
    its box and scale (template pixels per frame pixel across); None for a box under MIN_FACE_PX."""
    templates: list[FaceTemplate | None] = []
    for row, box in zip(pixels, boxes):
        x1, y1, x2, y2 = (float(value) for value in box)
        usable = min(x2 - x1, y2 - y1) >= MIN_FACE_PX
        templates.append(FaceTemplate(row, pixels.shape[2] / (x2 - x1), (x1, y1, x2, y2)) if usable else None)
    return templates


def face_template(frame: FrameImage, box: Box) -> FaceTemplate | None:
    """One face's template (`face_templates`)."""
    return face_templates(frame, [box])[0]


def best_places(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For score maps [F, h, w]: each map's best score [F] (-inf where none is finite) and its place x, y [F] in
    score pixels, moved within its pixel to where a parabola through it and its two neighbours peaks (-0.5 to 0.5;
    0 at an edge, or where the scores are flat or undefined: a flat patch scores NaN).

    Why sub-pixel: one template pixel is 4 frame pixels of a 100 px face, and a box off by that much changes the
    emotion read from it (BENCHMARKS.md, "Followed faces placed between template pixels")."""
    faces, height, width = scores.shape
    clean = np.where(np.isfinite(scores), scores, -np.inf).astype(np.float64)
    at = clean.reshape(faces, -1).argmax(axis=1)  # the first best, as cv2.minMaxLoc finds it
    by, bx = np.divmod(at, width)
    padded = np.pad(clean, ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    rows, x, y = np.arange(faces), bx + 1, by + 1
    best = padded[rows, y, x]
    with np.errstate(invalid="ignore"):
        dx = _peak_offsets(padded[rows, y, x - 1], best, padded[rows, y, x + 1])
        dy = _peak_offsets(padded[rows, y - 1, x], best, padded[rows, y + 1, x])
    return best, bx + dx, by + dy


def _peak_offsets(before: np.ndarray, at: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Where a parabola through three neighbouring scores peaks, relative to the middle one; 0 where it does not
    curve downwards or a neighbour is missing."""
    curvature = before - 2.0 * at + after
    curved = np.isfinite(curvature) & (curvature < 0)
    offset = 0.5 * (before - after) / np.where(curved, curvature, -1.0)
    return np.where(curved, np.clip(offset, -0.5, 0.5), 0.0)


def locate_all(frame: FrameImage, wanted: Sequence[tuple[FaceTemplate, Box]]) -> list[Box | None]:
    """Where each template's face is in `frame`, searched around its expected box (its size kept); None where the
    best match is weak or the search window is too small. The search windows come down together."""
    windows = []
    for _, expected in wanted:
        width, height = expected[2] - expected[0], expected[3] - expected[1]
        windows.append((expected[0] - SEARCH * width, expected[1] - SEARCH * height,
                        expected[2] + SEARCH * width, expected[3] + SEARCH * height))
    cuts = _grey_regions(frame, windows, [template.scale for template, _ in wanted])
    return [_match(cut, template) for cut, (template, _) in zip(cuts, wanted)]


def locate(frame: FrameImage, template: FaceTemplate, expected: Box) -> Box | None:
    """One face's place (`locate_all`)."""
    return locate_all(frame, [(template, expected)])[0]


def _match(cut: tuple[np.ndarray, tuple[int, int]] | None, template: FaceTemplate) -> Box | None:
    """The template's best place within one search window's grey pixels, in frame coordinates."""
    if cut is None:
        return None
    pixels, (x1, y1) = cut
    if pixels.shape[0] < template.pixels.shape[0] or pixels.shape[1] < template.pixels.shape[1]:
        return None
    scores = cv2.matchTemplate(pixels, template.pixels, cv2.TM_CCOEFF_NORMED)
    best, xs, ys = best_places(scores[None])
    if not best[0] >= MIN_SCORE:
        return None
    left, top = x1 + float(xs[0]) / template.scale, y1 + float(ys[0]) / template.scale
    box_w, box_h = template.box[2] - template.box[0], template.box[3] - template.box[1]
    return (left, top, left + box_w, top + box_h)


class Follower(Protocol):
    """How a tracker finds its faces by their look: templates cut at a detection, then searched for between them.
    `searches_device_frames`: whether a frame on the GPU is searched there (cheap), not copied down window by window."""

    searches_device_frames: bool

    def templates(self, frame: FrameImage, boxes: Sequence[Box]) -> list[FaceTemplate | None]: ...

    def locate(self, frame: FrameImage, wanted: Sequence[tuple[FaceTemplate, Box]]) -> list[Box | None]: ...


class HostFollower:
    """Templates and search on the host with OpenCV (`face_templates`, `locate_all`); a GPU frame's windows are
    copied down for it."""

    searches_device_frames = False

    def templates(self, frame: FrameImage, boxes: Sequence[Box]) -> list[FaceTemplate | None]:
        return face_templates(frame, boxes)

    def locate(self, frame: FrameImage, wanted: Sequence[tuple[FaceTemplate, Box]]) -> list[Box | None]:
        return locate_all(frame, wanted)


HOST_FOLLOWER = HostFollower()


@dataclass(frozen=True)
class BatchLook:
    """What the shared engine's search gave one frame, when faces are found by their look inside its batches
    (the CUDA frame graphs path): a detection frame's faces' templates, or whether each face given for a frame
    without detection was found by its look (its box then moved there)."""

    templates: list[FaceTemplate | None] | None = None
    found: list[bool] | None = None
