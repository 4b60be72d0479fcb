"""`bench interval`: what running the detector on every Nth frame (detector.interval) costs in accuracy and saves in
CPU, against every frame, on the same frames of a video, in one run.

Every frame is analysed twice, by two trackers fed from one detector: the reference detects every frame; the other
detects every Nth and, between, classifies the faces its tracker follows (`IouTracker.predict` with the frame), as a
camera worker does (`--set tracking.follow_by=motion`: by their motion alone, as frames on the GPU are followed
under `auto`). On each frame without detection each followed face is compared with the reference's detection it
overlaps most on the same frame: the box's IoU, and whether the top emotion agrees, per frame and after each
track's smoothing (what behaviour reads), and whether the avatar would show the same emotion for the face ("shown":
the behaviour mapper's thresholds, hysteresis and dwell applied to each track as if every face were a target;
nothing shown by both counts as the same; "showing": the same, among the observations where either shows one;
"tracks": for how many of the followed tracks the avatar showed another emotion at least once: the mapper decides
per track and holds its decision, so on a short clip a few tracks make the figure; "clear": the smoothed agreement
among the observations whose reference reading is clear, its top two emotions at least CLEAR_MARGIN apart: on a
face read as, say, 0.34 neutral and 0.31 sad, any crop a pixel off may swap the two, so this says how much of the
disagreement lies on faces the classifier itself finds ambiguous).
Faces the detector did not find on that frame cannot be compared and are counted apart. CPU: the process time of
the two ways of analysing a frame, summed over the video; "follow ms": the skipping way's tracker alone (keeping each
detected face's look, finding the followed faces) per followed face.

`--ceiling PX`: how far the detector agrees with itself, the most any follower can reach. Every frame is also
analysed shifted by PX pixels (the same picture, as a camera a hair to the side sees it), tracked and smoothed like
the reference, and on the compared frames its faces are compared with the reference's the same way. On small faces
neither the boxes nor the top emotion are stable under such a shift (group_1080p.mp4, BENCHMARKS.md), so the followed
faces are read against this ceiling.

`--follower graph`: the look is searched by the follow graphs (inference.following: the search made to run on GPU
frames, where they are), here on ONNX Runtime's CPU provider, so its accuracy is measured where OpenCV's is.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from pipeline.behavior.mapper import TargetState, decide
from pipeline.config.app import BehaviorConfig, TrackingConfig, load_config
from pipeline.core.types import Detection, EmotionScores
from pipeline.inference.following import cpu_graph_follower
from pipeline.inference.perception import Perception
from pipeline.service.parts import tracker_for
from pipeline.tools.bench_engine import video_frames
from pipeline.tools.bench_pipeline import add_set_arg, with_overrides
from pipeline.tools.usage import UsageError
from pipeline.vision.follow import HOST_FOLLOWER, Follower
from pipeline.vision.track import IouTracker, box_iou

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# what --ceiling reports
CEILING_FIGURES = ("iou_at_least_0_8", "emotion_agreement", "smoothed_agreement", "clear_agreement",
                   "shown_agreement", "showing_agreement", "tracks", "tracks_shown_differently")
CLEAR_MARGIN = 0.1  # a reference reading is clear when its smoothed top two probabilities are this far apart


def interval_list(text: str) -> list[int]:
    """--interval's value: one N or a comma-separated list, each at least 2 (1 is the reference itself)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers of 2 or more, e.g. 3 or 2,3,5")
    return values


def supersample_count(text: str) -> int:
    """--supersample's value: a whole number from 1 to 4."""
    if not text.isdigit() or not 1 <= int(text) <= 4:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1 to 4")
    return int(text)


def add_interval_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--video", type=Path, action="append", required=True, metavar="FILE",
                        help="video file, every frame analysed both ways; repeatable")
    parser.add_argument("--interval", type=interval_list, default=[3], metavar="N[,N...]",
                        help="detect every Nth frame (default 3); a list (2,3,5) compares each with every frame")
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "config" / "default.yaml")
    parser.add_argument("--json", type=Path, default=None)
    add_set_arg(parser)
    parser.add_argument("--ceiling", type=int, default=None, metavar="PX",
                        help="also compare the detector with itself on each frame shifted right and down by PX "
                             "pixels: the most any follower can agree (one more analysis per frame)")
    parser.add_argument("--follower", choices=("host", "graph"), default="host",
                        help="how faces are found by their look: host (OpenCV, as the daemon does) or graph (the "
                             "follow graphs made to search GPU frames on the GPU, here on the CPU)")
    parser.add_argument("--supersample", type=supersample_count, default=None, metavar="K",
                        help="with --follower graph: K x K bilinear samples averaged per template pixel (default: "
                             "the daemon's, modelprep.follow_graphs.FollowGeometry)")


