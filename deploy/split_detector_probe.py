"""Probe for issue 25's cores target: the frame detector graph split in two, its body captured as a CUDA graph.

The lanes' CPU is ONNX Runtime launching the frame graphs' kernels node by node (BENCHMARKS.md round 8: 82 % of a
lane's samples in `run_with_iobinding`). ONNX Runtime's CUDA graph capture (`enable_cuda_graph`) would replay a
whole run in one launch, but the detector graph cannot be captured whole: its NonMaxSuppression allocates during the
run (BENCHMARKS.md, "CUDA graphs (item 4), probe"). Split at the prepared detector's outputs (fixed shapes: the top
K candidates), the body (letterbox + network + TopK) might be captured and the tail (decode + NMS) run as today.

Per batch size, three ways, each in sessions of their own: the whole graph as the lanes run it; body + tail, both
plain; body captured + tail plain; on cuda each also with sessions made as the lanes make theirs (`_lane`:
shared arena, the lane's own stream, memory pattern off). Printed per way: wall ms and this thread's CPU ms per run
(medians), and whether the faces equal the whole graph's. One JSON line per batch size. Then, on cuda, the crop +
emotion graph (which can be captured whole: BENCHMARKS.md, "CUDA graphs (item 4), probe", which timed its wall
only) plain and captured, both ways, per face count of --faces, with new crop matrices written in place before every
run as a lane would.

    python3 deploy/split_detector_probe.py [--device cuda|cpu] [--batches 4,8,16] [--faces 16,64,256] [--runs 30]

Run from the project root with the prepared models (fp16 on cuda, fp32 on cpu) and .benchdata/video/group_1080p.mp4
(or ../shared/data); on the CPU only the first two ways run (a check that the split gives the same faces).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort
from pipeline.inference.backend import ONNX_NUMPY_TYPES
from pipeline.modelprep.frame_graphs import (
    DETECTOR_OUTPUTS,
    FACE_OUTPUTS,
    FRAME_INDEX_INPUT,
    FRAME_INPUT,
    IOU_THRESHOLD,
    MATRIX_INPUT,
    SCORE_THRESHOLD,
    FrameFormat,
    crop_classify_graph,
    detector_frame_graph,
    detector_graph_parts,
)
from pipeline.modelprep.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[1]
INPUT_SIZE = (640, 352)
FACES = 64  # inference.frames.GRAPH_FACES
THRESHOLDS = {SCORE_THRESHOLD: np.array([0.5], np.float32), IOU_THRESHOLD: np.array([0.4], np.float32)}


def split_graphs(detector: onnx.ModelProto, fmt: FrameFormat,
                 on_gpu: bool) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(body, tail): frame_graphs.detector_graph_parts as the lanes would build them on this device."""
    parts = detector_graph_parts(detector, fmt, INPUT_SIZE, FACES, halve_in_fp16=on_gpu, conv_halving=on_gpu)
    return parts.body, parts.tail


_LANE_STREAMS: list[Any] = []  # the one stream the lane-like sessions run on (made on first use)


def _lane_session(graph: onnx.ModelProto, captured: bool) -> Any:
    """A session made as the frame lanes make theirs (pipeline/inference/frames.py): a non-blocking stream of its
    own as user_compute_stream, memory pattern off, the shared CUDA arena, or, captured, an arena of its own. Why:
    whether ONNX Runtime's capture works, and what it saves, with the lanes' own options and not only with the
    defaults."""
    from pipeline.inference.gpu.cuda import Stream
    from pipeline.inference.onnxruntime import (
        captured_provider_options,
        cuda_provider_options,
        make_session,
        share_cuda_arena,
    )

    if not _LANE_STREAMS:
        _LANE_STREAMS.append(Stream("probe lane"))
    options = (captured_provider_options if captured else cuda_provider_options)(_LANE_STREAMS[0].handle, True)
    return make_session(ort, graph.SerializeToString(), "probe session", 1, [("CUDAExecutionProvider", options)],
                        share_cuda_arena(ort) and not captured, False)


def _session(graph: onnx.ModelProto, device: str, captured: bool = False, lane: bool = False) -> Any:
    if lane:
        return _lane_session(graph, captured)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    if device == "cpu":
        return ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
    provider = {"cudnn_conv_algo_search": "HEURISTIC", **({"enable_cuda_graph": "1"} if captured else {})}
    return ort.InferenceSession(graph.SerializeToString(), options, providers=[("CUDAExecutionProvider", provider)])


