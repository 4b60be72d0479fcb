"""`bench`: each mode runs the real models on a real video and gives a table, JSON and, when asked, a PNG plot.

Only that the measurements are made and reported is tested here; their values are never thresholds (machines here
are noisy: figures live in BENCHMARKS.md). One bound that is not a speed: a paced clip cannot be read faster than
its own frame rate, whatever the measuring costs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import cv2
import pytest

from tests.conftest import ROOT, data_path, run_cli


def _png_size(path: Path) -> tuple[int, int]:
    image = cv2.imread(str(path))
    assert image is not None, f"{path} is not a readable image"
    return image.shape[1], image.shape[0]


def test_bench_engine_reports_every_batch_with_json_and_plot(prepared_models: None, tmp_path: Path) -> None:
    video = data_path("video", "woman2.mp4")
    out, plot = tmp_path / "engine.json", tmp_path / "engine.png"
    done = run_cli("bench", "engine", "--model", "emotion", "--device", "cpu", "--precision", "fp32",
                   "--batch", "1,8", "--seconds", "0.3", "--video", str(video), "--log-level", "warning",
                   "--json", str(out), "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert "items/s" in done.stdout and f"plot: {plot}" in done.stdout
    result = json.loads(out.read_text())
    assert [row["batch"] for row in result["rows"]] == [1, 8]
    assert all(row["items_per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0 for row in result["rows"])
    assert result["machine"]["cores"] >= 1
    width, height = _png_size(plot)
    assert width > height > 200  # two panels side by side


def test_bench_pipeline_compares_both_designs_in_one_run(prepared_models: None, tmp_path: Path) -> None:
    video = data_path("video", "woman2.mp4")
    out, plot = tmp_path / "pipeline.json", tmp_path / "pipeline.png"
    done = run_cli("bench", "pipeline", "--video", str(video), "--cameras", "2", "--fps", "10", "--duration", "2",
                   "--mode", "both", "--log-level", "warning", "--json", str(out), "--plot", str(plot), timeout=240)
    assert done.returncode == 0, done.stderr
    assert "batched / naive" in done.stdout
    result = json.loads(out.read_text())
    assert [r["mode"] for r in result["results"]] == ["batched", "naive"]
    assert "ratio_analysed_batched_over_naive" in result
    for run in result["results"]:
        assert run["fps_in_per_camera"] > 0 and run["analysed_per_s"] > 0
        assert set(run["stage_ms"]) == {"detect", "crop", "emotion", "other"}
        assert run["latency_ms"]["p99"] >= run["latency_ms"]["p50"] > 0
        assert run["threads"] > 2 and run["peak_rss_mb"] > 0
        assert run["cores_by_thread"]["reader-camN"] > 0  # both cameras' decoding, folded into one role
    assert "cores by thread: " in done.stdout
    assert result["results"][1]["batching"]["detector"]["mean_batch"] == 1.0  # naive: never batched
    _png_size(plot)


def test_bench_pipeline_counts_frames_over_the_time_it_counted_them(prepared_models: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One process's frames read and analysed are divided by the time between their counts, not by the recorded
    window alone. Reading every thread's CPU from /proc took seconds in one process of 64 GIL-bound cameras (round 24:
    37 frames read a second per camera of a 25 fps clip); here each reading is made to take 1.5 s (the only stand-in:
    contention that cannot be had on 2 cores), and the paced 29.97 fps clip must still read at most its own rate."""
    import argparse

    from pipeline.tools import bench_pipeline

    real = bench_pipeline.cpu_by_role

    def slow_cpu_by_role() -> dict[str, float]:
        readings = real()
        time.sleep(1.5)
        return readings

    monkeypatch.setattr(bench_pipeline, "cpu_by_role", slow_cpu_by_role)
    parser = argparse.ArgumentParser()
    bench_pipeline.add_pipeline_args(parser)
    args = parser.parse_args(["--video", str(data_path("video", "woman2.mp4")), "--cameras", "2", "--fps", "30",
                              "--duration", "2", "--mode", "batched", "--detector-input", "320x192",
                              "--config", str(ROOT / "config" / "default.yaml")])
    run = bench_pipeline.run_mode(args, naive=False)
    assert 0 < run["fps_in_per_camera"] <= 29.97 * 1.15, run["fps_in_per_camera"]
    assert run["fps_analysed_per_camera"] <= run["fps_in_per_camera"] + 0.5, run  # analysed frames were read ones


