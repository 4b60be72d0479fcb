"""The OSC and webhook outputs against real receivers: a python-osc UDP server and an aiohttp web server.

Commands come from the real BehaviorMapper and `events.command_event`; the last test runs the whole daemon on a video
with stdout, OSC and webhook outputs at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pythonosc import dispatcher, osc_bundle, osc_packet, osc_server

from pipeline.behavior.mapper import BehaviorMapper
from pipeline.config.app import BehaviorConfig, OscOutput, WebhookOutput
from pipeline.core.types import CameraEvent
from pipeline.outputs.base import EventBus
from pipeline.outputs.events import (
    Event,
    camera_event,
    command_event,
    observation_event,
)
from pipeline.outputs.osc import VMC_APPLY, VMC_VAL, VRM_PRESETS, OscSink
from pipeline.outputs.registry import create_sink
from pipeline.outputs.webhook import WebhookSink
from tests.conftest import data_path, run_cli
from tests.running_daemon import short_clip, wait_until
from tests.test_behavior import observation, result, square

TOKEN = "s3cret-T0KEN"


# --- real receivers -------------------------------------------------------------------------------------------------


class OscReceiver:
    """python-osc's ThreadingOSCUDPServer on 127.0.0.1:0, recording each datagram and each dispatched message."""

    def __init__(self) -> None:
        self.packets: list[tuple[bool, list[tuple[str, tuple[Any, ...]]]]] = []  # (was a bundle, its messages)
        self.dispatched: list[tuple[str, tuple[Any, ...]]] = []
        self._lock = threading.Lock()
        receiver = self

        class RecordingDispatcher(dispatcher.Dispatcher):
            def call_handlers_for_packet(self, data: bytes, client_address: tuple[str, int]) -> list[Any]:
                messages = [(m.message.address, tuple(m.message.params)) for m in osc_packet.OscPacket(data).messages]
                with receiver._lock:
                    receiver.packets.append((osc_bundle.OscBundle.dgram_is_bundle(data), messages))
                return super().call_handlers_for_packet(data, client_address)

        recording = RecordingDispatcher()
        recording.set_default_handler(self._on_message)
        self.server = osc_server.ThreadingOSCUDPServer(("127.0.0.1", 0), recording)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _on_message(self, address: str, *args: Any) -> None:
        with self._lock:
            self.dispatched.append((address, args))

    def wait_for(self, count: int, timeout: float = 30.0) -> list[tuple[bool, list[tuple[str, tuple[Any, ...]]]]]:
        deadline = time.monotonic() + timeout
        while len(self.packets) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # anything beyond `count` would show up now
        with self._lock:
            return list(self.packets)

    def __enter__(self) -> OscReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class HookServer:
    """An aiohttp.web server on 127.0.0.1 (on `port`, or a free one) in its own thread and loop; answers POST /emotion
    with `statuses`, then 200, and records each request's headers and JSON body."""

    def __init__(self, statuses: tuple[int, ...] = (), port: int = 0) -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[dict[str, str], Any]] = []
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/emotion"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/emotion", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.json()))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"status": status}, status=status)

    def __enter__(self) -> HookServer:
        self._thread.start()
        assert self._ready.wait(10), "aiohttp test server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- events from the real mapper --------------------------------------------------------------------------------------


def commands_from_mapper(cfg: BehaviorConfig, emotions: list[str]) -> list[Event]:
    """Drive a BehaviorMapper through `emotions` (each held 2 s on the fake clock); the command events it emits."""
    mapper = BehaviorMapper(cfg)
    events = []
    frame = 0
    for emotion in emotions:
        for _ in range(32):
            events += [command_event(c) for c in mapper.update(observation(frame, result(1, emotion, 0.9)))]
            frame += 1
    assert [e["emotion"] for e in events] == emotions
    return events


FEAR_RULE = {"fear": {"expression": {"preset": "fear", "weight": 0.7}, "tone": {"style": "reassuring"}}}


def started(sink: Any) -> Any:
    sink.start()
    return sink


