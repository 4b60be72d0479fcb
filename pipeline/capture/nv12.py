"""NVDEC's NV12 frames converted to RGB on the GPU by a small CUDA kernel of our own, compiled once with NVRTC.

Why: PyNvVideoCodec keeps as many output frames per decoder as one `Decode` call has returned together, and a stream
with B-frames returns two or three at once now and then (`decoder_output_frames`, BENCHMARKS.md round 23). Asked
for RGB, each is 6.2 MB at 1080p; asked for NVDEC's own NV12, half that. The conversion then happens here, straight
into the camera's pool buffer: the device-to-device copy that was needed anyway becomes this kernel.

The formula is BT.601 limited range in 20-bit fixed point, each 2x2 block of pixels sharing its chroma sample: the
integers OpenCV's `cv2.COLOR_YUV2RGB_NV12` uses, so a frame converted here has the pixels the CPU would give for the
same NV12 (tests/test_nv12.py compares them exactly). `converter_for` compiles the kernel the first time a GPU asks
(NVRTC, to a CUBIN for that GPU's architecture, so no PTX version has to match the driver) and says why it cannot
when NVRTC is missing; the source then keeps PyNvVideoCodec's own RGB conversion.
"""

from __future__ import annotations

import importlib
import logging
import string
import threading
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

NVRTC_REQUIREMENT = "nvidia-cuda-nvrtc (pip install -r requirements-gpu.txt)"
KERNEL_NAME = b"nv12_to_rgb"
BLOCK = (32, 8)  # threads a block; each thread converts one 2x2 block of pixels

# BT.601, limited range (Y 16-235, chroma 16-240): 1.164, 1.596, -0.813, -0.391, 2.018, scaled by 2**SHIFT and
# truncated. tests/test_nv12.py applies them in numpy and gets OpenCV's NV12 conversion exactly.
SHIFT = 20
COEFFICIENTS = {"luma": 1220542, "v_red": 1673527, "v_green": -852492, "u_green": -409993, "u_blue": 2116026}
KERNEL_TEMPLATE = r"""
extern "C" __global__ void nv12_to_rgb(const unsigned char* luma, const unsigned char* chroma, int pitch,
                                       unsigned char* rgb, int width, int height) {
    const int cx = blockIdx.x * blockDim.x + threadIdx.x;
    const int cy = blockIdx.y * blockDim.y + threadIdx.y;
    if (2 * cx >= width || 2 * cy >= height) return;
    const int shift = $shift, half = 1 << (shift - 1);
    const int u = (int)chroma[cy * pitch + 2 * cx] - 128;
    const int v = (int)chroma[cy * pitch + 2 * cx + 1] - 128;
    const int red = half + ($v_red) * v;
    const int green = half + ($v_green) * v + ($u_green) * u;
    const int blue = half + ($u_blue) * u;
    for (int dy = 0; dy < 2; ++dy) {
        const int y = 2 * cy + dy;
        if (y >= height) break;
        for (int dx = 0; dx < 2; ++dx) {
            const int x = 2 * cx + dx;
            if (x >= width) break;
            const int lum = max((int)luma[y * pitch + x] - 16, 0) * ($luma);
            unsigned char* out = rgb + ((long long)y * width + x) * 3;
            out[0] = (unsigned char)min(max((lum + red) >> shift, 0), 255);
            out[1] = (unsigned char)min(max((lum + green) >> shift, 0), 255);
            out[2] = (unsigned char)min(max((lum + blue) >> shift, 0), 255);
        }
    }
}
"""
KERNEL_SOURCE = string.Template(KERNEL_TEMPLATE).substitute(shift=SHIFT, **COEFFICIENTS)


class ConverterError(RuntimeError):
    """The kernel could not be compiled, loaded or launched (the message says which step and why)."""


