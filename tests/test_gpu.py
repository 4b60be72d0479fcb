"""ONNX Runtime's CUDA path (lanes with their own streams and pinned staging) against the CPU path, on real frames.

Runs only where onnxruntime-gpu and an NVIDIA GPU are present (the lent H200: see deploy/gpu-bench.sh)."""

from __future__ import annotations

import threading

import cv2
import numpy as np
import pytest

from pipeline.backends.base import create_backend
from pipeline.batching import BatchedModel
from pipeline.bench_engine import video_frames
from pipeline.config import InferenceConfig
from pipeline.detect import letterbox
from pipeline.manifest import load_manifest
from pipeline.models import ensure_model
from tests.conftest import data_path

ort = pytest.importorskip("onnxruntime")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                                 reason="needs onnxruntime-gpu with a CUDA device")]


def _items(name: str, frames: list[np.ndarray]) -> list[np.ndarray]:
    if name == "retinaface_mnet025":
        return [letterbox(f, (640, 352))[0] for f in frames]
    return [cv2.resize(cv2.cvtColor(f, cv2.COLOR_BGR2GRAY)[40:300, 160:420], (64, 64))[:, :, None] for f in frames]


# cuDNN runs fp32 convolutions in TF32 on Hopper, so raw regression outputs differ by ~1e-2 from the CPU's fp32;
# the emotion probabilities stay within 2e-3.
TOLERANCE = {("retinaface_mnet025", "fp32"): 0.05, ("retinaface_mnet025", "fp16"): 0.3,
             ("mini_xception_fer2013", "fp32"): 2e-3, ("mini_xception_fer2013", "fp16"): 5e-2}


@pytest.mark.parametrize("name", ["retinaface_mnet025", "mini_xception_fer2013"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_lanes_match_cpu(prepared_models: None, name: str, precision: str) -> None:
    atol = TOLERANCE[(name, precision)]
    manifest = load_manifest(name)
    path = ensure_model(manifest, precision)  # type: ignore[arg-type]
    cpu = create_backend(InferenceConfig(device="cpu", precision=precision, max_batch=16), manifest, path)
    gpu = create_backend(InferenceConfig(device="cuda", precision=precision, max_batch=16, lanes=2), manifest, path)
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
    for output, reference in expected.items():
        got = np.stack([results[i][output] for i in range(len(items))])
        assert np.isfinite(got).all()
        assert np.abs(got - reference).max() <= atol, f"{output}: {np.abs(got - reference).max()}"
