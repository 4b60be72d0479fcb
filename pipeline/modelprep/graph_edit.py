"""Edits prepare-models makes to a network's ONNX graph, so that work happens on the device instead of in Python.

- `add_uint8_preprocessing`: the graph takes uint8 NHWC pixels and does cast, mean/scale and transpose itself,
  so 4x fewer bytes cross to an accelerator and no per-frame float work runs in Python.
- `add_top_candidates`: a detector keeps only its K best-scoring anchors (TopK + gather), so what is copied back
  to the host per image is K rows instead of every anchor (at 640x352: 9,240 anchors, 591 KB of float32 per image,
  which limited the detector to ~2,500 images/s on the H200: see BENCHMARKS.md).
- `restore_fp32_weights`: the project's own trained weights are committed stored in float16 behind Cast nodes
  (tools/onnx_fp16_weights.py, to keep the repository small); they are folded back into float32 initializers first,
  so every variant (fp32, fp16, int8: the quantizer only sees weights that are initializers) starts from a plain
  float32 network.
The first two edits are driven by the model's manifest, never by guessing from tensor shapes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter

from pipeline.modelprep.manifest import (
    CANDIDATE_ANCHOR,
    CANDIDATE_SCORE,
    RawInputSpec,
    TopCandidatesSpec,
)

PREPARED_INPUT = "image"
PREPROCESSING_NODES = ("pre_cast", "pre_mul", "pre_add", "pre_transpose")
CANDIDATE_NODES = ("cand_score", "cand_shape", "cand_count", "cand_k", "cand_topk", "cand_index")
# GatherND's batch_dims and Min over int64 need opset 12+; older graphs are converted (outputs unchanged: tested).
CANDIDATE_OPSET = 13


class GraphEditError(ValueError):
    """The manifest's description does not fit the graph (a named output is missing, a size is off)."""


