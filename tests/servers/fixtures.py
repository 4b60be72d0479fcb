"""Pytest fixtures that start real RTSP and MJPEG servers, and tear them down even when a test fails.

Use them from a test module (or list ``"tests.servers.fixtures"`` in ``pytest_plugins`` of a conftest):

    from tests.servers.fixtures import mjpeg_server_fixture, rtsp_server_fixture  # noqa: F401  (registers them)

    def test_reconnect(rtsp_server):
        server = rtsp_server(VIDEO)            # -> RtspProcess, already READY
        cap = open_capture(server.url)
        server.kill(); ...; server.restart()   # same port, so the same URL works again

The RTSP server is a separate process run by the *system* python (GStreamer's Python bindings come from Debian
packages, not from the venv): killing it is then a real camera crash, SIGSTOP a real frozen camera.  Tests are
skipped, with the reason, where those packages are missing.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import selectors
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO
from urllib.parse import quote

import cv2
import pytest

from tests.servers.mjpeg_server import MjpegServer

LOG = logging.getLogger(__name__)

SYSTEM_PYTHON = "/usr/bin/python3"
RTSP_SCRIPT = Path(__file__).with_name("rtsp_server.py")
READY_TIMEOUT_S = 20.0
APT_HINT = "apt-get install -y --no-install-recommends gir1.2-gst-rtsp-server-1.0 python3-gi"


def free_port() -> int:
    """A TCP port that is free right now (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@functools.lru_cache(maxsize=1)
def rtsp_unavailable_reason() -> str | None:
    """Why the GStreamer RTSP server cannot run here, or None when it can (checked once per session)."""
    if not Path(SYSTEM_PYTHON).exists():
        return f"{SYSTEM_PYTHON} is absent (the RTSP test server needs the system python with PyGObject)"
    probe = ("import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0'); "
             "from gi.repository import GstRtspServer")
    result = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()[-1:] or ["?"]
        return f"GStreamer RTSP server not installed ({detail[0]}); install with: {APT_HINT}"
    return None


def open_capture(url: str, open_timeout_ms: int = 5000, read_timeout_ms: int = 3000) -> cv2.VideoCapture:
    """Open `url` with OpenCV's FFmpeg backend and bounded timeouts; RTSP is forced onto TCP.

    OPENCV_FFMPEG_CAPTURE_OPTIONS is only read while opening, so it is set just for this call and restored.
    """
    saved = os.environ.get("OPENCV_FFMPEG_CAPTURE_OPTIONS")
    if url.startswith("rtsp://"):
        os.environ["OPENCV_FFMPEG_CAPTURE_OPTIONS"] = "rtsp_transport;tcp"
    try:
        return cv2.VideoCapture(url, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, open_timeout_ms,
                                                      cv2.CAP_PROP_READ_TIMEOUT_MSEC, read_timeout_ms])
    finally:
        if saved is None:
            os.environ.pop("OPENCV_FFMPEG_CAPTURE_OPTIONS", None)
        else:
            os.environ["OPENCV_FFMPEG_CAPTURE_OPTIONS"] = saved


