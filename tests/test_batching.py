"""BatchedModel (pipeline/inference/batching.py) over the real emotion model on ONNX Runtime.

Each test builds its own backend (closing a BatchedModel closes its backend, and the shared `perception` models must
stay usable). Only two boundary fakes: a gate that holds the backend until the test opens it, and a backend that
fails once; both wrap the real backend.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import cv2
import numpy as np
import pytest

from pipeline.inference.backend import Backend, ModelRuntime, create_backend
from pipeline.inference.batching import BatchedModel, ModelClosedError, QueueFullError
from tests.conftest import data_path

WAIT_S = 20.0  # generous: only reached when something hangs


@pytest.fixture(scope="module")
def make_backend(prepared_models, app_config):  # type: ignore[no-untyped-def]
    from pipeline.modelprep.manifest import load_manifest
    from pipeline.modelprep.prepare import ensure_model

    manifest = load_manifest("mini_xception_fer2013")
    path = ensure_model(manifest, "fp32")
    return lambda: create_backend(ModelRuntime.from_config(app_config.inference), manifest, path)


@pytest.fixture(scope="module")
def crops(perception) -> np.ndarray:  # type: ignore[no-untyped-def]
    """160 real 64x64x1 uint8 classifier inputs made from FER2013 images."""
    files = sorted(data_path("faces", "fer2013").glob("*/*.jpg"))[::2][:160]
    items = [perception.classifier.crop_from_still(cv2.imread(str(f), cv2.IMREAD_COLOR)) for f in files]
    assert len(items) == 160 and items[0].shape == (64, 64, 1) and items[0].dtype == np.uint8
    return np.stack(items)


@pytest.fixture(scope="module")
def reference(make_backend, crops: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Each crop run alone (batch of one) straight through a backend: the unbatched truth."""
    backend = make_backend()
    name = backend.inputs[0].name
    probs = np.stack([backend.run({name: crop[None]})["probs"][0] for crop in crops])
    backend.close()
    assert probs.shape == (160, 7)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    assert len({int(np.argmax(p)) for p in probs}) >= 3  # real faces, real, varied answers
    return probs


class GatedBackend(Backend):
    """The real backend, but `run` waits until the test opens the gate (a consumer as slow as the test wants)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner.inputs, inner.outputs, inner.max_batch, inner.lanes)
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()

    @classmethod
    def create(cls, cfg, model, model_path):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise NotImplementedError

    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        self.entered.set()
        assert self.gate.wait(WAIT_S), "gate never opened"
        return self.inner.run(batch, lane)

    def describe(self) -> dict[str, str]:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()


class FailingBackend(GatedBackend):
    """The real backend, except that batches containing a poisoned item (first pixel 255 and last pixel 1) fail."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.gate.set()
        self.calls = 0

    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        self.calls += 1
        items = next(iter(batch.values()))
        if any(item.flat[0] == 255 and item.flat[-1] == 1 for item in items):
            raise RuntimeError("device lost")
        return self.inner.run(batch, lane)


@pytest.fixture
def models() -> Iterator[list[BatchedModel]]:
    """Every BatchedModel a test makes is closed afterwards, even when the test fails."""
    made: list[BatchedModel] = []
    yield made
    for model in made:
        model.close(timeout=2.0)


def _run_threads(target: Callable[[int], None], count: int) -> None:
    """`target(0)` … `target(count - 1)`, each on its own thread at once; wait for all (bounded)."""
    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 2)


def _results(futures: list[Future]) -> np.ndarray:
    return np.stack([f.result(timeout=WAIT_S)["probs"] for f in futures])


def test_concurrent_submits_equal_unbatched_results(make_backend, crops, reference, models) -> None:  # type: ignore[no-untyped-def]
    model = BatchedModel(make_backend(), "emotion", max_batch=16, max_delay_ms=20.0, queue_size=256)
    models.append(model)
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def camera(worker: int) -> None:
        try:
            start.wait(WAIT_S)
            indices = list(range(worker * 20, worker * 20 + 20))
            futures = [model.submit(crops[i]) for i in indices]  # all at once, like faces of one frame
            for i, probs in zip(indices, _results(futures)):
                got[i] = probs
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    _run_threads(camera, 8)
    assert not errors, errors
    assert sorted(got) == list(range(160))
    batched = np.stack([got[i] for i in range(160)])
    np.testing.assert_allclose(batched, reference, atol=1e-5)
    stats = model.stats
    sizes = list(stats.batch_sizes)
    assert stats.items == 160 and sum(sizes) == 160 and stats.batches == len(sizes)
    assert max(sizes) > 1, sizes
    assert max(sizes) <= 16, sizes
    assert stats.rejected == 0 and stats.failed == 0


