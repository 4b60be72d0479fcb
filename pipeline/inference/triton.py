"""Triton backend: each batch goes to a Triton Inference Server over gRPC (KServe v2, `tritonclient[grpc]`).

Why: a fleet of daemons shares one GPU server; Triton's own dynamic batcher merges the batches of many daemons (each
daemon still batches its own cameras in BatchedModel). Registered as the `triton` backend; its settings are
`inference.triton` (TritonSettings).

What is sent: the names, data types and shapes of our prepared ONNX (modelprep.triton_repo.onnx_signature), the file
the Triton server serves too (`prepare-models --triton-repo`). At start the server's model metadata is checked
against it, and a mismatch (another input name, data type or shape) is a BackendError naming the model, the
tensor, what we expected and what the server has: it would fail every batch otherwise.

A server that cannot be reached, at start or later, never stops the daemon: the failing batch fails like any
backend error (BatchedModel fails its futures, the camera skips that frame and counts it), the backend is marked
down (`health()`: a /healthz problem and `emotion_backend_up` 0), and batches fail at once without a network call
until the next check, after a backoff that doubles from `reconnect_min_s` to `reconnect_max_s`. A check that finds
the server again re-reads the model metadata (a restarted server may serve another model) and the next batches run.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core.redact import MASK
from pipeline.core.registry import Plugin
from pipeline.inference.backend import (
    Backend,
    BackendError,
    BackendHealth,
    ModelRuntime,
    TensorSpec,
)
from pipeline.inference.settings import TritonModelRef, TritonSettings
from pipeline.modelprep.triton_repo import (
    OnnxSignature,
    TritonRepoError,
    TritonTensor,
    onnx_signature,
)

if TYPE_CHECKING:
    from pipeline.modelprep.manifest import ModelManifest

log = logging.getLogger(__name__)

_NUMPY_TYPES = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "UINT8": np.uint8, "INT8": np.int8,
                "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_}
# gRPC status codes that mean "the server is not there (yet)": retried with backoff, not a setup error.
_UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN")


class TritonUnreachable(BackendError):
    """The server cannot be reached (or is not ready): the batch fails and the backend retries later."""


def _client_module() -> Any:
    try:
        import tritonclient.grpc as grpcclient
    except ImportError as exc:
        raise BackendError("inference.backend triton needs tritonclient[grpc]: pip install -r requirements.txt") from exc
    return grpcclient


def _unreachable(exc: Exception) -> bool:
    """Whether a tritonclient error means the server is unreachable (rather than refusing this request)."""
    status = str(getattr(exc, "status", lambda: "")() or "")
    return any(code in status for code in _UNREACHABLE) or "failed to connect" in str(exc).lower()


def _auth_headers(settings: TritonSettings) -> dict[str, str] | None:
    """`authorization: Bearer TOKEN` for every request when a token is set."""
    return {"authorization": f"Bearer {settings.token.get_secret_value()}"} if settings.token is not None else None


def _new_client(grpc: Any, settings: TritonSettings) -> Any:
    """A gRPC client of the server in `settings` (TLS with its CA bundle when asked)."""
    root = Path(settings.ca_file).read_bytes() if settings.tls and settings.ca_file else None
    return grpc.InferenceServerClient(settings.url, ssl=settings.tls, root_certificates=root)


def _tensor_spec(tensor: TritonTensor) -> TensorSpec:
    return TensorSpec(tensor.name, tensor.shape, np.dtype(_NUMPY_TYPES[tensor.datatype]))


def metadata_mismatches(model: str, expected: OnnxSignature, metadata: dict[str, Any]) -> list[str]:
    """Every difference between our prepared ONNX and what Triton serves (get_model_metadata as JSON), as
    `model M: input X: expected …, got …`; empty when they agree. Extra outputs on the server are harmless."""
    problems: list[str] = []
    for kind, ours, theirs in (("input", expected.inputs, metadata.get("inputs", [])),
                               ("output", expected.outputs, metadata.get("outputs", []))):
        served = {t["name"]: t for t in theirs}
        for tensor in ours:
            got = served.get(tensor.name)
            if got is None:
                names = ", ".join(sorted(served)) or "none"
                problems.append(f"model {model}: {kind} {tensor.name}: expected {tensor.datatype} "
                                f"{list(tensor.shape)}, got no such {kind} (the server has: {names})")
                continue
            shape = [int(d) for d in got.get("shape", [])]
            if got.get("datatype") != tensor.datatype or shape != list(tensor.shape):
                problems.append(f"model {model}: {kind} {tensor.name}: expected {tensor.datatype} "
                                f"{list(tensor.shape)}, got {got.get('datatype')} {shape}")
        if kind == "input":
            known = {t.name for t in ours}
            problems += [f"model {model}: input {name}: the server expects an input the prepared ONNX does not "
                         f"have (expected only {', '.join(sorted(known))})" for name in sorted(set(served) - known)]
    return problems


class TritonBackend(Backend):
    """One of our models, run by a Triton server. Thread-safe: `lanes` runners may send batches at once."""

    name = "triton"

    def __init__(self, settings: TritonSettings, ref: TritonModelRef, signature: OnnxSignature, spec: ModelRuntime,
                 model_path: Path) -> None:
        super().__init__([_tensor_spec(t) for t in signature.inputs], [_tensor_spec(t) for t in signature.outputs],
                         max_batch=spec.max_batch, lanes=spec.lanes)
        self._grpc = _client_module()
        self._settings = settings
        self._ref = ref
        self._signature = signature
        self._precision = spec.precision
        self._model_path = model_path
        self._headers = _auth_headers(settings)
        self._timeout_s = settings.timeout_ms / 1000.0
        self._lock = threading.Lock()
        self._client: Any = None
        self._up = False
        self._problem: str | None = None
        self._reconnects = 0
        self._delay_s = settings.reconnect_min_s
        self._next_check = 0.0
        self._closed = False

    @classmethod
    def create(cls, spec: ModelRuntime, model: ModelManifest, model_path: Path) -> TritonBackend:
        """Read what to send from the prepared ONNX and check the server's metadata; an unreachable server is
        logged and retried later (never a failure to start), a mismatching model is a BackendError."""
        settings = spec.options if isinstance(spec.options, TritonSettings) else TritonSettings()
        if settings.url is None:
            raise BackendError("inference.backend triton needs inference.triton.url")
        try:
            signature = onnx_signature(model_path)
        except TritonRepoError as exc:
            raise BackendError(f"{model.name}: {exc}") from exc
        backend = cls(settings, settings.model_ref(model.name), signature, spec, model_path)
        try:
            backend._connect()
        except TritonUnreachable:  # logged by _down; the daemon starts, and batches fail until the server answers
            log.info("%s: starting without Triton; it is checked again with backoff", model.name)
        return backend

    def _connect(self) -> None:
        """A fresh client, the model's metadata read and checked; marks the backend up. TritonUnreachable when
        the server does not answer; BackendError (backend stays down) when it serves something else."""
        ref, url = self._ref, self._settings.url
        client = _new_client(self._grpc, self._settings)
        try:
            metadata = client.get_model_metadata(ref.name, ref.version, headers=self._headers, as_json=True,
                                                 client_timeout=self._timeout_s)
        except self._grpc.InferenceServerException as exc:
            client.close()
            if _unreachable(exc):
                raise self._down(f"Triton at {url} is unreachable: {self._clean(exc)}") from None
            raise BackendError(f"Triton at {url} cannot serve model {ref.name}: {self._clean(exc)}") from None
        problems = metadata_mismatches(ref.name, self._signature, metadata)
        if problems:
            client.close()
            raise BackendError(f"Triton at {url} serves a model that does not match {self._model_path.name}: "
                               + "; ".join(problems))
        with self._lock:
            old, self._client = self._client, client
            was_down = self._problem is not None
            self._up, self._problem, self._delay_s = True, None, self._settings.reconnect_min_s
            self._reconnects += int(was_down)
        if old is not None:
            old.close()
        if was_down:
            log.warning("%s: Triton at %s answers again", ref.name, url)

    def _down(self, reason: str) -> TritonUnreachable:
        """Mark the backend down with `reason`, schedule the next check (doubling backoff); the error to raise."""
        with self._lock:
            newly = self._up or self._problem is None
            self._up, self._problem = False, reason
            self._next_check = time.monotonic() + self._delay_s
            self._delay_s = min(self._delay_s * 2.0, self._settings.reconnect_max_s)
        if newly:
            log.warning("%s: %s", self._ref.name, reason)
        return TritonUnreachable(f"{self._ref.name}: {reason}")

    def _ready_client(self) -> Any:
        """The client to send with; while down, reconnect when the backoff has passed, else fail at once."""
        with self._lock:
            if self._closed:
                raise BackendError(f"{self._ref.name}: the Triton backend is closed")
            client, up, due = self._client, self._up, time.monotonic() >= self._next_check
            problem = self._problem
        if up:
            return client
        if not due:
            raise TritonUnreachable(f"{self._ref.name}: {problem} (next check in "
                                    f"{max(0.0, self._next_check - time.monotonic()):.1f} s)")
        try:
            self._connect()
        except TritonUnreachable:
            raise
        except BackendError as exc:  # answers, but serves something else now: keep checking, with backoff
            raise self._down(str(exc)) from None
        return self._client

    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        """One batch as one request (Triton's batcher may merge it with other daemons'); an unreachable server
        marks the backend down and fails the batch, which the batcher hands to the callers' futures."""
        client = self._ready_client()
        grpc = self._grpc
        inputs = []
        for spec in self.inputs:
            array = np.ascontiguousarray(batch[spec.name], dtype=spec.dtype)
            infer_input = grpc.InferInput(spec.name, list(array.shape), self._datatype(spec))
            infer_input.set_data_from_numpy(array)
            inputs.append(infer_input)
        wanted = [grpc.InferRequestedOutput(spec.name) for spec in self.outputs]
        try:
            result = client.infer(self._ref.name, inputs, model_version=self._ref.version, outputs=wanted,
                                  headers=self._headers, client_timeout=self._timeout_s)
        except grpc.InferenceServerException as exc:
            if _unreachable(exc):
                raise self._down(f"Triton at {self._settings.url} is unreachable: {self._clean(exc)}") from None
            raise BackendError(f"{self._ref.name}: Triton refused the batch: {self._clean(exc)}") from None
        return {spec.name: result.as_numpy(spec.name) for spec in self.outputs}

    def _datatype(self, spec: TensorSpec) -> str:
        """Triton's name of an input's data type, from the prepared ONNX (UINT8 for our image inputs)."""
        return next(t.datatype for t in self._signature.inputs if t.name == spec.name)

    def _clean(self, exc: Exception) -> str:
        """An error's text without the token, whatever the library put in it."""
        text = str(exc) or type(exc).__name__
        token = self._settings.token
        return text.replace(token.get_secret_value(), MASK) if token is not None else text

    def health(self) -> BackendHealth:
        with self._lock:
            return BackendHealth(up=self._up, problem=self._problem, reconnects=self._reconnects, remote=True)

    def describe(self) -> dict[str, str]:
        version = self._ref.version or "latest"
        return {"backend": self.name, "device": "remote", "precision": self._precision,
                "providers": f"{self._settings.describe()}, model {self._ref.name} version {version}",
                "lanes": str(self.lanes), "file": self._model_path.name}

    def close(self) -> None:
        """Refuse later runs and close the gRPC channel (a run in flight then fails, like a closed lane)."""
        with self._lock:
            client, self._client, self._closed, self._up = self._client, None, True, False
        if client is not None:
            client.close()