def test_bench_pipeline_with_camera_group_processes(prepared_models: None, tmp_path: Path) -> None:
    """--processes 2: the cameras in two camera group processes, as the daemon runs them; the figures are summed
    over this process and the groups (their CPU and memory count) and taken from the observations that came back."""
    video = data_path("video", "woman2.mp4")
    out = tmp_path / "groups.json"
    done = run_cli("bench", "pipeline", "--video", str(video), "--cameras", "2", "--fps", "10", "--duration", "2",
                   "--mode", "batched", "--processes", "2", "--detector-input", "320x192", "--log-level", "warning",
                   "--json", str(out), timeout=240)
    assert done.returncode == 0, done.stderr
    run = json.loads(out.read_text())["results"][0]
    assert run["processes"] == 2 and run["mode"] == "batched"
    assert run["fps_in_per_camera"] > 0 and run["analysed_per_s"] > 0
    assert set(run["stage_ms"]) == {"detect", "crop", "emotion", "other"}
    assert run["latency_ms"]["p99"] >= run["latency_ms"]["p50"] > 0
    assert run["batching"]["detector"]["mean_batch"] > 0 and run["batching"]["emotion"]["mean_batch"] > 0
    assert run["cpu_percent"] > 0 and run["peak_rss_mb"] > 300  # three interpreters with models, not one
    by_process = run["host_memory"]["processes"]  # the daemon's side and each group, adding up to the sums
    assert set(by_process) == {"daemon", "group 1", "group 2"}
    assert abs(sum(m["rss_mb"] for m in by_process.values()) - run["host_memory"]["rss_mb"]) < 1.0
    assert all(m["rss_mb"] >= m["anon_mb"] > 0 for m in by_process.values())
    # the groups' threads, read from /proc by the kernel names they give themselves (core.threads)
    roles = run["cores_by_thread"]
    assert roles["reader-camN"] > 0 and "worker-camN" in roles and any(r.startswith("lane-") for r in roles), roles


def test_bench_memory_steps_add_up_on_the_cpu(tmp_path: Path) -> None:
    """bench memory on the CPU (no context, no frame graphs): each step's host readings, their differences adding up
    to the last reading, and resident memory split into anonymous and shared, and by what is mapped."""
    video = data_path("video", "woman2.mp4")
    out = tmp_path / "memory.json"
    done = run_cli("bench", "memory", "--video", str(video), "--cameras", "2", "--fps", "10", "--duration", "2",
                   "--settle-s", "1", "--log-level", "warning", "--json", str(out), timeout=240)
    assert done.returncode == 0, done.stderr
    assert "shmem MB" in done.stdout
    steps = json.loads(out.read_text())["steps"]
    assert [s["step"] for s in steps][:3] == ["start", "CUDA context", "models loaded"]
    assert [s["step"] for s in steps][3:] == ["models warmed", "heap trimmed", "cameras decoding", "analysing (peak)",
                                              "heap trimmed"]
    assert "frames analysed" in steps[-2]["note"]
    # what the daemon's periodic trim gives back, read where the models were just warmed (no other thread runs)
    assert steps[4]["rss_delta_mb"] <= 0.5 and "MB of freed heap given back" in steps[4]["note"]
    grown = sum(s["rss_delta_mb"] for s in steps[1:])
    assert abs(steps[0]["rss_mb"] + grown - steps[-1]["rss_mb"]) < 1.0
    assert all(s["rss_mb"] >= s["anon_mb"] + s["shmem_mb"] - 0.2 for s in steps)  # each rounded to 0.1
    assert steps[2]["rss_delta_mb"] > 20  # ONNX Runtime and the models
    # resident memory by what is mapped (smaps) adds up to the RSS, and ONNX Runtime's library shows under libraries
    assert all(abs(sum(s["by_mapping_mb"].values()) - s["rss_mb"]) < 5.0 for s in steps), steps
    assert steps[2]["by_mapping_mb"]["libraries"] > steps[1]["by_mapping_mb"]["libraries"] + 10
    assert "resident MB by mapping" in done.stdout
    # the project's own GPU buffers at each step: none on the CPU (the GPU tests read them on NVDEC cameras)
    nothing = {"frame_pools": 0.0, "lane_buffers": 0.0, "nvdec_output_est": 0.0}
    assert all(s["ours_mib"] == nothing for s in steps), steps


