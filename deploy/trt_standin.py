"""Stand-in for TensorRT: runs the TensorRT backend's real CUDA code on a GPU where TensorRT cannot be installed.

Real, unchanged: pipeline/inference/gpu/cuda.py (cuda-python: pinned and device buffers, non-blocking streams,
blocking-sync events, `check`) and the backend's lanes in pipeline/inference/gpu/tensorrt.py
(`TensorRTBackend.assemble`, `run`, `staging`, `warm_up`, `close`, `_Lane`). A STAND-IN: the engine and its execution
contexts (`StandInEngine`, `StandInContext` below), which implement only the calls the lanes make. Their
`execute_async_v3(stream)` queues real CUDA work on the lane's stream, as TensorRT's enqueue does:
  - output "copy": cudaMemcpyAsync device-to-device of the uint8 input, so it must equal the input's bytes;
  - output "affine" (only where CuPy is installed): 2*x+1 in float32, a CuPy kernel launched on the lane's stream;
  - optionally first a chain of large device-to-device copies ("busy"), so a run is still on the GPU when another
    thread closes the backend, or while the waiting thread's CPU time is measured.

Checks (keys of the JSON summary, each with ok and what was measured): concurrent (2 lanes, 3 threads, batch sizes
1..max, results checked), warm_up, blocking_sync (the thread waiting for a busy run sleeps: CPU time far below wall
time), close_in_flight (close() from another thread while a run is still enqueueing, and while its work is on the
GPU: close waits for it, the run's result is right, later runs are refused, close twice is fine), memory
(cudaMemGetInfo and the wing's allocation ledger back to where they were after close), errors (CudaError naming the
call for a failed allocation and a failed enqueue copy; a refused enqueue quotes only its own thread's TensorRT
messages; an oversized copy and a wrong shape are refused before CUDA; the lane works again afterwards).

Run on the GPU machine, from the repository root:   PYTHONPATH=$HOME/site:. python3 deploy/trt_standin.py
It needs python3, numpy, pydantic and cuda-python (CuPy optional); not onnxruntime, not tensorrt. Prints the JSON
summary and writes $OUT/trt_standin.json when $OUT is set.
Exit status: 0 every check passed, 1 a check failed, 2 no CUDA device, no cuda-python or no pydantic (one line on
stderr).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

INPUT = "image"
ITEM_SHAPE = (64, 64, 3)  # one uint8 item, like a small face crop
ITEM = int(np.prod(ITEM_SHAPE))
MAX_BATCH = 32
BATCH_SIZES = (1, 2, 3, 5, 8, 13, 21, 32)
SCRATCH_BYTES = 512 << 20  # each of the two buffers the "busy" copies go between
BUSY_TARGET_S = 0.2
MAX_BUSY_COPIES = 600  # stays below the depth of a stream's work queue, so enqueueing never blocks


def pydantic_version() -> str:
    """pydantic's version (the backend module declares its settings with it); exit 2 with one line when it is absent."""
    try:
        import pydantic
    except ImportError:
        print("pydantic is not installed: install the project's small wheels first (../shared/tools/gpu-machine.md)",
              file=sys.stderr)
        raise SystemExit(2) from None
    return str(pydantic.VERSION)


def optional_cupy() -> Any:
    try:
        import cupy
    except ImportError:
        return None
    return cupy


class StandInContext:
    """STAND-IN for trt.IExecutionContext: only the calls _Lane makes. Not TensorRT: execute_async_v3 queues copies
    (and with CuPy a kernel) on the lane's stream."""

    def __init__(self, engine: StandInEngine) -> None:
        self.engine = engine
        self.addresses: dict[str, int] = {}
        self.batch = 0
        self.busy_copies = 0  # set by a check: GPU time queued before the real work of the next runs
        self.host_delay_s = 0.0  # set by a check: time spent "enqueueing" on the host, as TensorRT does
        self.fail_next: str | None = None  # "bad_copy" or "refuse", for one run
        self.started = threading.Event()  # set when execute_async_v3 is entered (the lane's lock is held then)

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = int(ptr)
        return True

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        if name != INPUT or tuple(shape[1:]) != ITEM_SHAPE or not 1 <= shape[0] <= self.engine.max_batch:
            self.engine.messages.add(1, "error", f"stand-in: shape {shape} is outside the profile")
            return False
        self.batch = int(shape[0])
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (self.batch, ITEM)

    def execute_async_v3(self, stream_handle: int) -> bool:
        engine, rt = self.engine, self.engine.runtime
        self.started.set()
        time.sleep(self.host_delay_s)
        failure, self.fail_next = self.fail_next, None
        if failure == "refuse":
            return engine.refuse(self)
        count = self.batch * ITEM
        d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        dst = 0 if failure == "bad_copy" else self.addresses["copy"]
        for _ in range(self.busy_copies):
            engine.check(rt.cudaMemcpyAsync(engine.scratch[1].ptr, engine.scratch[0].ptr, SCRATCH_BYTES, d2d,
                                            stream_handle), "cudaMemcpyAsync (stand-in engine: busy copy)")
        engine.check(rt.cudaMemcpyAsync(dst, self.addresses[INPUT], count, d2d, stream_handle),
                     f"cudaMemcpyAsync (stand-in engine: input to output 'copy' at address {dst:#x})")
        if engine.cupy is not None:
            engine.affine(stream_handle, self.addresses[INPUT], self.addresses["affine"], count, self)
        return True


