"""The native TensorRT backend and build-engine.

Two kinds of tests:
- everywhere (no TensorRT needed): the clear exit-3 errors when TensorRT/cuda-python are missing, engine naming, the
  sidecar check, profile shapes, the no-build message, the per-version timing cache, TensorRT messages quoted per
  thread and call, the backend registry and its spec, and mypy against tensorrt-stubs over the whole GPU wing
  (skipped without mypy or the stubs);
- `tensorrt`-marked: build, load and run real engines; skipped with a reason unless tensorrt, cuda-python and a GPU
  are there. They have never run on the machines this was written on (no TensorRT libraries there). The CUDA side of
  the backend runs on a GPU without TensorRT through deploy/trt_standin.py.

`python tests/test_tensorrt.py` runs the same mypy check by hand.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for `python tests/test_tensorrt.py`

from pipeline.inference.backend import BackendError, ModelRuntime  # noqa: E402
from pipeline.inference.gpu.cuda import cuda_python_problem  # noqa: E402
from pipeline.inference.gpu.engine_build import (  # noqa: E402
    TrtMessages,
    ensure_engine,
    require_gpu_packages,
    tensorrt_problem,
)
from pipeline.inference.gpu.engine_key import (  # noqa: E402
    EngineKey,
    build_command,
    check_engine,
    engine_path,
    engine_stem,
    profile_shapes,
    sanitise,
    sidecar_mismatches,
    sidecar_path,
    timing_cache_path,
)

GPU_PACKAGES_MISSING = tensorrt_problem() is not None or cuda_python_problem() is not None
# The whole GPU wing: the TensorRT backend, its builder, the CUDA binding and the ONNX Runtime CUDA lanes.
MYPY_FILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pipeline" / "inference" / "gpu").glob("*.py"))


def _key(**changes: object) -> EngineKey:
    fields: dict[str, object] = dict(model="mini_xception_fer2013", model_sha256="4a3c3e2c69cfc27170ed5162" + "0" * 40,
                                     precision="fp16", max_batch=8, input_size=(64, 64), gpu="NVIDIA H200",
                                     compute_capability="9.0", tensorrt="10.16.1.11")
    fields.update(changes)
    return EngineKey(**fields)  # type: ignore[arg-type]


def _run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "run_pipeline.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


# ---------------------------------------------------------------- without TensorRT: clear errors


@pytest.mark.skipif(not GPU_PACKAGES_MISSING, reason="tensorrt and cuda-python are installed here")
def test_build_engine_without_tensorrt_exits_3_with_one_line() -> None:
    done = _run_cli("build-engine", "--model", "mini_xception_fer2013")
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "tensorrt" in lines[0] and "requirements-gpu.txt" in lines[0]


@pytest.mark.skipif(not GPU_PACKAGES_MISSING, reason="tensorrt and cuda-python are installed here")
def test_run_with_tensorrt_backend_without_tensorrt_exits_3(prepared_models: None, tmp_path: Path) -> None:
    config = tmp_path / "trt.yaml"
    config.write_text("cameras:\n  - {name: cam, source: demo}\n"
                      "detector: {input_size: [640, 352]}\n"  # a fixed size: engines are built for one
                      "inference: {backend: tensorrt, device: cuda}\n"
                      "server: {enabled: false}\n")
    done = _run_cli("run", "--config", str(config), "--duration", "1")
    assert done.returncode == 3, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("model error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert "tensorrt" in errors[0] and "requirements-gpu.txt" in errors[0]


@pytest.mark.skipif(not GPU_PACKAGES_MISSING, reason="tensorrt and cuda-python are installed here")
def test_missing_packages_are_a_backend_error_naming_them() -> None:
    from pipeline.inference.backend import create_backend
    from pipeline.inference.settings import InferenceConfig
    from pipeline.modelprep.manifest import load_manifest

    with pytest.raises(BackendError, match="requirements-gpu.txt") as caught:
        require_gpu_packages()
    assert "tensorrt" in str(caught.value)
    manifest = load_manifest("mini_xception_fer2013")
    spec = ModelRuntime.from_config(InferenceConfig(backend="tensorrt", device="cuda"))
    with pytest.raises(BackendError, match="tensorrt"):
        create_backend(spec, manifest, manifest.file_for("fp32"))


# ---------------------------------------------------------------- the backend registry and the runtime spec


def test_inference_backend_choices_are_the_registered_backends() -> None:
    """The YAML's `inference.backend` Literal and the registry must name the same backends."""
    import typing

    from pipeline.inference.backend import BACKENDS
    from pipeline.inference.gpu.tensorrt import TensorRTBackend, TensorRTSettings
    from pipeline.inference.onnxruntime import OnnxRuntimeBackend
    from pipeline.inference.settings import InferenceConfig

    assert sorted(typing.get_args(InferenceConfig.model_fields["backend"].annotation)) == BACKENDS.names()
    assert BACKENDS.get("tensorrt").implementation is TensorRTBackend
    assert BACKENDS.get("tensorrt").settings is TensorRTSettings
    assert InferenceConfig.model_fields["tensorrt"].annotation is TensorRTSettings
    assert BACKENDS.get("onnxruntime").implementation is OnnxRuntimeBackend
    assert BACKENDS.get("onnxruntime").settings is None


