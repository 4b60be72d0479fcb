"""`bench engine`: one model alone through its backend, per precision and batch size (throughput, p50/p99 latency).

Inputs are real pixels (frames of a video letterboxed to the detector size, or face crops from it), never zeros, and
on GPU backends they are staged the way the batcher stages them, so the figures include the host→device copy.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from pipeline.config.app import AppConfig, load_config
from pipeline.inference.backend import Backend, ModelRuntime, create_backend
from pipeline.modelprep.manifest import load_manifest
from pipeline.modelprep.prepare import ensure_model
from pipeline.vision.retinaface import letterbox

ROLES = {"detector": "detector", "emotion": "emotion"}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(ROLES), default="detector")
    parser.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,int8")
    parser.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--detector-input", default="640x352", metavar="WxH")
    parser.add_argument("--video", type=Path, default=None, help="source of real pixels (default: the demo photo)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per batch size")
    parser.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[2] / "config/default.yaml")
    parser.add_argument("--json", type=Path, default=None)


def video_frames(video: Path, count: int) -> list[np.ndarray]:
    """Up to the first `count` BGR frames of a video (fewer if it is shorter or unreadable)."""
    frames: list[np.ndarray] = []
    cap = cv2.VideoCapture(str(video))
    while len(frames) < count:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    return frames


def _pixels(video: Path | None, count: int) -> list[np.ndarray]:
    """`count` real BGR frames (cycled) from a video, or from the demo photo when no video is given."""
    frames = video_frames(video, count) if video is not None else []
    if not frames:
        from pipeline.capture.sources import DemoSource

        demo = DemoSource()
        frames = [demo.frame_at(i / count) for i in range(count)]
    return [frames[i % len(frames)] for i in range(count)]


def _items(model: str, size: tuple[int, int], frames: list[np.ndarray]) -> list[np.ndarray]:
    """Real pixels in the model's input: letterboxed frames for the detector, face-sized grey squares of `size`
    for the emotion model."""
    if model == "detector":
        return [letterbox(f, size)[0] for f in frames]
    grey = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in frames]
    height, width = grey[0].shape
    side = min(height, width) // 2  # a face-sized central square, resized as the classifier's crops are
    return [cv2.resize(g[height // 4: height // 4 + side, width // 4: width // 4 + side], size)[:, :, None]
            for g in grey]


def _time_batches(backend: Backend, items: list[np.ndarray], batch: int, seconds: float) -> dict[str, float]:
    name = backend.inputs[0].name
    latencies: list[float] = []
    start = time.perf_counter()
    offset = 0
    warmup = 3
    while warmup > 0 or time.perf_counter() - start < seconds or len(latencies) < 5:
        chosen = [items[(offset + i) % len(items)] for i in range(batch)]
        offset += batch
        t0 = time.perf_counter()
        buffer = backend.staging(0, batch, chosen[0].shape, chosen[0].dtype)
        backend.run({name: np.stack(chosen, out=buffer)}, 0)
        elapsed = time.perf_counter() - t0
        if warmup > 0:
            warmup -= 1
            start = time.perf_counter()
            continue
        latencies.append(elapsed)
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000.0
    return {"batch": batch, "runs": len(latencies), "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3),
            "items_per_s": round(batch / (float(p50) / 1000.0), 1)}


def bench_engine(args: argparse.Namespace) -> dict[str, Any]:
    cfg: AppConfig = load_config(args.config)
    width, height = (int(v) for v in args.detector_input.lower().split("x"))
    batches = [int(b) for b in args.batch.split(",")]
    manifest = load_manifest(cfg.detector.model if args.model == "detector" else cfg.emotion.model)
    crop = manifest.input.size or (64, 64)
    items = _items(args.model, (width, height) if args.model == "detector" else crop, _pixels(args.video, 64))
    rows = []
    for precision in [p.strip() for p in args.precision.split(",")]:
        inference = cfg.inference.model_copy(update={"device": args.device, "precision": precision,
                                                     "max_batch": max(batches), "lanes": 1})
        spec = ModelRuntime.from_config(inference, input_size=(width, height) if args.model == "detector" else None)
        backend = create_backend(spec, manifest, ensure_model(manifest, precision))  # type: ignore[arg-type]
        try:
            for batch in batches:
                rows.append({"precision": precision, **_time_batches(backend, items, batch, args.seconds)})
        finally:
            backend.close()
    return {"mode": "engine", "model": manifest.name, "device": args.device,
            "input": f"{width}x{height}" if args.model == "detector" else f"{crop[0]}x{crop[1]}", "rows": rows}


def print_engine_table(result: dict[str, Any]) -> None:
    print(f"{result['model']} on {result['device']}, input {result['input']}")
    print(f"{'precision':9} {'batch':>5} {'runs':>6} {'p50 ms':>9} {'p99 ms':>9} {'items/s':>10}")
    for row in result["rows"]:
        print(f"{row['precision']:9} {row['batch']:>5} {row['runs']:>6} {row['p50_ms']:>9} {row['p99_ms']:>9} "
              f"{row['items_per_s']:>10}")