@dataclass
class Agreement:
    """The comparison of one video: IoUs of followed boxes, emotion agreement, faces without a reference, CPU."""

    ious: list[float] = field(default_factory=list)
    same_raw: int = 0
    same_smoothed: int = 0
    clear: int = 0  # compared observations whose reference reading is clear (CLEAR_MARGIN)
    same_clear: int = 0
    same_shown: int = 0
    showing: int = 0  # compared observations where either way's avatar shows an emotion for the face
    same_showing: int = 0
    tracks: set[int] = field(default_factory=set)  # the followed tracks compared
    tracks_shown_differently: set[int] = field(default_factory=set)  # ... of which the avatar showed another emotion
    without_reference: int = 0
    cpu_s: dict[str, float] = field(default_factory=lambda: {"every": 0.0, "interval": 0.0, "follow": 0.0})
    followed_faces: int = 0  # faces the skipping way's tracker followed on frames without detection
    frames: int = 0
    ceiling: Agreement | None = None  # --ceiling: the detector against itself on the shifted frames

    def summary(self) -> dict[str, Any]:
        ious = np.asarray(self.ious) if self.ious else np.zeros(1)
        compared = max(len(self.ious), 1)
        return {"frames": self.frames, "compared": len(self.ious), "without_reference": self.without_reference,
                "iou_min": round(float(ious.min()), 3), "iou_p5": round(float(np.percentile(ious, 5)), 3),
                "iou_median": round(float(np.median(ious)), 3),
                "iou_at_least_0_8": round(float((ious >= 0.8).mean()), 4),
                "emotion_agreement": round(self.same_raw / compared, 4),
                "smoothed_agreement": round(self.same_smoothed / compared, 4), "clear": self.clear,
                "clear_agreement": round(self.same_clear / max(self.clear, 1), 4),
                "shown_agreement": round(self.same_shown / compared, 4), "showing": self.showing,
                "showing_agreement": round(self.same_showing / max(self.showing, 1), 4),
                "tracks": len(self.tracks), "tracks_shown_differently": len(self.tracks_shown_differently),
                "cpu_ratio": round(self.cpu_s["interval"] / max(self.cpu_s["every"], 1e-9), 3),
                "follow_ms_per_face": round(1e3 * self.cpu_s["follow"] / max(self.followed_faces, 1), 3),
                **(self.ceiling.as_ceiling() if self.ceiling is not None else {})}

    def as_ceiling(self) -> dict[str, Any]:
        """This comparison as the ceiling of another (the detector against itself on shifted frames): its box and
        emotion agreement under `ceiling_` names."""
        mine = self.summary()
        return {f"ceiling_{key}": mine[key] for key in CEILING_FIGURES}


@dataclass(frozen=True)
class Reading:
    """What one way made of a track after an observation: its smoothed top emotion, how far that is ahead of the
    second, and the emotion the avatar shows for it (None: none)."""

    emotion: str
    margin: float
    shown: str | None


@dataclass
class _Way:
    """One way of analysing the video: its tracker, and the behaviour mapper's decision state of each of its tracks
    (every face a target, as `behavior.attention: all`), so that what the avatar would show can be compared too."""

    tracker: IouTracker
    behavior: BehaviorConfig
    targets: dict[int, TargetState] = field(default_factory=dict)

    def read(self, ids: list[int], scores: list[EmotionScores], now: float) -> dict[int, Reading]:
        """Each track's smoothed reading and the emotion the avatar shows for it after this observation."""
        read = {}
        for track_id, score in zip(ids, scores):
            smoothed = self.tracker.smooth(track_id, score, now)
            state = self.targets.setdefault(track_id, TargetState())
            decide(state, self.behavior, now, smoothed)
            top_two = np.sort(smoothed.probs)[-2:]
            read[track_id] = Reading(smoothed.emotion, float(top_two[1] - top_two[0]), state.shown)
        return read


Analysed = tuple[list[Detection], list[EmotionScores], dict[int, Reading], list[int]]