def test_unknown_backend_is_a_backend_error_listing_the_names() -> None:
    from pipeline.inference.backend import create_backend
    from pipeline.modelprep.manifest import load_manifest

    manifest = load_manifest("mini_xception_fer2013")
    with pytest.raises(BackendError, match=r"unknown inference.backend 'openvino' \(available: onnxruntime, "
                                           r"tensorrt, triton\)"):
        create_backend(ModelRuntime("openvino", "cpu", "fp32", 8), manifest, manifest.file_for("fp32"))


def test_runtime_spec_carries_the_input_size_and_only_the_chosen_backends_options() -> None:
    from pipeline.inference.gpu.tensorrt import TensorRTSettings
    from pipeline.inference.settings import InferenceConfig

    trt_cfg = InferenceConfig(backend="tensorrt", device="cuda", precision="fp16", max_batch=64, lanes=2,
                              tensorrt=TensorRTSettings(build_missing=False))
    spec = ModelRuntime.from_config(trt_cfg, input_size=(640, 352))
    assert (spec.backend, spec.device, spec.precision, spec.max_batch, spec.lanes) == ("tensorrt", "cuda", "fp16",
                                                                                       64, 2)
    assert spec.input_size == (640, 352)
    assert spec.options == TensorRTSettings(build_missing=False)
    assert ModelRuntime.from_config(trt_cfg, precision="fp32").precision == "fp32"  # a refused precision
    ort_spec = ModelRuntime.from_config(InferenceConfig(threads=3, batch_step=8))
    assert ort_spec.options is None and ort_spec.input_size is None
    assert (ort_spec.threads, ort_spec.batch_step) == (3, 8)


def test_build_missing_false_is_read_from_the_yaml() -> None:
    from pipeline.inference.settings import InferenceConfig

    cfg = InferenceConfig.model_validate({"backend": "tensorrt", "device": "cuda",
                                          "tensorrt": {"build_missing": False, "workspace_mb": 256}})
    assert cfg.tensorrt.build_missing is False and cfg.tensorrt.workspace_mb == 256
    assert InferenceConfig().tensorrt.build_missing is True


def test_stub_only_tensorrt_is_not_mistaken_for_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """tensorrt-stubs installs a tensorrt/ folder of .pyi files that imports as an empty namespace package."""
    import types

    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    problem = tensorrt_problem()
    assert problem is not None and "stubs" in problem


# ---------------------------------------------------------------- engine names and sidecars (pure)


def test_engine_name_is_deterministic_and_encodes_every_field() -> None:
    key = _key()
    assert engine_stem(key) == engine_stem(_key())
    stem = engine_stem(key)
    assert stem == "mini_xception_fer2013.4a3c3e2c69cf.fp16.b8.64x64.nvidia-h200.sm90.trt10.16.1.11"
    for change in (dict(model_sha256="f" * 64), dict(precision="fp32"), dict(max_batch=16), dict(input_size=(32, 64)),
                   dict(gpu="NVIDIA A100-SXM4-80GB"), dict(compute_capability="8.0"), dict(tensorrt="11.1.0.106")):
        assert engine_stem(_key(**change)) != stem, change
    assert engine_path(key, Path("/e")).name == f"{stem}.engine"
    assert sidecar_path(engine_path(key, Path("/e"))).name == f"{stem}.json"
    assert sanitise("NVIDIA A100-SXM4-80GB / MIG 1g.10gb") == "nvidia-a100-sxm4-80gb-mig-1g.10gb"
    assert "/" not in engine_stem(_key(gpu="a/b\\c d"))


