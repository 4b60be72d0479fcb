"""`bench`: measurements, always side by side with their baseline in one run, on the machine named in the output.

Modes:
  analyze  — our `analyze` on a video vs the `fer` package (Haar + the same mini-Xception) in its own venv.
  capture  — CPU cost of capture alone (decode + pacing), per camera, for N cameras replaying a file in real time.
  engine   — one model alone per precision and batch size (bench_engine.py).
  pipeline — N cameras in real time, batched vs naive design, same run (bench_pipeline.py).
  soak     — the daemon's resident memory over a long run with periodic camera reconnects (bench_soak.py).
  interval — detecting every Nth frame against every frame: box IoU, emotion agreement, CPU (bench_interval.py).
  memory   — where one camera group's GPU and host memory go, step by step (bench_memory.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
FER_SCRIPT = Path(__file__).resolve().parent / "bench_fer_baseline.py"


EXAMPLES = {
    "analyze": """examples:
  run_pipeline.py bench analyze --video ../shared/data/video/woman2.mp4 --repeat 3 --json bench-analyze.json
  run_pipeline.py bench analyze --video clip.mp4 --detector-input auto   # as plain `analyze` runs by default""",
    "capture": """examples:
  run_pipeline.py bench capture --video clip.mp4 --cameras 8 --seconds 10
  run_pipeline.py bench capture --video a.mp4 --video b.mp4 --json capture.json --plot capture.png""",
    "engine": """examples:
  run_pipeline.py bench engine --model emotion --batch 1,8,32 --seconds 2
  run_pipeline.py bench engine --model detector --device cuda --precision fp32,fp16 --detector-input 640x352""",
    "pipeline": """examples:
  run_pipeline.py bench pipeline                          # 4 demo cameras, batched vs naive, 20 s each
  run_pipeline.py bench pipeline --video clip.mp4 --cameras 8 --fps 15 --detector-input 320x256 --plot p.png""",
    "interval": """examples:
  run_pipeline.py bench interval --video ../shared/data/video/woman2.mp4 --video ../shared/data/video/group_1080p.mp4
  run_pipeline.py bench interval --video clip.mp4 --interval 5 --json interval.json
  run_pipeline.py bench interval --video ../shared/data/video/group_1080p.mp4 --interval 2,3,4,6""",
    "memory": """examples:
  run_pipeline.py bench memory --video group_1080p.mp4 --cameras 8 --device cuda --precision fp16 --decode gpu
  run_pipeline.py bench memory --video clip.mp4 --cameras 32 --device cuda --set inference.cudnn_max_workspace=false""",
    "soak": """examples:
  run_pipeline.py bench soak --rtsp-server ../shared/data/video/group_1080p.mp4 --json soak.json   # 40 min, 4 cameras
  run_pipeline.py bench soak --rtsp-server clip.mp4 --duration-min 4 --reconnect-every-s 20 --warmup-min 1""",
}


COMMON_HELP = {
    "config": ("PATH", "YAML config for the models and inference settings (default: config/default.yaml)"),
    "json": ("FILE", "also write the results here"),
}


