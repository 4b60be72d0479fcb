"""The detector on every Nth frame (detector.interval, issue 25 items 1-2), on the CPU with the real models: faces
followed between detections against a detection on the same frames, and the daemon with an interval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.config.loader import ConfigError
from tests.conftest import ROOT, data_path, run_cli
from tests.running_daemon import write_config


@pytest.fixture(scope="module")
def agreement(prepared_models: None) -> dict[str, dict[str, Any]]:
    """`bench interval`'s comparison at interval 3 on both clips, with the default models (the emotion figures
    depend on the emotion model: with mini-Xception woman2's smoothed agreement is 0.93, with the default 0.99)."""
    from pipeline.config.app import load_config
    from pipeline.inference.following import cpu_graph_follower
    from pipeline.inference.perception import Perception
    from pipeline.tools.bench_interval import frames_of, compare_intervals

    config = load_config(ROOT / "config" / "default.yaml")
    perception = Perception.from_config(config)
    graphs = cpu_graph_follower()  # the search made for GPU frames, on the CPU
    results = {}
    try:
        for name, most in (("woman2.mp4", 240), ("group_1080p.mp4", 10_000)):  # woman2's first 9.6 s (suite time)
            frames, fps = frames_of(data_path("video", name), most)
            results[name] = compare_intervals(perception, frames, fps, 3, tracking=config.tracking,
                                              behavior=config.behavior).summary()
            results[f"{name} on the follow graphs"] = compare_intervals(
                perception, frames, fps, 3, tracking=config.tracking, behavior=config.behavior,
                follower=graphs).summary()
        by_motion = config.tracking.model_copy(update={"follow_by": "motion"})  # as GPU frames under auto
        results["group_1080p.mp4 by motion"] = compare_intervals(perception, frames, fps, 3, tracking=by_motion,
                                                                 behavior=config.behavior).summary()
    finally:
        perception.close()
    student = Perception.from_config(config.model_copy(
        update={"emotion": config.emotion.model_copy(update={"model": "dlibface_student64"})}))
    try:  # the many-camera model on the crowd (frames: group_1080p.mp4's, the loop's last clip)
        results["group_1080p.mp4 student"] = compare_intervals(student, frames, fps, 3, tracking=config.tracking,
                                                               behavior=config.behavior).summary()
    finally:
        student.close()
    return results


def test_one_face_is_followed_within_the_detections_box_and_reads_the_same(agreement: dict) -> None:
    """woman2.mp4, one face turning and moving: every followed box overlaps the detection on its frame by IoU 0.8 or
    more (0.90 at worst when measured), and the smoothed emotion agrees on at least 97 % of them."""
    row = agreement["woman2.mp4"]
    assert row["compared"] >= 150 and row["without_reference"] == 0, row
    assert row["iou_min"] >= 0.8, row
    assert row["smoothed_agreement"] >= 0.97, row
    assert row["showing"] >= 100 and row["showing_agreement"] >= 0.97, row


def test_a_panning_crowd_is_followed_about_as_closely_as_the_detector_agrees_with_itself(agreement: dict) -> None:
    """group_1080p.mp4: several small faces moving up to 35 px a frame, the detector finding some only now and then.
    Only the faces the last detection found are followed, so nearly every followed face has a detection on its frame
    (a face the detector lost once drifted on its motion: 101 of 429 overlapped nothing). The boxes agree with the
    same frame's detection about as often as the detector agrees with itself on that frame shifted by 7 px (89.7 %
    within IoU 0.8; `bench interval --ceiling 7`, BENCHMARKS.md): 90.1 % when measured."""
    row = agreement["group_1080p.mp4"]
    assert row["compared"] >= 250 and row["without_reference"] <= 0.1 * row["compared"], row
    assert row["iou_median"] >= 0.85 and row["iou_at_least_0_8"] >= 0.85, row


def test_the_avatar_shows_a_followed_crowd_what_it_shows_with_every_frame_detected(agreement: dict) -> None:
    """group_1080p.mp4, each face as the avatar's target (behavior's thresholds, hysteresis and dwell): the emotion
    the avatar shows agrees with every-frame detection on 96.7 % of the followed observations when measured (92.6 %
    of the 135 where either shows one), while the detector on the frame shifted by 2 px agrees with itself on 84.2 %
    (70.3 %; `bench interval --ceiling 2`, BENCHMARKS.md). The top emotion a frame reads differs more often (65 %
    frame by frame, 90 % smoothed): the behaviour mapper does not act on a blip. The figure rests on ten tracks (two
    differ), so the bounds leave room for one short divergence more on another CPU; at interval 4 two more tracks
    part for good (72.6 % / 59.1 %), which they do not allow."""
    row = agreement["group_1080p.mp4"]
    assert row["showing"] >= 100, row
    assert row["shown_agreement"] >= 0.9 and row["showing_agreement"] >= 0.85, row


def test_the_crowds_smoothed_disagreements_lie_mostly_on_faces_the_classifier_finds_ambiguous(agreement: dict) -> None:
    """group_1080p.mp4: where every-frame detection reads a face clearly (its smoothed top two emotions at least 0.1
    apart, 208 of 303 observations when measured), the followed faces' smoothed top emotion agrees on 95.2 %, against
    90.4 % over all observations: most disagreements are near-ties that a crop a pixel off may swap (the detector on
    the frame shifted by 2 px: 97.5 % on clear readings, 85.9 % on all; BENCHMARKS.md)."""
    row = agreement["group_1080p.mp4"]
    assert 150 <= row["clear"] < row["compared"], row
    assert row["clear_agreement"] >= 0.93 and row["clear_agreement"] > row["smoothed_agreement"], row