def test_sidecar_matching_the_running_setup_has_no_mismatch() -> None:
    running = _key().to_dict()
    sidecar = {"format": 1, **running, "built_at": "2026-12-01T10:00:00Z", "input_size": (64, 64), "max_batch": 8.0}
    assert sidecar_mismatches(sidecar, running) == []


def test_sidecar_mismatches_name_each_difference() -> None:
    running = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "tensorrt": "10.16.1.11",
               "model_sha256": "a" * 64, "precision": "fp16", "max_batch": 8, "input_size": [640, 480]}
    sidecar = {"gpu": "NVIDIA A100", "compute_capability": "8.0", "tensorrt": "10.13.0.35",
               "model_sha256": "b" * 64, "precision": "fp32", "max_batch": 32, "input_size": [320, 192]}
    problems = sidecar_mismatches(sidecar, running)
    assert len(problems) == 7, problems
    text = "\n".join(problems)
    for expected in ("GPU: engine built for NVIDIA A100, running NVIDIA H200", "compute capability",
                     "TensorRT version: engine built for 10.13.0.35, running 10.16.1.11", "model sha256",
                     "precision: engine built for fp32, running fp16", "max batch: engine built for 32, running 8",
                     "input size (width, height): engine built for 320x192, running 640x480"):
        assert expected in text


def test_sidecar_without_a_field_or_of_another_format_is_a_mismatch() -> None:
    running = {"gpu": "NVIDIA H200", "tensorrt": "11.1.0"}
    assert sidecar_mismatches({"gpu": "NVIDIA H200"}, running) == ["TensorRT version: not recorded in the sidecar"]
    assert sidecar_mismatches({"format": 99, **running}, running) == ["sidecar format 99 (expected 1)"]
    assert sidecar_mismatches({}, {}) == []


def test_no_build_refuses_with_the_exact_build_command(tmp_path: Path) -> None:
    key = _key()
    target = engine_path(key, tmp_path)
    target.write_bytes(b"not really an engine")
    sidecar_path(target).write_text(json.dumps({"format": 1, **key.to_dict(), "tensorrt": "10.13.0.35"}))
    _, problem = check_engine(key, tmp_path)
    assert problem == "TensorRT version: engine built for 10.13.0.35, running 10.16.1.11"
    with pytest.raises(BackendError) as caught:
        ensure_engine(key, Path("unused.onnx"), 1, fixed_size=True, no_build=True, engines_dir=tmp_path)
    message = str(caught.value)
    assert "10.13.0.35" in message
    assert ("python run_pipeline.py build-engine --model mini_xception_fer2013 --precision fp16 --max-batch 8"
            in message)
    assert "--input-size" not in message  # the emotion model's size is fixed by its manifest


def test_no_build_for_a_missing_detector_engine_names_the_nearest_one(tmp_path: Path) -> None:
    built = _key(model="retinaface_mnet025", input_size=(320, 192), gpu="NVIDIA A100", compute_capability="8.0")
    target = engine_path(built, tmp_path)
    target.write_bytes(b"x")
    sidecar_path(target).write_text(json.dumps({"format": 1, **built.to_dict()}))
    wanted = _key(model="retinaface_mnet025", input_size=(640, 480))
    with pytest.raises(BackendError) as caught:
        ensure_engine(wanted, Path("unused.onnx"), 3, fixed_size=False, no_build=True, engines_dir=tmp_path)
    message = str(caught.value)
    assert target.name in message and "GPU: engine built for NVIDIA A100, running NVIDIA H200" in message
    assert message.endswith("python run_pipeline.py build-engine --model retinaface_mnet025 --precision fp16 "
                             "--max-batch 8 --input-size 640x480")
    assert build_command(wanted, fixed_size=False) in message


def test_unreadable_sidecar_means_rebuild(tmp_path: Path) -> None:
    key = _key()
    engine_path(key, tmp_path).write_bytes(b"x")
    sidecar_path(engine_path(key, tmp_path)).write_text("{not json")
    _, problem = check_engine(key, tmp_path)
    assert problem is not None and "unreadable" in problem


