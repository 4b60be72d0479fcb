"""Would a per-class bias on the emotion model's output help? (issue 13, item 4: "temperature, and per-class bias if it
helps neutral").

A bias b (one number per emotion, added to the log-probabilities before the arg-max) is fitted on the validation
hold-out only, two ways: minimum NLL (calibration: the bias that makes the hold-out's probabilities honest) and
class-balanced NLL (each emotion weighted by 1 / its count: the bias a balanced recall would want). Both are then
applied unchanged to every other set given, `faces/wild` typically, whose figures say whether it helps there. Nothing
is tuned on those sets. Input: `analyze`'s JSON lines (one face per image; an image without a face counts as wrong).

    python run_pipeline.py analyze --config C --cropped --holdout fer2013_train_jpeg.npz > holdout.jsonl
    python run_pipeline.py analyze --config C ../shared/data/faces/wild > wild.jsonl
    python tools/class_bias_check.py holdout.jsonl wild.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for the emotions' one order
from pipeline.core.types import EMOTIONS  # noqa: E402 - after the path that makes it importable

FLOOR = 1e-6  # analyze rounds probabilities to 4 decimals: a 0.0 must not become log(0)


def read_answers(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(log-probabilities [N, 7], NaN rows where no face was found; labels [N]) of an `analyze` output's labelled
    lines."""
    rows: list[np.ndarray] = []
    labels: list[int] = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("label") not in EMOTIONS:
            continue
        labels.append(EMOTIONS.index(record["label"]))
        faces = record.get("faces") or []
        if not faces:
            rows.append(np.full(len(EMOTIONS), np.nan))
            continue
        probs = np.array([faces[0]["probs"][e] for e in EMOTIONS], dtype=np.float64)
        rows.append(np.log(np.maximum(probs, FLOOR)))
    return np.array(rows, dtype=np.float64).reshape(-1, len(EMOTIONS)), np.array(labels, dtype=np.int64)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def fit_bias(log_probs: np.ndarray, labels: np.ndarray, balanced: bool = False, steps: int = 50,
             tolerance: float = 1e-10) -> np.ndarray:
    """The bias (zero mean) minimising the (class-balanced) NLL of softmax(log_probs + b): a convex problem in b,
    solved by Newton's method (gradient mean(softmax - one-hot), Hessian the weighted covariance of the softmax;
    a handful of steps where plain gradient descent needed thousands). The Hessian is singular along the all-ones
    direction (adding a constant to b changes nothing), so that direction is pinned by adding 11^T."""
    found = ~np.isnan(log_probs).any(axis=1)
    x, y = log_probs[found], labels[found]
    classes = x.shape[1]
    counts = np.bincount(y, minlength=classes).astype(np.float64)
    weights = (1.0 / np.maximum(counts, 1.0))[y] if balanced else np.ones(len(y))
    weights = weights / weights.sum()
    target = np.eye(classes)[y]
    bias, pin = np.zeros(classes), np.ones((classes, classes))
    for _ in range(steps):
        probs = _softmax(x + bias)
        gradient = (weights[:, None] * (probs - target)).sum(axis=0)
        hessian = np.diag((weights[:, None] * probs).sum(axis=0)) - (weights[:, None] * probs).T @ probs
        step = np.linalg.solve(hessian + pin, gradient)
        bias -= step
        if np.abs(step).max() < tolerance:
            break
    return bias - bias.mean()


def figures(log_probs: np.ndarray, labels: np.ndarray, bias: np.ndarray) -> dict[str, object]:
    """Accuracy and per-class recall with `bias` added (no face: wrong)."""
    found = ~np.isnan(log_probs).any(axis=1)
    answers = np.full(len(labels), -1)
    answers[found] = np.argmax(log_probs[found] + bias, axis=1)
    recall = {e: round(float((answers[labels == k] == k).mean()), 3)
              for k, e in enumerate(EMOTIONS) if (labels == k).any()}
    return {"accuracy": round(float((answers == labels).mean()), 4), "recall": recall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("holdout", type=Path, help="analyze's output on the validation hold-out (the bias is fitted here)")
    parser.add_argument("others", type=Path, nargs="*", help="analyze's outputs on other sets (only evaluated)")
    args = parser.parse_args(argv)
    holdout = read_answers(args.holdout)
    others = {path.name: read_answers(path) for path in args.others}
    for name, bias in (("none", np.zeros(len(EMOTIONS))), ("nll", fit_bias(*holdout)),
                       ("balanced", fit_bias(*holdout, balanced=True))):
        line: dict[str, object] = {"bias": name, "values": dict(zip(EMOTIONS, np.round(bias, 3).tolist())),
                                   args.holdout.name: figures(*holdout, bias)}
        line.update({label: figures(*answers, bias) for label, answers in others.items()})
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
