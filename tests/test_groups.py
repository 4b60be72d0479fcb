"""Camera groups in processes of their own (inference.processes > 1, pipeline/service/groups.py), run as an operator
runs the daemon: real models on the CPU, a real video file per camera, JSON events on stdout, the real status
server. A group process killed with SIGKILL is started again while the other group's camera keeps being analysed;
a SIGHUP moves the cameras back into the daemon's process; SIGTERM leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime
import pytest

from pipeline.config.app import AppConfig, CameraConfig
from pipeline.service.parts import sized_for_cameras
from pipeline.service.groups import (
    CameraGroup,
    GroupHandlers,
    GroupStartError,
    camera_groups,
    group_gpus,
    stop_groups,
    visible_gpus,
)
from tests.conftest import ROOT
from tests.running_daemon import (  # noqa: F401  (daemons: a fixture)
    RunningDaemon,
    clip,
    daemons,
    free_port,
    wait_until,
    write_config,
)

STARTED = re.compile(r"(cameras-\d+): process (\d+) started for ([\w, -]+)")


def _camera(name: str) -> CameraConfig:
    return CameraConfig.model_validate({"name": name, "source": "video.mp4"})


def test_cameras_are_dealt_round_robin_into_non_empty_groups() -> None:
    cams = [_camera(name) for name in "abcde"]
    assert [[c.name for c in group] for group in camera_groups(cams, 2)] == [["a", "c", "e"], ["b", "d"]]
    assert [[c.name for c in group] for group in camera_groups(cams, 8)] == [[n] for n in "abcde"]
    assert [[c.name for c in group] for group in camera_groups(cams, 1)] == [list("abcde")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (not reaped yet) is as good as gone
        return stat.read().split(")")[-1].split()[0] != "Z"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    return json.loads(body) if url.endswith("/api/status") else body


def _groups_started(daemon: RunningDaemon) -> dict[str, tuple[int, str]]:
    """Each group's latest process id and cameras, from the daemon's log lines."""
    found: dict[str, tuple[int, str]] = {}
    for line in list(daemon.stderr):
        match = STARTED.search(line)
        if match:
            found[match.group(1)] = (int(match.group(2)), match.group(3).strip())
    return found


@pytest.mark.slow
def test_groups_analyse_every_camera_survive_a_killed_process_and_reload_back(
        prepared_models: None, tmp_path: Path, daemons: Callable[..., RunningDaemon]) -> None:
    cams = [f"{{name: {name}, source: '{clip()}', fps: 8, loop: true}}" for name in ("lobby", "door", "hall")]
    port = free_port()
    config = write_config(tmp_path / "config.yaml", cams, port=port,
                          extra="inference: {processes: 2, trim_heap_s: 1}\n")
    daemon = daemons(config)
    for name in ("lobby", "door", "hall"):
        daemon.wait_for(lambda n=name: len(daemon.of("observation", n)) >= 3, 90, f"observations from {name}")
    # every process gives its freed heap back (pipeline/core/heap.py), the daemon's and each group's
    trimmed = r": gave \d+ MB of freed heap back to the system \([\d.]+ ms\)"
    for process in ("daemon", "emotion-cameras-1", "emotion-cameras-2"):
        daemon.wait_for(lambda p=process: re.search(p + trimmed, daemon.stderr_text()), 10,
                        f"{process} trimming its heap")
    groups = _groups_started(daemon)
    assert sorted(groups) == ["cameras-1", "cameras-2"], daemon.stderr_text()[-2000:]
    assert groups["cameras-1"][1] == "lobby, hall" and groups["cameras-2"][1] == "door"
    assert all(_alive(pid) for pid, _ in groups.values())

    # status and metrics describe the groups' cameras and models, read from their processes
    base = f"http://127.0.0.1:{port}"
    def streaming_views() -> bool:
        cameras = _get(f"{base}/api/status")["cameras"]
        return len(cameras) == 3 and all(cam["state"] == "streaming" and cam["frames_analysed"] for cam in cameras)

    assert wait_until(streaming_views, 10), _get(f"{base}/api/status")["cameras"]
    status = _get(f"{base}/api/status")
    assert {cam["name"]: cam["state"] for cam in status["cameras"]} == \
        {"lobby": "streaming", "door": "streaming", "hall": "streaming"}, status["cameras"]
    assert all(cam["frames_analysed"] > 0 for cam in status["cameras"]), status["cameras"]
    assert any(key.endswith("@cameras-1") for key in status["models"]) and \
        any(key.endswith("@cameras-2") for key in status["models"]), status["models"]
    processes = {proc["name"]: proc for proc in status["processes"]}  # each process's host memory, by name
    assert sorted(processes) == ["cameras-1", "cameras-2", "daemon"], status["processes"]
    assert all(processes[name]["pid"] == pid and processes[name]["rss_mb"] > 50 for name, (pid, _) in groups.items())
    assert wait_until(lambda: re.search(r'emotion_batch_size_count\{model="[^"]+@cameras-2"\} [1-9]',
                                        _get(f"{base}/metrics")), 10), "no batches counted for cameras-2's models"
    # the status page's annotated preview of a group's camera, rendered in its group
    with urllib.request.urlopen(f"{base}/preview/hall.jpg", timeout=5) as response:
        assert response.status == 200 and response.headers["Content-Type"] == "image/jpeg"
        assert response.read()[:3] == b"\xff\xd8\xff"  # a JPEG

    # a group process dies: it is started again, and the other group's camera is analysed meanwhile
    killed_pid = groups["cameras-2"][0]
    door_before, lobby_before = len(daemon.of("observation", "door")), len(daemon.of("observation", "lobby"))
    os.kill(killed_pid, signal.SIGKILL)
    daemon.wait_for(lambda: "cameras-2: process ended unexpectedly" in daemon.stderr_text(), 20,
                    "the daemon noticing the killed group")
    daemon.wait_for(lambda: _groups_started(daemon)["cameras-2"][0] != killed_pid, 30,
                    "cameras-2 started again in a new process")
    door_restarted = len(daemon.of("observation", "door"))  # what the killed process had sent is in by now
    daemon.wait_for(lambda: len(daemon.of("observation", "door")) > max(door_before, door_restarted) + 3, 90,
                    "door's observations after its group was started again")
    assert len(daemon.of("observation", "lobby")) > lobby_before, "lobby stopped while the other group was down"
    assert _alive(_groups_started(daemon)["cameras-2"][0])

    # a reload that sets processes: 1 (and drops hall) moves the cameras back into the daemon's own process
    assert 'camera="hall"' in _get(f"{base}/metrics")
    write_config(config, cams[:2], port=port)
    daemon.signal(signal.SIGHUP)
    daemon.wait_for(lambda: any(e["status"] == "applied" for e in daemon.of("config")), 60, "the reload applied")
    counts = {name: len(daemon.of("observation", name)) for name in ("lobby", "door")}
    for name in counts:
        daemon.wait_for(lambda n=name: len(daemon.of("observation", n)) > counts[n] + 3, 60,
                        f"{name} analysed in the daemon's process")
    assert wait_until(lambda: not any(_alive(pid) for pid, _ in _groups_started(daemon).values()), 5), \
        "a group process outlived the reload that ended the groups"
    status = _get(f"{base}/api/status")
    assert not any("@cameras-" in key for key in status["models"]), status["models"]
    assert sorted(cam["name"] for cam in status["cameras"]) == ["door", "lobby"], status["cameras"]
    assert 'camera="hall"' not in _get(f"{base}/metrics"), "the removed camera's series outlived it"

    code, _ = daemon.terminate(timeout=15)
    assert code == 0, daemon.stderr_text()[-2000:]
    assert "Traceback" not in daemon.stderr_text()


@pytest.mark.slow
def test_sigterm_to_every_process_stops_the_groups_in_order(prepared_models: None, tmp_path: Path,
                                           daemons: Callable[..., RunningDaemon]) -> None:
    cams = [f"{{name: {name}, source: '{clip()}', fps: 8, loop: true}}" for name in ("lobby", "door")]
    config = write_config(tmp_path / "config.yaml", cams, extra="inference: {processes: 2}\n")
    daemon = daemons(config)
    for name in ("lobby", "door"):  # the capture reports `streaming` a moment after its first frames
        daemon.wait_for(lambda n=name: daemon.of("observation", n) and daemon.of("camera", n), 90,
                        f"observations and the streaming event from {name}")
    pids = [pid for pid, _ in _groups_started(daemon).values()]
    for pid in pids:  # systemd's SIGTERM reaches every process of the unit, the groups too: they wait for the daemon
        os.kill(pid, signal.SIGTERM)
    code, _ = daemon.terminate(timeout=15)
    assert code == 0, daemon.stderr_text()[-2000:]
    assert not any(_alive(pid) for pid in pids)
    assert "did not stop in time" not in daemon.stderr_text()
    states = {name: [e["state"] for e in daemon.of("camera", name)] for name in ("lobby", "door")}
    assert all(s[0] == "streaming" and s[-1] == "stopped" for s in states.values()), states


def test_a_group_that_cannot_load_its_models_fails_the_start_with_exit_3(prepared_models: None,
                                                                        tmp_path: Path) -> None:
    """The models load in the group processes: a failure there is the daemon's model error (exit 3, naming the group
    and the cause), and no group process is left behind. Provoked with `device: cuda` on a machine without CUDA."""
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has CUDA: device cuda would load")
    cams = [f"{{name: {name}, source: '{clip()}', fps: 8, loop: true}}" for name in ("lobby", "door")]
    config = write_config(tmp_path / "config.yaml", cams, extra="inference: {processes: 2, device: cuda}\n")
    done = subprocess.run([sys.executable, str(ROOT / "run_pipeline.py"), "run", "--config", str(config)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("model error: cameras-")]
    assert errors and "cuda" in errors[0].lower(), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    pids = [int(pid) for _, pid, _ in STARTED.findall(done.stderr)]
    assert pids and not any(_alive(pid) for pid in pids)


def test_a_group_on_the_frame_graphs_path_prepares_no_batch_larger_than_its_cameras_allow() -> None:
    cams = [{"name": f"c{i}", "source": "demo"} for i in range(3)]
    graphs = AppConfig.model_validate({"cameras": cams, "inference": {"frame_path": "graph", "max_batch": 64,
                                                                       "frames_in_flight": 2}})
    assert sized_for_cameras(graphs, 16, "camera group").inference.max_batch == 32  # 16 cameras x 2 frames in flight
    assert sized_for_cameras(graphs, 40, "camera group").inference.max_batch == 64  # never raised
    assert sized_for_cameras(graphs, 16, "camera group").cameras == graphs.cameras and graphs.inference.max_batch == 64
    opencv = AppConfig.model_validate({"cameras": cams, "inference": {"frame_path": "opencv", "max_batch": 64}})
    # faces are batched there too: left alone
    assert sized_for_cameras(opencv, 2, "camera group").inference.max_batch == 64


def test_the_daemon_sizes_its_one_process_for_its_enabled_cameras_and_reloads_models_when_that_changes() -> None:
    """The daemon's own process (processes: 1) is capped like a group: 8 cameras with 2 frames in flight prepare
    batches of at most 16 frames, and the emotion runs then hold at most 128 crops (auto: 8 a frame); a reload that
    adds a camera changes that size, so it reloads the models; one past the configured max_batch does not."""
    from pipeline.service.reload import plan_reload

    def config(count: int, disabled: int = 0, **inference: Any) -> AppConfig:
        cams = [{"name": f"c{i}", "source": "demo", "enabled": i >= disabled} for i in range(count)]
        return AppConfig.model_validate({"cameras": cams, "inference": {"frame_path": "graph", "frames_in_flight": 2,
                                                                           **inference}})

    eight = sized_for_cameras(config(8), 8, "daemon").inference
    assert (eight.max_batch, eight.faces_per_run) == (16, 128)
    assert config(8).inference.faces_per_run == 256 and config(8, max_faces_per_run=40).inference.faces_per_run == 40
    assert sized_for_cameras(config(8, max_batch=8), 8, "daemon").inference.max_batch == 8
    assert plan_reload(config(8), config(9)).models
    assert not plan_reload(config(20), config(21)).models  # 40 and 42 frames: both past max_batch 32
    assert plan_reload(config(9, disabled=1), config(9)).models  # a disabled camera does not count
    assert not plan_reload(config(8), config(8)).models


def test_a_few_cameras_on_a_gpu_keep_one_frame_in_flight_each_when_auto() -> None:
    """frames_in_flight auto (0): at most 8 cameras on the GPU frame graphs path analyse one frame of each at a time
    (max_batch 8 and runs of at most 64 crops for 8: 1,239 against 1,495 MiB of an H200 with 2), 9 or more two; an
    explicit value, the CPU and the OpenCV path are left as they were; a reload from 8 to 9 cameras reloads."""
    from pipeline.service.reload import plan_reload

    def config(count: int, **inference: Any) -> AppConfig:
        cams = [{"name": f"c{i}", "source": "demo"} for i in range(count)]
        return AppConfig.model_validate({"cameras": cams, "inference": {"device": "cuda", **inference}})

    eight = sized_for_cameras(config(8), 8, "daemon").inference
    assert (eight.frames_in_flight_for(True), eight.max_batch, eight.faces_per_run) == (1, 8, 64)
    nine = sized_for_cameras(config(9), 9, "daemon").inference
    assert (nine.frames_in_flight_for(True), nine.max_batch) == (2, 18)
    assert sized_for_cameras(config(8, frames_in_flight=2), 8, "daemon").inference.max_batch == 16
    cpu = config(8, device="cpu", frame_path="graph")
    assert sized_for_cameras(cpu, 8, "daemon").inference.frames_in_flight_for(True) == 1
    assert sized_for_cameras(config(8, frame_path="opencv"), 8, "daemon").inference.frames_in_flight == 0
    assert plan_reload(config(8), config(9)).models


def _inference(**values: Any) -> Any:
    return AppConfig.model_validate({"cameras": [{"name": "a", "source": "demo"}], "inference": values}).inference


def test_groups_are_spread_over_the_gpus_round_robin() -> None:
    """inference.devices (issue 25 item 4), with fake GPU lists: every visible GPU by default, the listed ones
    otherwise (numbered within CUDA_VISIBLE_DEVICES), none on the CPU; a GPU that is not there is refused."""
    assert group_gpus(_inference(device="cuda", processes=5), 5, ["0", "1"]) == ["0", "1", "0", "1", "0"]
    assert group_gpus(_inference(device="cuda", processes=3, devices=[1]), 3, ["4", "6"]) == ["6", "6", "6"]
    assert group_gpus(_inference(device="cuda", processes=4, devices=[2, 0]), 4,
                      ["a", "b", "GPU-c"]) == ["GPU-c", "a", "GPU-c", "a"]
    assert group_gpus(_inference(device="cpu", processes=2), 2, ["0", "1"]) == [None, None]
    assert group_gpus(_inference(device="cuda", processes=2), 2, []) == [None, None]  # CUDA's default
    with pytest.raises(GroupStartError, match="GPU 2 does not exist"):
        group_gpus(_inference(device="cuda", processes=2, devices=[0, 2]), 2, ["0", "1"])
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5"}) == ["3", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    with pytest.raises(ValueError, match="distinct"):
        _inference(devices=[1, 1])


def test_a_group_process_sees_only_its_gpu(prepared_models: None, app_config: AppConfig) -> None:
    """The GPU given to a group is the only one CUDA sees in its process (CUDA_VISIBLE_DEVICES there, set before its
    models load): a real group process on the CPU, told GPU 7, reports it when ready."""
    import threading

    cams = [CameraConfig.model_validate({"name": "lobby", "source": str(clip()), "fps": 5})]
    group = CameraGroup(1, app_config, cams, GroupHandlers(lambda _obs: None, lambda _event: None), gpu="7")
    try:
        group.start()
        group.wait_ready(threading.Event())
        assert group.gpu_seen == "7"
    finally:
        stop_groups([group], 5.0)
