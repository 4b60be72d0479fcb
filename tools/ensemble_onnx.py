"""One ONNX graph that runs several emotion networks of tools/train_emotion.py on the same input and outputs the mean
of their probabilities: an ensemble the pipeline loads like any single model (one manifest, one session).

    python tools/ensemble_onnx.py runs/a/model.fp16w.onnx runs/b/model.fp16w.onnx --out runs/ab/model.fp16w.onnx

Why a graph and not several sessions: the inference wing batches one classifier per device; several sessions would
need several batches, arenas and prepared variants. Every member must take the same input (name, size, channels)
and output `probs` [N, 7]; each member's names get a prefix so the graphs do not collide.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
from onnx import compose, helper

INPUT, OUTPUT = "input", "probs"


def _input_shape(model: onnx.ModelProto) -> list[int | str]:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return [d.dim_param or d.dim_value for d in dims]


def ensemble(members: list[onnx.ModelProto]) -> onnx.ModelProto:
    """The members' probabilities averaged, in one graph sharing their input."""
    if len(members) < 2:
        raise SystemExit("an ensemble needs at least two networks")
    shapes = {tuple(_input_shape(m)[1:]) for m in members}
    if len(shapes) != 1:
        raise SystemExit(f"the networks take different inputs: {sorted(shapes)}")
    nodes, initializers, outputs = [], [], []
    for k, member in enumerate(members):
        names = {i.name for i in member.graph.input} | {o.name for o in member.graph.output}
        if names != {INPUT, OUTPUT}:
            raise SystemExit(f"network {k}: inputs/outputs {sorted(names)}, expected {INPUT!r} and {OUTPUT!r}")
        prefixed = compose.add_prefix(member, f"m{k}_")
        for node in prefixed.graph.node:
            node.input[:] = [INPUT if name == f"m{k}_{INPUT}" else name for name in node.input]
        nodes.extend(prefixed.graph.node)
        initializers.extend(prefixed.graph.initializer)
        outputs.append(f"m{k}_{OUTPUT}")
    share = helper.make_tensor("ensemble_share", onnx.TensorProto.FLOAT, [], [1.0 / len(members)])
    nodes.append(helper.make_node("Sum", outputs, ["ensemble_sum"], name="ensemble_sum"))
    nodes.append(helper.make_node("Mul", ["ensemble_sum", "ensemble_share"], [OUTPUT], name="ensemble_mean"))
    first = members[0].graph
    graph = helper.make_graph(nodes, "emotion_ensemble", list(first.input), list(first.output),
                              initializer=[*initializers, share])
    model = helper.make_model(graph, opset_imports=list(members[0].opset_import))
    model.ir_version = members[0].ir_version
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("members", type=Path, nargs="+", help="ONNX files of tools/train_emotion.py runs")
    parser.add_argument("--out", type=Path, required=True, help="the ensemble's ONNX file")
    args = parser.parse_args()
    model = ensemble([onnx.load(str(path)) for path in args.members])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(args.out))
    print(f"{args.out}: {len(args.members)} networks, {args.out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
