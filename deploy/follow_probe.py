"""Probe for issue 25 (the crowd on NVDEC frames): what following faces by their look costs a camera's worker thread
per frame, by the host's way (each face's search window copied down and matched in OpenCV: vision.follow.HostFollower)
against the follow graphs on the GPU (inference.following.GraphFollower: only the scores come down).

group_1080p.mp4's first frames decoded on NVDEC and kept on the GPU; the first frame's faces (the host detector)
are the templates; every later frame is searched for them, `--runs` rounds over the frames. The crowd's faces are
repeated to make runs of 1, 4, 8 and 16 faces a frame. Printed per way and face count: the thread's CPU ms and wall
ms per frame (medians), and how many faces were found. One JSON line per face count.

    python3 deploy/follow_probe.py [--frames 8] [--runs 20] [--faces 1,4,8,16]

Run from the project root with the prepared models and .benchdata/video/group_1080p.mp4 (or ../shared/data).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _video() -> Path:
    for base in (os.environ.get("EMOTION_TEST_DATA"), ROOT / ".benchdata", ROOT.parent / "shared" / "data"):
        if base and (Path(base) / "video" / "group_1080p.mp4").exists():
            return Path(base) / "video" / "group_1080p.mp4"
    raise SystemExit("group_1080p.mp4 not found under $EMOTION_TEST_DATA/video, .benchdata/video or ../shared/data")


def _timed(call, frames: list, runs: int) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """Median CPU and wall ms of `call(frame)` over the frames, `runs` rounds; the faces found in the last round."""
    cpu, wall, found = [], [], 0
    for _ in range(runs):
        found = 0
        for frame in frames:
            started_cpu, started = time.thread_time(), time.perf_counter()
            places = call(frame)
            cpu.append((time.thread_time() - started_cpu) * 1e3)
            wall.append((time.perf_counter() - started) * 1e3)
            found += sum(place is not None for place in places)
    return statistics.median(cpu), statistics.median(wall), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--faces", default="1,4,8,16")
    args = parser.parse_args()

    from pipeline.config.app import load_config
    from pipeline.inference.following import cuda_graph_follower
    from pipeline.inference.onnxruntime import import_ort
    from pipeline.inference.perception import Perception
    from pipeline.inference.settings import InferenceConfig
    from pipeline.vision.follow import HOST_FOLLOWER
    from pipeline.capture.nvdec import NvdecSource

    source = NvdecSource(str(_video()), "probe", keep_on_device=True)
    frames: list[Any] = []
    for _ in range(args.frames):  # at most 8 held at once (the camera's frame pool)
        source.grab(1.0)
        frames.append(source.retrieve())
    source.close()
    perception = Perception.from_config(load_config(ROOT / "config" / "default.yaml"))
    faces = [face.box for face in perception.analyze(frames[0].to_host())[0]]
    perception.close()
    graphs = cuda_graph_follower(import_ort(), InferenceConfig(device="cuda"))
    try:
        for count in (int(part) for part in args.faces.split(",")):
            boxes = [faces[i % len(faces)] for i in range(count)]
            row: dict[str, object] = {"faces": count}
            for name, follower in (("host", HOST_FOLLOWER), ("graph", graphs)):
                templates = follower.templates(frames[0], boxes)
                wanted = [(template, box) for template, box in zip(templates, boxes) if template is not None]
                follower.locate(frames[1], wanted)  # the first run of a face count plans its shapes
                cpu, wall, found = _timed(lambda frame: follower.locate(frame, wanted), frames[1:], args.runs)
                row[name] = {"cpu_ms": round(cpu, 3), "wall_ms": round(wall, 3), "found": found,
                             "of": len(wanted) * (len(frames) - 1)}
            print(json.dumps(row), flush=True)
    finally:
        graphs.close()


if __name__ == "__main__":
    main()
