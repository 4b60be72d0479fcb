"""Visitors arriving, leaving and looking (issue 27 item 4), and the greeting: the real daemon on a real clip in which
a face enters and leaves (woman2.mp4's frames between empty ones), plus the rules on a fake clock."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from pipeline.behavior.presence import Presence, VisitorTally
from pipeline.behavior.settings import PresenceConfig
from pipeline.core.types import Detection, EmotionScores, FaceResult, HeadPose, Observation
from tests.conftest import data_path, run_cli

FPS = 10
EMPTY_S, FACE_S = 1.5, 4.0


def _observation(t: float, tracks: list[int], looking: bool = False) -> Observation:
    faces = tuple(FaceResult(Detection((0, 0, 10, 10), 0.9, np.zeros((5, 2), np.float32)),
                             EmotionScores(np.full(7, 1 / 7, np.float32)), track, None,
                             HeadPose(0.0, 0.0, 0.0, looking)) for track in tracks)
    return Observation("lobby", int(t * 10), t, 1000.0 + t, (640, 360), faces, {})


def test_a_visitor_arrives_once_looks_and_leaves_with_its_dwell() -> None:
    presence = Presence(PresenceConfig(arrive_frames=3, leave_after_s=1.0, looking_frames=2))
    changes = []
    for k in range(40):  # 4 s at 10 fps; looks at the camera from 1 s to 2.5 s; a missed frame at 3 s
        t = k / 10
        changes += presence.update(_observation(t, [] if k == 30 else [7], looking=10 <= k < 25))
    for k in range(40, 70):  # gone
        changes += presence.update(_observation(k / 10, []))
    kinds = [c.kind for c in changes]
    assert kinds == ["arrived", "looking", "looking_away", "left"], kinds
    left = changes[-1]
    assert left.track_id == 7 and left.dwell_s == pytest.approx(3.9)
    assert presence.update(_observation(7.0, [8])) == []  # a glimpse is not a visit
    assert [c.kind for c in presence.camera_left("lobby")] == []  # track 8 never arrived


def test_visitors_per_hour_dwell_and_the_share_of_time_looked_at() -> None:
    """The status page's figures from the presence changes and the behaviour loop's clock: the visitor of the test
    above looked from 1.1 s to 2.6 s (looking_frames 2) of the 6.9 s the camera streamed; it stayed 3.9 s."""
    presence = Presence(PresenceConfig(arrive_frames=3, leave_after_s=1.0, looking_frames=2))
    tally = VisitorTally()
    for k in range(70):
        t = k / 10
        tracks = [7] if k < 40 and k != 30 else []
        for change in presence.update(_observation(t, tracks, looking=10 <= k < 25)):
            tally.record(change, t)
        tally.advance(t, presence.looking_cameras(), presence.cameras())
    row = tally.summary(6.9)["lobby"]
    assert row["visitors_last_hour"] == 1 and row["mean_dwell_s"] == pytest.approx(3.9)
    assert row["looked_at_share"] == pytest.approx(1.5 / 6.9, abs=0.002)
    assert tally.summary(6.9 + 3600.5)["lobby"]["visitors_last_hour"] == 0  # an hour later
    tally.forget("lobby")
    assert tally.summary(7.0) == {}


def test_the_voice_is_quieter_when_the_visitor_looks_away() -> None:
    """behavior.unwatched_volume: a command answering a face that does not look at the camera takes that volume;
    one that looks keeps its rule's, as does every command without the setting. Bad values are refused."""
    from pydantic import ValidationError

    from pipeline.behavior.mapper import BehaviorMapper
    from pipeline.behavior.settings import BehaviorConfig

    happy = np.zeros(7, np.float32)
    happy[3] = 1.0

    def first_command(cfg: BehaviorConfig, looking: bool) -> str:
        mapper = BehaviorMapper(cfg)
        for k in range(20):
            face = FaceResult(Detection((0, 0, 10, 10), 0.9, np.zeros((5, 2), np.float32)), EmotionScores(happy), 7,
                              None, HeadPose(0.0, 0.0, 0.0, looking))
            commands = mapper.update(Observation("lobby", k, k / 10, 1000.0 + k / 10, (640, 360), (face,), {}))
            if commands:
                return commands[0].tone.volume
        raise AssertionError("no command")

    quiet = BehaviorConfig(unwatched_volume="-6dB")
    rule_volume = quiet.rule_for("happy").tone.volume
    assert rule_volume != "-6dB"
    assert first_command(quiet, looking=False) == "-6dB"
    assert first_command(quiet, looking=True) == rule_volume
    assert first_command(BehaviorConfig(), looking=False) == rule_volume
    with pytest.raises(ValidationError, match="unwatched_volume"):
        BehaviorConfig(unwatched_volume="quiet please")


def _clip(path: Path) -> Path:
    """EMPTY_S of an empty room (a plain grey frame), FACE_S of woman2, EMPTY_S again."""
    capture = cv2.VideoCapture(str(data_path("video", "woman2.mp4")))
    frames = []
    while len(frames) < FACE_S * FPS * 2:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(frame)
    capture.release()
    face = frames[::2][: int(FACE_S * FPS)]
    empty = np.full_like(face[0], 90)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (face[0].shape[1], face[0].shape[0]))
    for frame in [empty] * int(EMPTY_S * FPS) + face + [empty] * int(EMPTY_S * FPS):
        writer.write(frame)
    writer.release()
    return path


@pytest.mark.slow
def test_the_daemon_sees_one_visitor_arrive_and_leave_and_greets_once(prepared_models: None, tmp_path: Path) -> None:
    clip = _clip(tmp_path / "visit.mp4")
    config = tmp_path / "config.yaml"
    config.write_text(f"cameras: [{{name: lobby, source: '{clip}', fps: {FPS}}}]\n"
                      "detector: {input_size: [320, 192]}\n"
                      "behavior: {on_arrival: {tone: {style: friendly}}, presence: {leave_after_s: 1.0}}\n"
                      "outputs: [{type: stdout, events: [presence, command]}]\n"
                      "server: {enabled: false}\n")
    done = run_cli("run", "--config", str(config), "--duration", "30", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    visits = [e for e in events if e["type"] == "presence" and e["event"] in ("arrived", "left")]
    assert [e["event"] for e in visits] == ["arrived", "left"], visits
    assert abs(visits[1]["dwell_s"] - FACE_S) <= 0.5, visits[1]
    greetings = [e for e in events if e["type"] == "command" and e["reason"] == "greeting"]
    assert len(greetings) == 1 and greetings[0]["tone"]["style"] == "friendly"
    assert greetings[0]["expression"]["preset"] == "happy"  # the rest of the greeting is the happy rule's
