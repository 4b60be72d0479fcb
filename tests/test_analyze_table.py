"""Issue 26 item 5, "analyze for people": the summary as a table (accuracy, balanced accuracy, per-class recall and
precision with counts, the confusion matrix as a grid with the class names on both axes) where a person reads it,
`--json` for today's `summary: {JSON}` line, and no INFO line per file before it.

The CLI runs as a subprocess with the real models on real photos: two of each class from ../shared/data/faces/wild
(14 photos, a few seconds on a CPU), so every class has a row and the figures can be recounted from the per-image
lines on stdout.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from pipeline.core.types import EMOTIONS
from pipeline.tools.analyze_table import balanced_accuracy, format_summary_table, precision_by_class
from tests.conftest import data_path, run_cli
from tests.test_first_contact import run_on_terminal

PER_CLASS = 2
GRID_HEADER = "label \\ answer"


@pytest.fixture(scope="module")
def wild_subset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first two photos of each emotion in faces/wild, with their labels.csv."""
    source = data_path("faces", "wild")
    folder = tmp_path_factory.mktemp("wild_subset")
    with (source / "labels.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    chosen = [row for emotion in EMOTIONS for row in [r for r in rows if r["emotion"] == emotion][:PER_CLASS]]
    if len(chosen) != PER_CLASS * len(EMOTIONS):
        pytest.skip(f"{source}/labels.csv has fewer than {PER_CLASS} photos of some emotion")
    with (folder / "labels.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "emotion"])
        for row in chosen:
            shutil.copy(source / row["file"], folder / row["file"])
            writer.writerow([row["file"], row["emotion"]])
    return folder


def _answers(stdout: str) -> list[tuple[str, str]]:
    """(label, answer) per image from the per-image lines: the largest face's emotion, or no_face."""
    pairs = []
    for record in map(json.loads, stdout.splitlines()):
        faces = record["faces"]
        largest = max(faces, key=lambda f: (f["box"][2] - f["box"][0]) * (f["box"][3] - f["box"][1]), default=None)
        pairs.append((record["label"], largest["emotion"] if largest else "no_face"))
    return pairs


def _grid(stderr: str) -> dict[str, dict[str, str]]:
    """The confusion grid as printed: row name → column name → cell text."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(GRID_HEADER))
    columns = lines[start][len(GRID_HEADER):].split()
    grid = {}
    for line in lines[start + 1:start + 1 + len(EMOTIONS)]:
        name, *cells = line.split()
        assert len(cells) == len(columns), f"ragged grid row: {line!r}"
        grid[name] = dict(zip(columns, cells))
    return grid


def test_table_shows_every_class_on_both_axes_and_per_class_figures(prepared_models: None,
                                                                     wild_subset: Path) -> None:
    done = run_cli("analyze", str(wild_subset), "--table")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "summary: {" not in done.stderr  # the table replaces the JSON line
    pairs = _answers(done.stdout)
    assert len(pairs) == PER_CLASS * len(EMOTIONS)
    grid = _grid(done.stderr)
    assert list(grid) == list(EMOTIONS)
    assert all(list(row) == [*EMOTIONS, "no_face", "total"] for row in grid.values())
    for label in EMOTIONS:  # each cell recounted from the per-image lines (. is zero)
        for answer in [*EMOTIONS, "no_face"]:
            count = pairs.count((label, answer))
            assert grid[label][answer] == (str(count) if count else "."), (label, answer, done.stderr[-3000:])
        assert grid[label]["total"] == str(PER_CLASS)
    right = sum(label == answer for label, answer in pairs)
    assert f"accuracy:          {100 * right / len(pairs):5.1f} % ({right}/{len(pairs)})" in done.stderr
    assert "balanced accuracy:" in done.stderr
    lines = done.stderr.splitlines()
    for label in EMOTIONS:
        line = next(ln for ln in lines if ln.split()[:2] == [label, str(PER_CLASS)])
        found = pairs.count((label, label))
        assert f"% ({found}/{PER_CLASS})" in line, line  # recall with its counts
        answered = sum(answer == label for _, answer in pairs)
        precision = f"% ({found}/{answered})" if answered else "-"  # never answered: no precision
        assert line.rstrip().endswith(precision), line


def test_json_keeps_the_summary_line_and_no_info_line_per_file(prepared_models: None, wild_subset: Path) -> None:
    done = run_cli("analyze", str(wild_subset), "--json")  # the default log level: info
    assert done.returncode == 0, done.stderr[-3000:]
    summary_lines = [ln for ln in done.stderr.splitlines() if ln.startswith("summary: ")]
    assert len(summary_lines) == 1 and GRID_HEADER not in done.stderr
    summary = json.loads(summary_lines[0][len("summary: "):])
    pairs = _answers(done.stdout)
    assert summary["labelled"] == len(pairs) and summary["accuracy"] == round(
        sum(label == answer for label, answer in pairs) / len(pairs), 4)
    photos = [p.name for p in wild_subset.glob("*.jpg")]
    per_file = [ln for ln in done.stderr.splitlines() if " INFO " in ln and any(name in ln for name in photos)]
    assert per_file == [], "an INFO line per file:\n" + "\n".join(per_file)
    said = [ln for ln in done.stderr.splitlines() if "INFO" in ln and "detector input for" in ln]
    assert len(said) == 1 and f"for {len(pairs)} image(s)" in said[0], done.stderr[-3000:]


def test_piped_stderr_keeps_the_json_line_and_a_terminal_gets_the_table(prepared_models: None,
                                                                        wild_subset: Path) -> None:
    """Without a flag: scripts (stderr piped) get the JSON line as before; a person (stderr a terminal) the table."""
    piped = run_cli("analyze", str(wild_subset), "--log-level", "warning")
    assert piped.returncode == 0 and piped.stderr.startswith("summary: {"), piped.stderr[-3000:]
    code, shown, stdout = run_on_terminal("analyze", str(wild_subset), "--log-level", "warning", stream="stderr")
    assert code == 0, shown[-3000:]
    assert GRID_HEADER in shown and "balanced accuracy:" in shown and "summary: {" not in shown, shown[-3000:]
    assert len(stdout.splitlines()) == PER_CLASS * len(EMOTIONS)


def test_precision_and_balanced_accuracy_of_an_imbalanced_set() -> None:
    """Nine happy photos and one sad, all answered happy: 90 % accuracy, but a balanced accuracy of 50 % and a
    precision of 90 % for happy tell that the model only ever says happy."""
    confusion = {"happy": {"happy": 9, "sad": 0, "no_face": 0}, "sad": {"happy": 1, "sad": 0, "no_face": 0}}
    assert balanced_accuracy(confusion) == 0.5
    assert precision_by_class(confusion) == {"happy": (9, 10)}
    summary = {"images": 10, "frames": 0, "faces": 10, "faces_per_image": {"1": 10},
               "emotions": {"happy": 10, "sad": 0}, "seconds": 1.0, "per_second": 10.0, "detector_input": None,
               "labelled": 10, "accuracy": 0.9, "confusion": confusion}
    table = format_summary_table(summary)
    assert "accuracy:           90.0 % (9/10)" in table and "balanced accuracy:  50.0 %" in table
    sad = next(ln for ln in table.splitlines() if ln.startswith("sad "))
    assert sad.split() == ["sad", "1", "0.0", "%", "(0/1)", "-"]  # never answered: no precision, not 0 %
