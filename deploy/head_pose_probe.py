"""CPU of one head-pose fit (pipeline.vision.head_pose), alone and among busy Python threads, on real landmarks.

Why: in a camera group the workers' pose fits cost up to ~0.66 ms of CPU each against ~0.1 ms alone (BENCHMARKS.md,
round 8): every OpenCV call gives the GIL away and takes it back, and taking it back waits while other threads run
Python. This probe fits the faces RetinaFace finds in a few group_1080p.mp4 frames, first in one thread, then in
FITTERS threads at once beside BUSY threads that only run Python, and reports each fit's thread CPU and wall time.
Run it on two trees alternately to compare implementations (BENCHMARKS.md names the commands).

    python deploy/head_pose_probe.py [SECONDS] [FITTERS] [BUSY] [VIDEO]   (VIDEO: ../shared/data/video/group_1080p.mp4)
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.vision.head_pose import head_pose  # noqa: E402


def real_faces(video: Path, frames: int = 3) -> tuple[list[np.ndarray], tuple[int, int]]:
    """The landmarks of every face the default detector finds in `frames` frames of `video`, 10 frames apart."""
    from pipeline.config.app import load_config
    from pipeline.inference.perception import Perception

    perception = Perception.from_config(load_config(ROOT / "config/default.yaml"))
    capture = cv2.VideoCapture(str(video))
    landmarks, size = [], (0, 0)
    for _ in range(frames):
        ok, frame = capture.read()
        if not ok:
            break
        size = (frame.shape[1], frame.shape[0])
        landmarks += [np.asarray(face.landmarks, np.float32) for face in perception.detector.detect(frame, 30)]
        for _ in range(9):  # frames 10 apart: different poses
            capture.read()
    capture.release()
    perception.close()
    return landmarks, size


def fit_loop(faces: list[np.ndarray], size: tuple[int, int], until: float, out: list[tuple[int, float, float]]) -> None:
    """Fit every face over and over until `until`; append (fits, thread CPU s, wall s)."""
    cpu0, wall0, fits = time.thread_time(), time.perf_counter(), 0
    while time.perf_counter() < until:
        for points in faces:
            head_pose(points, size)
            fits += 1
    out.append((fits, time.thread_time() - cpu0, time.perf_counter() - wall0))


def busy_loop(until: float) -> None:
    total = 0
    while time.perf_counter() < until:
        for value in range(1000):
            total += value * value


def measure(faces: list[np.ndarray], size: tuple[int, int], seconds: float, fitters: int, busy: int) -> dict:
    until = time.perf_counter() + seconds
    results: list[tuple[int, float, float]] = []
    threads = [threading.Thread(target=fit_loop, args=(faces, size, until, results)) for _ in range(fitters)]
    threads += [threading.Thread(target=busy_loop, args=(until,)) for _ in range(busy)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fits = sum(r[0] for r in results)
    cpu_s = sum(r[1] for r in results)
    return {"fitters": fitters, "busy": busy, "fits": fits, "cpu_us_per_fit": round(cpu_s / max(fits, 1) * 1e6, 1),
            "fits_per_s": round(fits / seconds, 1)}


def main(argv: list[str]) -> int:
    seconds = float(argv[0]) if argv else 5.0
    fitters = int(argv[1]) if len(argv) > 1 else 8
    busy = int(argv[2]) if len(argv) > 2 else 2
    video = Path(argv[3]) if len(argv) > 3 else ROOT.parent / "shared/data/video/group_1080p.mp4"
    cv2.setNumThreads(1)  # as the daemon runs OpenCV beside a GPU
    faces, size = real_faces(video)
    if not faces:
        print(f"no faces found in {video}", file=sys.stderr)
        return 1
    posed = sum(head_pose(points, size) is not None for points in faces)
    print(json.dumps({"faces": len(faces), "with_pose": posed, "frame": size}), flush=True)
    for fitters_now, busy_now in ((1, 0), (fitters, busy), (1, 0), (fitters, busy)):
        print(json.dumps(measure(faces, size, seconds, fitters_now, busy_now)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
