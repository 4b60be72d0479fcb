"""The configuration file: pydantic models of every section, and `load_config` with located error messages.

The models are the reference for what the YAML accepts (SPEC.md points here): unknown keys are errors, every field
says what it does, and ranges are checked here so the rest of the pipeline can trust the values it is given.
Loading (YAML marks, `${VAR}` substitution, error formatting) lives in `pipeline.config.loader`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, Union
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.config.loader import (
    MISSING,
    ConfigError,
    ConfigIssue,
    ConfigValueError,
    issues_from_validation,
    load_yaml,
    read_config_text,
    sort_issues,
)
from pipeline.core.redact import mask_secrets
from pipeline.core.types import EMOTIONS

__all__ = [
    "MISSING", "AppConfig", "BehaviorConfig", "CameraConfig", "ConfigError", "ConfigIssue", "DetectorConfig",
    "EmotionConfig", "ExpressionConfig", "InferenceConfig", "LoggingConfig", "OscOutput", "OutputConfig",
    "ReconnectConfig", "RuleConfig", "ServerConfig", "StdoutOutput", "ToneConfig", "TrackingConfig",
    "WebhookOutput", "WebsocketOutput", "default_rules", "load_config", "parse_config", "summarize",
]

SourceKind = Literal["index", "demo", "device", "rtsp", "http", "file"]
EventName = Literal["observation", "command", "camera"]
ALL_EVENTS: tuple[EventName, ...] = ("observation", "command", "camera")

_CAMERA_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
_PRESET_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_URL_SCHEMES = {"rtsp": "rtsp", "rtsps": "rtsp", "http": "http", "https": "http"}
_NUM = r"\d+(?:\.\d+)?"
_PERCENT = rf"[+-]?{_NUM}%"
_PROSODY: dict[str, tuple[re.Pattern[str], str]] = {
    "pitch": (re.compile(rf"^(?:{_PERCENT}|[+-]{_NUM}(?:st|Hz)|x-low|low|medium|high|x-high|default)$"),
              "a percentage (+5%, -10%, 90%), a signed step or frequency (+2st, -50Hz), "
              "or one of x-low, low, medium, high, x-high, default"),
    "rate": (re.compile(rf"^(?:{_PERCENT}|{_NUM}|x-slow|slow|medium|fast|x-fast|default)$"),
             "a percentage (+5%, -10%, 90%), a plain factor (1.2), "
             "or one of x-slow, slow, medium, fast, x-fast, default"),
    "volume": (re.compile(rf"^(?:{_PERCENT}|[+-]{_NUM}dB|silent|x-soft|soft|medium|loud|x-loud|default)$"),
               "a percentage (+5%, -10%, 90%), a signed decibel change (+6dB, -3dB), "
               "or one of silent, x-soft, soft, medium, loud, x-loud, default"),
}


class StrictModel(BaseModel):
    """Base of every section: unknown keys are errors (typos must not pass silently), values immutable and finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --- cameras ------------------------------------------------------------------------------------------------------


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
        scheme = value.split("://", 1)[0].lower()
        if scheme not in _URL_SCHEMES:
            raise ValueError(f"unsupported URL scheme {scheme!r}: use rtsp://, rtsps://, http:// or https://")
        try:
            host = urlsplit(value).hostname
        except ValueError:
            host = None
        if not host:
            raise ValueError("URL has no host (expected e.g. rtsp://user:pass@10.0.0.5/stream1)")
    return value


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
    enabled: bool = Field(True, description="false keeps the camera in the file but does not open it.")

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


# --- models and inference -----------------------------------------------------------------------------------------


