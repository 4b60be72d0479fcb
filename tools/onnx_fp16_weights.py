"""Store an ONNX network's float32 weights as float16, so the project's own trained models stay small enough to
commit (issue 13: the repository carries the weights, at most 10 MB; resnet_t's 2.8 M parameters are 11.2 MB in
float32, 5.6 MB in float16).

The file stays a valid fp32 network: each large float32 initializer W becomes a float16 initializer `W.fp16` and a
`Cast(to=FLOAT)` node producing W again, so every consumer still sees float32. prepare-models folds those casts back
into float32 initializers (`pipeline.modelprep.graph_edit.restore_fp32_weights`) before it adds preprocessing and
builds the fp32 / fp16 / int8 variants; the only change to the trained network is fp16's rounding of the weights
(the figures it costs are in models/README.md).

    python tools/onnx_fp16_weights.py runs/resnet_t_64/model.onnx models/weights/fer2013_resnet_t64.onnx
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SUFFIX = ".fp16"
MIN_ELEMENTS = 16  # scalars and tiny vectors (the temperature, shapes) stay as they are


def store_weights_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose float32 initializers of MIN_ELEMENTS or more are stored in float16 behind a Cast."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    kept, casts = [], []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < MIN_ELEMENTS:
            kept.append(init)
            continue
        half = numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name + SUFFIX)
        kept.append(half)
        casts.append(helper.make_node("Cast", [half.name], [init.name], name="fp16w_" + init.name,
                                      to=TensorProto.FLOAT))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [*casts, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="an fp32 ONNX file (tools/train_emotion.py's model.onnx)")
    parser.add_argument("target", type=Path, help="where the file with fp16-stored weights goes")
    args = parser.parse_args(argv)
    onnx.save(store_weights_fp16(onnx.load(str(args.source))), str(args.target))
    print(f"{args.target}: {args.target.stat().st_size / 1e6:.1f} MB (from {args.source.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
