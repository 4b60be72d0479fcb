"""Frame graphs for the GPU path: the per-frame work the host does in Python/OpenCV (letterbox, RetinaFace decode +
NMS, face crops) rebuilt as ONNX and joined to the prepared models, so frames that arrive in GPU memory (NVDEC) never
come back to the host: ONNX Runtime's CUDA provider runs the whole chain.

- `detector_frame_graph`: uint8 frames [B, H, W, 3] → letterbox → the prepared detector (unchanged, any
  precision) → decode + NonMaxSuppression → `face_score` [B, F] (-1 where there is no face), `face_box`
  [B, F, 4] and `face_landmarks` [B, F, 5, 2] in frame pixels. Thresholds are runtime inputs: a config change
  needs no rebuild.
- `crop_classify_graph`: uint8 frames + one inverse affine matrix per face (vision.align's matrices, inverted) → a
  bilinear, border-replicating crop (cv2.warpAffine's) in the classifier's colour → the prepared classifier.

Every formula is the host's (vision.retinaface, vision.align, cv2), re-expressed with ops that ONNX Runtime's CUDA
provider and TensorRT both run (no Loop/If, no GridSample/RoiAlign); tests/test_frame_graphs.py measures the
agreement on real frames. Two deliberate choices:
- no MatMul where precision matters: on Ampere and later GPUs a float MatMul may run in TF32 (10-bit mantissa), which
  would move a sample point of a 1080p frame by up to a pixel and break the exact integer grey conversion; broadcast
  Mul/Add and ReduceSum are always fp32.
- uint8 tensors are only transposed, reshaped and gathered, and cast to float as late as possible, so a batch of 64
  1080p frames costs one float copy (for the area halving) and no other full-resolution float tensor.
Our own names all start with `fg_`, so they cannot clash with a model's; a model that already uses the prefix is
refused. TensorRT caveat: it takes uint8 only at a network's edges and in Cast, so for a TensorRT build the uint8
Transpose/Gather on the frames would have to become float ones (4x the memory); ONNX Runtime's CUDA provider runs
them on uint8.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter

from pipeline.core.types import ChannelOrder
from pipeline.modelprep.graph_edit import PREPARED_INPUT, GraphEditError
from pipeline.modelprep.manifest import CANDIDATE_ANCHOR, CANDIDATE_SCORE
from pipeline.vision.retinaface import (
    CENTER_VARIANCE,
    PAD_BGR,
    SIZE_VARIANCE,
    anchor_grid,
    fit_size,
    halvings,
)

FRAME_INPUT = "frames"
SCORE_THRESHOLD = "score_threshold"
IOU_THRESHOLD = "iou_threshold"
MATRIX_INPUT = "crop_matrix"
FRAME_INDEX_INPUT = "crop_frame"
FACE_SCORE, FACE_BOX, FACE_LANDMARKS = "face_score", "face_box", "face_landmarks"
FACE_OUTPUTS = (FACE_SCORE, FACE_BOX, FACE_LANDMARKS)  # the detector graph's outputs, in this order
LETTERBOX_OUTPUT = "letterbox"
CROP_OUTPUT = "crops"
DETECTOR_OUTPUTS = (CANDIDATE_SCORE, CANDIDATE_ANCHOR, "top_loc", "top_landmarks")
# What each of those carries per candidate after [B, K]: a score, an anchor index, a box's 4 offsets, five landmarks'
# 10 (the decode below reads them so).
PER_CANDIDATE: dict[str, tuple[int, ...]] = {CANDIDATE_SCORE: (), CANDIDATE_ANCHOR: (), "top_loc": (4,),
                                             "top_landmarks": (10,)}
PREFIX = "fg_"
# Opset 13 has every op used here in its current form (Unsqueeze/Pad/Clip/ReduceSum take axes/pads/bounds as inputs);
# later opsets only add optional inputs or attributes whose defaults keep these semantics.
MIN_OPSET = 13
CLASSIFIER_OPSET = 17
# cv2's COLOR_BGR2GRAY for uint8 in the pinned OpenCV 5.0: (9798 R + 19235 G + 3735 B + 2^14) >> 15, exact integer
# arithmetic (measured on 200,000 random colours: 0 differences; OpenCV 4's 14-bit 4899/9617/1868 differs in 521).
GRAY_BITS = 15
GRAY_RGB = (9798.0, 19235.0, 3735.0)

Order = ChannelOrder
Colour = Literal["gray", "rgb", "bgr"]


@dataclass(frozen=True)
class FrameFormat:
    """The frames a graph takes: fixed size (a graph is built per camera resolution) and channel order."""

    width: int
    height: int
    order: Order  # the channel order of incoming frames


@dataclass(frozen=True)
class LetterboxPlan:
    """The letterbox geometry for one frame size, fixed at build time: `halvings` 2x2 means to `halved`, then
    bilinear to `resized` when that still differs, then padding to the detector input; boxes divide by `scale`."""

    scale: float
    halvings: int
    halved: tuple[int, int]
    resized: tuple[int, int]
    input_size: tuple[int, int]


class _Builder:
    """Nodes and constants of one graph part. Every name it makes starts with `fg_`, so a part can be spliced into
    any model that does not use the prefix itself."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def tensor(self, what: str) -> str:
        """A fresh name under the prefix, for an op output named in advance."""
        self._count += 1
        return f"{PREFIX}{self.scope}_{self._count}_{what}"

    def const(self, value: object, dtype: type = np.float32) -> str:
        """An initializer (not a Constant node): TensorRT wants K, axes and shapes as initializers."""
        name = self.tensor("const")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        """Append one node; returns its (only) output, named `out` when a graph output must carry that name."""
        return self.ops(op_type, *inputs, outs=[out or self.tensor(op_type.lower())], **attrs)[0]

    def ops(self, op_type: str, *inputs: str, outs: list[str], **attrs: Any) -> list[str]:
        """Append one node with several outputs (TopK)."""
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.tensor(op_type.lower()), **attrs))
        return outs