PLUGIN = Plugin("triton", TritonSettings, TritonBackend)


def batcher_statistics(settings: TritonSettings, models: list[str]) -> dict[str, dict[str, int]]:
    """Per our model name, Triton's cumulative `inference_count` (items), `request_count` (successful requests) and
    `execution_count` (model runs) for the model serving it: requests per execution over a window is how much
    Triton's dynamic batcher merged (bench pipeline reports it). Empty for a model the server cannot report on."""
    grpc = _client_module()
    client = _new_client(grpc, settings)
    headers = _auth_headers(settings)
    out: dict[str, dict[str, int]] = {}
    try:
        for model in models:
            ref = settings.model_ref(model)
            try:
                stats = client.get_inference_statistics(ref.name, ref.version, headers=headers, as_json=True)
            except grpc.InferenceServerException as exc:
                log.warning("%s: no statistics from Triton: %s", model, exc)
                continue
            rows = stats.get("model_stats", [])
            out[model] = {"inference_count": sum(int(r.get("inference_count", 0)) for r in rows),
                          "execution_count": sum(int(r.get("execution_count", 0)) for r in rows),
                          "request_count": sum(int(r.get("inference_stats", {}).get("success", {}).get("count", 0))
                                               for r in rows)}
    finally:
        client.close()
    return out
