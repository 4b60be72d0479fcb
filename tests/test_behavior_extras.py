"""BehaviorMapper additions: hysteresis (exit_confidence), room mood; the SSML helper; their config validation.

Same fake clock as tests/test_behavior.py (observation timestamps, multiples of 1/16 s): dwell 500 ms = 8 frames,
cooldown 1500 ms = 24 frames.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from pipeline.behavior.mapper import room_scores
from pipeline.config.app import (
    BehaviorConfig,
    ConfigError,
    ToneConfig,
    default_rules,
    parse_config,
)
from pipeline.core.types import EMOTIONS, Detection, EmotionScores, FaceResult, Tone
from pipeline.outputs.ssml import MSTTS_NS, SSML_NS, tone_to_ssml
from tests.test_behavior import STEP, WALL0, drive, mapper, observation, result, square


def mix(**probs: float) -> EmotionScores:
    """A probability vector with the given emotions; the rest of the mass spread evenly over the others."""
    rest = (1.0 - sum(probs.values())) / (len(EMOTIONS) - len(probs))
    return EmotionScores(np.array([probs.get(e, rest) for e in EMOTIONS], np.float32))


def face(track_id: int | None, scores: EmotionScores, side: float = 100.0, cx: float = 320.0) -> FaceResult:
    detection = Detection(box=square(cx, 240, side), score=0.99, landmarks=np.zeros((5, 2), np.float32))
    return FaceResult(detection, scores, track_id, smoothed=scores)


# --- hysteresis -----------------------------------------------------------------------------------------------------


def test_shown_emotion_is_held_while_above_exit_then_a_dwelt_challenger_takes_over() -> None:
    m = mapper(min_confidence=0.45, exit_confidence=0.35)
    happy, contested, faded = mix(happy=0.8), mix(neutral=0.5, happy=0.4), mix(neutral=0.6, happy=0.3)
    got = drive(m, range(0, 16), lambda f: (face(1, happy),))
    assert [(frame, c.emotion) for frame, c in got] == [(8, "happy")]
    # neutral is the top emotion above min_confidence for 40 frames (2.5 s >> dwell), but happy stays >= 0.35: held
    assert drive(m, range(16, 56), lambda f: (face(1, contested),)) == []
    # happy falls below exit_confidence: neutral has dwelt since frame 16, so it is answered at once
    got = drive(m, range(56, 80), lambda f: (face(1, faded),))
    assert [(frame, c.emotion, c.confidence) for frame, c in got] == [(56, "neutral", pytest.approx(0.6, abs=1e-4))]


def test_without_hysteresis_the_same_contest_switches_after_the_dwell() -> None:
    m = mapper(min_confidence=0.45, exit_confidence=0.45)
    drive(m, range(0, 16), lambda f: (face(1, mix(happy=0.8)),))
    got = drive(m, range(16, 56), lambda f: (face(1, mix(neutral=0.5, happy=0.4)),))
    assert [(frame, c.emotion) for frame, c in got] == [(32, "neutral")]  # frame 16 + 8 frames dwell; cooldown over


def test_exit_threshold_is_inclusive() -> None:
    m = mapper(min_confidence=0.5, exit_confidence=0.375)  # 0.375 is exact in float32
    drive(m, range(0, 16), lambda f: (face(1, mix(sad=0.8)),))
    assert drive(m, range(16, 60), lambda f: (face(1, mix(angry=0.5, sad=0.375)),)) == []
    got = drive(m, range(60, 70), lambda f: (face(1, mix(angry=0.5, sad=0.37)),))
    assert [(frame, c.emotion) for frame, c in got] == [(60, "angry")]


def test_gone_alone_sends_nothing_and_a_new_emotion_still_needs_its_dwell() -> None:
    m = mapper()
    drive(m, range(0, 16), lambda f: (face(1, mix(happy=0.8)),))
    # happy fades below exit, nothing reaches min_confidence: the avatar keeps its face, no command
    assert drive(m, range(16, 60), lambda f: (face(1, mix(happy=0.2, neutral=0.3)),)) == []
    got = drive(m, range(60, 90), lambda f: (face(1, mix(neutral=0.7)),))
    assert [(frame, c.emotion) for frame, c in got] == [(68, "neutral")]


def test_shown_emotion_coming_back_after_fading_is_not_repeated() -> None:
    m = mapper()
    drive(m, range(0, 16), lambda f: (face(1, mix(surprise=0.8)),))
    assert drive(m, range(16, 60), lambda f: (face(1, mix(surprise=0.1)),)) == []
    assert drive(m, range(60, 120), lambda f: (face(1, mix(surprise=0.9)),)) == []


def test_hysteresis_is_per_target_with_attention_all() -> None:
    m = mapper(attention="all")
    drive(m, range(0, 16), lambda f: (face(1, mix(happy=0.8), cx=150), face(2, mix(sad=0.8), cx=450)))
    # face 1's happy still >= exit (held); face 2's sad has faded: only face 2 switches to neutral
    got = drive(m, range(16, 60), lambda f: (face(1, mix(neutral=0.5, happy=0.4), cx=150),
                                             face(2, mix(neutral=0.6, sad=0.1), cx=450)))
    assert [(frame, c.target, c.emotion) for frame, c in got] == [(32, 2, "neutral")]  # 8 + 24 frames cooldown


def test_exit_confidence_config() -> None:
    assert BehaviorConfig().exit_confidence == 0.35
    assert BehaviorConfig(min_confidence=0.3).exit_confidence == 0.3  # left out: follows a lower enter threshold
    assert BehaviorConfig(min_confidence=0.6, exit_confidence=0.6).exit_confidence == 0.6
    text = "cameras:\n  - {name: a, source: demo}\nbehavior:\n  min_confidence: 0.4\n  exit_confidence: 0.5\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "site.yaml", env={})
    (issue,) = caught.value.issues
    assert (issue.line, issue.key) == (5, "behavior.exit_confidence")
    assert "must not exceed min_confidence (0.4)" in issue.format() and "(got 0.5)" in issue.format()


# --- room mood ------------------------------------------------------------------------------------------------------


def test_room_mood_weights_faces_by_area_and_the_larger_face_wins() -> None:
    big, small = 120.0, 60.0
    m = mapper(attention="room")
    got = drive(m, range(0, 40), lambda f: (face(1, mix(happy=0.8), side=big, cx=150),
                                            face(2, mix(sad=0.8), side=small, cx=450)))
    assert len(got) == 1
    frame, command = got[0]
    expected = (0.8 * big**2 + 0.2 / 6 * small**2) / (big**2 + small**2)  # happy's area-weighted mean
    assert (frame, command.target, command.emotion, command.reason) == (8, None, "happy", "emotion")
    assert command.confidence == pytest.approx(expected, abs=1e-4)
    # same faces, sizes swapped: the sad face is now the larger one and the room turns sad
    m = mapper(attention="room")
    got = drive(m, range(0, 40), lambda f: (face(1, mix(happy=0.8), side=small, cx=150),
                                            face(2, mix(sad=0.8), side=big, cx=450)))
    assert [(c.target, c.emotion) for _, c in got] == [(None, "sad")]


def test_room_mood_is_one_command_per_camera_whatever_the_number_of_faces() -> None:
    m = mapper(attention="room")
    out = []
    for frame in range(0, 40):
        faces = tuple(face(track, mix(surprise=0.7), side=80, cx=100 + 120 * track) for track in range(1, 5))
        for camera in ("lobby", "hall"):
            out += [(frame, c.camera, c.target) for c in m.update(observation(frame, *faces, camera=camera))]
    assert out == [(8, "lobby", None), (8, "hall", None)]


def test_room_mood_of_an_evenly_split_room_is_no_command() -> None:
    m = mapper(attention="room")  # two equal faces, happy vs sad: each 0.42 in the mean, under min_confidence
    assert drive(m, range(0, 60), lambda f: (face(1, mix(happy=0.8), cx=150), face(2, mix(sad=0.8), cx=450))) == []


def test_room_mood_uses_smoothed_scores_and_keeps_idle() -> None:
    m = mapper(attention="room", idle_after_s=1.0)
    # raw scores say angry, smoothed say happy: the smoothed ones count (as for single faces)
    got = drive(m, range(0, 16), lambda f: (result(1, "angry", smoothed=mix(happy=0.7)),
                                            result(2, "angry", smoothed=mix(happy=0.7), box=square(100, 100, 50))))
    assert [(c.target, c.emotion) for _, c in got] == [(None, "happy")]
    idle = drive(m, range(16, 40), lambda f: ())
    assert [(frame, c.target, c.reason) for frame, c in idle] == [(31, None, "idle")]
    assert idle[0][1].ts == WALL0 + 31 * STEP


def test_room_scores_of_degenerate_boxes_is_the_plain_mean() -> None:
    flat = Detection(box=(10.0, 10.0, 10.0, 10.0), score=0.9, landmarks=np.zeros((5, 2), np.float32))
    scores = room_scores([FaceResult(flat, mix(happy=0.8)), FaceResult(flat, mix(happy=0.4))])
    assert scores.emotion == "happy" and scores.confidence == pytest.approx(0.6, abs=1e-6)


def test_room_mood_with_hysteresis() -> None:
    m = mapper(attention="room")
    drive(m, range(0, 16), lambda f: (face(1, mix(happy=0.8)),))
    # a second, equally large neutral face joins: room = neutral 0.5 / happy 0.4 -> happy held
    both = lambda f: (face(1, mix(happy=0.7, neutral=0.2)), face(2, mix(neutral=0.8, happy=0.1), cx=500))  # noqa: E731
    assert drive(m, range(16, 60), both) == []


# --- rules and SSML ---------------------------------------------------------------------------------------------------


def test_default_rules_cover_every_emotion_with_vrm_presets() -> None:
    rules = default_rules()
    assert set(rules) == set(EMOTIONS)
    vrm = {"happy", "angry", "sad", "relaxed", "surprised", "neutral"}
    assert {r.expression.preset for r in rules.values()} <= vrm  # no fear/disgust preset in VRM 1.0
    assert rules["fear"].expression.preset != "fear" and rules["disgust"].expression.preset != "disgust"
    assert rules["happy"].expression.preset == "happy" and rules["surprise"].expression.preset == "surprised"


def _parse(ssml: str) -> ET.Element:
    return ET.fromstring(ssml)


def test_tone_to_ssml_with_style_and_voice() -> None:
    tone = Tone(style="cheerful", pitch="+5%", rate="+5%", volume="-3dB", style_degree=1.5)
    text = 'Hi <there> & "welcome" it\'s me'
    root = _parse(tone_to_ssml(tone, text, voice="en-US-JennyNeural"))
    assert root.tag == f"{{{SSML_NS}}}speak"
    assert root.get("version") == "1.0" and root.get("{http://www.w3.org/XML/1998/namespace}lang") == "en-US"
    (voice,) = list(root)
    assert voice.tag == f"{{{SSML_NS}}}voice" and voice.get("name") == "en-US-JennyNeural"
    (express,) = list(voice)
    assert express.tag == f"{{{MSTTS_NS}}}express-as" and MSTTS_NS == "https://www.w3.org/2001/mstts"
    assert (express.get("style"), express.get("styledegree")) == ("cheerful", "1.5")
    (prosody,) = list(express)
    assert prosody.tag == f"{{{SSML_NS}}}prosody"
    assert (prosody.get("pitch"), prosody.get("rate"), prosody.get("volume")) == ("+5%", "+5%", "-3dB")
    assert prosody.text == text  # escaped on the way in, identical once parsed


def test_tone_to_ssml_without_style_or_voice_and_from_config() -> None:
    root = _parse(tone_to_ssml(Tone(style="", pitch="low", rate="0.9", volume="soft"), "a < b"))
    (prosody,) = list(root)
    assert prosody.tag == f"{{{SSML_NS}}}prosody" and prosody.text == "a < b"
    assert (prosody.get("pitch"), prosody.get("rate"), prosody.get("volume")) == ("low", "0.9", "soft")
    # the config's ToneConfig works as well, and a voice name with quotes stays one attribute
    sad = default_rules()["sad"].tone
    root = _parse(tone_to_ssml(sad, "I'm sorry.", voice='odd "name"'))
    assert root[0].get("name") == 'odd "name"'
    assert root[0][0].get("style") == sad.style and root[0][0][0].get("volume") == sad.volume
    assert isinstance(sad, ToneConfig)
