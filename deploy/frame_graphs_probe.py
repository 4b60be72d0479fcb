"""Probe of the frame graphs on the GPU (deploy/gpu-bench.sh frames-probe): where ONNX Runtime places their nodes,
and what one batch costs on the device, with frames already in GPU memory (as NVDEC leaves them): per batch size
(padded to the lane's buckets, `STEP` in the environment, default 2), the letterbox alone, and ONNX Runtime's CUDA
graph capture (`enable_cuda_graph`) tried on both graphs (issue 11, item 4); the letterbox first halving by AveragePool vs by a strided Conv, the detector
graph with the CUDA provider's convolution options side by side, and ONNX Runtime's per-node profile of it at 32
frames (VARIANTS_ONLY=1 stops after those).

Prints one JSON line per measurement. Run from the project root with onnxruntime-gpu, cuda-python and the prepared
fp16 models:  python3 deploy/frame_graphs_probe.py .benchdata/video/group_1080p.mp4
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort

from pipeline.config.app import load_config
from pipeline.inference.frames import FramePerception
from pipeline.inference.gpu.cuda import DeviceBuffer, Stream, memory_info
from pipeline.inference.perception import load_perception
from pipeline.modelprep.frame_graphs import (
    FACE_OUTPUTS,
    FRAME_INDEX_INPUT,
    FRAME_INPUT,
    IOU_THRESHOLD,
    LETTERBOX_OUTPUT,
    MATRIX_INPUT,
    SCORE_THRESHOLD,
    FrameFormat,
    detector_frame_graph,
    letterbox_graph,
)

ROOT = Path(__file__).resolve().parents[1]
VIDEO = ROOT / ".benchdata" / "video" / "group_1080p.mp4"


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


def _timed(run: object, repeat: int = 10) -> float:
    """Median wall time of `run()` in ms, after one untimed run (capture, first-run planning)."""
    run()  # type: ignore[operator]
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        run()  # type: ignore[operator]
        times.append((time.monotonic() - t0) * 1e3)
    return round(float(np.median(times)), 3)


def _cuda_session(graph: bytes, cuda_graph: bool) -> object:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    provider = {"enable_cuda_graph": "1"} if cuda_graph else {}
    return ort.InferenceSession(graph, options, providers=[("CUDAExecutionProvider", provider)])


def _letterbox_alone(fmt: FrameFormat, frames: DeviceBuffer, batch: int, conv: bool) -> dict[str, object]:
    """The letterbox graph alone on `batch` device frames (float16 halvings, as the lane builds it): its share of
    the detector graph's cost, first halving by Transpose + AveragePool or by the transpose-free strided Conv."""
    graph = letterbox_graph(fmt, (640, 352), halve_in_fp16=True, conv_halving=conv).SerializeToString()
    session = _cuda_session(graph, False)
    binding = session.io_binding()  # type: ignore[attr-defined]
    binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, [batch, fmt.height, fmt.width, 3], frames.ptr)
    binding.bind_output(LETTERBOX_OUTPUT, "cuda")
    ms = _timed(lambda: session.run_with_iobinding(binding))  # type: ignore[attr-defined]
    output = binding.copy_outputs_to_cpu()[0]
    return {"letterbox_alone": {"batch": batch, "conv_halving": conv, "ms": ms, "checksum": int(output.sum(dtype=np.int64))}}