class DetectorConfig(StrictModel):
    """The face detector (RetinaFace)."""

    model: str = Field("retinaface_mnet025", min_length=1, description="Detector model name in models/.")
    input_size: tuple[int, int] = Field((640, 480), description="Network input [width, height]; each a multiple "
                                                                "of 32 between 64 and 4096. Larger finds smaller "
                                                                "faces, slower.")
    score_threshold: float = Field(0.8, ge=0, le=1, description="Minimum face score to keep a detection.")
    nms_threshold: float = Field(0.4, ge=0, le=1, description="IoU above which overlapping detections are merged.")
    min_face_px: int = Field(32, ge=0, description="Faces narrower than this many pixels (original frame) are "
                                                   "ignored: too small to read an emotion.")
    max_faces: int = Field(16, ge=1, le=256, description="At most this many faces (highest scores) per frame.")

    @field_validator("input_size", mode="before")
    @classmethod
    def _check_shape(cls, value: object) -> object:
        """Say `[width, height]` instead of pydantic's tuple wording."""
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ValueError("must be [width, height], two integers, e.g. [640, 480]")
        return value

    @field_validator("input_size")
    @classmethod
    def _check_strides(cls, value: tuple[int, int]) -> tuple[int, int]:
        """RetinaFace's feature strides go up to 32, so each side must divide by 32."""
        for index, side in enumerate(value):
            if side % 32 or not 64 <= side <= 4096:
                raise ConfigValueError("width and height must each be a multiple of 32 between 64 and 4096",
                                       key=(index,), value=side)
        return value


class EmotionConfig(StrictModel):
    """The emotion classifier run on each face."""

    model: str = Field("mini_xception_fer2013", min_length=1, description="Emotion model name in models/.")
    crop: Literal["align", "box"] = Field("box", description="How the face is cut for the classifier: box = the "
                                                             "detection box plus box_margin (measured best on "
                                                             "faces/wild, see BENCHMARKS.md), align = 5-point "
                                                             "similarity alignment onto FER2013's framing.")
    box_margin: float = Field(0.0, ge=0, le=1, description="crop=box only: margin added on each side, as a "
                                                            "fraction of the box size.")


class InferenceConfig(StrictModel):
    """Where and how the models run, and how requests from all cameras are batched."""

    backend: Literal["onnxruntime", "tensorrt"] = Field("onnxruntime", description="Inference library: "
                                                        "onnxruntime, or tensorrt engines built by build-engine.")
    device: Literal["cpu", "cuda", "tensorrt"] = Field("cpu", description="onnxruntime execution provider: cpu, "
                                                       "cuda, or tensorrt (ORT's TensorRT provider).")
    precision: Literal["fp32", "fp16", "int8"] = Field("fp32", description="Numeric precision of the models.")
    max_batch: int = Field(32, ge=1, le=1024, description="Most faces or frames sent to a model in one batch.")
    max_delay_ms: float = Field(4.0, ge=0, le=1000, description="Longest wait for a batch to fill before it is "
                                                                "run anyway, in milliseconds.")
    lanes: int = Field(1, ge=1, le=16, description="Parallel inference workers (streams) per model.")
    batch_step: int = Field(4, ge=2, le=64, description="device cuda: a batch is padded up to the next power of "
                                                        "this (capped at max_batch), and each padded size has "
                                                        "its own session per lane (ONNX Runtime re-plans for "
                                                        "1-3 s on every new shape). Smaller wastes less compute "
                                                        "on padding and takes more GPU memory.")
    threads: int = Field(0, ge=0, le=256, description="CPU threads per session; 0 = the library default.")
    queue_size: int = Field(256, ge=1, le=100_000, description="Requests waiting for inference before the oldest "
                                                               "frames are dropped.")

    @model_validator(mode="after")
    def _backend_needs_gpu(self) -> InferenceConfig:
        """TensorRT engines cannot run on the CPU; catch it here rather than at engine load."""
        if self.backend == "tensorrt" and self.device == "cpu":
            raise ConfigValueError("backend tensorrt runs on the GPU: set inference.device to cuda",
                                   key="device", value=self.device)
        return self