def test_profile_shapes_fix_height_width_and_channels() -> None:
    assert profile_shapes("image", (-1, -1, -1, 3), (640, 480), 3, 32) == (
        (1, 480, 640, 3), (32, 480, 640, 3), (32, 480, 640, 3))
    assert profile_shapes("image", (-1, 64, 64, 1), (64, 64), 1, 8, opt_batch=4) == (
        (1, 64, 64, 1), (4, 64, 64, 1), (8, 64, 64, 1))
    with pytest.raises(BackendError, match="fixed to 64"):
        profile_shapes("image", (-1, 64, 64, 1), (48, 48), 1, 8)
    with pytest.raises(BackendError, match="fixed batch"):
        profile_shapes("image", (4, 64, 64, 1), (64, 64), 1, 8)
    with pytest.raises(BackendError, match="batch, H, W, C"):
        profile_shapes("image", (-1, 3, 64), (64, 64), 3, 8)
    with pytest.raises(BackendError, match="opt batch"):
        profile_shapes("image", (-1, 64, 64, 1), (64, 64), 1, 8, opt_batch=9)


def test_trt_messages_keep_warnings_and_worse_for_errors() -> None:
    messages = TrtMessages(limit=3)
    messages.add(4, "verbose", "tactic 17")
    messages.add(3, "info", "building")
    messages.add(2, "warning", "weights cast")
    messages.add(1, "error", "no implementation for node 12")
    assert messages.messages() == ["[warning] weights cast", "[error] no implementation for node 12"]
    assert "node 12" in messages.tail()
    for i in range(5):
        messages.add(0, "internal error", f"boom {i}")
    assert len(messages.messages()) == 3
    messages.clear()
    assert messages.tail() == "TensorRT logged nothing"


def test_trt_messages_quote_only_the_calling_threads_messages_since_its_mark() -> None:
    """Lanes share one logger: an error on one lane must not quote what another lane (thread) or an earlier call
    logged."""
    import threading

    messages = TrtMessages()
    messages.add(1, "error", "an earlier call failed")
    mark = messages.mark()
    other_logged = threading.Event()

    def other_lane() -> None:
        messages.add(1, "error", "lane 1: set_input_shape failed")
        other_logged.set()

    thread = threading.Thread(target=other_lane)
    thread.start()
    assert other_logged.wait(10)
    thread.join(10)
    assert messages.tail(since=mark) == "TensorRT logged nothing for this call"
    messages.add(2, "warning", "lane 0: shape out of profile")
    messages.add(1, "error", "lane 0: enqueue failed")
    assert messages.tail(since=mark) == "[warning] lane 0: shape out of profile | [error] lane 0: enqueue failed"
    assert messages.tail(count=1, since=mark) == "[error] lane 0: enqueue failed"
    assert len(messages.messages()) == 4  # without a mark: everything kept (a build's own log)


class _FakeBuilderConfig:
    """Stands in for the two timing-cache calls of trt.IBuilderConfig (TensorRT is not installed here): a cache it
    cannot read gives None, as TensorRT's create_timing_cache does; set_timing_cache refuses another GPU's cache."""

    def __init__(self, readable: bool = True, accepted: bool = True) -> None:
        self.readable, self.accepted = readable, accepted
        self.attached: object = None

    def create_timing_cache(self, data: bytes) -> object:
        if data and not self.readable:
            return None
        return ("cache", bytes(data))

    def set_timing_cache(self, cache: object, ignore_mismatch: bool) -> bool:
        assert ignore_mismatch is False
        if not self.accepted and cache != ("cache", b""):
            return False
        self.attached = cache
        return True


def test_timing_cache_is_named_by_tensorrt_version(tmp_path: Path) -> None:
    assert timing_cache_path(tmp_path, "10.16.1.11") == tmp_path / "timing-trt10.16.1.11.cache"
    assert timing_cache_path(tmp_path, "11.1.0.106") != timing_cache_path(tmp_path, "10.16.1.11")


@pytest.mark.parametrize("readable,accepted,used", [(True, True, True), (False, True, False), (True, False, False)])
def test_unusable_timing_cache_is_treated_as_absent(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                    readable: bool, accepted: bool, used: bool) -> None:
    from pipeline.inference.gpu.engine_build import _timing_cache

    path = timing_cache_path(tmp_path, "10.16.1.11")
    path.write_bytes(b"timings")
    config = _FakeBuilderConfig(readable, accepted)
    with caplog.at_level("INFO"):
        cache = _timing_cache(config, path)  # type: ignore[arg-type]
    assert cache == config.attached == ("cache", b"timings" if used else b"")
    if not used:
        assert "starting a new one" in caplog.text and path.name in caplog.text
    fresh = _FakeBuilderConfig()
    assert _timing_cache(fresh, tmp_path / "missing.cache") == ("cache", b"")  # type: ignore[arg-type]