def restore_fp32_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Fold every `Cast(to=FLOAT)` whose input is a float16 initializer into a float32 initializer of the Cast's
    output name (what tools/onnx_fp16_weights.py wrote); a graph without such casts is returned unchanged."""
    graph = model.graph
    halves = {init.name: init for init in graph.initializer if init.data_type == TensorProto.FLOAT16}
    folded = [node for node in graph.node if node.op_type == "Cast" and len(node.input) == 1
              and node.input[0] in halves and _cast_target(node) == TensorProto.FLOAT]
    if not folded:
        return model
    restored = [numpy_helper.from_array(numpy_helper.to_array(halves[node.input[0]]).astype(np.float32),
                                        node.output[0]) for node in folded]
    used = {node.input[0] for node in folded}
    still_needed = {name for node in graph.node if node not in folded for name in node.input}
    keep = [init for init in graph.initializer if init.name not in used or init.name in still_needed]
    del graph.initializer[:]
    graph.initializer.extend([*keep, *restored])
    nodes = [node for node in graph.node if node not in folded]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    return model


def _cast_target(node: onnx.NodeProto) -> int | None:
    """The `to` data type of a Cast node (by name: newer opsets add a `saturate` attribute)."""
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "to"), None)


def add_uint8_preprocessing(model: onnx.ModelProto, raw: RawInputSpec, channels: int,
                            size: tuple[int, int] | None) -> onnx.ModelProto:
    """Make the graph take uint8 NHWC pixels: Cast → x*(scale/std) + (-mean/std) → Transpose (if NCHW)."""
    graph = model.graph
    scale = np.asarray([raw.scale / s for s in raw.std], dtype=np.float32)
    shift = np.asarray([-m / s for m, s in zip(raw.mean, raw.std)], dtype=np.float32)
    if scale.size not in (1, channels):
        raise GraphEditError(f"manifest mean/std have {scale.size} values for a {channels}-channel input")
    width, height = size if size else ("width", "height")
    new_input = helper.make_tensor_value_info(PREPARED_INPUT, TensorProto.UINT8, ["batch", height, width, channels])
    pre_nodes = [
        helper.make_node("Cast", [PREPARED_INPUT], ["pre_float"], to=TensorProto.FLOAT, name="pre_cast"),
        helper.make_node("Mul", ["pre_float", "pre_scale"], ["pre_scaled"], name="pre_mul"),
        helper.make_node("Add", ["pre_scaled", "pre_shift"], ["pre_norm"], name="pre_add"),
    ]
    last = "pre_norm"
    if raw.layout == "NCHW":
        pre_nodes.append(helper.make_node("Transpose", [last], ["pre_nchw"], perm=[0, 3, 1, 2], name="pre_transpose"))
        last = "pre_nchw"
    for node in graph.node:  # rewire the old input to the end of the preprocessing chain
        node.input[:] = [last if name == raw.name else name for name in node.input]
    old_inputs = [i for i in graph.input if i.name != raw.name]
    del graph.input[:]
    graph.input.extend([new_input, *old_inputs])
    graph.initializer.extend([numpy_helper.from_array(scale, "pre_scale"), numpy_helper.from_array(shift, "pre_shift")])
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(pre_nodes + nodes)
    onnx.checker.check_model(model)
    return model


def add_top_candidates(model: onnx.ModelProto, spec: TopCandidatesSpec) -> onnx.ModelProto:
    """Replace a detector's per-anchor outputs with its `spec.k` best anchors, best first.

    New outputs: `top_score` [N, K] (the score channel), `top_anchor` [N, K] (int64 anchor index, for the host's
    anchor grid) and `top_<name>` [N, K, C] for every output in `spec.gather`. K = min(spec.k, anchors), so a small
    input with fewer anchors than `spec.k` still works."""
    if _opset(model) < CANDIDATE_OPSET:
        model = version_converter.convert_version(model, CANDIDATE_OPSET)
        _drop_empty_optional_inputs(model)
    graph = model.graph
    outputs = {o.name: o for o in graph.output}
    missing = [name for name in (spec.score_output, *spec.gather) if name not in outputs]
    if missing:
        raise GraphEditError(f"top_candidates names outputs the graph lacks: {', '.join(missing)} "
                             f"(it has {', '.join(outputs)})")
    graph.initializer.extend([
        numpy_helper.from_array(np.array(spec.score_channel, dtype=np.int64), "cand_channel"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "cand_axis1"),
        numpy_helper.from_array(np.array([spec.k], dtype=np.int64), "cand_kmax"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "cand_axis2"),
    ])
    graph.node.extend([
        helper.make_node("Gather", [spec.score_output, "cand_channel"], ["cand_scores"], axis=2, name="cand_score"),
        helper.make_node("Shape", ["cand_scores"], ["cand_dims"], name="cand_shape"),
        helper.make_node("Gather", ["cand_dims", "cand_axis1"], ["cand_anchors"], axis=0, name="cand_count"),
        helper.make_node("Min", ["cand_anchors", "cand_kmax"], ["cand_k_value"], name="cand_k"),
        helper.make_node("TopK", ["cand_scores", "cand_k_value"], [CANDIDATE_SCORE, CANDIDATE_ANCHOR], axis=1,
                         largest=1, sorted=1, name="cand_topk"),
        helper.make_node("Unsqueeze", [CANDIDATE_ANCHOR, "cand_axis2"], ["cand_gather_index"], name="cand_index"),
    ])
    new_outputs = [helper.make_tensor_value_info(CANDIDATE_SCORE, TensorProto.FLOAT, ["batch", "candidates"]),
                   helper.make_tensor_value_info(CANDIDATE_ANCHOR, TensorProto.INT64, ["batch", "candidates"])]
    for name in spec.gather:
        graph.node.append(helper.make_node("GatherND", [name, "cand_gather_index"], [f"top_{name}"], batch_dims=1,
                                           name=f"cand_gather_{name}"))
        new_outputs.append(helper.make_tensor_value_info(f"top_{name}", TensorProto.FLOAT,
                                                         ["batch", "candidates", "channels"]))
    del graph.output[:]
    graph.output.extend(new_outputs)
    onnx.checker.check_model(model)
    return model


def candidate_node_names(spec: TopCandidatesSpec | None) -> list[str]:
    """Names of the nodes add_top_candidates adds (kept in fp32 by the fp16 variant, never quantised)."""
    if spec is None:
        return []
    return [*CANDIDATE_NODES, *(f"cand_gather_{name}" for name in spec.gather)]


def _drop_empty_optional_inputs(model: onnx.ModelProto) -> None:
    """Resize's unused `roi`/`scales` arrive from opset 11 exports as empty constants; from opset 13 they may be
    left out (""). Left in, the fp16 converter casts them into tensors of unknown size, and ONNX Runtime then
    refuses the Resize ("either sizes or scales, not both")."""
    graph = model.graph
    empty = {node.output[0] for node in graph.node if node.op_type == "Constant" and node.attribute
             and node.attribute[0].name == "value" and numpy_helper.to_array(node.attribute[0].t).size == 0}
    empty |= {init.name for init in graph.initializer if numpy_helper.to_array(init).size == 0}
    for node in graph.node:
        if node.op_type == "Resize":
            node.input[1:3] = ["" if name in empty else name for name in node.input[1:3]]


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
