"""The Sink role: one output of events, isolated behind its own bounded queue and thread.

A sink that is slow or broken drops (and counts) its own events; it can never stall perception or the other sinks.
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import ABC, abstractmethod
from typing import Any, Literal

from pipeline.core.settings import StrictModel
from pipeline.outputs.events import Event

log = logging.getLogger(__name__)

EventName = Literal["observation", "command", "camera"]
ALL_EVENTS: tuple[EventName, ...] = ("observation", "command", "camera")


class OutputSettings(StrictModel):
    """Base of every output's settings. Each subclass declares `type` (a Literal: the registry key) and `events` (the
    event types it receives) in its own field order: validators may read fields declared before them."""

    def describe(self) -> str:
        """One line for `check-config`; outputs with an address override it (credentials masked)."""
        return f"{getattr(self, 'type', '?')} [{', '.join(getattr(self, 'events', None) or ())}]"


class Sink(ABC):
    """Receives events on its own thread. Subclasses implement `write` (and may override `open`/`flush_close`)."""

    type_name = "abstract"

    def __init__(self, cfg: Any, queue_size: int = 256) -> None:
        self.cfg = cfg
        self.events: frozenset[str] = frozenset(getattr(cfg, "events", ("observation", "command", "camera")))
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self._queue: queue.Queue[Event | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._loop, name=f"sink-{self.type_name}", daemon=True)

    @classmethod
    def from_settings(cls, cfg: Any, **context: Any) -> Sink:
        """The sink for `cfg`; outputs that use daemon-wide context (e.g. the rules' presets) override this."""
        return cls(cfg, getattr(cfg, "queue_size", 1024))

    def start(self) -> None:
        self.open()
        self._thread.start()

    def is_alive(self) -> bool:
        """True while the sink's delivery thread runs (for health checks)."""
        return self._thread.is_alive()

    def offer(self, event: Event) -> None:
        """Queue an event if this sink wants its type; drop and count it when the queue is full."""
        if event["type"] not in self.events:
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def _loop(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                break
            try:
                self.write(event)
                self.sent += 1
            except Exception as exc:  # noqa: BLE001 - an output failure must never stop the pipeline
                self.failed += 1
                log.warning("output %s: %s", self.type_name, exc)
        self.flush_close()

    def open(self) -> None:
        """Acquire sockets, files, clients. Runs before the thread starts."""

    @abstractmethod
    def write(self, event: Event) -> None:
        """Deliver one event (on the sink's own thread)."""

    def flush_close(self) -> None:
        """Flush and release; runs on the sink's thread after the last event."""

    def close(self, timeout: float = 2.0) -> None:
        """Deliver what is queued, then stop."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("output %s: queue still full at shutdown, %d events dropped", self.type_name,
                        self._queue.qsize())
        self._thread.join(timeout)


class EventBus:
    """Fans every event out to every sink (each filters by type)."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def publish(self, event: Event) -> None:
        for sink in self.sinks:
            sink.offer(event)
