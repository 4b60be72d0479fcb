"""What each of the daemon's processes takes from the host (its own, and each camera group's): resident memory and CPU
time, read from /proc on Linux, for the status page, /api/status and /metrics.

Why: a daemon that runs for weeks should show what it holds, per process, without a shell on the box: a camera group
carries its own CUDA libraries and sessions (~2 GB of host memory each on a GPU, BENCHMARKS.md issue 25), and a leak
shows as one process's line climbing. Elsewhere (no /proc) the figures are None and nothing else changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessView:
    """One process of the daemon: its name ("daemon", or a camera group's), pid and what it takes now."""

    name: str
    pid: int
    rss_bytes: int | None  # resident set size; None where /proc cannot say (not Linux, or the process is gone)
    cpu_seconds: float | None  # user + system time since it started


def process_view(name: str, pid: int, proc: Path = PROC) -> ProcessView:
    """Read `pid`'s resident memory (statm: resident pages) and CPU time (stat: utime + stime, in clock ticks)."""
    return ProcessView(name, pid, _resident_bytes(proc / str(pid)), _cpu_seconds(proc / str(pid)))


def _resident_bytes(directory: Path) -> int | None:
    try:
        fields = (directory / "statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def stat_seconds(stat: str) -> tuple[str, float]:
    """(kernel name, user + system seconds) of one /proc/PID/stat or /proc/PID/task/TID/stat line. The name is in
    parentheses and may itself hold spaces or parentheses, hence the split at the last ')'; utime and stime are
    fields 14 and 15 of proc(5). ValueError or IndexError on a line that is not one."""
    head, _, rest = stat.rpartition(")")
    fields = rest.split()
    ticks = int(fields[11]) + int(fields[12])
    return head.partition("(")[2], ticks / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(directory: Path) -> float | None:
    try:
        return stat_seconds((directory / "stat").read_text())[1]
    except (OSError, ValueError, IndexError):
        return None