def _compare(result: Agreement, followed: Analysed, reference: Analysed) -> None:
    faces, scores, read, ids = followed
    ref_faces, ref_scores, ref_read, ref_ids = reference
    for face, score, track_id in zip(faces, scores, ids):
        overlaps = [box_iou(face.box, ref.box) for ref in ref_faces]
        best = int(np.argmax(overlaps)) if overlaps else -1
        if best < 0 or overlaps[best] <= 0.0:
            result.without_reference += 1
            continue
        result.ious.append(overlaps[best])
        result.same_raw += score.emotion == ref_scores[best].emotion
        mine, ref = read[track_id], ref_read[ref_ids[best]]
        smoothed, shown, ref_smoothed, ref_shown = mine.emotion, mine.shown, ref.emotion, ref.shown
        result.same_smoothed += smoothed == ref_smoothed
        if ref.margin >= CLEAR_MARGIN:
            result.clear += 1
            result.same_clear += smoothed == ref_smoothed
        result.same_shown += shown == ref_shown
        result.tracks.add(track_id)
        if shown != ref_shown:
            result.tracks_shown_differently.add(track_id)
        if shown is not None or ref_shown is not None:
            result.showing += 1
            result.same_showing += shown == ref_shown


def _shifted(perception: Perception, frame: np.ndarray, shift: int) -> tuple[list[Detection], list[EmotionScores]]:
    """The faces of `frame` moved right and down by `shift` pixels (border repeated), their boxes moved back."""
    move = np.array([[1, 0, shift], [0, 1, shift]], dtype=np.float32)
    shifted = cv2.warpAffine(frame, move, (frame.shape[1], frame.shape[0]), borderMode=cv2.BORDER_REPLICATE)
    faces, scores, _ = perception.analyze(shifted)
    back = [Detection(tuple(v - shift for v in face.box), face.score,  # type: ignore[arg-type]
                      np.asarray(face.landmarks, np.float32) - shift) for face in faces]
    return back, scores


def _tracked(result: Agreement, tracker: IouTracker, faces: list[Detection], now: float,
             frame: np.ndarray, follower: Follower) -> list[int]:
    """The skipping way's detection frame: its tracker takes the faces (and, following by look, their templates);
    the tracker's CPU is counted as following's."""
    started = time.process_time()
    ids = tracker.update(faces, now, tracker.searchable(frame, follower), follower)
    result.cpu_s["follow"] += time.process_time() - started
    return ids


def _followed(result: Agreement, tracker: IouTracker, now: float,
              frame: np.ndarray, follower: Follower) -> tuple[list[int], list[Detection]]:
    """The skipping way's frame without detection: the faces its tracker follows there, and the CPU that took."""
    started = time.process_time()
    predicted = tracker.predict(now, tracker.searchable(frame, follower), follower)
    result.cpu_s["follow"] += time.process_time() - started
    result.followed_faces += len(predicted)
    return [i for i, _ in predicted], [f for _, f in predicted]


def compare_intervals(perception: Perception, frames: list[np.ndarray], fps: float, interval: int,
                      ceiling: int | None = None, tracking: TrackingConfig | None = None,
                      behavior: BehaviorConfig | None = None, follower: Follower = HOST_FOLLOWER) -> Agreement:
    """Both ways over `frames` (see the module docstring). The detection frames of the skipping way reuse the
    reference's detection and are charged its cost. `ceiling`: the frames shifted by that many pixels too.
    `tracking`: the config's tracking section (overlap, age, smoothing), as a camera worker's tracker has it;
    `behavior`: the behavior section whose thresholds decide what the avatar shows; `follower`: how the skipping
    way finds faces by their look (`--follower`)."""
    every, skipping, shifted = (_Way(tracker_for(tracking or TrackingConfig(), follow), behavior or BehaviorConfig())
                                for follow in (False, True, False))
    followed = 0  # frames without detection so far (emotion.flip_followed: alternate)
    result = Agreement(frames=len(frames), ceiling=Agreement(frames=len(frames)) if ceiling is not None else None)
    for index, frame in enumerate(frames):
        now = index / fps
        started = time.process_time()
        faces, scores, _ = perception.analyze(frame)
        ids = every.tracker.update(faces, now)
        cost = time.process_time() - started
        result.cpu_s["every"] += cost
        reference = (faces, scores, every.read(ids, scores, now), ids)
        started = time.process_time()
        if index % interval == 0:
            own_ids = _tracked(result, skipping.tracker, faces, now, frame, follower)
            own_faces, own_scores = faces, scores
            result.cpu_s["interval"] += cost
        else:
            own_ids, own_faces = _followed(result, skipping.tracker, now, frame, follower)
            own_scores = perception.classify_faces(frame, own_faces, 0.0, followed=True, turn=followed)[1]
            followed += 1
        result.cpu_s["interval"] += time.process_time() - started
        read = skipping.read(own_ids, own_scores, now)
        if result.ceiling is not None and ceiling is not None:
            moved_faces, moved_scores = _shifted(perception, frame, ceiling)
            moved_ids = shifted.tracker.update(moved_faces, now)
            moved = (moved_faces, moved_scores, shifted.read(moved_ids, moved_scores, now), moved_ids)
            if index % interval:
                _compare(result.ceiling, moved, reference)
        if index % interval:
            _compare(result, (own_faces, own_scores, read, own_ids), reference)
    return result


