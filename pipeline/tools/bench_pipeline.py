"""`bench pipeline`: N cameras replaying a video in real time through capture → workers → shared models.

Two designs are measured in the same run:
  batched — the daemon's design: one detector and one classifier shared by all cameras, dynamic batching;
  naive   — the seed's design: one model pair per camera, one item at a time, no cross-camera batching.
Latency is capture → observation (what the behaviour stage receives), per analysed frame.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml
from pydantic import ValidationError

from pipeline.capture.nvdec import nvdec_problem
from pipeline.capture.sources import open_source
from pipeline.capture.thread import CaptureThread
from pipeline.config.app import AppConfig, CameraConfig, load_config
from pipeline.core.types import Observation
from pipeline.inference.frames import FramePerception
from pipeline.inference.perception import Analyzer, load_perception
from pipeline.modelprep.frame_graphs import FrameFormat
from pipeline.service.parts import limit_opencv_threads, new_tracker, prepare_gpu, sized_for_cameras
from pipeline.service.worker import CameraWorker
from pipeline.tools.bench_groups import (
    batch_figures,
    record_window,
    rss_mb_of,
    run_groups,
)
from pipeline.tools.gpu_sampler import gpu_memory_mb
from pipeline.tools.thread_cpu import cores_by_role, cpu_by_role
from pipeline.tools.usage import UsageError

WARMUP_S = 3.0


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--video", type=Path, default=Path("demo"), metavar="FILE|demo",
                        help="what every camera replays in real time (looped): a video file, or demo (default: the "
                             "built-in demo clip, 640x480 at 25 fps)")
    parser.add_argument("--cameras", type=int, default=4, help="cameras replaying the video at once (default 4)")
    parser.add_argument("--fps", type=float, default=15.0, help="analysed frames per second per camera, at most")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds measured per mode, after warm-up")
    parser.add_argument("--mode", choices=["batched", "naive", "both"], default="both",
                        help="which design to measure (default both, one after the other in this run)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="inference.device")
    parser.add_argument("--precision", choices=["fp32", "fp16", "int8"], default="fp32", help="inference.precision")
    parser.add_argument("--detector-input", default="auto", metavar="WxH|auto",
                        help="detector.input_size for this run (default auto: the video's aspect ratio, long side "
                             "640, e.g. 640x352 for 1080p; the config's value is not used); the size used is "
                             "printed")
    parser.add_argument("--max-batch", type=int, default=32, help="inference.max_batch (batched design)")
    parser.add_argument("--max-delay-ms", type=float, default=4.0, help="inference.max_delay_ms (batched design)")
    parser.add_argument("--lanes", type=int, default=1, help="inference.lanes (batched design)")
    parser.add_argument("--batch-step", type=int, default=2, help="CUDA: pad batches to powers of this")
    parser.add_argument("--frames-in-flight", type=int, default=0, metavar="N",
                        help="inference.frames_in_flight (batched design; 0 = auto: 2 on the GPU frame graphs "
                             "path, else 1); the naive design always analyses one frame at a time")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="inference.processes (batched design): the cameras in N camera group processes, each "
                             "with its own engine, observations sent back to this process as the daemon does; on one "
                             "GPU run NVIDIA MPS for it (deploy/nvidia-mps.service)")
    parser.add_argument("--frame-path", choices=["auto", "opencv", "graph"], default="auto",
                        help="inference.frame_path: letterbox, NMS and crops in OpenCV on the host, or in the frame "
                             "graphs (auto: graph on cuda)")
    parser.add_argument("--backend", choices=["onnxruntime", "triton"], default=None,
                        help="inference.backend (default: the config's); triton also needs --triton-url or the "
                             "config's inference.triton")
    parser.add_argument("--triton-url", default=None, metavar="HOST:PORT",
                        help="backend triton: the server's gRPC address (overrides inference.triton.url)")
    parser.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[2] / "config/default.yaml",
                        metavar="PATH", help="YAML config for the models and the settings not given here (default: "
                             "config/default.yaml; its cameras are replaced by --cameras copies of --video)")
    parser.add_argument("--decode-threads", type=int, default=1,
                        help="video decoder threads per camera (camera key decode_threads; 0 = FFmpeg's default)")
    parser.add_argument("--decode", choices=["auto", "cpu", "gpu"], default="auto",
                        help="where video is decoded (camera key decode; auto = NVDEC with --device cuda)")
    parser.add_argument("--capture-nice", type=int, default=0,
                        help="nice increment for capture and decoding (camera key nice)")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="Python's GIL switch interval for this run (default 5 ms), to measure GIL contention")
    parser.add_argument("--interval", default=None, metavar="N[,N...]",
                        help="detector.interval: detect every Nth frame (default: the config's); a list (1,3) runs "
                             "each in turn and reports the CPU per analysed frame of each against the first")
    add_set_arg(parser)
    parser.add_argument("--repeat", type=int, default=1, metavar="R",
                        help="run the whole list of intervals (and modes) R times, alternating (default 1)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")


def add_set_arg(parser: argparse.ArgumentParser) -> None:
    """`--set SECTION.KEY=VALUE` (repeatable) into args.overrides, applied by with_overrides."""
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="overrides",
                        help="override one config key for this run (value read as YAML), e.g. "
                             "--set inference.cudnn_max_workspace=false; repeatable")


def bench_config(args: argparse.Namespace, naive: bool, interval: int | None = None) -> AppConfig:
    """The run's settings: the config's, the command line's cameras and options, then --set. One process of the
    batched design is sized as the daemon sizes its own (service.parts.sized_for_cameras), so bench pipeline and
    bench memory measure what the daemon would run for as many cameras."""
    base = load_config(args.config)
    cameras = [CameraConfig(name=f"cam{i}", source=str(args.video), loop=True, fps=args.fps,
                            decode_threads=args.decode_threads, nice=args.capture_nice, decode=args.decode)
               for i in range(args.cameras)]
    inference = base.inference.model_copy(update={
        "device": args.device, "precision": args.precision,
        "max_batch": 1 if naive else args.max_batch, "max_delay_ms": 0.0 if naive else args.max_delay_ms,
        "lanes": 1 if naive else args.lanes, "batch_step": args.batch_step, "frame_path": args.frame_path,
        "frames_in_flight": 1 if naive else args.frames_in_flight,
        "processes": 1 if naive else args.processes,
        "backend": args.backend or base.inference.backend,
        "triton": base.inference.triton.model_copy(update={"url": args.triton_url or base.inference.triton.url})})
    detector = type(base.detector).model_validate(base.detector.model_dump() | {
        "input_size": _detector_input(args.detector_input), "interval": interval or base.detector.interval})
    cfg = base.model_copy(update={"cameras": cameras, "inference": inference, "detector": detector})
    cfg = with_overrides(cfg, args.overrides) if getattr(args, "overrides", None) else cfg
    if naive or cfg.inference.processes > 1:
        return cfg  # naive: each camera its own engine; camera groups size themselves (service.groups.run_group)
    return sized_for_cameras(cfg, len(cameras), "bench")  # one process, sized as the daemon sizes its own


def with_overrides(cfg: AppConfig, overrides: list[str]) -> AppConfig:
    """`cfg` with each SECTION.KEY=VALUE applied (the value read as YAML) and the whole validated again; a malformed
    or invalid --set is a UsageError naming it (the CLI prints it, exit 2)."""
    data = cfg.model_dump()
    for text in overrides:
        path, sep, value = text.partition("=")
        keys = [key.strip() for key in path.split(".") if key.strip()]
        if not sep or not keys:
            raise UsageError(f"--set {text!r}: write SECTION.KEY=VALUE, e.g. inference.max_batch=32")
        node = data
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                raise UsageError(f"--set {text!r}: {key!r} is not a section of the configuration")
            node = node[key]
        try:
            node[keys[-1]] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise UsageError(f"--set {text!r}: the value is not YAML ({exc.__class__.__name__})") from None
    try:
        return type(cfg).model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
                             for error in exc.errors())
        raise UsageError(f"--set {' '.join(overrides)}: {problems}") from None


def _detector_input(text: str) -> tuple[int, int] | str:
    """--detector-input: `auto` or WxH."""
    if text.strip().lower() == "auto":
        return "auto"
    width, height = (int(v) for v in text.lower().split("x"))
    return width, height


def _input_used(cfg: AppConfig, video: Path) -> str:
    """The detector input the cameras' frames get, for the table and the JSON: `640x352 for 1920x1080 frames`
    (the demo clip, whose size is not known before it plays: the setting only)."""
    fmt = video_format(video, nvdec=False)
    if fmt is None:
        return cfg.detector.describe_input()
    width, height = cfg.detector.input_for((fmt.width, fmt.height))
    return f"{width}x{height} for {fmt.width}x{fmt.height} frames"


class _Recorder:
    """Collects per-observation latency after the warm-up; thread-safe."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.stage_ms: dict[str, list[float]] = {}
        self.faces = 0
        self.recording = False
        self._lock = threading.Lock()

    def __call__(self, obs: Observation) -> None:
        if not self.recording:
            return
        latency = (time.monotonic() - obs.t_mono) * 1000.0
        with self._lock:
            self.latencies_ms.append(latency)
            self.faces += len(obs.faces)
            for stage, ms in obs.latency_ms.items():
                self.stage_ms.setdefault(stage, []).append(ms)
            # What the stages do not cover: the frame waiting for its worker, tracking, the hand-off.
            self.stage_ms.setdefault("other", []).append(latency - sum(obs.latency_ms.values()))