def letterbox_plan(frame: FrameFormat, input_size: tuple[int, int]) -> LetterboxPlan:
    """The geometry vision.retinaface.letterbox gives frames of this size (its fit_size and shrink's halvings), so
    the graph and the host path share one definition; tests compare the graphs with letterbox() output."""
    scale, resized = fit_size((frame.width, frame.height), input_size)
    width, height, count = frame.width, frame.height, 0
    if resized != (frame.width, frame.height):
        count = halvings((frame.width, frame.height), resized)
        width, height = frame.width >> count, frame.height >> count
    return LetterboxPlan(scale, count, (width, height), resized, (int(input_size[0]), int(input_size[1])))


def _linear_taps(source: int, target: int, pin_edges: bool) -> tuple[np.ndarray, ...]:
    """cv2 INTER_LINEAR's taps along one axis, computed as cv2.resize computes them (positions in float32, weights
    rounded to 1/2048 each): (first index, second index, first weight, second weight). Columns outside the image
    are pinned to the edge pixel with weight 2048 (`pin_edges`); rows keep their weights and only clamp indices."""
    position = ((np.arange(target) + 0.5) * (1.0 / (target / source)) - 0.5).astype(np.float32)
    first = np.floor(position)
    fraction = (position - first).astype(np.float32)
    if pin_edges:
        fraction[first < 0], first[first < 0] = 0.0, 0.0
        end = first >= source - 1
        fraction[end], first[end] = 0.0, source - 1
    weights = [np.round((np.float32(1.0) - fraction) * np.float32(2048.0)), np.round(fraction * np.float32(2048.0))]
    taps = [np.clip(first, 0, source - 1), np.clip(first + 1, 0, source - 1)]
    return (*(t.astype(np.int64) for t in taps), *(w.astype(np.int32) for w in weights))


def _linear_nodes(b: _Builder, x: str, source: tuple[int, int], target: tuple[int, int]) -> str:
    """cv2.resize INTER_LINEAR of uint8 pixels (integers in `x`, NCHW), bit for bit: a horizontal pass with 11-bit
    weights, then cv2's vertical SIMD arithmetic ((b0 * (S0 >> 4)) >> 16) + ((b1 * (S1 >> 4)) >> 16) + 2) >> 2, in
    int32 (float32 would round those products). ONNX Resize (float bilinear) differs from it by one grey level in
    ~10% of pixels, enough to move a 1080p face box by 3 px; this matches cv2 exactly for the same cost (four
    Gathers and a few integer ops on the small tensor). Non-negative integer Div is the right shift."""
    x0, x1, a0, a1 = _linear_taps(source[0], target[0], pin_edges=True)
    y0, y1, b0, b1 = _linear_taps(source[1], target[1], pin_edges=False)
    x = b.op("Cast", x, to=TensorProto.INT32)
    left, right = b.op("Gather", x, b.const(x0, np.int64), axis=3), b.op("Gather", x, b.const(x1, np.int64), axis=3)
    rows = b.op("Add", b.op("Mul", left, b.const(a0, np.int32)), b.op("Mul", right, b.const(a1, np.int32)))
    rows = b.op("Div", rows, b.const(16, np.int32))
    shift = b.const(65536, np.int32)
    top = b.op("Div", b.op("Mul", b.op("Gather", rows, b.const(y0, np.int64), axis=2), b.const(b0[:, None], np.int32)),
               shift)
    bottom = b.op("Div", b.op("Mul", b.op("Gather", rows, b.const(y1, np.int64), axis=2),
                              b.const(b1[:, None], np.int32)), shift)
    value = b.op("Div", b.op("Add", b.op("Add", top, bottom), b.const(2, np.int32)), b.const(4, np.int32))
    return b.op("Cast", value, to=TensorProto.FLOAT)


