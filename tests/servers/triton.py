"""A real Triton Inference Server for tests: the `tritonserver` 2.51 binary bundled in the `nvidia-pytriton` wheel.

That wheel has Triton's Python backend only (no onnxruntime backend exists on the package index), so each model of
the test repository is a Python-backend `model.py` that runs OUR prepared ONNX through ONNX Runtime, with the
config.pbtxt the production writer makes (pipeline.modelprep.triton_repo, `backend: "python"` instead of the
onnxruntime platform): the same tensor names, data types and dims a production server serves.

Started directly (not through PyTriton's Python API, which the issue measured ~2.5x slower), on loopback only (it
listens on 0.0.0.0 unless told), with the wheel's backends copied beside the stub for this Python version, as PyTriton
does. The stub needs the running interpreter's libpython (and the wheel's own libraries, as the stub is copied) on
LD_LIBRARY_PATH and this venv's bin first on PATH (its `python` is the one whose numpy and onnxruntime model.py
imports). The wheel is installed with --no-deps (it asks for numpy<2); its stub's numpy bridge then misreads numpy 2
arrays, so model.py passes tensors through DLPack (measured: as_numpy() repeated the first element).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pipeline.modelprep.triton_repo import write_triton_model
from tests.running_daemon import wait_until

log = logging.getLogger(__name__)

MODEL_PY = '''"""Triton Python backend: runs the prepared ONNX beside this file's version folder through ONNX Runtime."""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            # Through DLPack both ways: the stub's as_numpy() and Tensor(name, array) were built against numpy 1 and
            # read or write numpy 2 arrays wrongly (every element the first one; an empty output).
            feed = {name: np.from_dlpack(pb_utils.get_input_tensor_by_name(request, name)) for name in self.inputs}
            values = self.session.run(self.outputs, feed)
            tensors = [pb_utils.Tensor.from_dlpack(name, np.ascontiguousarray(value))
                       for name, value in zip(self.outputs, values)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''


def pytriton_dir() -> Path | None:
    """The installed nvidia-pytriton package's folder (found without importing it: it needs numpy<2)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def triton_missing() -> str | None:
    """Why no Triton server can be started here, or None."""
    root = pytriton_dir()
    if root is None:
        return "nvidia-pytriton is not installed (pip install --no-deps nvidia-pytriton==0.7.0, see .ci/run)"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for needed in (root / "tritonserver" / "bin" / "tritonserver",
                   root / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"):
        if not needed.exists():
            return f"nvidia-pytriton lacks {needed}"
    return None


def free_ports(count: int) -> list[int]:
    """`count` loopback ports free now (bound together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def write_test_repository(repo: Path, models: Sequence[tuple[str, Path]], max_batch: int = 32,
                          queue_delay_us: int = 0) -> Path:
    """A Python-backend repository serving each (Triton name, prepared ONNX) with the production tensors."""
    for name, onnx_path in models:
        folder = write_triton_model(repo, name, onnx_path, max_batch, backend="python", kind="KIND_CPU",
                                    queue_delay_us=queue_delay_us)
        (folder / "1" / "model.py").write_text(MODEL_PY, encoding="utf-8")
    return repo


class TritonServer:
    """One tritonserver process on loopback ports, over a model repository; can be killed and started again on the
    same ports (what a restarted server looks like to a client)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.dir = Path(tempfile.mkdtemp(prefix="triton-test-"))
        self.backends = self._backends()
        self.log_path = self.dir / "tritonserver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _backends(self) -> Path:
        """The wheel's backends with the stub for this Python copied in (the stub is looked up beside them)."""
        root = pytriton_dir()
        if root is None:
            raise RuntimeError(triton_missing() or "nvidia-pytriton missing")
        backends = self.dir / "backends"
        shutil.copytree(root / "tritonserver" / "backends", backends)
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        stub = root / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
        shutil.copy(stub, backends / "python" / "triton_python_backend_stub")
        return backends

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        root = pytriton_dir()
        wheel_libs = str(root.parent / "nvidia_pytriton.libs") if root else ""  # the copied stub's own libraries
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, wheel_libs, env.get("LD_LIBRARY_PATH", ""))
                                                 if p)
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        return env

    def start(self, timeout: float = 30.0) -> TritonServer:
        root = pytriton_dir()
        binary = root / "tritonserver" / "bin" / "tritonserver" if root else Path("tritonserver")
        command = [str(binary), f"--model-repository={self.repo}", f"--backend-directory={self.backends}",
                   "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
                   "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                   "--metrics-port", str(self.metrics_port), "--log-verbose", "0"]
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=self._env(),
                                         start_new_session=True)
        if not wait_until(lambda: self.ready() or self.proc.poll() is not None, timeout) or not self.ready():
            text = self.log_text()[-3000:]
            self.stop()
            raise RuntimeError(f"tritonserver did not become ready on {self.url}: {text}")
        return self

    def ready(self) -> bool:
        """Whether the server answers /v2/health/ready on its HTTP port (every model loaded)."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=0.5) as reply:
                return reply.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server and its Python stubs (a crash, not a clean stop)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self.proc = None

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the prepared models on loopback until interrupted, for `bench pipeline --backend triton` on a machine
    without a production Triton:  python -m tests.servers.triton [--precision fp32] [--max-batch 32] [--queue-delay-us N]"""
    import argparse
    import time

    from pipeline.modelprep.manifest import MODELS_DIR

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--models", default="retinaface_mnet025,mini_xception_fer2013", help="prepared model names")
    parser.add_argument("--precision", default="fp32", help="which prepared variant to serve (fp32)")
    parser.add_argument("--max-batch", type=int, default=32, help="max_batch_size of each model (32)")
    parser.add_argument("--queue-delay-us", type=int, default=0, help="max_queue_delay_microseconds (0)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops the server too, as Ctrl-C does
    logging.basicConfig(level=logging.INFO)
    repo = Path(tempfile.mkdtemp(prefix="triton-repo-"))
    models = [(name, MODELS_DIR / f"{name}.{args.precision}.onnx") for name in args.models.split(",")]
    write_test_repository(repo, models, args.max_batch, args.queue_delay_us)
    with TritonServer(repo) as server:
        log.info("Triton serving %s on %s (gRPC); Ctrl-C stops it", args.models, server.url)
        print(server.url, flush=True)
        try:
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    shutil.rmtree(repo, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
