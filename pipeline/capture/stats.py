"""Per-camera health figures for status, metrics and /healthz: rates, recent failures, and one quality word.

The quality word follows Frigate's idea of a connection-quality summary an operator can read at a glance:
excellent (streaming, no trouble in the last hour), fair (some reconnects or a lower frame rate), poor (repeated
failures or far below the configured rate), unusable (not delivering frames now).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

HOUR_S = 3600.0


class RateMeter:
    """Events per second over a sliding window; thread-safe, O(1) memory per event in the window."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.total = 0
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def mark(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self.total += 1
            self._times.append(now)
            self._trim(now)

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._trim(now)
            return len(self._times) / self.window_s

    def _trim(self, now: float) -> None:
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()


class RecentEvents:
    """Timestamps of rare events (reconnects, stalls) kept for one hour, so status can say 'in the last hour'."""

    def __init__(self, horizon_s: float = HOUR_S) -> None:
        self.horizon_s = horizon_s
        self.total = 0
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def mark(self, now: float | None = None) -> None:
        with self._lock:
            self.total += 1
            self._times.append(time.monotonic() if now is None else now)

    def count(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._times and now - self._times[0] > self.horizon_s:
                self._times.popleft()
            return len(self._times)


@dataclass(frozen=True)
class CameraHealth:
    """A snapshot of one camera, as status and metrics show it."""

    name: str
    state: str
    source: str
    fps_in: float
    fps_analysed: float
    frames_in: int
    frames_analysed: int
    frames_skipped: int
    reconnects_1h: int
    stalls_1h: int
    reconnects_total: int
    last_frame_age_s: float | None
    faces: int
    quality: str

    def as_dict(self) -> dict[str, object]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def connection_quality(state: str, last_frame_age_s: float | None, stall_s: float, fps_analysed: float,
                       fps_wanted: float, reconnects_1h: int, stalls_1h: int) -> str:
    """One word from the figures above; the thresholds are deliberately simple so operators can reason about them."""
    if state != "streaming" or last_frame_age_s is None or last_frame_age_s > stall_s:
        return "unusable"
    trouble = reconnects_1h + stalls_1h
    ratio = fps_analysed / fps_wanted if fps_wanted > 0 else 1.0
    if trouble >= 3 or ratio < 0.5:
        return "poor"
    if trouble >= 1 or ratio < 0.8:
        return "fair"
    return "excellent"