class _TritonWindow:
    """Triton's own batcher counters over the measured window (backend triton only): items ÷ model executions on
    the server shows how far its dynamic batcher merged what the daemon sent."""

    def __init__(self, cfg: AppConfig) -> None:
        self._models = [cfg.detector.model, cfg.emotion.model] if cfg.inference.backend == "triton" else []
        self._settings = cfg.inference.triton
        self._start: dict[str, dict[str, int]] = {}

    def _read(self) -> dict[str, dict[str, int]]:
        if not self._models:
            return {}
        from pipeline.inference.triton import batcher_statistics

        return batcher_statistics(self._settings, self._models)

    def open(self) -> None:
        self._start = self._read()

    def close(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for model, end in self._read().items():
            start = self._start.get(model, {"inference_count": 0, "execution_count": 0, "request_count": 0})
            items = end["inference_count"] - start["inference_count"]
            runs = end["execution_count"] - start["execution_count"]
            requests = end["request_count"] - start["request_count"]
            out[model] = {"items": items, "requests": requests, "executions": runs,
                          "items_per_execution": round(items / max(runs, 1), 2),
                          "requests_per_execution": round(requests / max(runs, 1), 2)}
        return out


def run_mode(args: argparse.Namespace, naive: bool, interval: int | None = None) -> dict[str, Any]:
    cfg = bench_config(args, naive, interval)
    if cfg.inference.processes > 1:
        return _run_grouped(args, cfg)
    triton = _TritonWindow(cfg)
    prepare_gpu(cfg)  # as the daemon does, before the models load
    shared = None if naive else load_perception(cfg)
    perceptions = [load_perception(cfg) for _ in cfg.cameras] if naive else [shared] * len(cfg.cameras)
    unique = list({id(p): p for p in perceptions}.values())
    gpu_active = cfg.inference.device != "cpu"
    device_frames = cfg.inference.graph_frames and cfg.inference.device == "cuda"
    for perception in unique:
        perception.warm_up()  # type: ignore[union-attr]
        fmt = video_format(args.video, device_frames and cfg.cameras[0].decode != "cpu")
        if isinstance(perception, FramePerception) and fmt is not None:
            perception.prepare(fmt)
    stop, recorder = threading.Event(), _Recorder()
    limit_opencv_threads(cfg)  # as the daemon does
    captures = [CaptureThread(cam, stop, lambda _e: None,
                              lambda c: open_source(c, gpu_active=gpu_active, device_frames=device_frames))
                for cam in cfg.cameras]
    workers = [CameraWorker(capture, perception, new_tracker(cfg), recorder, stop)  # type: ignore[arg-type]
               for capture, perception, cam in zip(captures, perceptions, cfg.cameras)]
    for thread in [*captures, *workers]:
        thread.start()
    time.sleep(WARMUP_S)
    window = _measure_in_process(captures, workers, recorder, triton, args.duration)
    wall, frames_in, analysed = window.wall, window.frames_in, window.analysed
    usage0, usage1, utilisation, triton_window = window.usage0, window.usage1, window.utilisation, window.triton
    gpu_mb, (rss_mb, peak_mb) = gpu_memory_mb(), rss_mb_of([])
    threads = len(os.listdir("/proc/self/task"))  # every thread of the process, the libraries' own included
    batch_stats = _batch_stats(unique)  # type: ignore[arg-type]
    stop.set()
    for thread in [*captures, *workers]:
        thread.join(5)
    for perception in unique:
        perception.close()  # type: ignore[union-attr]
    return _summary(args, naive, wall, frames_in, analysed, recorder, usage0, usage1, rss_mb, peak_mb, gpu_mb,
                    batch_stats) | {"detector_input_used": _input_used(cfg, args.video), "threads": threads,
                                      "decode_threads": args.decode_threads, "decode": args.decode,
                                      "frame_path": "graph" if cfg.inference.graph_frames else "opencv",
                                      "frames_in_flight": _in_flight(workers),
                                      "decoder": decoder_kind(captures), "gpu_utilisation": utilisation,
                                      "capture_nice": args.capture_nice, "backend": cfg.inference.backend,
                                      "triton": triton_window, "interval": cfg.detector.interval,
                                      "cores_by_thread": window.cores_by_thread}


@dataclass
class _Window:
    """One process's measured window: the counts and CPU over `wall`, the threads' cores over their own span."""

    wall: float
    frames_in: int
    analysed: int
    usage0: Any
    usage1: Any
    utilisation: dict[str, object] | None
    triton: dict[str, Any]
    cores_by_thread: dict[str, float]


def _measure_in_process(captures: list[CaptureThread], workers: list[CameraWorker], recorder: _Recorder,
                        triton: _TritonWindow, seconds: float) -> _Window:
    """Frames read and analysed and the process's CPU, counted at the edges of the recorded window and divided by
    the time between the counts. Why: reading every thread's CPU from /proc (`cpu_by_role`) gives the GIL away at
    each of ~300 files; in one process of 64 cameras, whose threads contend for the GIL, that took seconds, and the
    counts taken around it were once divided by the window alone (37 frames read a second per camera of a 25 fps
    clip, round 24). So the per-thread readings sit outside the counted span, with a span of their own."""
    threads_started = time.monotonic()
    threads0 = cpu_by_role()
    triton.open()
    usage0, counted_from = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    frames_in0 = sum(c.frames_in.total for c in captures)
    analysed0 = sum(w.stats.analysed.total for w in workers)
    _, utilisation = record_window(recorder, seconds)
    frames_in = sum(c.frames_in.total for c in captures) - frames_in0
    analysed = sum(w.stats.analysed.total for w in workers) - analysed0
    wall, usage1 = time.monotonic() - counted_from, resource.getrusage(resource.RUSAGE_SELF)
    triton_window = triton.close()
    threads1 = cpu_by_role()
    cores = cores_by_role(threads0, threads1, time.monotonic() - threads_started)
    return _Window(wall, frames_in, analysed, usage0, usage1, utilisation, triton_window, cores)


def _run_grouped(args: argparse.Namespace, cfg: AppConfig) -> dict[str, Any]:
    """The batched design with the cameras in camera group processes (pipeline/tools/bench_groups.py)."""
    recorder = _Recorder()
    measured = run_groups(args, cfg, recorder, WARMUP_S)
    usage0, usage1 = measured["usage"]
    return _summary(args, False, measured["wall"], measured["frames_in"], measured["analysed"], recorder, usage0,
                    usage1, measured["rss_mb"], measured["peak_mb"], measured["gpu_mb"], measured["batching"]) | {
        "detector_input_used": _input_used(cfg, args.video), "backend": cfg.inference.backend,
        "interval": cfg.detector.interval, **measured["extra"]}


def _in_flight(workers: list[CameraWorker]) -> dict[str, int]:
    """Frames per camera the workers were allowed in the engine at once, and the most any camera had."""
    return {"allowed": max(max(1, w.perception.frames_in_flight) for w in workers),
            "most": max(w.stats.most_in_flight for w in workers)}


def decoder_kind(captures: list[CaptureThread]) -> str:
    """What decoded the cameras in the end (`decode auto` may have fallen back to the CPU): nvdec, cpu or mixed."""
    on_gpu = [c.reader.source_kind == "nvdec" for c in captures if c.reader is not None and c.reader.source_kind]
    if not on_gpu:
        return "unknown"
    return "nvdec" if all(on_gpu) else "mixed" if any(on_gpu) else "cpu"


def video_format(video: Path, nvdec: bool) -> FrameFormat | None:
    """The frame format the cameras will deliver: the clip's size, RGB from NVDEC or BGR from OpenCV (a camera that
    falls back to the CPU brings a format not prepared here: the first batch prepares it, late). None when the
    source is not a readable file (the demo clip): its format is prepared by the first batch."""
    cap = cv2.VideoCapture(str(video))
    size = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    cap.release()
    if min(size) <= 0:
        return None
    return FrameFormat(size[0], size[1], "rgb" if nvdec and nvdec_problem() is None else "bgr")


def _batch_stats(perceptions: list[Analyzer]) -> dict[str, Any]:
    roles = [role for role, _ in perceptions[0].models()]
    return batch_figures({role: [dict(p.models())[role].stats for p in perceptions] for role in roles})


def _summary(args: argparse.Namespace, naive: bool, wall: float, frames_in: int, analysed: int,
             recorder: _Recorder, usage0: Any, usage1: Any, rss_mb: float, peak_mb: float, gpu_mb: float | None,
             batch_stats: dict[str, Any]) -> dict[str, Any]:
    cpu_s = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    lat = np.array(recorder.latencies_ms) if recorder.latencies_ms else np.array([np.nan])
    wanted = min(args.fps, frames_in / wall / args.cameras) if frames_in else args.fps
    return {
        "mode": "naive" if naive else "batched", "cameras": args.cameras, "fps_wanted": args.fps,
        "fps_in_per_camera": round(frames_in / wall / args.cameras, 2),
        "fps_analysed_per_camera": round(analysed / wall / args.cameras, 2),
        "analysed_per_s": round(analysed / wall, 1),
        "skipped_pct_of_wanted": round(100 * max(0.0, 1 - (analysed / wall / args.cameras) / wanted), 1),
        "latency_ms": {k: round(float(v), 1) for k, v in zip(("p50", "p95", "p99"), np.percentile(lat, [50, 95, 99]))},
        "faces_per_frame": round(recorder.faces / max(len(recorder.latencies_ms), 1), 2),
        "stage_ms": {stage: {k: round(float(v), 2) for k, v in zip(("p50", "p99"), np.percentile(times, [50, 99]))}
                     for stage, times in recorder.stage_ms.items()},
        "cpu_percent": round(100 * cpu_s / wall, 1), "rss_mb": round(rss_mb, 1), "peak_rss_mb": round(peak_mb, 1),
        "gpu_mb": gpu_mb, "batching": batch_stats,
    }


def bench_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000.0)
    modes = ["batched", "naive"] if args.mode == "both" else [args.mode]
    intervals = parse_intervals(args.interval)
    results = [run_mode(args, naive=(mode == "naive"), interval=interval)
               for _ in range(max(1, args.repeat)) for interval in intervals for mode in modes]
    out: dict[str, Any] = {"mode": "pipeline", "video": str(args.video), "device": args.device,
                           "switch_interval_ms": sys.getswitchinterval() * 1000,
                           "precision": args.precision, "detector_input": args.detector_input, "results": results}
    if len(results) == 2 and len(modes) == 2 and results[1]["analysed_per_s"]:
        out["ratio_analysed_batched_over_naive"] = round(results[0]["analysed_per_s"] / results[1]["analysed_per_s"], 2)
    if len(intervals) > 1:
        out["cpu_per_frame_vs_first_interval"] = interval_cpu_ratios(results, modes)
    return out


