"""The frame graphs path (`inference.frame_path: graph`): whole frames in, faces and emotions out, in two graph runs.

Why: on the GPU machine the host was the limit (issue 11): every frame was letterboxed by OpenCV, copied to the GPU,
its candidates decoded and NMS-ed in numpy, and every face cut by OpenCV and copied up again. Here a batch of frames
from all cameras goes through two ONNX graphs built around the prepared models (modelprep/frame_graphs.py):

  1. detector graph: frames (uint8, camera size, as decoded) → letterbox → RetinaFace → decode + NMS → the best faces
     of each frame (boxes, landmarks, scores; a few KB);
  2. classifier graph: the *same* frames + one inverse affine per face → bilinear crops → the emotion model →
     probabilities.

Between the two, the host does what needs no pixels: the min-size and max-faces filter and each face's crop matrix
(box or five-point alignment, vision.align's one definition). That is why there are two graphs and not one fused:
alignment's similarity fit (an SVD per face) and the size filter are cheap on the host and awkward in a graph, and the
round trip carries only boxes. On cuda (gpu/frame_lane.py) the frames are copied once into the lane's batch buffer
on the GPU (device to device from NVDEC, or host to device for a CPU-decoded camera) and read there by both graphs;
on the CPU (HostFrameLane below) the same graphs run on host arrays, which is how CI tests this path.

With `tracking.follow_by: look` on cuda the lanes also find the followed faces by their look between staging and
cropping, and cut the detected faces' templates (inference.batch_search, the follow graphs of
modelprep/follow_graphs.py): the workers send their tracks' templates with the frame and get the results back.

Items of one batch may come from cameras of different sizes or channel orders: they are grouped by FrameFormat, and
each format has its own graphs (shapes are static, so each graph is planned once), built when first met.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, TypeVar

import numpy as np
import onnx

from pipeline.core.types import Detection, FrameImage
from pipeline.inference.backend import BackendError
from pipeline.inference.batch_search import cut_templates, search_faces
from pipeline.inference.batching import BatchedModel
from pipeline.inference.classifier import followed_read, normalised
from pipeline.inference.format_gate import FormatGate
from pipeline.inference.frame_faces import (
    FrameResult,
    KeptFaces,
    given_faces,
    joined,
    kept_faces,
    no_face_rows,
    run_slices,
)
from pipeline.inference.pending import Analysis, PendingAnalysis
from pipeline.inference.settings import DetectorConfig, EmotionConfig, InferenceConfig
from pipeline.modelprep.frame_graphs import (
    FACE_BOX,
    FACE_LANDMARKS,
    FACE_OUTPUTS,
    FACE_SCORE,
    FRAME_INDEX_INPUT,
    FRAME_INPUT,
    IOU_THRESHOLD,
    MATRIX_INPUT,
    SCORE_THRESHOLD,
    FrameFormat,
    crop_classify_graph,
    detector_frame_graph,
    detector_graph_parts,
)
from pipeline.modelprep.follow_graphs import FOLLOW_GRAPHS, SCORE_OUTPUT, TEMPLATE_INPUT, FollowGeometry
from pipeline.modelprep.manifest import ModelManifest
from pipeline.vision.align import align_matrix, box_crop_matrices, inverse_affine
from pipeline.vision.follow import FaceTemplate

log = logging.getLogger(__name__)
_Built = TypeVar("_Built")

GRAPH_FACES = 64  # faces per frame the detector graph returns at most (best scores after NMS), before max_faces
# Crop matrices made per numpy call on the lane's thread: 64 faces x 6 are loops of 384 elements, which numpy runs
# holding the GIL (it gives it away in loops of more than 500; classifier.ROWS_PER_CALL says why that matters).
FACES_PER_CALL = 64
FOLLOW_GEOMETRY = FollowGeometry()  # the follow graphs' template and search sizes (modelprep.follow_graphs)


@dataclass(frozen=True)
class TrackedFrame:
    """A frame that skips the detector (detector.interval): its faces are where the camera's tracker expects them,
    and only the classifier graph reads it."""

    image: FrameImage
    faces: list[Detection]
    turn: int = 0  # the camera's frames without detection before this one (emotion.flip_followed: alternate)
    templates: list[FaceTemplate | None] | None = None  # each face's look, to be found by it (search in batches)


@dataclass(frozen=True)
class LookedFrame:
    """A frame to detect on whose faces' templates the camera's tracker wants (search in batches)."""

    image: FrameImage


Item = FrameImage | TrackedFrame | LookedFrame


def frame_image(item: Item) -> FrameImage:
    return item.image if isinstance(item, (TrackedFrame, LookedFrame)) else item


def frame_format(item: Item) -> FrameFormat:
    """A frame's size and channel order: host frames are BGR (OpenCV), device frames say their own."""
    image = frame_image(item)
    height, width = image.shape[:2]
    order = "bgr" if isinstance(image, np.ndarray) else image.order
    return FrameFormat(int(width), int(height), order)