def _profiled(graph: bytes, provider: dict[str, str], label: str, bind: Callable[[Any], None],
              runs: int = 20) -> dict[str, object]:
    """ONNX Runtime's own per-node profile of `graph` (its host-side time per node: launch time for most CUDA
    kernels, the wait for nodes that synchronise), summed by node over `runs` runs, top 15, and the wall time per run
    for comparison: the difference is time between nodes."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = f"/tmp/profile_{label}"
    session = ort.InferenceSession(graph, options, providers=[("CUDAExecutionProvider", provider)])
    binding = session.io_binding()
    bind(binding)
    for _ in range(2):  # the first runs pick convolution algorithms: left out of the figures below
        session.run_with_iobinding(binding)
    started = time.monotonic()
    for _ in range(runs):
        session.run_with_iobinding(binding)
    wall_us = (time.monotonic() - started) * 1e6 / runs
    events = json.loads(Path(session.end_profiling()).read_text())
    model_runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    timed_from = model_runs[-runs][0] if len(model_runs) >= runs else 0
    per_node: dict[str, float] = {}
    by_provider: dict[str, float] = {}
    for event in events:
        if (event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
                and event["ts"] >= timed_from):
            key = f"{event['args'].get('op_name', '?')}:{event['name'][:-len('_kernel_time')]}"
            per_node[key] = per_node.get(key, 0.0) + event["dur"] / runs
            provider_name = event["args"].get("provider", "?")
            by_provider[provider_name] = by_provider.get(provider_name, 0.0) + event["dur"] / runs
    in_runs = [end - start for start, end in model_runs[-runs:]]
    top = sorted(per_node.items(), key=lambda item: -item[1])[:15]
    return {"profile": label, "us_per_run": {k: round(v, 1) for k, v in top},
            "us_nodes_total": round(sum(per_node.values()), 1), "us_by_provider": {k: round(v, 1) for k, v in
                                                                                   by_provider.items()},
            "us_wall_per_run": round(wall_us, 1),
            "us_model_run_p50": round(float(np.median(in_runs)), 1) if in_runs else None}


PROVIDER_VARIANTS = {
    "heuristic": {"cudnn_conv_algo_search": "HEURISTIC"},  # what the lanes use today
    "exhaustive": {"cudnn_conv_algo_search": "EXHAUSTIVE"},
    "heuristic_prefer_nhwc": {"cudnn_conv_algo_search": "HEURISTIC", "prefer_nhwc": "1"},
    "exhaustive_prefer_nhwc": {"cudnn_conv_algo_search": "EXHAUSTIVE", "prefer_nhwc": "1"},
}


def _detector_variants(fmt: FrameFormat, frames: DeviceBuffer, batch: int) -> None:
    """The whole detector graph on `batch` device frames: the letterbox's first halving by AveragePool or by a
    strided Conv x the CUDA provider's convolution options, one JSON line each, with whether the faces found are the
    same as the first variant's; then its per-node profile alone and (LOAD_PROFILE) under each kind of load."""
    model = onnx.load(str(ROOT / "models" / "retinaface_mnet025.fp16.onnx"))
    thresholds = {SCORE_THRESHOLD: np.array([0.5], np.float32), IOU_THRESHOLD: np.array([0.4], np.float32)}

    def bind(binding: Any) -> None:
        binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, [batch, fmt.height, fmt.width, 3], frames.ptr)
        for name, value in thresholds.items():
            binding.bind_cpu_input(name, value)
        for name in FACE_OUTPUTS:
            binding.bind_output(name, "cpu")
    reference = None
    for conv in (False, True):
        graph = detector_frame_graph(model, fmt, (640, 352), 64, True, conv).SerializeToString()
        for label, provider in PROVIDER_VARIANTS.items():
            try:
                options = ort.SessionOptions()
                options.log_severity_level = 3
                session = ort.InferenceSession(graph, options, providers=[("CUDAExecutionProvider", provider)])
                binding = session.io_binding()
                bind(binding)
                ms = _timed(lambda: session.run_with_iobinding(binding), 20)
                scores = binding.copy_outputs_to_cpu()[0]
                reference = scores if reference is None else reference
                same = float(np.abs(scores - reference).max())
                print(json.dumps({"detector_variant": label, "conv_halving": conv, "batch": batch, "ms": ms,
                                  "faces_per_frame": int((scores[0] > 0.5).sum()), "score_max_diff": same}),
                      flush=True)
            except Exception as exc:  # noqa: BLE001 - a probe reports what ONNX Runtime refused, whatever its type
                print(json.dumps({"detector_variant": label, "conv_halving": conv,
                                  "error": f"{type(exc).__name__}: {str(exc)[:300]}"}), flush=True)
    graph = detector_frame_graph(model, fmt, (640, 352), 64, True, False).SerializeToString()
    provider = PROVIDER_VARIANTS["heuristic"]
    print(json.dumps(_profiled(graph, provider, "detector_alone", bind)), flush=True)
    if not os.environ.get("LOAD_PROFILE"):
        return
    # The same profile inside a pipeline's surroundings, one kind of load at a time: which slows a batch down, and
    # whether inside ONNX Runtime's nodes (GPU or driver contention) or around them (waiting for the GIL back).
    loads: dict[str, Callable[[threading.Event], list[threading.Thread]]] = {
        "64_decoders": lambda stop: _decode_load(VIDEO, 64, stop),
        "16_python_threads": lambda stop: _python_load(16, stop),
        "16_python_threads_switch_0.5ms": lambda stop: _python_load(16, stop),
        "64_decoders_16_python_threads": lambda stop: [*_decode_load(VIDEO, 64, stop), *_python_load(16, stop)],
    }
    for label, start in loads.items():
        stop = threading.Event()
        threads = start(stop)
        if "switch" in label:
            sys.setswitchinterval(0.0005)
        time.sleep(3.0)
        print(json.dumps(_profiled(graph, provider, f"detector_under_{label}", bind, 40)), flush=True)
        sys.setswitchinterval(0.005)
        stop.set()
        for thread in threads:
            thread.join(5.0)


