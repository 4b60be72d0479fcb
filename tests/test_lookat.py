"""The avatar looks at the face it reads (issue 27, items 1-2): the direction of the attended face from the avatar's
eyes given each camera's placement, a critically damped follower, and the look in a real VMC stream.

Geometry and the follower are pure logic (the clock is passed in); the stream is the real daemon on a real clip
with a real OSC receiver. No timing threshold is judged here: settling time and stream rate are measured by
`python tools/lookat_check.py` (BENCHMARKS.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.behavior.lookat import angles, face_point
from pipeline.capture.settings import Placement
from pipeline.core.types import Detection, EmotionScores, FaceResult
from pipeline.outputs.expression_stream import GazeFollower
from pipeline.outputs.osc import VMC_EYE
from tests.conftest import run_cli
from tests.running_daemon import clip
from tests.test_sinks_osc_webhook import OscReceiver


def _face(cx: float, cy: float, width: float = 100.0) -> FaceResult:
    box = (cx - width / 2, cy - width / 2, cx + width / 2, cy + width / 2)
    return FaceResult(Detection(box, 0.9, np.zeros((5, 2), np.float32)), EmotionScores(np.full(7, 1 / 7, np.float32)))


def test_the_direction_of_a_face_follows_the_camera_placement() -> None:
    size = (1280, 720)
    ahead = Placement()
    assert angles(face_point(_face(640, 360), size, ahead)) == pytest.approx((0.0, 0.0), abs=1e-6)
    yaw, pitch = angles(face_point(_face(1280, 360), size, ahead))  # the right edge of a 70° camera
    assert yaw == pytest.approx(35.0, abs=0.01) and pitch == pytest.approx(0.0, abs=1e-6)
    assert angles(face_point(_face(640, 100), size, ahead))[1] > 10  # above the centre: up
    turned = Placement(yaw_deg=30.0, pitch_deg=-10.0)
    assert angles(face_point(_face(640, 360), size, turned)) == pytest.approx((30.0, -10.0), abs=1e-6)
    # a camera 1 m to the avatar's right, looking ahead: a face in its centre (at ~1.4 m) is to the avatar's right
    beside = Placement(offset_m=(1.0, 0.0, 0.0))
    x, y, z = face_point(_face(640, 360, width=100), size, beside)
    assert x == pytest.approx(1.0) and z == pytest.approx(640 / math.tan(math.radians(35)) * 0.16 / 100, rel=1e-6)
    assert 25 < angles((x, y, z))[0] < 40


def test_the_gaze_follows_a_step_without_overshoot_and_smooths_jitter() -> None:
    gaze = GazeFollower()
    gaze.sample(0.0)
    gaze.command(20.0, -6.0)
    path = [gaze.sample(k / 100.0) for k in range(1, 101)]
    yaws = [yaw for yaw, _ in path]
    assert all(a <= b <= 20.0 for a, b in zip(yaws, yaws[1:]))  # rises monotonically, never past the target
    assert abs(yaws[29] - 20.0) < 2.0 and abs(path[29][1] + 6.0) < 2.0  # within 2° 300 ms after a 20° step
    rng = np.random.default_rng(7)
    still, out = GazeFollower(), []
    for k in range(600):  # a still face whose detections jitter by 1° (σ), targets at 15 Hz, samples at 30 Hz
        if k % 2 == 0:
            still.command(float(rng.normal(5.0, 1.0)), 0.0)
        out.append(still.sample(k / 30.0)[0])
    assert np.std(out[60:]) < 0.6 * 1.0 and abs(np.mean(out[60:]) - 5.0) < 0.3


@pytest.mark.slow
def test_a_vmc_stream_looks_at_the_face_it_reads(prepared_models: None, tmp_path: Path) -> None:
    """The daemon on a clip of one face: every bundle after the first look carries /VMC/Ext/Set/Eye, whose direction
    stays within the targets' range (no overshoot) and follows them (same mean within 2°). And when the daemon stops
    (here --duration), the avatar is left neutral (issue 26: it kept its last expression), reason stop."""
    with OscReceiver() as receiver:
        config = tmp_path / "config.yaml"
        config.write_text(f"cameras: [{{name: lobby, source: '{clip()}', fps: 10, loop: true}}]\n"
                          "detector: {input_size: [320, 192]}\n"
                          "outputs:\n  - {type: stdout, events: [lookat, command]}\n"
                          f"  - {{type: osc, port: {receiver.port}, rate_hz: 30}}\n"
                          "server: {enabled: false}\n")
        done = run_cli("run", "--config", str(config), "--duration", "5", timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        packets = receiver.wait_for(10_000, timeout=0.5)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    looks = [e for e in events if e["type"] == "lookat"]
    commands = [e for e in events if e["type"] == "command"]
    assert any(c["emotion"] != "neutral" for c in commands), commands  # the clip's face made the avatar move
    assert commands[-1]["emotion"] == "neutral" and commands[-1]["expression"]["preset"] == "neutral", commands[-1]
    if commands[-2]["emotion"] != "neutral":
        assert commands[-1]["reason"] == "stop"
    faced = [e for e in looks if e["target"] is not None]
    assert faced, looks[:3]
    eyes = [args for _, messages in packets for address, args in messages if address == VMC_EYE]
    assert eyes and all(args[0] == 1 for args in eyes)
    streamed = [math.degrees(math.atan2(x, z)) for _, x, _, z in eyes][len(eyes) // 3:]  # after the first looks
    targets = [e["yaw"] for e in faced]
    assert min(targets) - 0.5 <= min(streamed) and max(streamed) <= max(targets) + 0.5, \
        (min(targets), max(targets), min(streamed), max(streamed))
    assert abs(float(np.mean(streamed)) - float(np.mean(targets[len(targets) // 3:]))) < 2.0


def test_an_arkit_rig_gets_its_eyes_as_eye_look_blendshapes() -> None:
    """names: arkit: the gaze also as eyeLook* blendshapes (the rig's left and right), in every bundle of a real VMC
    stream to a real receiver; looking 15° to the avatar's right and 5° down."""
    import time

    from pipeline.outputs.osc import ARKIT_EYES, VMC_VAL, OscOutput, OscSink, arkit_eye_weights

    from tests.test_name_sets_table import ARKIT_NAMES

    assert set(ARKIT_EYES) <= ARKIT_NAMES and len(ARKIT_EYES) == 8
    eyes = arkit_eye_weights(15.0, -5.0)
    assert eyes["eyeLookOutRight"] == eyes["eyeLookInLeft"] == 0.5
    assert eyes["eyeLookDownLeft"] == eyes["eyeLookDownRight"] == 0.2
    assert sum(eyes.values()) == pytest.approx(1.4) and arkit_eye_weights(0.0, 0.0) == dict.fromkeys(ARKIT_EYES, 0.0)
    assert arkit_eye_weights(-90.0, 0.0)["eyeLookOutLeft"] == 1.0  # saturates
    with OscReceiver() as receiver:
        sink = OscSink(OscOutput(port=receiver.port, names="arkit", rate_hz=50))
        sink.start()
        sink.offer({"type": "lookat", "camera": "c", "avatar": None, "stream": "c", "ts": 0.0, "target": 1,
                    "yaw": 15.0, "pitch": -5.0, "point": [0.0, 0.0, 1.0]})
        time.sleep(1.0)  # the follower settles (0.42 s to 1 %); only the last bundle is read
        sink.close()
        packets = receiver.wait_for(10)
    values = {args[0]: args[1] for address, args in packets[-1][1] if address == VMC_VAL}
    assert set(ARKIT_EYES) <= set(values)
    assert values["eyeLookOutRight"] == pytest.approx(0.5, abs=0.02) and values["eyeLookInRight"] == 0.0
    assert values["eyeLookDownLeft"] == pytest.approx(0.2, abs=0.02) and values["eyeLookUpLeft"] == 0.0


def test_the_head_bone_turns_by_its_share_of_the_look() -> None:
    """head_turn 0.4: every bundle of a real VMC stream carries /VMC/Ext/Bone/Pos Head whose rotation, applied to the
    head's forward axis, points 0.4 of the way to the look (Unity's axes: yaw towards +x, pitch up towards +y);
    without head_turn no bone message is sent."""
    import time

    from pipeline.outputs.osc import VMC_BONE, OscOutput, OscSink

    def forward(qx: float, qy: float, qz: float, qw: float) -> np.ndarray:  # the rotated +z axis
        return np.array([2 * (qx * qz + qw * qy), 2 * (qy * qz - qw * qx), 1 - 2 * (qx * qx + qy * qy)])

    bones = {}
    for turn in (0.4, 0.0):
        with OscReceiver() as receiver:
            sink = OscSink(OscOutput(port=receiver.port, rate_hz=50, head_turn=turn))
            sink.start()
            sink.offer({"type": "lookat", "camera": "c", "avatar": None, "stream": "c", "ts": 0.0, "target": 1,
                        "yaw": 30.0, "pitch": 10.0, "point": [0.5, 0.2, 1.0]})
            time.sleep(1.0)  # the follower settles; only the last bundle is read
            sink.close()
            packets = receiver.wait_for(10)
        bones[turn] = [args for address, args in packets[-1][1] if address == VMC_BONE]
    assert bones[0.0] == []
    (name, px, py, pz, *rotation), = bones[0.4]
    assert name == "Head" and (px, py, pz) == pytest.approx((0.0, 0.06, 0.0))
    assert sum(v * v for v in rotation) == pytest.approx(1.0, abs=1e-4)
    x, y, z = forward(*rotation)
    assert math.degrees(math.atan2(x, z)) == pytest.approx(12.0, abs=0.2)  # 0.4 of 30° to the right
    assert math.degrees(math.atan2(y, math.hypot(x, z))) == pytest.approx(4.0, abs=0.2)  # 0.4 of 10° up


def test_the_tile_marks_the_face_the_avatar_looks_at() -> None:
    """The status page's preview frames the attended face a second time (white, outside its box) and labels it; a
    track that is not in the frame marks nothing."""
    from pipeline.core.types import Observation
    from pipeline.service.preview import ATTENDED_COLOUR, annotate

    image = np.full((360, 640, 3), 60, np.uint8)
    faces = (FaceResult(Detection((100, 100, 200, 200), 0.9, np.zeros((5, 2), np.float32)),
                        EmotionScores(np.full(7, 1 / 7, np.float32)), 7),
             FaceResult(Detection((400, 100, 500, 200), 0.9, np.zeros((5, 2), np.float32)),
                        EmotionScores(np.full(7, 1 / 7, np.float32)), 8))
    obs = Observation("lobby", 1, 0.0, 0.0, (640, 360), faces, {})
    plain, marked, absent = (annotate(image, obs, attended=a) for a in (None, 7, 9))
    assert np.array_equal(plain, absent)
    changed = np.argwhere((plain != marked).any(axis=2))
    assert len(changed), "nothing marked"
    assert (marked[205, 100:200] == ATTENDED_COLOUR).all()  # the outer frame below face 7's box
    assert changed[:, 1].max() < 400  # face 8 (x 400..500) untouched
