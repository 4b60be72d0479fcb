"""JSON lines on standard output: one event per line, flushed per line so pipes see events at once."""

from __future__ import annotations

import json
import sys
from typing import Any, Literal, TextIO

from pydantic import Field

from pipeline.core.registry import Plugin
from pipeline.outputs.base import ALL_EVENTS, EventName, OutputSettings, Sink
from pipeline.outputs.events import Event


class StdoutOutput(OutputSettings):
    """Events as JSON lines on standard output."""

    type: Literal["stdout"] = Field("stdout", description="Output kind.")
    events: list[EventName] = Field(default_factory=lambda: list(ALL_EVENTS), min_length=1,
                                    description="Event types written: observation, command, camera.")


class StdoutSink(Sink):
    type_name = "stdout"

    def __init__(self, cfg: Any, queue_size: int = 1024, stream: TextIO | None = None) -> None:
        super().__init__(cfg, queue_size)
        self._stream = stream or sys.stdout

    def write(self, event: Event) -> None:
        self._stream.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._stream.flush()


PLUGIN = Plugin("stdout", StdoutOutput, StdoutSink)
