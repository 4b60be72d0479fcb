"""Followed faces found by their look inside the shared engine's batches (inference.batch_search), as the CUDA
frame graphs path does, run here on ONNX Runtime's CPU provider with the real models and real frames: the engine
finds the faces where the same follow graphs find them frame by frame, cuts the classifier's crops there, and a real
camera worker keeps its tracks' looks from the engine's templates."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipeline.inference.frames import FramePerception, frame_format
from pipeline.inference.perception import load_perception
from tests.conftest import data_path
from tests.test_frames_in_flight import _run_camera
from tests.test_frames_path import _frames


def _searching(app_config: Any, interval: int = 1) -> FramePerception:
    """The frame graphs on the CPU with the batch search on (the daemon turns it on for cuda only)."""
    inference = app_config.inference.model_copy(update={"frame_path": "graph", "device": "cpu", "max_batch": 8,
                                                        "max_delay_ms": 5.0})
    detector = app_config.detector.model_copy(update={"interval": interval})
    perception = load_perception(app_config.model_copy(update={"inference": inference, "detector": detector}))
    if not isinstance(perception, FramePerception):
        raise TypeError(f"frame_path graph gave {type(perception).__name__}")
    perception.engine.search = True
    return perception


def follow_in_batches(perception: FramePerception, frames: list[Any], hosts: list[np.ndarray]) -> int:
    """The first frame's faces detected with their templates cut in the batch; on the next frames each tracked face
    searched in the batch, checked against the follow graphs on the CPU frame by frame (inference.following on the
    host copies `hosts`): the same places within a quarter pixel, the same faces. Returns how many were found by
    their look."""
    from pipeline.inference.following import cpu_graph_follower
    from pipeline.vision.track import IouTracker

    follower = cpu_graph_follower()
    in_batch, frame_by_frame = IouTracker(follow=True, follow_by="look"), IouTracker(follow=True, follow_by="look")
    assert perception.searches_in_batches and in_batch.looks_in_batches(perception.searches_in_batches)
    pending = perception.begin(frames[0], templates=True)
    faces, _, _ = pending.result()
    look = pending.look()
    assert look is not None and look.templates is not None and len(look.templates) == len(faces) >= 3
    in_batch.update(faces, 0.0, templates=look.templates)
    frame_by_frame.update(faces, 0.0, hosts[0], follower)
    found = 0
    for index in range(1, len(frames)):
        now = index / 25.0
        tracked = in_batch.predict(now)
        ids = [track_id for track_id, _ in tracked]
        pending = perception.begin_tracked(frames[index], [face for _, face in tracked], index - 1,
                                           in_batch.templates_for(ids))
        read, scores, _ = pending.result()
        look = pending.look()
        assert look is not None and look.found is not None and len(look.found) == len(read) == len(scores)
        in_batch.found_at(ids, read, look.found, now)
        expected = frame_by_frame.predict(now, hosts[index], follower)
        assert [i for i, _ in expected] == ids
        np.testing.assert_allclose([face.box for face in read], [face.box for _, face in expected], atol=0.25)
        found += sum(look.found)
    return found


def test_the_batch_finds_followed_faces_where_the_follow_graphs_find_them(prepared_models: None,
                                                                          app_config: Any) -> None:
    """group_1080p.mp4 (follow_in_batches): the faces land where the follow graphs put them frame by frame, their
    emotions read from crops there, and most are found by their look."""
    frames = _frames(data_path("video", "group_1080p.mp4"), 6, 1)
    perception = _searching(app_config)
    try:
        perception.prepare(frame_format(frames[0]))
        found = follow_in_batches(perception, frames, frames)
        assert found >= 0.7 * 5 * 3
    finally:
        perception.close()


@pytest.mark.slow
def test_a_camera_worker_keeps_its_tracks_looks_from_the_engine_s_templates(prepared_models: None,
                                                                             app_config: Any) -> None:
    """A real file camera at detector.interval 3 on the searching engine: the worker hands its detection frames
    over for templates and its followed frames with its tracks' looks; woman2's one face keeps one track, whose
    look is the engine's fixed-size template (float, 30 x 24), and no frame fails."""
    from pipeline.vision.track import IouTracker

    observations: list[Any] = []
    tracker = IouTracker(follow=True, follow_by="look")
    worker, alive = _run_camera(data_path("video", "woman2.mp4"), 10, _searching(app_config, interval=3),
                                observations.append, lambda: len(observations) >= 12, 90, tracker=tracker)
    assert alive and worker.stats.errors == 0, worker.stats
    ids = {face.track_id for o in observations for face in o.faces}
    assert len(observations) >= 12 and len(ids) == 1, (len(observations), ids)
    followed = [o for o in observations if o.latency_ms.get("detect", 1.0) == 0.0]
    assert len(followed) >= 6
    templates = [track.template for track in tracker.tracks.values() if track.template is not None]
    assert templates and all(t.pixels.shape == (30, 24) and t.pixels.dtype == np.float32 for t in templates)
