"""The camera test servers work with OpenCV's FFmpeg backend, and fail the way real cameras fail.

These pin down the behaviour the capture code relies on (measured on OpenCV 5.0 / its bundled FFmpeg):
* RTSP server killed: read() returns False at once (TCP EOF), no timeout needed.
* RTSP server frozen: read() blocks READ_TIMEOUT per call and may still return True a couple of times
  (frames drained from the H.264 decoder) before returning False, so detection takes up to ~3x READ_TIMEOUT.
* MJPEG server stalled: read() returns False after one READ_TIMEOUT.
* After any failure the VideoCapture is dead even if the source comes back: it must be reopened.

No pass/fail check is a time window: "at once" is shown against a read timeout far longer than any machine's noise
(NO_TIMEOUT_MS: failing in under half of it means the timeout played no part), "times out" by the read failing while
the connection is still open, and time limits are generous hang guards only.
"""

from __future__ import annotations

import time
from pathlib import Path

import cv2
import pytest

from tests.conftest import data_path
from tests.servers.fixtures import (  # noqa: F401  (importing the fixtures registers them)
    StartMjpeg,
    StartRtsp,
    mjpeg_server_fixture,
    open_capture,
    rtsp_server_fixture,
)

READ_TIMEOUT_MS = 1000
NO_TIMEOUT_MS = 30_000  # a read timeout that a failure "at once" must not wait for
HANG_GUARD_S = 20.0  # generous: a stall must be detected through READ_TIMEOUT, at most a few of them, not hang


@pytest.fixture
def clip() -> Path:
    """Small H.264 clip with a 10-frame GOP, so a client joining mid-stream decodes within 0.4 s."""
    return data_path("video", "woman_short.mp4")


def read_frames(cap: cv2.VideoCapture, count: int) -> int:
    """How many of `count` reads succeeded before the first failure."""
    for done in range(count):
        ok, _ = cap.read()
        if not ok:
            return done
    return count


def seconds_until_read_fails(cap: cv2.VideoCapture, max_reads: int = 200) -> float:
    """Wall time from now until read() first returns False (buffered frames are drained on the way)."""
    start = time.monotonic()
    for _ in range(max_reads):
        if not cap.read()[0]:
            return time.monotonic() - start
    pytest.fail(f"read() still succeeds after {max_reads} reads")


def test_rtsp_opens_and_reads_frames(rtsp_server: StartRtsp, clip: Path) -> None:
    server = rtsp_server(clip)
    cap = open_capture(server.url, read_timeout_ms=READ_TIMEOUT_MS)
    try:
        assert cap.isOpened(), server.stderr_text()
        assert read_frames(cap, 30) == 30
    finally:
        cap.release()


def test_rtsp_kill_fails_reads_then_restart_reopens(rtsp_server: StartRtsp, clip: Path) -> None:
    server = rtsp_server(clip)
    cap = open_capture(server.url, read_timeout_ms=NO_TIMEOUT_MS)
    assert read_frames(cap, 10) == 10
    server.kill()
    # TCP EOF: read() fails without waiting for the (30 s) read timeout
    assert seconds_until_read_fails(cap) < NO_TIMEOUT_MS / 1000 / 2, "a killed server's EOF waited for the timeout"
    cap.release()

    server.restart()
    cap = open_capture(server.url, read_timeout_ms=READ_TIMEOUT_MS)
    try:
        assert cap.isOpened(), server.stderr_text()
        assert read_frames(cap, 10) == 10
    finally:
        cap.release()


def test_rtsp_stall_fails_reads_within_bounded_time(rtsp_server: StartRtsp, clip: Path) -> None:
    server = rtsp_server(clip)
    cap = open_capture(server.url, read_timeout_ms=READ_TIMEOUT_MS)
    assert read_frames(cap, 10) == 10
    server.stall()
    # Each blocked read gives up after READ_TIMEOUT, but the decoder may hand out its last frames first; it fails
    # (seconds_until_read_fails fails the test if it never does), well before the hang guard
    assert seconds_until_read_fails(cap) < HANG_GUARD_S
    server.resume()
    assert not cap.read()[0], "a capture that timed out stays dead: callers must reopen"
    cap.release()
    cap = open_capture(server.url, read_timeout_ms=READ_TIMEOUT_MS)
    try:
        assert read_frames(cap, 5) == 5
    finally:
        cap.release()


def test_rtsp_auth_rejects_wrong_password(rtsp_server: StartRtsp, clip: Path) -> None:
    server = rtsp_server(clip, user="cam", password="p@ss word")
    for wrong in (server.url_with(None, None), server.url_with("cam", "nope")):
        cap = open_capture(wrong)
        assert not cap.isOpened(), f"{wrong} opened without the right credentials"
    cap = open_capture(server.url)  # credentials embedded, percent-encoded
    try:
        assert cap.isOpened(), server.stderr_text()
        assert read_frames(cap, 3) == 3
    finally:
        cap.release()


def test_mjpeg_reads_frames(mjpeg_server: StartMjpeg, clip: Path) -> None:
    server = mjpeg_server(clip, fps=50, max_frames=40)
    cap = open_capture(server.url, read_timeout_ms=READ_TIMEOUT_MS)
    try:
        assert cap.isOpened()
        assert read_frames(cap, 30) == 30
        assert cap.read()[1].shape[:2] == (336, 596)
    finally:
        cap.release()


def test_mjpeg_stall_read_times_out_then_resume_reopens(mjpeg_server: StartMjpeg, clip: Path) -> None:
    server = mjpeg_server(clip, fps=50, max_frames=40)
    cap = open_capture(server.url, read_timeout_ms=READ_TIMEOUT_MS)
    assert read_frames(cap, 5) == 5
    server.stall()
    elapsed = seconds_until_read_fails(cap)
    print(f"\nstalled MJPEG: read() failed after {elapsed:.2f} s (READ_TIMEOUT {READ_TIMEOUT_MS / 1000:g} s)")
    assert elapsed < HANG_GUARD_S
    # the connection is still open, so it was the read timeout that ended the read, not the stream closing
    assert server.clients == 1, "a stall keeps the connection open"
    server.resume()
    cap.release()
    cap = open_capture(server.url, read_timeout_ms=READ_TIMEOUT_MS)
    try:
        assert read_frames(cap, 5) == 5
    finally:
        cap.release()


def test_mjpeg_stop_ends_stream_at_once(mjpeg_server: StartMjpeg, clip: Path) -> None:
    server = mjpeg_server(clip, fps=50, max_frames=40)
    cap = open_capture(server.url, read_timeout_ms=NO_TIMEOUT_MS)
    assert read_frames(cap, 5) == 5
    server.stop()
    try:
        assert seconds_until_read_fails(cap) < NO_TIMEOUT_MS / 1000 / 2, \
            "a closed connection must not wait for the read timeout"
    finally:
        cap.release()