class StandInEngine:
    """STAND-IN for trt.ICudaEngine: create_execution_context() only, plus what its contexts share."""

    def __init__(self, messages: Any, scratch: tuple[Any, Any], cupy: Any, max_batch: int) -> None:
        from pipeline.inference.gpu.cuda import check, load_runtime

        self.messages, self.scratch, self.cupy, self.max_batch = messages, scratch, cupy, max_batch
        self.runtime, self.check = load_runtime(), check
        self.contexts: list[StandInContext] = []
        self._kernel: Any = None

    def create_execution_context(self) -> StandInContext:
        context = StandInContext(self)
        self.contexts.append(context)
        return context

    def refuse(self, context: StandInContext) -> bool:
        """What TensorRT does on a failed enqueue: log an error (on the calling thread) and return False. Another
        lane logs at the same moment, which the lane's error must not quote."""
        noise = threading.Thread(target=self.messages.add, args=(1, "error", "stand-in: another lane's message"))
        noise.start()
        noise.join()
        self.messages.add(1, "error", f"stand-in: enqueue refused for batch {context.batch}")
        return False

    def affine(self, stream_handle: int, src: int, dst: int, count: int, owner: object) -> None:
        """y = 2x + 1 (uint8 -> float32) by a CuPy kernel on the lane's stream, over the lane's own buffers."""
        cp = self.cupy
        if self._kernel is None:
            self._kernel = cp.ElementwiseKernel("uint8 x", "float32 y", "y = 2.0f * (float)x + 1.0f",
                                                "trt_standin_affine")
        memory = cp.cuda.MemoryPointer
        x = cp.ndarray((count,), cp.uint8, memory(cp.cuda.UnownedMemory(src, count, owner), 0))
        y = cp.ndarray((count,), cp.float32, memory(cp.cuda.UnownedMemory(dst, count * 4, owner), 0))
        with cp.cuda.ExternalStream(stream_handle):
            self._kernel(x, y)


class Harness:
    """The real backend around a stand-in engine, and the checks run against it."""

    def __init__(self, device: Any, cupy: Any) -> None:
        from pipeline.inference.gpu import cuda

        self.cuda, self.device, self.cupy = cuda, device, cupy
        self.scratch = (cuda.DeviceBuffer("stand-in busy scratch A", SCRATCH_BYTES),
                        cuda.DeviceBuffer("stand-in busy scratch B", SCRATCH_BYTES))
        self.busy_copies = 0

    def tensors(self, max_batch: int) -> list[Any]:
        from pipeline.inference.gpu.tensorrt import IoTensor

        tensors = [IoTensor(INPUT, True, np.dtype(np.uint8), (-1, *ITEM_SHAPE), (max_batch, *ITEM_SHAPE)),
                   IoTensor("copy", False, np.dtype(np.uint8), (-1, ITEM), (max_batch, ITEM))]
        if self.cupy is not None:
            tensors.append(IoTensor("affine", False, np.dtype(np.float32), (-1, ITEM), (max_batch, ITEM)))
        return tensors

    def assemble(self, lanes: int = 2, max_batch: int = MAX_BATCH) -> tuple[Any, StandInEngine]:
        from pipeline.inference.gpu.engine_build import TrtMessages
        from pipeline.inference.gpu.tensorrt import TensorRTBackend

        messages = TrtMessages()
        engine = StandInEngine(messages, self.scratch, self.cupy, max_batch)
        info = {"backend": "tensorrt", "engine": "stand-in (not TensorRT)"}
        backend = TensorRTBackend.assemble(engine, self.tensors(max_batch), messages, self.device,
                                           model="stand-in", max_batch=max_batch, lanes=lanes, info=info)
        return backend, engine

    def close(self) -> None:
        for buffer in self.scratch:
            buffer.close()


