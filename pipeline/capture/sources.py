"""Video sources, one class per kind, chosen from the camera's `source` string.

`grab(timeout)` waits for the next frame (False when none arrived within `timeout`: a stall) and `retrieve()` converts
it to BGR; SourceEnded marks the end of a non-looping file and SourceError a broken source. Files and the demo clip are paced at their native
frame rate so they behave like live cameras.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

from pipeline.capture.source_base import (
    SourceEnded,
    SourceError,
    VideoSource,
    pacer_for,
)
from pipeline.core.redact import mask_secrets, url_for_opening

if TYPE_CHECKING:
    from pipeline.capture.settings import CameraConfig

log = logging.getLogger(__name__)

STREAM_SCHEMES = ("rtsp://", "rtsps://", "http://", "https://")
OPEN_TIMEOUT_MS = 10_000
READ_TIMEOUT_MARGIN_S = 2.0


class OpenCvSource(VideoSource):
    """Anything OpenCV's VideoCapture reads: files, USB devices, RTSP and HTTP streams."""

    kind = "opencv"

    def __init__(self, cap: cv2.VideoCapture, label: str) -> None:
        self._cap = cap
        self._label = label

    def grab(self, timeout: float) -> bool:
        if not self._cap.grab():
            raise SourceError(f"{self._label}: read failed")
        return True

    def retrieve(self) -> np.ndarray:
        ok, image = self._cap.retrieve()
        if not ok or image is None:
            raise SourceError(f"{self._label}: could not decode the frame")
        return image

    def describe(self) -> str:
        width = int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        return f"{self._label} {width}x{height}"

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()


class FileSource(OpenCvSource):
    kind = "file"

    def __init__(self, path: Path, loop: bool, decode_threads: int = 1) -> None:
        cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG, decoder_params(decode_threads))
        if not cap.isOpened():
            cap.release()
            raise SourceError(f"cannot open video file {path} (unsupported format or corrupt)")
        super().__init__(cap, f"file {path.name}")
        self._loop = loop
        fps = cap.get(cv2.CAP_PROP_FPS)
        self._pacer = pacer_for(fps)
        self._frames = 0

    def grab(self, timeout: float) -> bool:
        self._pacer.wait()
        if self._cap.grab():
            self._frames += 1
            return True
        if self._frames == 0:
            raise SourceError(f"{self._label}: no frame could be decoded (corrupt or truncated file)")
        if not self._loop:
            raise SourceEnded(self._label)
        self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
        self._frames = 0
        if not self._cap.grab():
            raise SourceError(f"{self._label}: cannot restart the file at its first frame")
        self._frames = 1
        return True


class DemoSource(VideoSource):
    """A looping clip made at run time from face photos shipped inside insightface (no camera needed)."""

    kind = "demo"
    SIZE = (640, 480)
    FPS = 25.0
    PERIOD_S = 12.0

    def __init__(self) -> None:
        self._photo = _demo_photo()
        self._pacer = pacer_for(self.FPS)
        self._t0 = time.monotonic()
        self._grabbed_at = self._t0

    def grab(self, timeout: float) -> bool:
        self._pacer.wait()
        self._grabbed_at = time.monotonic()
        return True

    def retrieve(self) -> np.ndarray:
        phase = ((self._grabbed_at - self._t0) % self.PERIOD_S) / self.PERIOD_S
        return self.frame_at(phase)

    def frame_at(self, phase: float) -> np.ndarray:
        """Pan across the photo and back, with a gentle zoom, so faces move, grow and shrink."""
        height, width = self._photo.shape[:2]
        out_w, out_h = self.SIZE
        zoom = 1.0 + 0.35 * (0.5 - 0.5 * math.cos(2 * math.pi * phase))
        scale = max(out_w / width, out_h / height) * 1.25 * zoom
        travel = 0.5 - 0.5 * math.cos(2 * math.pi * phase)
        x0 = travel * (width * scale - out_w)
        y0 = 0.5 * (height * scale - out_h)
        matrix = np.array([[scale, 0.0, -x0], [0.0, scale, -y0]])
        return cv2.warpAffine(self._photo, matrix, self.SIZE, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)

    def describe(self) -> str:
        return f"demo clip {self.SIZE[0]}x{self.SIZE[1]} @ {self.FPS:g} fps"


def _demo_photo() -> np.ndarray:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("the demo camera needs insightface's sample photos: pip install -r requirements.txt")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / "t1.jpg"
    image = cv2.imread(str(path))
    if image is None:
        raise SourceError(f"cannot read the demo photo {path}")
    return image


def _usb_source(cfg: CameraConfig, device: int | str) -> VideoSource:
    cap = cv2.VideoCapture(device, cv2.CAP_V4L2) if isinstance(device, int) else cv2.VideoCapture(device)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"cannot open USB camera {device} (not connected, busy, or no permission)")
    if cfg.fourcc:
        cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter.fourcc(*cfg.fourcc))
    if cfg.width:
        cap.set(cv2.CAP_PROP_FRAME_WIDTH, cfg.width)
    if cfg.height:
        cap.set(cv2.CAP_PROP_FRAME_HEIGHT, cfg.height)
    return OpenCvSource(cap, f"usb {device}")