class FrameLane(Protocol):
    """Runs the two graphs of one lane; detect() keeps the batch's frames for the classify() that follows.

    detect() takes every frame of the batch and runs the detector graph on the first `rows` only (all when None):
    the batch's other frames are frames without detection (detector.interval), whose faces come from their cameras'
    trackers and which only the classifier graph reads."""

    def prepare(self, fmt: FrameFormat) -> None: ...

    def detect(self, items: Sequence[FrameImage], fmt: FrameFormat, thresholds: dict[str, np.ndarray],
               rows: int | None = None) -> dict[str, np.ndarray]: ...

    def classify(self, fmt: FrameFormat, matrices: np.ndarray, frame_index: np.ndarray) -> np.ndarray: ...

    def follow(self, fmt: FrameFormat, role: str, matrices: np.ndarray, frame_index: np.ndarray,
               templates: np.ndarray | None) -> np.ndarray:
        """A follow graph (batch_search: "templates" or "match") over the frames detect() staged."""
        ...

    def close(self) -> None: ...


class FrameGraphs:
    """Both graphs for each frame format, built once from the prepared models and shared (serialised) by the lanes."""

    def __init__(self, detector_path: Path, classifier_path: Path, detector: DetectorConfig,
                 classifier: ModelManifest, on_gpu: bool = False) -> None:
        if classifier.input.size is None:
            raise BackendError(f"emotion model {classifier.name}: manifest input.size is required")
        self._detector_model = onnx.load(str(detector_path))
        self._classifier_model = onnx.load(str(classifier_path))
        self._detector_cfg = detector  # the input size per frame format: fixed, or auto (DetectorConfig.input_for)
        self._crop_size = classifier.input.size
        self._colour = classifier.input.color
        self._max_faces = max(GRAPH_FACES, detector.max_faces)
        # The GPU's letterbox: the full-resolution pass in float16 and the first halving as a strided Conv (both
        # exact; 4.9 -> 3.6 ms per 32 1080p frames on the H200). ONNX Runtime's CPU provider has no float16
        # AveragePool and runs that Conv slower than Transpose + AveragePool, so the CPU keeps the plain version.
        self._on_gpu = on_gpu
        self._built: dict[tuple[str, FrameFormat], Any] = {}  # by (what, format): serialised graphs
        self._lock = threading.Lock()

    def detector(self, fmt: FrameFormat) -> bytes:
        return self._get("detector graph", fmt, lambda: detector_frame_graph(
            self._detector_model, fmt, self._detector_cfg.input_for((fmt.width, fmt.height)), self._max_faces,
            halve_in_fp16=self._on_gpu, conv_halving=self._on_gpu).SerializeToString())

    def classifier(self, fmt: FrameFormat) -> bytes:
        return self._get("classifier graph", fmt, lambda: crop_classify_graph(
            self._classifier_model, fmt, self._crop_size, self._colour).SerializeToString())

    def follow(self, role: str, fmt: FrameFormat) -> bytes:
        """A follow graph (modelprep.follow_graphs: "templates" or "match") for this format, at FOLLOW_GEOMETRY."""
        build = FOLLOW_GRAPHS[role]
        return self._get(f"follow {role} graph", fmt, lambda: build(fmt, FOLLOW_GEOMETRY).SerializeToString())

    def detector_parts(self, fmt: FrameFormat) -> tuple[bytes, bytes, int]:
        """The detector graph in two parts (body, tail) and K, its candidates per frame, for CUDA graph capture
        (gpu/captured.py)."""
        def build() -> tuple[bytes, bytes, int]:
            parts = detector_graph_parts(self._detector_model, fmt,
                                         self._detector_cfg.input_for((fmt.width, fmt.height)), self._max_faces,
                                         halve_in_fp16=self._on_gpu, conv_halving=self._on_gpu)
            return parts.body.SerializeToString(), parts.tail.SerializeToString(), parts.candidates
        return self._get("detector body and tail", fmt, build)

    def _get(self, role: str, fmt: FrameFormat, build: Callable[[], _Built]) -> _Built:
        with self._lock:  # lanes meeting a new format at once build it once
            found = self._built.get((role, fmt))
            if found is None:
                started = time.monotonic()
                found = self._built[(role, fmt)] = build()
                log.info("frame graphs: %s for %dx%d %s built in %.1f s", role, fmt.width, fmt.height,
                         fmt.order, time.monotonic() - started)
            return found