class TrackingConfig(StrictModel):
    """Face tracking across frames, and smoothing of each track's emotion."""

    iou_threshold: float = Field(0.3, ge=0, le=1, description="Minimum box overlap (IoU) to continue a track.")
    max_age_s: float = Field(1.0, gt=0, description="A track not seen for this many seconds is dropped.")
    smoothing_half_life_ms: float = Field(300.0, ge=0, description="Half-life of the exponential smoothing of "
                                                                   "emotion probabilities; 0 = no smoothing.")


# --- behaviour ----------------------------------------------------------------------------------------------------


class ExpressionConfig(StrictModel):
    """An avatar facial expression."""

    preset: str = Field(description="VRM 1.0 preset (happy, angry, sad, relaxed, surprised, neutral) or a custom "
                                    "expression name defined on the avatar.")
    weight: float = Field(1.0, ge=0, le=1, description="Expression strength, 0..1.")
    blend_ms: int = Field(300, ge=0, le=10_000, description="Time to blend into the expression, milliseconds.")

    @field_validator("preset")
    @classmethod
    def _check_preset(cls, value: str) -> str:
        """Preset names go into OSC addresses and JSON; keep them to a safe alphabet."""
        if not _PRESET_NAME.match(value):
            raise ValueError("must be a non-empty name of letters, digits, '_', '.' or '-'")
        return value


