"""Events over OSC/UDP (python-osc), for avatar apps: the VMC protocol, or a plain per-camera address scheme.

`protocol: vmc` (commands only; anything else is ignored). Each command is ONE OSC bundle (timetag "immediately"):

    /VMC/Ext/Blend/Val  (name: str, value: float)     one per known preset, in a fixed order; the command's
                                                      preset at its weight, every other preset at 0.0
    /VMC/Ext/Blend/Apply ()                           once, last

The known presets are the VRM 1.0 ones (happy, angry, sad, relaxed, surprised, neutral), then the custom names of the
configured rules (passed in as `presets` by whoever wires the outputs), then `osc.presets` from the config, then any
other preset a command has carried since start. So whatever this sink ever set is reset to 0 by the next command.

`protocol: plain`: separate OSC messages (no bundles), `<camera>` being the camera name ([a-z0-9_-]):

    /emotion/<camera>/command (emotion: str, confidence: float, preset: str, weight: float)      per command
    /emotion/<camera>/tone    (style: str, style_degree: float, pitch: str, rate: str, volume: str)  after it
    /emotion/<camera>/faces   (count: int)                                                 per observation
    /emotion/<camera>/top     (emotion: str, confidence: float)   after .../faces when count > 0: the largest face's
                                                                  smoothed emotion (raw when it has none)
    /emotion/<camera>/state   (state: str)                        per camera event (streaming, reconnecting, …)

Floats are OSC 32-bit floats. UDP has no delivery guarantee and no back-pressure: a send that fails (host
unresolvable, network down) counts as a failed event and is logged, it never blocks the pipeline.

The socket is a *connected* UDP socket (python-osc's client sends unconnected datagrams), because only then does the
kernel pass on the receiver host's "port unreachable" answer: when the avatar app is closed, the datagrams sent to
it are refused, and without this the output would count them as sent forever. The refusal of one datagram arrives
after it left, so it is read (SO_ERROR) before the next send and that event counts as failed: an OSC target that is
gone shows up as a failing output in /healthz. A receiver that is merely silent (another host, a firewall that drops)
cannot be told from a working one over UDP.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pythonosc import osc_bundle_builder
from pythonosc.osc_message_builder import OscMessageBuilder

from pipeline.core.registry import Plugin
from pipeline.core.settings import PRESET_NAME, ConfigValueError
from pipeline.outputs.base import ALL_EVENTS, EventName, OutputSettings, Sink
from pipeline.outputs.events import Event

log = logging.getLogger(__name__)

VRM_PRESETS: tuple[str, ...] = ("happy", "angry", "sad", "relaxed", "surprised", "neutral")
"""The VRM 1.0 emotion expression presets, in the order they are sent."""

VMC_VAL = "/VMC/Ext/Blend/Val"
VMC_APPLY = "/VMC/Ext/Blend/Apply"


def _message(address: str, *args: Any) -> Any:
    builder = OscMessageBuilder(address=address)
    for arg in args:
        builder.add_arg(arg)
    return builder.build()


class OscOutput(OutputSettings):
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
            if not PRESET_NAME.match(name):
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

    def describe(self) -> str:
        return f"osc {self.host}:{self.port} ({self.protocol})"

    @model_validator(mode="after")
    def _events_for_protocol(self) -> OscOutput:
        """Left out, `events` becomes what the protocol carries, so every consumer sees a plain list."""
        if self.events is None:
            self.__dict__["events"] = ["command"] if self.protocol == "vmc" else list(ALL_EVENTS)
        return self


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


class OscSink(Sink):
    type_name = "osc"

    def __init__(self, cfg: Any, queue_size: int | None = None, presets: Iterable[str] = ()) -> None:
        """`presets`: custom expression names used by the behaviour rules (reset to 0 in every VMC bundle)."""
        super().__init__(cfg, cfg.queue_size if queue_size is None else queue_size)
        names = [*VRM_PRESETS, *presets, *getattr(cfg, "presets", ())]
        self.presets: dict[str, None] = dict.fromkeys(names)  # an ordered set
        self._client: UdpTarget | None = None

    @classmethod
    def from_settings(cls, cfg: Any, **context: Any) -> OscSink:
        """`presets` in the context: the custom expression names the behaviour rules use."""
        return cls(cfg, presets=context.get("presets", ()))

    def open(self) -> None:
        try:
            self._connect()
        except OSError as exc:  # e.g. a host name that does not resolve yet: retried at each event
            log.warning("output osc: cannot reach %s:%d yet (%s); retrying with each event", self.cfg.host,
                        self.cfg.port, exc)

    def _connect(self) -> UdpTarget:
        if self._client is None:
            self._client = UdpTarget(self.cfg.host, self.cfg.port)
        return self._client

    def write(self, event: Event) -> None:
        """Send the event's datagrams; fail when they cannot leave, or when the receiver refused the previous ones
        (nothing listens on its port: the app was closed), so a vanished receiver counts as failing."""
        if self.cfg.protocol == "vmc":
            messages = [self.vmc_bundle(event)] if event["type"] == "command" else []
        else:
            messages = self.plain_messages(event)
        if not messages:
            return
        try:
            client = self._connect()
            refused = client.refusal()
            for message in messages:
                client.send(message)
        except OSError as exc:
            raise OSError(f"cannot send to {self.cfg.host}:{self.cfg.port}: {exc.strerror or exc}") from exc
        if refused is not None:
            raise ConnectionRefusedError(f"{refused} (is the receiver running?)")

    def vmc_bundle(self, command: Event) -> Any:
        """One command as one bundle: every known preset's Val (the chosen one at its weight), then Apply."""
        chosen, weight = command["expression"]["preset"], float(command["expression"]["weight"])
        self.presets.setdefault(chosen, None)
        bundle = osc_bundle_builder.OscBundleBuilder(osc_bundle_builder.IMMEDIATELY)
        for name in self.presets:
            bundle.add_content(_message(VMC_VAL, name, weight if name == chosen else 0.0))
        bundle.add_content(_message(VMC_APPLY))
        return bundle.build()

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
        return []

    def flush_close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


PLUGIN = Plugin("osc", OscOutput, OscSink)
