"""`bench pipeline --processes N`: the batched design with the cameras in N camera group processes, as the daemon
runs them with `inference.processes: N` (pipeline/service/groups.py): each group its own engine, observations back
to this process on a queue. CPU time, memory and GPU memory are the sum over this process and its groups; analysed
frames and latency are counted on the observations that arrive here, so the queue's cost is in them."""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.service.groups import (
    CameraGroup,
    GroupHandlers,
    start_groups,
    stop_groups,
)
from pipeline.tools.gpu_sampler import GpuSampler, gpu_memory_mb
from pipeline.tools.thread_cpu import cores_by_role, cpu_by_role_of_all

if TYPE_CHECKING:
    from pipeline.config.app import AppConfig
    from pipeline.inference.batching import BatchStats
    from pipeline.service.snapshot import ModelView

FIRST_FRAMES_S = 300.0  # a GPU group prepares its frame size on the first frames (20-40 s per size on an H200)


def run_groups(args: argparse.Namespace, cfg: AppConfig, recorder: Any, warmup_s: float) -> dict[str, Any]:
    """Start the groups, wait until every camera has been analysed once, then measure `args.duration` seconds."""
    stop = threading.Event()
    groups = start_groups(cfg, cfg.cameras, GroupHandlers(recorder, lambda _event: None), stop)
    try:
        for group in groups:
            group.go()
        _wait_for_first_frames(groups, len(cfg.cameras))
        time.sleep(warmup_s)
        pids = [group.pid for group in groups if group.pid is not None]
        cpu0, frames_in0, threads0 = _cpu_seconds(pids), _frames_in(groups), cpu_by_role_of_all(pids)
        wall, utilisation = record_window(recorder, args.duration)
        cpu_s, threads1 = _cpu_seconds(pids) - cpu0, cpu_by_role_of_all(pids)
        frames_in = _frames_in(groups) - frames_in0
        rss_mb, peak_mb = rss_mb_of(pids)
        host = host_memory_by_process(pids)
        gpu_mb = gpu_memory_mb(pids)
        batching = _batch_stats([model for group in groups for model in group.models])
    finally:
        stop_groups(groups, 5.0)
    usage = (SimpleNamespace(ru_utime=0.0, ru_stime=0.0), SimpleNamespace(ru_utime=cpu_s, ru_stime=0.0))
    return {"wall": wall, "frames_in": frames_in, "analysed": len(recorder.latencies_ms), "usage": usage,
            "rss_mb": rss_mb, "peak_mb": peak_mb, "gpu_mb": gpu_mb, "batching": batching,
            "extra": {"processes": len(groups), "gpu_utilisation": utilisation, "host_memory": host,
                      "cores_by_thread": cores_by_role(threads0, threads1, wall),  # the groups' threads only
                      "frame_path": "graph" if cfg.inference.graph_frames else "opencv"}}


def record_window(recorder: Any, seconds: float) -> tuple[float, dict[str, object] | None]:
    """Let `recorder` take observations for `seconds` while the GPU is sampled: the window's wall time and the GPU's
    utilisation over it (None without an NVIDIA GPU)."""
    started = time.monotonic()
    recorder.recording = True
    sampler = GpuSampler()
    sampler.start()
    time.sleep(seconds)
    recorder.recording = False
    return time.monotonic() - started, sampler.finish()


def _wait_for_first_frames(groups: list[CameraGroup], cameras: int) -> None:
    deadline = time.monotonic() + FIRST_FRAMES_S
    while time.monotonic() < deadline:
        views = [view for group in groups for view in group.views]
        if len(views) == cameras and all(view.health.frames_analysed > 0 for view in views):
            return
        time.sleep(0.5)
    raise RuntimeError(f"not every camera was analysed within {FIRST_FRAMES_S:.0f} s of the groups' start")


def _frames_in(groups: list[CameraGroup]) -> int:
    return sum(view.health.frames_in for group in groups for view in group.views)


