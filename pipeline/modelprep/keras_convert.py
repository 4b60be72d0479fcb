"""Convert the FER2013 mini-Xception Keras HDF5 model (Keras 2.x, TensorFlow backend) to ONNX.

Why our own converter: tf2onnx / keras2onnx need TensorFlow (a heavy, version-pinned dependency) just to read an
870 kB file whose graph uses seven layer types. Reading the HDF5 with h5py and writing the graph with ``onnx.helper``
keeps the conversion reproducible and auditable; anything outside the supported subset raises `ConversionError`
instead of being translated approximately.

The ONNX model takes ``input``: float32 NHWC ``[batch, H, W, C]`` (the already normalised image, the converter adds
no preprocessing), transposes once to NCHW, and returns ``probs``: float32 ``[batch, classes]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline import __version__

log = logging.getLogger(__name__)

PRODUCER_NAME = "emotion-pipeline keras_convert"
INPUT_NAME = "input"
OUTPUT_NAME = "probs"
BATCH_DIM = "batch"
MIN_OPSET = 13  # Softmax reduces over one axis only from opset 13 on, which is what Keras means.

_CONV_CLASSES = frozenset({"Conv2D", "SeparableConv2D"})
_ACTIVATION_OPS: dict[str, str | None] = {
    "linear": None,
    "relu": "Relu",
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "softmax": "Softmax",
}


class ConversionError(Exception):
    """The HDF5 holds something this converter cannot translate faithfully (layer class, option, structure)."""


@dataclass(frozen=True, eq=False)
class KerasLayer:
    """One layer of a functional Keras model: its config and its weights (short names, e.g. ``kernel``)."""

    name: str
    class_name: str
    config: dict[str, Any]
    inbound: tuple[str, ...]
    weights: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class _KerasModel:
    name: str
    layers: list[KerasLayer]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    keras_version: str


@dataclass(frozen=True)
class _Tensor:
    """A tensor of the ONNX graph being built; ``shape`` excludes the batch: (C, H, W) or (C,)."""

    name: str
    shape: tuple[int, ...]


# --------------------------------------------------------------------------------------------------- reading HDF5


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes | np.bytes_) else str(value)


def _endpoints(entries: Sequence[Any], what: str) -> tuple[str, ...]:
    """Names of the model's input/output layers; only first-call, single-tensor endpoints are supported."""
    names = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) < 3 or entry[1] != 0 or entry[2] != 0:
            raise ConversionError(f"unsupported {what} reference {entry!r} (only [layer, 0, 0])")
        names.append(str(entry[0]))
    return tuple(names)


def _parse_inbound(entry: dict[str, Any]) -> tuple[str, ...]:
    """Inbound layer names; a layer called more than once (shared weights) has several nodes and is rejected."""
    nodes = entry.get("inbound_nodes", [])
    if not nodes:
        return ()
    if len(nodes) > 1:
        raise ConversionError(f"layer {entry.get('name')!r}: shared layers (called {len(nodes)} times) are unsupported")
    names = []
    for ref in nodes[0]:
        if not isinstance(ref, list) or len(ref) < 3 or ref[1] != 0 or ref[2] != 0:
            raise ConversionError(f"layer {entry.get('name')!r}: unsupported inbound reference {ref!r}")
        names.append(str(ref[0]))
    return tuple(names)


def _read_weights(weights_root: h5py.Group, layer_name: str) -> dict[str, np.ndarray]:
    """Weights listed by the layer group's ``weight_names`` attribute, keyed ``kernel``, ``gamma``, ..."""
    if layer_name not in weights_root:
        return {}
    group = weights_root[layer_name]
    weights: dict[str, np.ndarray] = {}
    for raw in group.attrs.get("weight_names", []):
        path = _text(raw)
        short = path.rsplit("/", 1)[-1].split(":", 1)[0]
        weights[short] = np.array(group[path], dtype=np.float32)
    return weights


