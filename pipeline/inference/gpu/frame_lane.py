"""One CUDA lane of the frame graphs path: a batch of whole frames in GPU memory, read by both graphs in place.

Per frame format the lane owns one device buffer of `max_frames_per_run` frames (the engine runs a larger batch in
parts of that many: FrameEngine._run_group; 6.2 MB a 1080p row). detect() fills its first rows, on the lane's
stream: device to device from an NVDEC frame (core.types.DeviceImage), host to device from a CPU-decoded one. Both
graphs are bound to that buffer with ONNX Runtime's I/O binding (no numpy copy of a frame anywhere); only the
thresholds, the crop matrices and the frame index of each face go up, and only faces and probabilities come down.

Like CudaLane, each graph has one session per padded size (frames: powers of `step` from SMALLEST_DETECT_RUN up to
`frame_cap`; faces: from SMALLEST_CLASSIFY_RUN up to `face_cap`), because ONNX Runtime's CUDA provider re-plans for
seconds on any new input shape (with or without its memory pattern: 32 cameras served by one session a graph
analysed 178 frames in 8 s, with a session per size 6,669; BENCHMARKS.md, round 21), as its source says: its Conv
keeps one cuDNN frontend plan a node and builds it again whenever the input's dims differ from the last run's
(onnxruntime's core/providers/cuda/nn/conv.cc, UpdateState; no cache by shape). The smallest sizes are not
prepared: every CUDA session costs ~19 MB of GPU and ~75 MB of host memory, most of the latter cuDNN's choice of
convolution algorithms, which each session keeps (BENCHMARKS.md round 14), while a padded run of a few frames or
faces takes the GPU hardly longer than an exact one (the detector network alone, round 4's probe: 2.0 ms for 4
frames against 1.75 for one). One detect() takes at most `frame_cap` frames (inference.max_frames_per_run): the
largest run sets the detector's share of the memory arena (a run of 64 1080p frames holds them as float16 once, 0.8
GB, before the first halving), and the buffer's rows. The classifier graph is always bound to the whole buffer, so
its only varying shape is the face count.

With `captured` (inference.cuda_graphs) each padded size's runs are replayed as CUDA graphs (gpu/captured.py):
the detector as a captured body and a plain tail, the classifier whole; each keeps device buffers for its inputs and
outputs.

The caller (the batcher's runner thread) holds the frames it passed until detect/classify return; both end with
outputs copied to the host, i.e. after the stream has finished reading them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pipeline.core.types import FrameImage
from pipeline.inference.backend import BackendError
from pipeline.inference.gpu.captured import CAPTURE_RUNS, CapturedClassify, CapturedDetect
from pipeline.inference.gpu.cuda import DeviceBuffer, Stream, relax_capture_mode
from pipeline.inference.frame_faces import no_face_rows
from pipeline.inference.gpu.cuda_lane import (
    SMALLEST_CLASSIFY_RUN,
    SMALLEST_DETECT_RUN,
    padded_size,
    preparation_order,
)
from pipeline.modelprep.follow_graphs import SCORE_OUTPUT, TEMPLATE_INPUT
from pipeline.modelprep.frame_graphs import (
    FACE_OUTPUTS,
    FRAME_INDEX_INPUT,
    FRAME_INPUT,
    IOU_THRESHOLD,
    MATRIX_INPUT,
    SCORE_THRESHOLD,
    FrameFormat,
)

log = logging.getLogger(__name__)


class GraphSource(Protocol):
    def detector(self, fmt: FrameFormat) -> bytes: ...

    def classifier(self, fmt: FrameFormat) -> bytes: ...

    def follow(self, role: str, fmt: FrameFormat) -> bytes: ...

    def detector_parts(self, fmt: FrameFormat) -> tuple[bytes, bytes, int]: ...


@dataclass
class _FormatState:
    """A format's batch buffer and its sessions (with their I/O bindings) by padded size."""

    frames: DeviceBuffer
    frame_bytes: int
    detect: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    classify: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    classify_output: str = ""
    captured_detect: dict[int, CapturedDetect] = field(default_factory=dict)
    captured_classify: dict[int, CapturedClassify] = field(default_factory=dict)
    follow: dict[str, Any] = field(default_factory=dict)  # the follow graphs' sessions by role (plain, not captured)

    def close(self) -> None:
        """Drop the sessions and free the buffers (after the lane's stream has drained)."""
        for detect in self.captured_detect.values():
            detect.close()
        for classify in self.captured_classify.values():
            classify.close()
        self.captured_detect.clear()
        self.captured_classify.clear()
        self.follow.clear()
        self.detect.clear()
        self.classify.clear()
        self.frames.close()


