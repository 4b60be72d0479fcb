"""The Sink role: one output of events, isolated behind its own bounded queue and thread.

A sink that is slow or broken drops (and counts) its own events; it can never stall perception or the other sinks.
"""

from __future__ import annotations

import importlib
import logging
import queue
import threading
from abc import ABC, abstractmethod
from typing import Any

from pipeline.outputs.events import Event

log = logging.getLogger(__name__)


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


_REGISTRY: dict[str, str] = {
    "stdout": "pipeline.outputs.stdout:StdoutSink",
    "websocket": "pipeline.outputs.websocket:WebsocketSink",
    "osc": "pipeline.outputs.osc:OscSink",
    "webhook": "pipeline.outputs.webhook:WebhookSink",
}


def create_sink(cfg: Any) -> Sink:
    target = _REGISTRY.get(cfg.type)
    if target is None:
        raise ValueError(f"output type {cfg.type!r} is not available yet (available: {', '.join(sorted(_REGISTRY))})")
    module_name, class_name = target.split(":")
    sink_class: type[Sink] = getattr(importlib.import_module(module_name), class_name)
    return sink_class(cfg, getattr(cfg, "queue_size", 1024))


class EventBus:
    """Fans every event out to every sink (each filters by type)."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def publish(self, event: Event) -> None:
        for sink in self.sinks:
            sink.offer(event)
