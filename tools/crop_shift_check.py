"""Issue 25 item 2: how steady is each emotion model's top emotion when a face's crop moves by a few pixels?

    python tools/crop_shift_check.py --video ../shared/data/video/group_1080p.mp4 \
        --model dlibface_emotion150 --model dlibface_student64 --model mini_xception_fer2013

A followed face's box is never exactly where the detector would put it on that frame, so a classifier whose top
emotion changes when the crop moves by 2 px cannot agree with every-frame detection however well the face is
followed. This check detects the faces on every STEP-th frame and classifies each face's box and the same box moved
by SHIFT px right and down (the default config's crop and flip, only the model differs), and counts how often the top
emotion stays. `--ensemble` also reads every face at five positions (its box and the box moved by 3 % of its width,
at least 2 px, left, right, up and down) averaged, on both boxes: a try at making a model steadier for five times its
work (BENCHMARKS.md, "The crowd followed with the many-camera model"). Prints one JSON line per model. Needs the
prepared models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config.app import load_config  # noqa: E402
from pipeline.core.types import Detection  # noqa: E402
from pipeline.inference.perception import Perception  # noqa: E402
from pipeline.tools.bench_interval import frames_of  # noqa: E402
from pipeline.tools.bench_pipeline import with_overrides  # noqa: E402
from pipeline.vision.track import moved_detection  # noqa: E402

ONE = ((0.0, 0.0),)
CROSS = ((0.0, 0.0), (1.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (0.0, -1.0))  # in steps of ENSEMBLE_STEP of the width
ENSEMBLE_STEP, ENSEMBLE_MIN_PX = 0.03, 2.0


def moved(face: Detection, dx: float, dy: float) -> Detection:
    """The same face, its box (and with it its landmarks) moved by (dx, dy) pixels."""
    x1, y1, x2, y2 = face.box
    return moved_detection(face, (x1 + dx, y1 + dy, x2 + dx, y2 + dy))


def read(perception: Perception, frame: np.ndarray, faces: list[Detection],
         positions: tuple[tuple[float, float], ...]) -> np.ndarray:
    """Each face's probabilities, averaged over `positions` (steps of ENSEMBLE_STEP of the face's width)."""
    placed = []
    for face in faces:
        step = max(ENSEMBLE_MIN_PX, (face.box[2] - face.box[0]) * ENSEMBLE_STEP)
        placed += [moved(face, dx * step, dy * step) for dx, dy in positions]
    crops = [perception.classifier.face_crop(frame, face) for face in placed]
    probs = np.stack([scores.probs for scores in perception.classifier.classify(crops, 30.0)])
    return probs.reshape(len(faces), len(positions), -1).mean(axis=1)


def steadiness(perception: Perception, frames: list[np.ndarray], step: int, shift: float,
               positions: tuple[tuple[float, float], ...]) -> tuple[int, int]:
    """(faces whose top emotion stayed when the crop moved by `shift` px, faces read)."""
    same = total = 0
    for frame in frames[::step]:
        faces = perception.detector.detect(frame, 30.0)
        if not faces:
            continue
        here = read(perception, frame, faces, positions)
        there = read(perception, frame, [moved(face, shift, shift) for face in faces], positions)
        same += int((here.argmax(axis=1) == there.argmax(axis=1)).sum())
        total += len(faces)
    return same, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--video", type=Path, required=True)
    parser.add_argument("--model", action="append", required=True, help="emotion model name; repeatable")
    parser.add_argument("--step", type=int, default=3, help="every STEP-th frame (default 3)")
    parser.add_argument("--shift", type=float, default=2.0, help="pixels right and down (default 2)")
    parser.add_argument("--ensemble", action="store_true", help="also the five-position average")
    args = parser.parse_args()
    frames, _ = frames_of(args.video)
    for model in args.model:
        config = with_overrides(load_config(ROOT / "config" / "default.yaml"), [f"emotion.model={model}"])
        perception = Perception.from_config(config)
        perception.warm_up()
        try:
            ways = {"one": ONE, **({"five": CROSS} if args.ensemble else {})}
            line: dict[str, object] = {"video": args.video.name, "model": model, "shift_px": args.shift}
            for name, positions in ways.items():
                same, total = steadiness(perception, frames, args.step, args.shift, positions)
                line[f"{name}_kept"], line["faces"] = round(same / max(total, 1), 4), total
            print(json.dumps(line), flush=True)
        finally:
            perception.close()


if __name__ == "__main__":
    main()