def frames_of(video: Path, most: int = 10_000) -> tuple[list[np.ndarray], float]:
    """A video's frames (up to `most`) and its frame rate (25 when the file does not say)."""
    capture = cv2.VideoCapture(str(video))
    fps = capture.get(cv2.CAP_PROP_FPS) or 25.0
    capture.release()
    return video_frames(video, most), float(fps)


def bench_interval(args: argparse.Namespace) -> dict[str, Any]:
    config = with_overrides(load_config(args.config), args.overrides)
    if args.supersample is not None and args.follower != "graph":
        raise UsageError("--supersample samples the follow graphs' templates: give it with --follower graph")
    perception = Perception.from_config(config)
    perception.warm_up()
    follower = (cpu_graph_follower(config.inference.threads, args.supersample) if args.follower == "graph"
                else HOST_FOLLOWER)
    try:
        rows = []
        for video in args.video:
            frames, fps = frames_of(video)
            for interval in args.interval:
                agreement = compare_intervals(perception, frames, fps, interval, args.ceiling, config.tracking,
                                              config.behavior, follower)
                rows.append({"video": video.name, "interval": interval, **agreement.summary(),
                             **({"ceiling_shift_px": args.ceiling} if args.ceiling is not None else {})})
    finally:
        perception.close()
    return {"mode": "interval", "model": perception.classifier.model.name, "follower": args.follower,
            "supersample": args.supersample, "rows": rows}


def print_interval_table(result: dict[str, Any]) -> None:
    print(f"detector every Nth frame vs every frame, emotion model {result['model']}, "
          f"look follower {result.get('follower', 'host')}")
    print(f"{'video':22} {'N':>2} {'frames':>6} {'compared':>8} {'no ref':>6} {'IoU min':>7} {'p5':>6} "
          f"{'median':>6} {'>=0.8':>6} {'emotion':>7} {'smoothed':>8} {'clear':>6} {'shown':>6} {'showing':>7} "
          f"{'tracks':>6} {'CPU x':>6} {'follow ms':>9}")
    for row in result["rows"]:
        print(f"{row['video']:22} {row['interval']:>2} {row['frames']:>6} {row['compared']:>8} "
              f"{row['without_reference']:>6} {row['iou_min']:>7} {row['iou_p5']:>6} {row['iou_median']:>6} "
              f"{row['iou_at_least_0_8']:>6} {row['emotion_agreement']:>7} {row['smoothed_agreement']:>8} "
              f"{row['clear_agreement']:>6} {row['shown_agreement']:>6} {row['showing_agreement']:>7} "
              f"{str(row['tracks_shown_differently']) + '/' + str(row['tracks']):>6} {row['cpu_ratio']:>6} "
              f"{row['follow_ms_per_face']:>9}")
        if "ceiling_iou_at_least_0_8" in row:
            print(f"{'  ceiling: the detector, frame shifted ' + str(row['ceiling_shift_px']) + ' px':76} "
                  f"{row['ceiling_iou_at_least_0_8']:>6} {row['ceiling_emotion_agreement']:>7} "
                  f"{row['ceiling_smoothed_agreement']:>8} {row['ceiling_clear_agreement']:>6} "
                  f"{row['ceiling_shown_agreement']:>6} {row['ceiling_showing_agreement']:>7} "
                  f"{str(row['ceiling_tracks_shown_differently']) + '/' + str(row['ceiling_tracks']):>6}")
