"""ONNX Runtime's CUDA path (lanes with their own streams and pinned staging) against the CPU path, on real frames.

Runs only where onnxruntime-gpu and an NVIDIA GPU are present (the lent H200: see deploy/gpu-bench.sh)."""

from __future__ import annotations

import threading

import cv2
import numpy as np
import pytest

from pipeline.core.types import Detection
from pipeline.inference.backend import ModelRuntime, create_backend
from pipeline.inference.batching import BatchedModel
from pipeline.modelprep.manifest import load_manifest
from pipeline.modelprep.prepare import ensure_model
from pipeline.tools.bench_engine import video_frames
from pipeline.vision.retinaface import Letterbox, decode, letterbox
from tests.conftest import data_path

ort = pytest.importorskip("onnxruntime")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                                 reason="needs onnxruntime-gpu with a CUDA device")]


DETECTOR_INPUT = (640, 352)


def _items(name: str, frames: list[np.ndarray]) -> list[np.ndarray]:
    if name == "retinaface_mnet025":
        return [letterbox(f, DETECTOR_INPUT)[0] for f in frames]
    return [cv2.resize(cv2.cvtColor(f, cv2.COLOR_BGR2GRAY)[40:300, 160:420], (64, 64))[:, :, None] for f in frames]


# Emotion probabilities: cuDNN runs fp32 convolutions in TF32 on Hopper, so they stay within 2e-3 of the CPU's.
TOLERANCE = {"fp32": 2e-3, "fp16": 5e-2}
# Detections (decoded from the top candidates): pixels of the 640x352 input.
BOX_TOLERANCE_PX = {"fp32": 1.0, "fp16": 2.0}


def _faces(outputs: dict[str, np.ndarray]) -> list[Detection]:
    fit = Letterbox(1.0, DETECTOR_INPUT)
    return decode(outputs, DETECTOR_INPUT, fit, score_threshold=0.8, nms_threshold=0.4)


def _assert_same_faces(got: dict[str, np.ndarray], want: dict[str, np.ndarray], precision: str) -> None:
    """Raw candidates may swap places on near-equal scores, so the decoded faces are compared."""
    ours, theirs = _faces(got), _faces(want)
    assert len(ours) == len(theirs)
    for a, b in zip(sorted(ours, key=lambda f: f.box), sorted(theirs, key=lambda f: f.box)):
        assert np.abs(np.subtract(a.box, b.box)).max() <= BOX_TOLERANCE_PX[precision]
        assert np.abs(a.landmarks - b.landmarks).max() <= BOX_TOLERANCE_PX[precision]


