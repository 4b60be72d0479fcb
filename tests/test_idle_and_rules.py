"""Issue 12, items 4 and 12: the avatar returns to neutral when its camera goes away, and rules name only what they
change; indentation mistakes in the YAML are explained in plain words.

The idle rule is checked twice: on `BehaviorMapper.tick` with hand-made times (the clock is the boundary), and on the
real daemon with a real video file that ends (`loop: false`), whose stdout events are read as an avatar would.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.behavior.mapper import BehaviorMapper
from pipeline.config.app import default_rules, load_config
from pipeline.core.types import Command
from tests.conftest import data_path, run_cli
from tests.running_daemon import (  # noqa: F401  (daemons: a fixture)
    RunningDaemon,
    daemons,
)
from tests.test_behavior import STEP, T0, WALL0, drive, mapper, observation, result

# --- tick: idle on time, with no observation -----------------------------------------------------------------------


def _happy_for_one_second(m: BehaviorMapper, camera: str = "lobby") -> list[Command]:
    """Frames 0..15 with a happy face (the last one at T0 + 15 * STEP); the commands they gave."""
    commands = []
    for frame in range(16):
        commands += m.update(observation(frame, result(1, "happy"), camera=camera))
    return commands


def test_tick_sends_one_idle_command_idle_after_s_after_the_last_face_with_no_observation() -> None:
    m = mapper(idle_after_s=2.0)
    assert [c.emotion for c in _happy_for_one_second(m)] == ["happy"]
    last_face = T0 + 15 * STEP
    assert m.tick(last_face + 2.0 - STEP, WALL0 + 100.0) == []  # not yet
    (idle,) = m.tick(last_face + 2.0, WALL0 + 200.0)
    assert (idle.camera, idle.target, idle.emotion, idle.reason) == ("lobby", None, "neutral", "idle")
    assert idle.expression.preset == default_rules()["neutral"].expression.preset
    assert idle.ts == WALL0 + 200.0 and idle.t_mono == last_face + 2.0
    assert m.tick(last_face + 60.0, WALL0 + 300.0) == []  # once, not at every tick
    # the face returns: answered afresh (after its dwell), and the next silence idles again
    back = drive(m, range(200, 220), lambda f: (result(1, "happy"),))
    assert [c.emotion for _, c in back] == ["happy"]
    assert [c.reason for c in m.tick(T0 + 219 * STEP + 2.0, WALL0)] == ["idle"]


def test_tick_idles_only_the_camera_whose_faces_are_old_and_not_when_disabled() -> None:
    m = mapper(idle_after_s=1.0)
    _happy_for_one_second(m, camera="lobby")
    for frame in range(16, 40):  # the hall keeps seeing a face after the lobby went quiet
        m.update(observation(frame, result(1, "sad"), camera="hall"))
    assert [c.camera for c in m.tick(T0 + 39 * STEP, WALL0)] == ["lobby"]
    assert m.tick(T0 + 39 * STEP + 0.5, WALL0) == []
    disabled = mapper(idle_after_s=0.0)
    _happy_for_one_second(disabled)
    assert disabled.tick(T0 + 1000.0, WALL0) == []
    assert mapper().tick(T0 + 1000.0, WALL0) == []  # a camera that never saw a face has nothing to undo


def test_camera_left_forgets_its_targets_and_the_idle_command_still_follows() -> None:
    m = mapper(idle_after_s=2.0)
    assert [c.emotion for c in _happy_for_one_second(m)] == ["happy"]
    m.camera_left("lobby")  # e.g. `stalled`: the face is gone with the picture
    m.camera_left("never-seen")  # a camera that never streamed: nothing to forget, no error
    # the camera is back 1 s later with the same track: answered afresh (its old state was forgotten) after the dwell
    back = drive(m, range(32, 48), lambda f: (result(1, "happy"),))
    assert [(frame, c.emotion) for frame, c in back] == [(40, "happy")]
    m.camera_left("lobby")
    (idle,) = m.tick(T0 + 47 * STEP + 2.0, WALL0)
    assert (idle.camera, idle.reason, idle.emotion) == ("lobby", "idle", "neutral")


# --- the daemon: a file that ends ----------------------------------------------------------------------------------

IDLE_AFTER_S = 2.0
MARGIN_S = 8.0  # generous: the behaviour thread wakes every 0.25 s, but machines here are noisy


@pytest.mark.slow
def test_daemon_returns_the_avatar_to_neutral_after_a_file_camera_ends(
        prepared_models: None, tmp_path: Path, daemons: Callable[..., RunningDaemon]) -> None:  # noqa: F811
    video = data_path("video", "woman_short.mp4")
    config = tmp_path / "config.yaml"
    # `missing` keeps the daemon running (it retries forever) once `once` has ended
    config.write_text("cameras:\n"
                      f"  - {{name: once, source: {video}, fps: 5, loop: false}}\n"
                      f"  - {{name: missing, source: {tmp_path / 'nope.mp4'}, reconnect: {{initial_s: 1, max_s: 2}}}}\n"
                      "detector: {input_size: [320, 192]}\n"
                      f"behavior: {{dwell_ms: 300, cooldown_ms: 800, idle_after_s: {IDLE_AFTER_S}}}\n"
                      "server: {enabled: false}\n")
    daemon = daemons(config)

    def ended() -> list[float]:
        return [t for t, e in list(daemon.arrivals)
                if e["type"] == "camera" and e["camera"] == "once" and e["state"] == "ended"]

    def idle() -> list[tuple[float, dict[str, object]]]:
        return [(t, e) for t, e in list(daemon.arrivals)
                if e["type"] == "command" and e["camera"] == "once" and e["reason"] == "idle"]

    daemon.wait_for(ended, timeout=120, what="the file camera's `ended` event")
    daemon.wait_for(idle, timeout=IDLE_AFTER_S + MARGIN_S, what="a neutral (idle) command after the file ended")
    (idle_at, command), = idle()
    assert idle_at - ended()[0] <= IDLE_AFTER_S + MARGIN_S
    assert (command["emotion"], command["target"]) == ("neutral", None)
    assert command["expression"]["preset"] == "neutral"  # type: ignore[index]
    with_faces = [e for e in daemon.of("observation", "once") if e["faces"]]
    assert with_faces, "the clip showed no face, so there was nothing to return from"
    # not early: at least idle_after_s after the last face was captured (both are wall-clock seconds)
    assert float(command["ts"]) - float(with_faces[-1]["ts"]) >= IDLE_AFTER_S - 0.05  # type: ignore[arg-type]
    code, _ = daemon.terminate(timeout=15)
    assert code == 0, daemon.stderr_text()[-2000:]


# --- rules name only what they change ------------------------------------------------------------------------------


def test_check_config_accepts_a_tone_only_rule_and_the_merged_rule_drives_commands(tmp_path: Path) -> None:
    path = tmp_path / "tone.yaml"
    path.write_text("cameras:\n  - {name: lobby, source: demo}\n"
                    "behavior:\n  rules:\n    sad:\n      tone: {style: soothing, rate: \"-20%\"}\n")
    done = run_cli("check-config", str(path))
    assert done.returncode == 0, done.stderr
    assert f"{path}: valid" in done.stdout
    behavior = load_config(path, env={}).behavior
    default_sad = default_rules()["sad"]
    sad = behavior.rule_for("sad")
    assert sad.expression == default_sad.expression  # not named: the built-in expression
    assert (sad.tone.style, sad.tone.rate) == ("soothing", "-20%")  # named: overridden
    assert (sad.tone.pitch, sad.tone.volume) == (default_sad.tone.pitch, default_sad.tone.volume)  # the rest kept
    assert behavior.rule_for("happy") == default_rules()["happy"]
    m = BehaviorMapper(behavior)
    commands = [c for f in range(20) for c in m.update(observation(f, result(1, "sad")))]
    assert [(c.expression.preset, c.expression.weight, c.tone.style, c.tone.rate) for c in commands] == [
        ("sad", default_sad.expression.weight, "soothing", "-20%")]


# --- indentation mistakes in plain words ---------------------------------------------------------------------------

HEAD = "cameras:\n  - {name: lobby, source: demo}\n"


@pytest.mark.parametrize(("text", "line", "plain"), [
    (HEAD + "behavior:\n    dwell_ms: 300\n  cooldown_ms: 800\n", 5,
     "the indentation of this line does not match the lines above it"),
    (HEAD + "behavior:\n  rules:\n    sad:\n      tone: {style: calm}\n     expression: {preset: sad}\n", 7,
     "the indentation of this line does not match the lines above it"),
    (HEAD + "   - {name: hall, source: demo}\n", 3, "this list item ('- ') is not indented like the lines above it"),
    (HEAD + "behavior:\n  dwell_ms: 300\n    cooldown_ms: 800\n", 5,
     "mapping values are not allowed here; this line is probably indented further than the line above it"),
    (HEAD + "behavior:\n  dwell_ms: 300\n  cooldown_ms 800\n", 5, "this line has a key without its ':'"),
], ids=["key-less-indented", "nested-key-less-indented", "list-item", "key-more-indented", "missing-colon"])
def test_check_config_explains_bad_indentation_in_plain_words_at_the_line(tmp_path: Path, text: str, line: int,
                                                                          plain: str) -> None:
    path = tmp_path / "indent.yaml"
    path.write_text(text)
    done = run_cli("check-config", str(path))
    assert done.returncode == 2
    assert f"{path}:{line}: YAML syntax error: {plain}" in done.stderr, done.stderr
    assert "<block" not in done.stderr and "while parsing" not in done.stderr
    assert "Traceback" not in done.stderr
