"""Faces found by their look inside the shared engine's batches (`tracking.follow_by` on the CUDA frame graphs path).

Why in the batch: searching each camera's frame on its own (vision.follow.HostFollower: windows copied down and
matched in OpenCV; or one follow-graph run a frame, inference.following) costs every camera's worker thread per
frame, and at 150 cameras the workers became the limit (BENCHMARKS.md, rounds 17-18). Here the lane that already holds
a batch's frames on the GPU runs the follow graphs (modelprep.follow_graphs) once for every followed face of the
batch, between staging the frames and cutting their crops: one launch a batch, the faces' crops cut where they were
found. After the detector, one more run cuts the templates of the detected faces of frames that asked for them.

`Run` is the lane's call: (role "templates" or "match", sampling matrices [F, 2, 3], each face's row in the lane's
frame buffer [F], templates [F, h, w] or None) → the graph's output rows; called here in runs of at most
FACES_PER_RUN faces, each padded to a power of two so that a session meets a handful of shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core.types import Detection
from pipeline.inference.frame_faces import run_slices
from pipeline.modelprep.follow_graphs import FollowGeometry, found_box, sampling_matrix, search_window
from pipeline.vision.follow import MIN_SCORE, Box, FaceTemplate, best_places
from pipeline.vision.track import moved_detection

Run = Callable[[str, np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]


# Faces a follow-graph run takes at most. Why a cap: a run's memory grows with its faces (each window's samples, the
# correlation's [F, 66 x 29, 30] products), and the shared arena keeps the largest run's; a batch of 30 crowd
# cameras holds 100-150 followed faces. With the correlation as a MatMul, runs of up to 128 faces took 0.6 GB more
# GPU memory at 64 cameras (2 groups) on an H100, where a Conv over every pair in one run took 6.2 GB more
# (BENCHMARKS.md, round 19); smaller runs (32) cost more lane time in launches.
FACES_PER_RUN = 128


def padded_count(faces: int) -> int:
    """The next power of two: a session meets a handful of face counts, not every one (each new shape is planned)."""
    return 1 << max(0, faces - 1).bit_length()


def padded_run(run: Run, role: str, matrices: np.ndarray, frame_index: np.ndarray,
               templates: np.ndarray | None) -> np.ndarray:
    """`run` over at most FACES_PER_RUN faces at a time, each run's F padded to a power of two (copies of its first
    face, templates of zeros); the rows of all the faces, in order."""
    parts = []
    for part in run_slices(len(matrices), FACES_PER_RUN):
        count = part.stop - part.start
        extra = padded_count(count) - count
        matrix, index = matrices[part], frame_index[part]
        looks = None if templates is None else templates[part]
        if extra:
            matrix = np.concatenate([matrix, np.repeat(matrix[:1], extra, axis=0)])
            index = np.concatenate([index, np.repeat(index[:1], extra)])
            if looks is not None:
                looks = np.concatenate([looks, np.zeros((extra, *looks.shape[1:]), np.float32)])
        parts.append(np.asarray(run(role, matrix, index, looks))[:count])
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass(frozen=True)
class Searched:
    """A batch's followed frames after the search: each frame's faces (moved where their look was found) and which
    of them were found."""

    faces: list[list[Detection]]
    found: list[np.ndarray]


def search_boxes(run: Run, wanted: Sequence[tuple[FaceTemplate, Box]], rows: np.ndarray,
                 geometry: FollowGeometry) -> list[Box | None]:
    """Where each template's face is, searched around its expected box (its frame: `rows`), every face in one
    run (or a few: FACES_PER_RUN); None where the best match scores under vision.follow.MIN_SCORE. The templates
    must fit the geometry (FollowGeometry.fits)."""
    if not wanted:
        return []
    windows = [search_window(template.box, expected, geometry) for template, expected in wanted]
    matrices = np.stack([sampling_matrix(window, geometry.window, geometry.supersample) for window in windows])
    pixels = np.stack([template.pixels for template, _ in wanted]).astype(np.float32, copy=False)
    best, xs, ys = best_places(padded_run(run, "match", matrices, rows.astype(np.int64), pixels))
    return [found_box(window, float(x), float(y), template.box, geometry) if score >= MIN_SCORE else None
            for window, x, y, score, (template, _) in zip(windows, xs, ys, best, wanted)]


def search_faces(run: Run, faces: Sequence[list[Detection]], templates: Sequence[Sequence[FaceTemplate | None] | None],
                 first_row: int, geometry: FollowGeometry) -> Searched:
    """Every face with a template of this geometry, over all of the batch's followed frames (frame i in buffer row
    first_row + i), searched together (`search_boxes`); a face not found keeps the box it was given (its motion's
    guess)."""
    wanted = [(frame, face, template) for frame, (given, looks) in enumerate(zip(faces, templates)) if looks
              for face, template in enumerate(looks)
              if template is not None and geometry.fits(template.pixels) and face < len(given)]
    moved = [list(given) for given in faces]
    found = [np.zeros(len(given), bool) for given in faces]
    rows = np.array([first_row + frame for frame, _, _ in wanted], np.int64)
    places = search_boxes(run, [(template, faces[frame][face].box) for frame, face, template in wanted], rows,
                          geometry)
    for (frame, face, _), place in zip(wanted, places):
        if place is not None:
            moved[frame][face] = moved_detection(faces[frame][face], place)
            found[frame][face] = True
    return Searched(moved, found)


def cut_templates(run: Run, boxes: np.ndarray, rows: np.ndarray, geometry: FollowGeometry) -> np.ndarray:
    """The templates [n, h, w] of the faces in `boxes` [n, 4] (frame pixels), each in its buffer row, in one run."""
    if not len(boxes):
        return np.zeros((0, geometry.template[1], geometry.template[0]), np.float32)
    matrices = np.stack([sampling_matrix(tuple(box), geometry.template, geometry.supersample)  # type: ignore[arg-type]
                         for box in boxes.astype(np.float64)])
    return padded_run(run, "templates", matrices, rows.astype(np.int64), None)
