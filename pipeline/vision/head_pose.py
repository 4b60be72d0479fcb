"""Head pose from the detector's five landmarks: yaw, pitch, roll, and whether the face looks at the camera.

Why five points and a generic face: RetinaFace already gives both eyes, the nose tip and both mouth corners; a small
Perspective-n-Point fit of those against an average adult face (millimetres, symmetric about the nose) gives the
head's rotation for about 0.1 ms, with no extra model. The camera is a pinhole whose focal length comes from its
horizontal field of view (cameras[].placement.hfov_deg), centred on the frame.

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
    if not ok or not np.all(np.isfinite(tvec)) or float(tvec[2, 0]) <= 0:
        return None
    rotation, _ = cv2.Rodrigues(rvec)
    yaw = math.degrees(math.asin(max(-1.0, min(1.0, -float(rotation[2, 0])))))
    pitch = math.degrees(math.atan2(float(rotation[2, 1]), float(rotation[2, 2])))
    roll = math.degrees(math.atan2(float(rotation[1, 0]), float(rotation[0, 0])))
    return HeadPose(round(-yaw, 2), round(-pitch, 2), round(roll, 2), _looking(rotation, tvec, cone_deg))


def _looking(rotation: np.ndarray, tvec: np.ndarray, cone_deg: float) -> bool:
    """Whether the face's forward direction (towards the camera: -z of the model) points at the camera centre."""
    forward = rotation @ np.array([0.0, 0.0, -1.0])
    to_camera = -tvec[:, 0] / float(np.linalg.norm(tvec))
    return math.degrees(math.acos(max(-1.0, min(1.0, float(forward @ to_camera))))) <= cone_deg