def _read_model(h5_path: str | Path) -> _KerasModel:
    path = Path(h5_path)
    if not path.is_file():
        raise FileNotFoundError(path)
    with h5py.File(path, "r") as f:
        if "model_config" not in f.attrs or "model_weights" not in f:
            raise ConversionError(f"{path}: no model_config/model_weights (a weights-only file?)")
        config = json.loads(_text(f.attrs["model_config"]))
        if config.get("class_name") not in ("Model", "Functional"):
            raise ConversionError(f"{path}: unsupported model class {config.get('class_name')!r} (functional only)")
        body = config["config"]
        layers = [
            KerasLayer(
                name=str(entry["name"]),
                class_name=str(entry["class_name"]),
                config=dict(entry.get("config", {})),
                inbound=_parse_inbound(entry),
                weights=_read_weights(f["model_weights"], str(entry["name"])),
            )
            for entry in body["layers"]
        ]
        version = _text(f.attrs.get("keras_version", "unknown"))
    inputs = _endpoints(body.get("input_layers", []), "input")
    outputs = _endpoints(body.get("output_layers", []), "output")
    return _KerasModel(str(body.get("name", "keras_model")), layers, inputs, outputs, version)


def load_keras_layers(h5_path: str | Path) -> list[KerasLayer]:
    """The layers of a functional Keras HDF5 model, in file order, with weights as float32 numpy arrays."""
    return _read_model(h5_path).layers


def _topological(layers: list[KerasLayer]) -> list[KerasLayer]:
    """Layers ordered so every layer follows its inputs (file order is usually this already, but is not promised)."""
    by_name = {layer.name: layer for layer in layers}
    if len(by_name) != len(layers):
        raise ConversionError("duplicate layer names in model_config")
    done: set[str] = set()
    order: list[KerasLayer] = []
    pending = list(layers)
    while pending:
        ready = [layer for layer in pending if all(name in done for name in layer.inbound)]
        if not ready:
            missing = {n for layer in pending for n in layer.inbound if n not in by_name}
            raise ConversionError(f"unknown inbound layers {sorted(missing)}" if missing else "cycle in layer graph")
        for layer in ready:
            done.add(layer.name)
            order.append(layer)
        pending = [layer for layer in pending if layer.name not in done]
    return order


# --------------------------------------------------------------------------------------------------- option checks


def _option(layer: KerasLayer, key: str, allowed: Sequence[Any], default: Any = None) -> Any:
    """The layer's option ``key``, raising `ConversionError` when it is not one of ``allowed``."""
    value = layer.config.get(key, default)
    normalised = tuple(value) if isinstance(value, list) else value
    if normalised not in allowed:
        raise ConversionError(
            f"layer {layer.name!r} ({layer.class_name}): unsupported {key}={value!r}; supported: {list(allowed)}"
        )
    return normalised


def _pair(layer: KerasLayer, key: str, default: Any = None) -> tuple[int, int]:
    value = layer.config.get(key, default)
    if isinstance(value, int):
        return value, value
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ConversionError(f"layer {layer.name!r} ({layer.class_name}): unsupported {key}={value!r}")
    return int(value[0]), int(value[1])


def _weight(layer: KerasLayer, key: str, shape: tuple[int, ...]) -> np.ndarray:
    if key not in layer.weights:
        raise ConversionError(f"layer {layer.name!r} ({layer.class_name}): weight {key!r} missing from HDF5")
    value = layer.weights[key]
    if value.shape != shape:
        raise ConversionError(f"layer {layer.name!r}: weight {key!r} has shape {value.shape}, expected {shape}")
    return value


def _common_conv_options(layer: KerasLayer) -> str:
    _option(layer, "data_format", ("channels_last",), "channels_last")
    _option(layer, "dilation_rate", ((1, 1), 1), (1, 1))
    _option(layer, "groups", (1,), 1)
    _option(layer, "activation", tuple(_ACTIVATION_OPS), "linear")
    return str(_option(layer, "padding", ("valid", "same")))


def _rank4(layer: KerasLayer, x: _Tensor) -> tuple[int, int, int]:
    if len(x.shape) != 3:
        raise ConversionError(f"layer {layer.name!r} ({layer.class_name}) needs an image input, got shape {x.shape}")
    return x.shape  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------- geometry