def settle(sink: Any, count: int, timeout: float = 30.0) -> None:
    """Wait until `count` events were delivered or given up (close() would cut pending retries short)."""
    deadline = time.monotonic() + timeout
    while sink.sent + sink.failed < count and time.monotonic() < deadline:
        time.sleep(0.01)


# --- OSC --------------------------------------------------------------------------------------------------------------


def test_registry_creates_osc_and_webhook_sinks() -> None:
    osc = create_sink(OscOutput(port=9))
    hook = create_sink(WebhookOutput(url="http://127.0.0.1:9/x"))
    assert isinstance(osc, OscSink) and isinstance(hook, WebhookSink)
    assert osc.events == {"command", "lookat"} and hook.events == {"command"}  # a VMC stream also looks (look_at)
    assert create_sink(OscOutput(look_at=False)).events == {"command"}
    assert create_sink(OscOutput(mode="commands")).events == {"command"}  # no stream: nothing to look with
    assert create_sink(OscOutput(protocol="plain")).events == {"observation", "command", "camera", "presence", "lookat"}


def test_vmc_one_command_is_one_bundle_of_every_preset_then_apply() -> None:
    behavior = BehaviorConfig(rules=FEAR_RULE)
    (happy,) = commands_from_mapper(behavior, ["happy"])
    with OscReceiver() as receiver:
        sink = started(OscSink(OscOutput(port=receiver.port, mode="commands"),
                               presets=[r.expression.preset for r in behavior.rules.values()]))
        sink.offer(happy)
        sink.close()
        packets = receiver.wait_for(1)
    assert len(packets) == 1
    is_bundle, messages = packets[0]
    assert is_bundle
    presets = [*VRM_PRESETS, "fear"]
    assert [address for address, _ in messages] == [VMC_VAL] * len(presets) + [VMC_APPLY]
    values = {args[0]: args[1] for _, args in messages[:-1]}
    assert list(values) == presets
    assert values["happy"] == pytest.approx(happy["expression"]["weight"], abs=1e-6)  # OSC floats are 32-bit
    assert all(value == 0.0 for name, value in values.items() if name != "happy")
    assert messages[-1] == (VMC_APPLY, ())
    assert receiver.dispatched == messages  # the server dispatched them in this order
    assert (sink.sent, sink.failed, sink.dropped) == (1, 0, 0)


def test_daemon_wiring_gives_vmc_the_rules_custom_presets_from_the_first_bundle() -> None:
    """open_sinks (what the daemon calls) passes the rules' presets, so a custom one is reset before it is ever used."""
    from pipeline.outputs.websocket import EventHub
    from pipeline.service.parts import open_sinks

    behavior = BehaviorConfig(rules=FEAR_RULE)
    assert behavior.rule_presets() == ("relaxed", "neutral", "fear", "happy", "sad", "surprised")
    (happy,) = commands_from_mapper(behavior, ["happy"])
    with OscReceiver() as receiver:
        (sink,) = open_sinks([OscOutput(port=receiver.port, mode="commands")], EventHub(), 1.0,
                             behavior.rule_presets())
        sink.offer(happy)
        sink.close()
        (_, messages), = receiver.wait_for(1)
    assert [args[0] for _, args in messages[:-1]] == [*VRM_PRESETS, "fear"]


def test_reload_reopens_outputs_when_the_rules_presets_change() -> None:
    from pipeline.config.app import parse_config
    from pipeline.service.reload import plan_reload

    base = "cameras:\n  - {name: lobby, source: demo}\noutputs:\n  - {type: osc}\n"
    fear = base + "behavior:\n  rules:\n    fear: {expression: {preset: fear}, tone: {style: calm}}\n"
    calmer = base + "behavior:\n  min_confidence: 0.5\n"
    assert plan_reload(parse_config(base), parse_config(fear)).outputs
    assert not plan_reload(parse_config(base), parse_config(calmer)).outputs


