"""Training the emotion models (issue 24): the bundles' hold-outs, their framing and draw weights, a short real run
of tools/train_emotion.py for the fine-tuned dlib network and a student distilled from it, and installing a run as
a model of the project. The runs are tiny (a few hundred crops, one epoch, on the CPU): they check that the code
paths work end to end, not what they learn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.modelprep.manifest import load_manifest
from pipeline.modelprep.prepare import sha256_of
from pipeline.tools.fer_npz import holdout, load_bundle, person_of, person_split
from tests.conftest import ROOT, data_path, load_tool

sys.path.insert(0, str(ROOT / "tools"))  # the training scripts import their siblings by name


def test_person_split_keeps_every_photo_of_a_person_on_one_side() -> None:
    sources = np.array([f"{name}_{k:04d}.jpg" for name in ("Ann_Lee", "Bo", "Cy_Dee", "Di") for k in range(1, 4)]
                       + ["Eve_0001.jpg", "odd-name.jpg"])
    train, val = person_split(sources, 0.5, seed=3)
    assert sorted([*train, *val]) == list(range(len(sources)))
    people_val = {person_of(s) for s in sources[val]}
    assert people_val and not people_val & {person_of(s) for s in sources[train]}
    assert len(people_val) == 3  # half of the six people, rounded
    assert person_of("Tony_Blair_0042.jpg") == "Tony_Blair" and person_of("odd-name.jpg") == "odd-name"


def test_photo_bundle_hold_out_is_by_person_and_keeps_its_framing() -> None:
    bundle = load_bundle(data_path("train", "mux_dwdii_112.npz"))
    assert bundle.box_margin == 0.25 and bundle.sources is not None
    held = holdout(bundle)
    assert len(held) == 638  # every photo of 10 % of the 3,056 people (split seed 20261201)
    kept = set(range(len(bundle))) - set(held.positions.tolist())
    assert not {person_of(s) for s in held.sources} & {person_of(bundle.sources[i]) for i in kept}  # type: ignore


def test_analyze_scores_the_photo_hold_out_cut_as_the_pipeline_cuts(prepared_models: None) -> None:
    """`analyze --cropped --holdout` on the photo bundle: the 638 held-out crops, each cut again around its face box
    with the config's box_margin (0: the central 1/1.5 of the stored crop)."""
    from tests.conftest import run_cli

    done = run_cli("analyze", "--cropped", "--holdout", str(data_path("train", "mux_dwdii_112.npz")),
                   "--log-level", "info")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "10 % of the people" in done.stderr
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("summary: "))
    summary = json.loads(line[len("summary: "):])
    assert summary["labelled"] == 638 and summary["accuracy"] > 0.3, summary


def test_crop_from_a_photo_bundle_is_the_box_crop_of_its_face() -> None:
    """A stored crop cut at margin 0.25 and cut again at margin 0 is its central 1/1.5, exactly as box_crop cuts the
    face box out of the original photo."""
    import cv2

    from pipeline.vision.align import box_crop
    from pipeline.vision.faces import FaceCropper

    image = np.random.default_rng(0).integers(0, 255, (112, 112), dtype=np.uint8)
    cropper = FaceCropper((64, 64), "gray", "box", 0.0)
    got = cropper.crop_from_still(image, stored_margin=0.25)[:, :, 0]
    half = 112 / 1.5 / 2
    expected = box_crop(cv2.cvtColor(image, cv2.COLOR_GRAY2BGR), (56 - half, 56 - half, 56 + half, 56 + half),
                        (64, 64), 0.0)
    assert np.array_equal(got, cv2.cvtColor(expected, cv2.COLOR_BGR2GRAY))
    whole = cropper.crop_from_still(image)[:, :, 0]  # FER2013-style: the whole crop, resized
    assert np.array_equal(whole, cv2.resize(image, (64, 64), interpolation=cv2.INTER_LINEAR))