def batch_of(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(size, *ITEM_SHAPE), dtype=np.uint8)


def mismatches(batch: np.ndarray, out: dict[str, np.ndarray]) -> list[str]:
    """What differs from the expected outputs (empty when all is right)."""
    flat = batch.reshape(len(batch), ITEM)
    problems = []
    if out["copy"].shape != flat.shape or not np.array_equal(out["copy"], flat):
        problems.append(f"copy differs for batch {len(batch)}")
    if "affine" in out and not np.array_equal(out["affine"], flat.astype(np.float32) * 2 + 1):
        problems.append(f"affine differs for batch {len(batch)}")
    return problems


def check_concurrent(h: Harness, rounds: int = 40) -> dict[str, Any]:
    """Lane 0 from one thread through its pinned staging buffer (as the batcher does); lane 1 from two threads at
    once with plain arrays (they queue on the lane's lock). Every result is compared with what it must be."""
    backend, _ = h.assemble(lanes=2)
    problems: list[str] = []
    runs = {0: 0, 1: 0}
    lock = threading.Lock()
    start = threading.Barrier(3)

    def worker(lane: int, seed: int, staged: bool) -> None:
        start.wait(30)
        for i in range(rounds):
            batch = batch_of(BATCH_SIZES[(i + seed) % len(BATCH_SIZES)], seed * 1000 + i)
            if staged:
                buffer = backend.staging(lane, len(batch), ITEM_SHAPE, np.dtype(np.uint8))
                np.stack(list(batch), out=buffer)
                out = backend.run({INPUT: buffer}, lane)
            else:
                out = backend.run({INPUT: batch}, lane)
            with lock:
                problems.extend(mismatches(batch, out))
                runs[lane] += 1

    errors = run_threads([(worker, (0, 1, True)), (worker, (1, 2, False)), (worker, (1, 3, False))])
    backend.close()
    return {"ok": not problems and not errors and runs == {0: rounds, 1: 2 * rounds}, "runs_per_lane": runs,
            "batch_sizes": list(BATCH_SIZES), "threads": 3, "lanes": 2, "mismatches": problems[:5],
            "errors": errors}