def test_bench_memory_reads_what_onnx_runtimes_arenas_grew_by(tmp_path: Path) -> None:
    """--arena-log: ONNX Runtime's own log of its arenas, split by step. On the CPU the sessions' CPU arena grows when
    the models are first run; the daemon's quiet stderr comes back afterwards (the CLI's own lines still print)."""
    video = data_path("video", "woman2.mp4")
    out, log = tmp_path / "memory.json", tmp_path / "ort.log"
    done = run_cli("bench", "memory", "--video", str(video), "--cameras", "1", "--fps", "10", "--duration", "1",
                   "--settle-s", "0.5", "--log-level", "warning", "--json", str(out), "--arena-log", str(log),
                   timeout=240)
    assert done.returncode == 0, done.stderr
    steps = {s["step"]: s for s in json.loads(out.read_text())["steps"]}
    warmed = steps["models warmed"]["arena"]["Cpu"]
    assert warmed["extensions"] >= 1 and warmed["extended_mib"] > 0 and warmed["largest_requests_mib"]
    assert "Extended allocation by" in log.read_text()
    assert "ONNX Runtime's arenas grown" in done.stdout
    assert "Extended allocation" not in done.stderr  # ONNX Runtime's INFO lines stayed in the file


@pytest.mark.parametrize("mode_args", [["capture", "--seconds", "1"]])
def test_plot_that_cannot_be_written_keeps_the_json(tmp_path: Path, mode_args: list[str]) -> None:
    """The figures are saved before the plot is drawn; a bad plot path is a clear error, exit 2."""
    video = data_path("video", "woman2.mp4")
    out, plot = tmp_path / "capture.json", tmp_path / "no-such-dir" / "capture.png"
    done = run_cli("bench", *mode_args, "--video", str(video), "--log-level", "warning", "--json", str(out),
                   "--plot", str(plot))
    assert done.returncode == 2
    assert "cannot write the plot" in done.stderr and "Traceback" not in done.stderr
    assert json.loads(out.read_text())["rows"][0]["fps_per_camera"] > 0


def test_gpu_utilisation_parsing_and_absence() -> None:
    """nvidia-smi's CSV answer becomes (GPU %, NVDEC %); without nvidia-smi the sampler reports nothing."""
    import shutil

    from pipeline.tools.gpu_sampler import GpuSampler, parse_utilisation

    assert parse_utilisation("37, 12\n") == (37.0, 12.0)
    assert parse_utilisation("[N/A], [N/A]\n") is None
    assert parse_utilisation("") is None
    from pipeline.tools.gpu_sampler import parse_per_gpu, summarise

    two = parse_per_gpu("90, 80, 30000\n70, 60, 20000\n")  # two GPUs (issue 28's per-GPU figures)
    assert two == [(90.0, 80.0, 30000.0), (70.0, 60.0, 20000.0)]
    figures = summarise([two, [(50.0, 40.0, 31000.0), (30.0, 20.0, 19000.0)]])
    assert figures["gpu_busy_pct"] == 60.0 and figures["nvdec_busy_pct"] == 50.0 and figures["samples"] == 2
    assert figures["per_gpu"] == [{"index": 0, "gpu_busy_pct": 70.0, "nvdec_busy_pct": 60.0, "memory_mb_max": 31000.0},
                                  {"index": 1, "gpu_busy_pct": 50.0, "nvdec_busy_pct": 40.0, "memory_mb_max": 20000.0}]
    assert parse_per_gpu("[N/A], 3, 4\n") is None
    if shutil.which("nvidia-smi") is None:
        sampler = GpuSampler(period_s=0.01)
        sampler.start()
        assert sampler.finish() is None


