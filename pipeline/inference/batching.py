"""BatchedModel: one model shared by every camera, with Triton-style dynamic batching on K lanes.

What runs a batch is a `BatchRunner`: a Backend (one model; items are arrays) or the frame graphs' engine
(inference.frames: items are whole frames, on the host or on the GPU, and each result is a frame's faces).

Callers submit one item (no batch dimension) and get a Future. A collector thread forms a batch when `max_batch` items
wait or `max_delay_ms` has passed since the oldest one arrived; `lanes` runner threads each execute one batch at a time
on their own backend lane, so up to K batches are in flight. Like Triton's dynamic batcher, the collector forms a
batch only once a lane is free: while every lane is busy, requests wait in the queue and the next batch takes all of
them (up to max_batch), instead of small batches being formed early and queued behind the busy lanes (measured on the
H200 with 64 cameras: mean batch ~10 while ~30 requests waited; see BENCHMARKS.md). A full queue fails fast: the caller skips that frame
(counted) rather than blocking capture.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pipeline.core.logrepeat import RepeatLimiter
from pipeline.core.threads import name_native_thread

log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The model's request queue is full; the caller should skip this item."""


class NotReadyError(QueueFullError):
    """The engine is still preparing for this item (a frame size met for the first time); skip it like a full
    queue: the next frames will find it ready."""


class ModelClosedError(RuntimeError):
    """The model was closed before this request ran."""


class BatchRunner(Protocol):
    """What BatchedModel drives: `lanes` threads call run_items at once, each with its own lane index."""

    name: str
    max_batch: int
    lanes: int

    def run_items(self, items: Sequence[Any], lane: int = 0) -> list[Any]: ...

    def warm_up(self, item_shape: tuple[int, ...], dtype: np.dtype, lane: int = 0) -> None: ...

    def describe(self) -> dict[str, str]: ...

    def close(self) -> None: ...


@dataclass
class _Request:
    item: Any
    future: Future[Any]
    t_submit: float


@dataclass
class BatchStats:
    """Counters for status and metrics; written by the runner threads under a lock."""

    batches: int = 0
    items: int = 0
    rejected: int = 0
    failed: int = 0
    queue_s: float = 0.0
    compute_s: float = 0.0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=1000))
    recent_queue_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1000))
    recent_compute_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1000))