def test_max_batch_one_gives_only_batches_of_one(make_backend, crops, reference, models) -> None:  # type: ignore[no-untyped-def]
    model = BatchedModel(make_backend(), "emotion", max_batch=1, max_delay_ms=20.0, queue_size=256)
    models.append(model)
    futures = [model.submit(crop) for crop in crops[:40]]
    np.testing.assert_allclose(_results(futures), reference[:40], atol=1e-5)
    assert list(model.stats.batch_sizes) == [1] * 40


def test_max_batch_is_capped_by_the_backend(make_backend, models) -> None:  # type: ignore[no-untyped-def]
    backend = make_backend()
    model = BatchedModel(backend, "emotion", max_batch=10_000, max_delay_ms=1.0)
    models.append(model)
    assert model.max_batch == backend.max_batch


def test_full_queue_rejects_fast_and_counts(make_backend, crops, reference, models) -> None:  # type: ignore[no-untyped-def]
    backend = GatedBackend(make_backend())
    model = BatchedModel(backend, "emotion", max_batch=1, max_delay_ms=0.0, queue_size=4)
    models.append(model)
    accepted: list[tuple[int, Future]] = []
    rejected = 0
    for i in range(50):  # nothing can finish while the gate is shut
        try:
            accepted.append((i, model.submit(crops[i])))
        except QueueFullError:
            rejected += 1
    # at most: 4 queued + 1 held by the collector + 1 waiting for the lane + 1 running
    assert 4 <= len(accepted) <= 7, len(accepted)
    assert rejected == 50 - len(accepted)
    assert model.stats.rejected == rejected
    backend.gate.set()
    for i, future in accepted:
        np.testing.assert_allclose(future.result(timeout=WAIT_S)["probs"], reference[i], atol=1e-5)
    # and it accepts work again once the queue has drained
    np.testing.assert_allclose(model.infer(crops[60], timeout=WAIT_S)["probs"], reference[60], atol=1e-5)
    assert model.stats.rejected == rejected


def test_close_rejects_new_work_and_settles_every_pending_future(make_backend, crops, reference) -> None:  # type: ignore[no-untyped-def]
    backend = GatedBackend(make_backend())
    model = BatchedModel(backend, "emotion", max_batch=8, max_delay_ms=5.0, queue_size=256)
    futures = [model.submit(crop) for crop in crops[:30]]
    assert backend.entered.wait(WAIT_S)  # a batch is in flight, the rest are queued
    closer = threading.Thread(target=model.close, kwargs={"timeout": WAIT_S})
    closer.start()
    # close() is in progress: new work is refused at once, even before the in-flight batch finishes
    for _ in range(100):
        if model._closing.is_set():  # noqa: SLF001 - wait for close() to have begun, not for a time
            break
        time.sleep(0.01)
    with pytest.raises(ModelClosedError):
        model.submit(crops[0])
    backend.gate.set()
    closer.join(WAIT_S * 2)
    assert not closer.is_alive(), "close() hung"
    done = 0
    for i, future in enumerate(futures):
        try:
            probs = future.result(timeout=WAIT_S)["probs"]  # never hangs: a result or ModelClosedError
        except ModelClosedError:
            continue
        np.testing.assert_allclose(probs, reference[i], atol=1e-5)
        done += 1
    assert done >= 1  # the batch in flight at close() finished normally
    with pytest.raises(ModelClosedError):
        model.submit(crops[0])
    model.close()  # a second close is harmless


def test_backend_error_reaches_every_future_of_the_batch_and_serving_continues(  # type: ignore[no-untyped-def]
        make_backend, crops, reference, models) -> None:
    backend = FailingBackend(make_backend())
    # a batch is formed exactly when 6 items wait (the 10 s delay is never reached)
    model = BatchedModel(backend, "emotion", max_batch=6, max_delay_ms=10_000.0)
    models.append(model)
    poisoned = crops[10].copy()
    poisoned.flat[0], poisoned.flat[-1] = 255, 1
    bad = [model.submit(c) for c in [crops[0], crops[1], poisoned, crops[3], crops[4], crops[5]]]
    for future in bad:
        with pytest.raises(RuntimeError, match="device lost"):
            future.result(timeout=WAIT_S)
    assert model.stats.failed == 6
    good = [model.submit(crops[i]) for i in range(20, 32)]  # two more full batches on the same lane
    np.testing.assert_allclose(_results(good), reference[20:32], atol=1e-5)
    assert model.stats.batches == 2 and model.stats.items == 12 and model.stats.failed == 6
    assert backend.calls == 3


