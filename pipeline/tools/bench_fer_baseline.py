"""Throughput baseline: the `fer` package (Haar cascade + mini-Xception) on a video.

This is the reference that ``run_pipeline.py bench`` is compared against. It is
deliberately STANDALONE (no imports from the ``pipeline`` package) because it runs
under the separate fer virtualenv::

    /opt/fer-venv/bin/python pipeline/tools/bench_fer_baseline.py VIDEO \
        [--every N] [--warmup K] [--max-frames M] [--tflite | --keras]

Every Nth frame is processed as ``FER.find_faces`` (timed as "detect") followed by
``FER.detect_emotions(frame, face_rectangles=found)`` (timed as "classify": grey
conversion, padding, crops, resize, model inference, labelling). The first K
processed frames are warm-up and are neither timed nor counted. TensorFlow and
OpenCV keep their default thread counts; ``os.cpu_count()`` is reported instead.
stdout carries exactly one JSON line; status goes to stderr via logging.
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts pipeline/ first on sys.path, where pipeline/core/types.py and
# pipeline/secrets.py would shadow the stdlib modules of the same names: drop it first.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # must precede the TF import

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

log = logging.getLogger("bench_fer_baseline")


@dataclass
class Stats:
    """Accumulated timings and results over the timed (post-warm-up) frames."""

    frames: int = 0
    faces: int = 0
    seconds: float = 0.0
    decode_s: float = 0.0
    detect_s: float = 0.0
    classify_s: float = 0.0
    emotions: Counter = field(default_factory=Counter)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("video", help="path to a video file readable by OpenCV")
    p.add_argument("--every", type=int, default=1, help="process every Nth frame (default 1)")
    p.add_argument("--warmup", type=int, default=5,
                   help="processed frames run before timing starts (default 5)")
    p.add_argument("--max-frames", type=int, default=0,
                   help="stop after this many timed frames (0 = whole video)")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--tflite", dest="use_tflite", action="store_true", default=True,
                       help="quantized TFLite model (fer 25.10.3's default)")
    model.add_argument("--keras", dest="use_tflite", action="store_false",
                       help="Keras HDF5 mini-Xception model")
    args = p.parse_args(argv)
    if args.every < 1 or args.warmup < 0 or args.max_frames < 0:
        p.error("--every must be >= 1; --warmup and --max-frames must be >= 0")
    return args


def process(detector: Any, frame: np.ndarray, stats: Stats | None) -> None:
    """Run detect + classify on one frame; accumulate into ``stats`` unless warming up."""
    t0 = time.perf_counter()
    found = detector.find_faces(frame)
    t1 = time.perf_counter()
    results = detector.detect_emotions(frame, face_rectangles=found)
    t2 = time.perf_counter()
    if stats is None:
        return
    stats.frames += 1
    stats.faces += len(results)
    stats.detect_s += t1 - t0
    stats.classify_s += t2 - t1
    for face in results:
        scores = face["emotions"]
        stats.emotions[max(scores, key=scores.get)] += 1


def sampled_frames(cap: cv2.VideoCapture, every: int) -> Iterator[tuple[np.ndarray, float]]:
    """Yield (frame, decode seconds spent since the previous yield) for every Nth frame.

    Skipped frames are only grabbed (decoded, never retrieved as BGR images).
    """
    index, decode_s = 0, 0.0
    while True:
        t0 = time.perf_counter()
        if index % every == 0:
            ok, frame = cap.read()
        else:
            ok, frame = cap.grab(), None
        decode_s += time.perf_counter() - t0
        if not ok:
            return
        if frame is not None:
            yield frame, decode_s
            decode_s = 0.0
        index += 1


def run(detector: Any, cap: cv2.VideoCapture, args: argparse.Namespace) -> Stats:
    """Process every Nth frame; time everything (decode included) after the warm-up."""
    stats = Stats()
    frames = sampled_frames(cap, args.every)
    for _, (frame, _) in zip(range(args.warmup), frames):
        process(detector, frame, None)
    start = time.perf_counter()
    for frame, decode_s in frames:
        stats.decode_s += decode_s
        process(detector, frame, stats)
        if args.max_frames and stats.frames >= args.max_frames:
            break
    stats.seconds = time.perf_counter() - start
    return stats


def report(stats: Stats, args: argparse.Namespace, fer_version: str, tf_version: str) -> dict:
    """Build the single JSON-able result object."""
    n = max(stats.frames, 1)
    return {
        "tool": "fer",
        "fer_version": fer_version,
        "tensorflow_version": tf_version,
        "opencv_version": cv2.__version__,
        "numpy_version": np.__version__,
        "model": "tflite" if args.use_tflite else "keras",
        "video": args.video,
        "every": args.every,
        "warmup": args.warmup,
        "cpu_count": os.cpu_count(),
        "frames": stats.frames,
        "faces": stats.faces,
        "seconds": round(stats.seconds, 4),
        "fps": round(stats.frames / stats.seconds, 2) if stats.seconds > 0 else 0.0,
        "per_stage_ms": {
            "detect": round(1000 * stats.detect_s / n, 3),
            "classify": round(1000 * stats.classify_s / n, 3),
            "decode": round(1000 * stats.decode_s / n, 3),
        },
        "emotion_counts": dict(stats.emotions.most_common()),
    }


def main(argv: list[str] | None = None) -> int:
    """Load fer, benchmark the video, print one JSON line on stdout."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    cap = cv2.VideoCapture(args.video)
    if not cap.isOpened():
        log.error("cannot open video %s", args.video)
        return 2
    warnings.filterwarnings("ignore", message=r"(?s).*(pkg_resources|tf\.lite\.Interpreter) is deprecated")
    t0 = time.perf_counter()
    import fer
    import tensorflow as tf  # heavy: imported after argument checks
    from fer.fer import FER

    detector = FER(mtcnn=False, use_tflite=args.use_tflite)
    log.info("fer %s, tensorflow %s, model %s loaded in %.2fs", fer.__version__, tf.__version__,
             "tflite" if args.use_tflite else "keras", time.perf_counter() - t0)
    try:
        stats = run(detector, cap, args)
    finally:
        cap.release()
    log.info("%d frames, %d faces in %.2fs", stats.frames, stats.faces, stats.seconds)
    print(json.dumps(report(stats, args, fer.__version__, tf.__version__)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
