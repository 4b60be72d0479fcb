"""Issue 12, item 19: a SIGHUP that changes an existing camera (real daemon), and the pruning of stale behaviour
targets (BehaviorMapper on an injected clock).

No pass/fail bound is a time window: the daemon test waits for the events themselves, with time-outs that only catch
a hang; the mapper test drives its own clock.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pipeline.behavior.mapper import FORGET_AFTER_S, BehaviorMapper
from pipeline.config.app import BehaviorConfig
from pipeline.core.types import (
    EMOTIONS,
    Command,
    Detection,
    EmotionScores,
    FaceResult,
    Observation,
)
from tests import running_daemon
from tests.conftest import data_path
from tests.running_daemon import RunningDaemon, write_config

daemons = running_daemon.daemons  # the fixture, used by name

# ---------------------------------------------------------------------------------------------------------- reload


@pytest.mark.slow
def test_sighup_changing_a_camera_restarts_only_that_camera(prepared_models: None, tmp_path: Path,
                                                            daemons: Callable[..., RunningDaemon]) -> None:
    """lobby's fps, then its source, change by SIGHUP: the `config` event names lobby as restarted; lobby's capture
    is a new one (its frame counter starts again; a `stopped` and a new `streaming` event, the latter with the new
    source's frame size); door, unchanged, is left alone (no camera event, its frame counter keeps increasing)."""
    small = data_path("video", "woman2.mp4")  # 596x336
    large = data_path("video", "group_1080p.mp4")  # 1920x1080
    door = f"{{name: door, source: '{data_path('video', 'woman_short.mp4')}', fps: 8, loop: true}}"

    def lobby(source: Path, fps: int) -> str:
        return f"{{name: lobby, source: '{source}', fps: {fps}, loop: true}}"

    config = write_config(tmp_path / "config.yaml", [lobby(small, 8), door])
    daemon = daemons(config)

    def frames(camera: str, since: int = 0) -> list[int]:
        return [o["frame"] for o in daemon.of("observation", camera)[since:]]

    def states(camera: str) -> list[str]:
        return [e["state"] for e in daemon.of("camera", camera)]

    def details(camera: str) -> list[str]:
        return [e["detail"] for e in daemon.of("camera", camera) if e["state"] == "streaming"]

    daemon.wait_for(lambda: frames("lobby") and frames("door"), 90, "observations from both cameras")
    daemon.wait_for(lambda: states("lobby") == ["streaming"] and states("door") == ["streaming"], 30,
                    "both cameras streaming")
    assert details("lobby")[0].endswith("596x336"), details("lobby")

    def change(new_lobby: str, what: str, reloads: int) -> None:
        # lobby's current capture well past frame 60 (frames read, ~2 s of the source): a new capture's first frames
        # are then far below it
        daemon.wait_for(lambda: frames("lobby")[-1] >= 60, 60, f"lobby past frame 60 before {what}")
        lobby_seen, door_seen = len(frames("lobby")), len(frames("door"))
        lobby_last, door_last = max(frames("lobby")), max(frames("door"))
        write_config(config, [new_lobby, door])
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: len(daemon.of("config")) >= reloads, 60, f"the config event of {what}")
        event = daemon.of("config")[-1]
        assert event["status"] == "applied", event
        assert "restarted camera(s) lobby" in event["changes"], event
        assert not any("door" in phrase for phrase in event["changes"]), event
        # lobby's capture is a new one: its frame counter starts again below where the old one had got to (the old
        # capture's counter only grows: looping a file does not reset it)
        daemon.wait_for(lambda: any(f < lobby_last for f in frames("lobby", lobby_seen)), 60,
                        f"lobby's frame counter starting again after {what}")
        daemon.wait_for(lambda: len(frames("door", door_seen)) >= 10, 60, f"door keeps going after {what}")
        later = frames("door", door_seen)
        assert all(b > a for a, b in zip([door_last, *later], later)), \
            f"door's frame counter went back after {what} (door was restarted): {door_last} then {later[:10]}"
        assert states("door") == ["streaming"], f"door was restarted by {what}: {states('door')}"

    change(lobby(small, 5), "an fps change", 1)
    daemon.wait_for(lambda: states("lobby") == ["streaming", "stopped", "streaming"], 30,
                    f"lobby stopped and streaming again (states {states('lobby')})")

    change(lobby(large, 5), "a source change", 2)
    daemon.wait_for(lambda: len(details("lobby")) == 3, 30, "lobby streaming from the new source")
    assert states("lobby") == ["streaming", "stopped", "streaming", "stopped", "streaming"], states("lobby")
    assert details("lobby")[2].endswith("1920x1080"), details("lobby")

    code, _ = daemon.terminate(timeout=20)
    assert code == 0, daemon.stderr_text()[-2000:]
    assert "Traceback" not in daemon.stderr_text()


