"""Avatars that span cameras (issue 14, part 3) and the WebSocket snapshot for late joiners (part 4).

Real models and real clips: the three-camera avatar is an AvatarMapper fed with real Perception observations of the
three clips in ../shared/data/video, one tracker per camera as the workers have, on a deterministic schedule that
makes the faces alternate (a camera "without a face" is shown a face-free frame: the clip's first frame blurred
beyond recognition, checked to have no face). Two avatars on two real OSC receivers, the snapshot and /api/status run
a real daemon with a real WebSocket client. No timing thresholds: waits are on events, with generous time-outs.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import cv2
import pytest

from pipeline.behavior.avatar_mapper import AvatarMapper, BehaviorRouter
from pipeline.behavior.avatars import AvatarSettings
from pipeline.config.app import ConfigError, parse_config
from pipeline.core.types import Command, FaceResult, Observation
from pipeline.service.reload import plan_reload
from pipeline.vision.track import IouTracker
from tests.conftest import data_path
from tests.running_daemon import RunningDaemon, clip, free_port, short_clip, write_config
from tests.test_sinks_osc_webhook import OscReceiver

STEP = 0.125  # seconds of the synthetic capture clock between two rounds (one observation per camera)
T0, WALL0 = 5000.0, 1_764_470_000.0
SWITCH_AFTER_S = 0.5


# ---------------------------------------------------------------- configuration


def _config(avatars: str, cameras: str = "[{name: a, source: demo}, {name: b, source: demo}]") -> str:
    return f"cameras: {cameras}\nbehavior: {{dwell_ms: 300, attention: room}}\navatars:\n{avatars}"


def test_avatar_config_errors_name_file_and_line() -> None:
    text = _config("  - name: hall\n    cameras: [a, b]\n  - name: door\n    cameras:\n      - zz\n      - b\n")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "site.yaml")
    lines = [issue.format() for issue in caught.value.issues]
    assert lines == ["site.yaml:8: avatars[1].cameras[0]: no camera of that name (cameras: a, b) (got 'zz')"]
    text = _config("  - name: hall\n    cameras: [a]\n  - name: door\n    cameras:\n      - b\n      - a\n")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "site.yaml")
    assert [i.format() for i in caught.value.issues] == [
        "site.yaml:9: avatars[1].cameras[1]: camera already watched by avatars[0] (hall): a camera belongs to at "
        "most one avatar (got 'a')"]
    with pytest.raises(ConfigError) as caught:
        parse_config(_config("  - name: hall\n    cameras: [a]\n    behavior: {attention: all}\n"), "site.yaml")
    assert caught.value.issues[0].format().startswith("site.yaml:6: avatars[0].behavior.attention: an avatar's "
                                                      "attention is set by its own `attention:` key")


def test_avatar_behavior_overrides_top_level_and_example_is_valid() -> None:
    cfg = parse_config(_config("  - name: hall\n    cameras: [a]\n    attention: center\n"
                               "    behavior: {cooldown_ms: 10, rules: {sad: {tone: {rate: '-20%'}}}}\n"))
    behavior = cfg.avatars[0].behavior
    assert (behavior.dwell_ms, behavior.cooldown_ms, behavior.attention) == (300.0, 10.0, "largest")
    assert behavior.rules["sad"].tone.rate == "-20%" and behavior.rules["sad"].expression.preset == "sad"
    assert cfg.behavior.attention == "room" and cfg.avatars[0].attention == "center"
    example = Path(__file__).resolve().parents[1] / "config" / "examples" / "hall-one-avatar.yaml"
    hall = parse_config(example.read_text(), str(example), env={})
    assert [(a.name, a.cameras) for a in hall.avatars] == [("hall", ["entrance", "stage", "bar"])]


def test_changed_avatars_restart_behaviour_and_outputs() -> None:
    old = parse_config(_config("  - name: hall\n    cameras: [a, b]\n"))
    new = parse_config(_config("  - name: hall\n    cameras: [a]\n    switch_after_ms: 200\n"))
    plan = plan_reload(old, new)
    assert plan.behavior and plan.outputs and "avatars replaced" in plan.describe()
    assert not plan_reload(old, old).behavior


# ---------------------------------------------------------------- three cameras, one avatar (real observations)


class _Clip:
    """One camera's real observations: consecutive frames of a clip through Perception and the camera's tracker."""

    def __init__(self, camera: str, path: Path, perception: Any) -> None:
        self.camera, self.perception = camera, perception
        self.capture = cv2.VideoCapture(str(path))
        self.tracker = IouTracker(0.3, 1.0, 300.0)
        self.index = 0
        ok, first = self.capture.read()
        if not ok:
            pytest.fail(f"cannot read {path}")
        self.frame = first
        self.blank = cv2.GaussianBlur(first, (0, 0), 60)  # the scene with nobody recognisable in it
        if perception.analyze(self.blank)[0]:
            pytest.fail(f"the blurred first frame of {path} still has a face")

    def observe(self, t: float, with_face: bool) -> Observation:
        """The next frame (or the face-free one) analysed at capture time `t`."""
        image = self.blank
        if with_face:
            ok, frame = self.capture.read()
            if not ok:  # the clip ended: rewind (the tracker may give the face a new id, as a real camera would)
                self.capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
                ok, frame = self.capture.read()
            image = frame
        self.index += 1
        faces, scores, _ = self.perception.analyze(image)
        ids = self.tracker.update(faces, t)
        results = tuple(FaceResult(f, s, i, self.tracker.smooth(i, s, t)) for f, s, i in zip(faces, scores, ids))
        height, width = image.shape[:2]
        return Observation(self.camera, self.index, t, WALL0 + (t - T0), (width, height), results)


# (door, stage, bar) shows a face in rounds [start, end): the faces alternate deterministically
SCHEDULE = [
    ((True, False, False), 12),   # A: only door sees someone
    ((True, True, True), 14),     # B: everybody is seen: attention must stay on door (sticky)
    ((False, True, True), 18),    # C: door's face left: attention moves once, to stage or bar, and stays
    ((False, False, False), 14),  # D: nobody: idle
    ((False, False, True), 14),   # E: only bar
]


@pytest.fixture(scope="module")
def three_cameras(perception: Any) -> dict[str, Any]:
    clips = [_Clip("door", data_path("video", "woman_short.mp4"), perception),
             _Clip("stage", data_path("video", "woman2.mp4"), perception),
             _Clip("bar", data_path("video", "group_1080p.mp4"), perception)]
    settings = AvatarSettings.model_validate({
        "name": "hall", "cameras": ["door", "stage", "bar"], "attention": "largest",
        "switch_after_ms": SWITCH_AFTER_S * 1000,
        "behavior": {"min_confidence": 0.2, "exit_confidence": 0.2, "dwell_ms": 250, "cooldown_ms": 250,
                     "idle_after_s": 1.0}})
    mapper = AvatarMapper(settings)
    commands: list[tuple[str, float, Command]] = []  # (phase, t, command)
    focus: list[tuple[str, float, tuple[str, int | None] | None]] = []  # (phase, t, focus after the round)
    seen: list[tuple[float, dict[str, bool]]] = []  # (t, camera -> had a face) per round
    t = T0
    for phase, (pattern, rounds) in zip("ABCDE", SCHEDULE):
        for _ in range(rounds):
            had = {}
            for clip_, with_face in zip(clips, pattern):
                obs = clip_.observe(t, with_face)
                had[clip_.camera] = bool(obs.faces)
                commands += [(phase, t, c) for c in mapper.update(obs)]
            commands += [(phase, t, c) for c in mapper.tick(t, WALL0 + (t - T0))]
            focus.append((phase, t, mapper.focus))
            seen.append((t, had))
            t += STEP
    return {"commands": commands, "focus": focus, "seen": seen}


def test_three_camera_avatar_is_one_sticky_command_stream(three_cameras: dict[str, Any]) -> None:
    commands, focus = three_cameras["commands"], three_cameras["focus"]
    assert commands and all(c.avatar == "hall" for _, _, c in commands), "one stream: every command is hall's"
    emotion = [(phase, c.camera) for phase, _, c in commands if c.reason == "emotion"]
    assert {cam for phase, cam in emotion if phase in "AB"} == {"door"}, emotion
    assert all(f is not None and f[0] == "door" for phase, _, f in focus if phase in "AB"), \
        "while door's face is seen, attention stays there although stage and bar see faces"
    moved = [f[0] for phase, _, f in focus if phase == "C" and f is not None and f[0] != "door"]
    assert moved and len(set(moved)) == 1, f"attention moves once, to one camera, and stays: {moved}"
    assert {cam for phase, cam in emotion if phase == "C"} <= {"door", moved[0]}
    assert moved[0] in {cam for phase, cam in emotion if phase == "C"}, "the new camera's face gets commands"
    idle = [c for phase, _, c in commands if c.reason == "idle"]
    assert [phase for phase, _, c in commands if c.reason == "idle"] == ["D"] and idle[0].target is None
    assert {cam for phase, cam in emotion if phase == "E"} == {"bar"}


def test_attention_switches_camera_only_after_the_face_left(three_cameras: dict[str, Any]) -> None:
    """Every change of the attended camera happens when the previously attended camera had shown no face for
    switch_after_ms (or after idle), never while it still saw its face."""
    seen = dict(three_cameras["seen"])
    last_face: dict[str, float] = {}
    previous: tuple[str, int | None] | None = None
    for _, t, target in three_cameras["focus"]:
        for camera, had in seen[t].items():
            if had:
                last_face[camera] = t
        if previous is not None and target is not None and target[0] != previous[0]:
            assert not seen[t][previous[0]], f"switched away from {previous[0]} while it saw a face at {t}"
            assert t - last_face[previous[0]] >= SWITCH_AFTER_S, f"switched {t - last_face[previous[0]]} s after"
        previous = target or previous


def test_cameras_in_no_avatar_keep_their_own_stream() -> None:
    cfg = parse_config(_config("  - name: hall\n    cameras: [a]\n",
                               "[{name: a, source: demo}, {name: b, source: demo}, {name: c, source: demo}]"))
    router = BehaviorRouter(cfg.behavior, cfg.avatars)
    assert router.avatar_of("a") == "hall" and router.avatar_of("b") is None
    assert router.names(["a", "b", "c"]) == ["hall", "b", "c"]


# ---------------------------------------------------------------- two avatars, two OSC receivers, the snapshot


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


async def _first_messages(url: str, count: int) -> list[dict[str, Any]]:
    return await asyncio.wait_for(_receive(url, count), 60)


async def _receive(url: str, count: int) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        out = []
        while len(out) < count:
            message = await ws.receive(timeout=30)
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            out.append(json.loads(message.data))
        return out


@pytest.fixture(scope="module")
def two_avatars(prepared_models: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("avatars")
    receivers = ExitStack()
    anna, ben = receivers.enter_context(OscReceiver()), receivers.enter_context(OscReceiver())
    port = free_port()
    config = write_config(
        tmp / "config.yaml",
        [f"{{name: left, source: '{clip()}', fps: 8, loop: true}}",
         f"{{name: right, source: '{clip()}', fps: 8, loop: true}}"],
        port=port, outputs="[{type: stdout, events: [command, camera]}, "
                           "{type: websocket, events: [observation, command, camera, lookat]}]",
        extra="avatars:\n"
              f"  - {{name: anna, cameras: [left], outputs: [{{type: osc, port: {anna.port}, protocol: plain, "
              "events: [command, camera]}]}\n"
              f"  - {{name: ben, cameras: [right], outputs: [{{type: osc, port: {ben.port}, protocol: plain, "
              "events: [command, camera]}]}\n")
    daemon = RunningDaemon(config)
    try:
        yield {"daemon": daemon, "anna": anna, "ben": ben, "base": f"http://127.0.0.1:{port}"}
        code, _ = daemon.terminate()
        assert code == 0 and "Traceback" not in daemon.stderr_text()
    finally:
        daemon.kill()
        receivers.close()


def _commands_of(daemon: RunningDaemon, avatar: str) -> list[dict[str, Any]]:
    return [e for e in daemon.of("command") if e.get("avatar") == avatar]


def _osc_commands(receiver: OscReceiver) -> Callable[[], list[str]]:
    return lambda: [address for address, _ in list(receiver.dispatched) if address.endswith("/command")]


def test_two_avatars_each_output_gets_only_its_own_commands(two_avatars: dict[str, Any]) -> None:
    daemon, anna, ben = two_avatars["daemon"], two_avatars["anna"], two_avatars["ben"]
    daemon.wait_for(lambda: _commands_of(daemon, "anna") and _commands_of(daemon, "ben"), 90,
                    "a command of each avatar on stdout (the top-level output gets everything)")
    daemon.wait_for(lambda: _osc_commands(anna)() and _osc_commands(ben)(), 30, "commands at each OSC receiver")
    assert {e["avatar"] for e in daemon.of("command")} == {"anna", "ben"}
    assert {e["camera"] for e in _commands_of(daemon, "anna")} == {"left"}
    for receiver, own, other in ((anna, ("left", "anna"), ("right", "ben")), (ben, ("right", "ben"), ("left", "anna"))):
        segments = {address.split("/")[2] for address, _ in list(receiver.dispatched)}
        assert segments and segments <= set(own) and not segments & set(other), segments
    outputs = {o["output"] for o in _get_json(two_avatars["base"] + "/api/status")["sinks"]}
    assert {"stdout", "websocket", "anna.osc", "ben.osc"} <= outputs
    health = _get_json(two_avatars["base"] + "/healthz")
    assert {"anna.osc", "ben.osc"} <= set(health.get("outputs", {})), health


def test_websocket_snapshot_arrives_first_with_current_state(two_avatars: dict[str, Any]) -> None:
    daemon, base = two_avatars["daemon"], two_avatars["base"]
    daemon.wait_for(lambda: _commands_of(daemon, "anna") and _commands_of(daemon, "ben"), 90, "commands of both")
    url = base.replace("http", "ws") + "/ws?types=snapshot,command"
    first, *rest = asyncio.run(_first_messages(url, 1))
    assert first["type"] == "snapshot" and not rest
    assert first["cameras"] == {"left": "streaming", "right": "streaming"}
    assert set(first["avatars"]) == {"anna", "ben"}
    for name in ("anna", "ben"):
        current = first["avatars"][name]
        sent = {(e["ts"], e["emotion"]) for e in _commands_of(daemon, name)}
        daemon.wait_for(lambda: (current["ts"], current["emotion"]) in
                        {(e["ts"], e["emotion"]) for e in _commands_of(daemon, name)}, 30,
                        f"{name}'s snapshot entry among its command events ({sent})")
        latest = [e for e in _commands_of(daemon, name) if e["ts"] <= current["ts"]][-1]
        assert current == {k: latest[k] for k in ("emotion", "expression", "tone", "camera", "target", "ts")}
    plain = asyncio.run(_first_messages(base.replace("http", "ws") + "/ws?types=observation", 1))
    assert plain[0]["type"] == "observation", "a client that filters types and does not name snapshot gets none"


def test_websocket_state_says_where_each_avatar_looks(two_avatars: dict[str, Any]) -> None:
    """Issue 27: the snapshot carries each avatar's last look target (a lookat event of its own camera), and a
    client asking for lookat events (`?types=snapshot,lookat`) gets them after it."""
    daemon, base = two_avatars["daemon"], two_avatars["base"]
    daemon.wait_for(lambda: _commands_of(daemon, "anna") and _commands_of(daemon, "ben"), 90, "commands of both")
    first, *looks = asyncio.run(_first_messages(base.replace("http", "ws") + "/ws?types=snapshot,lookat", 5))
    assert first["type"] == "snapshot" and set(first["looks"]) == {"anna", "ben"}, first
    for name, camera in (("anna", "left"), ("ben", "right")):
        look = first["looks"][name]
        assert look["type"] == "lookat" and look["stream"] == name and look["camera"] == camera, look
        assert -90 < look["yaw"] < 90 and -90 < look["pitch"] < 90 and len(look["point"]) == 3, look
    assert looks and {e["type"] for e in looks} == {"lookat"} and {e["stream"] for e in looks} <= {"anna", "ben"}


def test_three_clips_one_avatar_daemon_one_stream_idle_when_all_ended(prepared_models: None, tmp_path: Path) -> None:
    """The daemon with three file cameras under one avatar: one command stream (every command is hall's, from one of
    its cameras), and the idle command once all three clips ended. `missing` (in no avatar) keeps the daemon up."""
    videos = {"door": data_path("video", "woman_short.mp4"), "stage": short_clip("woman2.mp4", 5, tmp_path),
              "bar": data_path("video", "group_1080p.mp4")}
    config = write_config(
        tmp_path / "config.yaml",
        [f"{{name: {name}, source: '{path}', fps: 5}}" for name, path in videos.items()] +
        [f"{{name: missing, source: '{tmp_path / 'missing.mp4'}', reconnect: {{initial_s: 0.5, max_s: 1}}}}"],
        outputs="[{type: stdout, events: [command, camera]}]",
        extra="avatars:\n  - {name: hall, cameras: [door, stage, bar], behavior: {idle_after_s: 30}}\n")
    daemon = RunningDaemon(config)

    def ended() -> set[str]:
        return {e["camera"] for e in daemon.of("camera") if e["state"] == "ended"}

    try:
        daemon.wait_for(lambda: ended() == set(videos), 120, "the three clips ending")
        daemon.wait_for(lambda: any(e["reason"] == "idle" for e in daemon.of("command")), 30,
                        "hall's idle command once all its cameras ended (well before idle_after_s)")
        code, _ = daemon.terminate()
        assert code == 0 and "Traceback" not in daemon.stderr_text()
    finally:
        daemon.kill()
    commands = daemon.of("command")
    assert {e["avatar"] for e in commands} == {"hall"} and {e["camera"] for e in commands} <= set(videos)
    assert [e["reason"] for e in commands].count("idle") == 1 and commands[-1]["reason"] == "idle"
    assert any(e["reason"] == "emotion" for e in commands)