def _python_load(count: int, stop: threading.Event) -> list[threading.Thread]:
    threads = [threading.Thread(target=_busy, args=(stop,), daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def _classifier_cuda_graph(graph: bytes, fmt: FrameFormat, frames: DeviceBuffer, max_batch: int,
                           faces: int) -> dict[str, object]:
    """The crop+classify graph for `faces` faces, plain vs captured as a CUDA graph (inputs at fixed addresses)."""
    matrices = np.tile(np.array([[0.5, 0, 100], [0, 0.5, 100]], np.float32), (faces, 1, 1))
    index = (np.arange(faces) % max_batch).astype(np.int64)
    result: dict[str, object] = {"faces": faces}
    for label, captured in (("plain_ms", False), ("cuda_graph_ms", True)):
        try:
            session = _cuda_session(graph, captured)
            binding = session.io_binding()  # type: ignore[attr-defined]
            values = {MATRIX_INPUT: ort.OrtValue.ortvalue_from_numpy(matrices, "cuda", 0),
                      FRAME_INDEX_INPUT: ort.OrtValue.ortvalue_from_numpy(index, "cuda", 0)}
            binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, [max_batch, fmt.height, fmt.width, 3], frames.ptr)
            for name, value in values.items():
                binding.bind_ortvalue_input(name, value)
            output = session.get_outputs()[0].name  # type: ignore[attr-defined]
            probs = ort.OrtValue.ortvalue_from_shape_and_type([faces, 7], np.float32, "cuda", 0)
            binding.bind_ortvalue_output(output, probs)

            def run() -> None:
                values[MATRIX_INPUT].update_inplace(matrices)  # what a real batch does: new matrices each time
                session.run_with_iobinding(binding)  # type: ignore[attr-defined]
                probs.numpy()
            result[label] = _timed(run)
        except Exception as exc:  # noqa: BLE001 - a probe reports what ONNX Runtime refused, whatever its type
            result[label] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return result


def _detector_cuda_graph(graph: bytes) -> dict[str, object]:
    """Whether the detector graph can be captured at all (its NMS output size depends on the data)."""
    try:
        session = _cuda_session(graph, True)
        feeds = {arg.name: np.zeros([d if isinstance(d, int) else 1 for d in arg.shape],
                                    {"tensor(uint8)": np.uint8}.get(arg.type, np.float32))
                 for arg in session.get_inputs()}  # type: ignore[attr-defined]
        binding = session.io_binding()  # type: ignore[attr-defined]
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        for arg in session.get_outputs():  # type: ignore[attr-defined]
            binding.bind_output(arg.name, "cuda")
        session.run_with_iobinding(binding)  # type: ignore[attr-defined]
        session.run_with_iobinding(binding)  # type: ignore[attr-defined]
        return {"detector_cuda_graph": "captured"}
    except Exception as exc:  # noqa: BLE001 - a probe reports what ONNX Runtime refused, whatever its type
        return {"detector_cuda_graph": f"{type(exc).__name__}: {str(exc)[:400]}"}


def _decode_load(video: Path, cameras: int, stop: threading.Event) -> list[threading.Thread]:
    """`cameras` NVDEC decoders at the clip's own rate, frames kept on the GPU and dropped: the decoding side of the
    pipeline without the analysis, to see what it costs a batch run on the same GPU."""
    from pipeline.capture.nvdec import NvdecSource

    def decode(index: int) -> None:
        source = NvdecSource(str(video), f"load{index}", loop=True, paced=True, keep_on_device=True)
        try:
            while not stop.is_set():
                source.grab(1.0)
                image = source.retrieve()
                del image
        finally:
            source.close()
    threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(cameras)]
    for thread in threads:
        thread.start()
    return threads


def _under_load(engine: object, frame: object, video: Path, cameras: int) -> None:
    """Batch cost of 32 frames alone, then while `cameras` NVDEC decoders run (same process, same GPU)."""
    items = [frame] * 32
    alone = _timed(lambda: engine.run_items(items, 0), 20)  # type: ignore[attr-defined]
    stop = threading.Event()
    threads = _decode_load(video, cameras, stop)
    time.sleep(3.0)
    loaded = _timed(lambda: engine.run_items(items, 0), 40)  # type: ignore[attr-defined]
    stop.set()
    for thread in threads:
        thread.join(5.0)
    print(json.dumps({"batch": 32, "alone_ms": alone, "decoders": cameras, "with_decoders_ms": loaded}), flush=True)


