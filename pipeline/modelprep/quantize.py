"""int8 variants: QDQ, symmetric, per-channel weights, calibrated on real images with ONNX Runtime's quantize_static.

The emotion model is calibrated on face crops (a folder of crops is used as is, resized to the model's input); the
detector on whole images letterboxed to a typical camera size. The uint8→float preprocessing nodes that
prepare-models added stay in float: only the network itself is quantised.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import onnx
from onnx import version_converter

from pipeline.modelprep.graph_edit import PREPARED_INPUT, PREPROCESSING_NODES
from pipeline.modelprep.manifest import ModelError, ModelManifest

log = logging.getLogger(__name__)

CALIB_LIMIT = 256
DETECTOR_CALIB_SIZE = (640, 480)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


def _calibration_images(folder: Path) -> list[Path]:
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise ModelError(f"no images in {folder} for int8 calibration (need jpg/png face images)")
    step = max(1, len(images) // CALIB_LIMIT)
    return images[::step][:CALIB_LIMIT]


def calibration_batches(manifest: ModelManifest, folder: Path) -> Iterator[np.ndarray]:
    """One uint8 NHWC batch of 1 per image, in the prepared model's input contract."""
    from pipeline.vision.retinaface import letterbox

    for path in _calibration_images(folder):
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            log.warning("skipping unreadable calibration image %s", path)
            continue
        if manifest.role == "detector":
            canvas, _ = letterbox(image, manifest.input.size or DETECTOR_CALIB_SIZE)
            yield canvas[None]
            continue
        size = manifest.input.size or (64, 64)
        patch = cv2.resize(image, size, interpolation=cv2.INTER_LINEAR)
        if manifest.input.color == "gray":
            patch = cv2.cvtColor(patch, cv2.COLOR_BGR2GRAY)[:, :, None]
        elif manifest.input.color == "rgb":
            patch = patch[:, :, ::-1]
        yield np.ascontiguousarray(patch)[None]


def quantize_int8(manifest: ModelManifest, fp32_path: Path, out_path: Path, calib_dir: Path | None) -> None:
    """Write the QDQ int8 model for `manifest` from its prepared fp32 file."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    if calib_dir is None or not calib_dir.is_dir():
        raise ModelError(f"{manifest.name}: int8 needs --calib DIR, a folder of face images (got {calib_dir})")

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._batches = calibration_batches(manifest, calib_dir)

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self._batches, None)
            return None if batch is None else {PREPARED_INPUT: batch}

    log.info("%s: calibrating int8 on %s", manifest.name, calib_dir)
    with tempfile.TemporaryDirectory() as tmp:
        source = _at_least_opset(fp32_path, Path(tmp) / "opset.onnx")
        quantize_static(str(source), str(out_path), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        nodes_to_exclude=list(PREPROCESSING_NODES),
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})


def _at_least_opset(path: Path, scratch: Path, opset: int = 13) -> Path:
    """Per-channel QDQ needs DequantizeLinear's `axis` (opset 13); older exports are converted first."""
    model = onnx.load(str(path))
    current = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if current >= opset:
        return path
    converted = version_converter.convert_version(model, opset)
    onnx.save(converted, str(scratch))
    return scratch
