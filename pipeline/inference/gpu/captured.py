"""Frame graph runs replayed as CUDA graphs (`inference.cuda_graphs`), for a CudaFrameLane.

Why: a lane's CPU is ONNX Runtime launching every node's kernels, run after run (BENCHMARKS.md round 8: 82 % of a
lane's samples in `run_with_iobinding`; the detector graph has a few hundred nodes). A session made with ONNX
Runtime's `enable_cuda_graph` records its run once and then replays it with one launch, on two conditions: every
input and output is bound to device memory at addresses that never change, and no node's output size depends on the
data. So each captured run here owns device buffers for its inputs and outputs (the host's values are copied into
them on the lane's stream before the replay, the results copied back after it), and the detector graph is captured
in two parts (modelprep.frame_graphs.detector_graph_parts): the body, whose shapes are fixed for a batch size, is
replayed; the tail (decode + NonMaxSuppression, whose output size depends on the data) runs node by node as before,
reading the body's outputs where they are. A captured session keeps a memory arena of its own
(onnxruntime.captured_provider_options): a replay writes its activations where the recorded run put them.

A run of each padded size has sessions of its own anyway (cuda_lane.py: ONNX Runtime re-plans on every new shape),
so a captured graph only ever sees the shapes it was captured with.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.inference.backend import ONNX_NUMPY_TYPES, BackendError
from pipeline.inference.gpu.cuda import DeviceBuffer, Stream
from pipeline.modelprep.frame_graphs import (
    DETECTOR_OUTPUTS,
    FACE_OUTPUTS,
    FRAME_INDEX_INPUT,
    FRAME_INPUT,
    MATRIX_INPUT,
    FrameFormat,
)

CAPTURE_RUNS = 2  # runs that prepare() makes of a captured size: ONNX Runtime records on a session's 2nd run


def _numpy_type(arg: Any) -> np.dtype[Any]:
    dtype = ONNX_NUMPY_TYPES.get(arg.type)
    if dtype is None:
        raise BackendError(f"captured frame graph: output {arg.name} has type {arg.type}, which no buffer here holds")
    return dtype


def _frames_shape(rows: int, fmt: FrameFormat) -> list[int]:
    return [rows, fmt.height, fmt.width, 3]


class _Buffers:
    """Device buffers of fixed shape and type, closed together."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._buffers: list[DeviceBuffer] = []

    def new(self, name: str, shape: list[int], dtype: np.dtype[Any]) -> DeviceBuffer:
        buffer = DeviceBuffer(f"{self.what} {name}", math.prod(shape) * dtype.itemsize)
        self._buffers.append(buffer)
        return buffer

    def close(self) -> None:
        buffers, self._buffers = self._buffers, []
        for buffer in buffers:
            buffer.close()


class CapturedDetect:
    """The detector graph for one padded size: the body replayed over the first `bucket` rows of the lane's frame
    buffer into buffers of its own, the tail run on them with the thresholds."""

    def __init__(self, body: Any, tail: Any, frames_ptr: int, bucket: int, fmt: FrameFormat, candidates: int,
                 what: str) -> None:
        self._body, self._tail = body, tail
        self._buffers = _Buffers(f"{what} detector ({bucket} frames)")
        self._body_binding = body.io_binding()
        self._body_binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, _frames_shape(bucket, fmt), frames_ptr)
        self._tail_binding = tail.io_binding()
        outputs = {arg.name: arg for arg in body.get_outputs()}
        try:
            for name in DETECTOR_OUTPUTS:
                shape = [bucket, *outputs[name].shape[1:]]  # [B, K, ...]: fixed by detector_graph_parts
                if not all(isinstance(dim, int) for dim in shape) or shape[1] != candidates:
                    raise BackendError(f"{what}: the detector body's output {name} is {outputs[name].shape}, not "
                                       f"[batch, {candidates}, fixed sizes]: rebuild it with detector_graph_parts")
                dtype = _numpy_type(outputs[name])
                buffer = self._buffers.new(name, shape, dtype)
                self._body_binding.bind_output(name, "cuda", 0, dtype, shape, buffer.ptr)
                self._tail_binding.bind_input(name, "cuda", 0, dtype, shape, buffer.ptr)
        except BaseException:
            self._buffers.close()
            raise

    def run(self, thresholds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The faces of the bucket's rows, on the host (the lane has queued the frames' copies on its stream)."""
        self._body.run_with_iobinding(self._body_binding)
        for name, value in thresholds.items():
            self._tail_binding.bind_cpu_input(name, value)
        self._tail_binding.clear_binding_outputs()
        for name in FACE_OUTPUTS:
            self._tail_binding.bind_output(name, "cpu")
        self._tail.run_with_iobinding(self._tail_binding)
        return list(self._tail_binding.copy_outputs_to_cpu())

    def close(self) -> None:
        self._buffers.close()


class CapturedClassify:
    """The crop + emotion graph for one padded face count, replayed over the lane's whole frame buffer: the crop
    matrices and frame indices are copied into its input buffers first, the probabilities out of its output after."""

    def __init__(self, session: Any, frames_ptr: int, rows: int, bucket: int, fmt: FrameFormat, what: str) -> None:
        self._session = session
        self._buffers = _Buffers(f"{what} classifier ({bucket} faces)")
        output = session.get_outputs()[0]
        classes = output.shape[1]
        if not isinstance(classes, int):
            raise BackendError(f"{what}: the classifier's output {output.name} has no fixed class count ({classes})")
        self._probs = np.empty((bucket, classes), _numpy_type(output))
        self._binding = session.io_binding()
        try:
            self._matrices = self._buffers.new(MATRIX_INPUT, [bucket, 2, 3], np.dtype(np.float32))
            self._index = self._buffers.new(FRAME_INDEX_INPUT, [bucket], np.dtype(np.int64))
            self._out = self._buffers.new(output.name, list(self._probs.shape), self._probs.dtype)
        except BaseException:
            self._buffers.close()
            raise
        self._binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, _frames_shape(rows, fmt), frames_ptr)
        self._binding.bind_input(MATRIX_INPUT, "cuda", 0, np.float32, [bucket, 2, 3], self._matrices.ptr)
        self._binding.bind_input(FRAME_INDEX_INPUT, "cuda", 0, np.int64, [bucket], self._index.ptr)
        self._binding.bind_output(output.name, "cuda", 0, self._probs.dtype, list(self._probs.shape), self._out.ptr)

    def run(self, stream: Stream, matrices: np.ndarray, frame_index: np.ndarray) -> np.ndarray:
        """Probabilities of `bucket` faces (padded `matrices` [bucket, 2, 3] float32, `frame_index` [bucket] int64),
        a copy on the host."""
        stream.copy_in(self._matrices, np.ascontiguousarray(matrices, np.float32))
        stream.copy_in(self._index, np.ascontiguousarray(frame_index, np.int64))
        self._session.run_with_iobinding(self._binding)
        stream.copy_out(self._probs, self._out)
        stream.synchronize()
        return self._probs.copy()

    def close(self) -> None:
        self._buffers.close()
