"""What a camera group's process sends the daemon, in order: its observations a few at a time, everything else at once.

Why batches: every message on a multiprocessing queue wakes the queue's feeder thread, which pickles it and writes it
to a pipe, and the daemon's reader unpickles it; at 30 cameras × 25 fps that is 750 messages a second per group, and
each wake-up is a GIL hand-off among the group's ~70 threads. Sending what arrived within SEND_EVERY_S as one message
took the group's CPU per observation, beyond making it, from 135-170 to 65-85 µs, and the reader's from 80-100 to
55-58 µs (`deploy/observation_queue_probe.py`, 30 threads × 25 fps, 2 cores; BENCHMARKS.md, issue 25, round 12);
at 150 cameras on an H200 the difference stayed within the runs' own spread (round 13). The first observation after
a quiet spell goes at once; later ones wait at most SEND_EVERY_S.

Why one object for every message: a camera's events (stopped, reconnecting) and the group's views must not overtake
the observations made before them, so sending any other message first sends what is pending, under the same lock.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from pipeline.core.threads import name_native_thread
from pipeline.core.types import Observation

log = logging.getLogger(__name__)

SEND_EVERY_S = 0.01  # the most an observation waits to share a message with others (added to its latency)


class GroupSender:
    """Observations in batches (`("observations", (obs, ...))`), other messages at once, all on `out` in order.

    An observation that finds the queue full (the daemon is not reading) is dropped and counted: behaviour wants what
    happens now, not a backlog. Other messages wait up to `timeout` seconds, as they did one by one."""

    def __init__(self, out: Any, every_s: float = SEND_EVERY_S, name: str = "group-send") -> None:
        self._out = out
        self._every_s = every_s
        self._pending: list[Observation] = []
        self._ready = threading.Condition()
        self._send_lock = threading.Lock()  # one message at a time, pending observations first
        self._closed = False
        self.dropped = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def observation(self, obs: Observation) -> None:
        """Queue `obs` for the next batch (called on the camera's worker thread)."""
        with self._ready:
            self._pending.append(obs)
            self._ready.notify()

    def send(self, message: tuple[Any, ...], timeout: float = 1.0) -> bool:
        """Send what is pending, then `message`; False (logged) when the daemon did not take it within `timeout`."""
        with self._send_lock:
            self._flush()
            try:
                self._out.put(message, timeout=timeout)
            except queue.Full:
                log.warning("camera group: the daemon is not reading; %s message dropped", message[0])
                return False
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Send what is pending and stop the sender thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join(timeout)
        with self._send_lock:
            self._flush()

    def _loop(self) -> None:
        """Wait for an observation, send everything pending, then let the next ones gather for `every_s`."""
        name_native_thread()
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    return
            with self._send_lock:
                self._flush()
            time.sleep(self._every_s)

    def _flush(self) -> None:
        """Put the pending observations as one message (the caller holds `_send_lock`)."""
        with self._ready:
            batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            self._out.put_nowait(("observations", tuple(batch)))
        except queue.Full:
            self.dropped += len(batch)