class CudaFrameLane:
    """The two frame graphs on one CUDA stream, over one device batch buffer per frame format."""

    def __init__(self, graphs: GraphSource, session_factory: Callable[[bytes, int, bool], Any], max_batch: int,
                 step: int, face_step: int, face_cap: int, what: str, frame_cap: int | None = None,
                 captured: bool = False) -> None:
        """`session_factory(graph, stream handle, captured)` makes one CUDA session on that stream, made for CUDA
        graph capture when `captured`. Frame runs are padded to powers of `step`, face runs to powers of
        `face_step`."""
        self.what = what
        self._captured = captured
        self._graphs = graphs
        self._session_factory = session_factory
        self._step = step
        self._face_step = face_step
        self._face_cap = max(1, face_cap)
        self._frame_cap = max(1, min(frame_cap or max_batch, max_batch))
        self._rows = self._frame_cap  # the buffer's rows: a run pads to at most frame_cap (padded_size's cap)
        self._formats: dict[FrameFormat, _FormatState] = {}
        self._lock = threading.Lock()
        self._stream: Stream | None = Stream(what)

    def _live_stream(self) -> Stream:
        if self._stream is None:
            raise BackendError(f"{self.what} is closed")
        return self._stream

    def _state(self, fmt: FrameFormat) -> _FormatState:
        state = self._formats.get(fmt)
        if state is None:
            frame_bytes = fmt.width * fmt.height * 3
            buffer = DeviceBuffer(f"{self.what} frames {fmt.width}x{fmt.height}", frame_bytes * self._rows)
            state = self._formats[fmt] = _FormatState(buffer, frame_bytes)
        return state

    def _detect_session(self, fmt: FrameFormat, state: _FormatState, bucket: int) -> tuple[Any, Any]:
        entry = state.detect.get(bucket)
        if entry is None:
            session = self._session_factory(self._graphs.detector(fmt), self._live_stream().handle, False)
            entry = state.detect[bucket] = (session, session.io_binding())
        return entry

    def _classify_session(self, fmt: FrameFormat, state: _FormatState, bucket: int) -> tuple[Any, Any]:
        entry = state.classify.get(bucket)
        if entry is None:
            session = self._session_factory(self._graphs.classifier(fmt), self._live_stream().handle, False)
            state.classify_output = session.get_outputs()[0].name
            entry = state.classify[bucket] = (session, session.io_binding())
        return entry

    def _captured_detect(self, fmt: FrameFormat, state: _FormatState, bucket: int) -> CapturedDetect:
        runner = state.captured_detect.get(bucket)
        if runner is None:
            body, tail, candidates = self._graphs.detector_parts(fmt)
            handle = self._live_stream().handle
            captured, plain = self._session_factory(body, handle, True), self._session_factory(tail, handle, False)
            runner = CapturedDetect(captured, plain, state.frames.ptr, bucket, fmt, candidates, self.what)
            state.captured_detect[bucket] = runner
        return runner

    def _captured_classify(self, fmt: FrameFormat, state: _FormatState, bucket: int) -> CapturedClassify:
        runner = state.captured_classify.get(bucket)
        if runner is None:
            session = self._session_factory(self._graphs.classifier(fmt), self._live_stream().handle, True)
            runner = state.captured_classify[bucket] = CapturedClassify(session, state.frames.ptr, self._rows, bucket,
                                                                        fmt, self.what)
        return runner

    def prepare(self, fmt: FrameFormat) -> None:
        """Create and run every session of this format (zeros in, results dropped): once, or, captured, as often as
        ONNX Runtime needs to record the graph, so no camera's frame waits for a capture. Largest runs first
        (cuda_lane.preparation_order: the smaller ones then fit in the shared arena's regions)."""
        with self._lock:
            state = self._state(fmt)
        zeros = np.zeros((fmt.height, fmt.width, 3), np.uint8)
        thresholds = {SCORE_THRESHOLD: np.array([0.5], np.float32), IOU_THRESHOLD: np.array([0.4], np.float32)}
        runs = CAPTURE_RUNS if self._captured else 1
        for bucket in preparation_order(self._step, self._frame_cap, SMALLEST_DETECT_RUN):
            for _ in range(runs):
                self.detect([zeros] * bucket, fmt, thresholds)
        for bucket in preparation_order(self._face_step, self._face_cap, SMALLEST_CLASSIFY_RUN):
            matrices = np.tile(np.array([[1, 0, 0], [0, 1, 0]], np.float32), (bucket, 1, 1))
            for _ in range(runs):
                self.classify(fmt, matrices, np.zeros(bucket, np.int64))
        log.info("%s: %dx%d %s ready (%d + %d sizes%s)", self.what, fmt.width, fmt.height, fmt.order,
                 len(state.detect) + len(state.captured_detect), len(state.classify) + len(state.captured_classify),
                 ", captured as CUDA graphs" if self._captured else "")

    def detect(self, items: Sequence[FrameImage], fmt: FrameFormat, thresholds: dict[str, np.ndarray],
               rows: int | None = None) -> dict[str, np.ndarray]:
        """Every frame (at most `frame_cap`: the engine runs a batch in parts) into the buffer; the detector graph on
        the first `rows` (all when None), in one padded run."""
        if len(items) > self._frame_cap:
            raise BackendError(f"{self.what}: {len(items)} frames exceed the lane's {self._frame_cap} a run "
                               f"(inference.max_frames_per_run)")
        count = len(items) if rows is None else rows
        if self._captured:
            relax_capture_mode()
        with self._lock:
            stream = self._live_stream()
            state = self._state(fmt)
            self._stage(stream, state, items)
            if count == 0:  # frames without detection only: the copies stay queued before classify's run
                return no_face_rows()
            return self._detect_run(fmt, state, count, thresholds)

    def _detect_run(self, fmt: FrameFormat, state: _FormatState, count: int,
                    thresholds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The detector graph on the buffer's first `count` rows (padded: the rows after them are read and their
        results dropped); on the lane's stream, after the copies; returns with the outputs on the host."""
        bucket = padded_size(count, self._step, self._frame_cap, SMALLEST_DETECT_RUN)
        if self._captured:
            values = self._captured_detect(fmt, state, bucket).run(thresholds)
            return {name: value[:count] for name, value in zip(FACE_OUTPUTS, values)}
        session, binding = self._detect_session(fmt, state, bucket)
        binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, [bucket, fmt.height, fmt.width, 3], state.frames.ptr)
        for name, value in thresholds.items():
            binding.bind_cpu_input(name, value)
        binding.clear_binding_outputs()
        for name in FACE_OUTPUTS:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        values = binding.copy_outputs_to_cpu()
        return {name: value[:count] for name, value in zip(FACE_OUTPUTS, values)}

    def _stage(self, stream: Stream, state: _FormatState, items: Sequence[FrameImage]) -> None:
        """Queue each frame's copy into its row of the batch buffer: GPU frames in one GIL-holding call
        (Stream.copy_within_many), host frames one by one (their copies take long enough to release the GIL for)."""
        on_device: list[tuple[int, int]] = []
        for row, item in enumerate(items):
            dst = state.frames.ptr + row * state.frame_bytes
            if isinstance(item, np.ndarray):
                stream.copy_host_to(dst, np.ascontiguousarray(item), f"{self.what}: frame {row} to the GPU")
            else:
                on_device.append((dst, item.ptr))
        if on_device:
            stream.copy_within_many(on_device, state.frame_bytes, f"{self.what}: frames into the batch")

    def classify(self, fmt: FrameFormat, matrices: np.ndarray, frame_index: np.ndarray) -> np.ndarray:
        count = len(matrices)
        bucket = padded_size(count, self._face_step, self._face_cap, SMALLEST_CLASSIFY_RUN)
        if count > bucket:
            raise BackendError(f"{self.what}: {count} faces exceed the lane's face capacity {self._face_cap}")
        padded_matrices = np.zeros((bucket, 2, 3), np.float32)
        padded_matrices[:count] = matrices
        padded_index = np.zeros(bucket, np.int64)
        padded_index[:count] = frame_index
        if self._captured:
            relax_capture_mode()
        with self._lock:
            stream = self._live_stream()
            state = self._state(fmt)
            if self._captured:
                return self._captured_classify(fmt, state, bucket).run(stream, padded_matrices, padded_index)[:count]
            session, binding = self._classify_session(fmt, state, bucket)
            binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, [self._rows, fmt.height, fmt.width, 3],
                               state.frames.ptr)
            binding.bind_cpu_input(MATRIX_INPUT, padded_matrices)
            binding.bind_cpu_input(FRAME_INDEX_INPUT, padded_index)
            binding.clear_binding_outputs()
            binding.bind_output(state.classify_output, "cpu")
            session.run_with_iobinding(binding)
            probs = binding.copy_outputs_to_cpu()[0]
        return np.asarray(probs[:count])

    def follow(self, fmt: FrameFormat, role: str, matrices: np.ndarray, frame_index: np.ndarray,
               templates: np.ndarray | None) -> np.ndarray:
        """A follow graph (inference.batch_search) over the whole buffer, after the staged copies on this stream:
        its face count varies (padded to powers of two by the caller), so one plain session a role and format."""
        if self._captured:
            relax_capture_mode()
        with self._lock:
            stream = self._live_stream()
            state = self._state(fmt)
            session = state.follow.get(role)
            if session is None:
                session = state.follow[role] = self._session_factory(self._graphs.follow(role, fmt), stream.handle,
                                                                     False)
            binding = session.io_binding()
            binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, [self._rows, fmt.height, fmt.width, 3],
                               state.frames.ptr)
            binding.bind_cpu_input(MATRIX_INPUT, np.ascontiguousarray(matrices, np.float32))
            binding.bind_cpu_input(FRAME_INDEX_INPUT, np.ascontiguousarray(frame_index, np.int64))
            if templates is not None:
                binding.bind_cpu_input(TEMPLATE_INPUT, np.ascontiguousarray(templates, np.float32))
            binding.bind_output(TEMPLATE_INPUT if templates is None else SCORE_OUTPUT, "cpu")
            session.run_with_iobinding(binding)
            return np.asarray(binding.copy_outputs_to_cpu()[0])

    def close(self) -> None:
        """Drain the stream, then drop the sessions (they run on it), free the buffers and destroy the stream."""
        with self._lock:
            stream, self._stream = self._stream, None
            if stream is None:
                return
            try:
                stream.synchronize()
                states, self._formats = list(self._formats.values()), {}
                for state in states:
                    state.close()
            finally:
                stream.close()