def parse_intervals(text: str | None) -> list[int | None]:
    """--interval: None (the config's) or each listed N."""
    if text is None:
        return [None]
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"--interval {text!r}: give whole numbers of 1 or more, e.g. 1,3")
    return list(values)


def interval_cpu_ratios(results: list[dict[str, Any]], modes: list[str]) -> dict[str, dict[str, float]]:
    """Per mode: each interval's CPU per analysed frame (all its runs together) divided by the first interval's,
    so runs that analysed different numbers of frames still compare."""
    ratios: dict[str, dict[str, float]] = {}
    for mode in modes:
        per: dict[int, list[float]] = {}
        for row in (r for r in results if r["mode"] == mode):
            totals = per.setdefault(row["interval"], [0.0, 0.0])
            totals[0] += row["cpu_percent"]
            totals[1] += row["analysed_per_s"]
        cost = {interval: cpu / max(frames, 1e-9) for interval, (cpu, frames) in per.items()}
        first = next(iter(cost.values()))
        ratios[mode] = {str(interval): round(value / max(first, 1e-12), 3) for interval, value in cost.items()}
    return ratios


def print_pipeline_table(result: dict[str, Any]) -> None:
    decoders = ",".join(sorted({r.get("decoder", "cpu") for r in result["results"]}))
    used = result["results"][0].get("detector_input_used", "") if result["results"] else ""
    print(f"{result['video']} on {result['device']} {result['precision']}, detector {result['detector_input']}"
          f"{f' ({used})' if used and used != result['detector_input'] else ''}, decoded by {decoders}")
    print(f"{'mode':8} {'path':6} {'N':>2} {'cams':>4} {'fps/cam':>8} {'skip%':>6} {'p50':>7} {'p95':>7} {'p99':>7} "
          f"{'CPU%':>6} {'RSS MB':>7} {'GPU MB':>7}  mean batch")
    for r in result["results"]:
        lat = r["latency_ms"]
        batches = ", ".join(f"{role} {b['mean_batch']}" for role, b in r["batching"].items())
        if r.get("frames_in_flight"):
            batches += f"; frames in flight per camera: up to {r['frames_in_flight']['allowed']}"
        print(f"{r['mode']:8} {r.get('frame_path', 'opencv'):6} {r.get('interval', 1):>2} {r['cameras']:>4} {r['fps_analysed_per_camera']:>8} "
              f"{r['skipped_pct_of_wanted']:>6} {lat['p50']:>7} {lat['p95']:>7} {lat['p99']:>7} {r['cpu_percent']:>6} "
              f"{r['peak_rss_mb']:>7} {r['gpu_mb'] if r['gpu_mb'] is not None else '-':>7}  {batches}")
    for r in result["results"]:
        if r.get("host_memory"):
            h = r["host_memory"]
            print(f"{r['mode']}: host memory of all processes: RSS {h['rss_mb']} MB, PSS {h['pss_mb']} MB (shared "
                  f"library pages counted once), anonymous {h['anon_mb']} MB")
            if h.get("processes"):
                print(f"{r['mode']}: RSS / anonymous MB by process: " + ", ".join(
                    f"{name} {m['rss_mb']:.0f} / {m['anon_mb']:.0f}" for name, m in h["processes"].items()))
    for r in result["results"]:
        if r.get("cores_by_thread"):
            print(f"{r['mode']}: cores by thread: " + ", ".join(f"{role} {c}" for role, c in r["cores_by_thread"].items()))
    for r in result["results"]:
        if r.get("gpu_utilisation"):
            u = r["gpu_utilisation"]
            print(f"{r['mode']}: GPU busy {u['gpu_busy_pct']} %, NVDEC busy {u['nvdec_busy_pct']} % "
                  f"({u['samples']} nvidia-smi samples)")
            for gpu in u.get("per_gpu", []) if len(u.get("per_gpu", [])) > 1 else []:
                print(f"  GPU {gpu['index']}: busy {gpu['gpu_busy_pct']} %, NVDEC {gpu['nvdec_busy_pct']} %, "
                      f"memory up to {gpu['memory_mb_max']:.0f} MB")
    for r in result["results"]:
        for model, t in (r.get("triton") or {}).items():
            print(f"{r['mode']}: Triton {model} (all its clients): {t['items']} items in {t['requests']} requests "
                  f"in {t['executions']} executions ({t['items_per_execution']} items, "
                  f"{t['requests_per_execution']} requests per execution)")
    for mode, ratios in result.get("cpu_per_frame_vs_first_interval", {}).items():
        print(f"{mode}: CPU per analysed frame against interval {next(iter(ratios))}: "
              + ", ".join(f"interval {n}: {ratio}x" for n, ratio in ratios.items()))
    if "ratio_analysed_batched_over_naive" in result:
        print(f"batched / naive analysed frames per second: {result['ratio_analysed_batched_over_naive']}x")
