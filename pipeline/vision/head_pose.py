"""Head pose from the detector's five landmarks: yaw, pitch, roll, and whether the face looks at the camera.

Why five points and a generic face: RetinaFace already gives both eyes, the nose tip and both mouth corners; a small
Perspective-n-Point fit of those against an average adult face (millimetres, symmetric about the nose) gives the
head's rotation for about 0.1 ms, with no extra model. The camera is a pinhole whose focal length comes from its
horizontal field of view (cameras[].placement.hfov_deg), centred on the frame. The fit is the only OpenCV call: the
rotation matrix and the angles are plain Python, because every OpenCV call gives the GIL away and taking it back
among a camera group's busy threads cost more than the arithmetic (deploy/head_pose_probe.py: 8 threads fitting
beside 2 busy ones made 1.7x the fits a second without cv2.Rodrigues; BENCHMARKS.md).

Angles, in degrees, in the camera's frame (x right, y down, z forward, as OpenCV's): yaw is the head's turn about the
vertical axis (positive: the face turns towards the image's right), pitch its nod (positive: the face tilts up),
roll its tilt in the image plane. A mirrored photo gives the opposite yaw and roll and the same pitch: the model is
symmetric, which tests/test_head_pose.py checks on real photos. `looking`: the face's forward direction points at
the camera within `cone_deg`, whatever the face's place in the frame.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from pipeline.core.types import HeadPose

# An average adult face (mm): the eye on the image's left, the other eye, the nose tip, the mouth corner on the image's
# left, the other corner; x right, y down, z away from the camera (the eyes and mouth lie behind the nose tip).
FACE_MODEL = np.array([[-32.0, -34.0, 28.0], [32.0, -34.0, 28.0], [0.0, 0.0, 0.0],
                       [-25.0, 34.0, 22.0], [25.0, 34.0, 22.0]], np.float64)
LOOKING_CONE_DEG = 20.0


def focal_length(width: float, hfov_deg: float) -> float:
    """The pinhole focal length, in pixels, of a frame `width` wide seen through a horizontal field of `hfov_deg`."""
    return (width / 2.0) / math.tan(math.radians(hfov_deg) / 2.0)


def head_pose(landmarks: np.ndarray, frame_size: tuple[int, int], hfov_deg: float = 70.0,
              cone_deg: float = LOOKING_CONE_DEG) -> HeadPose | None:
    """The pose of the head whose five landmarks (pixels, the detector's order) are given; None when the fit fails.

    A fit fails for landmarks too close together to say anything (a distant face, a profile whose points the
    detector heaped together: SQPnP refuses points spread less than ~12 px on a 1080p frame, by an OpenCV assertion
    that once ended camera workers on the H200); the face is then read without a pose."""
    width, height = frame_size
    f = focal_length(width, hfov_deg)
    camera = np.array([[f, 0.0, width / 2.0], [0.0, f, height / 2.0], [0.0, 0.0, 1.0]])
    points = np.asarray(landmarks, np.float64).reshape(5, 1, 2)
    if not np.all(np.isfinite(points)):
        return None
    try:
        ok, rvec, tvec = cv2.solvePnP(FACE_MODEL, points, camera, None, flags=cv2.SOLVEPNP_SQPNP)
    except cv2.error:
        return None
    if not ok:
        return None
    translation = [float(v) for v in np.asarray(tvec).reshape(3)]
    if not all(map(math.isfinite, translation)) or translation[2] <= 0:
        return None
    rotation = rotation_matrix([float(v) for v in rvec.reshape(3)])
    yaw = math.degrees(math.asin(max(-1.0, min(1.0, -rotation[2][0]))))
    pitch = math.degrees(math.atan2(rotation[2][1], rotation[2][2]))
    roll = math.degrees(math.atan2(rotation[1][0], rotation[0][0]))
    return HeadPose(round(-yaw, 2), round(-pitch, 2), round(roll, 2), _looking(rotation, translation, cone_deg))


def rotation_matrix(rvec: list[float]) -> list[list[float]]:
    """cv2.Rodrigues of a rotation vector (Rodrigues' formula), in plain Python: the fit's only other OpenCV call,
    and each OpenCV call gives the GIL away and must take it back, which among a camera group's busy threads cost
    more than the arithmetic (deploy/head_pose_probe.py; BENCHMARKS.md)."""
    theta = math.sqrt(sum(v * v for v in rvec))
    if theta < 1e-12:
        return [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    x, y, z = (v / theta for v in rvec)
    c, s = math.cos(theta), math.sin(theta)
    t = 1.0 - c
    return [[c + t * x * x, t * x * y - s * z, t * x * z + s * y],
            [t * y * x + s * z, c + t * y * y, t * y * z - s * x],
            [t * z * x - s * y, t * z * y + s * x, c + t * z * z]]


def _looking(rotation: list[list[float]], translation: list[float], cone_deg: float) -> bool:
    """Whether the face's forward direction (towards the camera: -z of the model) points at the camera centre."""
    distance = math.sqrt(sum(v * v for v in translation))
    cosine = sum(row[2] * v for row, v in zip(rotation, translation)) / distance  # forward . (-t / |t|)
    return math.degrees(math.acos(max(-1.0, min(1.0, cosine)))) <= cone_deg
