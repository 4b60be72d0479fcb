"""Events published to an MQTT broker (paho-mqtt), one message per event, on a templated topic.

Topic and payload: each event goes to `topic` formatted with `site`, `camera` and `type` (default
`emotion/{site}/{camera}/{type}`; `_` stands for an event without a camera), its payload the same JSON object as on
stdout plus `seq`. The daemon's presence is a retained `online` on `status_topic`, and the broker publishes the
retained last will `offline` there when the connection dies without a DISCONNECT (the process was killed, the
host lost power or network).

Why MQTT v3.1.1 with `clean_session=False` and a fixed client id, rather than v5's clean_start + session expiry:
what the issue measured to lose nothing across a broker restart is exactly that combination with Debian's mosquitto
(broker persistence on); every MQTT consumer library speaks 3.1.1, and nothing here needs v5's extras (a session
that expires by itself is what `persistent_client_expiration` in mosquitto.conf gives 3.1.1 sessions). The fixed id
is what lets the broker recognise the session after a reconnect; paho re-sends every QoS>0 message not yet
acknowledged, and keeps messages published while disconnected to send on reconnect, up to `max_queued_messages`
(paho's default is unbounded: a broker down for hours would grow the daemon's memory without end). The broker has a
limit of the same name per subscriber, 1000 by default in mosquitto, which dropped half of a 10,000-event burst in
the issue's measurement: raise it in mosquitto.conf (README). Commands and camera states use QoS 1
by default (delivered at least once, so a command survives a broker restart), observations QoS 0 (10 a second per
camera: a lost one is replaced by the next). Event types in `retain` (lookat by default, when `events` lists it) are
retained: the newest look target of each camera's topic is the avatar's look-at *state* for late subscribers.

Duplicates: QoS 1 is at-least-once, so a consumer must drop repeats by `seq`. `seq` grows by one per event of this
output and starts, at each start of the output (daemon start, or a reload that changes the outputs), at the wall
clock in microseconds: later runs continue above earlier ones without any state file, as long as the clock is not
set back and a run averages under a million events a second. A redelivered message carries its original `seq`.

Network, reconnect and health: paho's own network thread (`loop_start`) connects, reconnects with a backoff from
`reconnect_min_s` doubling to `reconnect_max_s`, and re-sends; `write` only hands a message to it. An event offered
while the broker is unreachable counts as failed (QoS 1 ones stay queued in the client and are delivered on
reconnect), so a broker down for long shows as a failing output in /healthz (see outputs.base.Delivery); the base
class's bounded queue drops and counts events as for every output. Log lines and errors never carry the password.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import ssl
import string
import threading
import time
from typing import Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from pydantic import Field, ValidationInfo, field_validator

from pipeline.core.redact import MASK
from pipeline.core.registry import Plugin
from pipeline.outputs.base import ALL_EVENTS, EventName, OutputSettings, Sink
from pipeline.outputs.events import Event

log = logging.getLogger(__name__)

TOPIC_FIELDS = frozenset({"site", "camera", "type"})
STATUS_FIELDS = frozenset({"site", "client_id"})
NO_CAMERA = "_"  # the topic level of an event without a camera
CONNECT_WAIT_S = 2.0  # open() waits this long for the first connection, so the first events find it up
FLUSH_WAIT_S = 0.3  # at close, wait this long for acks and the `offline`: inside the daemon's stop budget (the
# last will covers a close cut short: the broker publishes `offline` when the connection drops without DISCONNECT)
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")
_LIVE: dict[str, MqttSink] = {}  # client id -> the sink of this process that holds it (see MqttSink.open)
_LIVE_LOCK = threading.Lock()


def _template_fields(template: str) -> set[str]:
    """The `{name}` fields of a str.format template; ValueError on a malformed one."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _check_topic(template: str, allowed: frozenset[str]) -> str:
    """A topic template: known fields only, no MQTT wildcards, no empty levels at the ends."""
    try:
        fields = _template_fields(template)
    except ValueError as exc:
        raise ValueError(f"not a valid template ({exc})") from None
    unknown = fields - allowed
    if unknown or "" in fields:
        raise ValueError(f"unknown field(s) {', '.join(sorted(f'{{{f}}}' for f in unknown))}: use "
                         f"{', '.join(sorted(f'{{{f}}}' for f in allowed))}")
    if "+" in template or "#" in template or template.startswith("/") or template.endswith("/"):
        raise ValueError("a topic to publish to has no wildcards (+, #) and no leading or trailing '/'")
    return template


