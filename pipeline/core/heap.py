"""Giving the process's freed heap back to the system (glibc's malloc_trim), now and then.

Why: glibc keeps what a program frees in its malloc arenas for reuse and hands memory back to the system only from
the top of the main heap. Loading and warming the models frees part of what it allocated (graphs optimised,
initialisers converted), in chunks spread over the arenas of the threads that made them, and decoding threads
churn frame buffers likewise: those freed pages stay resident, counted in the process's RSS for its whole life,
until malloc_trim(0) gives every whole free page of every arena back (glibc 2.8 and later). The call walks the free
lists under each arena's lock in turn (milliseconds), so it runs every `inference.trim_heap_s` from a loop that
wakes anyway, never per frame. What it gives back (BENCHMARKS.md, round 20): 33-35 MB of a CPU daemon's ~300 MB;
~7 MB of a GPU camera group's ~2.3 GB, whose sessions' memory is live.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from pipeline.core.libc import LIBC

log = logging.getLogger(__name__)

_MALLOC_TRIM = getattr(LIBC, "malloc_trim", None)  # glibc only (musl has none)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def can_trim() -> bool:
    """Whether this process's C library can give freed heap back (glibc)."""
    return _MALLOC_TRIM is not None


def resident_bytes() -> int | None:
    """This process's resident memory (RSS) now, from /proc (None where there is no /proc)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


def trim_heap() -> int | None:
    """Give every whole free page of the heap back now; the bytes of resident memory that went (0 when none did),
    or None where the C library cannot (not glibc)."""
    if _MALLOC_TRIM is None:
        return None
    before = resident_bytes()
    _MALLOC_TRIM(0)
    after = resident_bytes()
    return max(0, before - after) if before is not None and after is not None else 0


class HeapTrimmer:
    """trim_heap every `period_s` seconds, for a loop that wakes often anyway (the daemon's, a camera group's).

    The first trim comes one period after the trimmer is made: by then the models' sessions are made and a GPU
    group has prepared its frame size, which is when most freed memory lies in the heap."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._clock = clock
        self._started = clock()
        self._last: float | None = None
        self.trims = 0
        self.released_bytes = 0  # in all trims so far

    def tick(self, period_s: float) -> int | None:
        """Trim when `period_s` (> 0; 0 = never) has passed since the last trim (or since the start); the bytes it
        gave back, None when it was not due (or cannot trim here)."""
        if period_s <= 0 or not can_trim():
            return None
        now = self._clock()
        if now - (self._started if self._last is None else self._last) < period_s:
            return None
        self._last = now
        started = time.perf_counter()
        released = trim_heap() or 0
        took_ms = (time.perf_counter() - started) * 1000.0
        self.trims += 1
        self.released_bytes += released
        if self.trims == 1 or released >= 64 << 20:
            log.info("%s: gave %.0f MB of freed heap back to the system (%.1f ms)", self._what, released / 2**20,
                     took_ms)
        return released
