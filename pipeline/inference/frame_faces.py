"""The frame graphs' fixed-size face rows → the faces the host keeps, for a whole batch, as arrays.

Why arrays: this runs on the lane's thread, the one thread every camera waits for. Done per frame and per face with
objects (Detection objects, filter_faces, one EmotionScores per face) it took 14 ms of a 48 ms batch of 55 1080p
frames at 64 cameras on the H200 (the GIL shared with ~130 other threads stretches any Python there). Here the lane
keeps arrays only; each camera's own thread turns its frame's rows into Detection and EmotionScores objects
(FrameResult.detections / emotions) when it collects the result. Nor does the lane give the GIL away in numpy calls
over all rows (kept_faces' docstring says why): it picks the few real faces in plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.types import Detection, EmotionScores
from pipeline.modelprep.frame_graphs import FACE_BOX, FACE_LANDMARKS, FACE_OUTPUTS, FACE_SCORE
from pipeline.vision.follow import BatchLook, templates_from


@dataclass(frozen=True)
class KeptFaces:
    """The faces kept in a batch, flat and in frame order: `frame[i]` is face i's frame in the batch, and frame b's
    faces are rows offsets[b]:offsets[b + 1], largest first (as vision.retinaface.filter_faces orders them)."""

    frame: np.ndarray  # [N] int64
    boxes: np.ndarray  # [N, 4] float64, frame pixels, clipped to the frame
    scores: np.ndarray  # [N] float32
    landmarks: np.ndarray  # [N, 5, 2] float32, frame pixels
    offsets: np.ndarray  # [B + 1]

    def rows(self, index: int) -> slice:
        return slice(int(self.offsets[index]), int(self.offsets[index + 1]))


def kept_faces(score: np.ndarray, box: np.ndarray, landmarks: np.ndarray, frame_size: tuple[int, int],
               min_face_px: int, max_faces: int) -> KeptFaces:
    """The detector graph's rows ([B, F] scores, best first, -1 where there is no face; [B, F, 4] boxes;
    [B, F, 5, 2] points) → the faces the OpenCV path keeps: boxes clipped to the frame (vision.retinaface._to_frame),
    faces whose short side is under `min_face_px` dropped, the `max_faces` largest kept, ties in area in score order
    (the stable sort of filter_faces). tests/test_frame_graphs.py compares it with filter_faces on real frames.

    Why plain Python over the few real faces instead of numpy over all B x F rows: this runs on the lane's thread
    between its two graph runs, and numpy gives the GIL away inside clip, argsort, nonzero and fancy indexing of
    arrays this size; each time, taking it back waits for whichever camera thread holds it (up to the 5 ms switch
    interval). Vectorised over the rows it took ~40 ms of waits a batch while one other thread ran Python (0.3 ms
    alone); this way it never lets go of the GIL (deploy/gil_release_probe.py, BENCHMARKS.md)."""
    width, height = frame_size
    boxes_in, scores_in = np.asarray(box), np.asarray(score)
    picks: list[tuple[int, int, list[float]]] = []  # frame, row, clipped box
    counts: list[int] = []
    for frame, row_scores in enumerate(scores_in.tolist()):
        faces = []
        for row, face_score in enumerate(row_scores):
            if face_score < 0:
                break  # the graph's rows come best first (TopK): the rest are empty too
            x0, y0, x1, y1 = boxes_in[frame, row].tolist()
            clipped = [min(max(x0, 0.0), width), min(max(y0, 0.0), height),
                       min(max(x1, 0.0), width), min(max(y1, 0.0), height)]
            side_w, side_h = clipped[2] - clipped[0], clipped[3] - clipped[1]
            if min(side_w, side_h) >= min_face_px:
                faces.append((-(max(side_w, 0.0) * max(side_h, 0.0)), row, clipped))
        faces.sort(key=lambda face: face[0])  # stable: equal areas stay in score order
        picks.extend((frame, row, clipped) for _, row, clipped in faces[:max_faces])
        counts.append(min(len(faces), max_faces))
    return KeptFaces(np.array([frame for frame, _, _ in picks], np.int64),
                     np.array([clipped for _, _, clipped in picks], np.float64).reshape(-1, 4),
                     np.array([scores_in[frame, row] for frame, row, _ in picks], np.float32),
                     np.array([landmarks[frame, row] for frame, row, _ in picks], np.float32).reshape(-1, 5, 2),
                     np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64))


def no_face_rows() -> dict[str, np.ndarray]:
    """The detector graph's outputs for a batch with no frame to detect on (every frame's faces are given)."""
    shapes = {FACE_SCORE: (0, 1), FACE_BOX: (0, 1, 4), FACE_LANDMARKS: (0, 1, 5, 2)}
    return {name: np.zeros(shapes[name], np.float32) for name in FACE_OUTPUTS}


def given_faces(per_frame: list[list[Detection]]) -> KeptFaces:
    """Faces known without the detector (each frame's tracked faces, detector.interval) as KeptFaces rows, as they
    are: a box the tracker moved is not clipped (the OpenCV path crops it unclipped too)."""
    counts = np.array([len(faces) for faces in per_frame], np.int64)
    faces = [face for frame_faces in per_frame for face in frame_faces]
    return KeptFaces(np.repeat(np.arange(len(per_frame), dtype=np.int64), counts),
                     np.array([face.box for face in faces], np.float64).reshape(-1, 4),
                     np.array([face.score for face in faces], np.float32),
                     np.array([face.landmarks for face in faces], np.float32).reshape(-1, 5, 2),
                     np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))


def joined(first: KeptFaces, then: KeptFaces) -> KeptFaces:
    """The faces of `first`'s frames followed by those of `then`'s, whose frames come after first's in the batch."""
    frames = len(first.offsets) - 1
    return KeptFaces(np.concatenate([first.frame, then.frame + frames]),
                     np.concatenate([first.boxes, then.boxes]), np.concatenate([first.scores, then.scores]),
                     np.concatenate([first.landmarks, then.landmarks]),
                     np.concatenate([first.offsets, then.offsets[1:] + first.offsets[-1]]))


@dataclass(frozen=True)
class FrameResult:
    """One frame's kept faces and their probabilities as arrays (views into the batch's), and the batch's stage
    times; the objects a camera publishes are made on the camera's thread."""

    boxes: np.ndarray
    scores: np.ndarray
    landmarks: np.ndarray
    probs: np.ndarray
    timings: dict[str, float]
    templates: np.ndarray | None = None  # a detection frame's faces' templates [n, h, w] (search in batches)
    found: np.ndarray | None = None  # a frame without detection: each given face found by its look [n] bool

    def look(self) -> BatchLook | None:
        """The search's part of this frame (None where the batch did not search it): templates as FaceTemplate,
        each with its face's box and scale (template pixels per frame pixel across)."""
        if self.found is not None:
            return BatchLook(found=[bool(value) for value in self.found])
        if self.templates is None:
            return None
        return BatchLook(templates=templates_from(self.templates, self.boxes))

    def detections(self) -> list[Detection]:
        return [Detection(box=(float(b[0]), float(b[1]), float(b[2]), float(b[3])), score=float(s), landmarks=p)
                for b, s, p in zip(self.boxes, self.scores, self.landmarks)]

    def emotions(self) -> list[EmotionScores]:
        return [EmotionScores(row) for row in self.probs]


def run_slices(count: int, cap: int) -> list[slice]:
    """`count` rows in consecutive runs of at most `cap` (inference.max_frames_per_run, max_faces_per_run): on
    cuda the largest run a session sees sizes its share of the memory arena, so a batch is read in parts."""
    cap = max(1, cap)
    return [slice(start, min(start + cap, count)) for start in range(0, count, cap)]
