"""GPU and NVDEC utilisation while a benchmark runs, sampled from nvidia-smi (absent without an NVIDIA GPU).

The benchmarks report how busy the GPU's compute and its video decoders were, so a run shows whether they, or the
host, limit it. nvidia-smi's utilisation is the share of time a kernel (or a decode) was running in the last sample
period: coarse, but the same tool operators use.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterable

QUERY = ["nvidia-smi", "--query-gpu=utilization.gpu,utilization.decoder,memory.used",
         "--format=csv,noheader,nounits"]


def parse_utilisation(text: str) -> tuple[float, float] | None:
    """(GPU %, NVDEC %) of the first GPU in nvidia-smi's CSV answer; None when it is not a number pair."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    parts = [part.strip() for part in lines[0].split(",")]
    try:
        return float(parts[0]), float(parts[1])
    except (IndexError, ValueError):
        return None


def parse_per_gpu(text: str) -> list[tuple[float, float, float]] | None:
    """(GPU %, NVDEC %, memory used MB) of every GPU in nvidia-smi's CSV answer, in its order (CUDA_VISIBLE_DEVICES
    does not apply to nvidia-smi: these are the driver's indices); None when a line is not three numbers."""
    rows = []
    for line in (line for line in text.splitlines() if line.strip()):
        parts = [part.strip() for part in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2])))
        except (IndexError, ValueError):
            return None
    return rows or None


def query_utilisation() -> list[tuple[float, float, float]] | None:
    try:
        done = subprocess.run(QUERY, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_per_gpu(done.stdout) if done.returncode == 0 else None


class GpuSampler(threading.Thread):
    """Samples every `period_s` until `finish()`; stops at once where nvidia-smi does not answer."""

    def __init__(self, period_s: float = 0.5) -> None:
        super().__init__(name="gpu-sampler", daemon=True)
        self.period_s = period_s
        self.samples: list[list[tuple[float, float, float]]] = []  # per sample, per GPU
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            sample = query_utilisation()
            if sample is None:
                return
            self.samples.append(sample)
            self._stop_event.wait(self.period_s)

    def finish(self) -> dict[str, object] | None:
        """Stop and summarise: mean GPU and NVDEC busy % over every GPU, the number of samples, and per GPU its
        busy figures and most memory used (None: nothing sampled)."""
        self._stop_event.set()
        self.join(5)
        if not self.samples:
            return None
        return summarise(self.samples)


def summarise(samples: list[list[tuple[float, float, float]]]) -> dict[str, object]:
    """The sampler's figures from its samples (see GpuSampler.finish)."""
    count = min(len(sample) for sample in samples)
    per_gpu = [{"index": index,
                "gpu_busy_pct": round(sum(s[index][0] for s in samples) / len(samples), 1),
                "nvdec_busy_pct": round(sum(s[index][1] for s in samples) / len(samples), 1),
                "memory_mb_max": max(s[index][2] for s in samples)} for index in range(count)]
    return {"gpu_busy_pct": round(sum(g["gpu_busy_pct"] for g in per_gpu) / count, 1),
            "nvdec_busy_pct": round(sum(g["nvdec_busy_pct"] for g in per_gpu) / count, 1),
            "samples": len(samples), "per_gpu": per_gpu}


def gpu_memory_mb(pids: Iterable[int] = ()) -> float | None:
    """GPU memory of this process and `pids` together, from one nvidia-smi query (None where there is no NVIDIA GPU
    or none of them holds any)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    wanted = {str(pid) for pid in (os.getpid(), *pids)}
    used = [float(line.split(",")[1]) for line in out.splitlines() if line.split(",")[0].strip() in wanted]
    return sum(used) if used else None
