"""JSON lines on standard output: one event per line, flushed per line so pipes see events at once."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from pipeline.outputs.events import Event
from pipeline.outputs.base import Sink


class StdoutSink(Sink):
    type_name = "stdout"

    def __init__(self, cfg: Any, queue_size: int = 1024, stream: TextIO | None = None) -> None:
        super().__init__(cfg, queue_size)
        self._stream = stream or sys.stdout

    def write(self, event: Event) -> None:
        self._stream.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._stream.flush()