def test_a_vmc_stream_counts_every_bundle_and_says_where_it_sends() -> None:
    """Issue 26: the page said `sent 1` while a VMC receiver got hundreds of bundles. Events and messages are counted
    apart: one command is one event; every bundle of the stream is a message, as many as the receiver got; the
    target names host, port, mode and name set. With nothing listening, the failed bundles are counted too."""
    (happy,) = commands_from_mapper(BehaviorConfig(), ["happy"])
    with OscReceiver() as receiver:
        sink = started(OscSink(OscOutput(port=receiver.port, rate_hz=50)))
        sink.offer(happy)
        receiver.wait_for(20)
        sink.close()
        received = len(receiver.wait_for(10_000, timeout=0.2))
    assert sink.sent == 1 and sink.failed == 0
    assert received >= 20 and sink.messages == received, (sink.messages, received)
    assert sink.target == f"osc 127.0.0.1:{receiver.port} (vmc stream 50 Hz, names vrm1)"

    port = free_udp_port()
    dead = started(OscSink(OscOutput(port=port, rate_hz=50)))
    dead.offer(happy)
    deadline = time.monotonic() + 10
    while dead.messages_failed < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    dead.close()
    assert dead.messages_failed >= 3  # each bundle after the first, refused by the closed port, is a failure


