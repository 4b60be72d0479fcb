"""Where a further ONNX Runtime CUDA session's host memory goes: the library handles its CUDA provider makes.

BENCHMARKS.md round 6 measured ~74 MB of anonymous host memory (VmRSS) per further CUDA session, not ONNX Runtime's
CPU arena and not CUDA's module loading; a camera group keeps 14 sessions, so this is ~1 GB of each group's host
memory. ONNX Runtime's CUDA provider makes a cuDNN, a cuBLAS and a cuBLASLt handle per session (per thread that runs
it). This probe makes those handles itself, one at a time, from the very libraries ONNX Runtime loads, and reads the
process's VmRSS after each; then it makes and runs CUDA sessions of the prepared detector the same way. One JSON line
per step on stdout. Runs on the GPU machine (deploy/gpu-bench.sh cuda-handles), with CUBLAS_WORKSPACE_CONFIG as the
daemon sets it.

    python3 deploy/cuda_handle_probe.py [MODEL.onnx] [HANDLES_EACH] [SESSIONS]
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
from pathlib import Path

LIBRARIES = {  # handle type: (library name pattern, create function)
    "cudnn": ("libcudnn.so.*", "cudnnCreate"),
    "cublas": ("libcublas.so.*", "cublasCreate_v2"),
    "cublaslt": ("libcublasLt.so.*", "cublasLtCreate"),
}
SYMBOLIC = {"batch": 1, "height": 352, "width": 640}  # the prepared detector's free dimensions, as the pipeline runs it


def rss_mb() -> dict[str, float]:
    """VmRSS and its anonymous and file parts, MB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def find_library(pattern: str) -> str:
    """The first match of `pattern` under any sys.path entry (the pip-installed NVIDIA libraries ONNX Runtime uses)."""
    for entry in sys.path:
        found = sorted(glob.glob(os.path.join(entry or ".", "**", pattern), recursive=True))
        if found:
            return found[0]
    raise FileNotFoundError(f"no {pattern} under sys.path")


def report(step: str, **extra: object) -> None:
    print(json.dumps({"step": step, **rss_mb(), **extra}), flush=True)


def handles(count: int) -> None:
    """`count` handles of each library, each created after the library is loaded and the CUDA context exists."""
    for kind, (pattern, create) in LIBRARIES.items():
        path = find_library(pattern)
        library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        report(f"{kind} loaded", library=os.path.basename(path))
        for index in range(count):
            handle = ctypes.c_void_p()
            status = getattr(library, create)(ctypes.byref(handle))
            report(f"{kind} handle {index + 1}", status=int(status))


def sessions(model: str, count: int) -> None:
    """`count` CUDA sessions of `model`, each run once (the provider makes its handles on the first run)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    kept = []
    for index in range(count):
        session = ort.InferenceSession(model, options, providers=[("CUDAExecutionProvider",
                                                                   {"cudnn_conv_algo_search": "HEURISTIC"})])
        report(f"session {index + 1} made")
        feed = session.get_inputs()[0]
        shape = [d if isinstance(d, int) else SYMBOLIC.get(d, 1) for d in feed.shape]
        session.run(None, {feed.name: np.zeros(shape, np.uint8 if "uint8" in feed.type else np.float32)})
        report(f"session {index + 1} run")
        kept.append(session)


def main(argv: list[str]) -> int:
    model = argv[0] if argv else "models/retinaface_mnet025.fp16.onnx"
    each = int(argv[1]) if len(argv) > 1 else 3
    count = int(argv[2]) if len(argv) > 2 else 3
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    report("start")
    from cuda.bindings import runtime  # the CUDA context first, so each handle's own cost shows alone

    runtime.cudaFree(0)
    report("CUDA context")
    handles(each)
    sessions(model, count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