def test_draw_weights_pooled_or_per_bundle() -> None:
    pytest.importorskip("torch", reason="training needs torch: pip install -r requirements-train.txt")
    data = load_tool("emotion_data")
    labels = np.array([6, 6, 6, 6, 0, 6, 3])  # bundle 0: four neutral, one angry; bundle 1: a neutral, a happy
    sources = np.array([0, 0, 0, 0, 0, 1, 1])
    pooled = data.sampling_weights(labels, sources, (1.0, 1.0))
    per_bundle = data.sampling_weights(labels, sources, (1.0, 1.0), per_bundle=True)
    assert pooled.sum() == pytest.approx(1.0) and per_bundle.sum() == pytest.approx(1.0)
    assert pooled[5] == pytest.approx(pooled[0])  # pooled: a neutral is a neutral, whichever bundle
    assert per_bundle[5] == pytest.approx(2 * per_bundle[0])  # its own bundle holds 1 neutral, not 4: 1/√1 vs 1/√4
    weighted = data.sampling_weights(labels, sources, (1.0, 3.0))
    assert weighted[6] / weighted[4] == pytest.approx(3.0)  # one happy, one angry: only the bundle weight differs


def test_view_frames_photo_crops_like_the_pipeline() -> None:
    """The training view of a photo crop (framing 1/1.5) is the pipeline's box crop of its face box, up to the
    difference between grid_sample's and warpAffine's bilinear sampling."""
    torch = pytest.importorskip("torch", reason="training needs torch: pip install -r requirements-train.txt")
    from pipeline.vision.faces import FaceCropper

    data = load_tool("emotion_data")
    image = load_bundle(data_path("train", "mux_dwdii_112.npz")).images[0]
    seen = data.view(torch.from_numpy(image[None]), 64, 1 / 1.5)[0, 0].numpy()
    pipeline = FaceCropper((64, 64), "gray", "box", 0.0).crop_from_still(image, 0.25)[:, :, 0].astype(np.float32)
    assert np.abs(seen - pipeline).mean() < 2.0


def _train(out: Path, *args: str) -> dict:
    torch = pytest.importorskip("torch", reason="training needs torch: pip install -r requirements-train.txt")
    del torch
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "train_emotion.py"),
                           "--data", str(data_path("train", "fer2013_train_jpeg.npz")),
                           "--photos", str(data_path("train", "mux_dwdii_112.npz")),
                           "--out", str(out), "--epochs", "1", "--batch", "16", "--limit", "96", "--device", "cpu",
                           *args], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "model_card.json").read_text())


def test_fine_tune_dlib_then_distil_a_student_then_install_it(tmp_path: Path) -> None:
    """The whole chain on real data, tiny: dlib's network fine-tuned from its .dat (pretrained), exported to ONNX that
    ONNX Runtime agrees with; a resnet_t student distilled from it (the teacher fed 150 px crops); the student
    installed as a model whose manifest prepare-models can read, with the right hash and input size."""
    dlib_resnet = load_tool("dlib_resnet")
    try:
        dlib_resnet.model_file()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    teacher = _train(tmp_path / "teacher", "--arch", "dlib_resnet", "--size", "150", "--optimizer", "adamw",
                     "--lr", "0.001", "--backbone-lr", "0.1", "--clip", "1", "--balance", "bundle")
    assert set(teacher["figures"]["bundles"]) == {"fer2013", "mux_dwdii_112"}
    assert teacher["onnx_max_abs_diff"] < 1e-4 and teacher["parameters"] > 5_000_000
    student = _train(tmp_path / "student", "--arch", "resnet_t", "--size", "64", "--teacher",
                     str(tmp_path / "teacher"))
    assert student["teacher"] == [str(tmp_path / "teacher")] and student["settings"]["distill_weight"] == 0.5
    assert (tmp_path / "student" / "model.fp16w.onnx").stat().st_size < 6_000_000

    install = load_tool("install_emotion_model")
    path = install.install(tmp_path / "student", "tiny_student", "a test", models=tmp_path / "models")
    manifest = load_manifest("tiny_student", tmp_path / "models")
    assert manifest.input.size == (64, 64) and manifest.input.color == "gray"
    assert manifest.source.sha256 == sha256_of((tmp_path / "models" / "weights" / "tiny_student.onnx").read_bytes())
    assert "python tools/train_emotion.py" in path.read_text()
    with pytest.raises(SystemExit, match="already exist"):
        install.install(tmp_path / "student", "tiny_student", "again", models=tmp_path / "models")
