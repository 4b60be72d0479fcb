"""`check-config` on configs that are valid but cannot start on this machine (issue 12, item 6).

The quick check (the default, run by the unit before every start) opens nothing and warns, exit 0; `--probe` opens
each camera once and loads each model as configured, and every failure is a `FILE: key: reason` line and exit 2.
Everything here is real: the command line as an operator runs it, real files, a real TCP listener that refuses or
never answers, the real prepared models.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.inference.settings import EmotionConfig
from tests.conftest import run_cli
from tests.running_daemon import clip

SECRET = "pr0be-S3cret"

EMOTION = EmotionConfig().model  # the default emotion model, which these configs leave as it is


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _has_cuda_provider() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def _int8_prepared() -> bool:
    from pipeline.modelprep.manifest import load_manifest

    return load_manifest(EMOTION).file_for("int8").exists()


@pytest.fixture
def unstartable(tmp_path: Path) -> Path:
    """Valid YAML that cannot start here: a missing video, /dev/video57, cuda without its provider, int8 unprepared."""
    if Path("/dev/video57").exists():
        pytest.skip("this machine has a /dev/video57")
    path = tmp_path / "site.yaml"
    path.write_text("cameras:\n"
                    f"  - {{name: lobby, source: '{tmp_path / 'missing.mp4'}'}}\n"
                    "  - {name: kiosk, source: /dev/video57}\n"
                    "  - {name: demo, source: demo}\n"
                    "inference: {device: cuda, precision: int8}\n"
                    "server: {enabled: false}\n")
    return path


def test_quick_check_warns_about_what_is_missing_here_and_stays_valid(unstartable: Path, tmp_path: Path) -> None:
    done = run_cli("check-config", str(unstartable), timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{unstartable}: valid" in done.stdout
    lines = done.stderr.splitlines()
    assert f"{unstartable}: warning: cameras[0].source: video file {tmp_path / 'missing.mp4'} not found; " \
           "the daemon would keep retrying it" in lines, done.stderr
    assert any(line.startswith(f"{unstartable}: warning: cameras[1].source: /dev/video57 does not exist")
               for line in lines), done.stderr
    assert not any("cameras[2]" in line for line in lines), done.stderr  # the demo camera is fine
    if not _has_cuda_provider():
        assert any(line.startswith(f"{unstartable}: warning: inference.device: cuda needs CUDAExecutionProvider")
                   for line in lines), done.stderr
    if not _int8_prepared():
        assert any(line.startswith(f"{unstartable}: warning: inference.precision: ") and
                   f"{EMOTION}.int8.onnx does not exist" in line and "--calib" in line
                   for line in lines), done.stderr
    assert "Traceback" not in done.stderr


def test_probe_reports_each_failure_by_key_and_exits_2(unstartable: Path, tmp_path: Path) -> None:
    done = run_cli("check-config", "--probe", "--timeout", "20", str(unstartable), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert f"{unstartable}: cameras[0].source: video file {tmp_path / 'missing.mp4'} not found" in lines, done.stderr
    assert f"{unstartable}: cameras[1].source: /dev/video57 does not exist (camera unplugged?)" in lines, done.stderr
    assert any(line.startswith(f"{unstartable}: cameras[2].source: opened, read a frame: demo")
               for line in done.stdout.splitlines()), done.stdout
    if not _has_cuda_provider():
        assert any(line.startswith(f"{unstartable}: inference.device: cuda needs CUDAExecutionProvider")
                   for line in lines), done.stderr
    if not _int8_prepared():
        assert any(line.startswith(f"{unstartable}: inference.precision: ") and
                   f"{EMOTION}.int8.onnx does not exist" in line for line in lines), done.stderr
    assert "Traceback" not in done.stderr


def test_probe_opens_good_sources_and_loads_the_models(prepared_models: None, tmp_path: Path) -> None:
    config = tmp_path / "good.yaml"
    config.write_text("cameras:\n"
                      f"  - {{name: lobby, source: '{clip()}'}}\n"
                      "  - {name: demo, source: demo}\n"
                      "  - {name: spare, source: /dev/video57, enabled: false}\n"  # disabled: neither opened nor warned
                      "server: {enabled: false}\n")
    done = run_cli("check-config", "--probe", str(config), timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert any(line.startswith(f"{config}: cameras[0].source: opened, read a frame: file woman_short.mp4")
               for line in out), done.stdout
    assert any(line.startswith(f"{config}: cameras[1].source: opened, read a frame: demo") for line in out)
    assert not any("cameras[2]" in line for line in out + done.stderr.splitlines())
    for role, model in (("detector", "retinaface_mnet025"), ("emotion", EMOTION)):
        assert any(line.startswith(f"{config}: {role}.model: {model} loads: backend onnxruntime, device cpu, "
                                   "precision fp32") for line in out), done.stdout
    assert f"{config}: probe: every camera and model opened" in out


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a camera whose stream hangs)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


def test_probe_names_a_corrupt_file_and_a_refused_stream_without_its_password(prepared_models: None,
                                                                              tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"this is not a video" * 100)
    refused = f"rtsp://viewer:{SECRET}@127.0.0.1:{_closed_port()}/stream1"
    config = tmp_path / "site.yaml"
    config.write_text("cameras:\n"
                      f"  - {{name: corrupt, source: '{corrupt}'}}\n"
                      f"  - {{name: refused, source: '{refused}'}}\n"
                      "server: {enabled: false}\n")
    done = run_cli("check-config", "--probe", "--timeout", "60", str(config), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert f"{config}: cameras[0].source: cannot open video file {corrupt} (unsupported format or corrupt)" in lines, \
        done.stderr
    assert any(line.startswith(f"{config}: cameras[1].source: cannot connect to rtsp://viewer:***@127.0.0.1:")
               for line in lines), done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    # cameras the daemon could not open are retried, not fatal: the summary says so and nothing more
    assert lines[-1] == f"{config}: probe: 2 camera(s) it could not open (the daemon would start and keep retrying " \
                        "them)", done.stderr


def test_probe_fails_a_server_port_in_use(prepared_models: None, tmp_path: Path) -> None:
    """Issue 26: the daemon exits 1 when its status port is taken; --probe now says so first (exit 2)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = int(taken.getsockname()[1])
        config = tmp_path / "site.yaml"
        config.write_text(f"cameras:\n  - {{name: lobby, source: '{clip()}'}}\nserver: {{port: {port}}}\n")
        done = run_cli("check-config", "--probe", str(config), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{config}: server.port: cannot listen on 127.0.0.1:{port}: in use (another instance running? change " \
           f"server.port); the daemon would exit 1" in done.stderr.splitlines(), done.stderr
    assert done.stderr.splitlines()[-1] == f"{config}: probe: 1 problem(s) that would stop the daemon here"


def test_probe_gives_up_on_a_stream_that_never_answers(prepared_models: None, tmp_path: Path,
                                                       silent_server: int) -> None:
    silent = f"http://viewer:{SECRET}@127.0.0.1:{silent_server}/video.mjpg"
    config = tmp_path / "site.yaml"
    config.write_text(f"cameras:\n  - {{name: silent, source: '{silent}'}}\n  - {{name: demo, source: demo}}\n"
                      "server: {enabled: false}\n")
    # The server accepts and never answers, so FFmpeg would wait for its own 10 s open time-out: the 3 s of --timeout
    # come first, and the camera is named as not answering (the other camera and the models are still checked).
    done = run_cli("check-config", "--probe", "--timeout", "3", str(config), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{config}: cameras[0].source: no answer within 3 s (neither refused nor delivering a frame)" in \
        done.stderr.splitlines(), done.stderr
    assert any(line.startswith(f"{config}: cameras[1].source: opened, read a frame: demo")
               for line in done.stdout.splitlines()), done.stdout
    assert any(line.startswith(f"{config}: emotion.model: {EMOTION} loads")
               for line in done.stdout.splitlines()), done.stdout
    assert SECRET not in done.stdout + done.stderr


def test_camera_groups_on_a_gpu_without_mps_are_warned_about(tmp_path: Path) -> None:
    """inference.processes > 1 on a GPU time-slices it without NVIDIA's MPS (measured: no more frames than one
    process): check-config says so until MPS's control pipe exists in its pipe directory. On the CPU, no warning."""
    import os

    config = tmp_path / "groups.yaml"
    config.write_text("cameras:\n  - {name: demo, source: demo}\n  - {name: demo2, source: demo}\n"
                      "inference: {device: cuda, processes: 2}\nserver: {enabled: false}\n")
    pipes = tmp_path / "mps"
    pipes.mkdir()
    without = run_cli("check-config", str(config), env={"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}, timeout=60)
    assert without.returncode == 0, without.stderr
    assert any(line.startswith(f"{config}: warning: inference.processes: 2 camera groups on cuda without NVIDIA "
                               f"MPS (no {pipes / 'control'})") and "nvidia-mps.service" in line
               for line in without.stderr.splitlines()), without.stderr
    os.mkfifo(pipes / "control")  # what nvidia-cuda-mps-control -d creates
    running = run_cli("check-config", str(config), env={"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}, timeout=60)
    assert running.returncode == 0 and "inference.processes" not in running.stderr, running.stderr
    config.write_text(config.read_text().replace("device: cuda", "device: cpu"))
    on_cpu = run_cli("check-config", str(config), env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")},
                     timeout=60)
    assert on_cpu.returncode == 0 and "inference.processes" not in on_cpu.stderr, on_cpu.stderr


def test_more_cameras_than_one_process_keeps_up_with_on_a_gpu_are_advised(tmp_path: Path) -> None:
    """Past 32 enabled cameras per process on a GPU, check-config suggests camera groups (measured on an H200: 64
    cameras of 1080p in one process 47-68 % analysed, as 2 groups under MPS 99.9 %); the count follows the
    cameras that are enabled, and the CPU gets no such advice."""
    cameras = "".join(f"  - {{name: cam{i}, source: demo{', enabled: false' if i >= 40 else ''}}}\n"
                      for i in range(41))
    config = tmp_path / "many.yaml"
    config.write_text(f"cameras:\n{cameras}inference: {{device: cuda}}\nserver: {{enabled: false}}\n")
    done = run_cli("check-config", str(config), timeout=60)
    assert done.returncode == 0, done.stderr
    advice = [line for line in done.stderr.splitlines() if "warning: inference.processes: 40 cameras in 1" in line]
    assert advice and "consider processes: 2 with MPS running" in advice[0], done.stderr
    config.write_text(config.read_text().replace("{device: cuda}", "{device: cuda, processes: 2}"))
    grouped = run_cli("check-config", str(config), env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}, timeout=60)
    assert "cameras in 2 process(es)" not in grouped.stderr, grouped.stderr
    config.write_text(config.read_text().replace("{device: cuda, processes: 2}", "{device: cpu}"))
    on_cpu = run_cli("check-config", str(config), timeout=60)
    assert on_cpu.returncode == 0 and "inference.processes" not in on_cpu.stderr, on_cpu.stderr


def test_the_detector_on_every_frame_of_too_many_cameras_a_gpu_is_advised(tmp_path: Path) -> None:
    """Past 64 enabled cameras a GPU with detector.interval 1, check-config suggests interval 3 (measured on an
    H200: 96 cameras at interval 1 78 % analysed, 150 at interval 3 every frame); counted over the GPUs the camera
    groups spread over (CUDA_VISIBLE_DEVICES here), and not on the CPU or at interval 3."""
    cameras = "".join(f"  - {{name: cam{i}, source: demo{', enabled: false' if i >= 70 else ''}}}\n"
                      for i in range(72))
    config = tmp_path / "many.yaml"
    config.write_text(f"cameras:\n{cameras}inference: {{device: cuda, processes: 3}}\nserver: {{enabled: false}}\n")
    pipes = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}

    def advice(env: dict[str, str]) -> list[str]:
        done = run_cli("check-config", str(config), env={**pipes, **env}, timeout=60)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stderr.splitlines() if "warning: detector.interval:" in line]

    one_gpu = advice({"CUDA_VISIBLE_DEVICES": "0"})
    assert one_gpu and "70 cameras on 1 GPU(s), 70 a GPU" in one_gpu[0] and "consider interval: 3" in one_gpu[0]
    assert not advice({"CUDA_VISIBLE_DEVICES": "0,1"})  # 35 a GPU
    config.write_text(config.read_text().replace("server:", "detector: {interval: 3}\nserver:"))
    assert not advice({"CUDA_VISIBLE_DEVICES": "0"})
    config.write_text(config.read_text().replace("device: cuda", "device: cpu"))
    config.write_text(config.read_text().replace("detector: {interval: 3}\n", ""))
    assert not advice({"CUDA_VISIBLE_DEVICES": "0"})


def test_many_cameras_a_gpu_on_frame_graphs_launched_node_by_node_are_advised_cuda_graphs(tmp_path: Path) -> None:
    """Past 96 enabled cameras a GPU on the frame graphs path with inference.cuda_graphs off, check-config suggests
    it (at 150 cameras the lanes took 2.6-2.8 cores that way, 1.2-1.3 replayed; BENCHMARKS.md round 16); counted
    over the GPUs the groups spread over, and not with cuda_graphs on, on the OpenCV frame path or on the CPU."""
    cameras = "".join(f"  - {{name: cam{i}, source: demo{', enabled: false' if i >= 100 else ''}}}\n"
                      for i in range(104))
    config = tmp_path / "many.yaml"
    inference = "{device: cuda, processes: 4}"
    config.write_text(f"cameras:\n{cameras}detector: {{interval: 3}}\ninference: {inference}\n"
                      "server: {enabled: false}\n")

    def advice(env: dict[str, str]) -> list[str]:
        done = run_cli("check-config", str(config), env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path), **env},
                       timeout=60)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stderr.splitlines() if "warning: inference.cuda_graphs:" in line]

    one_gpu = advice({"CUDA_VISIBLE_DEVICES": "0"})
    assert one_gpu and "100 cameras on 1 GPU(s), 100 a GPU" in one_gpu[0], one_gpu
    assert "consider cuda_graphs: true" in one_gpu[0]
    assert not advice({"CUDA_VISIBLE_DEVICES": "0,1"})  # 50 a GPU
    for other in ("{device: cuda, processes: 4, cuda_graphs: true}", "{device: cuda, processes: 4, frame_path: opencv}",
                  "{device: cpu, processes: 4}"):
        config.write_text(config.read_text().replace(inference, other))
        inference = other
        assert not advice({"CUDA_VISIBLE_DEVICES": "0"}), other


