"""BehaviorMapper (pipeline/behavior/mapper.py): attention, dwell, cooldown, confidence, idle and rules, on a fake clock.

Observations are built by hand (the camera/clock boundary). Times are multiples of 1/16 s so every comparison with
dwell_ms / cooldown_ms is exact in binary floating point.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.behavior.mapper import STICKINESS, BehaviorMapper
from pipeline.config.app import BehaviorConfig, default_rules
from pipeline.core.types import (
    EMOTIONS,
    Command,
    Detection,
    EmotionScores,
    FaceResult,
    Observation,
)

STEP = 0.0625  # 16 fps
T0 = 1000.0  # monotonic clock origin
WALL0 = 1_764_470_000.0  # wall clock origin, deliberately far from T0
CAMERA = "lobby"
FRAME_SIZE = (640, 480)


def probs_for(emotion: str, confidence: float = 0.8) -> EmotionScores:
    rest = (1.0 - confidence) / (len(EMOTIONS) - 1)
    probs = np.full(len(EMOTIONS), rest, np.float32)
    probs[EMOTIONS.index(emotion)] = confidence
    return EmotionScores(probs)


def result(track_id: int | None, emotion: str, confidence: float = 0.8,
           box: tuple[float, float, float, float] = (270.0, 190.0, 370.0, 290.0),
           smoothed: EmotionScores | None = None) -> FaceResult:
    detection = Detection(box=box, score=0.99, landmarks=np.zeros((5, 2), np.float32))
    return FaceResult(detection, probs_for(emotion, confidence), track_id, smoothed)


def observation(frame: int, *faces: FaceResult, camera: str = CAMERA) -> Observation:
    t = frame * STEP
    return Observation(camera, frame, T0 + t, WALL0 + t, FRAME_SIZE, tuple(faces))


def mapper(**overrides: object) -> BehaviorMapper:
    settings: dict[str, object] = {"dwell_ms": 500.0, "cooldown_ms": 1500.0, "min_confidence": 0.45,
                                   "idle_after_s": 2.0}
    settings.update(overrides)
    return BehaviorMapper(BehaviorConfig(**settings))


def drive(m: BehaviorMapper, frames: range, faces_at) -> list[tuple[int, Command]]:  # type: ignore[no-untyped-def]
    """Feed one observation per frame (faces_at(frame) -> tuple of FaceResult); collect (frame, command)."""
    out = []
    for frame in frames:
        for command in m.update(observation(frame, *faces_at(frame))):
            out.append((frame, command))
    return out


# --- dwell, repetition, cooldown, confidence -----------------------------------------------------------------------


def test_emotion_held_shorter_than_dwell_gives_no_command() -> None:
    m = mapper()
    # happy for 8 frames = 0.4375 s < 0.5 s, then the face keeps flipping to a low-confidence reading
    got = drive(m, range(0, 8), lambda f: (result(1, "happy"),))
    got += drive(m, range(8, 80), lambda f: (result(1, "happy", 0.3),))
    assert got == []


def test_emotion_held_for_dwell_gives_exactly_one_command() -> None:
    m = mapper()
    got = drive(m, range(0, 160), lambda f: (result(1, "happy"),))  # 10 s of steady happiness
    assert [(frame, c.emotion, c.target, c.reason) for frame, c in got] == [(8, "happy", 1, "emotion")]
    # frame 8 is exactly dwell_ms after frame 0: "held >= dwell" fires there, not one frame later
    assert got[0][1].confidence == pytest.approx(0.8, abs=1e-4)


def test_same_emotion_is_not_repeated_after_a_brief_interruption() -> None:
    m = mapper()
    first = drive(m, range(0, 40), lambda f: (result(1, "happy"),))
    blip = drive(m, range(40, 41), lambda f: (result(1, "sad"),))
    again = drive(m, range(41, 120), lambda f: (result(1, "happy"),))
    assert [c.emotion for _, c in first] == ["happy"]
    assert blip == [] and again == []


def test_cooldown_delays_a_different_emotion_then_emits_it() -> None:
    m = mapper(dwell_ms=500.0, cooldown_ms=1500.0)
    # happy from frame 0 -> command at frame 8 (t=0.5); sad from frame 12 (t=0.75): dwell met at frame 20
    # (t=1.25), but the cooldown lasts until t=0.5+1.5=2.0, i.e. frame 32.
    got = drive(m, range(0, 60), lambda f: (result(1, "happy" if f < 12 else "sad"),))
    assert [(frame, c.emotion) for frame, c in got] == [(8, "happy"), (32, "sad")]
    assert got[1][1].ts == WALL0 + 32 * STEP


def test_below_min_confidence_no_command() -> None:
    m = mapper(min_confidence=0.6)
    assert drive(m, range(0, 100), lambda f: (result(1, "surprise", 0.55),)) == []
    m = mapper(min_confidence=0.6)
    got = drive(m, range(0, 100), lambda f: (result(1, "surprise", 0.65),))
    assert [c.emotion for _, c in got] == ["surprise"]


def test_dipping_below_min_confidence_restarts_the_dwell() -> None:
    m = mapper(min_confidence=0.6)
    # confident for 7 frames, one unsure frame at 7, confident again from 8: the dwell counts from frame 8
    got = drive(m, range(0, 40), lambda f: (result(1, "sad", 0.3 if f == 7 else 0.9),))
    assert [frame for frame, _ in got] == [16]


def test_smoothed_scores_take_precedence_over_raw_scores() -> None:
    m = mapper()
    got = drive(m, range(0, 20), lambda f: (result(1, "angry", smoothed=probs_for("happy", 0.7)),))
    assert [(c.emotion, c.confidence) for _, c in got] == [("happy", pytest.approx(0.7, abs=1e-4))]


def test_flicker_every_frame_never_commands() -> None:
    m = mapper()
    got = drive(m, range(0, 320), lambda f: (result(1, "happy" if f % 2 else "sad"),))  # 20 s
    assert got == []


def test_command_carries_wall_clock_ts_and_capture_time() -> None:
    m = mapper()
    got = drive(m, range(0, 10), lambda f: (result(3, "sad"),))
    (frame, command), = got
    assert command.ts == WALL0 + frame * STEP
    assert command.t_mono == T0 + frame * STEP
    assert command.camera == CAMERA


# --- attention ------------------------------------------------------------------------------------------------------


def square(cx: float, cy: float, side: float) -> tuple[float, float, float, float]:
    return (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)


def test_largest_attends_the_biggest_face() -> None:
    m = mapper(attention="largest")
    got = drive(m, range(0, 20), lambda f: (result(1, "sad", box=square(100, 100, 60)),
                                            result(2, "happy", box=square(400, 300, 120))))
    assert [(c.target, c.emotion) for _, c in got] == [(2, "happy")]


def test_largest_is_sticky_a_slightly_larger_face_does_not_steal_focus() -> None:
    m = mapper(attention="largest")
    a_side, small_b, big_b = 100.0, 100.0 * STICKINESS**0.5 * 0.97, 100.0 * STICKINESS**0.5 * 1.05
    # 1) A is the larger face and gets the attention
    got = drive(m, range(0, 16), lambda f: (result(1, "happy", box=square(150, 200, a_side)),
                                            result(2, "sad", box=square(450, 200, 90))))
    assert [(c.target, c.emotion) for _, c in got] == [(1, "happy")]
    # 2) B grows a little larger than A (area ratio 1.13 < STICKINESS): still A; A's new emotion is answered
    got = drive(m, range(16, 80), lambda f: (result(1, "happy" if f < 40 else "surprise", box=square(150, 200, a_side)),
                                             result(2, "sad", box=square(450, 200, small_b))))
    assert [(c.target, c.emotion) for _, c in got] == [(1, "surprise")]
    # 3) B becomes much larger (area ratio 1.32 > STICKINESS): B takes the focus and its emotion is answered
    got = drive(m, range(80, 120), lambda f: (result(1, "surprise", box=square(150, 200, a_side)),
                                              result(2, "sad", box=square(450, 200, big_b))))
    assert [(c.target, c.emotion) for _, c in got] == [(2, "sad")]


def test_center_attends_the_face_nearest_the_frame_centre() -> None:
    m = mapper(attention="center")
    # the centred face is the smaller one, so "largest" would pick the other
    got = drive(m, range(0, 20), lambda f: (result(1, "sad", box=square(320, 240, 60)),
                                            result(2, "happy", box=square(80, 80, 150))))
    assert [(c.target, c.emotion) for _, c in got] == [(1, "sad")]
    m = mapper(attention="largest")
    got = drive(m, range(0, 20), lambda f: (result(1, "sad", box=square(320, 240, 60)),
                                            result(2, "happy", box=square(80, 80, 150))))
    assert [(c.target, c.emotion) for _, c in got] == [(2, "happy")]


def test_all_commands_every_target() -> None:
    m = mapper(attention="all")
    got = drive(m, range(0, 20), lambda f: (result(1, "sad", box=square(100, 100, 60)),
                                            result(2, "happy", box=square(400, 300, 120)),
                                            result(3, "surprise", box=square(550, 100, 80))))
    assert sorted((c.target, c.emotion) for _, c in got) == [(1, "sad"), (2, "happy"), (3, "surprise")]
    assert {frame for frame, _ in got} == {8}  # all three after the same dwell, in the same update


# --- idle -----------------------------------------------------------------------------------------------------------


def test_idle_command_once_after_idle_after_s_without_faces() -> None:
    m = mapper(idle_after_s=2.0)
    got = drive(m, range(0, 16), lambda f: (result(1, "happy"),))  # last face at frame 15
    assert [c.emotion for _, c in got] == ["happy"]
    idle = drive(m, range(16, 120), lambda f: ())
    # 2 s = 32 frames after the last face (frame 15) -> frame 47, and never again
    assert [(frame, c.target, c.emotion, c.reason) for frame, c in idle] == [(47, None, "neutral", "idle")]
    neutral = default_rules()["neutral"]
    assert idle[0][1].expression.preset == neutral.expression.preset
    assert idle[0][1].tone.style == neutral.tone.style
    assert idle[0][1].ts == WALL0 + 47 * STEP
    # a face returns: after idle the avatar answers it again (state was reset), then a second idle follows
    back = drive(m, range(120, 140), lambda f: (result(1, "happy"),))
    assert [(frame, c.emotion) for frame, c in back] == [(128, "happy")]
    idle2 = drive(m, range(140, 200), lambda f: ())
    assert [(frame, c.reason) for frame, c in idle2] == [(139 + 32, "idle")]


def test_idle_disabled_with_zero() -> None:
    m = mapper(idle_after_s=0.0)
    drive(m, range(0, 16), lambda f: (result(1, "happy"),))
    assert drive(m, range(16, 400), lambda f: ()) == []


def test_idle_is_per_camera() -> None:
    m = mapper(idle_after_s=1.0)
    for frame in range(0, 40):
        assert all(c.reason != "idle" for c in m.update(observation(frame, result(1, "sad"), camera="hall")))
        commands = m.update(observation(frame, camera="lobby") if frame else observation(frame, result(1, "sad")))
        if frame == 16:
            assert [(c.camera, c.reason) for c in commands] == [("lobby", "idle")]
        else:
            assert all(c.reason != "idle" for c in commands)


# --- rules ----------------------------------------------------------------------------------------------------------


def test_command_uses_the_configured_rule() -> None:
    defaults = default_rules()
    m = mapper()
    (_, happy), = drive(m, range(0, 10), lambda f: (result(1, "happy"),))
    rule = defaults["happy"]
    assert (happy.expression.preset, happy.expression.weight, happy.expression.blend_ms) == (
        rule.expression.preset, rule.expression.weight, rule.expression.blend_ms)
    assert (happy.tone.style, happy.tone.pitch, happy.tone.rate, happy.tone.volume) == (
        rule.tone.style, rule.tone.pitch, rule.tone.rate, rule.tone.volume)


def test_custom_rule_replaces_one_emotion_and_keeps_the_other_defaults() -> None:
    custom = {"happy": {"expression": {"preset": "joy", "weight": 0.5, "blend_ms": 120},
                        "tone": {"style": "bubbly", "pitch": "+7%", "rate": "-3%", "volume": "+2dB",
                                 "style_degree": 1.5}}}
    m = mapper(rules=custom)
    assert set(m.cfg.rules) == set(EMOTIONS)
    got = drive(m, range(0, 60), lambda f: (result(1, "happy" if f < 12 else "sad"),))
    (_, happy), (_, sad) = got
    assert (happy.expression.preset, happy.expression.weight, happy.expression.blend_ms) == ("joy", 0.5, 120)
    assert (happy.tone.style, happy.tone.pitch, happy.tone.rate, happy.tone.volume, happy.tone.style_degree) == (
        "bubbly", "+7%", "-3%", "+2dB", 1.5)
    default_sad = default_rules()["sad"]
    assert sad.expression.preset == default_sad.expression.preset
    assert sad.tone.style == default_sad.tone.style
    assert sad.tone.volume == default_sad.tone.volume