def test_a_batch_that_fails_once_closing_began_is_reported_as_abandoned_not_as_an_error(  # type: ignore[no-untyped-def]
        make_backend, crops, caplog: pytest.LogCaptureFixture) -> None:
    """A group process that ends while its lane still runs a batch (its close ran past its share of the stop) loses
    the GPU's context under that batch: the failure is the stop's, said as such, not a model error in the logs."""
    class LostAtExit(GatedBackend):
        def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
            self.entered.set()
            assert self.gate.wait(WAIT_S), "gate never opened"
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    backend = LostAtExit(make_backend())
    model = BatchedModel(backend, "frames", max_batch=4, max_delay_ms=1.0)
    future = model.submit(crops[0])
    assert backend.entered.wait(WAIT_S)
    closer = threading.Thread(target=model.close, kwargs={"timeout": WAIT_S})
    closer.start()
    while not model._closing.is_set():  # noqa: SLF001 - close() has begun
        time.sleep(0.01)
    backend.gate.set()
    with pytest.raises(RuntimeError, match="INVALID_VALUE"):
        future.result(timeout=WAIT_S)
    closer.join(WAIT_S)
    assert "frames: batch of 1 abandoned while closing: CUDA_ERROR_INVALID_VALUE" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert model.stats.failed == 1


def test_queue_and_compute_time_are_tracked_separately(make_backend, crops, models) -> None:  # type: ignore[no-untyped-def]
    delay_ms = 50.0
    model = BatchedModel(make_backend(), "emotion", max_batch=32, max_delay_ms=delay_ms)
    models.append(model)
    for i in range(3):  # one item at a time: each waits the full max_delay for company that never comes
        model.infer(crops[i], timeout=WAIT_S)
    stats = model.stats
    assert list(stats.batch_sizes) == [1, 1, 1]
    assert stats.queue_s > 0 and stats.compute_s > 0
    # batching delay is queue time, by construction at least max_delay per item, and never counted as compute
    assert all(q >= delay_ms for q in stats.recent_queue_ms), list(stats.recent_queue_ms)
    assert stats.queue_s >= 3 * delay_ms / 1000.0
    assert len(stats.recent_queue_ms) == 3 and len(stats.recent_compute_ms) == 3
    assert stats.queue_s == pytest.approx(sum(stats.recent_queue_ms) / 1000.0)
    assert stats.compute_s == pytest.approx(sum(stats.recent_compute_ms) / 1000.0)
    # queue time per item is counted per item: a batch of 4 adds four queue times but one compute time
    before_q, before_c = len(stats.recent_queue_ms), len(stats.recent_compute_ms)
    futures = [model.submit(c) for c in crops[:4]]
    _results(futures)
    assert sum(stats.batch_sizes) == 7
    grown_q, grown_c = len(stats.recent_queue_ms) - before_q, len(stats.recent_compute_ms) - before_c
    assert grown_q == 4 and grown_c == len(stats.batch_sizes) - 3


def test_a_cancelled_future_does_not_kill_the_lane(make_backend, crops, reference) -> None:  # type: ignore[no-untyped-def]
    backend = GatedBackend(make_backend())
    model = BatchedModel(backend, "emotion", max_batch=1, max_delay_ms=0.0)
    try:
        first = model.submit(crops[0])
        assert backend.entered.wait(WAIT_S)  # the first request is running (held at the gate)
        second = model.submit(crops[1])
        assert second.cancel()  # e.g. a worker gave up waiting for it
        backend.gate.set()
        np.testing.assert_allclose(first.result(timeout=WAIT_S)["probs"], reference[0], atol=1e-5)
        try:
            later = model.submit(crops[2]).result(timeout=WAIT_S)  # milliseconds when healthy
        except FutureTimeout:
            pytest.fail("the lane thread died after a cancelled future; later requests never complete")
        np.testing.assert_allclose(later["probs"], reference[2], atol=1e-5)
    finally:
        model.close(timeout=0.5)