def run_threads(jobs: list[tuple[Callable[..., None], tuple[Any, ...]]], timeout: float = 120) -> list[str]:
    """Run each job on its own thread; the exceptions they raised, as text."""
    errors: list[str] = []

    def guarded(fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported in the JSON summary, not swallowed
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=guarded, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    errors.extend(f"thread {t.name} still running after {timeout} s" for t in threads if t.is_alive())
    return errors


def check_warm_up(h: Harness) -> dict[str, Any]:
    backend, engine = h.assemble(lanes=2)
    try:
        for lane in range(2):
            backend.warm_up(ITEM_SHAPE, np.dtype(np.uint8), lane)
        batches = sorted({c.batch for c in engine.contexts})
    finally:
        backend.close()
    return {"ok": batches == [MAX_BATCH], "last_batch_per_lane": batches}


def calibrate_busy(h: Harness) -> dict[str, Any]:
    """How many busy copies make a run take about BUSY_TARGET_S on this GPU."""
    backend, engine = h.assemble(lanes=1)
    try:
        engine.contexts[0].busy_copies = 20
        backend.run({INPUT: batch_of(1, 0)})  # first run: lazy setup
        started = time.perf_counter()
        backend.run({INPUT: batch_of(1, 0)})
        per_copy = max((time.perf_counter() - started) / 20, 1e-5)
    finally:
        backend.close()
    h.busy_copies = max(20, min(MAX_BUSY_COPIES, int(BUSY_TARGET_S / per_copy)))
    return {"ms_per_busy_copy": round(per_copy * 1e3, 4), "busy_copies": h.busy_copies,
            "copy_mib": SCRATCH_BYTES >> 20}


def check_blocking_sync(h: Harness) -> dict[str, Any]:
    """The thread that waits for a busy run sleeps (blocking-sync event): its CPU time stays far below wall time."""
    backend, engine = h.assemble(lanes=1)
    try:
        engine.contexts[0].busy_copies = h.busy_copies
        batch = batch_of(4, 7)
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        out = backend.run({INPUT: batch})
        wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    finally:
        backend.close()
    return {"ok": wall >= 0.05 and cpu < 0.5 * wall and not mismatches(batch, out), "wall_ms": round(wall * 1e3, 1),
            "thread_cpu_ms": round(cpu * 1e3, 1), "cpu_over_wall": round(cpu / wall, 3)}


def check_close_in_flight(h: Harness) -> dict[str, Any]:
    """close() from another thread while lane 0's run is in flight, once while it is still enqueueing on the host
    (inside execute_async_v3) and once while its work is on the GPU: the run completes correctly, close returns only
    after it, and runs asked for afterwards are refused."""
    cases = {"during_enqueue": close_during_run(h, host_delay_s=0.2, busy_copies=0),
             "during_gpu_work": close_during_run(h, host_delay_s=0.0, busy_copies=h.busy_copies)}
    return {"ok": all(case["ok"] for case in cases.values()), **cases}


def close_during_run(h: Harness, host_delay_s: float, busy_copies: int) -> dict[str, Any]:
    from pipeline.inference.backend import BackendError

    backend, engine = h.assemble(lanes=2)
    engine.contexts[0].busy_copies = busy_copies
    engine.contexts[0].host_delay_s = host_delay_s
    batch = batch_of(MAX_BATCH, 11)
    done: dict[str, Any] = {}

    def run_busy() -> None:
        try:
            done["out"] = backend.run({INPUT: batch}, 0)
        except Exception as exc:  # noqa: BLE001 - reported in the summary
            done["error"] = f"{type(exc).__name__}: {exc}"
        done["end"] = time.perf_counter()

    runner = threading.Thread(target=run_busy)
    runner.start()
    entered = engine.contexts[0].started.wait(30)  # the run is inside execute_async_v3, holding lane 0's lock
    close_start = time.perf_counter()
    backend.close()
    close_end = time.perf_counter()
    runner.join(60)
    refused = []
    for lane in (0, 1):
        try:
            backend.run({INPUT: batch[:1]}, lane)
        except BackendError as exc:
            refused.append(str(exc))
    backend.close()  # twice: nothing left to free, no error
    correct = "out" in done and not mismatches(batch, done["out"])
    waited = "end" in done and close_end >= done["end"]
    return {"ok": entered and correct and waited and len(refused) == 2, "run_correct": correct,
            "run_error": done.get("error"), "close_waited_for_run": waited,
            "close_ms": round((close_end - close_start) * 1e3, 1), "later_runs_refused": refused}


def check_memory(h: Harness) -> dict[str, Any]:
    """Device memory (cudaMemGetInfo) and the ledger of pinned and device buffers return to where they were."""
    cuda = h.cuda
    big = 256
    warm, _ = h.assemble(lanes=2, max_batch=big)  # once first: lazy loading settles before the baseline
    warm.run({INPUT: batch_of(big, 1)})
    warm.close()
    free_before, ledger_before = cuda.memory_info()[0], cuda.live_allocations()
    backend, _ = h.assemble(lanes=2, max_batch=big)
    backend.run({INPUT: batch_of(big, 2)}, 1)
    free_during, ledger_during = cuda.memory_info()[0], cuda.live_allocations()
    backend.close()
    free_after, ledger_after = cuda.memory_info()[0], cuda.live_allocations()
    held = ledger_during["device_bytes"] - ledger_before["device_bytes"]
    visible = free_before - free_during >= held // 2
    returned = abs(free_after - free_before) <= 8 << 20
    return {"ok": visible and returned and ledger_after == ledger_before,
            "device_bytes_held_by_backend": held,
            "pinned_bytes_held_by_backend": ledger_during["pinned_bytes"] - ledger_before["pinned_bytes"],
            "free_mib": {"before": free_before >> 20, "during": free_during >> 20, "after": free_after >> 20},
            "ledger_before": ledger_before, "ledger_after": ledger_after}


def expect_error(fn: Callable[[], object], kind: type[Exception], *needles: str,
                 not_kind: type[Exception] | None = None) -> dict[str, Any]:
    """Run `fn`; ok when it raises `kind` (but not `not_kind`) with every needle in its message."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - classified below and reported
        wanted = isinstance(exc, kind) and not (not_kind is not None and isinstance(exc, not_kind))
        return {"ok": wanted and all(n in str(exc) for n in needles), "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": False, "error": "nothing was raised"}


def check_errors(h: Harness) -> dict[str, Any]:
    """Each failure is the right exception naming the call, and the lane runs normally afterwards."""
    from pipeline.inference.backend import BackendError

    cuda = h.cuda
    results = {
        "device_alloc": expect_error(lambda: cuda.DeviceBuffer("stand-in huge", 1 << 50), cuda.CudaError,
                                     "cudaMalloc", "cudaErrorMemoryAllocation"),
        "pinned_alloc": expect_error(lambda: cuda.PinnedBuffer("stand-in huge", 1 << 50), cuda.CudaError,
                                     "cudaMallocHost"),
    }
    small, stream = cuda.DeviceBuffer("stand-in small", 16), cuda.Stream("stand-in stream")
    try:
        results["oversized_copy"] = expect_error(lambda: stream.copy_in(small, np.zeros(64, np.uint8)), BackendError,
                                                 "does not fit", not_kind=cuda.CudaError)  # refused before CUDA
    finally:
        stream.close()
        small.close()
    backend, engine = h.assemble(lanes=2)
    try:
        batch = batch_of(3, 5)
        engine.contexts[1].fail_next = "bad_copy"
        results["enqueue_copy"] = expect_error(lambda: backend.run({INPUT: batch}, 1), cuda.CudaError,
                                               "cudaMemcpyAsync", "stand-in engine")
        engine.contexts[1].fail_next = "refuse"
        refused = expect_error(lambda: backend.run({INPUT: batch}, 1), BackendError, "execute_async_v3 failed",
                               "enqueue refused")
        refused["ok"] &= "another lane" not in refused["error"]
        results["refused_enqueue_quotes_own_thread"] = refused
        results["wrong_shape"] = expect_error(lambda: backend.run({INPUT: batch_of(MAX_BATCH + 1, 1)}, 1),
                                              BackendError, "shape")
        results["lane_works_after_errors"] = {"ok": not mismatches(batch, backend.run({INPUT: batch}, 1))}
    finally:
        backend.close()
    return {"ok": all(r["ok"] for r in results.values()), **results}


def versions(cupy: Any, pydantic: str) -> dict[str, str]:
    found = {"python": sys.version.split()[0], "numpy": np.__version__, "pydantic": pydantic,
             "cupy": getattr(cupy, "__version__", "not installed (output 'affine' skipped)")}
    for name in ("cuda-python", "cuda-bindings"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def open_device() -> Any:
    """The GPU, or exit 2 with one line when there is none (or no cuda-python)."""
    from pipeline.inference.backend import BackendError
    from pipeline.inference.gpu.cuda import CudaDevice

    try:
        return CudaDevice.open(0)
    except BackendError as exc:
        print(f"no CUDA device: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


CHECKS: tuple[tuple[str, Callable[[Harness], dict[str, Any]]], ...] = (
    ("concurrent", check_concurrent), ("warm_up", check_warm_up), ("busy_calibration", calibrate_busy),
    ("blocking_sync", check_blocking_sync), ("close_in_flight", check_close_in_flight), ("memory", check_memory),
    ("errors", check_errors),  # last: should a failed copy break the CUDA context, the other checks are done
)


def run_checks(h: Harness) -> dict[str, Any]:
    """Every check in order; one that raises is recorded as failed (with its error) and the next one still runs."""
    checks: dict[str, Any] = {}
    for name, check in CHECKS:
        try:
            checks[name] = check(h)
        except Exception as exc:  # noqa: BLE001 - recorded in the summary, which then says ok: false
            checks[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return checks


def teardown(h: Harness) -> dict[str, Any]:
    """Free the harness's own buffers; a failure (e.g. a CUDA context broken by a failed check) is reported."""
    from pipeline.inference.backend import BackendError

    try:
        h.close()
    except BackendError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True}


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    pydantic = pydantic_version()
    device = open_device()
    cupy = optional_cupy()
    from pipeline.inference.gpu.cuda import live_allocations

    harness = Harness(device, cupy)
    checks = run_checks(harness)
    checks["teardown"] = teardown(harness)
    leaks = {k: v for k, v in live_allocations().items() if v}
    summary = {"ok": all(c.get("ok", True) for c in checks.values()) and not leaks,
               "what": "TensorRT backend lanes (real CUDA via cuda-python) around a STAND-IN engine; not TensorRT",
               "device": {"name": device.name, "compute_capability": device.compute_capability},
               "versions": versions(cupy, pydantic), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               "allocations_left": leaks, "checks": checks}
    text = json.dumps(summary, indent=2)
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "trt_standin.json").write_text(text + "\n", encoding="utf-8")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
