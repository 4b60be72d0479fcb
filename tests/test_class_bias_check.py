"""tools/class_bias_check.py (issue 13, item 4): the per-class bias fit, and its figures against `analyze`'s own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.conftest import data_path, load_tool, run_cli


def test_fit_recovers_a_known_prior_shift() -> None:
    """Labels drawn from softmax(scores + b): the NLL fit finds b again (zero mean), and answering with it is right
    more often than without."""
    tool = load_tool("class_bias_check")
    rng = np.random.default_rng(7)
    scores = rng.normal(scale=2.0, size=(40_000, 7))
    shift = np.array([0.8, -1.2, 0.3, 0.0, -0.4, 0.6, -0.1])
    shift -= shift.mean()
    probs = np.exp(scores + shift)
    probs /= probs.sum(axis=1, keepdims=True)
    labels = (rng.random((len(probs), 1)) > probs.cumsum(axis=1)).sum(axis=1)  # one draw per row
    log_probs = scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))
    fitted = tool.fit_bias(log_probs, labels)
    assert np.abs(fitted - shift).max() < 0.08, (fitted, shift)
    assert abs(fitted.mean()) < 1e-9
    untouched = tool.figures(log_probs, labels, np.zeros(7))["accuracy"]
    assert tool.figures(log_probs, labels, fitted)["accuracy"] > untouched


def test_figures_match_analyze_and_a_missing_face_counts_as_wrong(prepared_models: None, tmp_path: Path) -> None:
    """Read back from `analyze`'s real output (the default model on the labelled FER2013 crops), the tool's unbiased
    accuracy is analyze's own summary figure; a line without a face is read as wrong, not dropped."""
    tool = load_tool("class_bias_check")
    result = run_cli("analyze", "--cropped", str(data_path("faces", "fer2013")))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stderr.split("summary: ", 1)[1].splitlines()[0])
    answers = tmp_path / "fer.jsonl"
    answers.write_text(result.stdout)
    log_probs, labels = tool.read_answers(answers)
    assert len(labels) == summary["labelled"] == 350
    assert tool.figures(log_probs, labels, np.zeros(7))["accuracy"] == summary["accuracy"]
    with answers.open("a") as out:
        out.write(json.dumps({"source": "x.jpg", "frame": 0, "faces": [], "label": "happy"}) + "\n")
    log_probs, labels = tool.read_answers(answers)
    correct = round(summary["accuracy"] * 350)
    assert tool.figures(log_probs, labels, np.zeros(7))["accuracy"] == round(correct / 351, 4)
