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

QUERY = ["nvidia-smi", "--query-gpu=utilization.gpu,utilization.decoder", "--format=csv,noheader,nounits"]


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


def query_utilisation() -> tuple[float, float] | None:
    try:
        done = subprocess.run(QUERY, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_utilisation(done.stdout) if done.returncode == 0 else None


class GpuSampler(threading.Thread):
    """Samples every `period_s` until `finish()`; stops at once where nvidia-smi does not answer."""

    def __init__(self, period_s: float = 0.5) -> None:
        super().__init__(name="gpu-sampler", daemon=True)
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            sample = query_utilisation()
            if sample is None:
                return
            self.samples.append(sample)
            self._stop_event.wait(self.period_s)

    def finish(self) -> dict[str, float] | None:
        """Stop and summarise: mean GPU and NVDEC busy %, and the number of samples (None: nothing sampled)."""
        self._stop_event.set()
        self.join(5)
        if not self.samples:
            return None
        gpu = sum(s[0] for s in self.samples) / len(self.samples)
        nvdec = sum(s[1] for s in self.samples) / len(self.samples)
        return {"gpu_busy_pct": round(gpu, 1), "nvdec_busy_pct": round(nvdec, 1), "samples": len(self.samples)}


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
