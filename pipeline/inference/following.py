"""Following faces by their look with the follow graphs (modelprep.follow_graphs): the search run where the frame
is, one session run per frame, only the score maps (~4 KB a face) brought down and every face's peak found at once.

Status: measured, not used by the daemon. The idea was to take look-following of GPU frames off the camera workers'
Python (vision.follow.HostFollower copies each face's window down and matches it in OpenCV). On an H100 a run costs a
worker ~0.85 ms of CPU whatever the face count (ONNX Runtime launching the graph's ~80 small kernels), so it only
pays from ~5 faces a frame (16 faces: 1.5 against 4.3 ms); and every camera's synchronous run waits behind the busy
lanes: at 150 cameras 50 % of frames against the host way's 81 %, p99 99 ms at 16 cameras, +0.6 GB of GPU memory a
group (BENCHMARKS.md, "Faces on GPU frames searched on the GPU"). What remains is to run the search inside the lanes'
batches (one run for every followed face of a batch, before its crops are read), with these graphs.

Kept because the search itself is verified (the scores are cv2.matchTemplate's to 1e-4, tests/test_frame_graphs.py)
and measured: `bench interval --follower graph` runs it on the CPU (the crowd's boxes 90.8 % within IoU 0.8 of the
detection, against 90.1 % with OpenCV), `deploy/follow_probe.py` and tests/test_nvdec.py on NVDEC frames. Host frames
are followed on the host unless the follower runs on the CPU (`host_frames`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipeline.core.types import FrameImage
from pipeline.inference.batch_search import Run, cut_templates, search_boxes
from pipeline.inference.batching import ModelClosedError
from pipeline.inference.frames import frame_format
from pipeline.inference.settings import InferenceConfig
from pipeline.modelprep.follow_graphs import FOLLOW_GRAPHS, SCORE_OUTPUT, TEMPLATE_INPUT, FollowGeometry
from pipeline.modelprep.frame_graphs import FRAME_INDEX_INPUT, FRAME_INPUT, MATRIX_INPUT, FrameFormat
from pipeline.vision.follow import HOST_FOLLOWER, Box, FaceTemplate, templates_from


class GraphFollower:
    """A vision.follow.Follower that searches GPU frames on the GPU (see the module docstring): the batch search's
    functions (inference.batch_search) over one frame at a time.

    `session_factory(graph bytes)` makes one session; `prepare_thread`, when given, is called before each run on a
    GPU frame (CUDA: relax the thread's capture mode beside inference.cuda_graphs recordings; it acts once a
    thread); `on_close` after the sessions are dropped (CUDA: their stream is drained and destroyed)."""

    searches_device_frames = True

    def __init__(self, session_factory: Callable[[bytes], Any], host_frames: bool = False,
                 geometry: FollowGeometry = FollowGeometry(), prepare_thread: Callable[[], None] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self._factory = session_factory
        self._on_close = on_close
        self._host_frames = host_frames
        self.geometry = geometry
        self._prepare_thread = prepare_thread
        self._sessions: dict[tuple[FrameFormat, str], Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    def templates(self, frame: FrameImage, boxes: Sequence[Box]) -> list[FaceTemplate | None]:
        """Each box's grey template at the geometry's fixed size (None for a box under vision.follow.MIN_FACE_PX)."""
        if self._on_host(frame):
            return HOST_FOLLOWER.templates(frame, boxes)
        if not boxes:
            return []
        cut = cut_templates(self._runner(frame), np.asarray(boxes, np.float64), np.zeros(len(boxes), np.int64),
                            self.geometry)
        return templates_from(cut, boxes)

    def locate(self, frame: FrameImage, wanted: Sequence[tuple[FaceTemplate, Box]]) -> list[Box | None]:
        """Where each template's face is: the best correlation within its search window (centred on the expected
        box), None where it is below vision.follow.MIN_SCORE or the template was not made by this follower."""
        if self._on_host(frame):
            return HOST_FOLLOWER.locate(frame, wanted)
        ours = [i for i, (template, _) in enumerate(wanted) if self.geometry.fits(template.pixels)]
        places = search_boxes(self._runner(frame), [wanted[i] for i in ours], np.zeros(len(ours), np.int64),
                              self.geometry)
        found: list[Box | None] = [None] * len(wanted)
        for i, place in zip(ours, places):
            found[i] = place
        return found

    def _on_host(self, frame: FrameImage) -> bool:
        return isinstance(frame, np.ndarray) and not self._host_frames

    def _runner(self, frame: FrameImage) -> Run:
        """The batch search's `Run` over this one frame (row 0 of a batch of one)."""
        fmt = frame_format(frame)

        def run(role: str, matrices: np.ndarray, index: np.ndarray, templates: np.ndarray | None) -> np.ndarray:
            session = self._session(fmt, role)
            output = TEMPLATE_INPUT if templates is None else SCORE_OUTPUT
            feeds = {MATRIX_INPUT: matrices, FRAME_INDEX_INPUT: index}
            if templates is not None:
                feeds[TEMPLATE_INPUT] = templates
            if isinstance(frame, np.ndarray):
                return np.asarray(session.run([output], {FRAME_INPUT: frame[None], **feeds})[0])
            return self._run_bound(session, frame, feeds, output)
        return run

    def _run_bound(self, session: Any, frame: Any, feeds: dict[str, np.ndarray], output: str) -> np.ndarray:
        """A GPU frame bound in place (no copy of it anywhere); the small inputs go up, the scores come down."""
        if self._prepare_thread is not None:
            self._prepare_thread()
        binding = session.io_binding()
        height, width, _ = frame.shape
        binding.bind_input(FRAME_INPUT, "cuda", 0, np.uint8, [1, height, width, 3], frame.ptr)
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        binding.bind_output(output, "cpu")
        session.run_with_iobinding(binding)
        return np.asarray(binding.copy_outputs_to_cpu()[0])

    def _session(self, fmt: FrameFormat, role: str) -> Any:
        key = (fmt, role)
        session = self._sessions.get(key)
        if session is not None:
            return session
        with self._lock:
            if self._closed:
                raise ModelClosedError("the follow graphs are closed")
            if key not in self._sessions:
                self._sessions[key] = self._factory(FOLLOW_GRAPHS[role](fmt, self.geometry).SerializeToString())
            return self._sessions[key]

    def close(self) -> None:
        """Drop the sessions; a later run refuses."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._sessions.clear()
        if self._on_close is not None:
            self._on_close()


def cpu_graph_follower(threads: int = 1, supersample: int | None = None) -> GraphFollower:
    """The follow graphs on ONNX Runtime's CPU provider, host frames included: what GPU frames get, measurable
    here (`bench interval --follower graph [--supersample K]`, the tests)."""
    from pipeline.inference.onnxruntime import import_ort, make_session

    ort = import_ort()
    geometry = FollowGeometry() if supersample is None else FollowGeometry(supersample=supersample)
    return GraphFollower(lambda graph: make_session(ort, graph, "follow graph", threads, ["CPUExecutionProvider"]),
                         host_frames=True, geometry=geometry)


def cuda_graph_follower(ort: Any, inference: InferenceConfig, threads: int = 1,
                        shared_arena: bool = False) -> GraphFollower:
    """The follow graphs on the GPU, on a stream of their own, with the frame graphs' provider options; their
    sessions are made when a camera first follows faces by their look."""
    from pipeline.inference.gpu.cuda import Stream, relax_capture_mode
    from pipeline.inference.onnxruntime import cuda_provider_options, make_session

    stream = Stream("follow graphs")

    def cuda_session(graph: bytes) -> Any:
        # full float32 in the correlation (no TF32): its few products cost the GPU nothing either way
        options = {**cuda_provider_options(stream.handle, inference.cudnn_max_workspace), "use_tf32": "0"}
        return make_session(ort, graph, "follow graph", threads, [("CUDAExecutionProvider", options)],
                            shared_arena, inference.memory_pattern)
    return GraphFollower(cuda_session, prepare_thread=relax_capture_mode, on_close=stream.close)