def add_bench_args(parser: argparse.ArgumentParser, parents: list[argparse.ArgumentParser]) -> None:
    modes = parser.add_subparsers(dest="bench_mode", metavar="MODE", required=True)

    def mode_parser(name: str, summary: str) -> argparse.ArgumentParser:
        return modes.add_parser(name, parents=parents, help=summary, description=summary, epilog=EXAMPLES[name],
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    analyze = mode_parser("analyze", "our `analyze` on a video vs the fer package (Haar + the same mini-Xception), "
                                     "alternating, in one run")
    analyze.add_argument("--video", type=Path, required=True, metavar="FILE", help="video file to analyse (every frame)")
    analyze.add_argument("--config", type=Path, default=PROJECT_ROOT / "config" / "default.yaml", metavar="PATH",
                         help="YAML config whose models and inference settings are used (default: "
                              "config/default.yaml)")
    analyze.add_argument("--fer-python", type=Path, default=Path("/opt/fer-venv/bin/python"), metavar="PYTHON",
                         help="interpreter of a venv with tensorflow-cpu and fer==25.10.3 (skip fer if absent)")
    analyze.add_argument("--detector-input", default="320x192", metavar="WxH|auto",
                         help="our detector input size (default 320x192: fits 16:9 video at 320 px wide, the size "
                              "BENCHMARKS.md's comparison with fer used; plain `analyze` uses the config's "
                              "detector.input_size instead, auto by default: both are printed, with the size "
                              "each run used)")
    analyze.add_argument("--repeat", type=int, default=2, help="alternate the two tools this many times each")
    analyze.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")

    capture = mode_parser("capture", "CPU cost of capture per camera (decode and pacing, no inference)")
    capture.add_argument("--video", type=Path, action="append", required=True, metavar="FILE",
                         help="video file each camera replays in real time; repeatable")
    capture.add_argument("--cameras", type=int, default=1, help="cameras replaying each video at once")
    capture.add_argument("--seconds", type=float, default=10.0, help="seconds measured per video")
    capture.add_argument("--decode", choices=["cpu", "gpu"], default="cpu",
                         help="decode on the CPU (FFmpeg) or on the GPU's NVDEC (PyNvVideoCodec, camera key decode)")
    capture.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")

    from pipeline.tools.bench_engine import add_engine_args
    from pipeline.tools.bench_pipeline import add_pipeline_args
    from pipeline.tools.bench_soak import add_soak_args

    add_engine_args(mode_parser("engine", "one model alone: throughput and latency per precision and batch size"))
    add_pipeline_args(mode_parser("pipeline", "N cameras in real time: the batched design vs a naive one, same run"))
    for mode in modes.choices.values():
        mode.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                          help="also draw the results into this PNG (matplotlib)")
        for action in mode._actions:  # options a mode's own module declares without a text get the common one
            if action.help is None and action.dest in COMMON_HELP:
                action.metavar, action.help = COMMON_HELP[action.dest]
    # soak is added after the loop: no --plot (its figures are a time series, in --json)
    add_soak_args(mode_parser("soak", "the daemon's resident memory over a long run in which every camera "
                                      "reconnects periodically"))
    from pipeline.tools.bench_interval import add_interval_args

    add_interval_args(mode_parser("interval", "the detector on every Nth frame, faces followed between: box IoU and "
                                              "emotion agreement against every frame, and CPU, in one run"))
    memory = mode_parser("memory", "where one camera group's GPU and host memory go: readings after each step of "
                                   "its start, then while it analyses")
    add_pipeline_args(memory)
    memory.add_argument("--settle-s", type=float, default=5.0,
                        help="seconds the cameras decode before the reading 'cameras decoding' (default 5)")
    memory.add_argument("--arena-log", type=Path, default=None, metavar="FILE",
                        help="write ONNX Runtime's log (at INFO; the process's stderr goes there meanwhile) into FILE "
                             "and add to each step what its memory arenas grew by, and for which requests")
    for action in [*modes.choices["interval"]._actions, *memory._actions]:
        if action.help is None and action.dest in COMMON_HELP:
            action.metavar, action.help = COMMON_HELP[action.dest]


def machine() -> dict[str, object]:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "host": platform.node()}