def _conv_halving(b: _Builder, frames: str, frame: FrameFormat, half: bool) -> str:
    """The first 2x2 halving straight from the uint8 NHWC frames to a float NCHW half-size tensor, with no
    transpose: the frames seen as one-channel images of H x 3W, and a Conv with 2x6 kernels at stride 2x6 whose
    output channel c adds the four samples of channel c in each 2x2 block (weights 0.25 at columns c and c + 3), i.e.
    AveragePool's value. Exact: every product and partial sum is a multiple of 0.25 below 256, which float16 holds
    exactly (float32 trivially), in whatever order the convolution adds them; on the H200 the letterbox of 32 and
    64 frames came out byte for byte the same as with AveragePool (deploy/frame_graphs_probe.py's checksums). A
    stride-2 Conv, like AveragePool, drops an odd last row/column."""
    dtype = np.float16 if half else np.float32
    x = b.op("Cast", frames, to=TensorProto.FLOAT16 if half else TensorProto.FLOAT)
    x = b.op("Reshape", x, b.const([-1, 1, frame.height, frame.width * 3], np.int64))
    weights = np.zeros((3, 1, 2, 6), dtype)
    for channel in range(3):
        weights[channel, 0, :, [channel, channel + 3]] = 0.25
    x = b.op("Conv", x, b.const(weights, dtype), kernel_shape=[2, 6], strides=[2, 6])
    return b.op("Floor", b.op("Add", x, b.const(0.5, dtype)))


def _letterbox_nodes(b: _Builder, frames: str, frame: FrameFormat, plan: LetterboxPlan,
                     halve_in_fp16: bool = False, conv_halving: bool = False) -> str:
    """Nodes from uint8 NHWC frames to the uint8 NHWC BGR detector input, reproducing letterbox()/shrink().

    A 2x2 mean + Floor(x + 0.5) is cv2 INTER_AREA at a factor of exactly 2 for uint8 ((a+b+c+d+2) >> 2, bit-exact).
    For an odd width or height cv2 resamples by areas at a factor slightly above 2 while AveragePool drops the last
    row/column: up to a pixel's shift near the right/bottom edge (no common camera size is odd after halving).
    The last step is `_linear_nodes` (cv2 INTER_LINEAR, bit-exact).

    `halve_in_fp16` (the GPU): the full-resolution cast and the halvings in float16, half the bytes of the costliest
    pass, and still exact: a 2x2 sum of uint8 is at most 1020 and its quarters are multiples of 0.25, all of which
    float16 represents exactly. (ONNX Runtime's CPU provider has no float16 AveragePool, so the CPU keeps float32.)"""
    half = halve_in_fp16 and plan.halvings > 0
    dtype = np.float16 if half else np.float32
    pooled = 0
    if conv_halving and plan.halvings > 0:
        x, pooled = _conv_halving(b, frames, frame, half), 1
    else:
        x = b.op("Transpose", frames, perm=[0, 3, 1, 2])  # on uint8: the float cast below is the one big copy
        x = b.op("Cast", x, to=TensorProto.FLOAT16 if half else TensorProto.FLOAT)
    for _ in range(plan.halvings - pooled):
        x = b.op("AveragePool", x, kernel_shape=[2, 2], strides=[2, 2])
        x = b.op("Floor", b.op("Add", x, b.const(0.5, dtype)))
    if half:
        x = b.op("Cast", x, to=TensorProto.FLOAT)
    if plan.halved != plan.resized:
        x = _linear_nodes(b, x, plan.halved, plan.resized)
    if frame.order == "rgb":  # the detector was trained on BGR
        x = b.op("Gather", x, b.const([2, 1, 0], np.int64), axis=1)
    pad_w, pad_h = plan.input_size[0] - plan.resized[0], plan.input_size[1] - plan.resized[1]
    if pad_w or pad_h:  # Pad has one constant for all channels: pad zeros around (x - colour), then add it back
        colour = b.const(np.asarray(PAD_BGR, np.float32).reshape(1, 3, 1, 1))
        x = b.op("Sub", x, colour)
        x = b.op("Pad", x, b.const([0, 0, 0, 0, 0, 0, pad_h, pad_w], np.int64), mode="constant")
        x = b.op("Add", x, colour)
    x = b.op("Transpose", x, perm=[0, 2, 3, 1])
    return b.op("Cast", x, to=TensorProto.UINT8)