class HostFrameLane:
    """The frame graphs on ONNX Runtime's CPU provider: host frames only (a GPU frame is refused)."""

    def __init__(self, graphs: FrameGraphs, session_factory: Callable[[bytes], Any], frame_cap: int = 1024) -> None:
        self._graphs = graphs
        self._session_factory = session_factory
        self._frame_cap = frame_cap  # inference.max_frames_per_run, as on cuda
        self._sessions: dict[tuple[str, FrameFormat], Any] = {}
        self._frames: np.ndarray | None = None

    def prepare(self, fmt: FrameFormat) -> None:
        self._session("detector", fmt)
        self._session("classifier", fmt)

    def _session(self, role: str, fmt: FrameFormat) -> Any:
        session = self._sessions.get((role, fmt))
        if session is None:
            own = {"detector": self._graphs.detector, "classifier": self._graphs.classifier}.get(role)
            graph = own(fmt) if own is not None else self._graphs.follow(role, fmt)
            session = self._sessions[(role, fmt)] = self._session_factory(graph)
        return session

    def detect(self, items: Sequence[FrameImage], fmt: FrameFormat, thresholds: dict[str, np.ndarray],
               rows: int | None = None) -> dict[str, np.ndarray]:
        """The part's frames (at most `frame_cap`: FrameEngine runs a batch in parts) stacked for classify(); the
        detector graph on the first `rows` (all when None) in one run."""
        if not all(isinstance(item, np.ndarray) for item in items):
            raise BackendError("frame graphs on the CPU take host frames; a GPU frame needs inference.device cuda")
        if len(items) > self._frame_cap:
            raise BackendError(f"frame graphs lane: {len(items)} frames exceed its {self._frame_cap} a run "
                               f"(inference.max_frames_per_run)")
        self._frames = np.stack(items)  # type: ignore[arg-type]
        rows = len(items) if rows is None else rows
        if rows == 0:
            return no_face_rows()
        outputs = self._session("detector", fmt).run(list(FACE_OUTPUTS),
                                                      {FRAME_INPUT: self._frames[:rows], **thresholds})
        return dict(zip(FACE_OUTPUTS, outputs))

    def classify(self, fmt: FrameFormat, matrices: np.ndarray, frame_index: np.ndarray) -> np.ndarray:
        if self._frames is None:
            raise BackendError("classify() before detect()")
        session = self._session("classifier", fmt)
        output = session.get_outputs()[0].name
        feeds = {FRAME_INPUT: self._frames, MATRIX_INPUT: matrices, FRAME_INDEX_INPUT: frame_index}
        return np.asarray(session.run([output], feeds)[0])

    def follow(self, fmt: FrameFormat, role: str, matrices: np.ndarray, frame_index: np.ndarray,
               templates: np.ndarray | None) -> np.ndarray:
        if self._frames is None:
            raise BackendError("follow() before detect()")
        feeds = {FRAME_INPUT: self._frames, MATRIX_INPUT: matrices, FRAME_INDEX_INPUT: frame_index}
        if templates is not None:
            feeds[TEMPLATE_INPUT] = templates
        output = TEMPLATE_INPUT if templates is None else SCORE_OUTPUT
        return np.asarray(self._session(role, fmt).run([output], feeds)[0])

    def close(self) -> None:
        self._sessions.clear()
        self._frames = None


