"""NVDEC's NV12 frames converted to RGB by our own kernel (capture.nv12): its integer formula against OpenCV's NV12
conversion on real frames (everywhere), the kernel compiled by NVRTC (where NVRTC is installed), and on the GPU the
kernel's pixels against OpenCV's for the same NV12 frames, which NVDEC sources keeping frames on the GPU now use."""

from __future__ import annotations

import importlib

import cv2
import numpy as np
import pytest

from pipeline.capture import nv12
from pipeline.capture.nvdec import nvdec_problem
from pipeline.tools.bench_engine import video_frames
from tests.conftest import data_path

NVDEC_PROBLEM = nvdec_problem()
needs_nvdec = pytest.mark.skipif(NVDEC_PROBLEM is not None, reason=f"NVDEC decoding unavailable: {NVDEC_PROBLEM}")


def _nvrtc_problem() -> str | None:
    try:
        nvrtc = importlib.import_module("cuda.bindings.nvrtc")
        nvrtc.nvrtcVersion()
    except (ImportError, RuntimeError, OSError) as exc:
        return f"NVRTC unavailable ({type(exc).__name__}: {str(exc)[:80]}; {nv12.NVRTC_REQUIREMENT})"
    return None


def _nv12_of(bgr: np.ndarray) -> np.ndarray:
    """An NV12 frame (luma rows, then interleaved U/V rows) made from a BGR frame through OpenCV's I420."""
    height, width = bgr.shape[:2]
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    quarter = height * width // 4
    chroma = i420[height:].reshape(-1)
    u = chroma[:quarter].reshape(height // 2, width // 2)
    v = chroma[quarter:].reshape(height // 2, width // 2)
    return np.concatenate([i420[:height], np.stack([u, v], axis=-1).reshape(height // 2, width)])


def _convert_as_the_kernel_does(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """The kernel's arithmetic in numpy: each 2x2 block's chroma, the module's coefficients, a rounding half."""
    k = nv12.COEFFICIENTS
    luma = np.maximum(frame[:height].astype(np.int64) - 16, 0) * k["luma"]
    chroma = frame[height:].astype(np.int64) - 128
    u = np.repeat(np.repeat(chroma[:, 0::2], 2, axis=0), 2, axis=1)
    v = np.repeat(np.repeat(chroma[:, 1::2], 2, axis=0), 2, axis=1)
    half = 1 << (nv12.SHIFT - 1)
    channels = [luma + half + k["v_red"] * v, luma + half + k["v_green"] * v + k["u_green"] * u,
                luma + half + k["u_blue"] * u]
    return np.clip(np.stack([c >> nv12.SHIFT for c in channels], axis=-1), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("clip", ["group_1080p.mp4", "woman2.mp4"])
def test_the_kernels_arithmetic_is_opencvs_nv12_conversion_exactly(clip: str) -> None:
    frames = video_frames(data_path("video", clip), 3)
    assert frames
    for bgr in frames:
        height, width = bgr.shape[:2]
        frame = _nv12_of(bgr)
        expected = cv2.cvtColor(frame, cv2.COLOR_YUV2RGB_NV12)
        assert np.array_equal(_convert_as_the_kernel_does(frame, width, height), expected)


def test_the_kernel_source_carries_the_coefficients_and_compiles_with_nvrtc() -> None:
    """NVRTC (requirements-dev.txt installs it, as requirements-gpu.txt does) compiles the kernel without a GPU; a
    wrong architecture is the clear error the daemon would log before keeping PyNvVideoCodec's RGB."""
    for value in [nv12.SHIFT, *nv12.COEFFICIENTS.values()]:
        assert f"{value}" in nv12.KERNEL_SOURCE
    problem = _nvrtc_problem()
    if problem is not None:
        pytest.skip(problem)
    converter = object.__new__(nv12.Nv12ToRgb)
    converter._nvrtc = importlib.import_module("cuda.bindings.nvrtc")  # type: ignore[attr-defined]
    cubin = converter._compile("sm_90")  # type: ignore[attr-defined]
    assert cubin[:4] == b"\x7fELF"
    with pytest.raises(nv12.ConverterError, match="could not compile"):
        converter._compile("sm_1")  # type: ignore[attr-defined]


@pytest.mark.gpu
@needs_nvdec
@pytest.mark.parametrize("clip", ["group_1080p.mp4", "woman2.mp4"])
def test_nvdec_frames_kept_on_the_gpu_are_opencvs_conversion_of_nvdecs_nv12(clip: str) -> None:
    """A source keeping frames on the GPU decodes to NV12 and converts with the kernel: each frame's RGB is exactly
    what OpenCV makes of the same NV12 bytes (copied down from the decoder's output before the conversion)."""
    from pipeline.capture.nvdec import NvdecSource

    source = NvdecSource(str(data_path("video", clip)), "test", keep_on_device=True)
    runtime = importlib.import_module("cuda.bindings.runtime")
    try:
        assert source._nv12 is not None, "NVRTC is missing on the GPU machine"  # type: ignore[attr-defined]
        for _ in range(12):
            source.grab(1.0)
            frame = source._current  # type: ignore[attr-defined]
            width, height = source._size  # type: ignore[attr-defined]
            nv12_bytes = np.empty(int(frame.framesize()), np.uint8)
            (status,) = runtime.cudaMemcpy(nv12_bytes.ctypes.data, int(frame.GetPtrToPlane(0)), nv12_bytes.size,
                                           runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost)
            assert int(status) == 0
            image = source.retrieve()
            expected = cv2.cvtColor(nv12_bytes.reshape(height * 3 // 2, width), cv2.COLOR_YUV2BGR_NV12)
            assert np.array_equal(image.to_host(), expected)
    finally:
        source.close()