class ToneConfig(StrictModel):
    """How the avatar's voice should sound, in SSML prosody terms."""

    style: str = Field(min_length=1, description="Speaking style, e.g. cheerful, calm, empathetic (TTS style).")
    style_degree: float = Field(1.0, ge=0.01, le=2, description="Intensity of the style, 0.01..2.")
    pitch: str = Field("+0%", description="SSML prosody pitch: +5%, -10%, +2st, -50Hz, or x-low..x-high, default.")
    rate: str = Field("+0%", description="SSML prosody rate: +5%, -10%, a factor like 1.2, or x-slow..x-fast, "
                                         "default.")
    volume: str = Field("+0%", description="SSML prosody volume: +5%, -10%, +6dB, -3dB, or silent, x-soft..x-loud, "
                                           "default.")

    @field_validator("pitch", "rate", "volume", mode="before")
    @classmethod
    def _check_prosody(cls, value: object, info: ValidationInfo) -> object:
        """Validate against SSML prosody forms so the TTS engine never rejects a command at run time."""
        name = str(info.field_name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = f"{value:g}"  # `rate: 1.2` arrives from YAML as a float
        pattern, forms = _PROSODY[name]
        if not isinstance(value, str) or not pattern.match(value):
            raise ValueError(f"{name} must be {forms}")
        return value


class RuleConfig(StrictModel):
    """What the avatar does in answer to one detected emotion."""

    expression: ExpressionConfig = Field(description="Facial expression the avatar shows.")
    tone: ToneConfig = Field(description="Voice tone the avatar uses.")


def _rule(preset: str, weight: float, style: str, pitch: str = "+0%", rate: str = "+0%",
          volume: str = "+0%") -> RuleConfig:
    return RuleConfig(expression=ExpressionConfig(preset=preset, weight=weight, blend_ms=300),
                      tone=ToneConfig(style=style, pitch=pitch, rate=rate, volume=volume))


def default_rules() -> dict[str, RuleConfig]:
    """The built-in answer to each emotion: mirror positive ones, calm and reassure on negative ones.

    The avatar answers the person rather than copying them: happiness and surprise are mirrored (VRM `happy`,
    `surprised`), sadness is met with a soft `sad` face and an empathetic, slower, quieter voice, and the
    negative-arousal emotions are calmed. VRM 1.0 has no fear or disgust preset (its presets are happy, angry, sad,
    relaxed, surprised, neutral), and mirroring anger or disgust at a visitor would be rude anyway: anger and fear
    get `relaxed` with a calm or reassuring, lower and slower voice, disgust a neutral face with a calm voice.
    A rule may name a custom expression instead (e.g. `fear`) when the avatar defines one.
    """
    return {
        "angry": _rule("relaxed", 0.6, "calm", "-5%", "-10%"),
        "disgust": _rule("neutral", 0.5, "calm"),
        "fear": _rule("relaxed", 0.5, "reassuring", "-5%", "-10%", "-5%"),  # VRM has no fear preset
        "happy": _rule("happy", 0.9, "cheerful", "+5%", "+5%"),
        "sad": _rule("sad", 0.7, "empathetic", "-5%", "-10%", "-10%"),
        "surprise": _rule("surprised", 0.8, "excited", "+10%", "+5%"),
        "neutral": _rule("neutral", 1.0, "friendly"),
    }


def _check_emotion(name: str) -> str:
    if name not in EMOTIONS:
        raise ValueError(f"unknown emotion {name!r} (allowed: {', '.join(EMOTIONS)})")
    return name


class BehaviorConfig(StrictModel):
    """How detected emotions become avatar commands (see `pipeline.behavior.mapper` for the exact rules)."""

    attention: Literal["largest", "center", "all", "room"] = Field(
        "largest",
        description="Whose emotion the avatar answers: largest = the largest face, center = the face nearest the "
                    "frame centre (both sticky: a new face must be clearly larger or closer to take over); all = "
                    "every face, one command stream per track; room = the room mood: one command stream per "
                    "camera (target null) from the mean of all faces' smoothed probabilities, each face weighted "
                    "by its box area.")
    min_confidence: float = Field(0.45, ge=0, le=1, description="Enter threshold: an emotion counts only while it "
                                                                "is the top smoothed emotion with at least this "
                                                                "confidence (and must stay so for dwell_ms).")
    exit_confidence: float = Field(0.35, ge=0, le=1, description="Exit threshold (hysteresis), at most "
                                   "min_confidence: the emotion the avatar shows is kept while its smoothed "
                                   "probability stays at or above this, so no other emotion replaces it until it "
                                   "falls below. Left out, it is 0.35, or min_confidence when that is lower.")
    dwell_ms: float = Field(400.0, ge=0, description="An emotion must hold this long before the avatar reacts.")
    cooldown_ms: float = Field(1500.0, ge=0, description="Minimum time between two commands for the same target.")
    idle_after_s: float = Field(5.0, ge=0, description="With no face for this long, send the neutral (idle) "
                                                       "command; 0 disables it.")
    rules: dict[Annotated[str, AfterValidator(_check_emotion)], RuleConfig] = Field(
        default_factory=default_rules,
        description="Rule per canonical emotion; an emotion given here replaces that emotion's built-in rule "
                    "as a whole, the others keep theirs.")

    @field_validator("rules")
    @classmethod
    def _merge_defaults(cls, value: dict[str, RuleConfig]) -> dict[str, RuleConfig]:
        """Users override single emotions; the other emotions keep their defaults, so every emotion has a rule."""
        defaults = default_rules()
        return {emotion: value.get(emotion, defaults[emotion]) for emotion in EMOTIONS}

    @model_validator(mode="after")
    def _exit_within_enter(self) -> BehaviorConfig:
        """Hysteresis needs exit <= enter; an unset exit follows a lower min_confidence instead of failing."""
        if self.exit_confidence > self.min_confidence:
            if "exit_confidence" not in self.model_fields_set:
                self.__dict__["exit_confidence"] = self.min_confidence  # frozen model: set the derived default once
            else:
                raise ConfigValueError(f"must not exceed min_confidence ({self.min_confidence:g}): the emotion "
                                       "shown is kept until it falls below exit_confidence, and a new one is taken "
                                       "at min_confidence or above",
                                       key="exit_confidence", value=self.exit_confidence)
        return self

    def rule_for(self, emotion: str) -> RuleConfig:
        """The rule for `emotion`; unknown labels fall back to neutral's rule."""
        return self.rules.get(emotion) or self.rules["neutral"]


# --- outputs ------------------------------------------------------------------------------------------------------


class StdoutOutput(StrictModel):
    """Events as JSON lines on standard output."""

    type: Literal["stdout"] = Field("stdout", description="Output kind.")
    events: list[EventName] = Field(default_factory=lambda: list(ALL_EVENTS), min_length=1,
                                    description="Event types written: observation, command, camera.")


class WebsocketOutput(StrictModel):
    """Events streamed by the status server at /ws."""

    type: Literal["websocket"] = Field("websocket", description="Output kind.")
    events: list[EventName] = Field(default_factory=lambda: list(ALL_EVENTS), min_length=1,
                                    description="Event types sent: observation, command, camera.")
    queue_size: int = Field(256, ge=1, le=100_000, description="Events buffered per /ws client; a client that "
                                                               "falls this far behind is disconnected (and counted) "
                                                               "rather than waited for.")


class OscOutput(StrictModel):
    """Events sent over OSC/UDP, e.g. to a VMC-protocol avatar app (address scheme in `pipeline.outputs.osc`)."""

    type: Literal["osc"] = Field("osc", description="Output kind.")
    host: str = Field("127.0.0.1", min_length=1, description="Receiver host name or IP address.")
    port: int = Field(39539, ge=1, le=65535, description="Receiver UDP port (39539 is the VMC default).")
    protocol: Literal["vmc", "plain"] = Field("vmc", description="vmc: each command is one bundle of "
                                              "/VMC/Ext/Blend/Val (name, value) for every preset followed by "
                                              "/VMC/Ext/Blend/Apply; plain: /emotion/<camera>/command, .../tone, "
                                              ".../faces, .../top and .../state messages.")
    presets: list[str] = Field(default_factory=list, description="vmc: custom expression names to reset to 0 in "
                               "every bundle, besides the VRM 1.0 presets and the custom names the rules use.")
    events: list[EventName] | None = Field(None, description="Event types sent; left out = what the protocol "
                                           "carries: vmc commands only; plain commands, observations and camera "
                                           "states.")
    queue_size: int = Field(256, ge=1, le=100_000, description="Events buffered before new ones are dropped "
                                                               "(and counted).")

    @field_validator("presets")
    @classmethod
    def _check_presets(cls, value: list[str]) -> list[str]:
        """The names become OSC string arguments; keep them to the alphabet of rule presets."""
        for index, name in enumerate(value):
            if not _PRESET_NAME.match(name):
                raise ConfigValueError("must be a non-empty name of letters, digits, '_', '.' or '-'",
                                       key=(index,), value=name)
        return value

    @field_validator("events")
    @classmethod
    def _vmc_sends_commands(cls, value: list[EventName] | None, info: ValidationInfo) -> list[EventName] | None:
        """VMC has no message for an observation or a camera state; asking for them is a misunderstanding.

        A field validator rather than a model one, so the error is located at `events` inside the outputs union.
        """
        if value is not None and not value:
            raise ValueError("list at least one event type: observation, command, camera")
        if value is not None and info.data.get("protocol") == "vmc" and set(value) != {"command"}:
            raise ValueError("protocol vmc sends commands only: use events: [command] (or leave it out), or "
                             "protocol: plain for observations and camera states")
        return value

    @model_validator(mode="after")
    def _events_for_protocol(self) -> OscOutput:
        """Left out, `events` becomes what the protocol carries, so every consumer sees a plain list."""
        if self.events is None:
            self.__dict__["events"] = ["command"] if self.protocol == "vmc" else list(ALL_EVENTS)
        return self


class WebhookOutput(StrictModel):
    """Events POSTed as JSON to an HTTP endpoint."""

    type: Literal["webhook"] = Field("webhook", description="Output kind.")
    url: str = Field(description="Endpoint receiving a POST per event; http:// or https://.")
    timeout_s: float = Field(2.0, gt=0, le=60, description="Timeout of one request, in seconds.")
    retries: int = Field(2, ge=0, le=10, description="Retries of a request that failed to connect, timed out "
                                                     "or got a 5xx answer, before the event is dropped (and "
                                                     "counted as failed); a 4xx answer is never retried.")
    backoff_s: float = Field(0.5, gt=0, le=60, description="Wait before the first retry, in seconds; doubles "
                                                           "before each further retry.")
    bearer_token: str | None = Field(None, description="Sent as `Authorization: Bearer TOKEN` when set; never "
                                                       "logged. Use ${VAR} to keep it out of the file.")
    events: list[EventName] = Field(default_factory=lambda: ["command"], min_length=1,
                                    description="Event types posted (default: commands only).")
    queue_size: int = Field(256, ge=1, le=100_000, description="Events buffered before new ones are dropped "
                                                               "(and counted).")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        """Only HTTP(S) can be posted to; a bare host is a common slip."""
        if not value.lower().startswith(("http://", "https://")) or not urlsplit(value).hostname:
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:9000/emotion")
        return value

    @field_validator("bearer_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: object) -> object:
        """`${HOOK_TOKEN:-}` with the variable unset means no token."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("bearer_token")
    @classmethod
    def _one_kind_of_auth(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A request carries one Authorization header: basic (user:password@ in the URL) or bearer, not both."""
        url = info.data.get("url")
        if value is not None and isinstance(url, str) and urlsplit(url).password is not None:
            raise ValueError("the url already has credentials (user:password@, sent as basic auth): use either "
                             "them or bearer_token, not both")
        return value


OutputConfig = Annotated[Union[StdoutOutput, WebsocketOutput, OscOutput, WebhookOutput], Field(discriminator="type")]


# --- server, logging, whole file ----------------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServerConfig(StrictModel):
    """The HTTP status server: /healthz, /metrics, /api/status, /ws and the status page."""

    enabled: bool = Field(True, description="false: no HTTP server (and no websocket output).")
    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on; anything but loopback "
                                                             "requires a token.")
    port: int = Field(8080, ge=1, le=65535, description="TCP port to listen on.")
    token: str | None = Field(None, description="When set, every path but /healthz requires `Authorization: "
                                                "Bearer TOKEN` (WebSocket also ?token=).")
    preview_fps: float = Field(2.0, ge=0, le=30, description="Frame rate of the annotated previews on the status "
                                                             "page; 0 disables them.")

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: object) -> object:
        """`${EMOTION_TOKEN:-}` with the variable unset means no token, which the host check then catches."""
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _exposed_needs_token(self) -> ServerConfig:
        """The server shows camera images: on a network it must not be open to everyone."""
        if self.enabled and self.token is None and not _is_loopback(self.host):
            raise ConfigValueError(f"server.host {self.host} is not loopback: set server.token "
                                   "(anyone on the network could read the cameras)", key="host")
        return self