@pytest.mark.parametrize("name", ["retinaface_mnet025", "mini_xception_fer2013"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_lanes_match_cpu(prepared_models: None, name: str, precision: str) -> None:
    manifest = load_manifest(name)
    path = ensure_model(manifest, precision)  # type: ignore[arg-type]
    cpu = create_backend(ModelRuntime("onnxruntime", "cpu", precision, max_batch=16), manifest, path)
    gpu = create_backend(ModelRuntime("onnxruntime", "cuda", precision, max_batch=16, lanes=2), manifest, path)
    model = BatchedModel(gpu, name, max_batch=16, max_delay_ms=2.0)
    items = _items(name, video_frames(data_path("video", "woman2.mp4"), 48))
    results: dict[int, dict[str, np.ndarray]] = {}

    def submit(offset: int) -> None:  # three threads, so batches of several sizes land on both lanes
        for i in range(offset, len(items), 3):
            results[i] = model.infer(items[i])

    threads = [threading.Thread(target=submit, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    model.close()
    expected = cpu.run({"image": np.stack(items)})
    cpu.close()
    assert len(results) == len(items)
    if name == "retinaface_mnet025":
        faces = 0
        for i in range(len(items)):
            _assert_same_faces(results[i], {k: v[i] for k, v in expected.items()}, precision)
            faces += len(_faces(results[i]))
        assert faces >= len(items) // 2  # the clip shows a face in most frames: the comparison is not vacuous
        return
    for output, reference in expected.items():
        got = np.stack([results[i][output] for i in range(len(items))])
        assert np.isfinite(got).all()
        assert np.abs(got - reference).max() <= TOLERANCE[precision], f"{output}: {np.abs(got - reference).max()}"


def test_cuda_lane_serves_two_input_sizes(prepared_models: None) -> None:
    """Cameras of different aspect ratios (detector.input_size: auto) share one lane: each input size keeps its own
    sessions and buffers, so switching back and forth neither re-plans a session nor mixes up buffers; a run of one
    frame is padded up to the smallest prepared size."""
    from pipeline.inference.gpu.cuda_lane import SMALLEST_DETECT_RUN

    manifest = load_manifest("retinaface_mnet025")
    path = ensure_model(manifest, "fp32")
    cpu = create_backend(ModelRuntime("onnxruntime", "cpu", "fp32", max_batch=8), manifest, path)
    gpu = create_backend(ModelRuntime("onnxruntime", "cuda", "fp32", max_batch=8, lanes=1), manifest, path)
    frames = video_frames(data_path("video", "woman2.mp4"), 6)
    sessions_after: list[int] = []
    faces = 0
    for _ in range(2):
        for size in ((640, 352), (640, 480)):
            batch = np.stack([letterbox(frame, size)[0] for frame in frames])
            got, want = gpu.run({"image": batch}), cpu.run({"image": batch})
            for i in range(len(frames)):
                ours = decode({k: v[i] for k, v in got.items()}, size, Letterbox(1.0, size), 0.8, 0.4)
                theirs = decode({k: v[i] for k, v in want.items()}, size, Letterbox(1.0, size), 0.8, 0.4)
                assert len(ours) == len(theirs)
                for a, b in zip(sorted(ours, key=lambda f: f.box), sorted(theirs, key=lambda f: f.box)):
                    assert np.abs(np.subtract(a.box, b.box)).max() <= BOX_TOLERANCE_PX["fp32"]
                faces += len(ours)
        sessions_after.append(len(gpu._cuda_lanes[0]._sessions))  # a test may look inside: one per (bucket, size)
    # one frame runs padded up to SMALLEST_DETECT_RUN (no session of its own), over rows that still hold the last
    # batch's frames, and gives that frame's faces alone
    one = np.stack([letterbox(frames[0], DETECTOR_INPUT)[0]])
    got, want = gpu.run({"image": one}), cpu.run({"image": one})
    assert all(len(value) == 1 for value in got.values())
    first = {k: v[0] for k, v in want.items()}
    _assert_same_faces({k: v[0] for k, v in got.items()}, first, "fp32")
    assert _faces(first)  # the frame shows her face: the comparison is not vacuous
    buckets = sorted(bucket for bucket, _ in gpu._cuda_lanes[0]._sessions)
    gpu.close()
    cpu.close()
    assert faces >= len(frames) * 2  # woman2 shows her face: the comparison is not vacuous
    assert sessions_after == [2, 2]  # the second round reused both sizes' sessions
    assert buckets == [SMALLEST_DETECT_RUN, 8, 8], buckets


def test_gpu_wait_sets_the_primary_context_flags() -> None:
    """inference.gpu_wait reaches the driver: the primary context's scheduling flag reads back as set, before and
    after the context is live (ONNX Runtime and NVDEC wait through it)."""
    from pipeline.inference.gpu.cuda import CudaDevice, gpu_wait_of, set_gpu_wait

    try:
        assert set_gpu_wait("spin") and gpu_wait_of(0) == "spin"
        CudaDevice.open(0)  # the runtime makes the primary context live
        set_gpu_wait("block")
        assert gpu_wait_of(0) == "block"
    finally:
        set_gpu_wait("block")


def test_models_run_on_a_small_gpu_thread_stack(prepared_models: None) -> None:
    """inference.gpu_stack_bytes reaches the context (read back), and the detector still finds the CPU's faces with
    the smallest stack asked for: CUDA grows the stack by itself for a kernel that needs more."""
    from pipeline.inference.gpu.cuda import CUDA_DEFAULT_STACK_BYTES, gpu_stack_of, set_gpu_stack

    manifest = load_manifest("retinaface_mnet025")
    path = ensure_model(manifest, "fp16")
    try:
        assert set_gpu_stack(256) == 256 == gpu_stack_of(0)
        small = set_gpu_stack(0)
        assert small < 256  # the driver's minimum
        cpu = create_backend(ModelRuntime("onnxruntime", "cpu", "fp16", max_batch=8), manifest, path)
        gpu = create_backend(ModelRuntime("onnxruntime", "cuda", "fp16", max_batch=8, lanes=1), manifest, path)
        batch = np.stack(_items("retinaface_mnet025", video_frames(data_path("video", "woman2.mp4"), 8)))
        got, want = gpu.run({"image": batch}), cpu.run({"image": batch})
        gpu.close()
        cpu.close()
        faces = 0
        for i in range(len(batch)):
            _assert_same_faces({k: v[i] for k, v in got.items()}, {k: v[i] for k, v in want.items()}, "fp16")
            faces += len(_faces({k: v[i] for k, v in got.items()}))
        assert faces >= len(batch) // 2
        assert gpu_stack_of(0) >= small
    finally:
        set_gpu_stack(CUDA_DEFAULT_STACK_BYTES)