def test_large_camera_processes_following_by_look_on_gpu_frames_are_advised(tmp_path: Path) -> None:
    """tracking.follow_by look on GPU frames for more than 16 enabled cameras a process: check-config says the
    batches' search limits it (an H100 analysed 81 % of 64 cameras in groups of 32 that way; BENCHMARKS.md
    round 19); not with 16 a process, with auto, every frame detected, the OpenCV frame path or on the CPU."""
    cameras = "".join(f"  - {{name: cam{i}, source: demo{', enabled: false' if i >= 64 else ''}}}\n"
                      for i in range(70))
    config = tmp_path / "look.yaml"
    settings = "detector: {interval: 3}\ntracking: {follow_by: look}\ninference: {device: cuda, processes: 2}\n"
    config.write_text(f"cameras:\n{cameras}{settings}server: {{enabled: false}}\n")

    def advice() -> list[str]:
        done = run_cli("check-config", str(config), env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path),
                                                         "CUDA_VISIBLE_DEVICES": "0"}, timeout=60)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stderr.splitlines() if "warning: tracking.follow_by:" in line]

    (line,) = advice()
    assert "64 cameras in 2 process(es), 32 a process" in line and "consider follow_by: auto" in line, line
    for other in ("detector: {interval: 3}\ntracking: {follow_by: look}\ninference: {device: cuda, processes: 4}\n",
                  "detector: {interval: 3}\ntracking: {follow_by: auto}\ninference: {device: cuda, processes: 2}\n",
                  "detector: {interval: 1}\ntracking: {follow_by: look}\ninference: {device: cuda, processes: 2}\n",
                  "detector: {interval: 3}\ntracking: {follow_by: look}\n"
                  "inference: {device: cuda, processes: 2, frame_path: opencv}\n",
                  "detector: {interval: 3}\ntracking: {follow_by: look}\ninference: {device: cpu, processes: 2}\n"):
        config.write_text(config.read_text().replace(settings, other))
        settings = other
        assert not advice(), other
