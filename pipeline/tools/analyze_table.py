"""`analyze`'s summary as a table for a person at a terminal (issue 26 item 5).

The JSON summary line is for scripts: one line of nested JSON tells a person little at a glance, least of all the
confusion matrix. The table reads the same summary (`Summary.as_dict()`), so the two never disagree, and adds what
a person asks next: balanced accuracy (a dataset with many happy faces makes plain accuracy flatter a model that
answers happy), and precision per class (a class the model answers for everything has a high recall and a low
precision). Counts stand beside every fraction, because 100 % of 2 images is no figure to trust.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from pipeline.core.types import EMOTIONS

Confusion = Mapping[str, Mapping[str, int]]  # label → answer (an emotion, or no_face) → images
ZERO = "."  # a zero cell of the grid: the few non-zero cells stand out


def format_summary_table(summary: Mapping[str, object]) -> str:
    """The whole table: counts, then (with labels) accuracy, per-class figures and the confusion grid."""
    sections = [_overview(summary)]
    confusion = cast(Confusion | None, summary.get("confusion"))
    if confusion:
        sections.append(_accuracy(summary, confusion))
        sections.append(_per_class(confusion))
        sections.append(_confusion_grid(confusion))
    return "\n\n".join("\n".join(lines) for lines in sections)


def precision_by_class(confusion: Confusion) -> dict[str, tuple[int, int]]:
    """Per answered emotion: (right, answered) over the labelled images; a class never answered is absent."""
    answered: dict[str, int] = {}
    for row in confusion.values():
        for answer, count in row.items():
            if answer in EMOTIONS and count:
                answered[answer] = answered.get(answer, 0) + count
    return {e: (confusion.get(e, {}).get(e, 0), n) for e, n in answered.items()}


def recall_by_class(confusion: Confusion) -> dict[str, tuple[int, int]]:
    """Per labelled emotion: (right, labelled)."""
    return {label: (row.get(label, 0), sum(row.values())) for label, row in confusion.items()}


def balanced_accuracy(confusion: Confusion) -> float:
    """The mean recall over the labelled classes: what accuracy would be if every class had as many images."""
    recalls = [right / total for right, total in recall_by_class(confusion).values() if total]
    return sum(recalls) / len(recalls) if recalls else 0.0


def shown_sizes(sizes: Sequence[str], most: int = 3) -> str:
    """Detector input sizes, the first few of many: with `auto` a folder of photos of many sizes uses many, and
    fifty of them on a line hide everything else."""
    if len(sizes) <= most:
        return ", ".join(sizes)
    return f"{len(sizes)} sizes (one per image shape), first {', '.join(sizes[:most])}, ..."


def _percent(right: int, total: int) -> str:
    return f"{100 * right / total:5.1f} % ({right}/{total})" if total else "-"


def _overview(summary: Mapping[str, object]) -> list[str]:
    seconds, per_second = summary.get("seconds"), summary.get("per_second")
    lines = [f"analyzed: {summary['images']} images, {summary['frames']} frames, {summary['faces']} faces "
             f"in {seconds} s" + (f" ({per_second} per second)" if per_second else "")]
    per_image = cast(Mapping[str, int], summary.get("faces_per_image", {}))
    if per_image:
        lines.append("images: " + ", ".join(f"{count} with {n} face{'' if n == '1' else 's'}"
                                            for n, count in per_image.items()))
    emotions = cast(Mapping[str, int], summary.get("emotions", {}))
    lines.append("emotions found: " + ", ".join(f"{e} {n}" for e, n in emotions.items()))
    if summary.get("detector_input"):
        lines.append(f"detector input: {shown_sizes(cast(str, summary['detector_input']).split(', '))}")
    lines.extend(_problems(summary))
    return lines


def _problems(summary: Mapping[str, object]) -> list[str]:
    """Inputs that are not in the figures: the warnings above name them, the table counts them."""
    unreadable = cast(Sequence[str], summary.get("unreadable", []))
    folders = cast(Mapping[str, int], summary.get("unlabelled_folders", {}))
    counts = {"unreadable": len(unreadable),
              "smaller than detector.min_face_px": cast(int, summary.get("smaller_than_min_face_px", 0)),
              "unlabelled (in folders named after no emotion)": sum(folders.values())}
    return [f"{what}: {count} (see the warnings above)" for what, count in counts.items() if count]


def _accuracy(summary: Mapping[str, object], confusion: Confusion) -> list[str]:
    labelled = cast(int, summary["labelled"])
    right = sum(row.get(label, 0) for label, row in confusion.items())
    return [f"accuracy:          {_percent(right, labelled)} of the labelled images",
            f"balanced accuracy: {100 * balanced_accuracy(confusion):5.1f} % (mean recall of "
            f"{len(confusion)} classes)"]


def _per_class(confusion: Confusion) -> list[str]:
    """One line per class that was labelled or answered: recall (of its images, how many were found as it) and
    precision (of the answers naming it, how many were right)."""
    recall, precision = recall_by_class(confusion), precision_by_class(confusion)
    classes = [e for e in EMOTIONS if e in recall or e in precision]
    rows = [["class", "images", "recall", "precision"]]
    for emotion in classes:
        rows.append([emotion, str(recall.get(emotion, (0, 0))[1]), _percent(*recall.get(emotion, (0, 0))),
                     _percent(*precision.get(emotion, (0, 0)))])
    return _aligned(rows, right_aligned=(1,))


def _confusion_grid(confusion: Confusion) -> list[str]:
    """Rows: the label; columns: the answer (no_face: no face was found). Zeros are dots."""
    columns = list(next(iter(confusion.values())))
    rows = [["label \\ answer", *columns, "total"]]
    for label, row in confusion.items():
        rows.append([label, *(str(row.get(c, 0)) if row.get(c, 0) else ZERO for c in columns),
                     str(sum(row.values()))])
    title = "confusion (rows: label, columns: answer; no_face: no face found; . is 0):"
    return [title, *_aligned(rows, right_aligned=tuple(range(1, len(columns) + 2)))]


def _aligned(rows: list[list[str]], right_aligned: tuple[int, ...]) -> list[str]:
    """Rows of cells as columns two spaces apart, each as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if i in right_aligned else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return lines
