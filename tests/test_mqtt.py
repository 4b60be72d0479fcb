"""The MQTT output (issue 15, items 2 and 3) against a real mosquitto broker and real paho subscribers.

What is proven: events arrive on the templated topics with a growing `seq`; every command arrives exactly once after
de-duplication by `seq` although the broker was stopped (and restarted from its persistence) while commands kept
coming; the daemon's retained `online` is there while it runs and the broker's last will `offline` follows a
SIGKILL; a broker that is down makes /healthz report the output failing, and one that comes up makes it healthy;
the broker password never appears in check-config output, errors or the daemon's logs. Nothing is faked: the broker
is Debian's mosquitto started from a config file (tests/servers/mosquitto.py), with a password file where a password
is tested. No timing thresholds: every wait is on an event, with generous time-outs.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from pipeline.config.app import parse_config
from pipeline.config.loader import ConfigError
from pipeline.outputs.mqtt import MqttOutput, MqttSink
from tests.conftest import run_cli
from tests.running_daemon import RunningDaemon, free_port, wait_until, write_config
from tests.servers.mosquitto import Mosquitto, mosquitto_missing
from tests.strict_skips import ENV as STRICT_SKIPS

USER, PASSWORD = "kiosk", "mq77-Pa55word"


@pytest.fixture
def broker_port() -> int:
    """A free port for a broker, or a skip (a failure under EMOTION_STRICT_SKIPS=1) without mosquitto."""
    if mosquitto_missing():
        reason = "mosquitto is not installed (Debian package `mosquitto`; .ci/run installs it)"
        if os.environ.get(STRICT_SKIPS) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return free_port()


class Subscriber:
    """A real paho subscriber with a fixed id and a persistent session (what a consumer of commands should use)."""

    def __init__(self, port: int, topic: str, client_id: str, users: tuple[str, str] | None = None) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        if users:
            self.client.username_pw_set(*users)
        self.client.reconnect_delay_set(0.1, 0.5)
        self.client.on_connect = lambda c, _u, _f, _r, _p: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect_async("127.0.0.1", port)
        self.client.loop_start()
        if not self._subscribed.wait(20):
            raise TimeoutError(f"subscriber {client_id} not subscribed to {topic} within 20 s")

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((message.topic, message.payload, bool(message.retain)))

    def payloads(self, suffix: str = "") -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(p) for t, p, _ in self.messages if t.endswith(suffix) and p.startswith(b"{")]

    def texts(self, topic: str) -> list[tuple[str, bool]]:
        with self._lock:
            return [(p.decode(), r) for t, p, r in self.messages if t == topic]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _command(camera: str, n: int) -> dict[str, Any]:
    return {"type": "command", "camera": camera, "ts": 1.0, "target": n, "emotion": "happy", "confidence": 0.9,
            "reason": "test", "expression": {"preset": "happy", "weight": 0.9, "blend_ms": 200},
            "tone": {}, "latency_ms": {}}


# ------------------------------------------------------------------------------------------------ settings


def test_mqtt_settings_errors_point_at_the_line_and_hide_the_password() -> None:
    text = ("cameras: [{name: lobby, source: demo}]\n"
            "outputs:\n"
            "  - type: mqtt\n"
            f"    username: {USER}\n"
            f"    password: {PASSWORD}\n"
            "    topic: emotion/{site}/{room}/#\n")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "fleet.yaml", {})
    message = str(caught.value)
    assert "fleet.yaml:6: outputs[0].mqtt.topic: " in message or "fleet.yaml:6: outputs[0].topic: " in message, \
        message
    assert "{room}" in message and PASSWORD not in message
    ok = parse_config(text.replace("{room}/#", "{camera}/{type}"), "fleet.yaml", {}).outputs[0]
    assert isinstance(ok, MqttOutput) and ok.qos == {"command": 1, "camera": 1, "observation": 0}
    assert PASSWORD not in ok.describe() and f"{USER}:***@" in ok.describe()


def test_check_config_never_shows_the_mqtt_password(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("cameras: [{name: lobby, source: demo}]\n"
                    f"outputs:\n  - {{type: mqtt, host: broker.local, username: {USER}, password: '${{MQ_PW}}', "
                    "site: hall-3}\n")
    checked = run_cli("check-config", str(good), env={"MQ_PW": PASSWORD})
    assert checked.returncode == 0, checked.stderr
    assert PASSWORD not in checked.stdout + checked.stderr
    assert f"mqtt mqtt://{USER}:***@broker.local:1883 emotion/{{site}}/{{camera}}/{{type}}" in checked.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("site: hall-3", "site: hall-3, port: 99999"))
    refused = run_cli("check-config", str(bad), env={"MQ_PW": PASSWORD})
    assert refused.returncode != 0 and "bad.yaml:3: outputs[0]" in refused.stdout + refused.stderr, refused
    assert PASSWORD not in refused.stdout + refused.stderr


def test_kiosk_fleet_example_is_valid_and_needs_its_password() -> None:
    from pipeline.config.app import load_config
    from tests.conftest import ROOT

    example = ROOT / "config" / "examples" / "kiosk-fleet.yaml"
    config = load_config(example, env={"MQTT_PASSWORD": PASSWORD, "KIOSK_SITE": "store-12-k3"})
    mqtt_output = next(o for o in config.outputs if isinstance(o, MqttOutput))
    assert mqtt_output.site == "store-12-k3" and mqtt_output.tls and config.inference.backend == "onnxruntime"
    assert mqtt_output.effective_status_topic == "emotion/store-12-k3/status"
    with pytest.raises(ConfigError, match=r"kiosk-fleet.yaml:\d+: outputs\[1\].password: environment variable"):
        load_config(example, env={})


# ------------------------------------------------------------------------------------------------ the sink


def test_commands_arrive_exactly_once_after_dedup_across_a_broker_restart(broker_port: int) -> None:
    """Commands keep coming while the broker is down; after it restarts from its persistence, the subscriber (a
    persistent session) has every one of them, each once after dropping repeated `seq`s."""
    broker = Mosquitto(broker_port).start()
    sink = MqttSink(MqttOutput(port=broker_port, site="lab", events=["command", "observation"],
                               reconnect_min_s=0.1, reconnect_max_s=0.5, client_id="emotion-test-restart"))
    subscriber = None
    try:
        subscriber = Subscriber(broker_port, "emotion/lab/+/command", "consumer-restart")
        sink.start()
        for n in range(50):
            sink.offer(_command("lobby", n))
        sink.offer({"type": "observation", "camera": "lobby", "ts": 1.0, "faces": []})
        assert wait_until(lambda: len(subscriber.payloads()) >= 50, 30), len(subscriber.payloads())
        broker.stop()
        for n in range(50, 100):
            sink.offer(_command("door", n))
        assert wait_until(lambda: sink.failed >= 50, 30), (sink.sent, sink.failed)  # counted while down
        broker.start()
        assert wait_until(lambda: sink.connects >= 2, 30), sink.connects  # back before the next commands
        for n in range(100, 150):
            sink.offer(_command("lobby", n))
        assert wait_until(lambda: {p["target"] for p in subscriber.payloads()} >= set(range(150)), 60), \
            sorted(set(range(150)) - {p["target"] for p in subscriber.payloads()})[:20]
        received = subscriber.payloads()
        unique = {p["seq"]: p for p in received}
        assert sorted(p["target"] for p in unique.values()) == list(range(150))  # exactly once after dedup
        assert all(unique[seq]["target"] < unique[later]["target"] for seq, later in zip(sorted(unique),
                                                                                       sorted(unique)[1:]))
        assert {t.split("/")[2] for t, _, _ in subscriber.messages} == {"lobby", "door"}
        assert sink.delivery.failures_in_row == 0 and sink.connects >= 2
    finally:
        sink.close()
        if subscriber is not None:
            subscriber.close()
        broker.close()


def test_a_reload_hands_the_client_id_over_without_an_offline(broker_port: int) -> None:
    """A reload opens the new output before closing the old one, same client id: the old one's close must not
    leave `offline` retained while the new one runs; the new one's close (a stop) does announce it."""
    settings = MqttOutput(port=broker_port, site="reload", client_id="emotion-test-reload", reconnect_min_s=0.5)
    status = settings.effective_status_topic
    with Mosquitto(broker_port) as broker:
        old, new = MqttSink(settings), MqttSink(settings)
        old.start()
        new.start()
        old.close()
        assert wait_until(lambda: new.delivery.failures_in_row == 0 and new._connected.is_set(), 20)

        def retained() -> list[tuple[str, bool]]:
            watcher = Subscriber(broker.port, status, f"watch-{free_port()}")
            try:
                wait_until(lambda: watcher.texts(status), 10)
                return watcher.texts(status)
            finally:
                watcher.close()

        assert retained() == [("online", True)]
        new.offer(_command("lobby", 1))
        new.close()
        assert new.sent == 1 and retained() == [("offline", True)]