def _gpu_mib() -> float:
    """This process's GPU memory by nvidia-smi (0 where it cannot say): read after each way, so the steps between
    ways show what a way's sessions (a captured graph keeps its own buffers) added."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0.0
    rows = [line.split(",") for line in out.splitlines() if "," in line]
    return sum(float(used) for pid, used in rows if pid.strip() == str(os.getpid()))


def _timed(run: Any, runs: int) -> dict[str, float]:
    """Median wall and this thread's CPU ms of `run()`, after two untimed runs (planning, capture), and the process's
    GPU memory after them."""
    run()
    run()
    wall, cpu = [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.thread_time()
        run()
        cpu.append((time.thread_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    return {"wall_ms": round(float(np.median(wall)), 3), "cpu_ms": round(float(np.median(cpu)), 3),
            "gpu_mib_after": _gpu_mib()}


class _Way:
    """One way of running the detector on a batch: `run()` and the faces of its last run."""

    def __init__(self) -> None:
        self.faces: list[np.ndarray] = []

    def run(self) -> None:
        raise NotImplementedError


def _faces_binding(session: Any, inputs: dict[str, Any]) -> Any:
    """`session`'s I/O binding: `inputs` (OrtValues) and the thresholds in, the faces out to the host."""
    binding = session.io_binding()
    for name, value in inputs.items():
        binding.bind_ortvalue_input(name, value)
    for name, threshold in THRESHOLDS.items():
        binding.bind_cpu_input(name, threshold)
    for name in FACE_OUTPUTS:
        binding.bind_output(name, "cpu")
    return binding


class _Whole(_Way):
    def __init__(self, graph: onnx.ModelProto, device: str, frames: Any, lane: bool = False) -> None:
        super().__init__()
        self.session = _session(graph, device, lane=lane)
        self.binding = _faces_binding(self.session, {FRAME_INPUT: frames})

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)
        self.faces = self.binding.copy_outputs_to_cpu()


class _Split(_Way):
    """The body's outputs stay on the device at fixed addresses (what a captured graph needs), read by the tail."""

    def __init__(self, body: onnx.ModelProto, tail: onnx.ModelProto, device: str, frames: Any, batch: int,
                 captured: bool, lane: bool = False) -> None:
        super().__init__()
        self.body = _session(body, device, captured, lane)
        self.tail = _session(tail, device, lane=lane)
        where = "cuda" if device == "cuda" else "cpu"
        shapes = {o.name: o.shape for o in self.body.get_outputs()}
        types = {o.name: o.type for o in self.body.get_outputs()}
        self.middle = {name: ort.OrtValue.ortvalue_from_shape_and_type(  # [batch, K, ...]: fixed by the parts
            [batch, *shapes[name][1:]], ONNX_NUMPY_TYPES[types[name]], where, 0) for name in DETECTOR_OUTPUTS}
        self.body_binding = self.body.io_binding()
        self.body_binding.bind_ortvalue_input(FRAME_INPUT, frames)
        for name, value in self.middle.items():
            self.body_binding.bind_ortvalue_output(name, value)
        self.tail_binding = _faces_binding(self.tail, self.middle)

    def run(self) -> None:
        self.body.run_with_iobinding(self.body_binding)
        self.tail.run_with_iobinding(self.tail_binding)
        self.faces = self.tail_binding.copy_outputs_to_cpu()


def _same_faces(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.allclose(x, y, atol=1e-3) for x, y in zip(a, b))