def tf_padding(padding: str, size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """(pad_before, pad_after, out_size) along one spatial axis, as TensorFlow computes them.

    TF's 'same' puts the odd extra pixel at the end (bottom/right), unlike ONNX ``SAME_LOWER`` and unlike a symmetric
    pad, so the pads are made explicit from the static size instead of using ``auto_pad``.
    """
    if padding == "valid":
        out = (size - kernel) // stride + 1
        before = after = 0
    else:
        out = math.ceil(size / stride)
        total = max((out - 1) * stride + kernel - size, 0)
        before, after = total // 2, total - total // 2
    if out < 1:
        raise ConversionError(f"kernel {kernel} with padding {padding!r} does not fit spatial size {size}")
    return before, after, out


def _window(
    padding: str, hw: tuple[int, int], kernel: tuple[int, int], strides: tuple[int, int]
) -> tuple[list[int], tuple[int, int]]:
    """ONNX ``pads`` ([top, left, bottom, right]) and the output (H, W) of a 2-D window op."""
    top, bottom, out_h = tf_padding(padding, hw[0], kernel[0], strides[0])
    left, right, out_w = tf_padding(padding, hw[1], kernel[1], strides[1])
    return [top, left, bottom, right], (out_h, out_w)


# --------------------------------------------------------------------------------------------------- graph building


class _Graph:
    """Accumulates nodes and float32 initializers, handing out unique tensor names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._used: set[str] = {INPUT_NAME, OUTPUT_NAME}

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        self._used.add(name)
        return name

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype=np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=f"{op}_{output}", **attrs))
        return output


def _bn_affine(bn: KerasLayer, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Inference BatchNorm as ``x * scale + shift`` (float64), from moving statistics and epsilon."""
    _option(bn, "axis", (-1, 3, (-1,), (3,)), -1)
    eps = float(bn.config.get("epsilon", 1e-3))
    shape = (channels,)
    gamma = _weight(bn, "gamma", shape) if bn.config.get("scale", True) else np.ones(shape, np.float32)
    beta = _weight(bn, "beta", shape) if bn.config.get("center", True) else np.zeros(shape, np.float32)
    mean = _weight(bn, "moving_mean", shape).astype(np.float64)
    var = _weight(bn, "moving_variance", shape).astype(np.float64)
    scale = gamma.astype(np.float64) / np.sqrt(var + eps)
    return scale, beta.astype(np.float64) - mean * scale


def _conv_node(
    g: _Graph, x: str, out: str, w: np.ndarray, b: np.ndarray | None, bn: KerasLayer | None, **attrs: Any
) -> str:
    """A Conv with ONNX weights ``w`` (O, I/group, kh, kw), with a following BatchNorm folded in when given."""
    if bn is not None:
        scale, shift = _bn_affine(bn, w.shape[0])
        w = w.astype(np.float64) * scale[:, None, None, None]
        b = (np.zeros(w.shape[0]) if b is None else b.astype(np.float64)) * scale + shift
    inputs = [x, g.const(f"{out}_W", w)] + ([g.const(f"{out}_B", b)] if b is not None else [])
    return g.node("Conv", inputs, out, kernel_shape=list(w.shape[2:]), **attrs)


def _activation(g: _Graph, kind: str, x: _Tensor, out: str) -> _Tensor:
    op = _ACTIVATION_OPS[kind]
    if op is None:
        return _Tensor(g.node("Identity", [x.name], out), x.shape)
    attrs = {"axis": 1 if len(x.shape) == 3 else -1} if op == "Softmax" else {}  # Keras softmax: last (channel) axis
    return _Tensor(g.node(op, [x.name], out, **attrs), x.shape)


def _finish_conv(g: _Graph, layer: KerasLayer, conv_out: str, shape: tuple[int, ...], out: str) -> _Tensor:
    kind = layer.config.get("activation", "linear")
    if kind == "linear":
        return _Tensor(conv_out, shape)
    return _activation(g, kind, _Tensor(conv_out, shape), out)


def _conv_output(g: _Graph, layer: KerasLayer, out: str) -> str:
    """Where the Conv itself writes: ``out`` unless a fused activation comes after it."""
    return out if layer.config.get("activation", "linear") == "linear" else g.fresh(f"{layer.name}_linear")


def _emit_conv2d(g: _Graph, layer: KerasLayer, xs: list[_Tensor], out: str, bn: KerasLayer | None) -> _Tensor:
    c, h, w = _rank4(layer, xs[0])
    padding = _common_conv_options(layer)
    kernel, strides = _pair(layer, "kernel_size"), _pair(layer, "strides", (1, 1))
    filters = int(layer.config["filters"])
    k = _weight(layer, "kernel", (*kernel, c, filters)).transpose(3, 2, 0, 1)  # (kh,kw,I,O) -> (O,I,kh,kw)
    b = _weight(layer, "bias", (filters,)) if layer.config.get("use_bias", True) else None
    pads, (oh, ow) = _window(padding, (h, w), kernel, strides)
    conv_out = _conv_output(g, layer, out)
    _conv_node(g, xs[0].name, conv_out, k, b, bn, strides=list(strides), pads=pads)
    return _finish_conv(g, layer, conv_out, (filters, oh, ow), out)


def _emit_separable(g: _Graph, layer: KerasLayer, xs: list[_Tensor], out: str, bn: KerasLayer | None) -> _Tensor:
    """Keras SeparableConv2D = depthwise conv (strides and padding here) then a 1x1 pointwise conv (+bias)."""
    c, h, w = _rank4(layer, xs[0])
    padding = _common_conv_options(layer)
    _option(layer, "depth_multiplier", (1,), 1)
    kernel, strides = _pair(layer, "kernel_size"), _pair(layer, "strides", (1, 1))
    filters = int(layer.config["filters"])
    dw = _weight(layer, "depthwise_kernel", (*kernel, c, 1)).transpose(2, 3, 0, 1)  # -> (C, 1, kh, kw)
    pw = _weight(layer, "pointwise_kernel", (1, 1, c, filters)).transpose(3, 2, 0, 1)  # -> (F, C, 1, 1)
    b = _weight(layer, "bias", (filters,)) if layer.config.get("use_bias", True) else None
    pads, (oh, ow) = _window(padding, (h, w), kernel, strides)
    depthwise = _conv_node(g, xs[0].name, g.fresh(f"{layer.name}_depthwise"), dw, None, None,
                           group=c, strides=list(strides), pads=pads)
    conv_out = _conv_output(g, layer, out)
    _conv_node(g, depthwise, conv_out, pw, b, bn)
    return _finish_conv(g, layer, conv_out, (filters, oh, ow), out)


def _emit_batchnorm(g: _Graph, layer: KerasLayer, xs: list[_Tensor], out: str, _bn: KerasLayer | None) -> _Tensor:
    """An unfused BatchNorm (its input is not a conv used only by it); epsilon stays as Keras has it."""
    channels = xs[0].shape[0]
    _bn_affine(layer, channels)  # validates options and weights
    eps = float(layer.config.get("epsilon", 1e-3))
    shape = (channels,)
    gamma = layer.weights["gamma"] if layer.config.get("scale", True) else np.ones(shape, np.float32)
    beta = layer.weights["beta"] if layer.config.get("center", True) else np.zeros(shape, np.float32)
    stats = {"scale": gamma, "B": beta, "mean": layer.weights["moving_mean"], "var": layer.weights["moving_variance"]}
    params = [g.const(f"{out}_{key}", value) for key, value in stats.items()]
    return _Tensor(g.node("BatchNormalization", [xs[0].name, *params], out, epsilon=eps), xs[0].shape)


def _emit_activation(g: _Graph, layer: KerasLayer, xs: list[_Tensor], out: str, _bn: KerasLayer | None) -> _Tensor:
    kind = _option(layer, "activation", tuple(_ACTIVATION_OPS))
    return _activation(g, kind, xs[0], out)


def _emit_maxpool(g: _Graph, layer: KerasLayer, xs: list[_Tensor], out: str, _bn: KerasLayer | None) -> _Tensor:
    """Max pooling; ONNX MaxPool ignores its explicit pads in the max, the same as TF's -inf padding for 'same'."""
    c, h, w = _rank4(layer, xs[0])
    _option(layer, "data_format", ("channels_last",), "channels_last")
    padding = str(_option(layer, "padding", ("valid", "same")))
    pool = _pair(layer, "pool_size", (2, 2))
    strides = _pair(layer, "strides") if layer.config.get("strides") is not None else pool
    pads, (oh, ow) = _window(padding, (h, w), pool, strides)
    g.node("MaxPool", [xs[0].name], out, kernel_shape=list(pool), strides=list(strides), pads=pads)
    return _Tensor(out, (c, oh, ow))


def _emit_add(g: _Graph, layer: KerasLayer, xs: list[_Tensor], out: str, _bn: KerasLayer | None) -> _Tensor:
    """Element-wise sum of two or more same-shape tensors (Keras Add does not broadcast)."""
    if len(xs) < 2 or any(x.shape != xs[0].shape for x in xs):
        shapes = [x.shape for x in xs]
        raise ConversionError(f"layer {layer.name!r} (Add): needs >= 2 inputs of one shape, got {shapes}")
    acc = xs[0].name
    for i, x in enumerate(xs[1:], start=2):
        acc = g.node("Add", [acc, x.name], out if i == len(xs) else g.fresh(f"{layer.name}_partial"))
    return _Tensor(acc, xs[0].shape)


def _emit_gap(g: _Graph, layer: KerasLayer, xs: list[_Tensor], out: str, _bn: KerasLayer | None) -> _Tensor:
    c, _, _ = _rank4(layer, xs[0])
    _option(layer, "data_format", ("channels_last",), "channels_last")
    _option(layer, "keepdims", (False,), False)
    pooled = g.node("GlobalAveragePool", [xs[0].name], g.fresh(f"{layer.name}_nc11"))
    return _Tensor(g.node("Flatten", [pooled], out, axis=1), (c,))


_Emitter = Callable[[_Graph, KerasLayer, list[_Tensor], str, "KerasLayer | None"], _Tensor]
_EMITTERS: dict[str, _Emitter] = {
    "Conv2D": _emit_conv2d,
    "SeparableConv2D": _emit_separable,
    "BatchNormalization": _emit_batchnorm,
    "Activation": _emit_activation,
    "MaxPooling2D": _emit_maxpool,
    "Add": _emit_add,
    "GlobalAveragePooling2D": _emit_gap,
}


# --------------------------------------------------------------------------------------------------- whole model


def _plan_bn_folds(model: _KerasModel) -> dict[str, KerasLayer]:
    """conv name -> the BatchNorm folded into it: BN reads a linear conv whose output nothing else reads."""
    by_name = {layer.name: layer for layer in model.layers}
    readers: dict[str, int] = {}
    for layer in model.layers:
        for name in layer.inbound:
            readers[name] = readers.get(name, 0) + 1
    folds: dict[str, KerasLayer] = {}
    for layer in model.layers:
        if layer.class_name != "BatchNormalization" or len(layer.inbound) != 1:
            continue
        src = by_name.get(layer.inbound[0])
        if (src is not None and src.class_name in _CONV_CLASSES and readers.get(src.name) == 1
                and src.config.get("activation", "linear") == "linear" and src.name not in model.outputs):
            folds[src.name] = layer
    return folds


def _emit_input(g: _Graph, layer: KerasLayer) -> tuple[onnx.ValueInfoProto, _Tensor]:
    """The NHWC graph input with a dynamic batch, and the single Transpose to NCHW everything else works in."""
    shape = layer.config.get("batch_input_shape")
    if not isinstance(shape, list) or len(shape) != 4 or any(not isinstance(d, int) for d in shape[1:]):
        raise ConversionError(f"input {layer.name!r}: need a static NHWC batch_input_shape, got {shape!r}")
    if layer.config.get("dtype", "float32") != "float32":
        raise ConversionError(f"input {layer.name!r}: unsupported dtype {layer.config.get('dtype')!r}")
    _, h, w, c = shape
    value = helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [BATCH_DIM, h, w, c])
    nchw = g.node("Transpose", [INPUT_NAME], g.fresh(f"{layer.name}_nchw"), perm=[0, 3, 1, 2])
    return value, _Tensor(nchw, (c, h, w))


