"""A Triton Inference Server model repository made from our prepared ONNX files (`prepare-models --triton-repo DIR`).

Why here: modelprep owns the model files, and the names, data types and shapes a Triton server must serve are the
prepared ONNX's own (the uint8 `image` input and the outputs graph_edit gives them). The daemon's `triton` backend
reads the same ONNX (`onnx_signature`) to know what to send and to check Triton's model metadata at start, so the
repository and the client cannot drift apart.

Layout, as Triton loads it (`tritonserver --model-repository=DIR`, e.g. NGC's container):

    DIR/<model name>/config.pbtxt      platform "onnxruntime_onnx", max_batch_size, dynamic_batching, instance_group,
                                       every input and output with its data type and dims (without the batch dim)
    DIR/<model name>/1/model.onnx      the prepared ONNX, copied

The same writer makes the test suite's repository (tests/servers/triton.py) with `backend: "python"` instead of the
platform, so tests run the production tensor names against a real server that has only the Python backend.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
VERSION = "1"

# ONNX element type -> Triton's data type name (model metadata says "FP32"; config.pbtxt says "TYPE_FP32").
_TRITON_TYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.BOOL: "BOOL",
}
INSTANCE_KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU")


class TritonRepoError(ValueError):
    """A model that cannot be described to Triton (an ONNX type Triton has no name for, a fixed batch size)."""


@dataclass(frozen=True)
class TritonTensor:
    """One input or output as Triton sees it: `datatype` as in model metadata (FP32, UINT8 …); `shape` with the
    batch dimension first, -1 for every dynamic dimension (what get_model_metadata reports)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def dims(self) -> tuple[int, ...]:
        """config.pbtxt's dims: the shape without the batch dimension (max_batch_size > 0 adds it)."""
        return self.shape[1:]


@dataclass(frozen=True)
class OnnxSignature:
    """The inputs and outputs of one ONNX file, in graph order."""

    inputs: tuple[TritonTensor, ...]
    outputs: tuple[TritonTensor, ...]


def _tensor(value: onnx.ValueInfoProto, path: Path) -> TritonTensor:
    tensor_type = value.type.tensor_type
    datatype = _TRITON_TYPES.get(tensor_type.elem_type)
    if datatype is None:
        name = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        raise TritonRepoError(f"{path.name}: tensor {value.name} has type {name}, which Triton cannot serve")
    shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
    if not shape or shape[0] != -1:
        raise TritonRepoError(f"{path.name}: tensor {value.name} has no dynamic batch dimension (shape {shape})")
    return TritonTensor(value.name, datatype, shape)


def onnx_signature(path: Path) -> OnnxSignature:
    """Names, Triton data types and shapes of a prepared ONNX's inputs and outputs (weights are not needed, but
    onnx reads the whole file; the prepared models are a few MB)."""
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except (OSError, ValueError, DecodeError) as exc:
        raise TritonRepoError(f"cannot read {path}: {exc}") from exc
    initializers = {init.name for init in graph.initializer}
    inputs = tuple(_tensor(v, path) for v in graph.input if v.name not in initializers)
    return OnnxSignature(inputs, tuple(_tensor(v, path) for v in graph.output))


def _tensor_block(tensors: Sequence[TritonTensor]) -> str:
    entries = [f'  {{\n    name: "{t.name}"\n    data_type: TYPE_{t.datatype}\n'
               f'    dims: [ {", ".join(str(d) for d in t.dims)} ]\n  }}' for t in tensors]
    return "[\n" + ",\n".join(entries) + "\n]"


def model_config_text(name: str, signature: OnnxSignature, max_batch: int, *, backend: str | None = None,
                      instances: int = 1, kind: str = "KIND_AUTO", queue_delay_us: int = 0) -> str:
    """config.pbtxt for one model: platform onnxruntime_onnx (or `backend`, e.g. "python" for the tests), Triton's
    dynamic batcher on (it merges requests of many daemons), `instances` copies of kind `kind` (KIND_AUTO: on a
    GPU where the server has one). `queue_delay_us` > 0 lets the batcher wait that long for more requests to merge
    (Triton's max_queue_delay_microseconds): without it, only requests already queued while the model runs merge."""
    if kind not in INSTANCE_KINDS:
        raise TritonRepoError(f"instance kind {kind} is not one of {', '.join(INSTANCE_KINDS)}")
    if queue_delay_us < 0:
        raise TritonRepoError(f"queue delay {queue_delay_us} us is negative")
    runtime = f'backend: "{backend}"' if backend else 'platform: "onnxruntime_onnx"'
    batcher = (f"dynamic_batching {{\n  max_queue_delay_microseconds: {int(queue_delay_us)}\n}}\n" if queue_delay_us
               else "dynamic_batching { }\n")
    return (f'name: "{name}"\n{runtime}\nmax_batch_size: {int(max_batch)}\n'
            f"{batcher}"
            f"instance_group [\n  {{\n    count: {int(instances)}\n    kind: {kind}\n  }}\n]\n"
            f"input {_tensor_block(signature.inputs)}\noutput {_tensor_block(signature.outputs)}\n")


def write_triton_model(repo: Path, name: str, onnx_path: Path, max_batch: int, *, backend: str | None = None,
                       instances: int = 1, kind: str = "KIND_AUTO", queue_delay_us: int = 0) -> Path:
    """DIR/<name>/config.pbtxt and DIR/<name>/1/model.onnx (a copy of `onnx_path`); returns the model's folder."""
    signature = onnx_signature(onnx_path)
    folder = repo / name
    (folder / VERSION).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(onnx_path, folder / VERSION / MODEL_FILE)
    text = model_config_text(name, signature, max_batch, backend=backend, instances=instances, kind=kind,
                             queue_delay_us=queue_delay_us)
    (folder / "config.pbtxt").write_text(text, encoding="utf-8")
    log.info("triton repository: %s (max_batch_size %d)", folder, max_batch)
    return folder


def write_triton_repository(repo: Path, models: Sequence[tuple[str, Path]], max_batch: int,
                            instances: int = 1, kind: str = "KIND_AUTO", queue_delay_us: int = 0) -> list[Path]:
    """A repository for a production Triton (onnxruntime backend): one folder per (model name, prepared ONNX)."""
    repo.mkdir(parents=True, exist_ok=True)
    return [write_triton_model(repo, name, path, max_batch, instances=instances, kind=kind,
                               queue_delay_us=queue_delay_us) for name, path in models]