def _frame(video: Path) -> np.ndarray:
    capture = cv2.VideoCapture(str(video))
    capture.set(cv2.CAP_PROP_POS_FRAMES, 40)
    ok, bgr = capture.read()
    capture.release()
    if not ok:
        raise SystemExit(f"cannot read a frame of {video}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def probe(batch: int, device: str, detector: onnx.ModelProto, rgb: np.ndarray, runs: int) -> dict[str, object]:
    fmt = FrameFormat(rgb.shape[1], rgb.shape[0], "rgb")
    on_gpu = device == "cuda"
    whole_graph = detector_frame_graph(detector, fmt, INPUT_SIZE, FACES, halve_in_fp16=on_gpu, conv_halving=on_gpu)
    body, tail = split_graphs(detector, fmt, on_gpu)
    frames = ort.OrtValue.ortvalue_from_numpy(np.repeat(rgb[None], batch, axis=0), "cuda" if on_gpu else "cpu", 0)
    ways: dict[str, _Way] = {"whole": _Whole(whole_graph, device, frames),
                             "split": _Split(body, tail, device, frames, batch, captured=False)}
    result: dict[str, object] = {"batch": batch, "device": device}
    if on_gpu:
        ways["whole_lane"] = _Whole(whole_graph, device, frames, lane=True)
        for name, lane in (("split_body_captured", False), ("split_lane", True), ("split_body_captured_lane", True)):
            try:
                ways[name] = _Split(body, tail, device, frames, batch, name != "split_lane", lane)
            except Exception as exc:  # noqa: BLE001 - a probe reports what ONNX Runtime refused, whatever its type
                result[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    for name, way in ways.items():
        try:
            result[name] = _timed(way.run, runs)
        except Exception as exc:  # noqa: BLE001 - e.g. a capture that fails on its first run
            result[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    reference = ways["whole"].faces
    result["same_faces"] = {name: _same_faces(reference, way.faces) for name, way in ways.items() if way.faces}
    result["same_faces_interleaved"] = _interleaved(ways, reference)
    result["faces_in_first_frame"] = int((reference[0][0] > 0).sum()) if reference else 0
    return result


def _interleaved(ways: dict[str, _Way], reference: list[np.ndarray], rounds: int = 3) -> dict[str, bool]:
    """Each way run in turn with the others, `rounds` times: whether every run still gives the reference faces. Why:
    a captured graph replays into the addresses it was captured with; if the shared arena handed those to another
    session in between, the faces would change only when the sessions interleave, as a lane's do."""
    same = {name: True for name, way in ways.items() if way.faces}
    for _ in range(rounds):
        for name in same:
            try:
                ways[name].run()
                same[name] = same[name] and _same_faces(reference, ways[name].faces)
            except Exception:  # noqa: BLE001 - a probe reports a failing way as not the same
                same[name] = False
    return same


def classifier_probe(faces: int, rgb: np.ndarray, runs: int, frames_in_buffer: int = 16) -> dict[str, object]:
    """The student emotion model's crop + classify graph over a buffer of `frames_in_buffer` frames, `faces` crops,
    plain and captured: wall and CPU ms per run, and whether both give the same probabilities."""
    manifest = load_manifest("dlibface_student64")
    if manifest.input.size is None:
        raise SystemExit("dlibface_student64's manifest has no input size")
    model = onnx.load(str(ROOT / "models" / "dlibface_student64.fp16.onnx"))
    fmt = FrameFormat(rgb.shape[1], rgb.shape[0], "rgb")
    graph = crop_classify_graph(model, fmt, manifest.input.size, manifest.input.color)
    frames = ort.OrtValue.ortvalue_from_numpy(np.repeat(rgb[None], frames_in_buffer, axis=0), "cuda", 0)
    rng = np.random.default_rng(0)
    matrices = np.tile(np.array([[1.5, 0, 800], [0, 1.5, 300]], np.float32), (faces, 1, 1))
    matrices[:, :, 2] += rng.uniform(-200, 200, (faces, 2)).astype(np.float32)
    index = (np.arange(faces) % frames_in_buffer).astype(np.int64)
    result: dict[str, object] = {"faces": faces}
    probs: dict[str, np.ndarray] = {}
    ways = (("classify", False, False), ("classify_captured", True, False), ("classify_lane", False, True),
            ("classify_captured_lane", True, True))
    for label, captured, lane in ways:
        try:
            session = _session(graph, "cuda", captured, lane)
            inputs = {MATRIX_INPUT: ort.OrtValue.ortvalue_from_numpy(matrices, "cuda", 0),
                      FRAME_INDEX_INPUT: ort.OrtValue.ortvalue_from_numpy(index, "cuda", 0)}
            output = ort.OrtValue.ortvalue_from_shape_and_type([faces, 7], np.float32, "cuda", 0)
            binding = session.io_binding()
            binding.bind_ortvalue_input(FRAME_INPUT, frames)
            for name, value in inputs.items():
                binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(session.get_outputs()[0].name, output)

            def run() -> None:
                inputs[MATRIX_INPUT].update_inplace(matrices)  # a lane's new matrices, at the same address
                session.run_with_iobinding(binding)
                probs[label] = output.numpy()
            result[label] = _timed(run, runs)
        except Exception as exc:  # noqa: BLE001 - a probe reports what ONNX Runtime refused, whatever its type
            result[label] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if "classify" in probs:
        result["same_probs"] = {label: bool(np.allclose(probs["classify"], value, atol=1e-3))
                                for label, value in probs.items() if label != "classify"}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--batches", default="4,8,16")
    parser.add_argument("--faces", default="16,64,256")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--video", type=Path, default=None)
    args = parser.parse_args()
    precision = "fp16" if args.device == "cuda" else "fp32"
    if args.device == "cuda":  # wait for the GPU as the daemon does (inference.gpu_wait: block), or CPU ms is spin
        from pipeline.inference.gpu.cuda import set_gpu_wait

        set_gpu_wait("block")
    detector = onnx.load(str(ROOT / "models" / f"retinaface_mnet025.{precision}.onnx"))
    candidates = [args.video] if args.video else [ROOT / ".benchdata" / "video" / "group_1080p.mp4",
                                                  ROOT.parent / "shared" / "data" / "video" / "group_1080p.mp4"]
    video = next((path for path in candidates if path and path.exists()), None)
    if video is None:
        raise SystemExit("group_1080p.mp4 not found: pass --video")
    rgb = _frame(video)
    for batch in (int(b) for b in args.batches.split(",")):
        print(json.dumps(probe(batch, args.device, detector, rgb, args.runs)), flush=True)
    if args.device == "cuda":
        for faces in (int(f) for f in args.faces.split(",")):
            print(json.dumps(classifier_probe(faces, rgb, args.runs)), flush=True)


if __name__ == "__main__":
    main()
