"""The VideoSource role and what every source shares: its two errors and the pacing of files at their frame rate.

Kept apart from `capture.sources` (the CPU sources and `open_source`) so that the GPU source (`capture.nvdec`) and
the CPU ones build on it without importing each other.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from pipeline.core.types import FrameImage


class SourceError(RuntimeError):
    """The source cannot be opened or stopped working; the capture thread retries it."""


class SourceEnded(Exception):
    """A non-looping file reached its end."""


class VideoSource(ABC):
    """A camera or file. Reading is split like OpenCV's: `grab` waits for the next frame, `retrieve` converts it.

    The capture reader grabs every frame (so a live stream is drained and the stall watch is fed) but retrieves
    only the frames it will analyse, which saves the colour conversion of the others."""

    kind = "abstract"

    @property
    def frames_pooled(self) -> bool:
        """True when retrieve() fills one of a few frame buffers the source owns (NVDEC frames kept on the GPU):
        the capture reader then lets go of the slot's untaken frame first, so that frame's buffer is refilled."""
        return False

    @abstractmethod
    def grab(self, timeout: float) -> bool:
        """Wait for the next frame; False if none arrived within `timeout` seconds."""

    @abstractmethod
    def retrieve(self) -> FrameImage:
        """The frame last grabbed: BGR pixels on the host, or a DeviceImage from a GPU source kept on the device."""

    @abstractmethod
    def describe(self) -> str:
        """One line for logs and status (secrets masked)."""

    def close(self) -> None:
        """Release the device or stream. Safe to call twice."""


class _Pacer:
    """Sleeps so frames come out at `fps`, like a live camera; resynchronises after a long pause."""

    def __init__(self, fps: float) -> None:
        self.period = 1.0 / fps if fps > 0 else 0.0
        self._next = time.monotonic()

    def wait(self) -> None:
        now = time.monotonic()
        if self._next > now:
            time.sleep(self._next - now)
        self._next = max(self._next + self.period, time.monotonic() - self.period)


def pacer_for(fps: float) -> _Pacer:
    """A pacer at a file's frame rate (25 fps when the container does not say or says nonsense)."""
    return _Pacer(fps if 0 < fps <= 240 else 25.0)
