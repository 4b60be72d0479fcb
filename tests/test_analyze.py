"""`analyze` on real images and videos."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.types import EMOTIONS
from tests.conftest import data_path, run_cli


def _summary(stderr: str) -> dict[str, object]:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("summary: "))
    return json.loads(line[len("summary: "):])  # type: ignore[no-any-return]


def test_cropped_fer2013_accuracy(prepared_models: None) -> None:
    """FER2013 training crops: the converted model should score high (78.6 % measured; fer's own model is the same)."""
    folder = data_path("faces", "fer2013")
    done = run_cli("analyze", "--cropped", str(folder), "--log-level", "warning")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(ln) for ln in done.stdout.splitlines()]
    assert len(lines) == 350
    assert all(len(r["faces"]) == 1 and r["label"] in r["faces"][0]["probs"] for r in lines)
    summary = _summary(done.stderr)
    assert summary["images"] == 350 and summary["labelled"] == 350
    assert float(summary["accuracy"]) >= 0.70  # type: ignore[arg-type]
    # Per-class recall and the confusion matrix, recomputed from the per-image lines (50 crops per emotion).
    confusion: dict[str, dict[str, int]] = summary["confusion"]  # type: ignore[assignment]
    assert set(confusion) == set(EMOTIONS) and all(sum(row.values()) == 50 for row in confusion.values())
    for label in EMOTIONS:
        answers = [max(r["faces"][0]["probs"], key=r["faces"][0]["probs"].get) for r in lines if r["label"] == label]
        assert {a: answers.count(a) for a in set(answers)} == {a: n for a, n in confusion[label].items() if n}
        assert summary["recall"][label] == round(answers.count(label) / 50, 4)  # type: ignore[index]
    assert sum(confusion[e][e] for e in EMOTIONS) == round(float(summary["accuracy"]) * 350)  # type: ignore[arg-type]


def test_wild_photos_one_face_each_and_accuracy_reported(prepared_models: None) -> None:
    folder = data_path("faces", "wild")
    done = run_cli("analyze", str(folder), "--log-level", "warning")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = _summary(done.stderr)
    assert summary["images"] == 171 and summary["labelled"] == 171
    per_image: dict[str, int] = summary["faces_per_image"]  # type: ignore[assignment]
    assert per_image.get("1", 0) >= 160
    assert 0.3 <= float(summary["accuracy"]) <= 1.0  # type: ignore[arg-type]  # noisy crowd labels: ~47 % measured


def test_video_every_nth_frame(prepared_models: None) -> None:
    video = data_path("video", "woman_short.mp4")
    done = run_cli("analyze", str(video), "--every", "10", "--log-level", "warning")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(ln) for ln in done.stdout.splitlines()]
    assert [r["frame"] for r in lines] == list(range(0, 115, 10))
    assert sum(len(r["faces"]) >= 1 for r in lines) >= 10
    assert all("track_id" not in f for r in lines for f in r["faces"])


def test_unreadable_inputs_are_named_and_exit_2(prepared_models: None, tmp_path: Path) -> None:
    bad_image = tmp_path / "broken.jpg"
    bad_image.write_bytes(b"\xff\xd8 not really a jpeg")
    bad_video = tmp_path / "truncated.mp4"
    bad_video.write_bytes(data_path("video", "woman_short.mp4").read_bytes()[:2000])
    done = run_cli("analyze", str(bad_image), str(bad_video), "--log-level", "warning")
    assert done.returncode == 2
    assert "broken.jpg" in done.stderr and "truncated.mp4" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_path_exits_2(tmp_path: Path) -> None:
    done = run_cli("analyze", str(tmp_path / "nothing.jpg"))
    assert done.returncode == 2 and "nothing.jpg" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("crop", ["align", "box"])
def test_both_crop_modes_run(prepared_models: None, crop: str) -> None:
    folder = data_path("faces", "wild")
    image = sorted(folder.glob("*.jpg"))[5]
    done = run_cli("analyze", str(image), "--crop", crop, "--log-level", "warning")
    assert done.returncode == 0 and json.loads(done.stdout)["faces"]