def _frames_info(frame: FrameFormat) -> onnx.ValueInfoProto:
    """`frames` with static H, W (the geometry is fixed at build time) and a dynamic batch."""
    return helper.make_tensor_value_info(FRAME_INPUT, TensorProto.UINT8, ["batch", frame.height, frame.width, 3])


def _standalone(b: _Builder, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
                opset: int, name: str) -> onnx.ModelProto:
    """A model of one part alone, at the opset it will be spliced into (for tests and inspection)."""
    graph = helper.make_graph(b.nodes, name, inputs, outputs, initializer=b.initializers)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    onnx.checker.check_model(model)
    return model


def letterbox_graph(frame: FrameFormat, input_size: tuple[int, int], halve_in_fp16: bool = False,
                    conv_halving: bool = False) -> onnx.ModelProto:
    """The letterbox part alone (`frames` → `letterbox` uint8 [B, h, w, 3] BGR), to test it against letterbox()."""
    b = _Builder("lb")
    plan = letterbox_plan(frame, input_size)
    b.op("Identity", _letterbox_nodes(b, FRAME_INPUT, frame, plan, halve_in_fp16, conv_halving),
         out=LETTERBOX_OUTPUT)
    width, height = plan.input_size
    output = helper.make_tensor_value_info(LETTERBOX_OUTPUT, TensorProto.UINT8, ["batch", height, width, 3])
    return _standalone(b, [_frames_info(frame)], [output], MIN_OPSET, "letterbox")


def _split_pairs(b: _Builder, x: str) -> tuple[str, str]:
    """(x[..., 0:2], x[..., 2:4]) of a [N, K, 4] tensor: (centre, size) of anchors, (offset, log-size) of loc."""
    axes = b.const([2], np.int64)
    first = b.op("Slice", x, b.const([0], np.int64), b.const([2], np.int64), axes)
    return first, b.op("Slice", x, b.const([2], np.int64), b.const([4], np.int64), axes)


def _decode_candidates(b: _Builder, input_size: tuple[int, int]) -> tuple[str, str, str]:
    """vision.retinaface.decode's formulas on all K candidates of every image: (score [N, K], boxes [N, K, 4],
    points [N, K, 5, 2]) in detector-input pixels, float32 whatever the detector's precision."""
    score = b.op("Cast", CANDIDATE_SCORE, to=TensorProto.FLOAT)
    loc = b.op("Cast", "top_loc", to=TensorProto.FLOAT)
    marks = b.op("Cast", "top_landmarks", to=TensorProto.FLOAT)
    anchors = b.op("Gather", b.const(anchor_grid(input_size)), CANDIDATE_ANCHOR, axis=0)
    centre, size = _split_pairs(b, anchors)
    offset, log_size = _split_pairs(b, loc)
    variance, size_variance = b.const(CENTER_VARIANCE), b.const(SIZE_VARIANCE)
    centres = b.op("Add", centre, b.op("Mul", b.op("Mul", offset, variance), size))
    sizes = b.op("Mul", size, b.op("Exp", b.op("Mul", log_size, size_variance)))
    half = b.op("Div", sizes, b.const(2.0))
    boxes = b.op("Concat", b.op("Sub", centres, half), b.op("Add", centres, half), axis=2)
    axis2 = b.const([2], np.int64)
    points = b.op("Reshape", marks, b.const([0, 0, 5, 2], np.int64))
    points = b.op("Mul", b.op("Mul", points, variance), b.op("Unsqueeze", size, axis2))
    points = b.op("Add", b.op("Unsqueeze", centre, axis2), points)
    return score, boxes, points


def _nms_scores(b: _Builder, score: str, boxes: str, candidates: int) -> str:
    """[N, K] scores of the candidates NonMaxSuppression keeps (score > score_threshold, IoU <= iou_threshold with
    every better kept box, as cv2.dnn.NMSBoxes), -1 for the others: a fixed shape TopK can rank, so no
    data-dependent shape ever leaves the graph."""
    selected = b.op("NonMaxSuppression", boxes, b.op("Unsqueeze", score, b.const([1], np.int64)),
                    b.const([candidates], np.int64), IOU_THRESHOLD, SCORE_THRESHOLD)
    pairs = b.op("Gather", selected, b.const([0, 2], np.int64), axis=1)  # (image, candidate) of each kept box
    blank = b.op("ConstantOfShape", b.op("Shape", score),
                 value=numpy_helper.from_array(np.array([-1.0], np.float32)))
    return b.op("ScatterND", blank, pairs, b.op("GatherND", score, pairs))


