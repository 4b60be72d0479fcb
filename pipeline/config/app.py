"""The configuration file: the whole YAML as one model, composed of the sections each wing declares, and
`load_config` with located error messages.

The models are the reference for what the YAML accepts (SPEC.md points here): unknown keys are errors, every field
says what it does, and ranges are checked so the rest of the pipeline can trust the values it is given. Each wing
owns its section (cameras: `pipeline.capture.settings`; detector, emotion, inference: `pipeline.inference.settings`;
behavior: `pipeline.behavior.settings`; each output type: its own module in `pipeline.outputs`, found by the outputs'
registry); this module adds the daemon's own sections (tracking, server, logging) and the checks that span sections.
Loading (YAML marks, `${VAR}` substitution, error formatting) lives in `pipeline.config.loader`.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import Field, ValidationError, field_validator, model_validator

from pipeline.behavior.avatars import AvatarSettings, merge_behavior
from pipeline.behavior.settings import (
    BehaviorConfig,
    ExpressionConfig,
    RuleConfig,
    ToneConfig,
    default_rules,
)
from pipeline.capture.settings import CameraConfig, ReconnectConfig
from pipeline.config.loader import (
    MISSING,
    ConfigError,
    ConfigIssue,
    issues_from_validation,
    load_yaml,
    read_config_text,
    sort_issues,
)
from pipeline.core.redact import mask_secrets
from pipeline.core.settings import ConfigValueError, StrictModel
from pipeline.inference.settings import DetectorConfig, EmotionConfig, InferenceConfig
from pipeline.outputs.base import OutputSettings
from pipeline.outputs.osc import OscOutput
from pipeline.outputs.registry import output_settings_models
from pipeline.outputs.stdout import StdoutOutput
from pipeline.outputs.webhook import WebhookOutput
from pipeline.outputs.websocket import WebsocketOutput

__all__ = [
    "MISSING", "AppConfig", "AvatarSection", "BehaviorConfig", "CameraConfig", "ConfigError", "ConfigIssue", "DetectorConfig",
    "EmotionConfig", "ExpressionConfig", "InferenceConfig", "LoggingConfig", "OscOutput", "OutputConfig",
    "ReconnectConfig", "RuleConfig", "ServerConfig", "StdoutOutput", "ToneConfig", "TrackingConfig",
    "WebhookOutput", "WebsocketOutput", "default_rules", "load_config", "parse_config", "summarize",
]

# Every output type the outputs' registry knows, told apart by `type` (a new output module joins by itself). Type
# checkers cannot follow a union built at import time: they see the base class every entry derives from.
if TYPE_CHECKING:
    OutputConfig = OutputSettings
else:
    OutputConfig = Annotated[Union[output_settings_models()], Field(discriminator="type")]


class TrackingConfig(StrictModel):
    """Face tracking across frames, and smoothing of each track's emotion."""

    iou_threshold: float = Field(0.3, ge=0, le=1, description="Minimum box overlap (IoU) to continue a track.")
    max_age_s: float = Field(1.0, gt=0, description="A track not seen for this many seconds is dropped.")
    smoothing_half_life_ms: float = Field(300.0, ge=0, description="Half-life of the exponential smoothing of "
                                                                   "emotion probabilities; 0 = no smoothing.")
    pose_every: int = Field(1, ge=1, le=30, description="Fit each tracked face's head pose on every Nth detection "
                            "of it (1: every detection); in between the track keeps its last pose, as it does on "
                            "frames without detection (detector.interval). A fit costs 0.1-0.3 ms of CPU per face "
                            "(SQPnP): at 150 cameras on an H200, 2 took 0.3-0.5 of the camera workers' 1.9-2.6 "
                            "cores; where a visitor looks then shows up to N - 1 detections later "
                            "(BENCHMARKS.md, round 9).")
    follow_by: Literal["auto", "look", "motion"] = Field(
        "auto", description="With detector.interval > 1, how a face is found on the frames between detections: "
        "look (its track's motion, then its own pixels matched near there, a 24 px template), motion (the motion "
        "alone), auto (look on frames on the host, motion on frames that stay on the GPU: NVDEC). On the CUDA frame "
        "graphs path look searches every followed face of a batch on the GPU, in the lanes (one run a batch); "
        "elsewhere a GPU frame's window around each face is copied down and searched on the host. On a panning crowd "
        "(group_1080p.mp4, interval 3, CPU) look kept 90 % of followed boxes within IoU 0.8 of the detection, motion "
        "alone 49.5 % (BENCHMARKS.md, \"Following by look or by motion\"). On NVDEC frames look suits a few cameras a "
        "process: an H100 analysed every frame of 16 in one process (0.3 cores more than motion), 81 % of 64 in "
        "groups of 32 (round 19).")


