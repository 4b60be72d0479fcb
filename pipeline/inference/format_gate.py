"""Frame sizes ready on every lane, and the background preparation of a size met for the first time.

On the frame graphs path each frame size has its own graphs and sessions, built and warmed per lane. On a GPU that
takes 20-40 s (H200, 1080p, one lane: BENCHMARKS.md), longer than a frame's result timeout, so the first frames of a
size used to fail with TimeoutError, one warning per camera, while the batch holding them prepared the size. Like
Triton answering "not ready" while a model loads, the gate prepares a new size in the background and cameras of that
size skip frames (NotReadyError, counted as skipped) until it is ready; the cameras of other sizes keep running.
Preparing a size frees part of what making its sessions allocated: with `trim_heap` the gate gives that freed heap
back to the system as soon as the size is ready (pipeline.core.heap), not a trim period later (a GPU camera group:
5-12 MB, BENCHMARKS.md round 20).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pipeline.core.heap import trim_heap
from pipeline.inference.batching import NotReadyError
from pipeline.modelprep.frame_graphs import FrameFormat

log = logging.getLogger(__name__)


class FormatGate:
    """`prepare(fmt)` builds and warms a size on every lane (blocking); the gate runs it once per size."""

    def __init__(self, prepare: Callable[[FrameFormat], None], trim_heap: bool = False) -> None:
        self._prepare = prepare
        self._trim_heap = trim_heap  # inference.trim_heap_s > 0
        self._ready: set[FrameFormat] = set()
        self._preparing: set[FrameFormat] = set()  # started in the background, not ready yet
        self._lock = threading.Lock()

    def is_ready(self, fmt: FrameFormat) -> bool:
        return fmt in self._ready

    def admit(self, fmt: FrameFormat) -> None:
        """Return at once when `fmt` is ready; else start preparing it (once) and raise NotReadyError."""
        if fmt in self._ready:
            return
        with self._lock:
            if fmt in self._ready:
                return
            if fmt not in self._preparing:
                self._preparing.add(fmt)
                threading.Thread(target=self._prepare_in_background, args=(fmt,), daemon=True,
                                 name=f"prepare-{fmt.width}x{fmt.height}").start()
        raise NotReadyError(f"{fmt.width}x{fmt.height} {fmt.order} frames are being prepared")

    def prepare_now(self, fmt: FrameFormat) -> None:
        """Prepare `fmt` on the calling thread (a size the caller knows in advance, or a one-off analysis)."""
        if fmt not in self._ready:
            self._prepare(fmt)
            self._trimmed()
            with self._lock:
                self._ready.add(fmt)

    def _prepare_in_background(self, fmt: FrameFormat) -> None:
        started = time.monotonic()
        log.info("preparing %dx%d %s frames on every lane; cameras of that size skip frames until it is done",
                 fmt.width, fmt.height, fmt.order)
        try:
            self._prepare(fmt)
        except Exception as exc:  # noqa: BLE001 - reported; the frames then fail one by one with the real error
            log.error("preparing %dx%d %s frames failed (%s: %s); their batches will try again",
                      fmt.width, fmt.height, fmt.order, type(exc).__name__, exc)
        else:
            log.info("%dx%d %s frames ready in %.1f s%s", fmt.width, fmt.height, fmt.order,
                     time.monotonic() - started, self._trimmed())
        with self._lock:
            self._ready.add(fmt)
            self._preparing.discard(fmt)

    def _trimmed(self) -> str:
        """Trim the heap (when asked to); a phrase for the log saying what went back ("" when not asked)."""
        released = trim_heap() if self._trim_heap else None
        return "" if released is None else f"; {released / 2**20:.0f} MB of freed heap given back"
