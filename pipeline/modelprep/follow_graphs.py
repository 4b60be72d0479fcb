"""Follow graphs: finding a face again by its look on a frame that stays in GPU memory (`tracking.follow_by`), as
ONNX, so only a few kilobytes of scores come down instead of every face's window of pixels.

- `template_graph`: frames + one sampling matrix per face → each face's grey template at a fixed size
  (`FollowGeometry.template`), sampled bilinearly at each template pixel's centre (`supersample` > 1: that many
  samples along each axis averaged, nearer cv2.INTER_AREA; on the crowd 3×3 found the same boxes as one sample,
  BENCHMARKS.md round 19, at 9× the memory and work).
- `match_graph`: frames + one sampling matrix per face (its search window: the template's size plus `margin`
  template pixels on each side, at the template's scale) + the templates → normalised cross-correlation scores
  [F, 2 my + 1, 2 mx + 1], cv2.TM_CCOEFF_NORMED's formula: the centred template correlated with each window
  position, over the template's and the position's energies.

Why fixed sizes: every shape stays static but the face count, so one session serves every face size. Why the
correlation as a batched MatMul along x and a Gather down the rows (`_correlation`), not a Conv: ONNX Conv has no
per-sample weights, and a Conv of every window with every template ([F, F, ...], its diagonal kept) grew as F² with
cuDNN's workspace besides: a batch's 100+ faces took gigabytes of GPU memory (BENCHMARKS.md, round 19). The
window's energy at each position comes from AveragePool over the window and its square (centred by the window's
mean first, so float32 keeps its precision).

Inputs and sampling reuse the crop graph's bilinear part (modelprep.frame_graphs): `frames` uint8 [B, H, W, 3] in
the frame's order, `crop_matrix` [F, 2, 3] (supersampled pixel centre → frame pixel centre), `crop_frame` [F] (each
face's frame in the batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from pipeline.modelprep.frame_graphs import (
    CLASSIFIER_OPSET,
    GRAY_BITS,
    GRAY_RGB,
    FrameFormat,
    _bilinear_crop,
    _Builder,
    _crop_inputs,
    _standalone,
)

TEMPLATE_INPUT = "follow_templates"  # the match graph's templates; also the template graph's output
SCORE_OUTPUT = "follow_scores"


@dataclass(frozen=True)
class FollowGeometry:
    """Sizes fixed when a follow graph is built: the template's (width, height) in template pixels, the search
    margin on each side (x, y) in template pixels, and the bilinear samples per template pixel along each axis
    (averaged)."""

    template: tuple[int, int] = (24, 30)
    margin: tuple[int, int] = (14, 18)
    supersample: int = 1

    @property
    def window(self) -> tuple[int, int]:
        """The search window's (width, height) in template pixels."""
        return self.template[0] + 2 * self.margin[0], self.template[1] + 2 * self.margin[1]

    def fits(self, pixels: np.ndarray) -> bool:
        """Whether a template's pixels were cut at this geometry (a host-made one, or another size, is not)."""
        return pixels.shape == (self.template[1], self.template[0])

    @property
    def scores(self) -> tuple[int, int]:
        """The score map's (width, height): one score per template position within the window."""
        return 2 * self.margin[0] + 1, 2 * self.margin[1] + 1


def _grey_area(b: _Builder, frame: FrameFormat, size: tuple[int, int], supersample: int) -> str:
    """Each face's region as grey float [F, h, w] (cv2's grey weights, unrounded), every output pixel the mean of
    `supersample`² bilinear samples. Each neighbour is made grey before the blend (grey is linear, so this is the
    blend's grey): one channel through the blend's tensors instead of three, a third of their memory."""
    width, height = size
    k = supersample
    weights = np.asarray(GRAY_RGB if frame.order == "rgb" else GRAY_RGB[::-1], np.float32) / float(1 << GRAY_BITS)
    axis = b.const([3], np.int64)

    def grey(colours: str) -> str:  # [F, h, w, 3] → [F, h, w, 1]
        return b.op("ReduceSum", b.op("Mul", colours, b.const(weights)), axis, keepdims=1)
    samples = _bilinear_crop(b, frame, (width * k, height * k), corner=grey)  # [F, h k, w k, 1]
    blocks = b.op("Reshape", samples, b.const([-1, height, k, width, k], np.int64))
    return b.op("ReduceMean", blocks, axes=[2, 4], keepdims=0)


def template_graph(frame: FrameFormat, geometry: FollowGeometry = FollowGeometry()) -> onnx.ModelProto:
    """(`frames`, `crop_matrix`, `crop_frame`) → `follow_templates` float [F, th, tw] (see the module docstring)."""
    b = _Builder("follow")
    b.op("Identity", _grey_area(b, frame, geometry.template, geometry.supersample), out=TEMPLATE_INPUT)
    width, height = geometry.template
    output = helper.make_tensor_value_info(TEMPLATE_INPUT, TensorProto.FLOAT, ["faces", height, width])
    return _standalone(b, _crop_inputs(frame), [output], CLASSIFIER_OPSET, "follow_templates")


def _centred(b: _Builder, x: str, axes: list[int]) -> str:
    return b.op("Sub", x, b.op("ReduceMean", x, axes=axes, keepdims=1))


