"""Events on standard output: JSON lines for programs, or one readable line per event for a person at a terminal.

JSON lines (one event per line, flushed per line so pipes see events at once) are the contract for anything that
reads stdout: a pipe, a file, systemd. A person who starts the daemon in a terminal, though, met a wall of JSON
(about ten 1.4 KB observation lines a second, the few commands lost among them); with `format: auto` (the default)
a terminal gets one short line per command, camera change and config reload instead, and observations only when
`text_observations` asks for them. Camera changes are left to the log when it shares the terminal (each showed twice).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Literal, TextIO

from pydantic import Field

from pipeline.core.registry import Plugin
from pipeline.outputs.base import ALL_EVENTS, EventName, OutputSettings, Sink
from pipeline.outputs.events import Event

StdoutFormat = Literal["auto", "json", "text"]


class StdoutOutput(OutputSettings):
    """Events on standard output: JSON lines, or readable text lines on a terminal."""

    type: Literal["stdout"] = Field("stdout", description="Output kind.")
    events: list[EventName] = Field(default_factory=lambda: list(ALL_EVENTS), min_length=1,
                                    description="Event types written: observation, command, camera.")
    format: StdoutFormat = Field("auto", description="json: one JSON object per line (the event schema). text: one "
                                 "readable line per command, camera change and config reload. auto: text when "
                                 "stdout is a terminal, JSON when it is piped, redirected or under systemd.")
    text_observations: bool = Field(False, description="In text format, also print one line per analysed frame "
                                    "(faces and emotions; about ten a second). Off: the terminal shows what the "
                                    "avatar is told, and the observations stay in the JSON outputs.")

    def describe(self) -> str:
        return f"{super().describe()} format {self.format}"


def _is_terminal(stream: TextIO) -> bool:
    """Whether a person reads `stream`; a closed or unusual stream counts as a program reading it."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _same_terminal(out: TextIO, err: TextIO) -> bool:
    """Whether two streams are the same terminal (a person reads both on one screen)."""
    try:
        return bool(out.isatty() and err.isatty()) and os.fstat(out.fileno()).st_rdev == os.fstat(err.fileno()).st_rdev
    except (AttributeError, ValueError, OSError):
        return False


def _clock(event: Event) -> str:
    return time.strftime("%H:%M:%S", time.localtime(float(event.get("ts") or time.time())))


def _command_text(event: Event) -> str:
    expression, tone = event.get("expression") or {}, event.get("tone") or {}
    if event.get("reason") == "idle":
        why = "idle"
    else:
        why = "room" if event.get("target") is None else f"face #{event['target']}"
    return (f"{event.get('emotion')} {float(event.get('confidence') or 0.0):.2f} -> expression "
            f"{expression.get('preset')} {float(expression.get('weight') or 0.0):.1f}, tone {tone.get('style')} "
            f"({why})")


def _camera_text(event: Event) -> str:
    detail = event.get("detail")
    return f"{event.get('state')}: {detail}" if detail else str(event.get("state"))


def _config_text(event: Event) -> str:
    items = event.get("changes") if event.get("status") == "applied" else event.get("errors")
    return f"{event.get('status')}: {'; '.join(items) if items else 'no changes'}"


def _observation_text(event: Event) -> str:
    faces = event.get("faces") or []
    parts = []
    for face in faces:
        shown = face.get("smoothed") or face
        track = f"#{face['track_id']} " if "track_id" in face else ""
        parts.append(f"{track}{shown.get('emotion')} {float(shown.get('confidence') or 0.0):.2f}")
    total = (event.get("latency_ms") or {}).get("total")
    count = f"{len(faces)} face{'' if len(faces) == 1 else 's'}"
    return (f"frame {event.get('frame')}: {count}{': ' if parts else ''}{', '.join(parts)}"
            f"{f'  ({total:.0f} ms)' if total is not None else ''}")


def _presence_text(event: Event) -> str:
    dwell = f" after {event['dwell_s']:.1f} s" if event.get("dwell_s") is not None else ""
    return f"visitor #{event.get('track_id')} {event.get('event')}{dwell}"


SHOWN = {"command": "commands", "camera": "camera changes", "config": "config reloads", "presence": "visitors",
         "observation": "observations"}
TEXT = {"command": _command_text, "camera": _camera_text, "config": _config_text, "observation": _observation_text,
        "presence": _presence_text}


def text_line(event: Event) -> str:
    """One event as a line a person reads at a glance: time, camera, kind, what happened."""
    kind = str(event.get("type"))
    render = TEXT.get(kind)
    body = render(event) if render else json.dumps(event, separators=(",", ":"))
    return f"{_clock(event)}  {event.get('camera') or '-':<12} {kind:<11} {body}"


class StdoutSink(Sink):
    type_name = "stdout"

    def __init__(self, cfg: Any, queue_size: int = 1024, stream: TextIO | None = None) -> None:
        super().__init__(cfg, queue_size)
        self._stream = stream or sys.stdout
        fmt = getattr(cfg, "format", "json")
        self.text = fmt == "text" or (fmt == "auto" and _is_terminal(self._stream))
        if self.text and not getattr(cfg, "text_observations", False):
            self.events = self.events - {"observation"}  # not even queued: nobody asked to read them
        if self.text and fmt == "auto" and _same_terminal(self._stream, sys.stderr):
            # The log on the same screen already says every camera change (failures and returns at WARNING): the
            # person at the terminal read each one twice.
            self.events = self.events - {"camera"}

    def open(self) -> None:
        """In text format, say once what the lines are and how to get JSON, so nobody scripts against text."""
        if self.text:
            shown = ", ".join(label for kind, label in SHOWN.items() if kind in self.events)
            self._stream.write(f"events as text ({shown}) as stdout is a terminal; piped, or with "
                               "`format: json` on the stdout output, they are JSON lines\n")
            self._stream.flush()

    def write(self, event: Event) -> None:
        line = text_line(event) if self.text else json.dumps(event, separators=(",", ":"))
        self._stream.write(line + "\n")
        self._stream.flush()


PLUGIN = Plugin("stdout", StdoutOutput, StdoutSink)