class BatchedModel:
    """Dynamic batcher over one Backend. Thread-safe `submit`; `close` finishes in-flight batches."""

    def __init__(self, backend: BatchRunner, name: str, max_batch: int, max_delay_ms: float, queue_size: int = 256,
                 lanes: int | None = None) -> None:
        self.backend = backend
        self.name = name
        self.max_batch = max(1, min(max_batch, backend.max_batch))
        self.max_delay_s = max_delay_ms / 1000.0
        self.lanes = lanes or backend.lanes
        self.stats = BatchStats()
        self._failures = RepeatLimiter(log)  # a dead backend fails every batch: one line per 30 s, not per batch
        self._requests: queue.Queue[_Request] = queue.Queue(maxsize=queue_size)
        self._batches: queue.Queue[list[_Request] | Callable[[int], None] | None] = queue.Queue(maxsize=self.lanes)
        self._closing = threading.Event()
        self._free_lanes = threading.Semaphore(self.lanes)  # taken by the collector per batch, given back by a runner
        self._lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._lanes_lock = threading.Lock()  # one on_lanes call at a time
        self._collector = threading.Thread(target=self._collect_loop, name=f"batch-{name}", daemon=True)
        self._runners = [threading.Thread(target=self._run_loop, args=(lane,), name=f"lane-{name}-{lane}", daemon=True)
                         for lane in range(self.lanes)]
        self._collector.start()
        for runner in self._runners:
            runner.start()

    def submit(self, item: Any) -> Future[Any]:
        """Queue one item; raises QueueFullError at once when the queue is full, ModelClosedError after close()."""
        request = _Request(item, Future(), time.monotonic())
        with self._submit_lock:  # close() cannot slip between the check and the put
            if self._closing.is_set():
                raise ModelClosedError(f"{self.name} is closed")
            try:
                self._requests.put_nowait(request)
            except queue.Full:
                full = True
            else:
                full = False
        if full:
            with self._lock:
                self.stats.rejected += 1
            raise QueueFullError(f"{self.name}: request queue full ({self._requests.maxsize})")
        return request.future

    def warm_up(self, item_shape: tuple[int, ...], dtype: np.dtype, timeout: float = 300.0) -> None:
        """Let every lane pay its one-time costs on the thread that will run it.

        GPU runtimes keep per-thread state (ONNX Runtime's CUDA provider builds kernels and handles per thread and
        input shape, which costs seconds): warming from another thread would leave that cost to the first frames."""
        self.on_lanes(lambda lane: self.backend.warm_up(item_shape, dtype, lane), timeout)

    def on_lanes(self, task: Callable[[int], None], timeout: float = 300.0) -> None:
        """Run `task(lane)` once on each lane's own runner thread, between batches; wait for all; re-raise a failure.

        Callers take turns (`_lanes_lock`): two calls' tasks queued at once could each be picked up by some of the
        lanes, which would then wait at their two barriers for each other until the timeout."""
        with self._lanes_lock:
            self._on_lanes(task, timeout)

    def _on_lanes(self, task: Callable[[int], None], timeout: float) -> None:
        barrier = threading.Barrier(self.lanes + 1)
        errors: list[BaseException] = []

        def warm(lane: int) -> None:
            try:
                task(lane)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, on the caller's thread
                errors.append(exc)
            barrier.wait(timeout)  # hold this runner until every lane has taken its own task

        for _ in range(self.lanes):
            self._batches.put(warm)  # type: ignore[arg-type]
        barrier.wait(timeout)
        if errors:
            raise errors[0]

    def is_alive(self) -> bool:
        """True while the collector and every lane's runner thread are running (for health checks)."""
        return self._collector.is_alive() and all(runner.is_alive() for runner in self._runners)

    def infer(self, item: Any, timeout: float = 10.0) -> Any:
        """submit() and wait: the plain sequential call a camera worker makes."""
        return self.submit(item).result(timeout=timeout)

    def _collect_loop(self) -> None:
        name_native_thread()
        while True:
            if not self._free_lanes.acquire(timeout=0.1):  # every lane busy: requests keep queueing meanwhile
                if self._closing.is_set() and self._requests.empty():
                    break
                continue
            batch = self._collect_batch()
            if batch is None:
                self._free_lanes.release()
                if self._closing.is_set():
                    break
                continue
            self._batches.put(batch)
        for _ in self._runners:
            self._batches.put(None)

    def _collect_batch(self) -> list[_Request] | None:
        """With a lane free: the first request (None after 0.1 s without one), then more until max_batch or until
        max_delay has passed since the first one was submitted (at once when it waited for the lane that long)."""
        try:
            first = self._requests.get(timeout=0.1)
        except queue.Empty:
            return None
        batch = [first]
        deadline = first.t_submit + self.max_delay_s
        while len(batch) < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                batch.append(self._requests.get(timeout=remaining) if remaining > 0 else self._requests.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run_loop(self, lane: int) -> None:
        name_native_thread()
        while True:
            batch = self._batches.get()
            if batch is None:
                return
            if callable(batch):  # a warm-up task (see warm_up)
                batch(lane)
                continue
            try:
                self._run_batch(batch, lane)
            finally:
                self._free_lanes.release()

    def _run_batch(self, batch: list[_Request], lane: int) -> None:
        batch = [r for r in batch if r.future.set_running_or_notify_cancel()]  # a caller may have cancelled
        if not batch:
            return
        started = time.monotonic()
        try:
            results = self.backend.run_items([r.item for r in batch], lane)
        except Exception as exc:  # noqa: BLE001 - any backend failure belongs to the callers' futures
            if self._closing.is_set():  # e.g. a process ending tears the GPU's context down under a late batch
                log.warning("%s: batch of %d abandoned while closing: %s", self.name, len(batch), exc)
            else:
                self._failures.log(logging.ERROR, type(exc).__name__, "%s: batch of %d failed: %s", self.name,
                                   len(batch), exc)
            with self._lock:
                self.stats.failed += len(batch)
            for request in batch:
                request.future.set_exception(exc)
            return
        finished = time.monotonic()
        for request, result in zip(batch, results):
            request.future.set_result(result)
        self._record(batch, started, finished)

    def _record(self, batch: list[_Request], started: float, finished: float) -> None:
        queue_ms = [(started - r.t_submit) * 1000.0 for r in batch]
        with self._lock:
            stats = self.stats
            stats.batches += 1
            stats.items += len(batch)
            stats.queue_s += sum(queue_ms) / 1000.0
            stats.compute_s += finished - started
            stats.batch_sizes.append(len(batch))
            stats.recent_queue_ms.extend(queue_ms)
            stats.recent_compute_ms.append((finished - started) * 1000.0)

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting work, let queued and in-flight batches finish, then release the backend."""
        with self._submit_lock:
            if self._closing.is_set():
                return
            self._closing.set()
        self._collector.join(timeout)
        for runner in self._runners:
            runner.join(timeout)
        while True:  # requests left behind if the collector did not finish in time
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                break
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(ModelClosedError(f"{self.name} closed"))
        self.backend.close()
