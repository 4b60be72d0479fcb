"""Where the avatar should look: the direction, from the avatar's eyes, of the face its behaviour attends to.

Why in behaviour: *which* face is the behaviour's choice (attention, with its stickiness and, across an avatar's
cameras, its switching delay); the look follows that choice, so it never jumps between faces the avatar does not
also answer. The outputs smooth the direction into a stream (outputs.expression_stream.GazeFollower); here it is
one target per observation of the attended face, and the centre when nobody is attended.

Frames: the avatar's is x to its right, y up, z forward (out of the screen, towards the visitors). A camera's image
is turned into it by the camera's placement (cameras[].placement): pitch, then yaw, then its offset from the avatar's
eyes. A face's distance, needed only with an offset, is estimated from its box width (an adult face's box is about
FACE_WIDTH_M wide). Yaw is positive towards the avatar's right, pitch positive upwards, in degrees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from pipeline.core.types import FaceResult, Observation

FACE_WIDTH_M = 0.16  # width of the detector's box around an adult face, at the face's distance
IDLE = "idle"


class CameraPlacement(Protocol):
    """cameras[].placement (capture.settings.Placement), read-only here."""

    @property
    def yaw_deg(self) -> float: ...

    @property
    def pitch_deg(self) -> float: ...

    @property
    def hfov_deg(self) -> float: ...

    @property
    def offset_m(self) -> tuple[float, float, float]: ...


@dataclass(frozen=True)
class LookTarget:
    """Where one stream's avatar should look now."""

    stream: str  # the avatar, or the camera in no avatar
    avatar: str | None
    camera: str
    track_id: int | None  # the attended face; None: nobody (look ahead)
    yaw_deg: float
    pitch_deg: float
    point_m: tuple[float, float, float]  # the face's position in the avatar's frame (1 m ahead when idle)


def face_point(face: FaceResult, frame_size: tuple[int, int], placement: CameraPlacement) -> tuple[float, float, float]:
    """The face's centre in the avatar's frame, in metres (see the module docstring)."""
    width, height = frame_size
    f = (width / 2.0) / math.tan(math.radians(placement.hfov_deg) / 2.0)
    x1, y1, x2, y2 = face.detection.box
    cx, cy, box_w = (x1 + x2) / 2.0, (y1 + y2) / 2.0, max(x2 - x1, 1.0)
    distance = f * FACE_WIDTH_M / box_w
    ray = ((cx - width / 2.0) / f, -(cy - height / 2.0) / f, 1.0)  # camera frame turned y-up
    norm = math.sqrt(sum(v * v for v in ray))
    x, y, z = (v / norm * distance for v in ray)
    pitch, yaw = math.radians(placement.pitch_deg), math.radians(placement.yaw_deg)
    y, z = y * math.cos(pitch) + z * math.sin(pitch), -y * math.sin(pitch) + z * math.cos(pitch)
    x, z = x * math.cos(yaw) + z * math.sin(yaw), -x * math.sin(yaw) + z * math.cos(yaw)
    ox, oy, oz = placement.offset_m
    return (x + ox, y + oy, z + oz)


def angles(point: tuple[float, float, float]) -> tuple[float, float]:
    """(yaw, pitch) in degrees of a point in the avatar's frame."""
    x, y, z = point
    return math.degrees(math.atan2(x, z)), math.degrees(math.atan2(y, math.hypot(x, z)))


class FocusSource(Protocol):
    def focus(self, camera: str) -> tuple[str, str | None, str | None, int | None]: ...


class LookAt:
    """One look target per observation of the attended face; the centre once when attention ends."""

    def __init__(self, router: FocusSource, placements: dict[str, CameraPlacement]) -> None:
        self._router = router
        self._placements = placements
        self._idle: set[str] = set()  # streams whose last target was the centre

    def observe(self, obs: Observation) -> LookTarget | None:
        """After the behaviour digested `obs`: where its stream's avatar should look, or None (this camera is not
        the one its avatar attends to, or the avatar already looks ahead)."""
        stream, avatar, camera, track = self._router.focus(obs.camera)
        if camera is None:
            return self._ahead(stream, avatar, obs.camera)
        if camera != obs.camera:
            return None
        face = next((f for f in obs.faces if f.track_id == track), None) if track is not None else \
            max(obs.faces, key=lambda f: f.detection.area, default=None)
        placement = self._placements.get(obs.camera)
        if face is None or placement is None:
            return None
        self._idle.discard(stream)
        point = face_point(face, obs.frame_size, placement)
        yaw, pitch = angles(point)
        return LookTarget(stream, avatar, obs.camera, face.track_id, round(yaw, 2), round(pitch, 2),
                          tuple(round(v, 3) for v in point))  # type: ignore[arg-type]

    def tick(self, cameras: list[str]) -> list[LookTarget]:
        """Without an observation (a camera that left, or went idle): look ahead where nobody is attended."""
        targets = []
        for camera in cameras:
            stream, avatar, focus_camera, _ = self._router.focus(camera)
            if focus_camera is None:
                target = self._ahead(stream, avatar, camera)
                if target is not None:
                    targets.append(target)
        return targets

    def _ahead(self, stream: str, avatar: str | None, camera: str) -> LookTarget | None:
        if stream in self._idle:
            return None
        self._idle.add(stream)
        return LookTarget(stream, avatar, camera, None, 0.0, 0.0, (0.0, 0.0, 1.0))