class AvatarSection(AvatarSettings):
    """One avatar (see pipeline.behavior.avatars): its cameras, attention, behaviour, and its own outputs."""

    outputs: list[OutputConfig] = Field(default_factory=list,
                                        description="Where this avatar's commands go (and its cameras' observation "
                                                    "and camera events): the same entries as the top-level outputs, "
                                                    "websocket excepted (the one /ws is top-level).")

    def describe(self) -> str:
        """One line for `check-config`."""
        outputs = "; ".join(o.describe() for o in self.outputs) or "none of its own"
        return (f"  {self.name}: cameras {', '.join(self.cameras)}, attention {self.attention} (sticky, switch "
                f"after {self.switch_after_ms:g} ms), outputs: {outputs}")


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
    config_editor: bool = Field(True, description="The status page may save the configuration file (PUT "
                                "/api/config: checked like check-config, the previous file kept as FILE.bak, then "
                                "reloaded). false: the page and GET /api/config still show it, read-only.")

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
    outputs: list[OutputConfig] = Field(default_factory=lambda: list[OutputConfig]([StdoutOutput()]),
                                        description="Where events go: stdout, websocket, osc, webhook.")
    avatars: list[AvatarSection] = Field(default_factory=list,
                                         description="Avatars that span cameras, each with its own attention, "
                                                     "behaviour and outputs; cameras in no avatar keep one command "
                                                     "stream per camera (the top-level behavior and outputs).")
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

    @model_validator(mode="before")
    @classmethod
    def _avatars_inherit_behavior(cls, data: object) -> object:
        """An avatar's `behavior:` names only what differs from the top-level one: lay it over the top-level keys
        (as written) before validation. A top-level section that is itself invalid is not inherited, so its errors
        are reported once, at its own lines."""
        if not isinstance(data, dict) or not isinstance(data.get("avatars"), list):
            return data
        top = data.get("behavior", {})
        try:
            BehaviorConfig.model_validate(top)
        except ValidationError:
            top = {}
        avatars = [{**a, "behavior": merge_behavior(top, a.get("behavior", {}))} if isinstance(a, dict) else a
                   for a in data["avatars"]]
        return {**data, "avatars": avatars}

    @model_validator(mode="after")
    def _avatars_cameras(self) -> AppConfig:
        """Avatar names key events and outputs; every camera an avatar names must exist, and belong to it alone:
        one camera's faces answered by two avatars would make both talk to the same person."""
        cameras = {c.name for c in self.cameras}
        names: dict[str, int] = {}
        owner: dict[str, int] = {}
        for index, avatar in enumerate(self.avatars):
            if avatar.name in names:
                raise ConfigValueError(f"duplicate avatar name (already used by avatars[{names[avatar.name]}])",
                                       key=("avatars", index, "name"), value=avatar.name)
            names[avatar.name] = index
            for j, camera in enumerate(avatar.cameras):
                if camera not in cameras:
                    raise ConfigValueError(f"no camera of that name (cameras: {', '.join(sorted(cameras))})",
                                           key=("avatars", index, "cameras", j), value=camera)
                if camera in owner:
                    raise ConfigValueError(f"camera already watched by avatars[{owner[camera]}] "
                                           f"({self.avatars[owner[camera]].name}): a camera belongs to at most one "
                                           "avatar", key=("avatars", index, "cameras", j), value=camera)
                owner[camera] = index
            sockets = [j for j, o in enumerate(avatar.outputs) if isinstance(o, WebsocketOutput)]
            if sockets:
                raise ConfigValueError("an avatar cannot have a websocket output: the status server has a single "
                                       "/ws, a top-level output (its command events carry `avatar`)",
                                       key=("avatars", index, "outputs", sockets[0], "type"), value="websocket")
        return self

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

    @model_validator(mode="after")
    def _detector_flip_on_the_opencv_path(self) -> AppConfig:
        """detector.flip averages two detector runs on the host; the frame graphs path detects inside its graph."""
        if self.detector.flip and self.inference.graph_frames:
            raise ConfigValueError("detector.flip runs on the OpenCV frame path only: set inference.frame_path: "
                                   "opencv (frame_path auto is the graph path with backend onnxruntime on cuda)",
                                   key=("detector", "flip"), value=True)
        return self

    @model_validator(mode="after")
    def _tensorrt_needs_fixed_input(self) -> AppConfig:
        """A TensorRT engine is built for one input size (build-engine, engine_key), while `auto` gives each camera
        shape its own; say so here rather than at engine load. Points at detector.input_size when the file sets it,
        else at inference.backend (auto being the default)."""
        if self.inference.backend != "tensorrt" or self.detector.fixed_input_size is not None:
            return self
        message = ("TensorRT engines are built for one size: set detector.input_size to [640, 352] for 16:9 "
                   "cameras ([640, 480] for 4:3) with inference.backend tensorrt")
        if "input_size" in self.detector.model_fields_set:
            raise ConfigValueError(message, key=("detector", "input_size"), value=self.detector.input_size)
        raise ConfigValueError(f"{message} (detector.input_size is auto by default)",
                               key=("inference", "backend"), value=self.inference.backend)


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


