"""The project's own emotion model (issue 13): the committed weights, their float16 storage folded back by
prepare-models, and the prepared model reading real photos through the detector."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from pipeline.modelprep.graph_edit import restore_fp32_weights
from pipeline.modelprep.manifest import MODELS_DIR, load_manifest
from pipeline.modelprep.prepare import prepare_model, sha256_of
from tests.conftest import ROOT, data_path, load_tool, run_cli

NAME = "fer2013_resnet_t64"


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_committed_weights_are_small_and_match_the_manifest() -> None:
    manifest = load_manifest(NAME)
    path = MODELS_DIR / (manifest.source.path or "")
    assert path.stat().st_size <= 10 * 1024 * 1024  # the limit for weights in the repository
    assert sha256_of(path.read_bytes()) == manifest.source.sha256


def test_float16_storage_folds_back_to_the_same_network() -> None:
    """The committed file computes in float32 behind Cast nodes; restore_fp32_weights turns those into plain float32
    initializers (what the int8 quantizer needs) without changing a single output; storing again halves the size."""
    committed = onnx.load(str(MODELS_DIR / "weights" / f"{NAME}.onnx"))
    x = np.random.default_rng(0).normal(size=(4, 1, 64, 64)).astype(np.float32)
    expected = _run(committed, x)
    restored = restore_fp32_weights(onnx.load(str(MODELS_DIR / "weights" / f"{NAME}.onnx")))
    assert not [n for n in restored.graph.node if n.op_type == "Cast"]
    assert {init.data_type for init in restored.graph.initializer} == {onnx.TensorProto.FLOAT}
    assert np.abs(_run(restored, x) - expected).max() < 1e-6
    stored = load_tool("onnx_fp16_weights").store_weights_fp16(restored)
    assert stored.ByteSize() < 0.55 * restored.ByteSize()
    assert np.abs(_run(stored, x) - expected).max() < 1e-6  # the same fp16 values, stored again


def test_float32_graph_without_casts_is_left_alone(prepared_models: None) -> None:
    model = onnx.load(str(MODELS_DIR / "mini_xception_fer2013.fp32.onnx"))
    before = model.SerializeToString()
    assert restore_fp32_weights(model).SerializeToString() == before


@pytest.mark.slow
def test_own_model_reads_faces_in_real_photos(tmp_path: Path) -> None:
    """Prepared from the committed weights, selected with emotion.model, through the detector on faces/wild: 50.3 %
    when committed (mini-Xception 48.5 %, BENCHMARKS.md). A wrong normalisation or channel order falls to chance."""
    wild = data_path("faces", "wild")
    prepare_model(load_manifest(NAME), ["fp32"])
    config = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    config["emotion"]["model"] = NAME
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run_cli("analyze", str(wild), "--config", str(path), "--log-level", "warning")
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("summary: "))
    summary = json.loads(line[len("summary: "):])
    assert summary["labelled"] == 171 and summary["accuracy"] >= 0.45, summary
    assert summary["recall"]["happy"] >= 0.8, summary["recall"]