def _decode_nodes(b: _Builder, plan: LetterboxPlan, candidates: int, faces: int) -> None:
    """Detector top-K outputs → `face_score` [N, F] (best first), `face_box` [N, F, 4] and `face_landmarks`
    [N, F, 5, 2] in frame pixels (boxes not clipped: the host clips, as vision.retinaface._to_frame does)."""
    score, boxes, points = _decode_candidates(b, plan.input_size)
    masked = _nms_scores(b, score, boxes, candidates)
    _, order = b.ops("TopK", masked, b.const([faces], np.int64), outs=[FACE_SCORE, b.tensor("order")], axis=1,
                     largest=1, sorted=1)
    index = b.op("Unsqueeze", order, b.const([2], np.int64))
    scale = b.const(plan.scale)
    b.op("Div", b.op("GatherND", boxes, index, batch_dims=1), scale, out=FACE_BOX)
    b.op("Div", b.op("GatherND", points, index, batch_dims=1), scale, out=FACE_LANDMARKS)


def _opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset (1 when it names none, as the ONNX spec says)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _prepared_copy(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """A copy to edit, converted up to `opset` when older (the frame ops need it; mixing versions is not allowed),
    refused when it already uses our `fg_` prefix."""
    model = copy.deepcopy(model)
    if _opset(model) < opset:
        model = version_converter.convert_version(model, opset)
    graph = model.graph
    names = {n.name for n in graph.node} | {t for n in graph.node for t in [*n.input, *n.output]}
    names |= {i.name for i in graph.initializer} | {i.name for i in graph.input}
    clashing = sorted(n for n in names if n.startswith(PREFIX))
    if clashing:
        raise GraphEditError(f"the model already uses the prefix {PREFIX!r} of the frame graph: {clashing[:5]}")
    return model


def _input_spec(model: onnx.ModelProto, name: str) -> list[int | str]:
    """Shape of the uint8 input `name` (ints, or strings for symbolic dims); GraphEditError when it is missing or
    not uint8 rank 4."""
    found = {i.name: i for i in model.graph.input}
    if name not in found:
        raise GraphEditError(f"the model has no input {name!r} (it has {', '.join(found) or 'none'})")
    tensor = found[name].type.tensor_type
    dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim]
    if tensor.elem_type != TensorProto.UINT8 or len(dims) != 4:
        raise GraphEditError(f"input {name!r} must be uint8 NHWC (prepare-models' uint8 input), got "
                             f"{TensorProto.DataType.Name(tensor.elem_type)} {dims}")
    return dims


def _candidate_count(model: onnx.ModelProto, input_size: tuple[int, int]) -> int:
    """K, the candidates per image: the constant bound of the TopK that makes `top_anchor` (add_top_candidates
    writes Min(anchors, k)), capped by the anchors at this input size. It fixes the output shapes at build time."""
    producers = {out: node for node in model.graph.node for out in node.output}
    constants = {i.name: int(numpy_helper.to_array(i).reshape(-1)[0]) for i in model.graph.initializer
                 if i.data_type == TensorProto.INT64 and numpy_helper.to_array(i).size == 1}
    topk = producers.get(CANDIDATE_ANCHOR)
    if topk is None or topk.op_type != "TopK":
        raise GraphEditError(f"no TopK makes {CANDIDATE_ANCHOR!r}: prepare the detector with top_candidates")
    k_name = topk.input[1]
    bounds = [constants[k_name]] if k_name in constants else []
    if not bounds and k_name in producers and producers[k_name].op_type == "Min":
        bounds = [constants[i] for i in producers[k_name].input if i in constants]
    if not bounds:
        raise GraphEditError(f"the candidate count of {CANDIDATE_ANCHOR!r} is not a constant")
    return min(*bounds, len(anchor_grid(input_size)))


def _splice(model: onnx.ModelProto, model_input: str, front: _Builder, fed: str, back: _Builder | None,
            inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto] | None) -> onnx.ModelProto:
    """Feed `model_input` from `front`'s tensor `fed`, run `back` after the model; the graph takes `inputs` and
    gives `outputs` (None: the model's own). The model's nodes are kept as they are, in between."""
    graph = model.graph
    initialisers = {i.name for i in graph.initializer}
    others = [i.name for i in graph.input if i.name != model_input and i.name not in initialisers]
    if others:
        raise GraphEditError(f"the model has inputs besides {model_input!r}: {', '.join(others)}")
    for node in graph.node:
        node.input[:] = [fed if name == model_input else name for name in node.input]
    kept_inputs = [i for i in graph.input if i.name in initialisers]  # old IR lists initialisers as inputs
    nodes = [*front.nodes, *graph.node, *(back.nodes if back else [])]
    del graph.node[:], graph.input[:]
    graph.node.extend(nodes)
    graph.input.extend([*inputs, *kept_inputs])
    graph.initializer.extend([*front.initializers, *(back.initializers if back else [])])
    if outputs is not None:
        del graph.output[:]
        graph.output.extend(outputs)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise GraphEditError(f"the frame graph does not check: {exc}") from exc
    return model