class _PausingQueue(queue.Queue):
    """A request queue whose next put_nowait pauses until released: freezes submit() between its two steps."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.paused = threading.Event()
        self.release = threading.Event()

    def put_nowait(self, item) -> None:  # type: ignore[no-untyped-def]
        self.paused.set()
        assert self.release.wait(WAIT_S)
        super().put_nowait(item)


def test_submit_racing_close_never_leaves_a_future_hanging(make_backend, crops) -> None:  # type: ignore[no-untyped-def]
    model = BatchedModel(make_backend(), "emotion", max_batch=4, max_delay_ms=1.0)
    requests = _PausingQueue(16)
    model._requests = requests  # noqa: SLF001 - the one seam where the interleaving can be forced
    outcome: list[object] = []

    def submitter() -> None:
        try:
            outcome.append(model.submit(crops[0]))
        except ModelClosedError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=submitter)
    thread.start()
    assert requests.paused.wait(WAIT_S)  # submit() passed its closed-check and is about to enqueue
    closer = threading.Thread(target=model.close, kwargs={"timeout": WAIT_S})
    closer.start()
    closer.join(2.0)  # today close() completes here (nothing queued); a fixed submit/close may make it wait
    requests.release.set()
    thread.join(WAIT_S)
    closer.join(WAIT_S)
    assert not closer.is_alive()
    (result,) = outcome
    if isinstance(result, Future):  # accepted: it must still be settled, with a result or ModelClosedError
        try:
            result.result(timeout=WAIT_S)  # immediate when healthy: close() has already returned
        except ModelClosedError:
            pass
        except FutureTimeout:
            pytest.fail("a request accepted during close() never completes")


@pytest.mark.parametrize("step,expected,sizes", [(4, [1, 4, 4, 16, 64, 64, 64], 4),
                                                 (2, [1, 2, 4, 16, 32, 64, 64], 7)])
def test_cuda_batches_pad_to_a_few_fixed_sizes(step: int, expected: list[int], sizes: int) -> None:
    """Each padded size is one ONNX Runtime CUDA session per lane, so sizes must come from a short fixed ladder."""
    from pipeline.inference.gpu.cuda_lane import padded_size

    assert [padded_size(n, step, 64) for n in (1, 2, 3, 9, 17, 33, 64)] == expected
    assert padded_size(100, 4, 80) == 80  # never past max_batch
    assert len({padded_size(n, step, 64) for n in range(1, 65)}) == sizes


@pytest.mark.parametrize("step,cap,smallest,expected", [
    (2, 16, 4, [4, 8, 16]),  # a frame lane's detector at the defaults: 3 sessions, not 5
    (2, 256, 16, [16, 32, 64, 128, 256]),  # its crops: 5, not 9
    (4, 256, 16, [16, 64, 256]),
    (4, 16, 4, [4, 16]),
    (2, 8, 16, [8]),  # a cap below the smallest run: the cap alone
    (2, 64, 1, [1, 2, 4, 8, 16, 32, 64])])
def test_the_smallest_runs_are_padded_up_instead_of_prepared(step: int, cap: int, smallest: int,
                                                             expected: list[int]) -> None:
    """Every prepared size is a CUDA session (GPU memory, and host memory for cuDNN's algorithm choices), so runs of
    a few frames or faces are padded up to `smallest` rather than given sessions of their own; a run still fits its
    size, and no size passes the cap."""
    from pipeline.inference.gpu.cuda_lane import padded_size, padded_sizes, preparation_order

    assert padded_sizes(step, cap, smallest) == expected
    assert preparation_order(step, cap, smallest) == expected[::-1]  # largest first, for the shared arena
    for count in range(1, cap + 1):
        size = padded_size(count, step, cap, smallest)
        assert count <= size <= cap and size in expected


@pytest.mark.parametrize("max_batch,step,cap", [(64, 2, 16), (64, 2, 64), (35, 2, 16), (40, 4, 16), (8, 2, 16),
                                                (24, 4, 12)])
def test_frame_runs_stay_inside_the_frame_buffer(max_batch: int, step: int, cap: int) -> None:
    """inference.max_frames_per_run: a batch runs in parts of at most `cap` frames (FrameEngine), each part staged
    into the lane's buffer of that many rows (CudaFrameLane: min(cap, max_batch)) and detected in one run padded to
    its session's size, which never reads past the buffer's rows."""
    from pipeline.inference.frame_faces import run_slices
    from pipeline.inference.gpu.cuda_lane import padded_size

    rows = min(cap, max_batch)  # the lane's buffer (CudaFrameLane._rows)
    for count in range(1, max_batch + 1):
        parts = run_slices(count, rows)
        assert [i for part in parts for i in range(part.start, part.stop)] == list(range(count))  # each once, in order
        assert all(padded_size(part.stop - part.start, step, rows) <= rows for part in parts)


def test_cuda_arena_sharing_degrades_with_a_warning_without_cuda(caplog: pytest.LogCaptureFixture) -> None:
    """Where ONNX Runtime cannot share a CUDA arena (here: the CPU build), sessions keep their own; nothing fails."""
    import onnxruntime as ort

    from pipeline.inference.onnxruntime import share_cuda_arena

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: sharing is exercised by tests/test_gpu.py")
    with caplog.at_level("WARNING"):
        assert share_cuda_arena(ort) is False
    assert "each keeps its own" in caplog.text


def test_a_batch_is_formed_when_a_lane_frees_up_and_takes_all_that_waited(  # type: ignore[no-untyped-def]
        make_backend, crops, reference, models) -> None:
    """Triton-style: requests that arrive while the only lane is busy are not cut into small batches queued behind
    it; the next batch, formed when the lane frees up, takes all of them."""
    backend = GatedBackend(make_backend())
    model = BatchedModel(backend, "emotion", max_batch=32, max_delay_ms=0.0, lanes=1)
    models.append(model)
    first = model.submit(crops[0])
    assert backend.entered.wait(WAIT_S)  # batch [0] is running (held at the gate)
    waiting = [model.submit(crop) for crop in crops[1:11]]
    time.sleep(0.1)  # requests arriving in two waves: a collector cutting batches early would make two of them
    waiting += [model.submit(crop) for crop in crops[11:21]]
    time.sleep(0.1)
    backend.gate.set()
    np.testing.assert_allclose(first.result(timeout=WAIT_S)["probs"], reference[0], atol=1e-5)
    np.testing.assert_allclose(_results(waiting), reference[1:21], atol=1e-5)
    assert list(model.stats.batch_sizes) == [1, 20]


def test_tasks_on_lanes_from_several_threads_do_not_interleave(make_backend, models) -> None:  # type: ignore[no-untyped-def]
    """on_lanes from several threads at once (a frame size prepared in the background while analyze() prepares
    another): each call's task runs once on every lane. Interleaved, two calls' tasks could each hold some lanes at
    their barriers and wait for the others for good."""
    model = BatchedModel(make_backend(), "emotion", max_batch=8, max_delay_ms=1.0, lanes=3)
    models.append(model)
    ran: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def call(index: int) -> None:
        def task(lane: int) -> None:
            time.sleep(0.005)  # long enough for the other callers' tasks to queue up meanwhile
            with lock:
                ran.append((index, lane))
        try:
            model.on_lanes(task, timeout=WAIT_S)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    _run_threads(call, 6)
    assert not errors, errors
    assert sorted(ran) == [(index, lane) for index in range(6) for lane in range(3)]


def test_cublas_workspace_is_set_for_cuda_sessions_unless_the_operator_set_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """inference.cublas_workspace reaches cuBLAS through its environment variable, before any CUDA session is made;
    a value the daemon was started with is the operator's and stays; "" leaves cuBLAS's default."""
    import pipeline.inference.onnxruntime as ort_backend

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(ort_backend, "_CUBLAS_FROM_OPERATOR", False)
    ort_backend.limit_cublas_workspace("")
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    ort_backend.limit_cublas_workspace(":16:8")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2")
    monkeypatch.setattr(ort_backend, "_CUBLAS_FROM_OPERATOR", True)
    ort_backend.limit_cublas_workspace(":16:8")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:2"


def test_cublas_workspace_and_memory_pattern_are_checked_and_reach_the_session(prepared_models: None) -> None:
    """A malformed workspace is a config error naming the key; memory_pattern is the session's option."""
    import onnxruntime as ort
    from pydantic import ValidationError

    from pipeline.inference.onnxruntime import make_session
    from pipeline.inference.settings import InferenceConfig
    from pipeline.modelprep.manifest import load_manifest

    assert InferenceConfig(cublas_workspace=":4096:2:16:8").cublas_workspace == ":4096:2:16:8"
    with pytest.raises(ValidationError, match="cublas_workspace"):
        InferenceConfig(cublas_workspace="16MB")
    path = load_manifest("retinaface_mnet025").file_for("fp32")
    for pattern in (True, False):
        session = make_session(ort, path, "test", 1, ["CPUExecutionProvider"], memory_pattern=pattern)
        assert session.get_session_options().enable_mem_pattern is pattern