class LoggingConfig(StrictModel):
    """Log verbosity and format (logs go to stderr; stdout carries events)."""

    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Least severe level logged.")
    format: Literal["text", "json"] = Field("text", description="text for people, json for log collectors.")

    @field_validator("level", mode="before")
    @classmethod
    def _lowercase(cls, value: object) -> object:
        """Accept INFO as well as info, as Python's logging does."""
        return value.lower() if isinstance(value, str) else value


class AppConfig(StrictModel):
    """The whole configuration file."""

    cameras: list[CameraConfig] = Field(description="Video sources, at least one; names must be unique.")
    detector: DetectorConfig = Field(default_factory=DetectorConfig, description="Face detector.")
    emotion: EmotionConfig = Field(default_factory=EmotionConfig, description="Emotion classifier.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference backend, device, "
                                                                                    "precision and batching.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="Face tracking and smoothing.")
    behavior: BehaviorConfig = Field(default_factory=BehaviorConfig, description="Emotion → avatar command rules.")
    outputs: list[OutputConfig] = Field(default_factory=lambda: [StdoutOutput()],
                                        description="Where events go: stdout, websocket, osc, webhook.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="HTTP status server.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Logging.")

    @field_validator("cameras")
    @classmethod
    def _unique_cameras(cls, value: list[CameraConfig]) -> list[CameraConfig]:
        """Names key events, metrics and URLs, so a duplicate would merge two cameras' data."""
        if not value:
            raise ValueError("list at least one camera (each with a name and a source)")
        first: dict[str, int] = {}
        for index, camera in enumerate(value):
            if camera.name in first:
                raise ConfigValueError(f"duplicate camera name (already used by cameras[{first[camera.name]}])",
                                       key=(index, "name"), value=camera.name)
            first[camera.name] = index
        rtsp = [(i, c.rtsp_transport) for i, c in enumerate(value) if c.source_kind == "rtsp"]
        for index, transport in rtsp[1:]:
            if transport != rtsp[0][1]:
                raise ConfigValueError(f"every RTSP camera must use the same rtsp_transport (cameras[{rtsp[0][0]}] "
                                       f"uses {rtsp[0][1]}): OpenCV hands FFmpeg options to the whole process",
                                       key=(index, "rtsp_transport"), value=transport)
        return value

    @model_validator(mode="after")
    def _websocket_served(self) -> AppConfig:
        """The websocket output is the status server's single /ws stream."""
        sockets = [i for i, output in enumerate(self.outputs) if isinstance(output, WebsocketOutput)]
        if len(sockets) > 1:
            raise ConfigValueError("only one websocket output is allowed (the status server has a single /ws)",
                                   key=("outputs", sockets[1], "type"), value="websocket")
        if sockets and not self.server.enabled:
            raise ConfigValueError("the websocket output is served by the status server: set server.enabled: "
                                   "true", key=("outputs", sockets[0], "type"), value="websocket")
        return self


# --- loading ------------------------------------------------------------------------------------------------------


def parse_config(text: str, filename: str = "<config>", env: Mapping[str, str] | None = None) -> AppConfig:
    """Validate YAML text; every problem found is raised at once as a ConfigError (nothing is half-loaded)."""
    loaded = load_yaml(text, filename, os.environ if env is None else env)
    issues: list[ConfigIssue] = list(loaded.issues)
    config: AppConfig | None = None
    try:
        config = AppConfig.model_validate(loaded.data)
    except ValidationError as exc:
        issues.extend(issues_from_validation(exc, loaded, filename, AppConfig))
    if issues or config is None:
        raise ConfigError(sort_issues(issues))
    return config


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> AppConfig:
    """Read and validate a config file; a missing or unreadable file is a ConfigError like any other problem."""
    return parse_config(read_config_text(Path(path)), str(path), env)


def _describe_output(output: OutputConfig) -> str:
    if isinstance(output, OscOutput):
        return f"osc {output.host}:{output.port} ({output.protocol})"
    if isinstance(output, WebhookOutput):
        return f"webhook {mask_secrets(output.url)} [{', '.join(output.events)}]"
    return f"{output.type} [{', '.join(output.events)}]"


def summarize(config: AppConfig) -> str:
    """A few lines for `check-config`, so an operator sees what the daemon would do; credentials masked."""
    lines = [f"cameras: {len(config.cameras)} ({sum(c.enabled for c in config.cameras)} enabled)"]
    for camera in config.cameras:
        source = camera.source if isinstance(camera.source, int) else mask_secrets(camera.source)
        state = "" if camera.enabled else ", disabled"
        lines.append(f"  {camera.name}: {source} ({camera.source_kind}), {camera.fps:g} fps{state}")
    width, height = config.detector.input_size
    lines.append(f"models: detector {config.detector.model} {width}x{height}, "
                 f"emotion {config.emotion.model} (crop {config.emotion.crop})")
    inference = config.inference
    lines.append(f"inference: {inference.backend} on {inference.device}, {inference.precision}, "
                 f"max_batch {inference.max_batch}, lanes {inference.lanes}")
    lines.append("outputs: " + ("; ".join(_describe_output(o) for o in config.outputs) or "none"))
    server = config.server
    if server.enabled:
        host = f"[{server.host}]" if ":" in server.host else server.host
        auth = "token required" if server.token else "no token"
        lines.append(f"server: http://{host}:{server.port}/ ({auth})")
    else:
        lines.append("server: disabled")
    return "\n".join(lines)
