"""int8 variants (QDQ, symmetric, per-channel weights, calibrated on real images with ONNX Runtime's
quantize_static), and the real images every fp16 or int8 variant is verified on against fp32.

The emotion model is calibrated on face crops (a folder of crops is used as is, resized to the model's input); the
detector on whole images letterboxed to a typical camera size. The uint8→float preprocessing nodes that
prepare-models added stay in float: only the network itself is quantised.

Verification needs real faces, not random noise, which says nothing about faces (the int8 emotion model that agrees
with fp32 on 97 % of held-out FER2013 crops agreed on 3 of the 4 noise images prepare-models used to compare).
Always the sample photos that ship with insightface (the demo camera's, there on every machine that installed
requirements.txt; for the emotion model, the faces the fp32 detector finds in them), as is and mirrored; with
`--calib DIR` also the folder's images that calibration did not use (all of them when it used every one). The
sample faces are checked even then, as a folder of the wrong images would vouch for its own variant: an emotion
model calibrated on 32 flat grey images agreed with fp32 on 97 % of them, and on 69 % of the sample faces.
"""

from __future__ import annotations

import importlib.util
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
from pipeline.modelprep.sessions import quiet_options

log = logging.getLogger(__name__)

CALIB_LIMIT = 256
# Held-out calibration images a variant is verified on: 256 emotion crops take ~0.3 s per model on 2 cores; a
# detector image ~30 ms (640x480), so it gets fewer (64 are 1.6 % steps, fine against a 95 % threshold).
VERIFY_LIMIT = {"emotion": 256, "detector": 64}
DETECTOR_CALIB_SIZE = (640, 480)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
# The detector's thresholds in config/default.yaml, used to find faces when verifying.
FACE_SCORE, FACE_NMS = 0.8, 0.4
# Each face of the sample photos is cut at these margins, as is and mirrored: 7 faces give 42 crops.
SAMPLE_MARGINS = (0.0, 0.1, 0.2)


def _image_files(folder: Path) -> list[Path]:
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise ModelError(f"no images in {folder} (need jpg/png face images)")
    return images


def _pick(images: list[Path], limit: int) -> list[Path]:
    step = max(1, len(images) // limit)
    return images[::step][:limit]


def _calibration_images(folder: Path) -> list[Path]:
    return _pick(_image_files(folder), CALIB_LIMIT)


def verification_images(folder: Path, limit: int) -> list[Path]:
    """Up to `limit` of the folder's images that calibration does not use (held out: a variant is not judged on
    the images it was calibrated on), or of all of them when calibration uses every one."""
    images = _image_files(folder)
    used = set(_pick(images, CALIB_LIMIT))
    held_out = [p for p in images if p not in used]
    return _pick(held_out or images, limit)


def model_input(manifest: ModelManifest, image: np.ndarray) -> np.ndarray:
    """One BGR image as the prepared model takes it: letterboxed for a detector, resized and converted to the
    model's colour for a classifier; a batch of 1 (uint8 NHWC)."""
    from pipeline.vision.retinaface import letterbox

    if manifest.role == "detector":
        canvas, _ = letterbox(image, manifest.input.size or DETECTOR_CALIB_SIZE)
        return canvas[None]
    patch = cv2.resize(image, manifest.input.size or (64, 64), interpolation=cv2.INTER_LINEAR)
    if manifest.input.color == "gray":
        patch = cv2.cvtColor(patch, cv2.COLOR_BGR2GRAY)[:, :, None]
    elif manifest.input.color == "rgb":
        patch = patch[:, :, ::-1]
    return np.ascontiguousarray(patch)[None]


def _read_images(paths: list[Path]) -> Iterator[np.ndarray]:
    for path in paths:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            log.warning("skipping unreadable image %s", path)
            continue
        yield image


def calibration_batches(manifest: ModelManifest, folder: Path) -> Iterator[np.ndarray]:
    """One uint8 NHWC batch of 1 per image, in the prepared model's input contract."""
    for image in _read_images(_calibration_images(folder)):
        yield model_input(manifest, image)


def folder_inputs(manifest: ModelManifest, folder: Path) -> list[np.ndarray]:
    """The held-out images of a calibration folder, each as the model's input (batches of 1)."""
    paths = verification_images(folder, VERIFY_LIMIT[manifest.role])
    return [model_input(manifest, image) for image in _read_images(paths)]


def sample_photos() -> list[np.ndarray]:
    """insightface's sample photos (the demo camera's), each as is and mirrored; real faces on every machine that
    installed requirements.txt."""
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("verifying an fp16 or int8 variant needs insightface's sample photos: "
                         "pip install -r requirements.txt")
    folder = Path(next(iter(spec.submodule_search_locations))) / "data" / "images"
    photos = list(_read_images(_image_files(folder)))
    return [variant for photo in photos for variant in (photo, np.ascontiguousarray(photo[:, ::-1]))]


def detect_faces(session: object, detector: ModelManifest, canvas: np.ndarray) -> list[tuple[float, ...]]:
    """The face boxes (letterbox pixels) a prepared detector finds on one letterboxed image, at the default
    thresholds; used to compare a detector variant with fp32 and to find the sample photos' faces."""
    from pipeline.vision.retinaface import Letterbox, decode

    size = (canvas.shape[2], canvas.shape[1])
    outputs = session.run(None, {PREPARED_INPUT: canvas})  # type: ignore[attr-defined]
    named = {name: value[0] for name, value in zip(detector.prepared_outputs, outputs)}
    return [face.box for face in decode(named, size, Letterbox(1.0, size), FACE_SCORE, FACE_NMS)]


def sample_face_crops(manifest: ModelManifest, detector: ModelManifest, detector_path: Path) -> list[np.ndarray]:
    """The faces of the sample photos, found by the fp32 detector, as `manifest`'s inputs at each SAMPLE_MARGINS."""
    import onnxruntime as ort

    from pipeline.vision.align import box_crop
    from pipeline.vision.retinaface import letterbox

    session = ort.InferenceSession(str(detector_path), quiet_options(ort), providers=["CPUExecutionProvider"])
    crops = []
    for photo in sample_photos():
        canvas, fit = letterbox(photo, DETECTOR_CALIB_SIZE)
        for box in detect_faces(session, detector, canvas[None]):
            x1, y1, x2, y2 = (v / fit.scale for v in box)
            for margin in SAMPLE_MARGINS:
                crops.append(model_input(manifest, box_crop(photo, (x1, y1, x2, y2), manifest.input.size or (64, 64),
                                                             margin)))
    if not crops:
        raise ModelError(f"{detector.name} found no face in insightface's sample photos, so {manifest.name}'s "
                         "variants cannot be verified on faces: reinstall them (pip install -r requirements.txt)")
    return crops


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
    folder: Path = calib_dir

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._batches = calibration_batches(manifest, folder)

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self._batches, None)
            return None if batch is None else {PREPARED_INPUT: batch}

    log.info("%s: calibrating int8 on %s", manifest.name, calib_dir)
    with tempfile.TemporaryDirectory() as tmp:
        source = _at_least_opset(fp32_path, Path(tmp) / "opset.onnx")
        # reduce_range: 7-bit weights. x86 CPUs without VNNI (AVX2-only, e.g. many AMD EPYCs) multiply int8 pairs
        # into 16-bit sums that saturate with 8-bit weights: mini-Xception's int8 then agreed with fp32 on 83 % of
        # faces there against >= 90 % on VNNI CPUs. The variant is made where it runs, on any of them.
        quantize_static(str(source), str(out_path), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        reduce_range=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
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
