"""Issue 25 item 2, tried and not kept: does smoothing each track's crop box make followed faces read as detected ones?

    python tools/crop_smoothing_check.py --video ../shared/data/video/group_1080p.mp4 \
        --video ../shared/data/video/woman2.mp4 --weights 1.0/1.0,0.5/1.0,0.3/1.0,0.5/0.5

The classifier reads a box crop (`emotion.crop: box`), so a box a pixel larger or off changes the reading of a small
face. This check runs `bench interval`'s comparison (interval 3, default models) with one change on both ways: the
box each face is cropped by is smoothed per track, its size (and centre) an exponential average with the newest
detection weighted SIZE (CENTRE); on frames without detection the followed face keeps its found centre and takes the
track's smoothed size. "1.0/1.0" is this loop without smoothing (the followed face's size then is its last
detection's, not its motion's: the figure differs a little from `bench interval`'s). Prints one JSON line per clip
and weight pair (BENCHMARKS.md, "Where the crowd's emotion disagreements lie"). Needs the prepared models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config.app import AppConfig, load_config  # noqa: E402
from pipeline.core.types import Detection  # noqa: E402
from pipeline.inference.perception import Perception  # noqa: E402
from pipeline.service.parts import tracker_for  # noqa: E402
from pipeline.tools.bench_interval import Agreement, _compare, _Way, frames_of  # noqa: E402

INTERVAL = 3
FIGURES = ("compared", "iou_at_least_0_8", "emotion_agreement", "smoothed_agreement", "clear_agreement",
           "shown_agreement", "showing_agreement", "tracks_shown_differently")


class CropSmoother:
    """Each track's crop box: size and centre averaged over its detections (newest weighted `size_weight`,
    `centre_weight`)."""

    def __init__(self, size_weight: float, centre_weight: float) -> None:
        self.size_weight, self.centre_weight = size_weight, centre_weight
        self.state: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def detected(self, ids: list[int], faces: list[Detection]) -> list[Detection]:
        """The faces to crop on a detection frame; each track's average moves towards its detection."""
        out = []
        for track_id, face in zip(ids, faces):
            size, centre = _size_and_centre(face)
            if track_id in self.state:
                old_size, old_centre = self.state[track_id]
                size = self.size_weight * size + (1 - self.size_weight) * old_size
                centre = self.centre_weight * centre + (1 - self.centre_weight) * old_centre
            self.state[track_id] = (size, centre)
            out.append(_boxed(face, size, centre))
        return out

    def followed(self, ids: list[int], faces: list[Detection]) -> list[Detection]:
        """The faces to crop on a frame without detection: found centre, the track's averaged size."""
        out = []
        for track_id, face in zip(ids, faces):
            size, centre = _size_and_centre(face)
            out.append(_boxed(face, self.state[track_id][0] if track_id in self.state else size, centre))
        return out


def _size_and_centre(face: Detection) -> tuple[np.ndarray, np.ndarray]:
    box = np.asarray(face.box, np.float64)
    return box[2:] - box[:2], (box[:2] + box[2:]) / 2.0


def _boxed(face: Detection, size: np.ndarray, centre: np.ndarray) -> Detection:
    x1, y1 = (centre - size / 2.0).tolist()
    x2, y2 = (centre + size / 2.0).tolist()
    return Detection((x1, y1, x2, y2), face.score, face.landmarks)


def compare(perception: Perception, frames: list[np.ndarray], fps: float, config: AppConfig,
            weights: tuple[float, float]) -> Agreement:
    """`bench interval`'s loop (without the ceiling and the CPU figures), each way's crops smoothed by `weights`.
    Boxes are compared as each way tracked them; only the crops differ."""
    every, skipping = (_Way(tracker_for(config.tracking, follow), config.behavior) for follow in (False, True))
    every_crops, skipping_crops = CropSmoother(*weights), CropSmoother(*weights)
    result, followed = Agreement(frames=len(frames)), 0
    for index, frame in enumerate(frames):
        now = index / fps
        faces, _, _ = perception.analyze(frame)
        ids = every.tracker.update(faces, now)
        scores = perception.classify_faces(frame, every_crops.detected(ids, faces), 0.0)[1]
        reference = (faces, scores, every.read(ids, scores, now), ids)
        if index % INTERVAL == 0:
            own_ids = skipping.tracker.update(faces, now, frame)
            skipping.read(own_ids, perception.classify_faces(frame, skipping_crops.detected(own_ids, faces), 0.0)[1],
                          now)
            continue
        predicted = skipping.tracker.predict(now, frame)
        own_ids, own_faces = [i for i, _ in predicted], [f for _, f in predicted]
        own_scores = perception.classify_faces(frame, skipping_crops.followed(own_ids, own_faces), 0.0,
                                               followed=True, turn=followed)[1]
        followed += 1
        _compare(result, (own_faces, own_scores, skipping.read(own_ids, own_scores, now), own_ids), reference)
    return result


def weight_pairs(text: str) -> list[tuple[float, float]]:
    """--weights: SIZE/CENTRE pairs, comma-separated."""
    pairs = [part.split("/") for part in text.split(",") if part.strip()]
    return [(float(size), float(centre)) for size, centre in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--video", type=Path, action="append", required=True)
    parser.add_argument("--weights", type=weight_pairs, default=weight_pairs("1.0/1.0,0.5/1.0"))
    args = parser.parse_args()
    config = load_config(ROOT / "config" / "default.yaml")
    perception = Perception.from_config(config)
    perception.warm_up()
    try:
        for video in args.video:
            frames, fps = frames_of(video)
            for weights in args.weights:
                summary = compare(perception, frames, fps, config, weights).summary()
                print(json.dumps({"video": video.name, "size_weight": weights[0], "centre_weight": weights[1],
                                  **{key: summary[key] for key in FIGURES}}), flush=True)
    finally:
        perception.close()


if __name__ == "__main__":
    main()
