"""IoU tracking (stable ids per camera) and per-track smoothing of emotion probabilities.

Smoothing is an exponential moving average whose weight depends on the real time between frames
(alpha = 1 - 0.5 ** (dt / half_life)), so it behaves the same at 5 fps and at 30 fps.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

import numpy as np

from pipeline.core.types import Detection, EmotionScores


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of boxes a (N x 4) and b (M x 4), x1 y1 x2 y2."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


@dataclass
class Track:
    track_id: int
    box: tuple[float, float, float, float]
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
        if live and faces:
            overlap = iou_matrix(np.array([f.box for f in faces]), np.array([t.box for t in live]))
            for flat in np.argsort(-overlap, axis=None):
                face_i, track_i = np.unravel_index(flat, overlap.shape)
                if overlap[face_i, track_i] < self.iou_threshold:
                    break
                if ids[face_i] is None and live[track_i].track_id not in ids:
                    ids[face_i] = live[track_i].track_id
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