def test_one_bench_process_is_sized_as_the_daemon_sizes_its_own(tmp_path: Path) -> None:
    """bench pipeline / bench memory in one process measure what the daemon would run for as many cameras: on the GPU
    frame graphs path 8 cameras get one frame in flight each and batches of at most 8 (InferenceConfig.for_cameras);
    an explicit frames_in_flight is kept, camera groups size themselves, the naive design is left alone."""
    from pipeline.tools.bench_pipeline import bench_config
    from pipeline.tools.cli import build_parser

    def config(*extra: str, naive: bool = False) -> Any:
        args = build_parser().parse_args(["bench", "pipeline", "--video", "demo", "--device", "cuda",
                                          "--max-batch", "64", *extra])
        return bench_config(args, naive=naive).inference

    eight = config("--cameras", "8")
    assert (eight.frames_in_flight_for(True), eight.max_batch) == (1, 8)
    assert config("--cameras", "8", "--frames-in-flight", "2").max_batch == 16
    assert config("--cameras", "40").max_batch == 64
    assert config("--cameras", "8", "--processes", "2").max_batch == 64  # each group sizes itself
    assert config("--cameras", "8", naive=True).max_batch == 1


@pytest.mark.parametrize(("setting", "message"), [
    ("tracking", "write SECTION.KEY=VALUE"),
    ("tracking.nokey=1", "tracking.nokey: Extra inputs are not permitted"),
    ("nosection.key=1", "'nosection' is not a section"),
    ("tracking.max_age_s=[1", "the value is not YAML"),
])
def test_a_bad_set_is_named_before_anything_runs(setting: str, message: str) -> None:
    """`bench pipeline` and `bench interval` read --set alike: a malformed or invalid one is named, exit 2, no
    traceback, before a model is loaded or a video opened (the video named here does not exist)."""
    for mode in ("pipeline", "interval"):
        done = run_cli("bench", mode, "--video", "no-such.mp4", "--set", setting, timeout=60)
        assert done.returncode == 2, (mode, done.stderr[-1000:])
        assert message in done.stderr and "Traceback" not in done.stderr, (mode, done.stderr[-1000:])


def test_bench_interval_applies_set_to_the_tracking_it_measures(prepared_models: None, tmp_path: Path) -> None:
    """--set reaches the trackers `bench interval` compares: without smoothing the smoothed agreement is the raw one
    (read from --json: the printed table's columns move as figures are added); a list of intervals gives a row for
    each, printed and written; the file names the command and settings that made it."""
    video, out = data_path("video", "woman_short.mp4"), tmp_path / "interval.json"
    done = run_cli("bench", "interval", "--video", str(video), "--set", "tracking.smoothing_half_life_ms=0",
                   "--interval", "2,4", "--log-level", "warning", "--json", str(out), timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line.split()[:2] for line in done.stdout.strip().splitlines()[-2:]]
    assert printed == [["woman_short.mp4", "2"], ["woman_short.mp4", "4"]], done.stdout
    result = json.loads(out.read_text())
    assert result["overrides"] == ["tracking.smoothing_half_life_ms=0"], result
    assert result["command"][:3] == ["run_pipeline.py", "bench", "interval"], result["command"]
    assert "tracking.smoothing_half_life_ms=0" in result["command"], result["command"]
    rows = result["rows"]
    assert [row["interval"] for row in rows] == [2, 4], rows
    assert all(row["smoothed_agreement"] == row["emotion_agreement"] for row in rows), rows
    assert all(row["follow_ms_per_face"] > 0 for row in rows), rows


def test_bench_interval_names_a_bad_interval() -> None:
    """1 is the reference itself, so `--interval` takes 2 or more: exit 2 with the value named, no traceback."""
    done = run_cli("bench", "interval", "--video", "clip.mp4", "--interval", "3,1", timeout=60)
    assert done.returncode == 2 and "'3,1': give whole numbers of 2 or more" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_bench_interval_measures_the_follow_graphs_on_the_cpu(prepared_models: None, tmp_path: Path) -> None:
    """`--follower graph` follows by the follow graphs (the search the CUDA lanes run), here on the CPU, sampled as
    `--supersample` says; the table and the JSON say which; --supersample alone is refused, exit 2."""
    video, out = data_path("video", "woman_short.mp4"), tmp_path / "graph.json"
    done = run_cli("bench", "interval", "--video", str(video), "--follower", "graph", "--supersample", "2",
                   "--log-level", "warning", "--json", str(out), timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "look follower graph" in done.stdout, done.stdout
    result = json.loads(out.read_text())
    assert result["follower"] == "graph" and result["supersample"] == 2, result
    (row,) = result["rows"]
    assert row["compared"] > 0 and row["iou_min"] >= 0.8, row
    refused = run_cli("bench", "interval", "--video", str(video), "--supersample", "2", timeout=60)
    assert refused.returncode == 2 and "with --follower graph" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