class Nv12ToRgb:
    """The compiled kernel of one GPU. `convert` queues one frame's conversion on a stream; thread-safe (launches
    only read the loaded function)."""

    def __init__(self, gpu: int) -> None:
        self._driver: Any = importlib.import_module("cuda.bindings.driver")
        self._nvrtc: Any = importlib.import_module("cuda.bindings.nvrtc")
        runtime: Any = importlib.import_module("cuda.bindings.runtime")
        self.gpu = gpu
        self.arch = _architecture(runtime, gpu)
        cubin = self._compile(self.arch)
        self._module = self._check("cuModuleLoadData", self._driver.cuModuleLoadData(cubin))
        self._function = self._check("cuModuleGetFunction",
                                     self._driver.cuModuleGetFunction(self._module, KERNEL_NAME))

    def convert(self, src: int, width: int, height: int, dst: int, stream: Any) -> None:
        """Queue the conversion of an NV12 frame at `src` (luma rows of `width` bytes, then the interleaved chroma
        rows) into packed RGB at `dst` (width * height * 3 bytes) on `stream`."""
        values: list[np.ndarray] = [
            np.array([src], np.uint64), np.array([src + width * height], np.uint64), np.array([width], np.int32),
            np.array([dst], np.uint64), np.array([width], np.int32), np.array([height], np.int32)]
        params = np.array([value.ctypes.data for value in values], np.uint64)
        blocks_x = -(-((width + 1) // 2) // BLOCK[0])
        blocks_y = -(-((height + 1) // 2) // BLOCK[1])
        self._check("cuLaunchKernel (NV12 to RGB)", self._driver.cuLaunchKernel(
            self._function, blocks_x, blocks_y, 1, BLOCK[0], BLOCK[1], 1, 0, self._driver.CUstream(int(stream)),
            params.ctypes.data, 0))

    def _compile(self, arch: str) -> bytes:
        nvrtc = self._nvrtc
        program = self._check_nvrtc("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(
            KERNEL_SOURCE.encode(), b"nv12_to_rgb.cu", 0, [], []), None)
        try:
            options = [f"--gpu-architecture={arch}".encode()]
            result = nvrtc.nvrtcCompileProgram(program, len(options), options)
            if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise ConverterError(f"NVRTC could not compile the NV12 kernel for {arch}: {self._log(program)}")
            size = self._check_nvrtc("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(program), program)
            cubin = b" " * size
            self._check_nvrtc("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(program, cubin), program)
            return cubin
        finally:
            nvrtc.nvrtcDestroyProgram(program)

    def _log(self, program: Any) -> str:
        _, size = self._nvrtc.nvrtcGetProgramLogSize(program)
        text = b" " * size
        self._nvrtc.nvrtcGetProgramLog(program, text)
        return text.decode(errors="replace").strip()

    def _check_nvrtc(self, call: str, result: tuple[Any, ...], program: Any) -> Any:
        if result[0] != self._nvrtc.nvrtcResult.NVRTC_SUCCESS:
            detail = f": {self._log(program)}" if program is not None else ""
            raise ConverterError(f"{call} failed ({result[0]}){detail}")
        return result[1] if len(result) > 1 else None

    def _check(self, call: str, result: tuple[Any, ...]) -> Any:
        if result[0] != self._driver.CUresult.CUDA_SUCCESS:
            raise ConverterError(f"{call} failed ({result[0]})")
        return result[1] if len(result) > 1 else None


def _architecture(runtime: Any, gpu: int) -> str:
    """The GPU's `sm_XY` from its compute capability (the CUBIN is built for exactly that architecture)."""
    attribute = runtime.cudaDeviceAttr
    major = runtime.cudaDeviceGetAttribute(attribute.cudaDevAttrComputeCapabilityMajor, gpu)
    minor = runtime.cudaDeviceGetAttribute(attribute.cudaDevAttrComputeCapabilityMinor, gpu)
    if int(major[0]) != 0 or int(minor[0]) != 0:
        raise ConverterError(f"cudaDeviceGetAttribute (compute capability of GPU {gpu}) failed ({major[0]})")
    return f"sm_{major[1]}{minor[1]}"


_converters: dict[int, Nv12ToRgb | None] = {}
_converters_lock = threading.Lock()


def converter_for(gpu: int) -> Nv12ToRgb | None:
    """The NV12 kernel for `gpu`, compiled on the first call (on a thread whose CUDA context is current); None, with
    one log line saying why, where it cannot be built (NVRTC not installed, or it failed): callers then ask
    PyNvVideoCodec for RGB frames instead."""
    with _converters_lock:
        if gpu not in _converters:
            _converters[gpu] = _build(gpu)
        return _converters[gpu]


def _build(gpu: int) -> Nv12ToRgb | None:
    try:
        converter = Nv12ToRgb(gpu)
    except (ImportError, OSError, RuntimeError) as exc:  # no NVRTC library, or the compile or load failed
        log.info("NVDEC frames on GPU %d are converted to RGB by PyNvVideoCodec (3 MB more GPU memory for each "
                 "frame a decoder keeps at 1080p): our NV12 kernel is unavailable (%s; needs %s)", gpu, exc,
                 NVRTC_REQUIREMENT)
        return None
    log.info("NVDEC frames on GPU %d: NV12 converted to RGB by our kernel (%s)", gpu, converter.arch)
    return converter