# ---------------------------------------------------------------- mypy against tensorrt-stubs


def _repair_signature(line: str) -> str:
    """Make one generated `def` line parse: parameters named `in`, and defaults followed by non-defaults."""
    line = re.sub(r"(\(|, )in: ", r"\1in_: ", line)
    head, paren, rest = line.partition("(")
    depth, params, current = 0, [], ""
    body_end = -1
    for index, char in enumerate(rest):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                body_end = index
                break
            depth -= 1
        if char == "," and depth == 0:
            params.append(current)
            current = ""
        else:
            current += char
    if body_end < 0:
        return line
    params.append(current)
    seen_default = False
    fixed = []
    for param in params:
        name = param.strip()
        if name.startswith("*") or name == "/":
            seen_default = False if name.startswith("*") else seen_default
        elif "=" in param:
            seen_default = True
        elif seen_default and name:
            param = f"{param} = ..."
        fixed.append(param)
    return f"{head}{paren}{','.join(fixed)}{rest[body_end:]}"


def repaired_tensorrt_stubs(dest: Path) -> Path:
    """Copy the installed tensorrt-stubs into `dest` (for MYPYPATH) with the few lines mypy cannot parse repaired.

    Why a copy: the package installs `tensorrt/__init__.pyi` into site-packages without a `py.typed` marker, which
    mypy skips ("missing library stubs or py.typed marker"), and site-packages may not be put on MYPYPATH. Why a
    repair: the generated stubs (10.13.0.35.1) contain a few syntax errors (a parameter named `in`, one non-default
    parameter after defaults), all in plugin and layer APIs this project does not call.
    """
    dist = importlib.metadata.distribution("tensorrt-stubs")
    for file in dist.files or []:
        if file.suffix != ".pyi" or file.parts[0] not in ("tensorrt", "tensorrt_bindings"):
            continue
        text = Path(str(dist.locate_file(file))).read_text(encoding="utf-8")
        lines = [(_repair_signature(line) if line.lstrip().startswith("def ") else line) for line in text.split("\n")]
        text = "\n".join(lines)
        ast.parse(text)  # fail here, clearly, if the stubs change in a way the repair does not cover
        target = dest / str(file)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return dest


def _mypy_available() -> str | None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        return "mypy is not installed (pip install -r requirements-dev.txt)"
    try:
        importlib.metadata.distribution("tensorrt-stubs")
    except importlib.metadata.PackageNotFoundError:
        return "tensorrt-stubs is not installed (pip install --no-deps tensorrt-stubs==10.13.0.35.1)"
    return None


def run_mypy(*files: str, stub_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MYPYPATH=str(stub_dir))
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", "tests/mypy-tensorrt.ini", "--no-incremental",
                           *files], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600, check=False)


@pytest.fixture(scope="module")
def trt_stub_dir() -> Iterator[Path]:
    reason = _mypy_available()
    if reason:
        pytest.skip(reason)
    with tempfile.TemporaryDirectory() as tmp:
        yield repaired_tensorrt_stubs(Path(tmp))