def test_send_test_moves_a_vmc_avatar_then_returns_it_to_neutral(tmp_path: Path) -> None:
    """`run_pipeline.py send-test`: with no camera and no model, the rules' happy command reaches a real VMC
    receiver, then neutral; an unknown avatar is exit 2 naming the ones there are."""
    with OscReceiver() as receiver:
        config = tmp_path / "config.yaml"
        config.write_text("cameras: [{name: kiosk, source: demo}]\n"
                          f"outputs: [{{type: osc, port: {receiver.port}, mode: commands}}]\n"
                          "server: {enabled: false}\n")
        done = run_cli("send-test", "--config", str(config), "--expression", "happy", "--hold-s", "0.3", timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"127.0.0.1:{receiver.port}" in done.stdout
        packets = receiver.wait_for(2)
    weights = [{args[0]: args[1] for address, args in messages if address == VMC_VAL} for _, messages in packets]
    assert len(weights) == 2 and weights[0]["happy"] > 0.5 and weights[1]["happy"] == 0.0, weights
    assert weights[1]["neutral"] > 0.5
    wrong = run_cli("send-test", "--config", str(config), "--avatar", "hall", timeout=60)
    assert wrong.returncode == 2 and "kiosk" in wrong.stderr


def free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_vmc_sequence_resets_the_previous_preset_and_ignores_other_events() -> None:
    behavior = BehaviorConfig(rules=FEAR_RULE)
    commands = commands_from_mapper(behavior, ["happy", "fear", "sad", "happy"])
    obs = observation_event(observation(0, result(1, "happy")))
    cam = camera_event(CameraEvent("lobby", time.time(), "streaming"))
    with OscReceiver() as receiver:
        # no presets given: learns "fear" when it is used
        sink = started(OscSink(OscOutput(port=receiver.port, mode="commands")))
        for event in [cam, *commands[:2], obs, *commands[2:]]:
            sink.offer(event)
        sink.close()
        packets = receiver.wait_for(4)
    assert len(packets) == 4 and all(is_bundle for is_bundle, _ in packets)
    shown = []
    for _, messages in packets:
        assert messages[-1][0] == VMC_APPLY and [a for a, _ in messages].count(VMC_APPLY) == 1
        values = dict(args for _, args in messages[:-1])
        nonzero = {k: v for k, v in values.items() if v != 0.0}
        assert len(nonzero) == 1
        shown.append(next(iter(nonzero)))
        if "fear" in shown:
            assert "fear" in values  # once set, a custom preset is reset by every later bundle
    assert sorted(shown) == sorted(c["expression"]["preset"] for c in commands)  # UDP may reorder datagrams
    assert (sink.sent, sink.failed) == (4, 0)


def test_plain_protocol_address_scheme() -> None:
    (command,) = commands_from_mapper(BehaviorConfig(), ["surprise"])
    faces = observation_event(observation(3, result(1, "sad", box=square(100, 100, 40)),
                                          result(2, "happy", 0.7, box=square(400, 300, 120))))
    empty = observation_event(observation(4))
    cam = camera_event(CameraEvent("lobby", time.time(), "reconnecting", "gone"))
    with OscReceiver() as receiver:
        sink = started(OscSink(OscOutput(port=receiver.port, protocol="plain")))
        for event in (command, faces, empty, cam):
            sink.offer(event)
        sink.close()
        packets = receiver.wait_for(6)
    # one message per datagram; UDP (and the threading server) may reorder datagrams, so compare by address
    assert len(packets) == 6 and all(not is_bundle and len(messages) == 1 for is_bundle, messages in packets)
    by_address: dict[str, list[tuple[Any, ...]]] = {}
    for _, ((address, args),) in packets:
        by_address.setdefault(address, []).append(args)
    expression, tone = command["expression"], command["tone"]
    (cmd,) = by_address.pop("/emotion/lobby/command")
    assert (cmd[0], cmd[2]) == ("surprise", expression["preset"])
    assert cmd[1] == pytest.approx(command["confidence"], abs=1e-6)
    assert cmd[3] == pytest.approx(expression["weight"], abs=1e-6)
    (voice,) = by_address.pop("/emotion/lobby/tone")
    assert (voice[0], voice[2:]) == (tone["style"], (tone["pitch"], tone["rate"], tone["volume"]))
    assert voice[1] == pytest.approx(tone["style_degree"])
    assert sorted(by_address.pop("/emotion/lobby/faces")) == [(0,), (2,)]
    (top,) = by_address.pop("/emotion/lobby/top")  # only for the observation with faces: its largest face
    assert top[0] == "happy" and top[1] == pytest.approx(0.7, abs=1e-4)
    assert by_address == {"/emotion/lobby/state": [("reconnecting",)]}


# --- webhook ----------------------------------------------------------------------------------------------------------


def hook(url: str, **settings: Any) -> WebhookSink:
    options: dict[str, Any] = {"url": url, "timeout_s": 2.0, "retries": 2, "backoff_s": 0.05}
    options.update(settings)
    return started(WebhookSink(WebhookOutput(**options)))


def test_webhook_posts_events_with_the_bearer_token() -> None:
    commands = commands_from_mapper(BehaviorConfig(), ["happy", "sad"])
    obs = observation_event(observation(0, result(1, "happy")))
    with HookServer() as server:
        sink = hook(server.url, bearer_token=TOKEN, events=["command", "observation"])
        for event in (commands[0], obs, commands[1]):
            sink.offer(event)
        sink.close()
    assert [body for _, body in server.requests] == json.loads(json.dumps([commands[0], obs, commands[1]]))
    for headers, _ in server.requests:
        assert headers["Authorization"] == f"Bearer {TOKEN}"
        assert headers["Content-Type"] == "application/json"
    assert (sink.sent, sink.failed, sink.dropped, sink.retried) == (3, 0, 0, 0)


def test_webhook_without_token_sends_no_authorization() -> None:
    (command,) = commands_from_mapper(BehaviorConfig(), ["happy"])
    with HookServer() as server:
        sink = hook(server.url, events=["command"])
        sink.offer(command)
        sink.offer(observation_event(observation(0, result(1, "happy"))))  # not configured: not posted
        sink.close()
    assert len(server.requests) == 1 and "Authorization" not in server.requests[0][0]


def test_webhook_retries_5xx_then_delivers() -> None:
    (command,) = commands_from_mapper(BehaviorConfig(), ["happy"])
    with HookServer(statuses=(500, 503)) as server:
        sink = hook(server.url, retries=2)
        sink.offer(command)
        settle(sink, 1)
        sink.close()
    assert len(server.requests) == 3 and all(body == server.requests[0][1] for _, body in server.requests)
    assert (sink.sent, sink.failed, sink.retried) == (1, 0, 2)


def test_webhook_does_not_retry_4xx_and_keeps_going(caplog: pytest.LogCaptureFixture) -> None:
    first, second = commands_from_mapper(BehaviorConfig(), ["happy", "sad"])
    with caplog.at_level(logging.WARNING), HookServer(statuses=(400,)) as server:
        sink = hook(server.url, retries=3, bearer_token=TOKEN)
        sink.offer(first)
        sink.offer(second)
        settle(sink, 2)
        sink.close()
    assert [body["emotion"] for _, body in server.requests] == ["happy", "sad"]  # 400 once, then the next event
    assert (sink.sent, sink.failed, sink.retried) == (1, 1, 0)
    assert "HTTP 400" in caplog.text and TOKEN not in caplog.text


def test_webhook_gives_up_after_retries_and_logs_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    (command,) = commands_from_mapper(BehaviorConfig(), ["happy"])
    with caplog.at_level(logging.WARNING), HookServer(statuses=(500, 500, 500, 500)) as server:
        sink = hook(server.url + "?key=k3y-in-query", retries=2, bearer_token=TOKEN)
        sink.offer(command)
        settle(sink, 1)
        sink.close()
    assert len(server.requests) == 3
    assert (sink.sent, sink.failed, sink.retried) == (0, 1, 2)
    assert "HTTP 500" in caplog.text and "after 3 attempts" in caplog.text
    assert TOKEN not in caplog.text and "k3y-in-query" not in caplog.text


def test_webhook_url_credentials_are_masked_in_logs(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://viewer:hunter2@127.0.0.1:{closed_port()}/emotion"
    with caplog.at_level(logging.WARNING):
        sink = hook(url, retries=0)
        sink.offer(commands_from_mapper(BehaviorConfig(), ["happy"])[0])
        sink.close()
    assert sink.failed == 1 and "viewer:***@" in caplog.text and "hunter2" not in caplog.text


def test_close_cuts_pending_retries_short() -> None:
    """A dead endpoint with long backoffs must not hold shutdown: each queued event gets one last attempt."""
    commands = commands_from_mapper(BehaviorConfig(), ["happy", "sad", "surprise"])
    sink = hook(f"http://127.0.0.1:{closed_port()}/emotion", retries=10, backoff_s=60)
    for command in commands:
        sink.offer(command)
    # the first attempt made (refused at once): the first event now waits 60 s before its first retry
    assert wait_until(lambda: sink.attempts >= 1, 30), "the webhook never tried to post"
    sink.close(timeout=10)
    assert not sink._thread.is_alive(), "close() waited for the 60 s backoff"
    assert (sink.sent, sink.failed, sink.dropped) == (0, 3, 0)


def test_dead_webhook_does_not_reduce_what_osc_receives(caplog: pytest.LogCaptureFixture) -> None:
    """Both sinks on one EventBus; the webhook's endpoint refuses connections and its small queue overflows."""
    behavior = BehaviorConfig(dwell_ms=0, cooldown_ms=0)
    emotions = ["happy", "sad", "surprise", "neutral"] * 10
    commands = commands_from_mapper(behavior, emotions)
    observations = [observation_event(observation(i, result(1, "happy"))) for i in range(40)]
    with caplog.at_level(logging.WARNING), OscReceiver() as receiver:
        osc = started(OscSink(OscOutput(port=receiver.port, mode="commands")))
        dead = hook(f"http://127.0.0.1:{closed_port()}/emotion", retries=3, backoff_s=0.2, queue_size=2,
                    bearer_token=TOKEN)
        bus = EventBus([osc, dead])
        for command, obs in zip(commands, observations):
            bus.publish(obs)
            bus.publish(command)
        packets = receiver.wait_for(len(commands))
        osc.close()
        dead.close()
    assert len(packets) == len(commands) and osc.sent == len(commands) and osc.dropped == osc.failed == 0
    assert Counter(next(args[0] for _, args in messages if args and args[1] != 0.0) for _, messages in packets) == (
        Counter(c["expression"]["preset"] for c in commands))
    assert dead.sent == 0 and dead.dropped > 0 and dead.failed > 0
    assert dead.dropped + dead.failed == len(commands)  # every command accounted for, observations not taken
    assert "ClientConnectorError" in caplog.text and TOKEN not in caplog.text


# --- end to end -------------------------------------------------------------------------------------------------------


def _window_emotions(observations: list[dict[str, Any]], target: int, end_ts: float, span_s: float) -> Counter[str]:
    return Counter(face["smoothed"]["emotion"] for o in observations if end_ts - span_s <= o["ts"] <= end_ts
                   for face in o["faces"] if face.get("track_id") == target)


@pytest.mark.slow
def test_daemon_on_video_commands_follow_the_clip(prepared_models: None, tmp_path: Path) -> None:
    video = short_clip("woman2.mp4", 8, tmp_path)  # the first 8 s of one face, smiling and frightened
    dwell_ms, cooldown_ms = 400, 1500
    with OscReceiver() as receiver, HookServer() as server:
        config = tmp_path / "config.yaml"
        config.write_text(
            f"cameras:\n  - {{name: lobby, source: {video}, fps: 10, loop: false}}\n"
            "detector: {input_size: [320, 192]}\n"
            f"behavior: {{attention: largest, dwell_ms: {dwell_ms}, cooldown_ms: {cooldown_ms}}}\n"
            "server: {enabled: false}\n"
            "outputs:\n  - {type: stdout}\n"
            f"  - {{type: osc, host: 127.0.0.1, port: {receiver.port}, protocol: vmc, mode: commands}}\n"
            f"  - {{type: webhook, url: '{server.url}', bearer_token: '${{HOOK_TOKEN}}'}}\n")
        done = run_cli("run", "--config", str(config), "--duration", "40", env={"HOOK_TOKEN": TOKEN}, timeout=90)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Traceback" not in done.stderr and TOKEN not in done.stderr
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        commands = [e for e in events if e["type"] == "command"]
        packets = receiver.wait_for(len(commands))
    observations = [e for e in events if e["type"] == "observation"]
    # the whole clip was read and analysed: frame numbers count the frames published at 10 fps (~80 in 8 s) however
    # fast analysis is, and a slow machine analyses fewer of them (it skips frames): no throughput is judged here
    assert observations and observations[-1]["frame"] >= 60, "the 8 s clip at 10 fps has ~80 frames"
    assert len(observations) >= 20
    # a few commands, never more than the cooldown allows per target over the clip's own time
    span_s = observations[-1]["ts"] - observations[0]["ts"]
    per_target = Counter(c["target"] for c in commands)
    assert len(commands) >= 2 and all(n <= 1 + span_s * 1000 / cooldown_ms for n in per_target.values()), \
        (per_target, span_s)
    # every command reached the OSC receiver (one bundle each) and the webhook (with the token), in order for HTTP
    assert len(packets) == len(commands) and all(is_bundle for is_bundle, _ in packets)
    assert [body for _, body in server.requests] == commands
    assert all(headers["Authorization"] == f"Bearer {TOKEN}" for headers, _ in server.requests)
    # each command answers what its target showed during the dwell before it: the trigger is the last observation
    # printed before the command (the mapper runs right after it), the window dwell + one frame of slack
    for index, command in enumerate(events):
        if command["type"] != "command":
            continue
        assert command["reason"] == "emotion"
        trigger = next(e for e in reversed(events[:index]) if e["type"] == "observation")
        window = _window_emotions(observations, command["target"], trigger["ts"], dwell_ms / 1000 + 0.1)
        top_count = max(window.values())
        assert window[command["emotion"]] == top_count, (command, window)
    emitted = [c["emotion"] for c in commands]
    assert all(a != b for a, b in zip(emitted, emitted[1:])), "a command repeated what the avatar already shows"
    # the clip's dominant emotions (per-frame majority over the smoothed readings) are among the commands
    per_frame = Counter(o["faces"][0]["smoothed"]["emotion"] for o in observations if o["faces"])
    dominant = {emotion for emotion, count in per_frame.items() if count >= 0.25 * sum(per_frame.values())}
    assert dominant and dominant <= set(emitted), (per_frame, emitted)
