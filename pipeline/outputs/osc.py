"""Events over OSC/UDP (python-osc), for avatar apps: the VMC protocol, or a plain per-camera address scheme.

`protocol: vmc` (commands only; anything else is ignored), in one of two modes:

- `mode: stream` (the default): a timer thread of its own sends, `rate_hz` times a second, ONE OSC bundle (timetag
  "immediately") with the avatar's *current* weights. Those move from what the face showed to the last command's
  expression over the command's `blend_ms` (`pipeline.outputs.expression_stream`), scaled by the command's smoothed
  confidence with `intensity: confidence`; an idle command (reason `idle`, the neutral rule) blends back to neutral.
  Every bundle carries the whole face, so a lost datagram costs one frame. A VMC port drives one avatar: when several
  cameras (or `avatar`s) feed one vmc output, the most recent command wins.
- `mode: commands`: each command is one such bundle, sent when the command arrives, at the full weight (no blend).

Each bundle:

    /VMC/Ext/Blend/Val  (name: str, value: float)     one per known name, in a fixed order; unset names at 0.0
    /VMC/Ext/T          (time: float)                 stream only: seconds since the output started (frame order)
    /VMC/Ext/Set/Eye    (1, x: float, y: float, z: float)   stream with look_at: where the eyes look, a point 1 m
                                                      away (x right, y up, z forward), following the attended face
                                                      through a critically damped follower (GazeFollower); with
                                                      names: arkit also as the eyeLook* Val blendshapes
    /VMC/Ext/Bone/Pos   ("Head", px, py, pz, qx, qy, qz, qw)   stream with look_at and head_turn > 0: the head bone
                                                      turned by head_turn of the gaze's yaw and pitch (local
                                                      rotation, Unity's axes; position: head_position_m)
    /VMC/Ext/Blend/Apply ()                           once, last

The names come from the name set (`names:`, `pipeline.outputs.name_sets`): vrm1 (the VRM 1.0 presets happy, angry,
sad, relaxed, surprised, neutral), vrm0 (Joy, Angry, Sorrow, Fun, Neutral), arkit (ARKit blendshapes from each
expression's action units) or custom (`custom_names`). Known names are the set's own, then what the configured rules'
presets (passed in as `presets` by whoever wires the outputs) translate to, then `osc.presets` from the config, then
any other name a command has carried since start. So whatever this sink ever set is reset to 0 by the next bundle.

`protocol: plain`: separate OSC messages (no bundles), `<camera>` being the camera name ([a-z0-9_-]):

    /emotion/<camera>/command (emotion: str, confidence: float, preset: str, weight: float)      per command
    /emotion/<camera>/tone    (style: str, style_degree: float, pitch: str, rate: str, volume: str)  after it
    /emotion/<camera>/faces   (count: int)                                                 per observation
    /emotion/<camera>/top     (emotion: str, confidence: float)   after .../faces when count > 0: the largest face's
                                                                  smoothed emotion (raw when it has none)
    /emotion/<camera>/state   (state: str)                        per camera event (streaming, reconnecting, …)
    /emotion/<camera>/presence (event: str, track: int, dwell_s: float)   arrived, left (with dwell), looking, …
    /emotion/<stream>/lookat  (yaw: float, pitch: float, x: float, y: float, z: float)   per look-at target (look_at):
                              degrees to the avatar's right and up, and the face's position in metres
    /emotion/<avatar>/state   (emotion: str, preset: str, weight: float, style: str)    once a second per avatar
                              (the command's `avatar`, else its camera) that had a command: the current expression
                              and tone style. Same address as the camera state: the argument count tells them apart.

Floats are OSC 32-bit floats. UDP has no delivery guarantee and no back-pressure: a send that fails (host
unresolvable, network down) counts as a failed event and is logged, it never blocks the pipeline.

The socket is a *connected* UDP socket (python-osc's client sends unconnected datagrams), because only then does the
kernel pass on the receiver host's "port unreachable" answer: when the avatar app is closed, the datagrams sent to
it are refused, and without this the output would count them as sent forever. The refusal of one datagram arrives
after it left, so it is read (SO_ERROR) before the next send and that event counts as failed: an OSC target that is
gone shows up as a failing output in /healthz. A receiver that is merely silent (another host, a firewall that drops)
cannot be told from a working one over UDP.

The timer thread (stream frames, plain states) shares that socket: a refused frame marks the output failing exactly
as a refused event does (the delivery record, not the event counters), and while frames are refused a command
counts as failed too. A recovered receiver gets the whole current face with the next frame.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pythonosc import osc_bundle_builder
from pythonosc.osc_message_builder import OscMessageBuilder

from pipeline.core.registry import Plugin
from pipeline.core.settings import PRESET_NAME, ConfigValueError
from pipeline.outputs.base import ALL_EVENTS, EventName, OutputSettings, Sink
from pipeline.outputs.events import Event
from pipeline.outputs.expression_stream import ExpressionStream, GazeFollower
from pipeline.outputs.name_sets import (
    EXPRESSION_KEYS,
    VRM1_PRESETS,
    NameSet,
    NameSetName,
)

log = logging.getLogger(__name__)

VRM_PRESETS: tuple[str, ...] = VRM1_PRESETS
"""The VRM 1.0 emotion expression presets, in the order they are sent."""

VMC_VAL = "/VMC/Ext/Blend/Val"
VMC_APPLY = "/VMC/Ext/Blend/Apply"
VMC_TIME = "/VMC/Ext/T"
VMC_EYE = "/VMC/Ext/Set/Eye"
VMC_BONE = "/VMC/Ext/Bone/Pos"
RECONNECT_EVERY_S = 1.0  # at most one attempt a second to open the socket (resolve the host)
REFUSAL_HOLD_S = 1.0  # a refused datagram marks the receiver as down this long (see OscSink._recent_refusal)
STATE_EVERY_S = 1.0  # plain: how often each avatar's current expression is resent
STREAM_ONLY = ("mode", "names", "custom_names", "rate_hz", "intensity")  # keys protocol plain has no use for

Weight = Annotated[float, Field(ge=0, le=1)]


def _message(address: str, *args: Any) -> Any:
    builder = OscMessageBuilder(address=address)
    for arg in args:
        builder.add_arg(arg)
    return builder.build()


def avatar_key(event: Event) -> str:
    """Whose face a command drives: its `avatar` when it names one, else its camera."""
    return str(event.get("avatar") or event["camera"])


class OscOutput(OutputSettings):
    """Events sent over OSC/UDP, e.g. to a VMC-protocol avatar app (address scheme in `pipeline.outputs.osc`)."""

    type: Literal["osc"] = Field("osc", description="Output kind.")
    host: str = Field("127.0.0.1", min_length=1, description="Receiver host name or IP address.")
    port: int = Field(39539, ge=1, le=65535, description="Receiver UDP port (39539 is the VMC default).")
    protocol: Literal["vmc", "plain"] = Field("vmc", description="vmc: bundles of /VMC/Ext/Blend/Val (name, value) "
                                              "for every known name followed by /VMC/Ext/Blend/Apply (see mode); "
                                              "plain: /emotion/<camera>/command, .../tone, .../faces, .../top and "
                                              ".../state messages.")
    mode: Literal["stream", "commands"] | None = Field(None, description="vmc only. stream (the default): rate_hz "
                                                       "bundles a second of the current weights, blending to each "
                                                       "command's expression over its blend_ms; commands: one "
                                                       "bundle per command, as it arrives.")
    custom_names: dict[str, dict[str, Weight]] | None = Field(None, description="names: custom only: expression "
                                                              "(angry, disgust, fear, happy, sad, surprise, neutral, "
                                                              "relaxed) → {avatar name: weight 0..1}, scaled by the "
                                                              "rule's weight.")
    names: NameSetName = Field("vrm1", validate_default=True, description="vmc only: the expression names sent. "
                               "vrm1: VRM 1.0 presets; vrm0: Joy, Angry, Sorrow, Fun, Neutral; arkit: ARKit "
                               "blendshapes from each expression's action units; custom: the custom_names map.")
    rate_hz: float = Field(30.0, ge=1, le=120, description="vmc stream: bundles sent per second.")
    look_at: bool = Field(True, description="The avatar looks at the face its behaviour attends to: vmc stream: "
                          "/VMC/Ext/Set/Eye (enable 1, a point 1 m away in the avatar's direction) in every bundle, "
                          "smoothed (a critically damped follower); plain: /emotion/<stream>/lookat (yaw, pitch in "
                          "degrees, x, y, z in metres) as each target arrives, when `events` is left out or lists "
                          "lookat. Placement: cameras[].placement.")
    head_turn: float = Field(0.0, ge=0.0, le=1.0, description="vmc stream with look_at: the share of the look "
                             "made by turning the head, sent as /VMC/Ext/Bone/Pos Head (local rotation) in every "
                             "bundle; 0 (the default): the eyes only, no bone message. People turn the head for "
                             "about 0.3-0.5 of a glance.")
    head_position_m: tuple[float, float, float] = Field((0.0, 0.06, 0.0), description="vmc stream with head_turn: "
                                                        "the Head bone's local position sent with its rotation "
                                                        "(receivers that apply bone positions need the rig's own; "
                                                        "a VRM humanoid's head sits about 6 cm above its neck).")
    intensity: Literal["fixed", "confidence"] = Field("fixed", description="vmc: fixed = the rule's weight; "
                                                      "confidence = the rule's weight times the command's smoothed "
                                                      "confidence.")
    presets: list[str] = Field(default_factory=list, description="vmc: custom expression names to reset to 0 in "
                               "every bundle, besides the name set's own and the names the rules' presets become.")
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
            if not PRESET_NAME.match(name):
                raise ConfigValueError("must be a non-empty name of letters, digits, '_', '.' or '-'",
                                       key=(index,), value=name)
        return value

    @field_validator("custom_names")
    @classmethod
    def _check_custom_names(cls, value: dict[str, dict[str, float]] | None) -> dict[str, dict[str, float]] | None:
        """Keys are the expressions the rules can show (a typo would silently leave a face at rest); names become
        OSC string arguments."""
        for expression, names in (value or {}).items():
            if expression not in EXPRESSION_KEYS:
                raise ConfigValueError(f"unknown expression (allowed: {', '.join(EXPRESSION_KEYS)})",
                                       key=(expression,), value=expression)
            for name in names:
                if not PRESET_NAME.match(name):
                    raise ConfigValueError("must be a non-empty name of letters, digits, '_', '.' or '-'",
                                           key=(expression, name), value=name)
        return value

    @field_validator(*STREAM_ONLY)
    @classmethod
    def _vmc_only(cls, value: Any, info: ValidationInfo) -> Any:
        """A key that changes nothing is a misunderstanding: say so at its line rather than ignore it. Field
        validators (not a model one) so the error is located at the key inside the outputs union."""
        if info.data.get("protocol") == "plain" and value is not None and value != "vrm1":
            raise ValueError(f"{info.field_name} is for protocol vmc only (plain sends each command's preset and "
                             "weight as they are)")
        return value

    @field_validator("names")
    @classmethod
    def _names_need_their_map(cls, value: str, info: ValidationInfo) -> str:
        """custom_names is the custom set, and nothing else: each without the other is a mistake."""
        if "custom_names" not in info.data:
            return value  # custom_names itself was wrong: that error is reported already
        given = info.data["custom_names"] is not None
        if value == "custom" and not given:
            raise ValueError("names: custom needs a custom_names map: expression → {name: weight}")
        if value != "custom" and given:
            raise ValueError("custom_names is read only with names: custom (set it, or remove custom_names)")
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

    def describe(self) -> str:
        if self.protocol == "plain":
            return f"osc {self.host}:{self.port} (plain)"
        rate = f" {self.rate_hz:g} Hz" if self.mode == "stream" else ""
        return f"osc {self.host}:{self.port} (vmc {self.mode}{rate}, names {self.names})"

    @model_validator(mode="after")
    def _events_for_protocol(self) -> OscOutput:
        """Left out, `events` and `mode` become what the protocol carries, so every consumer sees plain values."""
        if self.events is None:
            self.__dict__["events"] = ["command"] if self.protocol == "vmc" else list(ALL_EVENTS)
        if self.mode is None:
            self.__dict__["mode"] = "stream" if self.protocol == "vmc" else "commands"
        return self

ARKIT_EYES = tuple(f"eyeLook{way}{side}" for side in ("Left", "Right") for way in ("In", "Out", "Up", "Down"))
ARKIT_EYE_RANGE_DEG = (30.0, 25.0)  # the eyes' turn (yaw, pitch) at which an eyeLook* blendshape reaches 1


def arkit_eye_weights(yaw_deg: float, pitch_deg: float) -> dict[str, float]:
    """The avatar's gaze as ARKit eye blendshapes (the rig's own left and right): looking to its right is the
    right eye out and the left eye in; up and down alike for both eyes."""
    side = min(1.0, abs(yaw_deg) / ARKIT_EYE_RANGE_DEG[0])
    vertical = min(1.0, abs(pitch_deg) / ARKIT_EYE_RANGE_DEG[1])
    weights = dict.fromkeys(ARKIT_EYES, 0.0)
    if yaw_deg > 0:
        weights["eyeLookOutRight"] = weights["eyeLookInLeft"] = round(side, 4)
    elif yaw_deg < 0:
        weights["eyeLookOutLeft"] = weights["eyeLookInRight"] = round(side, 4)
    way = "Up" if pitch_deg > 0 else "Down"
    if pitch_deg:
        weights[f"eyeLook{way}Left"] = weights[f"eyeLook{way}Right"] = round(vertical, 4)
    return weights


def gaze_point(yaw_deg: float, pitch_deg: float) -> tuple[float, float, float]:
    """A point 1 m away in the direction (yaw to the avatar's right, pitch up): x right, y up, z forward, as a VRM
    avatar facing +z in Unity sees it."""
    yaw, pitch = math.radians(yaw_deg), math.radians(pitch_deg)
    return (round(math.sin(yaw) * math.cos(pitch), 4), round(math.sin(pitch), 4), round(math.cos(yaw) * math.cos(pitch), 4))


def head_rotation(yaw_deg: float, pitch_deg: float) -> tuple[float, float, float, float]:
    """The head bone's local rotation (x, y, z, w) turning it by `yaw_deg` to the avatar's right and `pitch_deg` up,
    in Unity's left-handed axes (y up, z forward): yaw about +y (turns +z towards +x), then pitch about +x (positive
    turns +z down, so up is negative), the yaw applied last (q_yaw * q_pitch)."""
    half_yaw, half_pitch = math.radians(yaw_deg) / 2.0, math.radians(-pitch_deg) / 2.0
    sy, cy, sx, cx = math.sin(half_yaw), math.cos(half_yaw), math.sin(half_pitch), math.cos(half_pitch)
    return (round(cy * sx, 5), round(sy * cx, 5), round(-sy * sx, 5), round(cy * cx, 5))


class UdpTarget:
    """A connected, non-blocking UDP socket to one receiver; `refusal()` tells whether it refused a datagram."""

    def __init__(self, host: str, port: int) -> None:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self.where = f"{host}:{port}"
        self._sock = socket.socket(family, kind, proto)
        try:
            self._sock.setblocking(False)
            self._sock.connect(address)  # UDP: nothing is sent; it fixes the peer so its ICMP errors reach us
        except OSError:
            self._sock.close()
            raise

    def refusal(self) -> str | None:
        """Why an earlier datagram was refused (read and cleared from the socket), or None."""
        code = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        return None if code == 0 else f"{self.where} refused an earlier datagram: {os.strerror(code)}"

    def send(self, content: Any) -> None:
        """Send one OSC message or bundle (anything with `.dgram`)."""
        self._sock.send(content.dgram)

    def close(self) -> None:
        self._sock.close()


class Ticker:
    """Calls `tick` every `period_s` on a thread of its own, on a fixed schedule (no drift from the time a tick
    takes). A tick that ran late is followed at once by the one now due, so the rate holds; after a stall of more
    than two periods the missed ticks are skipped instead of sent in a burst (each frame is the whole face anyway)."""

    def __init__(self, name: str, period_s: float, tick: Callable[[], None]) -> None:
        self.period_s = period_s
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self._tick()
            due += self.period_s
            behind = time.monotonic() - due
            if behind > self.period_s:
                due += self.period_s * int(behind / self.period_s)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


class OscSink(Sink):
    type_name = "osc"
    counts_messages = True  # datagrams: a command is two plain messages; a VMC stream sends rate_hz bundles a second

    def __init__(self, cfg: Any, queue_size: int | None = None, presets: Iterable[str] = ()) -> None:
        """`presets`: the expression names the behaviour rules use (what they become is reset in every VMC bundle)."""
        super().__init__(cfg, cfg.queue_size if queue_size is None else queue_size)
        self.name_set = NameSet(cfg.names, cfg.custom_names)
        self.presets: tuple[str, ...] = tuple(dict.fromkeys([*self.name_set.names(presets), *cfg.presets]))
        self.stream = ExpressionStream()
        self.gaze = GazeFollower()
        # A VMC stream looks by itself (its events are commands only); plain sends lookat when its events are left
        # to the default or list it (an explicit list is what the operator asked for).
        self.looks = cfg.look_at and (cfg.mode == "stream" if cfg.protocol == "vmc" else
                                      "events" not in cfg.model_fields_set or "lookat" in self.events)
        if self.looks:
            self.events = self.events | {"lookat"}
            if cfg.names == "arkit":  # the eyes as ARKit rigs take them: eyeLook* blendshapes, reset in every bundle
                self.presets = tuple(dict.fromkeys([*self.presets, *ARKIT_EYES]))
        self._started = time.monotonic()
        self._states: dict[str, tuple[str, str, float, str]] = {}  # plain: avatar → its current expression
        self._client: UdpTarget | None = None
        self._client_lock = threading.Lock()  # the sink thread and the ticker share the socket
        self._delivery_lock = threading.Lock()
        self._frame_error: str | None = None
        self._last_refusal: tuple[float, str] | None = None  # (monotonic time, why) of the newest refused datagram
        self._next_connect = 0.0  # monotonic time of the next attempt to open the socket
        self._connect_error: str | None = None
        self._ticker: Ticker | None = None
        if cfg.protocol == "vmc" and cfg.mode == "stream":
            self._ticker = Ticker("sink-osc-stream", 1.0 / cfg.rate_hz, self._send_frame)
        elif cfg.protocol == "plain":
            self._ticker = Ticker("sink-osc-state", STATE_EVERY_S, self._send_states)

    @classmethod
    def from_settings(cls, cfg: Any, **context: Any) -> OscSink:
        """`presets` in the context: the custom expression names the behaviour rules use."""
        return cls(cfg, presets=context.get("presets", ()))

    def open(self) -> None:
        try:
            self._connect()
        except OSError as exc:  # e.g. a host name that does not resolve yet: retried when sending
            log.warning("output osc: cannot reach %s:%d yet (%s); retrying when sending, at most once a second",
                        self.cfg.host, self.cfg.port, exc)
        if self._ticker is not None:
            self._ticker.start()

    def is_alive(self) -> bool:
        """The delivery thread and, when there is one, the timer thread both run."""
        return super().is_alive() and (self._ticker is None or self._ticker.is_alive())

    def _connect(self) -> UdpTarget:
        """The socket, opened on first use; a failed attempt (a name that does not resolve) is retried at most once
        per RECONNECT_EVERY_S, so a 30 Hz stream does not ask the resolver 30 times a second."""
        if self._client is None:
            now = time.monotonic()
            if now < self._next_connect:
                raise OSError(self._connect_error or "not connected")
            self._next_connect = now + RECONNECT_EVERY_S
            try:
                self._client = UdpTarget(self.cfg.host, self.cfg.port)
            except OSError as exc:
                self._connect_error = str(exc)
                raise
        return self._client

    def _send(self, messages: list[Any]) -> None:
        """Send datagrams (each counted: a VMC bundle is one); fail when they cannot leave or the receiver refused
        earlier ones (nothing listens)."""
        try:
            with self._client_lock:
                client = self._connect()
                refused = self._recent_refusal(client.refusal())
                for message in messages:
                    client.send(message)
                    self._count_messages(sent=1)
        except OSError as exc:
            self._count_messages(failed=1)
            raise OSError(f"cannot send to {self.cfg.host}:{self.cfg.port}: {exc.strerror or exc}") from exc
        if refused is not None:
            self._count_messages(failed=1)  # an earlier datagram came back refused: nothing listens there
            raise ConnectionRefusedError(f"{refused} (is the receiver running?)")

    def _recent_refusal(self, refused: str | None) -> str | None:
        """A refusal seen now, or within REFUSAL_HOLD_S: the receiver's "port unreachable" arrives a moment after a
        datagram, so of two sent in quick succession (an observation and its look) the second would pass as
        delivered and a dead receiver would never count as failing."""
        now = time.monotonic()
        if refused is not None:
            self._last_refusal = (now, refused)
            return refused
        last = self._last_refusal
        return last[1] if last is not None and now - last[0] < REFUSAL_HOLD_S else None

    def write(self, event: Event) -> None:
        """Send the event's datagrams (stream mode: retarget the stream); fail when they cannot leave, or when the
        receiver refused earlier ones (nothing listens on its port: the app was closed)."""
        if event["type"] == "lookat":
            self._look(event)
            return
        if self.cfg.protocol == "plain":
            if event["type"] == "command":
                self._remember_state(event)
            messages = self.plain_messages(event)
        elif event["type"] != "command":
            return
        elif self.cfg.mode == "stream":
            self._retarget(event)
            if self._frame_error is not None:
                raise ConnectionRefusedError(f"stream frames not delivered: {self._frame_error}")
            return
        else:
            messages = [self.vmc_bundle(event)]
        if messages:
            self._send(messages)

    def _look(self, event: Event) -> None:
        """vmc stream: retarget the gaze the next bundles carry (failing, as a command does, while the stream's
        frames are not delivered: a look is only as delivered as the frames that carry it); plain: send it as it is."""
        if self.cfg.protocol == "plain":
            x, y, z = (float(v) for v in event["point"])
            self._send([_message(f"/emotion/{event['stream']}/lookat", float(event["yaw"]), float(event["pitch"]),
                                 x, y, z)])
            return
        self.gaze.command(float(event["yaw"]), float(event["pitch"]))
        if self._frame_error is not None:
            raise ConnectionRefusedError(f"stream frames not delivered: {self._frame_error}")

    def command_weights(self, command: Event) -> dict[str, float]:
        """The names and weights a command's expression becomes in this output's name set and intensity."""
        expression = command["expression"]
        weight = float(expression["weight"])
        if self.cfg.intensity == "confidence" and command.get("reason") != "idle":
            weight *= min(1.0, max(0.0, float(command.get("confidence", 1.0))))
        weights = self.name_set.weights(expression["preset"], weight)
        new = [name for name in weights if name not in self.presets]
        if new:
            self.presets = (*self.presets, *new)  # one assignment: the ticker reads a whole tuple
        return weights

    def _retarget(self, command: Event) -> None:
        """Stream mode: blend from the face shown now to the command's expression (most recent command wins)."""
        target = self.command_weights(command)
        self.stream.command(target, float(command["expression"].get("blend_ms", 0)), time.monotonic())

    def bundle(self, weights: Mapping[str, float], stream_time: float | None = None,
               gaze: tuple[float, float] | None = None) -> Any:
        """One bundle: every known name's Val (`weights`' value, else 0.0), the stream's time (VMC's /VMC/Ext/T, so
        a receiver can order frames UDP delivered out of order), then Apply."""
        bundle = osc_bundle_builder.OscBundleBuilder(osc_bundle_builder.IMMEDIATELY)
        for name in self.presets:
            bundle.add_content(_message(VMC_VAL, name, float(weights.get(name, 0.0))))
        if stream_time is not None:
            bundle.add_content(_message(VMC_TIME, float(stream_time)))
        if gaze is not None:
            bundle.add_content(_message(VMC_EYE, 1, *gaze_point(*gaze)))
            if self.cfg.head_turn > 0:
                turn = self.cfg.head_turn
                bundle.add_content(_message(VMC_BONE, "Head", *map(float, self.cfg.head_position_m),
                                            *head_rotation(gaze[0] * turn, gaze[1] * turn)))
        bundle.add_content(_message(VMC_APPLY))
        return bundle.build()

    def vmc_bundle(self, command: Event) -> Any:
        """One command as one bundle: its expression's names at their weights, every other known name at 0."""
        return self.bundle(self.command_weights(command))

    def streamed_weights(self) -> dict[str, float] | None:
        """Stream mode: the weights the next bundle carries (names above 0.001)."""
        if self.cfg.protocol != "vmc" or self.cfg.mode != "stream":
            return None
        weights = self.stream.weights(time.monotonic())
        return {name: round(value, 3) for name, value in weights.items() if value > 0.001}

    def _send_frame(self) -> None:
        """Stream mode, on the ticker: the current weights as one bundle."""
        now = time.monotonic()
        gaze = self.gaze.sample(now) if self.looks else None
        weights = self.stream.weights(now)
        if gaze is not None and self.cfg.names == "arkit":
            weights = {**weights, **arkit_eye_weights(*gaze)}
        self._tick_delivery(lambda: [self.bundle(weights, now - self._started, gaze)])

    def _remember_state(self, command: Event) -> None:
        state = (str(command["emotion"]), str(command["expression"]["preset"]),
                 float(command["expression"]["weight"]), str(command["tone"]["style"]))
        self._states = {**self._states, avatar_key(command): state}  # one assignment: the ticker reads whole dicts

    def _send_states(self) -> None:
        """Plain, on the ticker: each avatar's current expression (after its first command)."""
        states = self._states
        if states:
            self._tick_delivery(lambda: [_message(f"/emotion/{key}/state", *state) for key, state in states.items()])

    def _tick_delivery(self, build: Callable[[], list[Any]]) -> None:
        """Send what the ticker built; its outcome goes to the delivery record (health), not to the event counters."""
        try:
            self._send(build())
        except Exception as exc:  # noqa: BLE001 - a broken frame must not end the stream; it is recorded and logged
            self._frame_error = str(exc) or type(exc).__name__
            self._failed(exc)
        else:
            self._frame_error = None
            self._delivered()

    def _delivered(self) -> None:
        with self._delivery_lock:
            super()._delivered()

    def _failed(self, exc: Exception) -> None:
        with self._delivery_lock:
            super()._failed(exc)

    @staticmethod
    def plain_messages(event: Event) -> list[Any]:
        """The messages of the plain scheme (module docstring) for one event."""
        base = f"/emotion/{event['camera']}"
        if event["type"] == "command":
            expression, tone = event["expression"], event["tone"]
            return [_message(f"{base}/command", event["emotion"], float(event["confidence"]), expression["preset"],
                             float(expression["weight"])),
                    _message(f"{base}/tone", tone["style"], float(tone.get("style_degree", 1.0)), tone["pitch"],
                             tone["rate"], tone["volume"])]
        if event["type"] == "observation":
            faces = event["faces"]
            messages = [_message(f"{base}/faces", len(faces))]
            if faces:
                largest = max(faces, key=lambda f: (f["box"][2] - f["box"][0]) * (f["box"][3] - f["box"][1]))
                top = largest.get("smoothed") or largest
                messages.append(_message(f"{base}/top", top["emotion"], float(top["confidence"])))
            return messages
        if event["type"] == "camera":
            return [_message(f"{base}/state", event["state"])]
        if event["type"] == "presence":
            return [_message(f"{base}/presence", event["event"], int(event["track_id"]),
                             float(event.get("dwell_s") or 0.0))]
        return []

    def flush_close(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None


PLUGIN = Plugin("osc", OscOutput, OscSink)