def mirrored(inverse: np.ndarray, width: int) -> np.ndarray:
    """Inverse crop affines [F, 2, 3] whose crops are the mirror images of `inverse`'s: output column x samples
    where column width-1-x did, exactly as crop[:, ::-1] (the OpenCV path's flip)."""
    out = inverse.copy()
    out[:, :, 0] = -inverse[:, :, 0]
    out[:, :, 2] = inverse[:, :, 2] + (width - 1) * inverse[:, :, 0]
    return out


class FrameEngine:
    """The BatchRunner of the frame graphs path: a batch of frames (any cameras) → one FrameResult per frame."""

    name = "frame-graphs"

    def __init__(self, lanes: list[FrameLane], detector: DetectorConfig, emotion: EmotionConfig,
                 classifier: ModelManifest, max_batch: int, describe: dict[str, str],
                 faces_per_run: int = 256, frames_per_part: int = 1024, search: bool = False) -> None:
        """`frames_per_part` (inference.max_frames_per_run): a batch is run in parts of at most this many frames,
        each staged, detected and read in turn, so a lane holds that many frames, not max_batch (see _run_group).
        `search`: followed faces given with templates are found by their look in the batch (batch_search)."""
        self.search = search
        self.lanes = len(lanes)
        self.max_batch = max_batch
        self._faces_per_run = max(1, faces_per_run)
        self._frames_per_part = max(1, frames_per_part)
        self._lanes = lanes
        self._detector = detector
        self._emotion = emotion
        self._crop_size: tuple[int, int] = classifier.input.size or (64, 64)
        self._order = np.asarray(classifier.canonical_order())
        self._described = describe
        self._thresholds = {SCORE_THRESHOLD: np.array([detector.score_threshold], np.float32),
                            IOU_THRESHOLD: np.array([detector.nms_threshold], np.float32)}
        self._prepared: set[tuple[int, FrameFormat]] = set()  # each (lane, format) is touched by its lane only

    def prepare(self, fmt: FrameFormat, lane: int) -> None:
        """Build this format's graphs and sessions on `lane` and run each once (call it on the lane's own thread).

        A format met for the first time in a batch is prepared then, before its first run: that batch waits
        (seconds on a GPU, logged), but no later batch meets an unplanned shape."""
        if (lane, fmt) in self._prepared:
            return
        started = time.monotonic()
        self._lanes[lane].prepare(fmt)
        self._prepared.add((lane, fmt))
        log.info("frame graphs lane %d: %dx%d %s frames prepared in %.1f s", lane, fmt.width, fmt.height, fmt.order,
                 time.monotonic() - started)

    def warm_up(self, item_shape: tuple[int, ...], dtype: np.dtype, lane: int = 0) -> None:
        height, width = item_shape[:2]
        self.prepare(FrameFormat(int(width), int(height), "bgr"), lane)

    def run_items(self, items: Sequence[Item], lane: int = 0) -> list[FrameResult]:
        """Group the batch by format (usually one), run each group, and return results in the items' order."""
        groups: dict[FrameFormat, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(frame_format(item), []).append(index)
        results: list[FrameResult | None] = [None] * len(items)
        for fmt, indices in groups.items():
            for index, result in zip(indices, self._run_group([items[i] for i in indices], fmt, lane)):
                results[index] = result
        return results  # type: ignore[return-value]

    def _run_group(self, items: list[Item], fmt: FrameFormat, lane: int) -> list[FrameResult]:
        """One format's frames, those to detect on first (then frames whose faces are given), in consecutive parts
        of at most `frames_per_part` frames. Why parts: a lane keeps the frames it reads in one GPU buffer, and a
        buffer of max_batch 1080p frames is 6.2 MB a row (0.4 GB at 64 rows, per camera group) where the detector
        already reads at most max_frames_per_run frames a run; a batch of detections and followed frames puts its
        detections in the first parts, so the detector runs as often as before. Results in the items' order."""
        self.prepare(fmt, lane)
        order = sorted(range(len(items)), key=lambda i: isinstance(items[i], TrackedFrame))  # stable
        results: list[FrameResult | None] = [None] * len(items)
        for part in run_slices(len(order), self._frames_per_part):
            indices = order[part]
            for index, result in zip(indices, self._run_part([items[i] for i in indices], fmt, lane)):
                results[index] = result
        return results  # type: ignore[return-value]

    def _run_part(self, ordered: list[Item], fmt: FrameFormat, lane: int) -> list[FrameResult]:
        """Both graphs on a part's frames (frames to detect on first, then frames whose faces are given); between
        and after them only array work on this (the lane's) thread, and with `search` the follow graphs: the given
        faces found by their look before their crops are cut, the detected faces' templates cut after. Results in
        `ordered`'s order."""
        runner = self._lanes[lane]
        tracked = [item for item in ordered if isinstance(item, TrackedFrame)]
        rows = len(ordered) - len(tracked)
        t0 = time.monotonic()
        outputs = runner.detect([frame_image(item) for item in ordered], fmt, self._thresholds, rows)
        t1 = time.monotonic()
        tracked, found = self._searched(runner, fmt, tracked, rows)
        kept, matrices, frame_index, flips = self.faces_and_crops(outputs, fmt, tracked, rows)
        templates = self._templates(runner, fmt, kept, ordered[:rows])
        t2 = time.monotonic()
        probs = self._classify(runner, fmt, matrices, frame_index)
        t3 = time.monotonic()
        emotions = normalised(probs, self._order, flips)
        results = []
        for position in range(len(ordered)):
            rows_of = kept.rows(position)
            detect_ms = (t1 - t0) * 1e3 if position < rows else 0.0
            timings = {"detect": detect_ms, "crop": (t2 - t1) * 1e3, "emotion": (t3 - t2) * 1e3}
            look = {"templates": templates[rows_of]} if templates is not None and isinstance(
                ordered[position], LookedFrame) else {}
            if position >= rows and found is not None:
                look = {"found": found[position - rows]}
            results.append(FrameResult(kept.boxes[rows_of], kept.scores[rows_of], kept.landmarks[rows_of],
                                       emotions[rows_of], timings, **look))
        return results

    def _searched(self, runner: FrameLane, fmt: FrameFormat, tracked: list[TrackedFrame],
                  rows: int) -> tuple[list[TrackedFrame], list[np.ndarray] | None]:
        """The followed frames with their faces moved where their look was found, and which were (batch_search);
        as given, None, without `search` or templates."""
        if not self.search or not any(item.templates for item in tracked):
            return tracked, None
        searched = search_faces(partial(runner.follow, fmt), [item.faces for item in tracked],
                                [item.templates for item in tracked], rows, FOLLOW_GEOMETRY)
        moved = [replace(item, faces=faces) for item, faces in zip(tracked, searched.faces)]
        return moved, searched.found

    def _templates(self, runner: FrameLane, fmt: FrameFormat, kept: KeptFaces,
                   detected: list[Item]) -> np.ndarray | None:
        """The templates of every kept face (rows as `kept`'s; zeros where not cut) when a detected frame asked for
        them (LookedFrame), cut in one run; None when none did."""
        wanted = [position for position, item in enumerate(detected) if isinstance(item, LookedFrame)]
        if not self.search or not wanted:
            return None
        faces = np.concatenate([np.arange(len(kept.frame))[kept.rows(position)] for position in wanted])
        width, height = FOLLOW_GEOMETRY.template
        templates = np.zeros((len(kept.frame), height, width), np.float32)
        if len(faces):
            templates[faces] = cut_templates(partial(runner.follow, fmt), kept.boxes[faces], kept.frame[faces],
                                             FOLLOW_GEOMETRY)
        return templates

    def faces_and_crops(self, outputs: dict[str, np.ndarray], fmt: FrameFormat, tracked: list[TrackedFrame],
                        rows: int) -> tuple[KeptFaces, np.ndarray, np.ndarray, int]:
        """The lane's array work between its two graph runs: the batch's faces (the detector's `rows` frames', then
        the `tracked` frames' given ones), each face's crop matrix [F + flips, 2, 3] (the inverse affine; mirrored
        for a followed face read as its mirror image), the frame of each crop, and how many faces are read mirrored
        too (their mirror images' matrices come last: emotion.flip).

        Matrices are made FACES_PER_CALL faces at a time into one array, so that numpy keeps the GIL (see
        FACES_PER_CALL): every camera waits for this thread."""
        detected = kept_faces(outputs[FACE_SCORE], outputs[FACE_BOX], outputs[FACE_LANDMARKS],
                              (fmt.width, fmt.height), self._detector.min_face_px, self._detector.max_faces)
        kept = joined(detected, given_faces([item.faces for item in tracked]))
        faces = len(kept.frame)
        flips = self._mirrored_count(faces, len(detected.frame))
        alone = self._mirrored_alone(kept, tracked, rows)
        width = self._crop_size[0]
        matrices = np.empty((faces + flips, 2, 3), np.float32)
        for start in range(0, faces, FACES_PER_CALL):
            stop = min(start + FACES_PER_CALL, faces)
            inverse = self._inverse_crops(kept, slice(start, stop)).astype(np.float32)
            twins = min(stop, flips) - start
            if twins > 0:  # these faces' mirror images, read in the same run (detected faces come first)
                matrices[faces + start:faces + start + twins] = mirrored(inverse[:twins], width)
            if alone[start:stop].any():  # followed faces read only as their mirror images (flip_followed: alternate)
                inverse[alone[start:stop]] = mirrored(inverse[alone[start:stop]], width)
            matrices[start:stop] = inverse
        frame_index = kept.frame if not flips else np.concatenate([kept.frame, kept.frame[:flips]])
        return kept, matrices, frame_index, flips

    def _mirrored_count(self, faces: int, detected: int) -> int:
        """How many of a batch's faces (the `detected` ones first, then the followed ones) are also read mirrored:
        none without emotion.flip, the detected ones only unless emotion.flip_followed is true."""
        if not self._emotion.flip:
            return 0
        both = followed_read(True, self._emotion.flip_followed, 0) == "both"  # "both" holds on every turn or none
        return faces if both else detected

    def _mirrored_alone(self, kept: KeptFaces, tracked: list[TrackedFrame], first: int) -> np.ndarray:
        """Which of `kept`'s faces (the batch's; the tracked frames' from position `first` on) are read as their
        mirror images instead of as they are, as a mask: the faces of followed frames whose turn says so."""
        flip, flip_followed = self._emotion.flip, self._emotion.flip_followed
        alone = np.zeros(len(kept.frame), bool)
        for position, item in enumerate(tracked):
            if followed_read(flip, flip_followed, item.turn) == "mirror":
                alone[kept.rows(first + position)] = True
        return alone

    def _classify(self, runner: FrameLane, fmt: FrameFormat, matrices: np.ndarray,
                  frame_index: np.ndarray) -> np.ndarray:
        """The classifier graph over every crop, at most `max_faces_per_run` crops a run (inference.max_faces_per_run:
        on cuda the largest run sizes the memory arena)."""
        if not len(matrices):
            return np.zeros((0, len(self._order)), np.float32)
        parts = [runner.classify(fmt, matrices[run], frame_index[run])
                 for run in run_slices(len(matrices), self._faces_per_run)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _inverse_crops(self, kept: KeptFaces, faces: slice) -> np.ndarray:
        """The inverse affines (output pixel → frame pixel) of `faces`' crops, float64 [n, 2, 3]: box crops in one
        vectorised step, alignment (an SVD per face) one by one."""
        if self._emotion.crop == "align":
            forward = np.stack([align_matrix(points, self._crop_size) for points in kept.landmarks[faces]])
        else:
            forward = box_crop_matrices(kept.boxes[faces], self._crop_size, self._emotion.box_margin)
        return inverse_affine(forward)

    def describe(self) -> dict[str, str]:
        return dict(self._described)

    def close(self) -> None:
        lanes, self._lanes = self._lanes, []
        for runner in lanes:
            runner.close()


class FramePerception:
    """Perception on the frame graphs path: `analyze` takes a whole frame (host or GPU) and returns its faces and
    emotions; one shared BatchedModel batches frames across cameras."""

    def __init__(self, model: BatchedModel, engine: FrameEngine, result_timeout_s: float = 10.0,
                 frames_in_flight: int = 1, interval: int = 1, trim_heap: bool = False) -> None:
        """`trim_heap`: give the heap freed while preparing a frame size back to the system (core.heap)."""
        self.model = model
        self.engine = engine
        self.frames_in_flight = frames_in_flight  # per camera (inference.frames_in_flight, resolved)
        self.interval = interval  # detector.interval: frames between detections carry their tracked faces
        self._timeout = result_timeout_s
        self._formats = FormatGate(lambda fmt: self.model.on_lanes(lambda lane: self.engine.prepare(fmt, lane)),
                                   trim_heap)

    def models(self) -> list[tuple[str, BatchedModel]]:
        return [("frames", self.model)]

    def prepare(self, fmt: FrameFormat) -> None:
        """Build and warm a frame format's graphs on every lane before frames of that size arrive (otherwise the
        cameras of that size skip frames while it is prepared in the background: see format_gate)."""
        self._formats.prepare_now(fmt)

    def is_ready(self, fmt: FrameFormat) -> bool:
        """Whether frames of this size are prepared on every lane."""
        return self._formats.is_ready(fmt)

    def warm_up(self) -> None:
        """Nothing to warm before the cameras say their sizes: each format is prepared when first met (logged)."""

    def analyze(self, image: FrameImage) -> Analysis:
        """Faces and emotions of one frame, with the batch's stage times and this frame's wait, in ms (a frame size
        not prepared yet is prepared first, on this thread)."""
        self._formats.prepare_now(frame_format(image))
        return self.begin(image).result()

    @property
    def searches_in_batches(self) -> bool:
        """Whether followed faces given with templates are found by their look in the batches (on cuda)."""
        return self.engine.search

    def begin(self, image: FrameImage, templates: bool = False) -> PendingAnalysis:
        """Hand the frame to the batcher and return at once: QueueFullError when its queue is full, NotReadyError
        while its frame size is being prepared (started by the first frame of that size). `templates`: cut the
        templates of its faces too (PendingAnalysis.look), where the engine searches in batches."""
        return self._submit(LookedFrame(image) if templates and self.engine.search else image)

    def begin_tracked(self, image: FrameImage, faces: list[Detection], turn: int = 0,
                      templates: list[FaceTemplate | None] | None = None) -> PendingAnalysis:
        """A frame without detection (detector.interval): batched with the other cameras' frames like any frame, but
        the detector graph skips it and the classifier graph reads `faces` (the tracker's) in it, as its `turn`
        says (the camera's frames without detection before it: emotion.flip_followed). With `templates` (one per
        face) and an engine that searches, each face is first found by its look near where it was given."""
        return self._submit(TrackedFrame(image, faces, turn, templates if self.engine.search else None))

    def _submit(self, item: Item) -> PendingAnalysis:
        self._formats.admit(frame_format(item))
        started = time.monotonic()

        def finish(result: FrameResult) -> Analysis:  # on the camera's thread
            total = (time.monotonic() - started) * 1e3
            timings = dict(result.timings)
            timings["queue"] = max(0.0, total - sum(timings.values()))
            return result.detections(), result.emotions(), timings
        return PendingAnalysis(self.model.submit(item), finish, self._timeout, look=FrameResult.look)

    def close(self) -> None:
        self.model.close()


def load_frame_perception(detector_path: Path, classifier_path: Path, detector: DetectorConfig,
                          emotion: EmotionConfig, classifier: ModelManifest, inference: InferenceConfig,
                          precision: str, search: bool | None = None) -> FramePerception:
    """The frame graphs path on `inference.device` (cpu or cuda), one lane per `inference.lanes`. `search`: whether
    followed faces are found by their look in the batches (inference.batch_search; default: on cuda, where the
    frames already are; on the CPU the trackers' OpenCV search costs far less than the graphs)."""
    from pipeline.inference.onnxruntime import (
        import_ort,
        limit_cublas_workspace,
        make_session,
        share_cuda_arena,
    )

    ort = import_ort()
    graphs = FrameGraphs(detector_path, classifier_path, detector, classifier,
                         on_gpu=inference.device == "cuda")
    threads = inference.threads
    lanes: list[FrameLane] = []
    if inference.device == "cuda":
        limit_cublas_workspace(inference.cublas_workspace)
        shared = share_cuda_arena(ort, limit_mb=inference.gpu_memory_limit_mb)
        lanes = _cuda_lanes(ort, graphs, inference, detector, threads or 1, shared, emotion.flip)
    else:
        def cpu_session(graph: bytes) -> Any:
            return make_session(ort, graph, "frame graph", threads, ["CPUExecutionProvider"])
        lanes = [HostFrameLane(graphs, cpu_session, inference.max_frames_per_run) for _ in range(inference.lanes)]
    describe = {"backend": "onnxruntime", "device": inference.device, "precision": precision,
                "frame_path": "graph", "lanes": str(len(lanes)),
                "files": f"{detector_path.name}, {classifier_path.name}"}
    engine = FrameEngine(lanes, detector, emotion, classifier, inference.max_batch, describe,
                         inference.faces_per_run, inference.max_frames_per_run,
                         search=inference.device == "cuda" if search is None else search)
    model = BatchedModel(engine, "frames", inference.max_batch, inference.max_delay_ms, inference.queue_size)
    return FramePerception(model, engine, frames_in_flight=inference.frames_in_flight_for(graph=True),
                           interval=detector.interval, trim_heap=inference.trim_heap_s > 0)


def _cuda_lanes(ort: Any, graphs: FrameGraphs, inference: InferenceConfig, detector: DetectorConfig, threads: int,
                shared_arena: bool, flip: bool) -> list[FrameLane]:
    from pipeline.inference.gpu.cuda import load_runtime
    from pipeline.inference.gpu.frame_lane import CudaFrameLane
    from pipeline.inference.onnxruntime import captured_provider_options, cuda_provider_options, make_session

    load_runtime()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise BackendError(f"inference.device cuda needs CUDAExecutionProvider, which this onnxruntime "
                           f"({ort.__version__}) lacks; pip install -r requirements-gpu.txt")

    def cuda_session(graph: bytes, stream: int, captured: bool) -> Any:
        provider_options = captured_provider_options if captured else cuda_provider_options
        options = provider_options(stream, inference.cudnn_max_workspace)
        return make_session(ort, graph, "frame graph", threads, [("CUDAExecutionProvider", options)],
                            shared_arena and not captured, inference.memory_pattern)

    lanes: list[FrameLane] = []
    try:
        for index in range(inference.lanes):
            lanes.append(CudaFrameLane(graphs, cuda_session, inference.max_batch, inference.batch_step,
                                       inference.face_step, face_cap=inference.faces_per_run,
                                       what=f"frame graphs lane {index}",
                                       frame_cap=inference.max_frames_per_run, captured=inference.cuda_graphs))
    except BaseException:
        for lane in lanes:
            lane.close()
        raise
    return lanes
