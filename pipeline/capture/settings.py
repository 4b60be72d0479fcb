"""The `cameras:` section: one model per camera, owned by the capture wing that reads it.

Checked here so capture can trust what it is given: names fit URLs and metric labels, sources are of a kind the
capture code can open (a URL without a known scheme, or one that lost its `rtsp://`, is refused rather than
retried forever as a file path, printing its password on every retry).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.redact import mask_secrets, split_userinfo
from pipeline.core.settings import ConfigValueError, StrictModel

SourceKind = Literal["index", "demo", "device", "rtsp", "http", "file"]

_CAMERA_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
_URL_SCHEMES = {"rtsp": "rtsp", "rtsps": "rtsp", "http": "http", "https": "http"}
_HOST = re.compile(r"\[[^\]]*\]|[^/?#:]*")
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}(?:[/?#]|$)")


class ReconnectConfig(StrictModel):
    """How a camera that fails or stalls is reopened: exponential backoff from initial_s up to max_s."""

    initial_s: float = Field(1.0, gt=0, description="First wait before reopening a failed camera, in seconds; "
                                                     "doubles after each failed attempt.")
    max_s: float = Field(30.0, gt=0, description="Longest wait between two reopen attempts, in seconds.")
    stall_s: float = Field(5.0, gt=0, description="A camera that delivers no frame for this many seconds is "
                                                   "reported stalled (and /healthz fails) and is reopened.")

    @model_validator(mode="after")
    def _initial_within_max(self) -> ReconnectConfig:
        """A backoff that starts above its own ceiling is a typo, not a policy."""
        if self.initial_s > self.max_s:
            raise ConfigValueError(f"initial_s ({self.initial_s:g}) must not exceed max_s ({self.max_s:g})",
                                   key="initial_s", value=self.initial_s)
        return self


def _normalize_source(value: object) -> str | int:
    """Check a camera source; digit strings (e.g. from `${CAM:-0}`) become camera indexes."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("must be a camera index (0, 1, …) or a string: demo, a file path, /dev/videoN, "
                         "or an rtsp://, rtsps://, http:// or https:// URL")
    if isinstance(value, str):
        value = value.strip()
        if not value:
            raise ValueError("must not be empty (use demo for the built-in clip, 0 for the first USB camera)")
        if value.isdigit():
            value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a camera index must be 0 or more")
        return value
    if "://" in value:
        _check_url(value)
    elif _looks_like_url(value):
        raise ConfigValueError("looks like a camera URL without its scheme: write rtsp:// (or http:// for an HTTP "
                               "camera) in front of it; a video file named like this: start it with ./",
                               value=mask_secrets("rtsp://" + value).removeprefix("rtsp://"))
    return value


def _check_url(value: str) -> None:
    """A stream URL the capture code can open, with its password found by the rule of `core.redact`."""
    if any(c.isspace() for c in value):  # masking cannot tell where such a URL ends: echo nothing
        raise ConfigValueError("a URL cannot contain spaces: write a space in a password as %20")
    scheme = value.split("://", 1)[0].lower()
    if scheme not in _URL_SCHEMES:
        raise ValueError(f"unsupported URL scheme {scheme!r}: use rtsp://, rtsps://, http:// or https://")
    parts = split_userinfo(value)
    if parts is None and split_userinfo(value, include_query=True) is not None:
        raise ConfigValueError("the password seems to contain '?', which starts a URL's query: write it as %3F "
                               "(or, if the '@' belongs to the query, write that '@' as %40)",
                               value=mask_secrets(value))
    rest = parts.rest if parts is not None else value.split("://", 1)[1]
    host = _HOST.match(rest)
    if host is None or not host.group():
        raise ValueError("URL has no host (expected e.g. rtsp://user:pass@10.0.0.5/stream1)")


def _looks_like_url(value: str) -> bool:
    """`admin:pw@10.0.0.5/…` or `10.0.0.5:554/…`: a camera URL that lost its `rtsp://`, not a file path."""
    if value.startswith(("/", ".", "~")):
        return False
    parts = split_userinfo("rtsp://" + value, include_query=True)
    return (parts is not None and parts.password is not None) or bool(_HOST_PORT.match(value))


class Placement(StrictModel):
    """Where a camera is and where it looks, relative to the avatar's screen, so the avatar can look at the people the
    camera sees (look-at) and tell whether they look back (head pose)."""

    yaw_deg: float = Field(0.0, ge=-180, le=180, description="Where the camera looks, turned from the screen's "
                           "forward direction about the vertical (positive: towards the avatar's left, i.e. the "
                           "viewer's right). 0: the camera looks out of the screen, as a webcam on top of it does.")
    pitch_deg: float = Field(0.0, ge=-90, le=90, description="The camera's tilt (positive: looking up).")
    hfov_deg: float = Field(70.0, ge=10, le=170, description="The camera's horizontal field of view (a typical "
                            "webcam: 60-78; a wide-angle dome camera: 90-120). Sets the angle of each pixel.")
    offset_m: tuple[float, float, float] = Field((0.0, 0.0, 0.0), description="The camera's position relative to "
                                                 "the avatar's eyes in metres: [right, up, forward] (a camera 30 cm "
                                                 "above the screen's centre: [0, 0.3, 0]). With it, a face's distance "
                                                 "is estimated from its size.")


