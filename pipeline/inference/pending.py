"""One frame's analysis under way, so a camera can have more than one frame in the shared engine at a time.

With one frame in flight per camera, a camera's analysed rate is at most 1 / (queueing + batch time): at 64 cameras on
one GPU lane a frame waits for the batch running ahead of it and then for its own (~60 ms together on an H200), so
no camera could reach 25 fps however fast the GPU was. `inference.frames_in_flight` lets a camera worker hand over
its next frame while the previous one is still being analysed (DeepStream keeps several buffers per source in its
batch pipeline for the same reason); the worker still publishes results in frame order.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pipeline.core.types import Detection, EmotionScores
from pipeline.vision.follow import BatchLook

Analysis = tuple[list[Detection], list[EmotionScores], dict[str, float]]


class PendingAnalysis:
    """A frame's analysis: the batch's Future, and how its result becomes the frame's faces, scores and timings
    (done on the camera's own thread, not on the lane's)."""

    def __init__(self, future: Future[Any], finish: Callable[[Any], Analysis], timeout_s: float,
                 look: Callable[[Any], BatchLook | None] | None = None) -> None:
        self._future = future
        self._finish = finish
        self._timeout_s = timeout_s
        self._look = look

    def done(self) -> bool:
        return self._future.done()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """`callback()` once the batch has run (at once when it already has), on the thread that finished it."""
        self._future.add_done_callback(lambda _future: callback())

    def result(self) -> Analysis:
        """The analysis; re-raises the batch's failure, TimeoutError past the engine's result timeout."""
        return self._finish(self._future.result(timeout=self._timeout_s))

    def look(self) -> BatchLook | None:
        """What the batch's search of faces by their look gave this frame (after `result`); None where it did not
        search (vision.follow.BatchLook)."""
        if self._look is None or not self._future.done() or self._future.exception() is not None:
            return None
        return self._look(self._future.result())


def finished(analysis: Analysis) -> PendingAnalysis:
    """An analysis already done (a path that analyses a frame before taking the next)."""
    future: Future[Analysis] = Future()
    future.set_result(analysis)
    return PendingAnalysis(future, lambda value: value, 0.0)
