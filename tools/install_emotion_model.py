"""Make a training run of tools/train_emotion.py a model of the project: its weights (the run's `model.fp16w.onnx`,
float16 weights behind casts) copied to `models/weights/NAME.onnx` and a manifest `models/NAME.yaml` that
prepare-models reads like any other (repository file, sha256, input size and normalisation, labels).

    python tools/install_emotion_model.py runs/dlib_150 --name dlibface_emotion150 \\
        --description "dlib's face-recognition ResNet fine-tuned for the seven emotions, 150x150 grey"

Why a tool: the manifest's sha256, input size and normalisation must match the file exactly, and the run's
model_card.json already says all of it; copying them by hand is how a manifest ends up describing another file.
The manifest's comment header names the run's command and hold-out figures (the model card in models/README.md says
the rest). Nothing is overwritten without --force.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root
from pipeline.core.types import EMOTIONS  # noqa: E402 - after the path that makes it importable

MODELS = Path(__file__).resolve().parents[1] / "models"


def manifest_for(name: str, description: str, card: dict, weights_sha256: str) -> dict:
    """The manifest of a run's network: what train_emotion.py's export takes and gives (see its docstring)."""
    size = int(card["settings"]["size"])
    return {
        "name": name, "role": "emotion", "description": description,
        "source": {"kind": "repository_file", "path": f"weights/{name}.onnx", "sha256": weights_sha256,
                   "format": "onnx",
                   "license": "project weights (this repository's licence); see models/README.md"},
        "raw_input": {"name": "input", "layout": "NCHW", "scale": 1 / 255, "mean": [0.5], "std": [0.5]},
        "input": {"color": "gray", "size": [size, size]},
        "outputs": ["probs"], "labels": list(EMOTIONS), "min_agreement": 0.90,
    }


def header_for(card: dict) -> str:
    """Comment lines: how the weights were made and what they scored on the hold-outs."""
    figures = card["figures"]
    lines = [f"# Trained by tools/train_emotion.py ({card['date']}, torch {card['torch']} on {card['device']}, "
             f"{card['train_s']} s), installed by tools/install_emotion_model.py. Model card: models/README.md.",
             f"#   {card['command']}"]
    for bundle, scores in figures.get("bundles", {"fer2013": figures}).items():
        lines.append(f"# hold-out {bundle}: {100 * scores['val_acc_flip']:.2f} % (flip), balanced "
                     f"{100 * scores.get('balanced_flip', 0):.2f} %, recall {scores['recall_flip']}")
    lines.append(f"# softmax temperature {figures['temperature']} inside the graph (fitted on the hold-outs)")
    return "\n".join(lines) + "\n"


def install(run: Path, name: str, description: str, force: bool = False, models: Path = MODELS) -> Path:
    """Copy the run's weights and write its manifest; returns the manifest's path."""
    card_path, weights = run / "model_card.json", run / "model.fp16w.onnx"
    for needed in (card_path, weights):
        if not needed.is_file():
            raise SystemExit(f"{needed}: missing (is {run} a finished tools/train_emotion.py --out folder?)")
    target, manifest_path = models / "weights" / f"{name}.onnx", models / f"{name}.yaml"
    existing = [str(p) for p in (target, manifest_path) if p.exists()]
    if existing and not force:
        raise SystemExit(f"{', '.join(existing)} already exist(s): pass --force to replace")
    card = json.loads(card_path.read_text())
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(weights, target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    body = yaml.safe_dump(manifest_for(name, description, card, digest), sort_keys=False, width=120)
    manifest_path.write_text(header_for(card) + body)
    return manifest_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a tools/train_emotion.py --out folder")
    parser.add_argument("--name", required=True, help="the model's name (emotion.model in the config)")
    parser.add_argument("--description", required=True, help="one line for humans")
    parser.add_argument("--force", action="store_true", help="replace an existing manifest and weights")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    path = install(args.run, args.name, args.description, args.force)
    print(f"wrote {path} and {MODELS / 'weights' / (args.name + '.onnx')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
