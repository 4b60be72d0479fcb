"""tools/ensemble_onnx.py: several emotion networks in one graph whose output is the mean of their probabilities.
Real committed weights through ONNX Runtime: two networks averaged equal the mean of each one run alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import ROOT, load_tool

WEIGHTS = ROOT / "models" / "weights"


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> np.ndarray:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(["probs"], {"input": x})[0]


def test_the_ensemble_is_the_mean_of_its_members() -> None:
    tool = load_tool("ensemble_onnx")
    student, other = WEIGHTS / "dlibface_student64.onnx", WEIGHTS / "fer2013_resnet_t64.onnx"
    members = [onnx.load(str(student)), onnx.load(str(other))]
    x = np.random.default_rng(3).uniform(-1, 1, (4, 1, 64, 64)).astype(np.float32)
    expected = (_run(student, x) + _run(other, x)) / 2
    merged = tool.ensemble(members)
    assert np.allclose(_run(merged, x), expected, atol=1e-5)
    assert np.allclose(_run(merged, x).sum(axis=1), 1.0, atol=1e-5)


def test_networks_of_different_inputs_are_refused() -> None:
    tool = load_tool("ensemble_onnx")
    with pytest.raises(SystemExit, match="different inputs"):
        tool.ensemble([onnx.load(str(WEIGHTS / "dlibface_student64.onnx")),
                       onnx.load(str(WEIGHTS / "dlibface_emotion150.onnx"))])