class CameraConfig(StrictModel):
    """One video source analysed by the pipeline."""

    name: str = Field(description="Unique camera name, 1-64 characters of a-z, 0-9, '_' or '-'; it names the "
                                  "camera in events, metrics and status URLs.")
    source: str | int = Field(description="Where frames come from: an int is a USB camera index (OpenCV); a "
                                          "string is 'demo' (built-in looping clip), /dev/videoN, a video file "
                                          "path, or an rtsp://, rtsps://, http:// or https:// URL.")
    fps: float = Field(15.0, gt=0, le=120, description="Frames analysed per second, at most; extra frames are "
                                                        "read and skipped.")
    loop: bool = Field(False, description="Files only: restart at the end instead of reporting the camera ended.")
    reconnect: ReconnectConfig = Field(default_factory=ReconnectConfig,
                                       description="Backoff and stall detection when the source fails.")
    width: Annotated[int, Field(gt=0)] | None = Field(None, description="USB capture hint: requested frame width "
                                                                         "in pixels (null: the camera's default).")
    height: Annotated[int, Field(gt=0)] | None = Field(None, description="USB capture hint: requested frame "
                                                                          "height in pixels (null: default).")
    fourcc: str | None = Field(None, description="USB capture hint: pixel format as a 4-character code, e.g. "
                                                 "MJPG or YUYV (null: the camera's default).")
    rtsp_transport: Literal["tcp", "udp"] = Field("tcp", description="RTSP transport; tcp survives lossy "
                                                                     "networks, udp has less latency.")
    decode_threads: int = Field(1, ge=0, le=64, description="Video decoder threads for this camera (files, RTSP, "
                                                             "HTTP). 1 adds no delay; each extra thread holds back "
                                                             "one frame (FFmpeg frame threading). 0 = FFmpeg's "
                                                             "choice, one per core: more throughput with many "
                                                             "cameras (BENCHMARKS.md), more delay.")
    nice: int = Field(0, ge=0, le=19, description="Lower CPU priority for this camera's reading and decoding "
                                                  "(a Unix nice increment over the daemon's): when the CPU is full, "
                                                  "inference goes first; a late frame is skipped anyway, a late "
                                                  "batch delays every camera.")
    decode: Literal["auto", "cpu", "gpu"] = Field("auto", description="Where video is decoded (files, RTSP, HTTP "
                                                  "streams): gpu = on the GPU's NVDEC engines through PyNvVideoCodec "
                                                  "(requirements-gpu.txt), demuxing on the CPU; cpu = FFmpeg on the "
                                                  "CPU; auto = gpu when inference.device is cuda and the GPU can "
                                                  "decode the stream's codec, else cpu (with a log line saying "
                                                  "why). USB cameras and the demo clip always use the CPU.")
    enabled: bool = Field(True, description="false keeps the camera in the file but does not open it.")
    placement: Placement = Field(default_factory=Placement, description="Where the camera is relative to the "
                                 "avatar's screen (look-at and head pose); default: on the screen, looking out, "
                                 "a 70° field of view.")

    @field_validator("name", mode="before")
    @classmethod
    def _check_name(cls, value: object) -> object:
        """Names appear in URLs and metric labels, hence the restricted alphabet."""
        if isinstance(value, str) and not _CAMERA_NAME.match(value):
            raise ValueError("must be 1-64 characters of lowercase a-z, 0-9, '_' or '-'")
        return value

    @field_validator("source", mode="before")
    @classmethod
    def _check_source(cls, value: object) -> str | int:
        """Reject sources the camera module could only fail on later, after the daemon started."""
        return _normalize_source(value)

    @field_validator("fourcc")
    @classmethod
    def _check_fourcc(cls, value: str | None) -> str | None:
        """OpenCV's VideoWriter_fourcc takes exactly four characters."""
        if value is not None and len(value) != 4:
            raise ValueError("must be exactly 4 characters, e.g. MJPG or YUYV")
        return value

    @property
    def source_kind(self) -> SourceKind:
        """What kind of source this is, so the camera module need not re-parse the string."""
        if isinstance(self.source, int):
            return "index"
        if self.source == "demo":
            return "demo"
        if self.source.startswith("/dev/"):
            return "device"
        if "://" in self.source:
            return _URL_SCHEMES[self.source.split("://", 1)[0].lower()]  # type: ignore[return-value]
        return "file"
