"""ONNX Runtime's memory arenas as they grow, read from its own log (`bench memory --arena-log FILE`).

Why: a camera group's GPU memory grows by ~0.4 GB while it analyses (BENCHMARKS.md, round 22), beyond its frame pools,
and nvidia-smi cannot say which library took it. ONNX Runtime exposes no arena statistics to Python, but its arenas
(BFCArena) log every extension at INFO: "Extending BFCArena for Cuda. bin_num:.. (requested) num_bytes: R ..." then
"Extended allocation by B bytes." `ArenaLog` points the process's stderr (file descriptor 2, where ONNX Runtime's
default logger writes) at a file, turns that logger to INFO, and notes the file's length at each step, so each
step's extensions can be summed per arena (Cuda, Cpu, CudaPinned) with the largest requests that caused them.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

_EXTENDING = re.compile(r"Extending BFCArena for (\w+)\..*?num_bytes: (\d+)")
_EXTENDED = re.compile(r"Extended allocation by (\d+) bytes")
ORT_INFO = 1  # onnxruntime's logging severity: 0 verbose, 1 info, 2 warning, 3 error
LARGEST = 5  # requests listed per step and arena


class ArenaLog:
    """stderr redirected into `path` for the measurement, ONNX Runtime's default logger at INFO; close() undoes it."""

    def __init__(self, path: Path) -> None:
        import onnxruntime

        self.path = path
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - held open until close()
        sys.stderr.flush()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        onnxruntime.set_default_logger_severity(ORT_INFO)

    def offset(self) -> int:
        """How far the log has been written: a step's extensions lie between its offset and the one before."""
        sys.stderr.flush()
        return os.fstat(2).st_size

    def close(self) -> None:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)  # errors only: what the CLI sets at every level but debug
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.close()


def arena_growth(text: str) -> dict[str, dict[str, Any]]:
    """Extensions in a stretch of ONNX Runtime's log, per arena: MiB added, how many, the largest requests (MiB)."""
    growth: dict[str, dict[str, Any]] = {}
    arena, requested = "unknown", 0
    for line in text.splitlines():
        extending = _EXTENDING.search(line)
        if extending:
            arena, requested = extending.group(1), int(extending.group(2))
            continue
        extended = _EXTENDED.search(line)
        if extended:
            entry = growth.setdefault(arena, {"extended_mib": 0.0, "extensions": 0, "requests_mib": []})
            entry["extended_mib"] += int(extended.group(1)) / 2**20
            entry["extensions"] += 1
            entry["requests_mib"].append(requested / 2**20)
    for entry in growth.values():
        entry["extended_mib"] = round(entry["extended_mib"], 1)
        entry["largest_requests_mib"] = [round(r, 1) for r in sorted(entry.pop("requests_mib"), reverse=True)[:LARGEST]]
    return growth


def attach_arena_growth(rows: list[dict[str, Any]], path: Path) -> None:
    """Give each step row (with its `log_offset`) the arena extensions logged since the step before."""
    data = path.read_bytes()
    start = 0
    for row in rows:
        end = row.pop("log_offset", start)
        row["arena"] = arena_growth(data[start:end].decode("utf-8", "replace"))
        start = end