def _ours(video: Path, config: Path, detector_input: str) -> dict[str, object]:
    """Run our analyze as a subprocess (same conditions as the baseline) and read its summary line."""
    cmd = [sys.executable, str(PROJECT_ROOT / "run_pipeline.py"), "analyze", str(video), "--config", str(config),
           "--detector-input", detector_input, "--log-level", "warning"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=PROJECT_ROOT)
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("summary: ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"analyze failed: {done.stderr.strip()[-500:]}")
    summary = json.loads(lines[-1][len("summary: "):])
    return {"tool": "ours", "frames": summary["frames"], "faces": summary["faces"],
            "detector_input_used": summary.get("detector_input"),
            "fps": summary["per_second"], "per_stage_ms": summary["stage_ms_mean"], "emotions": summary["emotions"]}


def _fer(python: Path, video: Path) -> dict[str, object] | None:
    if not python.exists():
        log.warning("%s not found: skipping the fer baseline (see BENCHMARKS.md for how to make that venv)", python)
        return None
    done = subprocess.run([str(python), str(FER_SCRIPT), str(video)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fer baseline failed: {done.stderr.strip()[-500:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench_analyze(args: argparse.Namespace) -> dict[str, object]:
    runs: dict[str, list[dict[str, object]]] = {"ours": [], "fer": []}
    for _ in range(max(1, args.repeat)):  # alternate, so drift in machine load hits both tools alike
        runs["ours"].append(_ours(args.video, args.config, args.detector_input))
        fer = _fer(args.fer_python, args.video)
        if fer is not None:
            runs["fer"].append(fer)
    best = {tool: max(r, key=lambda x: float(x["fps"])) for tool, r in runs.items() if r}  # type: ignore[arg-type]
    result: dict[str, object] = {"mode": "analyze", "video": str(args.video), "machine": machine(), "runs": runs,
                                 "best": best, "detector_input": args.detector_input,
                                 "analyze_detector_input": _config_detector_input(args.config)}
    if "fer" in best:
        result["ratio_fps"] = round(float(best["ours"]["fps"]) / float(best["fer"]["fps"]), 2)  # type: ignore[arg-type]
    return result


def _config_detector_input(config: Path) -> str:
    """What plain `analyze` would use with this config (its detector.input_size), to print beside ours."""
    from pipeline.config.app import load_config

    return load_config(config).detector.describe_input()


def print_analyze_table(result: dict[str, object]) -> None:
    best: dict[str, dict[str, object]] = result["best"]  # type: ignore[assignment]
    used = best.get("ours", {}).get("detector_input_used")
    print(f"ours: detector input {result['detector_input']} (bench analyze --detector-input)"
          f"{f', used {used} for this video' if used and used != result['detector_input'] else ''}; plain "
          f"`analyze` uses the config's detector.input_size, {result.get('analyze_detector_input', '?')}")
    print(f"{'tool':6} {'frames':>7} {'faces':>6} {'fps':>8}  per-stage ms")
    for tool, r in best.items():
        stages = ", ".join(f"{k} {v}" for k, v in dict(r.get("per_stage_ms") or {}).items())  # type: ignore[call-overload]
        print(f"{tool:6} {r['frames']:>7} {r['faces']:>6} {float(r['fps']):>8.1f}  {stages}")  # type: ignore[arg-type]
    if "ratio_fps" in result:
        print(f"ours / fer frames per second: {result['ratio_fps']}x")


def bench_capture(args: argparse.Namespace) -> dict[str, object]:
    """Run capture threads only and read the process CPU time: the decode share of one camera."""
    import resource
    import threading

    from pipeline.capture.sources import open_source
    from pipeline.capture.thread import CaptureThread
    from pipeline.config.app import CameraConfig

    if args.decode == "gpu":
        import cv2

        cv2.setNumThreads(1)  # as the daemon does with its models on a GPU (service.parts.limit_opencv_threads)
    rows = []
    for video in args.video:
        stop = threading.Event()
        cams = [CaptureThread(CameraConfig(name=f"c{i}", source=str(video), loop=True, decode=args.decode), stop,
                              lambda _e: None, open_source) for i in range(args.cameras)]
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        for cam in cams:
            cam.start()
        time.sleep(args.seconds)
        stop.set()
        for cam in cams:
            cam.join(5)
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        frames = sum(cam.frames_in.total for cam in cams)
        rows.append({"video": video.name, "decode": args.decode, "cameras": args.cameras, "fps_per_camera": round(frames / wall / args.cameras, 1),
                     "cpu_percent_per_camera": round(100 * cpu / wall / args.cameras, 1),
                     "cpu_ms_per_frame": round(1000 * cpu / max(frames, 1), 2)})
    return {"mode": "capture", "machine": machine(), "rows": rows}


def print_capture_table(result: dict[str, object]) -> None:
    print(f"{'video':24} {'decode':>6} {'cams':>4} {'fps/cam':>8} {'CPU %/cam':>10} {'CPU ms/frame':>13}")
    for row in result["rows"]:  # type: ignore[attr-defined]
        print(f"{row['video']:24} {row.get('decode', 'cpu'):>6} {row['cameras']:>4} {row['fps_per_camera']:>8} {row['cpu_percent_per_camera']:>10}"
              f" {row['cpu_ms_per_frame']:>13}")


def run_bench(args: argparse.Namespace) -> int:
    from pipeline.tools.bench_engine import bench_engine, print_engine_table
    from pipeline.tools.bench_pipeline import bench_pipeline, print_pipeline_table
    from pipeline.tools.bench_interval import bench_interval, print_interval_table
    from pipeline.tools.bench_memory import bench_memory, print_memory_table
    from pipeline.tools.bench_soak import bench_soak, print_soak_table

    modes = {"interval": (bench_interval, print_interval_table), "memory": (bench_memory, print_memory_table),
             "analyze": (bench_analyze, print_analyze_table), "capture": (bench_capture, print_capture_table),
             "engine": (bench_engine, print_engine_table), "pipeline": (bench_pipeline, print_pipeline_table),
             "soak": (bench_soak, print_soak_table)}
    measure, show = modes[args.bench_mode]
    result = measure(args)
    result.setdefault("machine", machine())
    # the command as given, so that a results file says which settings made it: runs that differ by one --set
    # otherwise leave files that differ only in their figures
    result.setdefault("command", ["run_pipeline.py", *getattr(args, "argv", sys.argv[1:])])
    if getattr(args, "overrides", None):
        result.setdefault("overrides", list(args.overrides))
    show(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if getattr(args, "plot", None):  # last (soak has none): a plot that cannot be drawn loses none of the figures
        from pipeline.tools.bench_plot import PlotError, save_plot
        from pipeline.tools.usage import UsageError

        try:
            save_plot(result, args.plot)
        except PlotError as exc:
            raise UsageError(str(exc)) from exc
        print(f"plot: {args.plot}")
    return 0
