"""Issue 12, item 9: a camera's reconnects must not start new reader threads.

Resident memory rose by a few MB at each reconnect because every reconnect opened the source on a new thread: glibc
gives each new thread that allocates a malloc arena of its own choosing (a new one while the previous reader is still
blocked in FFmpeg), and every arena a camera's frame buffers passed through kept them cached (BENCHMARKS.md, "Memory
at reconnects"). The fix is structural, and so are these tests: they count the threads that opened a camera's
source, never bytes or seconds (the memory figures are `bench soak`'s job).

The sources are scripted (they drop, stall or hang on cue) so each reconnect path is taken on purpose and quickly;
one test does the same against the real RTSP server, killed and restarted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.capture import thread as capture_thread
from pipeline.capture.source_base import SourceError, VideoSource
from pipeline.capture.sources import configure_ffmpeg, open_source
from pipeline.capture.thread import CaptureThread
from pipeline.config.app import CameraConfig, ReconnectConfig
from pipeline.core.types import CameraEvent
from tests.running_daemon import clip as clip_path
from tests.running_daemon import wait_until
from tests.servers.fixtures import (  # noqa: F401  (registers the fixture)
    StartRtsp,
    rtsp_server_fixture,
)

HANG_GUARD_S = 30.0  # only catches a hang; no test waits for a duration


class ScriptedSource(VideoSource):
    """Delivers `frames` frames, then fails the way `then` says: `drop` (the read fails at once, as when a camera
    reboots), `stall` (the read blocks past the stall and then gives up, as FFmpeg's read timeout does) or `hang`
    (the read blocks until the test releases it: a reader stuck beyond every timeout)."""

    kind = "scripted"

    def __init__(self, frames: int, then: str, release: threading.Event) -> None:
        self._left, self._then, self._release = frames, then, release

    def grab(self, timeout: float) -> bool:
        if self._left > 0:
            self._left -= 1
            time.sleep(0.005)
            return True
        if self._then == "drop":
            raise SourceError("scripted: connection dropped")
        self._release.wait(timeout * 3 if self._then == "stall" else None)
        return False

    def retrieve(self) -> np.ndarray:
        return np.zeros((8, 8, 3), np.uint8)

    def describe(self) -> str:
        return f"scripted ({self._then})"


class Opens:
    """A source factory that records which thread opened each session."""

    def __init__(self, make: Callable[[CameraConfig], VideoSource]) -> None:
        self.threads: list[threading.Thread] = []
        self._make = make
        self._lock = threading.Lock()

    def __call__(self, cfg: CameraConfig) -> VideoSource:
        with self._lock:
            self.threads.append(threading.current_thread())
        return self._make(cfg)

    def distinct_threads(self) -> int:
        with self._lock:
            return len({id(t) for t in self.threads})

    def count(self) -> int:
        with self._lock:
            return len(self.threads)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at teardown, so that no scripted read stays blocked after its test."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def run_camera() -> Iterator[Callable[..., tuple[CaptureThread, list[CameraEvent]]]]:
    """Start a CaptureThread on a source factory; stopped at teardown."""
    started: list[tuple[CaptureThread, threading.Event]] = []

    def start(factory: Callable[[CameraConfig], VideoSource], source: str = "demo",
              stall_s: float = 5.0) -> tuple[CaptureThread, list[CameraEvent]]:
        cfg = CameraConfig(name="cam", source=source, fps=100,
                           reconnect=ReconnectConfig(initial_s=0.01, max_s=0.02, stall_s=stall_s))
        events: list[CameraEvent] = []
        stop = threading.Event()
        capture = CaptureThread(cfg, stop, events.append, factory)
        capture.start()
        started.append((capture, stop))
        return capture, events

    yield start
    for capture, stop in started:
        stop.set()
        capture.join(HANG_GUARD_S)
        assert not capture.is_alive(), "the capture thread did not stop"


def states(events: list[CameraEvent]) -> list[str]:
    return [e.state for e in list(events)]


def test_dropped_connections_reopen_on_the_same_reader_thread(run_camera: Callable, release: threading.Event) -> None:
    opens = Opens(lambda cfg: ScriptedSource(3, "drop", release))
    capture, events = run_camera(opens)
    assert wait_until(lambda: opens.count() >= 12, timeout=HANG_GUARD_S), states(events)

    assert opens.distinct_threads() == 1, (
        f"{opens.count()} opens of one camera ran on {opens.distinct_threads()} different threads")
    assert capture.readers_started == 1
    assert capture.reconnects.total >= 10 and states(events).count("streaming") >= 10, states(events)
    assert capture.reader is opens.threads[0] and capture.reader.is_alive()


def test_stalled_reads_reopen_on_the_same_reader_once_it_gives_up(run_camera: Callable,
                                                                  release: threading.Event) -> None:
    """A stall is declared while the reader is still blocked in its read: the camera waits for that read to give up
    instead of opening on a second thread beside it (the case that made glibc add arenas)."""
    opens = Opens(lambda cfg: ScriptedSource(3, "stall", release))
    capture, events = run_camera(opens, stall_s=0.2)
    assert wait_until(lambda: opens.count() >= 4, timeout=HANG_GUARD_S), states(events)

    assert opens.distinct_threads() == 1, (
        f"{opens.count()} opens of one camera ran on {opens.distinct_threads()} different threads")
    assert capture.readers_started == 1
    assert capture.stalls.total >= 3
    assert states(events)[:4] == ["streaming", "stalled", "reconnecting", "streaming"], states(events)


def test_a_reader_stuck_beyond_every_timeout_is_replaced(run_camera: Callable, release: threading.Event,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The one case that still starts a second reader: the old one did not come back within READER_RETURN_S (a
    driver that ignores its timeouts). The camera recovers on a new thread; the stuck one ends once released."""
    monkeypatch.setattr(capture_thread, "READER_RETURN_S", 0.3)
    sessions = iter([ScriptedSource(3, "hang", release)])
    opens = Opens(lambda cfg: next(sessions, None) or ScriptedSource(10_000, "drop", release))
    capture, events = run_camera(opens, stall_s=0.2)
    with caplog.at_level(logging.WARNING, logger="pipeline.capture.thread"):
        assert wait_until(lambda: states(events).count("streaming") >= 2, timeout=HANG_GUARD_S), states(events)

    assert capture.readers_started == 2 and opens.distinct_threads() == 2
    stuck = opens.threads[0]
    assert stuck.is_alive() and capture.reader is opens.threads[1]
    assert "starting a new reader thread" in caplog.text
    release.set()
    stuck.join(HANG_GUARD_S)
    assert not stuck.is_alive(), "the retired reader did not end once its read returned"


def test_rtsp_server_restarts_reopen_on_the_same_reader_thread(run_camera: Callable,
                                                               rtsp_server: StartRtsp) -> None:
    """The same with the real RTSP server killed and restarted (a camera rebooting), through FFmpeg."""
    configure_ffmpeg("tcp")
    server = rtsp_server(Path(clip_path()))
    opens = Opens(open_source)
    capture, events = run_camera(opens, source=server.url, stall_s=3.0)
    for outage in range(1, 4):
        assert wait_until(lambda: states(events).count("streaming") == outage and capture.frames_in.total,
                          timeout=HANG_GUARD_S), states(events)
        server.kill()
        assert wait_until(lambda: capture.reconnects.total >= outage, timeout=HANG_GUARD_S), states(events)
        server.restart()
    assert wait_until(lambda: states(events).count("streaming") == 4, timeout=HANG_GUARD_S), states(events)

    assert opens.distinct_threads() == 1, (
        f"{opens.count()} opens of one camera ran on {opens.distinct_threads()} different threads")
    assert capture.readers_started == 1