class RtspProcess:
    """One `rtsp_server.py` process on a fixed port; it can be stopped, killed, stalled and restarted."""

    def __init__(self, video: Path, port: int, path: str = "/cam",
                 user: str | None = None, password: str | None = None) -> None:
        self.video, self.port, self.path = Path(video), port, path
        self.user, self.password = user, password
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self._stalled = False

    @property
    def url(self) -> str:
        """The stream URL, with the server's credentials embedded when it requires auth."""
        return self.url_with(self.user, self.password)

    def url_with(self, user: str | None, password: str | None) -> str:
        """The stream URL with arbitrary (possibly wrong) credentials, for auth tests."""
        auth = "" if user is None else f"{quote(user, safe='')}:{quote(password or '', safe='')}@"
        return f"rtsp://{auth}127.0.0.1:{self.port}{self.path}"

    @property
    def running(self) -> bool:
        """True while the server process is alive (stalled counts as alive)."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> RtspProcess:
        """Launch the server and wait for its READY line; fail the test with its stderr if none comes."""
        cmd = [SYSTEM_PYTHON, str(RTSP_SCRIPT), "--port", str(self.port), "--path", self.path,
               "--video", str(self.video)]
        if self.user is not None:
            cmd += ["--user", self.user, "--password", self.password or ""]
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="rtsp_server_stderr")  # noqa: SIM115 (closed in close())
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1)
        self._wait_ready()
        LOG.info("RTSP server pid %d ready at %s", self._proc.pid, self.url_with(None, None))
        return self

    def _wait_ready(self) -> None:
        """Block until `READY rtsp://...` appears on stdout, the process dies, or READY_TIMEOUT_S passes."""
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(timeout=left):
                    line = self._proc.stdout.readline()
                    if line.startswith("READY "):
                        return
                    if line == "":  # EOF: the process is exiting
                        _wait_quietly(self._proc, timeout=5)
                        break
        exited = self._proc.poll() is not None
        self.kill()
        what = (f"exited with status {self._proc.returncode}" if exited
                else f"did not report READY within {READY_TIMEOUT_S:.0f} s")
        pytest.fail(f"RTSP server on port {self.port} {what}; stderr:\n{self.stderr_text()}")

    def stderr_text(self) -> str:
        """What the server wrote to stderr so far (for failure messages)."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()

    def stall(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open but no packet is sent, like a hung camera."""
        if self.running:
            os.kill(self._proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            self._stalled = True

    def resume(self) -> None:
        """Undo stall() (SIGCONT)."""
        if self.running and self._stalled:
            os.kill(self._proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        self._stalled = False

    def stop(self, timeout: float = 10.0) -> int | None:
        """Graceful stop: SIGTERM (after SIGCONT if stalled) and wait; SIGKILL if it does not exit in time."""
        if self._proc is None:
            return None
        if self.running:
            self.resume()  # a stopped process would keep SIGTERM pending forever
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                LOG.warning("RTSP server pid %d ignored SIGTERM; killing it", self._proc.pid)
                self.kill()
        return self._proc.returncode

    def kill(self) -> None:
        """Crash the server (SIGKILL, works even while stalled) and reap it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._stalled = False

    def restart(self) -> RtspProcess:
        """Stop whatever runs, then start again on the same port and path (so `url` is unchanged)."""
        self.close()
        return self.start()

    def close(self) -> None:
        """Stop the process and release its pipes; safe to call any number of times."""
        self.stop()
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _wait_quietly(proc: subprocess.Popen[str], timeout: float) -> None:
    """Reap `proc` if it exits within `timeout`; otherwise leave it to the caller."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)


StartRtsp = Callable[..., RtspProcess]
StartMjpeg = Callable[..., MjpegServer]


@pytest.fixture(name="rtsp_server")
def rtsp_server_fixture() -> Iterator[StartRtsp]:
    """Factory `start_rtsp(video, port=None, user=None, password=None, path="/cam") -> RtspProcess` (started).

    Skips the test when the GStreamer RTSP packages are missing.  Every server started through the factory is
    stopped at teardown, whatever the test did to it (killed, stalled, restarted).
    """
    reason = rtsp_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    started: list[RtspProcess] = []

    def start_rtsp(video: Path, port: int | None = None, user: str | None = None,
                   password: str | None = None, path: str = "/cam") -> RtspProcess:
        server = RtspProcess(video, port or free_port(), path=path, user=user, password=password)
        started.append(server)
        return server.start()

    yield start_rtsp
    for server in started:
        server.close()


@pytest.fixture(name="mjpeg_server")
def mjpeg_server_fixture() -> Iterator[StartMjpeg]:
    """Factory `start_mjpeg(video, fps=None, max_frames=250) -> MjpegServer` (started, ephemeral port).

    Every server started through the factory is stopped at teardown, even when the test failed or stalled it.
    """
    started: list[MjpegServer] = []

    def start_mjpeg(video: Path, fps: float | None = None, max_frames: int = 250) -> MjpegServer:
        server = MjpegServer(video, fps=fps, max_frames=max_frames)
        started.append(server)
        return server.start()

    yield start_mjpeg
    for server in started:
        server.stop()
