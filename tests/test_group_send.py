"""A camera group's messages to the daemon (pipeline/service/group_send.py) over a real multiprocessing queue:
observations from many camera threads arrive in batches, each camera's in order, none lost; an event sent after a
camera's observations never overtakes them; a full queue drops observations (counted) and nothing blocks."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from typing import Any

import numpy as np

from pipeline.core.types import Detection, EmotionScores, FaceResult, Observation
from pipeline.service.group_send import GroupSender

CAMERAS, PER_CAMERA = 12, 40


def _observation(camera: str, index: int) -> Observation:
    face = FaceResult(Detection((10.0, 20.0, 60.0, 90.0), 0.9, np.zeros((5, 2), np.float32)),
                      EmotionScores(np.full(7, 1 / 7, np.float32)), track_id=1)
    return Observation(camera, index, time.monotonic(), time.time(), (1920, 1080), (face,))


def _drain(out: Any, until: float) -> list[tuple[Any, ...]]:
    messages: list[tuple[Any, ...]] = []
    while time.monotonic() < until:
        try:
            messages.append(out.get(timeout=0.2))
        except queue.Empty:
            if messages and messages[-1][0] == "done":
                break
    return messages


def test_observations_arrive_batched_in_order_and_events_do_not_overtake_them() -> None:
    out = mp.get_context("spawn").Queue(256)
    sender = GroupSender(out, every_s=0.02)

    def camera(name: str) -> None:
        for index in range(PER_CAMERA):
            sender.observation(_observation(name, index))
            time.sleep(0.002)
        sender.send(("event", name))  # e.g. the camera stopped: after all of its observations

    threads = [threading.Thread(target=camera, args=(f"cam{n}",)) for n in range(CAMERAS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sender.close()
    sender.send(("done",))
    messages = _drain(out, time.monotonic() + 20)

    seen: dict[str, list[int]] = {f"cam{n}": [] for n in range(CAMERAS)}
    for message in messages:
        if message[0] == "observations":
            for obs in message[1]:
                seen[obs.camera].append(obs.frame_index)
        elif message[0] == "event":
            assert seen[message[1]] == list(range(PER_CAMERA)), f"{message[1]}'s event overtook its observations"
    assert all(indices == list(range(PER_CAMERA)) for indices in seen.values()), "observations lost or reordered"
    batches = [message for message in messages if message[0] == "observations"]
    assert len(batches) < CAMERAS * PER_CAMERA / 2, f"{len(batches)} messages for {CAMERAS * PER_CAMERA} observations"
    assert sender.dropped == 0


def test_a_full_queue_drops_observations_and_counts_them() -> None:
    out = mp.get_context("spawn").Queue(1)
    out.put(("views",))  # the daemon is not reading: the queue stays full
    sender = GroupSender(out, every_s=0.01)
    for index in range(5):
        sender.observation(_observation("lobby", index))
    deadline = time.monotonic() + 5
    while sender.dropped < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    assert sender.send(("event", "lobby"), timeout=0.2) is False  # refused after its timeout, logged
    assert time.monotonic() - started < 2
    sender.close()
    assert sender.dropped == 5
