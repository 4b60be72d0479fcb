"""What a TensorRT engine is built for, and whether the one on disk still fits: pure, no TensorRT needed.

An engine is only valid for the GPU (name and compute capability), the TensorRT version, the exact ONNX file
(sha256), the precision, the batch range and, for the detector, the input size it was built for. All of these go into
its file name and its sidecar; `sidecar_mismatches` compares a sidecar with what is running, and a mismatch means
rebuild (or, when building is not allowed, a BackendError that prints the exact build-engine command). Kept apart
from `engine_build` (which needs TensorRT) so that this part is tested everywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.inference.backend import BackendError

if TYPE_CHECKING:
    from pipeline.modelprep.manifest import ModelManifest

ENGINES_DIR = Path(__file__).resolve().parents[3] / "engines"
SIDECAR_FORMAT = 1

# The fields an engine must match, in the order mismatches are reported, with the words used to report them.
KEY_FIELDS: dict[str, str] = {
    "model": "model",
    "model_sha256": "model sha256",
    "precision": "precision",
    "max_batch": "max batch",
    "input_size": "input size (width, height)",
    "gpu": "GPU",
    "compute_capability": "compute capability",
    "tensorrt": "TensorRT version",
}


# ---------------------------------------------------------------- what an engine is built for (pure)


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine depends on. Two keys are equal exactly when one engine serves both."""

    model: str
    model_sha256: str
    precision: str
    max_batch: int
    input_size: tuple[int, int]  # width, height
    gpu: str
    compute_capability: str  # "9.0"
    tensorrt: str  # "10.13.0.35"

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model, "model_sha256": self.model_sha256, "precision": self.precision,
                "max_batch": self.max_batch, "input_size": [int(self.input_size[0]), int(self.input_size[1])],
                "gpu": self.gpu, "compute_capability": self.compute_capability, "tensorrt": self.tensorrt}


def sanitise(text: str) -> str:
    """A file-name-safe, lower-case form: 'NVIDIA H200 NVL' -> 'nvidia-h200-nvl' (keeps . and _)."""
    return re.sub(r"[^a-z0-9._]+", "-", text.lower()).strip("-._") or "unknown"


def engine_stem(key: EngineKey) -> str:
    """Deterministic name of the engine (without extension); encodes every field of the key but the full hash."""
    width, height = key.input_size
    cc = key.compute_capability.replace(".", "")
    return (f"{sanitise(key.model)}.{key.model_sha256[:12]}.{sanitise(key.precision)}.b{key.max_batch}."
            f"{width}x{height}.{sanitise(key.gpu)}.sm{cc}.trt{sanitise(key.tensorrt)}")


def engine_path(key: EngineKey, engines_dir: Path = ENGINES_DIR) -> Path:
    return engines_dir / f"{engine_stem(key)}.engine"


def sidecar_path(engine: Path) -> Path:
    return engine.with_suffix(".json")


def _normalise(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)) and float(value).is_integer():
        return int(value)
    return value


def sidecar_mismatches(sidecar: Mapping[str, object], running: Mapping[str, object]) -> list[str]:
    """Why an engine with this sidecar cannot serve `running` (an `EngineKey.to_dict()`); [] when it can.

    Pure: compares the GPU, compute capability, TensorRT version, model sha256, precision, max batch and input size.
    """
    problems: list[str] = []
    if sidecar.get("format") not in (None, SIDECAR_FORMAT):
        problems.append(f"sidecar format {sidecar.get('format')!r} (expected {SIDECAR_FORMAT})")
    for field, words in KEY_FIELDS.items():
        if field not in running:
            continue
        if field not in sidecar:
            problems.append(f"{words}: not recorded in the sidecar")
            continue
        have, want = _normalise(sidecar[field]), _normalise(running[field])
        if have != want:
            problems.append(f"{words}: engine built for {_show(have)}, running {_show(want)}")
    return problems


def _show(value: object) -> str:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"{value[0]}x{value[1]}"
    return str(value)


def read_sidecar(path: Path) -> dict[str, object] | None:
    """The sidecar's content; None when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def build_command(key: EngineKey, fixed_size: bool) -> str:
    """The exact command that builds the engine `key` names (what an operator should run)."""
    command = (f"python run_pipeline.py build-engine --model {key.model} --precision {key.precision} "
               f"--max-batch {key.max_batch}")
    if not fixed_size:
        command += f" --input-size {key.input_size[0]}x{key.input_size[1]}"
    return command


def timing_cache_path(engines_dir: Path, tensorrt_version: str) -> Path:
    """Where builds with this TensorRT version keep their timing cache (one file per version: a cache made by
    another version is of no use to the builder)."""
    return engines_dir / f"timing-trt{sanitise(tensorrt_version)}.cache"


def input_channels(manifest: ModelManifest) -> int:
    return 1 if manifest.input.color == "gray" else 3


def profile_shapes(name: str, network_shape: Sequence[int], input_size: tuple[int, int], channels: int,
                   max_batch: int, opt_batch: int | None = None) -> tuple[tuple[int, ...], ...]:
    """(min, opt, max) shapes of the uint8 NHWC input: batch 1 | opt | max_batch, height and width fixed.

    Dimensions the ONNX fixes must agree with the manifest and config; dynamic ones (-1) are filled in.
    """
    if len(network_shape) != 4:
        raise BackendError(f"input {name!r} has shape {tuple(network_shape)}; prepared models take [batch, H, W, C]")
    width, height = input_size
    opt = max_batch if opt_batch is None else opt_batch
    if not 1 <= opt <= max_batch:
        raise BackendError(f"opt batch {opt} is outside 1..{max_batch}")
    wanted = (height, width, channels)
    for axis, (have, want) in enumerate(zip(network_shape[1:], wanted), start=1):
        if have not in (-1, want):
            raise BackendError(f"input {name!r} dimension {axis} is fixed to {have} in the ONNX file, but the "
                               f"engine is asked for {want} (input size {width}x{height}, {channels} channel(s))")
    if network_shape[0] != -1 and not network_shape[0] == max_batch == 1:
        raise BackendError(f"input {name!r} has a fixed batch of {network_shape[0]}; prepared models have a dynamic "
                           "batch dimension")
    return tuple((batch, height, width, channels) for batch in (1, opt, max_batch))


def _why_missing(key: EngineKey, engines_dir: Path) -> str:
    """For an engine that does not exist: what the nearest existing one (same model and precision) differs in."""
    pattern = f"{sanitise(key.model)}.*.{sanitise(key.precision)}.*.json"
    candidates = sorted(engines_dir.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in candidates:
        data = read_sidecar(candidate)
        if data is not None and data.get("model") == key.model:
            differences = sidecar_mismatches(data, key.to_dict())
            if differences:
                return f"no engine for this setup (existing {candidate.with_suffix('.engine').name}: " \
                       f"{'; '.join(differences)})"
    return f"no engine {engine_path(key, engines_dir).name} yet"


def check_engine(key: EngineKey, engines_dir: Path = ENGINES_DIR) -> tuple[Path, str | None]:
    """The engine path for `key` and why it cannot be used as is (None when it is there and matches)."""
    target = engine_path(key, engines_dir)
    if not target.is_file():
        return target, _why_missing(key, engines_dir)
    data = read_sidecar(sidecar_path(target))
    if data is None:
        return target, f"{sidecar_path(target).name} is missing or unreadable"
    problems = sidecar_mismatches(data, key.to_dict())
    return target, ("; ".join(problems) if problems else None)