def decoder_params(threads: int) -> list[int]:
    """VideoCapture open parameters for `threads` decoder threads (0: FFmpeg's default, one per core).

    The default is 1 because FFmpeg's frame threading holds back one frame per extra thread (16 cores: about half
    a second of a live 30 fps stream), which a kiosk feels as delay. Measured on the 16-core GPU machine with 64
    cameras (BENCHMARKS.md): FFmpeg's default analysed 1.39x more frames, so it is the setting for throughput."""
    if threads <= 0 or not hasattr(cv2, "CAP_PROP_N_THREADS"):
        return []
    return [cv2.CAP_PROP_N_THREADS, threads]


def configure_ffmpeg(rtsp_transport: str) -> None:
    """Set FFmpeg's RTSP transport for every capture of this process.

    OpenCV reads OPENCV_FFMPEG_CAPTURE_OPTIONS from the environment at each open, process-wide; setting it once,
    before any camera starts, avoids changing the environment while other threads open streams (which is why the
    config requires one rtsp_transport for all cameras)."""
    os.environ["OPENCV_FFMPEG_CAPTURE_OPTIONS"] = f"rtsp_transport;{rtsp_transport}"


def _stream_source(cfg: CameraConfig, url: str, stall_s: float, label: str) -> VideoSource:
    """FFmpeg on a stream URL (`url` as FFmpeg must get it); `label` is what errors and events may show."""
    if url.startswith(("rtsp://", "rtsps://")) and "OPENCV_FFMPEG_CAPTURE_OPTIONS" not in os.environ:
        log.warning("configure_ffmpeg() was not called: FFmpeg picks the RTSP transport itself")
    # The read timeout is a backstop past stall_s: the capture thread declares the stall itself, on time.
    read_timeout_ms = int((stall_s + READ_TIMEOUT_MARGIN_S) * 1000)
    params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, OPEN_TIMEOUT_MS, cv2.CAP_PROP_READ_TIMEOUT_MSEC, read_timeout_ms,
              *decoder_params(cfg.decode_threads)]
    cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG, params)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"cannot connect to {label} (host down, wrong path or credentials)")
    return OpenCvSource(cap, label)


def open_source(cfg: CameraConfig, gpu_active: bool = False, device_frames: bool = False) -> VideoSource:
    """Open the camera's source by kind; raises SourceError with a clear, secret-free reason.

    gpu_active: the models run on a GPU (inference.device cuda), which makes `decode: auto` decode on NVDEC.
    device_frames: the analysis takes frames in GPU memory (inference.frame_path graph on cuda), so an NVDEC source
    hands over its decoded frames without copying them to the host."""
    source = cfg.source
    if isinstance(source, int) or (isinstance(source, str) and source.isdigit()):
        return _usb_source(cfg, int(source))
    if source == "demo":
        return DemoSource()
    if source.startswith("/dev/video"):
        if not Path(source).exists():
            raise SourceError(f"{source} does not exist (camera unplugged?)")
        return _usb_source(cfg, source)
    if source.lower().startswith(STREAM_SCHEMES):
        # The URL as written is what may be shown (masked); FFmpeg gets the password percent-encoded, so that
        # `/ @ # :` in it cannot end it early (core.redact has the rule both follow).
        url, label = url_for_opening(source), mask_secrets(source)
        return _gpu_source(cfg, url, label, gpu_active, device_frames) or \
            _stream_source(cfg, url, cfg.reconnect.stall_s, label)
    path = Path(source).expanduser()
    if not path.is_file():
        raise SourceError(f"video file {path} not found")
    return _gpu_source(cfg, str(path), f"file {path.name}", gpu_active, device_frames) or \
        FileSource(path, cfg.loop, cfg.decode_threads)


def _gpu_source(cfg: CameraConfig, location: str, label: str, gpu_active: bool,
                device_frames: bool = False) -> VideoSource | None:
    """An NVDEC source when the camera's `decode` asks for one and it can be had; None means: decode on the CPU.

    `decode: gpu` that cannot be had is a SourceError (retried, and said in the camera's events); `decode: auto`
    falls back to the CPU with one log line per open."""
    if cfg.decode == "cpu" or (cfg.decode == "auto" and not gpu_active):
        return None
    from pipeline.capture.nvdec import NvdecSource, nvdec_problem

    problem = nvdec_problem()
    if problem is None:
        try:
            return NvdecSource(location, label, loop=cfg.loop, paced=not location.startswith(STREAM_SCHEMES),
                               keep_on_device=device_frames)
        except SourceError as exc:
            if cfg.decode == "gpu":
                raise
            problem = str(exc)
    if cfg.decode == "gpu":
        raise SourceError(f"{label}: decode gpu requested, but GPU decoding is unavailable: {problem}")
    log.info("camera %s: decoding on the CPU (decode auto): %s", cfg.name, problem)
    return None