def _emit_layers(g: _Graph, model: _KerasModel) -> tuple[onnx.ValueInfoProto, _Tensor, int]:
    """Emit every layer in dependency order; returns the graph input, the output tensor and the folded-BN count."""
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ConversionError(f"need exactly one input and one output, got {model.inputs} -> {model.outputs}")
    folds = _plan_bn_folds(model)
    folded = {bn.name: conv for conv, bn in folds.items()}
    output_layer = model.outputs[0]
    tensors: dict[str, _Tensor] = {}
    graph_input: onnx.ValueInfoProto | None = None
    for layer in _topological(model.layers):
        if layer.class_name == "InputLayer":
            if layer.name != model.inputs[0]:
                raise ConversionError(f"InputLayer {layer.name!r} is not the model input")
            graph_input, tensors[layer.name] = _emit_input(g, layer)
        elif layer.name in folded:
            tensors[layer.name] = tensors[folded[layer.name]]
        elif layer.class_name not in _EMITTERS:
            raise ConversionError(f"layer {layer.name!r}: unsupported layer class {layer.class_name!r}")
        else:
            bn = folds.get(layer.name)
            result = bn.name if bn is not None else layer.name
            out = OUTPUT_NAME if result == output_layer else g.fresh(result)
            xs = [tensors[name] for name in layer.inbound]
            tensors[layer.name] = _EMITTERS[layer.class_name](g, layer, xs, out, bn)
    if graph_input is None or model.inputs[0] not in tensors:
        raise ConversionError(f"model input {model.inputs[0]!r} is not an InputLayer")
    return graph_input, tensors[output_layer], len(folds)