def _correlation(b: _Builder, windows: str, templates: str, geometry: FollowGeometry) -> str:
    """Each window [F, SH, SW] correlated with its own template [F, th, tw] at every position: [F, sh, sw], in two
    steps linear in F. Along x, every window row against every template row (the window's rows gathered at each x
    offset, one batched MatMul per face): A[f, y, dx, r] = sum_c W[f, y, dx + c] T[f, r, c]; then down the rows,
    out[f, dy, dx] = sum_r A[f, dy + r, dx, r] (a Gather of the (dy + r, r) pairs)."""
    (tw, th), (ww, wh), (sw, sh) = geometry.template, geometry.window, geometry.scores
    along_x = np.arange(sw)[:, None] + np.arange(tw)[None, :]  # [sw, tw]: window column of (dx, c)
    rows = b.op("Gather", windows, b.const(along_x, np.int64), axis=2)  # [F, SH, sw, tw]
    rows = b.op("Reshape", rows, b.const([-1, wh * sw, tw], np.int64))
    by_row = b.op("MatMul", rows, b.op("Transpose", templates, perm=[0, 2, 1]))  # [F, SH * sw, th]
    by_row = b.op("Reshape", b.op("Transpose", b.op("Reshape", by_row, b.const([-1, wh, sw, th], np.int64)),
                                  perm=[0, 2, 1, 3]), b.const([-1, sw, wh * th], np.int64))  # [F, sw, SH * th]
    pairs = (np.arange(sh)[:, None] + np.arange(th)[None, :]) * th + np.arange(th)[None, :]  # [sh, th]: (dy + r, r)
    summed = b.op("ReduceSum", b.op("Gather", by_row, b.const(pairs, np.int64), axis=2), b.const([3], np.int64),
                  keepdims=0)  # [F, sw, sh]
    return b.op("Transpose", summed, perm=[0, 2, 1])


def match_graph(frame: FrameFormat, geometry: FollowGeometry = FollowGeometry()) -> onnx.ModelProto:
    """(`frames`, `crop_matrix`, `crop_frame`, `follow_templates`) → `follow_scores` float [F, sh, sw]: the
    normalised cross-correlation of each face's template at every position of its search window."""
    b = _Builder("follow")
    tw, th = geometry.template
    flat_windows = _centred(b, _grey_area(b, frame, geometry.window, geometry.supersample), [1, 2])  # [F, SH, SW]
    flat_templates = _centred(b, TEMPLATE_INPUT, [1, 2])  # [F, th, tw]
    products = _correlation(b, flat_windows, flat_templates, geometry)
    windows = b.op("Unsqueeze", flat_windows, b.const([1], np.int64))  # [F, 1, SH, SW]
    templates = b.op("Unsqueeze", flat_templates, b.const([1], np.int64))  # [F, 1, th, tw]
    mean = b.op("AveragePool", windows, kernel_shape=[th, tw])
    square_mean = b.op("AveragePool", b.op("Mul", windows, windows), kernel_shape=[th, tw])
    variance = b.op("Relu", b.op("Sub", square_mean, b.op("Mul", mean, mean)))  # [F, 1, sh, sw]
    window_energy = b.op("Mul", b.op("Squeeze", variance, b.const([1], np.int64)), b.const(float(tw * th)))
    template_energy = b.op("ReduceSum", b.op("Mul", templates, templates), b.const([1, 2, 3], np.int64),
                           keepdims=1)  # [F, 1, 1, 1]
    template_energy = b.op("Squeeze", template_energy, b.const([1], np.int64))  # [F, 1, 1]
    # a flat window or template has no energy: its scores come out ~0, below any match threshold
    energy = b.op("Add", b.op("Mul", window_energy, template_energy), b.const(1e-3))
    b.op("Div", products, b.op("Sqrt", energy), out=SCORE_OUTPUT)
    sw, sh = geometry.scores
    inputs = [*_crop_inputs(frame),
              helper.make_tensor_value_info(TEMPLATE_INPUT, TensorProto.FLOAT, ["faces", th, tw])]
    output = helper.make_tensor_value_info(SCORE_OUTPUT, TensorProto.FLOAT, ["faces", sh, sw])
    return _standalone(b, inputs, [output], CLASSIFIER_OPSET, "follow_match")


FOLLOW_GRAPHS = {"templates": template_graph, "match": match_graph}  # by role, as the lanes ask for them

Box = tuple[float, float, float, float]


def search_window(template_box: Box, expected: Box, geometry: FollowGeometry) -> Box:
    """A face's search window in frame coordinates: centred on where it is expected, at its template's scale,
    `margin` template pixels more than the template on each side."""
    (tw, th), (ww, wh) = geometry.template, geometry.window
    per_x = (template_box[2] - template_box[0]) / tw  # frame pixels per template pixel
    per_y = (template_box[3] - template_box[1]) / th
    cx, cy = (expected[0] + expected[2]) / 2.0, (expected[1] + expected[3]) / 2.0
    return (cx - ww * per_x / 2.0, cy - wh * per_y / 2.0, cx + ww * per_x / 2.0, cy + wh * per_y / 2.0)


def found_box(window: Box, x: float, y: float, template_box: Box, geometry: FollowGeometry) -> Box:
    """The face's box where the template matched at score position (x, y) of `window`: the template's size, its
    top-left that many template pixels into the window."""
    (tw, th) = geometry.template
    width, height = template_box[2] - template_box[0], template_box[3] - template_box[1]
    left, top = window[0] + x * width / tw, window[1] + y * height / th
    return (left, top, left + width, top + height)


def sampling_matrix(box: tuple[float, float, float, float], size: tuple[int, int], supersample: int) -> np.ndarray:
    """The crop matrix [2, 3] that samples `box` (x1, y1, x2, y2, continuous frame coordinates) at `size` × the
    supersampling: supersampled pixel centre (u, v) → frame pixel centre."""
    step_x = (box[2] - box[0]) / (size[0] * supersample)
    step_y = (box[3] - box[1]) / (size[1] * supersample)
    return np.array([[step_x, 0.0, box[0] + 0.5 * step_x - 0.5],
                     [0.0, step_y, box[1] + 0.5 * step_y - 0.5]], np.float32)
