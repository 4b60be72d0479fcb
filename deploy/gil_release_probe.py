"""How long the frame lane's host work between its two graph runs takes while another thread runs Python.

Why: on the frame graphs path every camera waits for the lane's thread, and numpy gives the GIL away inside some
calls (sorting, nonzero, fancy indexing, ufuncs over large enough arrays). Each time, taking it back waits for the
thread that holds it to be asked to drop it (sys.getswitchinterval(), 5 ms): one other thread running Python turns a
sub-millisecond step into tens of milliseconds. This probe times the steps the lane runs for one batch (the
detector graph's rows → kept faces, the tracked faces joined, the crop matrices, the batch's probabilities
normalised) alone and beside one thread that runs pure Python, so that the difference counts the waits.

The batch is synthetic but shaped as the graphs give it: FRAMES frames, DETECTED of them detected (the detector's
[B, 64] rows, FACES faces each, the rest -1), the others followed with FACES faces each, every face mirrored.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.types import Detection  # noqa: E402
from pipeline.inference.classifier import normalised  # noqa: E402
from pipeline.inference.frame_faces import given_faces, joined, kept_faces  # noqa: E402
from pipeline.vision.align import box_crop_matrices, inverse_affine  # noqa: E402

ROWS = 64  # the detector graph's faces per frame (frames.GRAPH_FACES)


def batch(frames: int, detected: int, faces: int) -> dict[str, Any]:
    """Detector rows for `detected` frames and tracked faces for the others, 1080p, faces 80-200 px wide."""
    rng = np.random.default_rng(0)
    score = np.full((detected, ROWS), -1.0, np.float32)
    score[:, :faces] = np.sort(rng.uniform(0.8, 1.0, (detected, faces)), axis=1)[:, ::-1]
    corner = rng.uniform(0, 1700, (detected, ROWS, 2))
    box = np.concatenate([corner, corner + rng.uniform(80, 200, (detected, ROWS, 1))], axis=2).astype(np.float32)
    points = rng.uniform(0, 1900, (detected, ROWS, 5, 2)).astype(np.float32)
    tracked = [[Detection((100.0 * i, 100.0, 100.0 * i + 90, 190.0), 0.9, np.zeros((5, 2), np.float32))
                for i in range(faces)] for _ in range(frames - detected)]
    probs = rng.dirichlet(np.ones(7), 2 * frames * faces).astype(np.float32)  # the classifier's rows, mirrors last
    return {"score": score, "box": box, "points": points, "tracked": tracked, "probs": probs}


def lane_work(b: dict[str, Any], order: np.ndarray) -> dict[str, float]:
    """What FrameEngine._run_group does on the lane's thread between the detector and the classifier runs, and after
    the classifier's (the probabilities normalised); ms per step."""
    marks = [time.perf_counter()]
    detected = kept_faces(b["score"], b["box"], b["points"], (1920, 1080), 32, 16)
    marks.append(time.perf_counter())
    kept = joined(detected, given_faces(b["tracked"]))
    marks.append(time.perf_counter())
    inverse_affine(box_crop_matrices(kept.boxes, (64, 64), 0.0)).astype(np.float32)
    marks.append(time.perf_counter())
    normalised(b["probs"][: 2 * len(kept.frame)], order, len(kept.frame))
    marks.append(time.perf_counter())
    steps = ("kept_faces", "tracked_joined", "crop_matrices", "normalised")
    return {step: (end - start) * 1e3 for step, start, end in zip(steps, marks, marks[1:])}


def timed(b: dict[str, Any], repeat: int) -> list[dict[str, float]]:
    order = np.array([3, 1, 2, 0, 4, 5, 6])
    out = []
    for _ in range(repeat):
        out.append(lane_work(b, order))
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
