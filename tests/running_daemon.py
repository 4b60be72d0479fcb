"""Helpers for tests that run the daemon as an operator (or systemd) would: a `run_pipeline.py run` subprocess whose
JSON events and logs are read by threads, a real sd_notify datagram socket, free ports and config files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, data_path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clip() -> Path:
    return data_path("video", "woman_short.mp4")


def short_clip(name: str, seconds: float, folder: Path) -> Path:
    """The first `seconds` of ../shared/data/video/NAME, re-encoded into `folder`: file cameras play in real time,
    so a daemon test that waits for a clip to end waits for all of it (suite time)."""
    import cv2

    capture = cv2.VideoCapture(str(data_path("video", name)))
    fps = capture.get(cv2.CAP_PROP_FPS) or 25.0
    path = folder / f"{Path(name).stem}_{seconds:g}s.mp4"
    writer = None
    try:
        for _ in range(int(seconds * fps)):
            ok, frame = capture.read()
            if not ok:
                break
            if writer is None:
                writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps,
                                         (frame.shape[1], frame.shape[0]))
            writer.write(frame)
    finally:
        capture.release()
        if writer is not None:
            writer.release()
    return path


def write_config(path: Path, cameras: list[str], extra: str = "", port: int | None = None,
                 outputs: str = "[{type: stdout}]", server: str = "") -> Path:
    """A small config: detector input 320x192 (fast on a CPU), quick behaviour, the given cameras (YAML flow maps)."""
    server_yaml = f"server: {{port: {port}{', ' + server if server else ''}}}\n" if port else \
        "server: {enabled: false}\n"
    path.write_text("cameras:\n" + "".join(f"  - {c}\n" for c in cameras) +
                    "detector: {input_size: [320, 192]}\n"
                    "behavior: {dwell_ms: 300, cooldown_ms: 800}\n"
                    f"outputs: {outputs}\n" + server_yaml + extra)
    return path


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class RunningDaemon:
    """`python run_pipeline.py run --config FILE` with its stdout events and stderr lines collected as they come."""

    def __init__(self, config: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        self.config = config
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "run_pipeline.py"), "run", "--config", str(config),
                                      *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     env=dict(os.environ, **(env or {})), bufsize=1)
        self.stdout: list[str] = []  # every stdout line, JSON or not
        self.arrivals: list[tuple[float, dict[str, Any]]] = []  # each JSON event with the monotonic time it was read
        self.stderr: list[str] = []
        self._threads = [threading.Thread(target=self._read_events, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            arrived = time.monotonic()
            self.stdout.append(line)
            if line.startswith("{"):
                self.arrivals.append((arrived, json.loads(line)))

    @property
    def events(self) -> list[dict[str, Any]]:
        """The JSON events so far, in arrival order."""
        return [event for _, event in list(self.arrivals)]

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def of(self, type_: str, camera: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_ and (camera is None or e.get("camera") == camera)]

    def stderr_text(self) -> str:
        return "".join(self.stderr)

    def stdout_text(self) -> str:
        return "".join(self.stdout)

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        if not wait_until(lambda: predicate() or self.proc.poll() is not None, timeout) or not predicate():
            pytest.fail(f"{what}: not within {timeout:g} s (exit {self.proc.poll()}); "
                        f"stderr tail:\n{self.stderr_text()[-3000:]}")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def terminate(self, timeout: float = 10.0) -> tuple[int, float]:
        """SIGTERM; (exit code, seconds from the signal to the process having exited)."""
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self._exit_code(timeout, " of SIGTERM")
        elapsed = time.monotonic() - began
        self._drain()
        return code, elapsed

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit by itself and for both pipes to be drained; the exit status."""
        code = self._exit_code(timeout, "")
        self._drain()
        return code

    def _exit_code(self, timeout: float, after: str) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"no exit within {timeout:g} s{after}; stderr tail:\n{self.stderr_text()[-3000:]}")

    def _drain(self) -> None:
        for thread in self._threads:
            thread.join(5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def daemons() -> Iterator[Callable[..., RunningDaemon]]:
    started: list[RunningDaemon] = []

    def start(config: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> RunningDaemon:
        daemon = RunningDaemon(config, env, args)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()


class NotifyListener:
    """A real sd_notify socket: AF_UNIX datagrams at a path, or in the abstract namespace (`@name`)."""

    def __init__(self, address: str | Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        text = str(address)
        self.env_value = text
        self.sock.bind(b"\0" + text[1:].encode() if text.startswith("@") else text)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def with_key(self, key: str, value: str | None = None) -> list[tuple[float, dict[str, str]]]:
        return [(t, m) for t, m in list(self.messages) if key in m and (value is None or m[key] == value)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1)
        self.sock.close()
