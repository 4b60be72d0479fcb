"""IoU tracking (stable ids per camera), each track's motion, and per-track smoothing of emotion probabilities.

Smoothing is an exponential moving average whose weight depends on the real time between frames
(alpha = 1 - 0.5 ** (dt / half_life)), so it behaves the same at 5 fps and at 30 fps.

Motion: each track keeps a velocity per box coordinate, measured between its detections. Matching compares a
detection with where each track should be by then, and `predict` gives the faces of a frame that is not run through
the detector (`detector.interval`): every live track's last detection moved on at its velocity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from typing import Literal

import numpy as np

from pipeline.core.types import Detection, EmotionScores, FrameImage
from pipeline.vision.follow import HOST_FOLLOWER, FaceTemplate, Follower

Box = tuple[float, float, float, float]
FollowBy = Literal["auto", "look", "motion"]  # tracking.follow_by: what a followed face is found by (see the config)


def box_iou(a: Box, b: Box) -> float:
    """IoU of two boxes (x1, y1, x2, y2).

    Plain Python on purpose: a camera has a handful of faces, and for so few pairs numpy's per-call overhead made the
    tracker the largest holder of the GIL at 64 cameras (py-spy on the H200, 2026-12-01)."""
    inter_w = min(a[2], b[2]) - max(a[0], b[0])
    inter_h = min(a[3], b[3]) - max(a[1], b[1])
    if inter_w <= 0 or inter_h <= 0:
        return 0.0
    inter = inter_w * inter_h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / max(union, 1e-9)


VELOCITY_BLEND = 0.5  # weight of the newest measurement in a track's velocity (the rest: the previous estimate)
NEAR_WIDTHS = 1.5  # second matching pass: a face this many track widths from a track's expected centre, at most
SIZE_RATIO = 1.5  # ... and no more than this much wider or narrower


def _centre_distance(a: Box, b: Box) -> float:
    return float(np.hypot((a[0] + a[2] - b[0] - b[2]) / 2.0, (a[1] + a[3] - b[1] - b[3]) / 2.0))


@dataclass
class Track:
    track_id: int
    box: Box  # where the face was at box_time: its last detection, or where following found it since
    last_seen: float  # when a detection last matched it: what keeps it alive
    probs: np.ndarray | None = None
    smoothed_at: float = 0.0
    velocity: Box = (0.0, 0.0, 0.0, 0.0)  # pixels per second of each box coordinate
    detection: Detection | None = None  # its last detection: what a prediction moves on
    box_time: float = 0.0
    template: FaceTemplate | None = None  # its face as last detected, to find it again between detections
    moves: int = 0  # how many movements the velocity was measured from

    def box_at(self, now: float) -> Box:
        """Where the face should be at `now`, moved on from its last known box at the track's velocity."""
        dt = now - self.box_time
        x1, y1, x2, y2 = (b + v * dt for b, v in zip(self.box, self.velocity))
        return (x1, y1, x2, y2)

    def moved_to(self, box: Box, now: float) -> None:
        """The face was found at `box` at `now`: measure the velocity since the last known box, move there."""
        dt = now - self.box_time
        if self.detection is not None and dt > 0:
            blend = VELOCITY_BLEND if self.moves else 1.0  # the first measurement is all there is
            measured = [(new - old) / dt for new, old in zip(box, self.box)]
            v1, v2, v3, v4 = (blend * m + (1 - blend) * v for m, v in zip(measured, self.velocity))
            self.velocity, self.moves = (v1, v2, v3, v4), self.moves + 1
        self.box, self.box_time = box, now

    def seen(self, face: Detection, now: float, template: FaceTemplate | None = None) -> None:
        """A detection matched: the track moves there, lives on, and keeps the face's look (`template`, when the
        frame was searchable)."""
        self.moved_to(face.box, now)
        self.last_seen, self.detection = now, face
        self.template = template


