"""Probe of the frame graphs on the GPU (deploy/gpu-bench.sh frames-probe): where ONNX Runtime places their nodes,
and what one batch costs on the device, with frames already in GPU memory (as NVDEC leaves them).

Prints one JSON line per measurement. Run from the project root with onnxruntime-gpu, cuda-python and the prepared
fp16 models:  python3 deploy/frame_graphs_probe.py .benchdata/video/group_1080p.mp4
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort

from pipeline.config.app import load_config
from pipeline.inference.frames import FramePerception
from pipeline.inference.gpu.cuda import DeviceBuffer, Stream, memory_info
from pipeline.inference.perception import load_perception
from pipeline.modelprep.frame_graphs import FrameFormat

ROOT = Path(__file__).resolve().parents[1]


class _DeviceFrame:
    """A frame uploaded once into GPU memory, standing in for an NVDEC frame (same interface: shape, order, ptr)."""

    def __init__(self, rgb: np.ndarray, stream: Stream) -> None:
        self.shape = rgb.shape
        self.order = "rgb"
        self._buffer = DeviceBuffer("probe frame", rgb.nbytes)
        stream.copy_host_to(self._buffer.ptr, np.ascontiguousarray(rgb), "probe frame")
        stream.synchronize()

    @property
    def ptr(self) -> int:
        return self._buffer.ptr

    def to_host(self) -> np.ndarray:
        raise NotImplementedError


def _placement(graph: bytes, label: str) -> dict[str, object]:
    """Node counts by execution provider, from ONNX Runtime's profile of one session (what ran where)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = f"/tmp/probe_{label}"
    session = ort.InferenceSession(graph, options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        dtype = {"tensor(uint8)": np.uint8, "tensor(int64)": np.int64}.get(arg.type, np.float32)
        feeds[arg.name] = np.zeros(shape, dtype)
    if "crop_matrix" in feeds:
        feeds["crop_matrix"][:] = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    session.run(None, feeds)
    profile = json.loads(Path(session.end_profiling()).read_text())
    by_provider: dict[str, list[str]] = {}
    for event in profile:
        args = event.get("args", {})
        if event.get("cat") == "Node" and "provider" in args and event["name"].endswith("_kernel_time"):
            by_provider.setdefault(args["provider"], []).append(args.get("op_name", "?"))
    return {"graph": label, **{k: sorted(set(v)) for k, v in by_provider.items()},
            "nodes": {k: len(v) for k, v in by_provider.items()}}


def main() -> None:
    video = Path(sys.argv[1])
    cap = cv2.VideoCapture(str(video))
    ok, bgr = cap.read()
    cap.release()
    if not ok:
        raise SystemExit(f"cannot read {video}")
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    cfg = load_config(ROOT / "config" / "default.yaml")
    inference = cfg.inference.model_copy(update={"device": "cuda", "precision": "fp16", "frame_path": "graph",
                                                 "max_batch": 64, "lanes": 1, "batch_step": 4})
    detector = cfg.detector.model_copy(update={"input_size": (640, 352)})
    cfg = cfg.model_copy(update={"inference": inference, "detector": detector})
    fmt = FrameFormat(rgb.shape[1], rgb.shape[0], "rgb")
    free0 = memory_info()[0]
    perception = load_perception(cfg)
    if not isinstance(perception, FramePerception):
        raise SystemExit("frame_path graph did not give a FramePerception")
    graphs = perception.engine._lanes[0]._graphs  # type: ignore[attr-defined]  # a probe may look inside
    for label, graph in (("detector", graphs.detector(fmt)), ("classifier", graphs.classifier(fmt))):
        print(json.dumps(_placement(graph, label)), flush=True)
    started = time.monotonic()
    perception.prepare(fmt)
    print(json.dumps({"prepare_s": round(time.monotonic() - started, 1),
                      "gpu_mb_after_prepare": round((free0 - memory_info()[0]) / 2**20)}), flush=True)
    stream = Stream("probe")
    frame = _DeviceFrame(rgb, stream)
    engine = perception.engine
    for batch in (1, 4, 16, 64):
        items = [frame] * batch
        engine.run_items(items, 0)
        times = []
        for _ in range(10):
            t0 = time.monotonic()
            results = engine.run_items(items, 0)
            times.append((time.monotonic() - t0) * 1e3)
        stage = results[0].timings
        print(json.dumps({"batch": batch, "ms_per_batch_p50": round(float(np.median(times)), 2),
                          "frames_per_s": round(batch / (float(np.median(times)) / 1e3)),
                          "faces_per_frame": len(results[0].faces),
                          "stage_ms": {k: round(v, 2) for k, v in stage.items()}}), flush=True)
    perception.close()
    stream.close()


if __name__ == "__main__":
    main()