def test_tensorrt_code_is_mypy_clean_against_tensorrt_stubs(trt_stub_dir: Path) -> None:
    done = run_mypy(*MYPY_FILES, stub_dir=trt_stub_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in MYPY_FILES:
        assert "type: ignore" not in (ROOT / name).read_text(encoding="utf-8"), name


def test_mypy_really_checks_tensorrt_calls(trt_stub_dir: Path, tmp_path: Path) -> None:
    """Guard against the stubs silently resolving to Any: an API removed in 10.0 must be an error."""
    probe = tmp_path / "probe_trt.py"
    probe.write_text("import tensorrt as trt\n\n\n"
                     "def f(config: trt.IBuilderConfig) -> None:\n"
                     "    config.max_workspace_size = 1 << 30\n")
    done = run_mypy(str(probe), stub_dir=trt_stub_dir)
    assert done.returncode == 1 and "max_workspace_size" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------- with TensorRT, cuda-python and a GPU

# TensorRT runs fp32 convolutions in TF32 on Ampere and later (its default), as cuDNN does: emotion probabilities
# differ from the CPU's by up to ~2e-3 on the H200 (measured with ONNX Runtime's CUDA provider, tests/test_gpu.py).
FP32_PROBS_ATOL = 5e-3
# Detections decoded from the detector's top candidates: pixels of the detector input (as in tests/test_gpu.py).
BOX_TOLERANCE_PX = {"fp32": 1.0, "fp16": 2.0}
SCORE_TOLERANCE = {"fp32": 1e-2, "fp16": 3e-2}
DETECTOR_INPUT = (640, 352)


@pytest.fixture(scope="module")
def gpu() -> object:
    if GPU_PACKAGES_MISSING:
        pytest.skip(f"TensorRT backend not usable here: {tensorrt_problem() or cuda_python_problem()}")
    from pipeline.inference.gpu.cuda import CudaDevice

    try:
        return CudaDevice.open(0)
    except BackendError as exc:
        pytest.skip(f"no usable GPU: {exc}")


def _crops(count: int) -> np.ndarray:
    import cv2

    from tests.conftest import data_path

    folder = data_path("faces", "fer2013")
    paths = sorted(folder.glob("*/*.jpg"))[::97][:count]
    crops = [cv2.resize(cv2.imread(str(p), cv2.IMREAD_GRAYSCALE), (64, 64), interpolation=cv2.INTER_LINEAR)
             for p in paths]
    return np.stack(crops)[..., None].astype(np.uint8)


def _reference(path: Path, batch: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime's CPU outputs for the same ONNX file, by name."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"image": batch})))


def _spec(precision: str, max_batch: int = 8, lanes: int = 2, input_size: tuple[int, int] | None = None,
          build_missing: bool = True) -> ModelRuntime:
    from pipeline.inference.gpu.tensorrt import TensorRTSettings

    return ModelRuntime(backend="tensorrt", device="cuda", precision=precision, max_batch=max_batch, lanes=lanes,
                        input_size=input_size, options=TensorRTSettings(build_missing=build_missing))


def _backend(precision: str, engines: Path, build_missing: bool = True):  # type: ignore[no-untyped-def]
    from pipeline.inference.gpu.tensorrt import TensorRTBackend
    from pipeline.modelprep.manifest import load_manifest
    from pipeline.modelprep.prepare import ensure_model

    manifest = load_manifest("mini_xception_fer2013")
    path = ensure_model(manifest, precision)  # type: ignore[arg-type]
    spec = _spec(precision, build_missing=build_missing)
    return TensorRTBackend.create(spec, manifest, path, engines_dir=engines), path


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engines")


@pytest.mark.tensorrt
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_emotion_engine_matches_onnxruntime(gpu: object, engines: Path, precision: str) -> None:
    backend, path = _backend(precision, engines)
    try:
        batch = _crops(3)
        assert batch.shape == (3, 64, 64, 1)
        got = backend.run({"image": batch}, lane=1)["probs"]
        want = _reference(path, batch)["probs"]
        assert got.shape == want.shape == (3, 7)
        assert (got.argmax(1) == want.argmax(1)).all()
        if precision == "fp32":
            np.testing.assert_allclose(got, want, atol=FP32_PROBS_ATOL)
        staged = backend.staging(0, 3, (64, 64, 1), np.dtype(np.uint8))
        assert staged is not None
        np.stack(list(batch), out=staged)  # what the batcher does: stack straight into pinned memory
        np.testing.assert_array_equal(backend.run({"image": staged}, lane=0)["probs"], got)
        backend.warm_up((64, 64, 1), np.dtype(np.uint8))
        describe = backend.describe()
        assert describe["backend"] == "tensorrt" and describe["precision"] == precision
    finally:
        backend.close()
        backend.close()  # safe twice
    with pytest.raises(BackendError, match="closed"):
        backend.run({"image": batch})


@pytest.mark.tensorrt
def test_sidecar_mismatch_rebuilds_and_build_missing_false_refuses(gpu: object, engines: Path) -> None:
    backend, _ = _backend("fp32", engines)
    engine = engines / backend.describe()["engine"]
    version = backend.describe()["tensorrt"]
    backend.close()
    sidecar = sidecar_path(engine)
    data = json.loads(sidecar.read_text())
    data["tensorrt"] = "0.0.0"
    sidecar.write_text(json.dumps(data))
    with pytest.raises(BackendError) as caught:
        _backend("fp32", engines, build_missing=False)
    assert ("python run_pipeline.py build-engine --model mini_xception_fer2013 --precision fp32 --max-batch 8"
            in str(caught.value))
    assert "TensorRT version: engine built for 0.0.0" in str(caught.value)
    rebuilt, _ = _backend("fp32", engines)
    try:
        assert rebuilt.describe()["built"] == "now"
        assert json.loads(sidecar.read_text())["tensorrt"] != "0.0.0"
        assert timing_cache_path(engines, version).stat().st_size > 0
    finally:
        rebuilt.close()


@pytest.mark.tensorrt
def test_corrupt_engine_error_quotes_tensorrt(gpu: object, engines: Path) -> None:
    backend, _ = _backend("fp32", engines)
    engine = engines / backend.describe()["engine"]
    backend.close()
    saved = engine.read_bytes()
    try:
        engine.write_bytes(saved[: len(saved) // 3])
        with pytest.raises(BackendError, match="rebuild with: python run_pipeline.py build-engine"):
            _backend("fp32", engines, build_missing=False)
    finally:
        engine.write_bytes(saved)


def _detector_items() -> list[np.ndarray]:
    """Letterboxed frames of a real video with a face in most of them (as tests/test_gpu.py uses)."""
    from pipeline.tools.bench_engine import video_frames
    from pipeline.vision.retinaface import letterbox
    from tests.conftest import data_path

    return [letterbox(f, DETECTOR_INPUT)[0] for f in video_frames(data_path("video", "woman2.mp4"), 8)]


def _assert_same_faces(got: dict[str, np.ndarray], want: dict[str, np.ndarray], precision: str) -> int:
    """Raw top candidates swap places on near-equal scores, so the decoded faces are compared; returns their count."""
    from pipeline.vision.retinaface import Letterbox, decode

    fit = Letterbox(1.0, DETECTOR_INPUT)
    ours = sorted(decode(got, DETECTOR_INPUT, fit, 0.8, 0.4), key=lambda f: f.box)
    theirs = sorted(decode(want, DETECTOR_INPUT, fit, 0.8, 0.4), key=lambda f: f.box)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert np.abs(np.subtract(a.box, b.box)).max() <= BOX_TOLERANCE_PX[precision]
        assert np.abs(a.landmarks - b.landmarks).max() <= BOX_TOLERANCE_PX[precision]
        assert abs(a.score - b.score) <= SCORE_TOLERANCE[precision]
    return len(ours)


@pytest.mark.tensorrt
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_detector_engine_is_built_for_the_configured_size(gpu: object, engines: Path, precision: str) -> None:
    from pipeline.inference.gpu.tensorrt import TensorRTBackend
    from pipeline.modelprep.manifest import load_manifest
    from pipeline.modelprep.prepare import ensure_model

    manifest = load_manifest("retinaface_mnet025")
    path = ensure_model(manifest, precision)  # type: ignore[arg-type]
    spec = _spec(precision, max_batch=4, lanes=1, input_size=DETECTOR_INPUT)
    backend = TensorRTBackend.create(spec, manifest, path, engines_dir=engines)
    try:
        assert ".640x352." in backend.describe()["engine"]  # built for the size it was told, not guessed
        items = _detector_items()
        faces = 0
        for start in range(0, len(items), 4):
            batch = np.stack(items[start:start + 4])
            got = backend.run({"image": batch})
            want = _reference(path, batch)
            for index in range(len(batch)):
                faces += _assert_same_faces({k: v[index] for k, v in got.items()},
                                            {k: v[index] for k, v in want.items()}, precision)
        assert faces >= len(items) // 2  # the clip shows a face in most frames: the comparison is not vacuous
        with pytest.raises(BackendError, match="shape"):
            backend.run({"image": np.zeros((1, 480, 640, 3), np.uint8)})
    finally:
        backend.close()


if __name__ == "__main__":  # the mypy check by hand: python tests/test_tensorrt.py
    missing = _mypy_available()
    if missing:
        sys.exit(missing)
    with tempfile.TemporaryDirectory() as tmp_dir:
        result = run_mypy(*MYPY_FILES, stub_dir=repaired_tensorrt_stubs(Path(tmp_dir)))
    print(result.stdout + result.stderr, end="")
    sys.exit(result.returncode)