def _input_summary(detector: DetectorConfig) -> str:
    """`640x480`, or with auto what it means for the common camera shapes (the cameras' own sizes are known only
    once they deliver)."""
    if detector.fixed_input_size is not None:
        return detector.describe_input()
    examples = ", ".join(f"{w}x{h} for {name}" for name, (w, h) in
                         (("16:9", detector.input_for((1920, 1080))), ("4:3", detector.input_for((1600, 1200)))))
    return f"input auto per camera shape (long side {detector.max_input_side}: {examples}; smaller frames not enlarged)"


def summarize(config: AppConfig) -> str:
    """A few lines for `check-config`, so an operator sees what the daemon would do; credentials masked."""
    lines = [f"cameras: {len(config.cameras)} ({sum(c.enabled for c in config.cameras)} enabled)"]
    for camera in config.cameras:
        source = camera.source if isinstance(camera.source, int) else mask_secrets(camera.source)
        state = "" if camera.enabled else ", disabled"
        lines.append(f"  {camera.name}: {source} ({camera.source_kind}), {camera.fps:g} fps{state}")
    lines.append(f"models: detector {config.detector.model} {_input_summary(config.detector)}, "
                 f"emotion {config.emotion.model} (crop {config.emotion.crop})")
    inference = config.inference
    lines.append(f"inference: {inference.backend} on {inference.device}, {inference.precision}, "
                 f"max_batch {inference.max_batch}, lanes {inference.lanes}, "
                 f"frame path {'graph' if inference.graph_frames else 'opencv'}"
                 + (f", {inference.processes} camera group processes" if inference.processes > 1 else ""))
    if inference.backend == "triton":
        lines.append(f"  {inference.triton.describe()}")  # the token shows as ***
    lines.append("outputs: " + ("; ".join(o.describe() for o in config.outputs) or "none"))
    if config.avatars:
        lines.append(f"avatars: {len(config.avatars)}")
        lines.extend(avatar.describe() for avatar in config.avatars)
    server = config.server
    if server.enabled:
        host = f"[{server.host}]" if ":" in server.host else server.host
        auth = "token required" if server.token else "no token"
        lines.append(f"server: http://{host}:{server.port}/ ({auth})")
    else:
        lines.append("server: disabled")
    return "\n".join(lines)
