"""An in-process HTTP MJPEG server (``multipart/x-mixed-replace``) that tests can stall, resume and stop.

Many IP cameras serve MJPEG over plain HTTP; their failure modes differ from RTSP (no session, no RTCP, a stalled
camera usually keeps the TCP connection open).  This server reproduces them on 127.0.0.1 with an ephemeral port:

    server = MjpegServer(Path("clip.mp4"), fps=25)
    server.start()
    cap = cv2.VideoCapture(server.url, cv2.CAP_FFMPEG)
    server.stall()    # connections stay open, no bytes flow
    server.resume()
    server.stop()     # closes every connection, so clients see EOF

Frames are decoded and JPEG-encoded once, up front, so serving costs no CPU beyond socket writes; the 2-core CI
machine also runs the pipeline under test.  Only the standard library and OpenCV are used.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2

LOG = logging.getLogger(__name__)

BOUNDARY = "frame"
STREAM_PATH = "/stream.mjpg"


def encode_clip(video: Path, max_frames: int = 250, quality: int = 80) -> list[bytes]:
    """Decode up to `max_frames` frames of `video` and JPEG-encode them (done once; frames loop forever)."""
    cap = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    jpegs: list[bytes] = []
    try:
        while len(jpegs) < max_frames:
            ok, frame = cap.read()
            if not ok:
                break
            ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if ok:
                jpegs.append(buf.tobytes())
    finally:
        cap.release()
    if not jpegs:
        raise ValueError(f"{video}: no frame could be decoded")
    return jpegs


def video_fps(video: Path, default: float = 25.0) -> float:
    """The clip's nominal frame rate, so the stream plays at natural speed unless a test asks otherwise."""
    cap = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    fps = cap.get(cv2.CAP_PROP_FPS)
    cap.release()
    return fps if fps and 1.0 <= fps <= 120.0 else default


class _Handler(BaseHTTPRequestHandler):
    """Streams the shared JPEG list to one client; `server` is the `_HttpServer` carrying the controls."""

    server: _HttpServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        """Send the multipart header, then one part per frame until the server stops or the client leaves."""
        if self.path.split("?")[0] != STREAM_PATH:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.server.owner._track(self.connection, add=True)
        try:
            self.server.owner._stream_to(self.wfile)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            LOG.debug("client %s left: %s", self.client_address, exc)
        finally:
            self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (signature of the base class)
        """Route http.server's access log to logging instead of stderr."""
        LOG.debug("%s " + format, self.client_address[0], *args)


class _HttpServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its `MjpegServer` (handlers reach the controls through it)."""

    daemon_threads = True
    owner: MjpegServer


class MjpegServer:
    """HTTP MJPEG camera double with `stall()`, `resume()` and `stop()`; see the module docstring."""

    def __init__(self, video: Path, fps: float | None = None, max_frames: int = 250) -> None:
        self.fps = fps or video_fps(video)
        self._jpegs = encode_clip(video, max_frames=max_frames)
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self.frames_sent = 0

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT/stream.mjpg` (valid once started)."""
        if self._http is None:
            raise RuntimeError("MjpegServer.url is only known after start()")
        return f"http://127.0.0.1:{self._http.server_address[1]}{STREAM_PATH}"

    @property
    def clients(self) -> int:
        """Number of clients currently connected to the stream."""
        with self._lock:
            return len(self._connections)

    def start(self) -> MjpegServer:
        """Bind an ephemeral port on 127.0.0.1 and serve from a background thread."""
        self._http = _HttpServer(("127.0.0.1", 0), _Handler)
        self._http.owner = self
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="mjpeg-server", daemon=True)
        self._thread.start()
        LOG.info("MJPEG server at %s (%d frames, %.1f fps)", self.url, len(self._jpegs), self.fps)
        return self

    def stall(self) -> None:
        """Stop sending frames but keep every connection open, like a frozen camera."""
        self._flowing.clear()

    def resume(self) -> None:
        """Send frames again on the connections that are still open (and to new ones)."""
        self._flowing.set()

    def stop(self) -> None:
        """Close all connections (clients see EOF), stop listening, join the server thread. Idempotent."""
        self._stopping.set()
        self._flowing.set()  # wake streams parked in a stall so they notice the stop
        with self._lock:
            for conn in self._connections:
                _close_quietly(conn)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._http, self._thread = None, None

    def __enter__(self) -> MjpegServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track(self, conn: socket.socket, add: bool) -> None:
        """Remember open client sockets so stop() can close them (handler threads may be blocked writing)."""
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _stream_to(self, wfile: io.BufferedIOBase) -> None:
        """Write frames paced at `fps`, looping the clip; park while stalled; return when stopping."""
        period = 1.0 / self.fps
        deadline = time.monotonic()
        index = 0
        while not self._stopping.is_set():
            if not self._flowing.is_set():
                self._flowing.wait(timeout=0.2)
                deadline = time.monotonic()  # do not burst the frames "missed" during the stall
                continue
            jpeg = self._jpegs[index % len(self._jpegs)]
            wfile.write(f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n"
                        .encode("ascii") + jpeg + b"\r\n")
            wfile.flush()
            self.frames_sent += 1
            index += 1
            deadline += period
            time.sleep(max(0.0, deadline - time.monotonic()))


def _close_quietly(conn: socket.socket) -> None:
    """Shut a client socket down so a blocked write in its handler thread fails at once."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
