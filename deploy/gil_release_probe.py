"""How long the frame lane's host work between its two graph runs takes while another thread runs Python.

Why: on the frame graphs path every camera waits for the lane's thread, and numpy gives the GIL away inside some
calls (sorting, nonzero, fancy indexing, ufuncs over large enough arrays). Each time, taking it back waits for the
thread that holds it to be asked to drop it (sys.getswitchinterval(), 5 ms): one other thread running Python turns a
sub-millisecond step into tens of milliseconds. This probe times the steps the lane runs for one batch (FrameEngine.faces_and_crops:
the detector graph's rows → kept faces, the tracked faces joined, the crop matrices; then the batch's probabilities
normalised) alone and beside one thread that runs pure Python, so that the difference counts the waits.

The batch is synthetic but shaped as the graphs give it: FRAMES frames, DETECTED of them detected (the detector's
[B, 64] rows, FACES faces each, the rest -1), the others followed with FACES faces each, read as config/default.yaml
says (emotion.flip and flip_followed).

    python deploy/gil_release_probe.py [--frames 34] [--detected 11] [--faces 5] [--repeat 50] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config.app import load_config  # noqa: E402
from pipeline.core.types import Detection  # noqa: E402
from pipeline.inference.classifier import normalised  # noqa: E402
from pipeline.inference.frames import FrameEngine, TrackedFrame  # noqa: E402
from pipeline.modelprep.frame_graphs import FACE_BOX, FACE_LANDMARKS, FACE_SCORE, FrameFormat  # noqa: E402
from pipeline.modelprep.manifest import load_manifest  # noqa: E402

ROWS = 64  # the detector graph's faces per frame (frames.GRAPH_FACES)


def batch(frames: int, detected: int, faces: int) -> dict[str, Any]:
    """Detector rows for `detected` frames and tracked faces for the others, 1080p, faces 80-200 px wide."""
    rng = np.random.default_rng(0)
    score = np.full((detected, ROWS), -1.0, np.float32)
    score[:, :faces] = np.sort(rng.uniform(0.8, 1.0, (detected, faces)), axis=1)[:, ::-1]
    corner = rng.uniform(0, 1700, (detected, ROWS, 2))
    box = np.concatenate([corner, corner + rng.uniform(80, 200, (detected, ROWS, 1))], axis=2).astype(np.float32)
    points = rng.uniform(0, 1900, (detected, ROWS, 5, 2)).astype(np.float32)
    tracked = [TrackedFrame(np.zeros((1, 1, 3), np.uint8),
                            [Detection((100.0 * i, 100.0, 100.0 * i + 90, 190.0), 0.9, np.zeros((5, 2), np.float32))
                             for i in range(faces)], turn) for turn in range(frames - detected)]
    probs = rng.dirichlet(np.ones(7), 2 * frames * faces).astype(np.float32)  # the classifier's rows, mirrors last
    outputs = {FACE_SCORE: score, FACE_BOX: box, FACE_LANDMARKS: points}
    return {"score": score, "outputs": outputs, "format": FrameFormat(1920, 1080, "rgb"), "tracked": tracked,
            "probs": probs}


def lane_work(engine: FrameEngine, b: dict[str, Any], order: np.ndarray) -> dict[str, float]:
    """What FrameEngine._run_group does on the lane's thread between the detector and the classifier runs
    (`faces_and_crops`), and after the classifier's (the probabilities normalised); ms per step."""
    started = time.perf_counter()
    kept, _, _, flips = engine.faces_and_crops(b["outputs"], b["format"], b["tracked"], len(b["score"]))
    between = time.perf_counter()
    normalised(b["probs"][: len(kept.frame) + flips], order, flips)
    done = time.perf_counter()
    return {"faces_and_crops": (between - started) * 1e3, "normalised": (done - between) * 1e3}


def engine() -> FrameEngine:
    """A frame engine without lanes (only its host work runs here), configured as config/default.yaml says, with
    the student's 64 px crops."""
    config = load_config(ROOT / "config" / "default.yaml")
    return FrameEngine([], config.detector, config.emotion, load_manifest("dlibface_student64"), 64, {})


def timed(b: dict[str, Any], repeat: int) -> list[dict[str, float]]:
    order, lanes = np.array([3, 1, 2, 0, 4, 5, 6]), engine()
    out = []
    for _ in range(repeat):
        out.append(lane_work(lanes, b, order))
        time.sleep(0.001)  # as the lane waits for its next run
    return out


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    """The median of each step and of their sum, ms."""
    medians = {step: round(statistics.median(run[step] for run in runs), 3) for step in runs[0]}
    return {**medians, "total": round(statistics.median(sum(run.values()) for run in runs), 3)}


def with_python_thread(b: dict[str, Any], repeat: int) -> list[dict[str, float]]:
    stop = threading.Event()

    def python_loop() -> None:  # holds the GIL whenever it has it, until asked to drop it
        count = 0
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=python_loop, daemon=True)
    thread.start()
    try:
        time.sleep(0.05)
        return timed(b, repeat)
    finally:
        stop.set()
        thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=34)
    parser.add_argument("--detected", type=int, default=11)
    parser.add_argument("--faces", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    b = batch(args.frames, args.detected, args.faces)
    alone, beside = timed(b, args.repeat), with_python_thread(b, args.repeat)
    result = {"frames": args.frames, "detected": args.detected, "faces": args.faces,
              "switch_interval_ms": sys.getswitchinterval() * 1e3,
              "median_ms_alone": summary(alone), "median_ms_beside_a_python_thread": summary(beside)}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
