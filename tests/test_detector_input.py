"""Issue 12, item 14: the detector input follows the camera (`detector.input_size: auto`) and never upscales.

auto gives a 16:9 camera 640x352 instead of padding it into 640x480, a portrait camera 352x640, and a frame smaller
than that its own size rounded up to multiples of 32 at scale 1 (fit_size caps every letterbox scale at 1, for fixed
sizes too). Cameras of different shapes then send the shared detector inputs of different shapes: a batch runs one
group per shape (Backend.run_items). TensorRT engines are built for one size, so backend tensorrt with auto is a
config error. Real models through ONNX Runtime on real frames; skipped with a reason when the data is absent.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from pipeline.config.app import ConfigError, load_config, summarize
from pipeline.inference.backend import Backend, ModelRuntime, TensorSpec
from pipeline.inference.batching import BatchedModel
from pipeline.inference.detector import FaceDetector
from pipeline.inference.perception import load_batched_model
from pipeline.inference.settings import DetectorConfig, InferenceConfig
from pipeline.modelprep.manifest import load_manifest
from pipeline.vision.retinaface import auto_input_size, fit_size, letterbox
from tests.conftest import data_path

ROOT = Path(__file__).resolve().parents[1]


def _first_frame(name: str) -> np.ndarray:
    cap = cv2.VideoCapture(str(data_path("video", name)))
    ok, frame = cap.read()
    cap.release()
    if not ok:
        pytest.fail(f"cannot read a frame of {name}")
    return frame


# ---------------------------------------------------------------- the size rule


@pytest.mark.parametrize(("frame", "max_side", "expected"), [
    ((1920, 1080), 640, (640, 352)),
    ((1280, 720), 640, (640, 352)),
    ((640, 480), 640, (640, 480)),
    ((1080, 1920), 640, (352, 640)),
    ((596, 336), 640, (608, 352)),  # smaller than 640x352: its own size rounded up, not enlarged
    ((20, 20), 640, (32, 32)),  # at least 32
    ((1280, 720), 320, (320, 192)),
    ((640, 480), 320, (320, 256)),
])
def test_auto_input_size(frame: tuple[int, int], max_side: int, expected: tuple[int, int]) -> None:
    assert auto_input_size(frame, max_side) == expected
    assert all(side % 32 == 0 for side in expected)


def test_auto_is_the_default_and_a_fixed_size_still_wins() -> None:
    auto = DetectorConfig()
    assert auto.input_size == "auto" and auto.fixed_input_size is None and auto.max_input_side == 640
    assert auto.input_for((1920, 1080)) == (640, 352) and auto.input_for((1080, 1920)) == (352, 640)
    fixed = DetectorConfig(input_size=[640, 480])
    assert fixed.fixed_input_size == (640, 480) and fixed.input_for((1920, 1080)) == (640, 480)
    assert DetectorConfig(max_input_side=320).input_for((1920, 1080)) == (320, 192)
    with pytest.raises(ValueError, match="multiple of 32"):
        DetectorConfig(max_input_side=600)


def test_no_letterbox_enlarges_a_frame_even_into_a_fixed_size() -> None:
    assert fit_size((596, 336), (640, 480)) == (1.0, (596, 336))
    assert fit_size((596, 336), (608, 352)) == (1.0, (596, 336))
    assert fit_size((1920, 1080), (640, 352)) == (pytest.approx(352 / 1080), (626, 352))


# ---------------------------------------------------------------- the detector on real frames


@pytest.fixture(scope="module")
def detector_model(prepared_models: None) -> Iterator[BatchedModel]:
    """The prepared detector behind one BatchedModel; a long batch window, so frames submitted together batch."""
    model = load_batched_model(load_manifest("retinaface_mnet025"), InferenceConfig(max_batch=4, max_delay_ms=300))
    yield model
    model.close()


def test_small_clip_is_padded_not_enlarged_and_faces_are_in_frame_pixels(detector_model: BatchedModel) -> None:
    frame = _first_frame("woman2.mp4")
    assert frame.shape[:2] == (336, 596)
    detector = FaceDetector(detector_model, DetectorConfig(input_size="auto"))
    assert detector.input_for((596, 336)) == (608, 352)
    canvas, fit = letterbox(frame, detector.input_for((596, 336)))
    assert fit.scale == 1.0 and canvas.shape == (352, 608, 3)
    assert np.array_equal(canvas[:336, :596], frame)  # the frame itself, untouched; padding right and below
    faces = detector.detect(frame)
    assert len(faces) == 1
    x1, y1, x2, y2 = faces[0].box
    assert 0 <= x1 < x2 <= 596 and 0 <= y1 < y2 <= 336
    # The same frame at twice its size (1192x672 → 640x352, scale 0.537): the same face, boxes halved.
    big = detector.detect(cv2.resize(frame, None, fx=2.0, fy=2.0))
    assert len(big) == 1
    np.testing.assert_allclose(np.array(big[0].box) / 2.0, faces[0].box, atol=4.0)


def test_two_cameras_of_different_shapes_in_one_batch(detector_model: BatchedModel) -> None:
    """A 1080p camera (640x352 input) and a 596x336 one (608x352) batched together: each gets the faces it gets
    alone, in its own frame pixels."""
    detector = FaceDetector(detector_model, DetectorConfig(input_size="auto"))
    frames = [_first_frame("group_1080p.mp4"), _first_frame("woman2.mp4")]
    alone = [detector.detect(frame) for frame in frames]
    batches_before = detector_model.stats.batches
    pending = [detector.submit(frame) for frame in frames]  # within one batch window
    together = [detector.finish(future.result(timeout=10), fit) for future, fit in pending]
    assert detector_model.stats.batches == batches_before + 1 and detector_model.stats.batch_sizes[-1] == 2
    assert [len(faces) for faces in alone] == [len(faces) for faces in together]
    assert len(alone[0]) >= 4 and len(alone[1]) == 1
    for faces_alone, faces_together in zip(alone, together):
        np.testing.assert_allclose([f.box for f in faces_alone], [f.box for f in faces_together], atol=1e-3)
        np.testing.assert_allclose([f.score for f in faces_alone], [f.score for f in faces_together], atol=1e-5)
    assert max(f.box[2] for f in together[0]) > 640  # 1080p faces in 1920-wide pixels, not in input pixels


class _ShapeEcho(Backend):
    """A stand-in model: each item's output is its shape and its first value, and every run's batch shape is
    recorded."""

    name = "echo"

    def __init__(self) -> None:
        super().__init__([TensorSpec("image", (-1, -1, -1, 3), np.dtype(np.uint8))], [], max_batch=8, lanes=1)
        self.runs: list[tuple[int, ...]] = []

    @classmethod
    def create(cls, spec: ModelRuntime, model: Any, model_path: Path) -> Backend:
        return cls()

    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        images = batch["image"]
        self.runs.append(images.shape)
        shapes = np.tile(np.array(images.shape[1:]), (len(images), 1))
        return {"shape": shapes, "first": images.reshape(len(images), -1)[:, 0].copy()}

    def describe(self) -> dict[str, str]:
        return {"backend": self.name}


def test_a_batch_of_mixed_shapes_runs_one_group_per_shape_in_order() -> None:
    backend = _ShapeEcho()
    items: Sequence[np.ndarray] = [np.full((352, 640, 3), 1, np.uint8), np.full((352, 608, 3), 2, np.uint8),
                                   np.full((352, 640, 3), 3, np.uint8), np.full((640, 352, 3), 4, np.uint8)]
    results = backend.run_items(items)
    assert sorted(backend.runs) == sorted([(2, 352, 640, 3), (1, 352, 608, 3), (1, 640, 352, 3)])
    assert [int(r["first"]) for r in results] == [1, 2, 3, 4]
    assert [tuple(r["shape"]) for r in results] == [item.shape for item in items]


# ---------------------------------------------------------------- configuration and tools


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_tensorrt_with_auto_input_is_a_located_config_error(tmp_path: Path) -> None:
    head = "cameras:\n  - {name: lobby, source: demo}\n"
    trt = "inference:\n  backend: tensorrt\n  device: cuda\n"
    explicit = _write(tmp_path, head + "detector:\n  input_size: auto\n" + trt)
    with pytest.raises(ConfigError) as caught:
        load_config(explicit, env={})
    text = str(caught.value)
    assert f"{explicit}:4: detector.input_size: TensorRT engines are built for one size" in text, text
    assert "[640, 352] for 16:9" in text
    implicit = _write(tmp_path, head + trt)  # auto by default: the error points at the backend
    with pytest.raises(ConfigError) as caught:
        load_config(implicit, env={})
    assert f"{implicit}:4: inference.backend: TensorRT engines are built for one size" in str(caught.value)
    fixed = _write(tmp_path, head + "detector:\n  input_size: [640, 352]\n" + trt)
    assert load_config(fixed, env={}).detector.fixed_input_size == (640, 352)


def test_shipped_configs_default_to_auto_and_check_config_says_so() -> None:
    config = load_config(ROOT / "config" / "default.yaml", env={})
    assert config.detector.input_size == "auto"
    assert "input auto per camera shape (long side 640: 640x352 for 16:9, 640x480 for 4:3" in summarize(config)
    kiosk = load_config(ROOT / "config" / "examples" / "kiosk-webcam.yaml", env={})
    assert kiosk.detector.input_for((1280, 720)) == (320, 192)


def test_bench_pipeline_defaults_to_auto_and_names_the_size_it_used() -> None:
    from pipeline.tools.bench_pipeline import _input_used, add_pipeline_args, bench_config

    parser = argparse.ArgumentParser()
    add_pipeline_args(parser)
    video = data_path("video", "group_1080p.mp4")
    args = parser.parse_args(["--video", str(video), "--cameras", "1"])
    cfg = bench_config(args, naive=False)
    assert args.detector_input == "auto" and cfg.detector.input_size == "auto"
    assert _input_used(cfg, video) == "640x352 for 1920x1080 frames"
    fixed = bench_config(parser.parse_args(["--video", str(video), "--detector-input", "640x480"]), naive=False)
    assert _input_used(fixed, video) == "640x480 for 1920x1080 frames"