def default_client_id(site: str) -> str:
    """`emotion-HOST-SITE`: stable across restarts of this daemon on this host, so the broker keeps its session."""
    return _UNSAFE_ID.sub("-", f"emotion-{socket.gethostname()}-{site}")


def _default_qos() -> dict[EventName, Literal[0, 1, 2]]:
    """Commands and camera states at least once; observations at most once (the next one replaces a lost one)."""
    return {"command": 1, "camera": 1, "observation": 0}


def _acked(info: mqtt.MQTTMessageInfo) -> bool:
    """Whether the broker acknowledged a message; a message queued while disconnected reports its first attempt's
    error from is_published() even after it went out, so that counts as not (yet) known."""
    try:
        return info.is_published()
    except RuntimeError:
        return False


def _default_retain() -> list[EventName]:
    return ["lookat"]


class MqttOutput(OutputSettings):
    """Events published to an MQTT broker (topics, payload and delivery in `pipeline.outputs.mqtt`)."""

    type: Literal["mqtt"] = Field("mqtt", description="Output kind.")
    host: str = Field("127.0.0.1", min_length=1, description="Broker host name or IP address.")
    port: int = Field(1883, ge=1, le=65535, description="Broker TCP port (1883 plain, usually 8883 with TLS).")
    tls: bool = Field(False, description="Connect with TLS, verifying the broker's certificate.")
    ca_file: str | None = Field(None, description="With tls: CA bundle (PEM) that signed the broker's "
                                                  "certificate; left out = the system's CAs.")
    username: str | None = Field(None, description="User name sent to the broker, if it requires one.")
    password: str | None = Field(None, description="Password sent with username; never shown or logged. Use "
                                                   "${VAR} to keep it out of the file.")
    site: str = Field("default", pattern=r"^[A-Za-z0-9_.-]+$", description="This daemon's place in the fleet: "
                      "the {site} of the topic templates and of the default client id.")
    topic: str = Field("emotion/{site}/{camera}/{type}", description="Topic of each event: {site}, {camera} "
                       "(`_` for none) and {type} are filled in.")
    status_topic: str = Field("emotion/{site}/status", description="Retained `online` while connected; the "
                              "broker publishes the last will `offline` there when the daemon dies. {site} and "
                              "{client_id} are filled in.")
    client_id: str | None = Field(None, min_length=1, max_length=128, description="Fixed MQTT client id, so the "
                                  "broker keeps this daemon's session across reconnects; left out = "
                                  "emotion-HOSTNAME-SITE. Two outputs to one broker need different ids.")
    qos: dict[EventName, Literal[0, 1, 2]] = Field(default_factory=_default_qos,
                                                   description="QoS per event type; a type left out gets 0.")
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive: how soon a dead connection is "
                                                            "noticed (and the last will published), in seconds.")
    reconnect_min_s: float = Field(1.0, gt=0, le=60, description="First wait before reconnecting, in seconds; "
                                                                 "doubles up to reconnect_max_s.")
    reconnect_max_s: float = Field(30.0, gt=0, le=3600, description="Longest wait between reconnect attempts, "
                                                                    "in seconds.")
    max_queued_messages: int = Field(100_000, ge=1, le=10_000_000, description="QoS 1/2 messages the client "
                                     "keeps while unacknowledged or disconnected; beyond it events fail.")
    events: list[EventName] = Field(default_factory=lambda: list(ALL_EVENTS), min_length=1,
                                    description="Event types published (lookat only when listed).")
    retain: list[EventName] = Field(default_factory=_default_retain, description="Event types published as "
                                    "retained messages: a subscriber that joins later gets the newest one of each "
                                    "topic at once. lookat (the default): where each avatar looks now.")
    queue_size: int = Field(1024, ge=1, le=100_000, description="Events buffered before new ones are dropped "
                                                                "(and counted).")

    @field_validator("password", "username", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        """`${MQTT_PASSWORD:-}` with the variable unset means none."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("password")
    @classmethod
    def _password_needs_user(cls, value: str | None, info: ValidationInfo) -> str | None:
        """MQTT sends a password only together with a user name."""
        if value is not None and info.data.get("username") is None:
            raise ValueError("a password needs a username")
        return value

    @field_validator("topic")
    @classmethod
    def _check_event_topic(cls, value: str) -> str:
        return _check_topic(value, TOPIC_FIELDS)

    @field_validator("status_topic")
    @classmethod
    def _check_status_topic(cls, value: str) -> str:
        return _check_topic(value, STATUS_FIELDS)

    @field_validator("reconnect_max_s")
    @classmethod
    def _max_not_below_min(cls, value: float, info: ValidationInfo) -> float:
        low = info.data.get("reconnect_min_s")
        if low is not None and value < low:
            raise ValueError(f"must be at least reconnect_min_s ({low:g})")
        return value

    @property
    def effective_client_id(self) -> str:
        return self.client_id or default_client_id(self.site)

    @property
    def effective_status_topic(self) -> str:
        return self.status_topic.format(site=self.site, client_id=self.effective_client_id)

    def describe(self) -> str:
        user = "" if self.username is None else f"{self.username}{':' + MASK if self.password else ''}@"
        scheme = "mqtts" if self.tls else "mqtt"
        return (f"mqtt {scheme}://{user}{self.host}:{self.port} {self.topic} (client {self.effective_client_id}) "
                f"[{', '.join(self.events)}]")


class MqttError(RuntimeError):
    """An event not handed to the broker; the message is safe to log (no password)."""


class MqttSink(Sink):
    type_name = "mqtt"

    def __init__(self, cfg: Any, queue_size: int | None = None) -> None:
        super().__init__(cfg, cfg.queue_size if queue_size is None else queue_size)
        self.seq = time.time_ns() // 1000  # the first event gets seq + 1 (module docstring: across restarts)
        self.acked = 0  # QoS>0 messages the broker acknowledged (and QoS 0 ones written to the socket)
        self.connects = 0
        self._connected = threading.Event()
        self._down_since: float | None = time.monotonic()
        self._last_problem = "not connected yet"
        self._superseded = False
        self._older: MqttSink | None = None  # the sink of this process that held the client id before (a reload)
        self._last_reliable: mqtt.MQTTMessageInfo | None = None  # the newest QoS>0 message, awaited at close
        self.client = self._new_client()

    @property
    def where(self) -> str:
        return f"{self.cfg.host}:{self.cfg.port}"

    def _new_client(self) -> mqtt.Client:
        """A paho client with the session, will, queue and backoff settings of the module docstring."""
        cfg = self.cfg
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cfg.effective_client_id, clean_session=False,
                             protocol=mqtt.MQTTv311)
        if cfg.username is not None:
            client.username_pw_set(cfg.username, cfg.password)
        if cfg.tls:
            client.tls_set(ca_certs=cfg.ca_file, cert_reqs=ssl.CERT_REQUIRED)
        client.will_set(cfg.effective_status_topic, "offline", qos=1, retain=True)
        client.max_queued_messages_set(cfg.max_queued_messages)
        client.max_inflight_messages_set(100)
        client.reconnect_delay_set(min_delay=cfg.reconnect_min_s, max_delay=cfg.reconnect_max_s)  # type: ignore[arg-type]
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        return client

    def open(self) -> None:
        """Start paho's network thread (it connects and reconnects by itself) and wait briefly for the broker.

        A reload opens the new outputs before it closes the old ones: a sink of this process that holds the same
        client id is marked superseded, so that its close does not publish `offline` over this one's `online` (the
        broker hands the session to the newer connection; the old one is closed moments later)."""
        with _LIVE_LOCK:
            self._older = _LIVE.get(self.cfg.effective_client_id)
            _LIVE[self.cfg.effective_client_id] = self
            if self._older is not None:
                self._older._superseded = True
        self.client.connect_async(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive_s)
        self.client.loop_start()
        if not self._connected.wait(CONNECT_WAIT_S):
            log.warning("output mqtt: broker %s not reachable yet (%s); reconnecting in the background",
                        self.where, self._safe(self._last_problem))

    def _release_client_id(self) -> bool:
        """Forget this sink in the process's client ids; True when it must not announce `offline` at close.

        A rejected reload closes its new sinks while the old ones keep running: the old one gets its id back (its
        paho reconnects, and announces `online` again, by itself)."""
        with _LIVE_LOCK:
            if _LIVE.get(self.cfg.effective_client_id) is not self:
                return True
            older = self._older
            if older is not None and older.is_alive():
                older._superseded = False
                _LIVE[self.cfg.effective_client_id] = older
                return True
            del _LIVE[self.cfg.effective_client_id]
            return self._superseded

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._last_problem = f"broker {self.where} refused the connection: {reason}"
            log.warning("output mqtt: %s", self._safe(self._last_problem))
            return
        client.publish(self.cfg.effective_status_topic, "online", qos=1, retain=True)
        self.connects += 1
        if self._down_since is not None and self.connects > 1:
            log.info("output mqtt: connected to %s again after %.1f s", self.where,
                     time.monotonic() - self._down_since)
        else:
            log.info("output mqtt: connected to %s as %s", self.where, self.cfg.effective_client_id)
        self._down_since = None
        self._connected.set()

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self._last_problem = f"cannot connect to broker {self.where}"

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self._connected.clear()
        if self._down_since is None:
            self._down_since = time.monotonic()
        self._last_problem = f"lost the connection to broker {self.where} ({reason})"

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        self.acked += 1

    def topic_for(self, event: Event) -> str:
        camera = event.get("camera")
        return self.cfg.topic.format(site=self.cfg.site, camera=NO_CAMERA if camera is None else camera,
                                     type=event["type"])

    def write(self, event: Event) -> None:
        """Hand the event with the next `seq` to paho; fail while the broker is unreachable (QoS>0: still queued)."""
        self.seq += 1
        qos = self.cfg.qos.get(event["type"], 0)
        body = json.dumps({**event, "seq": self.seq}, separators=(",", ":"))
        info = self.client.publish(self.topic_for(event), body, qos=qos, retain=event["type"] in self.cfg.retain)
        if qos:
            self._last_reliable = info
        if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
            return
        if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            raise MqttError(f"{event['type']} seq {self.seq} dropped: {self.cfg.max_queued_messages} messages "
                            f"already wait for broker {self.where}")
        down = "" if self._down_since is None else f" for {time.monotonic() - self._down_since:.0f} s"
        kept = "queued for delivery on reconnect" if qos else "dropped (QoS 0)"
        raise MqttError(self._safe(f"{self._last_problem}{down}: {event['type']} seq {self.seq} {kept}"))

    def _safe(self, text: str) -> str:
        """Text without the password, whatever a library put in it."""
        return text.replace(self.cfg.password, MASK) if self.cfg.password else text

    def flush_close(self) -> None:
        """Give queued QoS>0 messages a moment to be acknowledged, announce `offline`, and disconnect.

        Not when a newer sink of this process holds the client id (see `open`): that one is online."""
        quiet = self._release_client_id()
        deadline, last = time.monotonic() + FLUSH_WAIT_S / 2, self._last_reliable
        while self._connected.is_set() and last is not None and not _acked(last) and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._connected.is_set() and not quiet:
            offline = self.client.publish(self.cfg.effective_status_topic, "offline", qos=1, retain=True)
            deadline += FLUSH_WAIT_S / 2
            while not _acked(offline) and self._connected.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
        self.client.disconnect()
        self.client.loop_stop()


PLUGIN = Plugin("mqtt", MqttOutput, MqttSink)
