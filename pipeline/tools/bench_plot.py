"""PNG plots of `bench` results (`--plot FILE.png`), drawn with matplotlib from the same dict that `--json` writes.

One function per bench mode, each turning a result into one figure; matplotlib is imported only when a plot is
asked for, with its non-interactive backend (a headless server has no display).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


class PlotError(RuntimeError):
    """A plot cannot be drawn (matplotlib missing, or the file cannot be written)."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotError("--plot needs matplotlib: pip install -r requirements.txt") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _engine(plt: Any, result: dict[str, Any]) -> Any:
    fig, (speed, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    batches = sorted({row["batch"] for row in result["rows"]})
    for precision in dict.fromkeys(row["precision"] for row in result["rows"]):
        rows = [r for r in result["rows"] if r["precision"] == precision]
        sizes = [r["batch"] for r in rows]
        (line,) = speed.plot(sizes, [r["items_per_s"] for r in rows], marker="o", label=precision)
        latency.plot(sizes, [r["p99_ms"] for r in rows], marker="o", color=line.get_color(), label=f"{precision} p99")
        latency.plot(sizes, [r["p50_ms"] for r in rows], marker=".", linestyle=":", color=line.get_color(),
                     label=f"{precision} p50")
    for axis, label in ((speed, "items per second"), (latency, "ms per batch")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(batches, [str(b) for b in batches])
        axis.set_xlabel("batch size")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(f"bench engine: {result['model']} on {result['device']}, input {result['input']}")
    return fig


def _pipeline(plt: Any, result: dict[str, Any]) -> Any:
    rows = result["results"]
    labels = [f"{r['mode']}\n{r['cameras']} cams" for r in rows]
    fig, (fps, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    fps.bar(labels, [r["fps_analysed_per_camera"] for r in rows], color="tab:blue")
    fps.axhline(rows[0]["fps_wanted"], color="gray", linestyle="--", label="wanted")
    fps.set_ylabel("analysed frames per second per camera")
    fps.legend()
    width = 0.25
    for offset, key in enumerate(("p50", "p95", "p99")):
        positions = [i + (offset - 1) * width for i in range(len(rows))]
        latency.bar(positions, [r["latency_ms"][key] for r in rows], width, label=key)
    latency.set_xticks(range(len(rows)), labels)
    latency.set_ylabel("capture → observation, ms")
    latency.legend()
    for axis in (fps, latency):
        axis.grid(axis="y", alpha=0.3)
    fig.suptitle(f"bench pipeline: {Path(result['video']).name} on {result['device']} {result['precision']}, "
                 f"detector {result['detector_input']}")
    return fig


def _analyze(plt: Any, result: dict[str, Any]) -> Any:
    best = result["best"]
    fig, axis = plt.subplots(figsize=(6, 4))
    axis.bar(list(best), [float(r["fps"]) for r in best.values()], color=["tab:blue", "tab:gray"][: len(best)])
    axis.set_ylabel("frames per second")
    axis.grid(axis="y", alpha=0.3)
    fig.suptitle(f"bench analyze: {Path(result['video']).name}")
    return fig


def _capture(plt: Any, result: dict[str, Any]) -> Any:
    rows = result["rows"]
    fig, axis = plt.subplots(figsize=(7, 4))
    axis.bar([f"{r['video']}\n{r['cameras']} cams" for r in rows], [r["cpu_percent_per_camera"] for r in rows])
    axis.set_ylabel("CPU % of one core per camera")
    axis.grid(axis="y", alpha=0.3)
    fig.suptitle("bench capture")
    return fig


PLOTTERS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "engine": _engine, "pipeline": _pipeline, "analyze": _analyze, "capture": _capture}


def save_plot(result: dict[str, Any], path: Path) -> None:
    """Draw the result of any bench mode (its `mode` key picks the figure) into a PNG at `path`."""
    plt = _pyplot()
    fig = PLOTTERS[result["mode"]](plt, result)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise PlotError(f"cannot write the plot to {path}: {exc}") from exc
    finally:
        plt.close(fig)
