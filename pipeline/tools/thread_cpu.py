"""CPU time per thread role, read from /proc (Linux): where a process's cores go, counted by the kernel.

Why: a sampling profiler (py-spy) counts a thread asleep in native code (NVDEC's driver, a CUDA wait) as busy, so its
shares say where threads *are*, not what they cost. The kernel's own per-thread CPU time does not have that bias.
A Python thread is named by its `threading` name with digits folded (`reader-cam12` → `reader-camN`), so the 64
cameras' readers add up to one row; any other thread (ONNX Runtime's pools, CUDA's and the driver's own) by its
kernel name, prefixed `native:`. In another process (a camera group) only kernel names can be read: the pipeline's
own threads give theirs their `threading` names (core.threads), so they count under the same roles there, and a
library's thread started by one of them (an FFmpeg decoder's) counts under its starter's name.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from pipeline.service.procs import stat_seconds

TASKS = Path("/proc/self/task")
_DIGITS = re.compile(r"\d+")


def _role_of(native_names: dict[int, str], tid: int, comm: str) -> str:
    name = native_names.get(tid)
    return _DIGITS.sub("N", name) if name is not None else f"native:{_DIGITS.sub('N', comm)}"


def _threads(tasks: Path) -> list[tuple[int, str, float]]:
    """(thread id, kernel name, CPU seconds) of each thread under `tasks` (a /proc/PID/task directory) alive now;
    empty when the directory cannot be read (no /proc, or the process has gone)."""
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return []
    found = []
    for task in entries:
        try:
            comm, seconds = stat_seconds((task / "stat").read_text())
        except (OSError, IndexError, ValueError):  # the thread ended while we read it
            continue
        found.append((int(task.name), comm, seconds))
    return found


def _summed(roles: list[tuple[str, float]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for role, seconds in roles:
        totals[role] = totals.get(role, 0.0) + seconds
    return totals


def cpu_by_role(tasks: Path = TASKS) -> dict[str, float]:
    """CPU seconds so far of this process's threads alive now, summed per role (threads that ended are not counted);
    empty where there is no /proc (not Linux)."""
    native_names = {thread.native_id: thread.name for thread in threading.enumerate() if thread.native_id is not None}
    return _summed([(_role_of(native_names, tid, comm), seconds) for tid, comm, seconds in _threads(tasks)])


def cpu_by_role_of(pid: int) -> dict[str, float]:
    """`cpu_by_role` for another process (e.g. a camera group), by kernel names with digits folded; empty when the
    process has gone."""
    return _summed([(_DIGITS.sub("N", comm), seconds) for _, comm, seconds in _threads(Path(f"/proc/{pid}/task"))])


def cpu_by_role_of_all(pids: list[int]) -> dict[str, float]:
    """`cpu_by_role_of` summed over several processes (the camera groups of one run)."""
    return _summed([item for pid in pids for item in cpu_by_role_of(pid).items()])


def cores_by_role(before: dict[str, float], after: dict[str, float], wall_s: float, top: int = 12) -> dict[str, float]:
    """Cores each role used between two `cpu_by_role` readings, largest first; the rest summed as `other`."""
    used = {role: after[role] - before.get(role, 0.0) for role in after}
    ranked = sorted(used.items(), key=lambda item: item[1], reverse=True)
    cores = {role: round(seconds / max(wall_s, 1e-9), 3) for role, seconds in ranked[:top]}
    rest = sum(seconds for _, seconds in ranked[top:])
    if rest > 0:
        cores["other"] = round(rest / max(wall_s, 1e-9), 3)
    return cores
