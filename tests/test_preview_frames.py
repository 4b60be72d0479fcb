"""The preview keeps an analysed frame only while someone watches its camera (issue 25: on the GPU frame path a kept
frame pins one of the camera's 6.2 MB pool buffers). Real frames of group_1080p.mp4 through the real models and the
daemon's previewing worker, published as the daemon publishes them; the clock is the only fake."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import cv2
import numpy as np
import pytest

from pipeline.capture.settings import CameraConfig
from pipeline.capture.thread import CaptureThread
from pipeline.core.types import Frame, Observation
from pipeline.service.cameras import Camera, PreviewingWorker
from pipeline.service.preview import WATCH_S, PreviewStore
from pipeline.vision.track import IouTracker
from tests.conftest import data_path


class Clock:
    """Monotonic time that a test can move forward (frames keep their real capture times)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    video = cv2.VideoCapture(str(data_path("video", "group_1080p.mp4")))
    frames = [video.read()[1] for _ in range(3)]
    video.release()
    assert all(frame is not None for frame in frames)
    return frames


class Wiring:
    """One camera as the daemon wires it: the worker's publish takes the analysed frame into the preview store."""

    def __init__(self, perception: Any, clock: Clock, newest: list[Frame]) -> None:
        stop = threading.Event()
        cfg = CameraConfig(name="lobby", source="demo")
        capture = CaptureThread(cfg, stop, lambda _event: None)
        self.previews = PreviewStore(5.0, lambda _name: newest[-1] if newest else None, clock=clock)
        worker = PreviewingWorker(capture, perception, IouTracker(), self._publish, stop)
        self.camera = Camera(cfg, capture, worker)
        self.perception = perception

    def _publish(self, obs: Observation) -> None:
        frame = self.camera.analysed_frame(obs)
        if frame is not None:
            self.previews.update(frame, obs)

    def analyse(self, frame: Frame) -> None:
        faces, scores, timings = self.perception.begin(frame.image).result()
        self.camera.worker.publish(self.camera.worker.observe(frame, faces, scores, timings))


def _frame(images: list[np.ndarray], index: int) -> Frame:
    return Frame("lobby", index, images[index % len(images)].copy(), time.monotonic(), time.time())


def _kept_after_analysis(wiring: Wiring, images: list[np.ndarray], index: int) -> bool:
    """Analyse frame `index` and drop the test's own reference: whether anything still holds its pixels."""
    frame = _frame(images, index)
    pixels = weakref.ref(frame.image)
    wiring.analyse(frame)
    del frame
    gc.collect()
    return pixels() is not None


def test_an_unwatched_camera_keeps_no_analysed_frame(perception: Any, images: list[np.ndarray]) -> None:
    wiring = Wiring(perception, Clock(), [])
    assert not _kept_after_analysis(wiring, images, 0), "an analysed frame was kept although nobody watches"


def test_a_watched_camera_keeps_its_analysed_frame_until_nobody_watches(perception: Any,
                                                                         images: list[np.ndarray]) -> None:
    clock = Clock()
    newest: list[Frame] = []
    wiring = Wiring(perception, clock, newest)
    wiring.analyse(_frame(images, 0))
    newest.append(_frame(images, 1))  # the capture's newest frame, one after the analysed one
    first = wiring.previews.jpeg("lobby")  # a client opens the page: the newest frame, annotated, and now watched
    assert first is not None and first.jpeg[:3] == b"\xff\xd8\xff"
    assert first.key[:2] == (1, 1), "the first tile should draw the latest observation on the newest frame"

    assert _kept_after_analysis(wiring, images, 2), "a watched camera's analysed frame was dropped"
    clock.offset += 1.0  # past the preview's 1/fps: the next tile is rendered anew
    tile = wiring.previews.jpeg("lobby")
    assert tile is not None and tile.key[:2] == (2, 1), "the tile should show the analysed frame itself"

    clock.offset += WATCH_S + 1.0  # nobody asked for a while
    assert not _kept_after_analysis(wiring, images, 3), "the frame was kept after the viewers left"