def convert_keras_hdf5(h5_path: str | Path, onnx_path: str | Path, *, opset: int = 17) -> None:
    """Convert a functional Keras 2.x HDF5 model to an ONNX file (input ``input`` NHWC, output ``probs``)."""
    if opset < MIN_OPSET:
        raise ConversionError(f"opset {opset} < {MIN_OPSET}: Softmax would not mean what Keras means")
    model = _read_model(h5_path)
    g = _Graph()
    graph_input, result, n_folded = _emit_layers(g, model)
    if result.name != OUTPUT_NAME or len(result.shape) != 1:
        raise ConversionError(f"model output must be a rank-2 (batch, classes) tensor, got shape {result.shape}")
    graph_output = helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [BATCH_DIM, result.shape[0]])
    graph = helper.make_graph(g.nodes, model.name, [graph_input], [graph_output], initializer=g.initializers)
    opset_id = helper.make_opsetid("", opset)
    onnx_model = helper.make_model(graph, producer_name=PRODUCER_NAME, producer_version=__version__,
                                   opset_imports=[opset_id])
    onnx_model.ir_version = helper.find_min_ir_version_for([opset_id])  # newest runtimes are not required
    onnx_model.doc_string = f"Converted from {Path(h5_path).name} (Keras {model.keras_version}); no preprocessing."
    onnx.checker.check_model(onnx_model, full_check=True)
    out_path = Path(onnx_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_model, out_path)
    log.info("converted %s -> %s: %d nodes, %d BatchNorms folded, opset %d",
             h5_path, out_path, len(g.nodes), n_folded, opset)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m pipeline.modelprep.keras_convert model.hdf5 model.onnx``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hdf5", type=Path)
    parser.add_argument("onnx", type=Path)
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    convert_keras_hdf5(args.hdf5, args.onnx, opset=args.opset)


if __name__ == "__main__":
    main()
