"""IoU tracking (stable ids per camera) and per-track smoothing of emotion probabilities.

Smoothing is an exponential moving average whose weight depends on the real time between frames
(alpha = 1 - 0.5 ** (dt / half_life)), so it behaves the same at 5 fps and at 30 fps.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

import numpy as np

from pipeline.core.types import Detection, EmotionScores

Box = tuple[float, float, float, float]


def box_iou(a: Box, b: Box) -> float:
    """IoU of two boxes (x1, y1, x2, y2).

    Plain Python on purpose: a camera has a handful of faces, and for so few pairs numpy's per-call overhead made the
    tracker the largest holder of the GIL at 64 cameras (py-spy on the H200, 2026-12-01)."""
    inter_w = min(a[2], b[2]) - max(a[0], b[0])
    inter_h = min(a[3], b[3]) - max(a[1], b[1])
    if inter_w <= 0 or inter_h <= 0:
        return 0.0
    inter = inter_w * inter_h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / max(union, 1e-9)


@dataclass
class Track:
    track_id: int
    box: Box
    last_seen: float
    probs: np.ndarray | None = None
    smoothed_at: float = 0.0


class IouTracker:
    """Greedy highest-IoU-first matching of detections to live tracks; unmatched detections start new tracks."""

    def __init__(self, iou_threshold: float = 0.3, max_age_s: float = 1.0, half_life_ms: float = 300.0) -> None:
        self.iou_threshold = iou_threshold
        self.max_age_s = max_age_s
        self.half_life_s = half_life_ms / 1000.0
        self.tracks: dict[int, Track] = {}
        self._ids = count(1)

    def update(self, faces: list[Detection], now: float) -> list[int]:
        """Assign a track id to each face (same order), expiring tracks unseen for max_age_s."""
        self.tracks = {k: t for k, t in self.tracks.items() if now - t.last_seen <= self.max_age_s}
        live = list(self.tracks.values())
        ids: list[int | None] = [None] * len(faces)
        pairs = [(overlap, face_i, track_i)
                 for face_i, face in enumerate(faces) for track_i, track in enumerate(live)
                 if (overlap := box_iou(face.box, track.box)) >= self.iou_threshold]
        taken: set[int] = set()
        for _, face_i, track_i in sorted(pairs, key=lambda pair: -pair[0]):  # stable: ties keep face, track order
            if ids[face_i] is None and track_i not in taken:
                ids[face_i] = live[track_i].track_id
                taken.add(track_i)
        for index, face in enumerate(faces):
            track_id = ids[index]
            if track_id is None:
                track_id = next(self._ids)
                self.tracks[track_id] = Track(track_id, face.box, now)
                ids[index] = track_id
            track = self.tracks[track_id]
            track.box, track.last_seen = face.box, now
        return [int(i) for i in ids if i is not None]

    def smooth(self, track_id: int, scores: EmotionScores, now: float) -> EmotionScores:
        """Blend `scores` into the track's running probabilities and return the smoothed vector."""
        track = self.tracks[track_id]
        dt = now - track.smoothed_at
        if track.probs is None or self.half_life_s <= 0:
            track.probs = scores.probs.copy()
        elif dt > 0:
            alpha = 1.0 - 0.5 ** (dt / self.half_life_s)
            track.probs = (1.0 - alpha) * track.probs + alpha * scores.probs
        track.smoothed_at = now
        return EmotionScores(track.probs.astype(np.float32))
