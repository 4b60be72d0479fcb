"""A camera with more than one frame in the shared engine (inference.frames_in_flight): the next frame joins a batch
while the previous one is analysed, and the camera still publishes in frame order. Real capture (a file camera),
the real frame graphs on ONNX Runtime's CPU provider, the real worker."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.capture.settings import CameraConfig, ReconnectConfig
from pipeline.capture.thread import CaptureThread
from pipeline.core.types import Observation
from pipeline.inference.batching import NotReadyError
from pipeline.inference.frames import FramePerception, frame_format
from pipeline.inference.perception import load_perception
from pipeline.inference.settings import InferenceConfig
from pipeline.service.worker import CameraWorker
from pipeline.vision.track import IouTracker
from tests.conftest import data_path
from tests.test_frames_path import _frames


def _perception(app_config: Any, frames_in_flight: int) -> FramePerception:
    inference = app_config.inference.model_copy(update={"frame_path": "graph", "device": "cpu", "max_batch": 8,
                                                        "max_delay_ms": 20.0, "frames_in_flight": frames_in_flight})
    perception = load_perception(app_config.model_copy(update={"inference": inference}))
    if not isinstance(perception, FramePerception):
        raise TypeError(f"frame_path graph gave {type(perception).__name__}")
    return perception


def _run_camera(video: Path, fps: float, perception: Any, publish: Callable[[Observation], None],
                enough: Callable[[], bool], timeout_s: float,
                tracker: IouTracker | None = None) -> tuple[CameraWorker, bool]:
    """A real capture of `video` looping at `fps` and a CameraWorker on `perception`, until `enough()` or the time
    is up; then both are stopped and the perception closed. The worker, and whether it was alive at the end."""
    stop = threading.Event()
    cfg = CameraConfig(name="lobby", source=str(video), fps=fps, loop=True,
                       reconnect=ReconnectConfig(initial_s=0.2, max_s=0.5, stall_s=5.0))
    capture = CaptureThread(cfg, stop, lambda _event: None)
    worker = CameraWorker(capture, perception, tracker or IouTracker(), publish, stop)
    try:
        capture.start()
        worker.start()
        deadline = time.monotonic() + timeout_s
        while not enough() and time.monotonic() < deadline and worker.is_alive():
            time.sleep(0.05)
        alive = worker.is_alive()
    finally:
        stop.set()
        capture.slot.close()
        worker.join(15)
        capture.join(15)
        perception.close()
    return worker, alive


@pytest.mark.parametrize("depth", [1, 2])
def test_a_camera_keeps_its_frames_in_flight_and_publishes_in_order(prepared_models: None, app_config: Any,
                                                                     depth: int) -> None:
    """1080p frames arrive every 40 ms and take longer than that to analyse on the CPU, so the worker always has a
    next frame to hand over: it reaches its depth, never exceeds it, and publishes frames in increasing order."""
    observations: list[Observation] = []
    worker, _ = _run_camera(data_path("video", "group_1080p.mp4"), 25, _perception(app_config, depth),
                            observations.append, lambda: len(observations) >= 12, 90)
    indices = [o.frame_index for o in observations]
    assert len(indices) >= 12, f"only {len(indices)} observations, worker errors {worker.stats.errors}"
    assert indices == sorted(set(indices)), indices
    assert worker.stats.most_in_flight == depth
    assert worker.stats.errors == 0
    assert worker.stats.skipped_busy >= 1  # the first frame found its size unprepared and started its preparation
    assert all(o.faces for o in observations)  # group_1080p has faces in every frame


@pytest.mark.parametrize(("settings", "graph", "expected"), [
    ({"device": "cuda"}, True, 2),  # auto: the GPU frame graphs path pipelines two frames per camera
    ({"device": "cpu"}, True, 1),
    ({"device": "cuda"}, False, 1),  # the OpenCV path analyses a frame on the camera's own thread
    ({"device": "cpu", "frames_in_flight": 3}, True, 3),
    ({"device": "cuda", "frames_in_flight": 3}, False, 1),
])
def test_frames_in_flight_auto(settings: dict[str, Any], graph: bool, expected: int) -> None:
    assert InferenceConfig(**settings).frames_in_flight_for(graph=graph) == expected


def test_a_new_frame_size_is_prepared_in_the_background(prepared_models: None, app_config: Any,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The first frame of a size starts its preparation and is refused at once (NotReadyError, a skip), instead of
    waiting behind it past the result timeout; once the size is ready, frames go through, and what preparing it
    freed has gone back to the system (inference.trim_heap_s, on by default). analyze() (one-off analyses) prepares
    on the calling thread instead."""
    caplog.set_level(logging.INFO, logger="pipeline.inference.format_gate")
    frames = _frames(data_path("video", "woman2.mp4"), 3, 1)
    perception = _perception(app_config, 2)
    try:
        fmt = frame_format(frames[0])
        with pytest.raises(NotReadyError):
            perception.begin(frames[0])
        deadline = time.monotonic() + 60
        while not perception.is_ready(fmt) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert perception.is_ready(fmt)
        assert re.search(r"frames ready in [\d.]+ s; \d+ MB of freed heap given back", caplog.text), caplog.text
        faces, scores, _ = perception.begin(frames[1]).result()
        assert len(faces) == len(scores) == 1
        smaller = np.ascontiguousarray(frames[2][: 320, : 480])  # another size: analyze() prepares it itself
        assert not perception.is_ready(frame_format(smaller))
        faces, _, _ = perception.analyze(smaller)
        assert perception.is_ready(frame_format(smaller))
    finally:
        perception.close()



def test_an_observation_that_cannot_be_published_is_counted_and_the_camera_goes_on(
        prepared_models: None, app_config: Any) -> None:
    """What follows the analysis (track ids, head pose, the publish callback) raising once is one failed frame, as an
    analysis that raises: the worker logs and counts it and keeps reading the camera (it used to end the thread)."""
    from pipeline.inference.perception import Perception

    observations: list[Observation] = []

    def publish_failing_once(observation: Observation) -> None:
        if not observations and not getattr(publish_failing_once, "failed", False):
            publish_failing_once.failed = True  # type: ignore[attr-defined]
            raise RuntimeError("sink refused the first observation")
        observations.append(observation)

    worker, alive = _run_camera(data_path("video", "woman2.mp4"), 15, Perception.from_config(app_config),
                                publish_failing_once, lambda: len(observations) >= 5, 60)
    assert alive and len(observations) >= 5, (alive, len(observations))
    assert worker.stats.errors == 1
