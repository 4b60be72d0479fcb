"""`analyze` on real images and videos."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.core.types import EMOTIONS
from tests.conftest import ROOT, data_path, run_cli


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


def _bundle_of(folder: Path, target: Path) -> list[Path]:
    """The labelled crops of `folder` (<emotion>/<file>) written as an .npz in FER2013's training-split layout (the
    JPEG bytes unchanged); returns the files in the bundle's order."""
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in {".jpg", ".jpeg", ".png"})
    blobs = [np.frombuffer(p.read_bytes(), np.uint8) for p in files]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    labels = np.array([EMOTIONS.index(p.parent.name) for p in files], np.uint8)
    np.savez(target, jpeg=np.concatenate(blobs), offsets=offsets, labels=labels, label_names=np.array(EMOTIONS),
             names=np.array([p.name for p in files]))
    return files


def test_npz_of_crops_reads_like_the_same_images_in_folders(prepared_models: None, tmp_path: Path) -> None:
    """An .npz bundle (FER2013's training split's layout) gives each crop's label and the same probabilities as the
    same JPEG files analysed from their folders."""
    folder = data_path("faces", "fer2013")
    bundle = tmp_path / "crops.npz"
    files = _bundle_of(folder, bundle)
    from_folder = run_cli("analyze", "--cropped", str(folder), "--log-level", "warning")
    from_bundle = run_cli("analyze", "--cropped", str(bundle), "--log-level", "warning")
    assert from_folder.returncode == 0 and from_bundle.returncode == 0, from_bundle.stderr[-2000:]
    by_file = {Path(r["source"]).name: r for r in map(json.loads, from_folder.stdout.splitlines())}
    lines = [json.loads(ln) for ln in from_bundle.stdout.splitlines()]
    assert [r["source"] for r in lines] == [f"{bundle}#{i}" for i in range(len(files))]
    for record, path in zip(lines, files):
        same = by_file[path.name]
        assert record["label"] == same["label"] == path.parent.name
        ours, theirs = record["faces"][0]["probs"], same["faces"][0]["probs"]
        assert max(abs(ours[e] - theirs[e]) for e in EMOTIONS) < 1e-3
    assert _summary(from_bundle.stderr)["accuracy"] == _summary(from_folder.stderr)["accuracy"]


def test_holdout_scores_the_crops_training_holds_out(prepared_models: None, tmp_path: Path) -> None:
    """--holdout keeps the stratified 10 % that tools/train_emotion.py never trains on (its split function, seed
    and fraction are the ones analyze uses): on the real training split, 2,872 crops."""
    from pipeline.tools.fer_npz import (
        HOLDOUT_FRACTION,
        HOLDOUT_SEED,
        load_bundle,
        stratified_split,
    )

    bundle = tmp_path / "crops.npz"
    _bundle_of(data_path("faces", "fer2013"), bundle)
    done = run_cli("analyze", "--cropped", "--holdout", str(bundle), "--log-level", "warning")
    assert done.returncode == 0, done.stderr[-2000:]
    labels = load_bundle(bundle).labels
    _, expected = stratified_split(labels, HOLDOUT_FRACTION, HOLDOUT_SEED, len(EMOTIONS))
    positions = [int(json.loads(ln)["source"].rsplit("#", 1)[1]) for ln in done.stdout.splitlines()]
    assert positions == expected.tolist() and len(positions) == 35  # 5 of each class's 50
    assert all(len([p for p in positions if labels[p] == c]) == 5 for c in range(len(EMOTIONS)))

    split = data_path("train", "fer2013_train_jpeg.npz")
    light = tmp_path / "mini.yaml"  # the selection is what is checked here, not the model: the 64 px one is 7x cheaper
    settings = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    settings["emotion"]["model"] = "mini_xception_fer2013"
    light.write_text(yaml.safe_dump(settings))
    real = run_cli("analyze", "--cropped", "--holdout", str(split), "--config", str(light), "--log-level", "warning")
    assert real.returncode == 0, real.stderr[-2000:]
    summary = _summary(real.stderr)
    assert summary["images"] == summary["labelled"] == 2872
    confusion: dict[str, dict[str, int]] = summary["confusion"]  # type: ignore[assignment]
    assert {e: sum(confusion[e].values()) for e in EMOTIONS} == {
        "angry": 400, "disgust": 44, "fear": 410, "happy": 722, "sad": 483, "surprise": 317, "neutral": 496}


@pytest.mark.parametrize(("make", "args", "complaint"), [
    ("npz", [], "analyze it with --cropped"),
    ("jpg", ["--cropped", "--holdout"], "--holdout selects crops of an .npz"),
    ("broken", ["--cropped"], "not an .npz of face crops"),
])
def test_npz_misuse_is_a_clear_error(tmp_path: Path, make: str, args: list[str], complaint: str) -> None:
    path = tmp_path / ("crops.npz" if make != "jpg" else "face.jpg")
    if make == "npz":
        _bundle_of(data_path("faces", "fer2013"), path)
    elif make == "jpg":
        path.write_bytes(next(data_path("faces", "fer2013").rglob("*.jpg")).read_bytes())
    else:
        path.write_bytes(b"PK\x03\x04 not really a zip")
    done = run_cli("analyze", *args, str(path), "--log-level", "warning")
    assert done.returncode == 2 and complaint in done.stderr and "Traceback" not in done.stderr, done.stderr[-1500:]