# ------------------------------------------------------------------------------------------------ the daemon


def _healthz(base: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (OSError, ValueError):
        return 0, {}


@pytest.fixture
def daemon_and_broker(prepared_models: None, broker_port: int,
                      tmp_path: Path) -> Iterator[tuple[RunningDaemon, Mosquitto, str]]:
    """A daemon (demo camera, server on) whose MQTT output needs a password, and its broker, not started yet."""
    broker, port = Mosquitto(broker_port, users={USER: PASSWORD, "watcher": "watch"}), free_port()
    output = (f"[{{type: mqtt, port: {broker_port}, username: {USER}, password: '${{MQ_PW}}', site: hall, "
              "client_id: emotion-test-daemon, reconnect_min_s: 0.2, reconnect_max_s: 1, keepalive_s: 5}]")
    config = write_config(tmp_path / "config.yaml", ["{name: lobby, source: demo, fps: 10}"], port=port,
                          outputs=output)
    daemon = RunningDaemon(config, env={"MQ_PW": PASSWORD})
    try:
        yield daemon, broker, f"http://127.0.0.1:{port}"
    finally:
        daemon.kill()
        broker.close()


def test_daemon_health_topics_online_and_last_will(daemon_and_broker: tuple[RunningDaemon, Mosquitto, str]) -> None:
    daemon, broker, base = daemon_and_broker
    daemon.wait_for(lambda: _healthz(base)[1].get("outputs") == {"mqtt": "failing"}, 120,
                    "/healthz naming the mqtt output failing while the broker is down")
    code, health = _healthz(base)
    assert code == 503 and any(p.startswith("output mqtt: ") for p in health["problems"]), health

    broker.start()
    daemon.wait_for(lambda: _healthz(base)[0] == 200, 90, "/healthz 200 once the broker is up")
    watcher = Subscriber(broker.port, "emotion/hall/#", "watcher-test", users=("watcher", "watch"))
    try:
        watcher_sees = lambda: watcher.payloads("/observation")  # noqa: E731
        daemon.wait_for(lambda: len(watcher_sees()) >= 5, 60, "observations on emotion/hall/lobby/observation")
        fresh = Subscriber(broker.port, "emotion/hall/status", "watcher-fresh", users=("watcher", "watch"))
        try:  # subscribed after the daemon's `online` surely reached the broker: it comes as a retained message
            assert wait_until(lambda: ("online", True) in fresh.texts("emotion/hall/status"), 20), \
                fresh.texts("emotion/hall/status")
        finally:
            fresh.close()
        seqs = [p["seq"] for p in watcher_sees()]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
        first = watcher_sees()[0]
        assert first["type"] == "observation" and first["camera"] == "lobby" and "faces" in first
        assert {t for t, _, _ in watcher.messages} <= {"emotion/hall/status", "emotion/hall/lobby/observation",
                                                       "emotion/hall/lobby/command", "emotion/hall/lobby/camera",
                                                       "emotion/hall/lobby/presence"}

        daemon.signal(signal.SIGKILL)
        assert daemon.wait(30) == -signal.SIGKILL
        assert wait_until(lambda: ("offline", False) in watcher.texts("emotion/hall/status"), 30), \
            watcher.texts("emotion/hall/status")
    finally:
        watcher.close()
    later = Subscriber(broker.port, "emotion/hall/status", "watcher-later", users=("watcher", "watch"))
    try:
        assert wait_until(lambda: later.texts("emotion/hall/status"), 20)
        assert later.texts("emotion/hall/status") == [("offline", True)]  # the will is retained
    finally:
        later.close()
    assert PASSWORD not in daemon.stderr_text() + daemon.stdout_text()
    assert "output mqtt: connected to 127.0.0.1:" in daemon.stderr_text()


def test_the_look_target_is_retained_for_late_subscribers(broker_port: int) -> None:
    """Issue 27: lookat events (when listed) are retained, so a consumer that subscribes after the avatar last looked
    somewhere gets that look at once (the look-at state); commands are not retained."""
    broker = Mosquitto(broker_port).start()
    sink = MqttSink(MqttOutput(port=broker_port, site="lab", events=["command", "lookat"],
                               client_id="emotion-test-retain"))
    late = None
    try:
        sink.start()
        sink.offer(_command("lobby", 1))
        for yaw in (10.0, 20.0):
            sink.offer({"type": "lookat", "camera": "lobby", "avatar": None, "stream": "lobby", "ts": 1.0,
                        "target": 3, "yaw": yaw, "pitch": -2.0, "point": [0.3, 0.0, 1.0]})
        assert wait_until(lambda: sink.sent >= 3 and sink.acked >= 1, 30), (sink.sent, sink.failed)
        sink.close()  # flushes; the retained look stays at the broker
        late = Subscriber(broker_port, "emotion/lab/#", "consumer-late")
        assert wait_until(lambda: late.payloads("/lookat"), 20), late.messages
        looks = [(t, json.loads(p), retained) for t, p, retained in late.messages if t.endswith("/lookat")]
        assert [(t, body["yaw"], retained) for t, body, retained in looks] == [("emotion/lab/lobby/lookat", 20.0, True)]
        assert not late.payloads("/command"), "a command is not state: it is not retained"
    finally:
        sink.close()
        if late is not None:
            late.close()
        broker.close()