def test_the_many_camera_model_reads_a_followed_crowd_as_every_frame_detection_does(agreement: dict) -> None:
    """group_1080p.mp4 with `dlibface_student64` (the README's model for many cameras), the same followed boxes: the
    smoothed top emotion agrees with every-frame detection on 94.1 % of the observations and on 98.2 % of the clear
    ones when measured (the default model: 90.4 % / 95.2 %): the student's top emotion moves less when a small face's
    crop moves by a pixel or two (`tools/crop_shift_check.py`: kept on 91.8 % of 159 faces under a 2 px move, the
    default model 77.4 %). Issue 25's 97 % holds on the clear readings (BENCHMARKS.md, "The crowd followed with the
    many-camera model")."""
    student, default = agreement["group_1080p.mp4 student"], agreement["group_1080p.mp4"]
    assert student["compared"] == default["compared"] and student["clear"] >= 150, (student, default)
    assert student["clear_agreement"] >= 0.97, student
    assert student["smoothed_agreement"] >= default["smoothed_agreement"] + 0.02, (student, default)


def test_a_crowd_followed_by_its_motion_alone_strays_from_the_detections(agreement: dict) -> None:
    """tracking.follow_by motion (what frames on the GPU get under auto): group_1080p.mp4's followed boxes within IoU
    0.8 of the same frame's detection 49.5 % against 90.1 % when each face is also found by its look, and what the
    avatar shows the same 84.5 % against 96.7 % (BENCHMARKS.md, "Following by look or by motion")."""
    look, motion = agreement["group_1080p.mp4"], agreement["group_1080p.mp4 by motion"]
    assert motion["compared"] == look["compared"], (motion, look)
    assert motion["iou_at_least_0_8"] <= 0.7 and look["iou_at_least_0_8"] - motion["iou_at_least_0_8"] >= 0.25
    assert motion["shown_agreement"] < look["shown_agreement"], (motion, look)


def test_faces_followed_on_the_follow_graphs_stay_as_close_to_the_detections(agreement: dict) -> None:
    """The follow graphs (inference.following: fixed-size templates, the correlation as ONNX, made to search GPU
    frames on the GPU), run here on the CPU: the crowd's followed boxes within IoU 0.8 of the same frame's detection
    90.8 % (90.1 % with OpenCV on the host), woman2's never below 0.8 and its smoothed emotion the same as every
    frame's (BENCHMARKS.md, "Faces on GPU frames searched on the GPU")."""
    crowd, host = agreement["group_1080p.mp4 on the follow graphs"], agreement["group_1080p.mp4"]
    assert crowd["compared"] == host["compared"], (crowd, host)
    assert crowd["iou_median"] >= 0.85 and crowd["iou_at_least_0_8"] >= 0.85, crowd
    assert crowd["iou_at_least_0_8"] >= agreement["group_1080p.mp4 by motion"]["iou_at_least_0_8"] + 0.25
    one = agreement["woman2.mp4 on the follow graphs"]
    assert one["iou_min"] >= 0.8 and one["smoothed_agreement"] >= 0.97, one


def test_interval_is_validated(tmp_path: Path) -> None:
    from pipeline.config.app import load_config

    path = tmp_path / "bad.yaml"
    path.write_text("cameras:\n  - {name: a, source: demo}\ndetector: {interval: 0}\n")
    with pytest.raises(ConfigError, match="interval"):
        load_config(path)


@pytest.mark.slow
@pytest.mark.parametrize("frame_path", ["opencv", "graph"])
def test_daemon_detects_every_third_frame_and_keeps_the_face_s_id(prepared_models: None, tmp_path: Path,
                                                                   frame_path: str) -> None:
    """A camera at interval 3, on both frame paths: two of every three observations ran no detector (detect 0 ms),
    the face keeps one track id throughout, every observation has its emotion, and a frame without detection keeps
    the head pose of the detection before it (not fitted again on moved landmarks)."""
    video = data_path("video", "woman_short.mp4")
    config = write_config(tmp_path / "interval.yaml", [f"{{name: lobby, source: '{video}', fps: 10}}"],
                          f"emotion: {{model: mini_xception_fer2013}}\ninference: {{frame_path: {frame_path}}}\n")
    config.write_text(config.read_text().replace("detector: {input_size: [320, 192]}",
                                                 "detector: {input_size: [320, 192], interval: 3}"))
    done = run_cli("run", "--config", str(config), "--duration", "8", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    observations = [e for e in map(json.loads, done.stdout.splitlines()) if e["type"] == "observation"]
    with_face = [o for o in observations if o["faces"]]
    assert len(with_face) >= 20, len(observations)
    detected = [o for o in with_face if o["latency_ms"]["detect"] > 0]
    assert 0.2 <= len(detected) / len(with_face) <= 0.5, (len(detected), len(with_face))
    assert len({f["track_id"] for o in with_face for f in o["faces"]}) == 1
    assert all(f["emotion"] and abs(sum(f["probs"].values()) - 1) < 1e-3 for o in with_face for f in o["faces"])
    heads = [(o["latency_ms"]["detect"] > 0, o["faces"][0].get("head")) for o in with_face]
    assert sum(head is not None for _, head in heads) >= 0.8 * len(heads)
    kept = [(head, heads[index - 1][1]) for index, (detected_here, head) in enumerate(heads)
            if index and not detected_here and heads[index - 1][0]]
    assert len(kept) >= 5 and all(head == before for head, before in kept), kept
    assert len({json.dumps(head) for detected_here, head in heads if detected_here}) > 1  # detections do fit anew
