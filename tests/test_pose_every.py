"""tracking.pose_every: a tracked face's head pose is refitted on every Nth detection only and kept in between, on
real frames of group_1080p.mp4 through the real detector, tracker and camera worker (not started: its observe step
is what fits poses)."""

from __future__ import annotations

import threading
from typing import Any

import cv2
import pytest

from pipeline.capture.settings import CameraConfig
from pipeline.capture.thread import CaptureThread
from pipeline.core.types import Frame, Observation
from pipeline.service.worker import CameraWorker
from pipeline.vision.track import IouTracker
from tests.conftest import data_path

FRAMES = 8


@pytest.fixture(scope="module")
def frames() -> list[Any]:
    video = cv2.VideoCapture(str(data_path("video", "group_1080p.mp4")))
    images = [video.read()[1] for _ in range(FRAMES)]
    video.release()
    assert all(image is not None for image in images)
    return images


def _observations(perception: Any, images: list[Any], pose_every: int) -> list[Observation]:
    """Every frame a detection frame, observed by one worker whose tracker refits poses every `pose_every`."""
    stop = threading.Event()
    capture = CaptureThread(CameraConfig(name="lobby", source="demo"), stop, lambda _event: None)
    worker = CameraWorker(capture, perception, IouTracker(pose_every=pose_every), lambda _obs: None, stop)
    out = []
    for index, image in enumerate(images):
        faces, scores, timings = perception.begin(image).result()
        out.append(worker.observe(Frame("lobby", index, image, index * 0.04, 0.0), faces, scores, timings))
    return out


def _kept_and_refitted(observations: list[Observation]) -> tuple[int, int]:
    """Over consecutive frames, how many tracks kept exactly their previous pose, and how many got a new one."""
    kept = refitted = 0
    for before, after in zip(observations, observations[1:]):
        previous = {face.track_id: face.head for face in before.faces}
        for face in after.faces:
            if face.track_id in previous and previous[face.track_id] is not None and face.head is not None:
                kept += face.head == previous[face.track_id]
                refitted += face.head != previous[face.track_id]
    return kept, refitted


def test_every_detection_refits_every_pose_by_default(perception: Any, frames: list[Any]) -> None:
    kept, refitted = _kept_and_refitted(_observations(perception, frames, 1))
    assert refitted >= 20 and kept <= refitted // 10  # real landmarks move between frames: a kept pose is rare


def test_pose_every_two_refits_about_half_the_tracks_on_each_detection(perception: Any, frames: list[Any]) -> None:
    observations = _observations(perception, frames, 2)
    kept, refitted = _kept_and_refitted(observations)
    assert kept >= 10 and refitted >= 10
    assert 0.3 <= kept / (kept + refitted) <= 0.7, (kept, refitted)
    fitted = [face.head for face in _observations(perception, frames[:1], 1)[0].faces]
    assert [face.head for face in observations[0].faces] == fitted  # a new track is always fitted