def detector_frame_graph(detector: onnx.ModelProto, frame: FrameFormat, input_size: tuple[int, int],
                         max_faces: int = 64, halve_in_fp16: bool = False,
                         conv_halving: bool = False) -> onnx.ModelProto:
    """letterbox → `detector` (a prepared RetinaFace with top candidates, any precision) → decode + NMS.

    Inputs: `frames` uint8 [B, H, W, 3] in `frame.order`, `score_threshold` and `iou_threshold` float32 [1].
    Outputs (F = min(max_faces, K)): `face_score` [B, F] (kept faces best first, -1 in rows without a face),
    `face_box` [B, F, 4] (x1, y1, x2, y2, frame pixels, not clipped), `face_landmarks` [B, F, 5, 2] (frame pixels).
    The host keeps only what filter_faces decides (size, count), on a few floats per face."""
    model = _prepared_detector(detector)
    plan = letterbox_plan(frame, input_size)
    candidates = _candidate_count(model, plan.input_size)
    front, back = _Builder("lb"), _Builder("dec")
    fed = _letterbox_nodes(front, FRAME_INPUT, frame, plan, halve_in_fp16, conv_halving)
    faces = min(max_faces, candidates)
    _decode_nodes(back, plan, candidates, faces)
    inputs = [_frames_info(frame), *_threshold_infos()]
    return _splice(model, PREPARED_INPUT, front, fed, back, inputs, _face_infos(faces))


@dataclass(frozen=True)
class DetectorParts:
    """detector_graph_parts' result: the two graphs and K, the candidates per frame that the body's outputs carry
    (each DETECTOR_OUTPUTS tensor is [B, K, ...])."""

    body: onnx.ModelProto
    tail: onnx.ModelProto
    candidates: int


def detector_graph_parts(detector: onnx.ModelProto, frame: FrameFormat, input_size: tuple[int, int],
                         max_faces: int = 64, halve_in_fp16: bool = False,
                         conv_halving: bool = False) -> DetectorParts:
    """detector_frame_graph in two parts, cut where the shapes stop depending on the data: the body (`frames` →
    letterbox → the prepared detector's top-K outputs, DETECTOR_OUTPUTS, all of fixed shape for a batch size) and
    the tail (those outputs + the thresholds → decode + NMS → the same three face outputs). Why: a GPU can capture
    the body as one CUDA graph and replay it with one launch (inference.cuda_graphs), but not NonMaxSuppression,
    whose output size depends on the data. Run one after the other, they give detector_frame_graph's faces."""
    body = _prepared_detector(detector)
    plan = letterbox_plan(frame, input_size)
    candidates = _candidate_count(body, plan.input_size)
    front, back = _Builder("lb"), _Builder("dec")
    fed = _letterbox_nodes(front, FRAME_INPUT, frame, plan, halve_in_fp16, conv_halving)
    body = _splice(body, PREPARED_INPUT, front, fed, None, [_frames_info(frame)], None)
    outputs = {output.name: output for output in body.graph.output}
    middle = [_fixed_dims(outputs[name], candidates) for name in DETECTOR_OUTPUTS]  # any other output is dropped
    del body.graph.output[:]
    body.graph.output.extend(middle)
    faces = min(max_faces, candidates)
    _decode_nodes(back, plan, candidates, faces)
    inputs = [*middle, *_threshold_infos()]
    tail = _standalone(back, inputs, _face_infos(faces), _opset(body), "detector_tail")
    return DetectorParts(body, tail, candidates)