def _cpu_seconds(pids: list[int]) -> float:
    """CPU time of this process and the groups' (utime + stime from /proc)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    ticks = os.sysconf("SC_CLK_TCK")
    total = own.ru_utime + own.ru_stime
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime: fields 14 and 15 of stat
    return total


def rss_mb_of(pids: list[int]) -> tuple[float, float]:
    """Resident memory now and at its peak, summed over this process and `pids`."""
    now = peak = 0.0
    for pid in ["self", *pids]:
        with open(f"/proc/{pid}/status") as handle:
            fields = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
        now += float(fields["VmRSS"].split()[0]) / 1024
        peak += float(fields["VmHWM"].split()[0]) / 1024
    return now, peak


def host_memory_mb(pids: list[int]) -> dict[str, float]:
    """This process's and `pids`' host memory summed: resident (RSS, every mapped page counted in every process),
    proportional (PSS: a page shared by k processes counts 1/k, so the sum is what they take together), anonymous
    (RssAnon: the processes' own heaps, not the libraries' file pages) and shared (RssShmem)."""
    sums = host_memory_by_process(pids)
    del sums["processes"]
    return sums


def process_memory_mb(pid: int | str) -> dict[str, float] | None:
    """One process's RSS, PSS, anonymous and shared memory in MB (see host_memory_mb; RssShmem: shared memory
    mappings, where host memory that drivers map for a device shows up); None once it has gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            rollup = dict(line.split(":", 1) for line in handle.read().splitlines()[1:] if ":" in line)
        with open(f"/proc/{pid}/status") as handle:
            status = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
    except OSError:
        return None
    return {"rss_mb": round(float(status["VmRSS"].split()[0]) / 1024, 1),
            "pss_mb": round(float(rollup["Pss"].split()[0]) / 1024, 1),
            "anon_mb": round(float(status["RssAnon"].split()[0]) / 1024, 1),
            "shmem_mb": round(float(status.get("RssShmem", "0 kB").split()[0]) / 1024, 1)}


def host_memory_by_process(pids: list[int]) -> dict[str, Any]:
    """host_memory_mb's sums, and each process's own: the daemon's side (this process: observations, behaviour,
    outputs) and each camera group, so a breakdown tells a group's cost from the daemon's."""
    read = {"daemon": process_memory_mb("self")}
    read.update((f"group {index + 1}", process_memory_mb(pid)) for index, pid in enumerate(pids))
    processes = {name: memory for name, memory in read.items() if memory is not None}
    sums = {key: round(sum(memory[key] for memory in processes.values()), 1)
            for key in ("rss_mb", "pss_mb", "anon_mb", "shmem_mb")}
    return {**sums, "processes": processes}


def _batch_stats(models: list[ModelView]) -> dict[str, Any]:
    """bench pipeline's batching figures per role, over the same role's model in every group."""
    by_role: dict[str, list[BatchStats]] = {}
    for model in models:
        by_role.setdefault(model.role.split("@")[0], []).append(model.stats)
    return batch_figures(by_role)


def batch_figures(stats_by_role: dict[str, list[BatchStats]]) -> dict[str, Any]:
    """Per role, over its models' counters: mean batch (of the recent batches), queue wait per item, compute per
    batch, requests refused."""
    out: dict[str, Any] = {}
    for role, stats in stats_by_role.items():
        sizes = [size for st in stats for size in st.batch_sizes]
        items = sum(st.items for st in stats)
        out[role] = {"mean_batch": round(float(np.mean(sizes)), 2) if sizes else 0.0,
                     "queue_ms_per_item": round(1000 * sum(st.queue_s for st in stats) / max(items, 1), 2),
                     "compute_ms_per_batch": round(1000 * sum(st.compute_s for st in stats) /
                                                   max(sum(st.batches for st in stats), 1), 2),
                     "rejected": sum(st.rejected for st in stats)}
    return out