# ---------------------------------------------------------------------------------------------- stale targets

STEP = 0.25  # 4 observations a second; a multiple of 1/16 s, so time comparisons are exact in floating point
T0 = 1000.0
WALL0 = 1_764_470_000.0


def _face(track_id: int, emotion: str, x: float) -> FaceResult:
    probs = np.full(len(EMOTIONS), 0.2 / (len(EMOTIONS) - 1), np.float32)
    probs[EMOTIONS.index(emotion)] = 0.8
    detection = Detection(box=(x, 100.0, x + 80.0, 180.0), score=0.99, landmarks=np.zeros((5, 2), np.float32))
    return FaceResult(detection, EmotionScores(probs), track_id, None)


def _mapper() -> BehaviorMapper:
    # idle never comes (a face is always present anyway): only the pruning of stale targets can forget one
    return BehaviorMapper(BehaviorConfig(attention="all", dwell_ms=500.0, cooldown_ms=1500.0, min_confidence=0.45,
                                         idle_after_s=0))


def _run(mapper: BehaviorMapper, start: float, seconds: float,
         faces: Callable[[float], tuple[FaceResult, ...]]) -> tuple[float, list[Command]]:
    """Observations every STEP from `start` for `seconds`; the time after the last one and the commands."""
    commands: list[Command] = []
    t = start
    for _ in range(round(seconds / STEP)):
        commands += mapper.update(Observation("lobby", 0, T0 + t, WALL0 + t, (640, 480), faces(t)))
        t += STEP
    return t, commands


def _returning_face_is_answered(gap_s: float) -> bool:
    """Track 1 shows happy (a command), leaves for `gap_s` while track 2 stays in view, then comes back happy: is it
    answered with a new `happy` command?"""
    mapper = _mapper()
    stayer = _face(2, "sad", 400.0)
    t, first = _run(mapper, 0.0, 3.0, lambda t: (_face(1, "happy", 100.0), stayer))
    assert [(c.target, c.emotion) for c in first] == [(1, "happy"), (2, "sad")]
    t, during = _run(mapper, t, gap_s, lambda t: (stayer,))
    assert during == []
    _, back = _run(mapper, t, 3.0, lambda t: (_face(1, "happy", 100.0), stayer))
    assert all(c.target == 1 and c.emotion == "happy" for c in back), back
    return bool(back)


def test_a_target_gone_longer_than_forget_after_is_forgotten() -> None:
    """mapper.py forgets a target not seen for FORGET_AFTER_S (while its camera still sees other faces, so idle never
    comes): a track that comes back after that is a new target and its emotion is answered afresh. Back within the
    time, it is still remembered and what it shows is not re-sent. Without the pruning the target would stay
    remembered for ever and the returning `happy` would never be answered (and `attention: all` would keep every
    track id it ever saw)."""
    assert not _returning_face_is_answered(FORGET_AFTER_S / 2), "a target was forgotten before FORGET_AFTER_S"
    assert _returning_face_is_answered(FORGET_AFTER_S + 5.0), \
        f"a target gone for {FORGET_AFTER_S + 5:g} s (FORGET_AFTER_S {FORGET_AFTER_S:g}) was not forgotten"


def test_target_memory_stays_bounded_with_ever_new_track_ids() -> None:
    """`attention: all` with a new track id every observation (a tracker that keeps losing faces) for ten times
    FORGET_AFTER_S: the mapper keeps only the targets seen within about FORGET_AFTER_S, not every id it ever saw."""
    mapper = _mapper()
    ids = iter(range(1, 1_000_000))
    seconds = 10 * FORGET_AFTER_S
    _run(mapper, 0.0, seconds, lambda t: (_face(next(ids), "happy", 100.0),))
    seen = round(seconds / STEP)
    bound = (FORGET_AFTER_S + 2.0) / STEP + 1  # the ids of the last FORGET_AFTER_S, plus the once-a-second check
    remembered = len(mapper._targets)  # noqa: SLF001 - the memory the pruning exists to bound
    assert remembered <= bound, f"{remembered} of {seen} targets remembered: stale targets are not pruned"