def moved_detection(face: Detection, box: Box) -> Detection:
    """`face` with its box replaced by `box` and its landmarks carried along (the same place within the box)."""
    scale_x = (box[2] - box[0]) / max(face.box[2] - face.box[0], 1e-6)
    scale_y = (box[3] - box[1]) / max(face.box[3] - face.box[1], 1e-6)
    landmarks = np.asarray(face.landmarks, np.float32)
    moved = np.stack([box[0] + (landmarks[:, 0] - face.box[0]) * scale_x,
                      box[1] + (landmarks[:, 1] - face.box[1]) * scale_y], axis=1).astype(np.float32)
    return Detection(box, face.score, moved)


class IouTracker:
    """Greedy highest-IoU-first matching of detections to live tracks; unmatched detections start new tracks.

    `follow` (a camera whose detector skips frames, detector.interval > 1): a detection is matched with where each
    track should be by now (its velocity), and what overlap leaves unmatched is matched by distance
    (`_match_near`). Without it, matching is by overlap with each track's last box alone, as always."""

    def __init__(self, iou_threshold: float = 0.3, max_age_s: float = 1.0, half_life_ms: float = 300.0,
                 follow: bool = False, pose_every: int = 1, follow_by: FollowBy = "auto") -> None:
        self.follow = follow
        self.pose_every = max(1, pose_every)  # tracking.pose_every: read by the camera worker that fits poses
        self.follow_by = follow_by  # tracking.follow_by: read by the camera worker that hands this tracker its frames
        self.iou_threshold = iou_threshold
        self.max_age_s = max_age_s
        self.half_life_s = half_life_ms / 1000.0
        self.tracks: dict[int, Track] = {}
        self._ids = count(1)
        self.detected_at = float("-inf")  # when `update` last ran: the detection `predict` follows from

    def searchable(self, image: FrameImage, follower: Follower = HOST_FOLLOWER) -> FrameImage | None:
        """The frame to hand `update` and `predict` for finding faces by their look, or None: not following (every
        frame detected), following by motion alone (`tracking.follow_by: motion`), or, under `auto`, a frame on the
        GPU that `follower` would search by copying windows down. With `look` a GPU frame is searched either way."""
        if not self.follow or self.follow_by == "motion":
            return None
        if self.follow_by == "auto" and not isinstance(image, np.ndarray) and not follower.searches_device_frames:
            return None
        return image

    def looks_in_batches(self, available: bool) -> bool:
        """Whether this camera's followed faces are found by their look in the shared engine's batches, where the
        engine can (`available`: the CUDA frame graphs path), instead of here: with `tracking.follow_by: look`.
        Not under `auto`: on an H100 the batches' search kept every frame of 16 cameras in one process but 81 % of
        64 in groups of 32, where motion alone keeps them all (BENCHMARKS.md, round 19)."""
        return available and self.follow and self.follow_by == "look"

    def update(self, faces: list[Detection], now: float, frame: FrameImage | None = None,
               follower: Follower = HOST_FOLLOWER,
               templates: Sequence[FaceTemplate | None] | None = None) -> list[int]:
        """Assign a track id to each face (same order), expiring tracks unseen for max_age_s; with the frame, each
        face's look is kept (by `follower`) for `predict` to find it again; or given as `templates` (cut in the
        engine's batch: vision.follow.BatchLook)."""
        self.tracks = {k: t for k, t in self.tracks.items() if now - t.last_seen <= self.max_age_s}
        self.detected_at = now
        live = list(self.tracks.values())
        ids: list[int | None] = [None] * len(faces)
        expected = [track.box_at(now) if self.follow else track.box for track in live]
        pairs = [(overlap, face_i, track_i)
                 for face_i, face in enumerate(faces) for track_i, box in enumerate(expected)
                 if (overlap := box_iou(face.box, box)) >= self.iou_threshold]
        taken: set[int] = set()
        for _, face_i, track_i in sorted(pairs, key=lambda pair: -pair[0]):  # stable: ties keep face, track order
            if ids[face_i] is None and track_i not in taken:
                ids[face_i] = live[track_i].track_id
                taken.add(track_i)
        if self.follow:
            self._match_near(faces, live, expected, ids, taken)
        if templates is None or len(templates) != len(faces):
            templates = (follower.templates(frame, [face.box for face in faces]) if frame is not None and faces
                         else [None] * len(faces))
        for index, (face, template) in enumerate(zip(faces, templates)):
            track_id = ids[index]
            if track_id is None:
                track_id = next(self._ids)
                self.tracks[track_id] = Track(track_id, face.box, now, box_time=now)
                ids[index] = track_id
            self.tracks[track_id].seen(face, now, template)
        return [int(i) for i in ids if i is not None]

    @staticmethod
    def _match_near(faces: list[Detection], live: list[Track], expected: list[Box], ids: list[int | None],
                    taken: set[int]) -> None:
        """Second pass, for what overlap left unmatched: a face whose centre lies within NEAR_WIDTHS of a track's
        expected width from that track's expected centre, at a similar size, continues it (nearest first). A face
        that moved more than its width since the last detection (a pan, or a detector run only every few frames)
        overlaps nothing, yet is plainly the same face; without this it would start a new track with no velocity,
        every time."""
        pairs = []
        for face_i, face in enumerate(faces):
            if ids[face_i] is not None:
                continue
            for track_i, box in enumerate(expected):
                if track_i in taken:
                    continue
                width = max(box[2] - box[0], 1e-6)
                distance = _centre_distance(face.box, box) / width
                if distance <= NEAR_WIDTHS and 1 / SIZE_RATIO <= (face.box[2] - face.box[0]) / width <= SIZE_RATIO:
                    pairs.append((distance, face_i, track_i))
        for _, face_i, track_i in sorted(pairs):
            if ids[face_i] is None and track_i not in taken:
                ids[face_i] = live[track_i].track_id
                taken.add(track_i)

    def predict(self, now: float, frame: FrameImage | None = None,
                follower: Follower = HOST_FOLLOWER) -> list[tuple[int, Detection]]:
        """The faces of a frame that skips the detector: each track the last detection run found, with that
        detection moved to where the track's motion puts it at `now` and, given the frame, to where its look is
        found near there (the track then moves there too).

        A track the last detection run missed is not followed: with every frame detected that face would not be
        reported either, and a face whose detector lost it (turned away, hidden, gone) drifts on its motion alone
        (group_1080p.mp4: such faces made most followed boxes that overlapped no detection). The track stays alive
        for matching until max_age_s after its last detection, as without skipping, and is not followed past it."""
        followed = [(track, detection) for track in self.tracks.values() if (detection := track.detection) is not None
                    and track.last_seen >= self.detected_at and now - track.last_seen <= self.max_age_s]
        boxes = [track.box_at(now) for track, _ in followed]
        looked = [(i, track.template) for i, (track, _) in enumerate(followed) if track.template is not None]
        if frame is not None and looked:  # every followed face at once (one round trip on a GPU)
            found = follower.locate(frame, [(template, boxes[i]) for i, template in looked])
            for (i, _), place in zip(looked, found):
                if place is not None:
                    followed[i][0].moved_to(place, now)
                    boxes[i] = place
        return [(track.track_id, moved_detection(detection, box)) for (track, detection), box in zip(followed, boxes)]

    def templates_for(self, track_ids: Sequence[int]) -> list[FaceTemplate | None]:
        """The looks of these tracks (as `predict` returned them), for the engine to search by."""
        return [track.template if (track := self.tracks.get(track_id)) is not None else None
                for track_id in track_ids]

    def found_at(self, track_ids: Sequence[int], faces: Sequence[Detection], found: Sequence[bool],
                 now: float) -> None:
        """The engine found these tracks' faces by their look (where `found`) at the faces' boxes: the tracks move
        there, as `predict` moves them when it searches itself."""
        for track_id, face, was_found in zip(track_ids, faces, found):
            track = self.tracks.get(track_id)
            if was_found and track is not None:
                track.moved_to(face.box, now)

    def smooth(self, track_id: int, scores: EmotionScores, now: float) -> EmotionScores:
        """Blend `scores` into the track's running probabilities and return the smoothed vector."""
        track = self.tracks[track_id]
        dt = now - track.smoothed_at
        if track.probs is None or self.half_life_s <= 0:
            track.probs = scores.probs.copy()
        elif dt > 0:
            alpha = 1.0 - 0.5 ** (dt / self.half_life_s)
            track.probs = (1.0 - alpha) * track.probs + alpha * scores.probs
        track.smoothed_at = now
        return EmotionScores(track.probs.astype(np.float32))