def _prepared_detector(detector: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a prepared RetinaFace to splice into; GraphEditError when it lacks the top-K outputs."""
    model = _prepared_copy(detector, MIN_OPSET)
    dims = _input_spec(model, PREPARED_INPUT)
    missing = [name for name in DETECTOR_OUTPUTS if name not in {o.name for o in model.graph.output}]
    if missing or dims[3] != 3:
        raise GraphEditError(f"not a prepared detector: outputs {', '.join(missing) or 'present'}, input {dims} "
                             f"(needs {', '.join(DETECTOR_OUTPUTS)} and a 3-channel input)")
    return model


def _threshold_infos() -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in (SCORE_THRESHOLD, IOU_THRESHOLD)]


def _face_infos(faces: int) -> list[onnx.ValueInfoProto]:
    """The three face outputs of a detector graph, F = `faces` per frame."""
    return [helper.make_tensor_value_info(FACE_SCORE, TensorProto.FLOAT, ["batch", faces]),
            helper.make_tensor_value_info(FACE_BOX, TensorProto.FLOAT, ["batch", faces, 4]),
            helper.make_tensor_value_info(FACE_LANDMARKS, TensorProto.FLOAT, ["batch", faces, 5, 2])]


def _fixed_dims(info: onnx.ValueInfoProto, candidates: int) -> onnx.ValueInfoProto:
    """A copy of a detector output's `info` with every dimension but the batch fixed: K candidates, then what each
    candidate carries (PER_CANDIDATE). Why: the prepared detector names its outputs' last dimensions alike although
    they differ (a box's 4 offsets, five landmarks' 10), and ONNX Runtime's CUDA planner, taking the tail's inputs for
    equal in size, reused one's buffer for another ("Shape mismatch attempting to re-use buffer"); fixed sizes are
    also what the buffers of a captured body are allocated from (inference/gpu/captured.py)."""
    fixed = onnx.ValueInfoProto()
    fixed.CopyFrom(info)
    dims = fixed.type.tensor_type.shape.dim
    for dim, size in zip(dims[1:], (candidates, *PER_CANDIDATE[info.name])):
        dim.Clear()
        dim.dim_value = size
    return fixed


def _sample_points(b: _Builder, crop_size: tuple[int, int]) -> tuple[str, str]:
    """Frame coordinates (x, y), each [F, h, w], of every crop pixel centre: x = m00 u + m01 v + m02 (likewise y)
    for the inverse matrix of each face. Broadcast Mul/Add, not MatMul, so a GPU never computes them in TF32."""
    width, height = crop_size
    u = b.const(np.arange(width, dtype=np.float32).reshape(1, 1, width))
    v = b.const(np.arange(height, dtype=np.float32).reshape(1, height, 1))
    axes = b.const([1, 2], np.int64)

    def entry(row: int, col: int) -> str:  # m[:, row, col] as [F, 1, 1]
        return b.op("Slice", MATRIX_INPUT, b.const([row, col], np.int64), b.const([row + 1, col + 1], np.int64),
                    axes)

    coords = []
    for row in (0, 1):
        along_u = b.op("Mul", entry(row, 0), u)
        coords.append(b.op("Add", along_u, b.op("Add", b.op("Mul", entry(row, 1), v), entry(row, 2))))
    return coords[0], coords[1]


def _neighbours(b: _Builder, coord: str, limit: int) -> tuple[str, str, str]:
    """Clamp a coordinate to [0, limit - 1] (bilinear + clamping = cv2's BORDER_REPLICATE), then its two
    neighbouring pixel indices (int64) and the fraction towards the second."""
    coord = b.op("Clip", coord, b.const(0.0), b.const(float(limit - 1)))
    low = b.op("Floor", coord)
    high = b.op("Min", b.op("Add", low, b.const(1.0)), b.const(float(limit - 1)))
    fraction = b.op("Unsqueeze", b.op("Sub", coord, low), b.const([3], np.int64))
    return b.op("Cast", low, to=TensorProto.INT64), b.op("Cast", high, to=TensorProto.INT64), fraction


def _bilinear_crop(b: _Builder, frame: FrameFormat, crop_size: tuple[int, int],
                   corner: Callable[[str], str] | None = None) -> str:
    """cv2.warpAffine(INTER_LINEAR, BORDER_REPLICATE) of every face from its frame: [F, h, w, 3] float, rounded to
    the integers cv2 gives, channels in the frame's order. The four neighbours are gathered from the whole batch
    seen as [B*H*W, 3] uint8 at (frame * H + y) * W + x (int64: the index passes 2^24 with a 1080p batch).

    `corner`: a linear map applied to each neighbour's float colours before they are blended (grey: one channel
    through the blend instead of three), whose result is then not rounded."""
    x, y = _sample_points(b, crop_size)
    x0, x1, fx = _neighbours(b, x, frame.width)
    y0, y1, fy = _neighbours(b, y, frame.height)
    image = b.op("Unsqueeze", FRAME_INDEX_INPUT, b.const([1, 2], np.int64))  # [F, 1, 1]
    first_row = b.op("Mul", image, b.const(frame.height, np.int64))
    pixels = b.op("Reshape", FRAME_INPUT, b.const([-1, 3], np.int64))
    width = b.const(frame.width, np.int64)
    corners = []
    for row in (y0, y1):
        start = b.op("Mul", b.op("Add", first_row, row), width)
        for col in (x0, x1):
            gathered = b.op("Gather", pixels, b.op("Add", start, col), axis=0)
            colours = b.op("Cast", gathered, to=TensorProto.FLOAT)
            corners.append(colours if corner is None else corner(colours))
    top = b.op("Add", corners[0], b.op("Mul", fx, b.op("Sub", corners[1], corners[0])))
    bottom = b.op("Add", corners[2], b.op("Mul", fx, b.op("Sub", corners[3], corners[2])))
    value = b.op("Add", top, b.op("Mul", fy, b.op("Sub", bottom, top)))
    if corner is not None:
        return value
    return b.op("Clip", b.op("Round", value), b.const(0.0), b.const(255.0))


def _colour_nodes(b: _Builder, x: str, order: Order, colour: Colour) -> str:
    """[F, h, w, 3] pixels in the frame's `order` → the classifier's `colour`, uint8 [F, h, w, C]. Grey is cv2's
    BGR2GRAY integer formula (GRAY_RGB), exact in float32 (every partial sum is an integer below 2^24)."""
    if colour == "gray":
        weights = GRAY_RGB if order == "rgb" else GRAY_RGB[::-1]
        total = b.op("ReduceSum", b.op("Mul", x, b.const(weights)), b.const([3], np.int64), keepdims=1)
        x = b.op("Floor", b.op("Div", b.op("Add", total, b.const(float(1 << (GRAY_BITS - 1)))),
                               b.const(float(1 << GRAY_BITS))))
    elif colour != order:
        x = b.op("Gather", x, b.const([2, 1, 0], np.int64), axis=3)
    return b.op("Cast", x, to=TensorProto.UINT8)


def _crop_inputs(frame: FrameFormat) -> list[onnx.ValueInfoProto]:
    """`frames`, `crop_matrix` and `crop_frame`: faces is its own dynamic dimension, independent of the batch."""
    return [_frames_info(frame),
            helper.make_tensor_value_info(MATRIX_INPUT, TensorProto.FLOAT, ["faces", 2, 3]),
            helper.make_tensor_value_info(FRAME_INDEX_INPUT, TensorProto.INT64, ["faces"])]


def _crop_nodes(b: _Builder, frame: FrameFormat, crop_size: tuple[int, int], colour: Colour) -> str:
    """The whole crop part; the colour names are checked here because they arrive from manifests and configs."""
    if colour not in ("gray", "rgb", "bgr") or frame.order not in ("rgb", "bgr"):
        raise GraphEditError(f"crop colour {colour!r} from {frame.order!r} frames: expected gray/rgb/bgr from rgb/bgr")
    return _colour_nodes(b, _bilinear_crop(b, frame, crop_size), frame.order, colour)


def crop_graph(frame: FrameFormat, crop_size: tuple[int, int], colour: Colour) -> onnx.ModelProto:
    """The crop part alone: (`frames`, `crop_matrix`, `crop_frame`) → `crops` uint8 [F, h, w, C], to test it
    against vision.align + FaceCropper, or to look at what the classifier is given."""
    b = _Builder("crop")
    b.op("Identity", _crop_nodes(b, frame, crop_size, colour), out=CROP_OUTPUT)
    width, height = crop_size
    channels = 1 if colour == "gray" else 3
    output = helper.make_tensor_value_info(CROP_OUTPUT, TensorProto.UINT8, ["faces", height, width, channels])
    return _standalone(b, _crop_inputs(frame), [output], CLASSIFIER_OPSET, "crop")


def crop_classify_graph(classifier: onnx.ModelProto, frame: FrameFormat, crop_size: tuple[int, int],
                        colour: Colour, classifier_input: str = PREPARED_INPUT) -> onnx.ModelProto:
    """crop → `classifier` (a prepared uint8 NHWC model, any precision), one row of its outputs per face.

    Inputs: `frames` uint8 [B, H, W, 3] in `frame.order`; `crop_matrix` float32 [F, 2, 3], per face the INVERSE of
    vision.align's crop matrix (crop pixel centre (u, v) → frame pixel centre M @ [u, v, 1]: inverse_affine);
    `crop_frame` int64 [F], the frame of the batch each face is in. Outputs: the classifier's, e.g. `probs` [F, 7]."""
    model = _prepared_copy(classifier, MIN_OPSET)
    dims = _input_spec(model, classifier_input)
    width, height = crop_size
    wanted = [height, width, 1 if colour == "gray" else 3]
    if any(isinstance(have, int) and have > 0 and have != want for have, want in zip(dims[1:], wanted)):
        raise GraphEditError(f"classifier input {classifier_input!r} is {dims}, the crop gives [faces, "
                             f"{', '.join(map(str, wanted))}] ({colour} {width}x{height})")
    b = _Builder("crop")
    fed = _crop_nodes(b, frame, crop_size, colour)
    return _splice(model, classifier_input, b, fed, None, _crop_inputs(frame), None)
