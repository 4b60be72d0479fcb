"""One log line per run of the same failure, not one per frame.

Why: when a shared resource goes away (a Triton server restarting, a GPU lane closing), every batch and every frame
of every camera fails the same way, 20 or more times a second. Logged one by one, an hour of that is ~70,000 journal
lines that bury the one line saying what happened. RepeatLimiter logs the first occurrence of a kind at once, then
at most one line per `interval_s` carrying how many of that kind it held back; counters and metrics still count
every failure."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Run:
    last_logged: float
    held_back: int = 0


class RepeatLimiter:
    """Rate-limits log lines by a caller-chosen key (e.g. the exception's type); thread-safe."""

    def __init__(self, logger: logging.Logger, interval_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def log(self, level: int, key: str, message: str, *args: object) -> bool:
        """Log `message % args` unless a line of this `key` went out less than interval_s ago; True if logged."""
        now = self._clock()
        with self._lock:
            run = self._runs.get(key)
            if run is not None and now - run.last_logged < self._interval_s:
                run.held_back += 1
                return False
            held_back = run.held_back if run is not None else 0
            self._runs[key] = _Run(now)
        if held_back:
            message += " (and %d more like it in the last %.0f s)"
            args = (*args, held_back, self._interval_s)
        self._logger.log(level, message, *args)
        return True