def _busy(stop: threading.Event) -> None:
    """Pure-Python work in bursts, as camera workers do between frames (tracking, events): GIL contention."""
    while not stop.is_set():
        total = 0
        for i in range(20000):
            total += i * i
        time.sleep(0.002)


def _under_gil_load(engine: object, frame: object, threads: int) -> None:
    items = [frame] * 32
    stop = threading.Event()
    workers = [threading.Thread(target=_busy, args=(stop,), daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    loaded = _timed(lambda: engine.run_items(items, 0), 40)  # type: ignore[attr-defined]
    sys.setswitchinterval(0.0005)
    fast_switch = _timed(lambda: engine.run_items(items, 0), 40)  # type: ignore[attr-defined]
    sys.setswitchinterval(0.005)
    stop.set()
    for worker in workers:
        worker.join(5.0)
    print(json.dumps({"batch": 32, "python_threads": threads, "with_gil_load_ms": loaded,
                      "switch_0.5ms": fast_switch}), flush=True)


def _batch_buffer(frame: _DeviceFrame, nbytes: int, stream: Stream) -> DeviceBuffer:
    """64 copies of the frame, one after another: a full batch in one device buffer, as a lane holds it."""
    frames = DeviceBuffer("probe batch", nbytes * 64)
    for row in range(64):
        stream.copy_within(frames.ptr + row * nbytes, frame.ptr, nbytes, "probe batch row")
    stream.synchronize()
    return frames


def _variants(fmt: FrameFormat, frames: DeviceBuffer) -> None:
    for batch in (32, 64):
        for conv in (False, True):
            print(json.dumps(_letterbox_alone(fmt, frames, batch, conv)), flush=True)
    _detector_variants(fmt, frames, 32)


def main() -> None:
    video = Path(sys.argv[1])
    cap = cv2.VideoCapture(str(video))
    ok, bgr = cap.read()
    cap.release()
    if not ok:
        raise SystemExit(f"cannot read {video}")
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    step = int(os.environ.get("STEP", "2"))
    cfg = load_config(ROOT / "config" / "default.yaml")
    inference = cfg.inference.model_copy(update={"device": "cuda", "precision": "fp16", "frame_path": "graph",
                                                 "max_batch": 64, "lanes": 1, "batch_step": step})
    detector = cfg.detector.model_copy(update={"input_size": (640, 352)})
    cfg = cfg.model_copy(update={"inference": inference, "detector": detector})
    fmt = FrameFormat(rgb.shape[1], rgb.shape[0], "rgb")
    if os.environ.get("VARIANTS_ONLY"):  # the letterbox and detector variants only, no lane prepared
        stream = Stream("probe")
        frame = _DeviceFrame(rgb, stream)
        frames = _batch_buffer(frame, rgb.nbytes, stream)
        _variants(fmt, frames)
        return
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
    for batch in (1, 8, 16, 24, 32, 48, 64):
        items = [frame] * batch
        engine.run_items(items, 0)
        times = []
        for _ in range(10):
            t0 = time.monotonic()
            results = engine.run_items(items, 0)
            times.append((time.monotonic() - t0) * 1e3)
        stage = results[0].timings
        print(json.dumps({"batch": batch, "step": step, "ms_per_batch_p50": round(float(np.median(times)), 2),
                          "frames_per_s": round(batch / (float(np.median(times)) / 1e3)),
                          "faces_per_frame": len(results[0].boxes),
                          "stage_ms": {k: round(v, 2) for k, v in stage.items()}}), flush=True)
    if os.environ.get("LOAD"):
        for cameras in (16, 64):
            _under_load(engine, frame, video, cameras)
    if os.environ.get("GIL_LOAD"):
        for threads in (4, 16, 64):
            _under_gil_load(engine, frame, threads)
    frames = _batch_buffer(frame, rgb.nbytes, stream)
    _variants(fmt, frames)
    print(json.dumps(_detector_cuda_graph(graphs.detector(fmt))), flush=True)
    for faces in (64, 256):
        print(json.dumps(_classifier_cuda_graph(graphs.classifier(fmt), fmt, frames, 64, faces)), flush=True)
    perception.close()
    frames.close()
    stream.close()


if __name__ == "__main__":
    main()
