"""inference.gpu_wait without a GPU: the daemon's start never fails on it (the models' loading says what is
missing), and CPU inference leaves CUDA alone. tests/test_gpu.py checks the flags on a real GPU."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pipeline.config.app import parse_config
from pipeline.inference.gpu.cuda import CudaError, set_gpu_wait
from pipeline.service.parts import prepare_gpu

CUDA_CONFIG = "cameras:\n  - {name: lobby, source: demo}\ninference:\n  device: cuda\n  gpu_wait: %s\n"


def test_gpu_wait_defaults_to_block_and_refuses_other_words() -> None:
    from pipeline.config.loader import ConfigError

    assert parse_config("cameras:\n  - {name: lobby, source: demo}\n", "a.yaml", env={}).inference.gpu_wait == "block"
    assert parse_config(CUDA_CONFIG % "spin", "a.yaml", env={}).inference.gpu_wait == "spin"
    with pytest.raises(ConfigError, match=r"a\.yaml:5: inference\.gpu_wait: must be one of: block, spin, auto"):
        parse_config(CUDA_CONFIG % "sleepy", "a.yaml", env={})


def test_an_unknown_mode_is_refused_before_the_driver_is_touched() -> None:
    with pytest.raises(CudaError, match="unknown GPU wait mode 'nap'"):
        set_gpu_wait("nap")


def test_the_start_goes_on_when_the_driver_cannot_be_reached(caplog: Any) -> None:
    cfg = parse_config(CUDA_CONFIG % "block", "a.yaml", env={})
    with caplog.at_level(logging.INFO, logger="pipeline.service.parts"):
        prepare_gpu(cfg)  # no libcuda here: a warning; on a GPU machine: set
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("GPU waits left to CUDA's default") or m.startswith("GPU waits: block on") for m in said)


def test_cpu_inference_leaves_cuda_alone(caplog: Any) -> None:
    cfg = parse_config("cameras:\n  - {name: lobby, source: demo}\n", "a.yaml", env={})
    with caplog.at_level(logging.DEBUG, logger="pipeline.service.parts"):
        prepare_gpu(cfg)
    assert not [r for r in caplog.records if "GPU waits" in r.getMessage()]


STACK_CONFIG = "cameras:\n  - {name: lobby, source: demo}\ninference:\n  device: cuda\n  gpu_stack_bytes: %s\n"


def test_gpu_stack_bytes_is_a_size_or_null_and_refuses_nonsense() -> None:
    from pipeline.config.loader import ConfigError

    plain = "cameras:\n  - {name: lobby, source: demo}\n"
    assert parse_config(plain, "a.yaml", env={}).inference.gpu_stack_bytes == 0  # what the kernels need
    assert parse_config(STACK_CONFIG % "256", "a.yaml", env={}).inference.gpu_stack_bytes == 256
    assert parse_config(STACK_CONFIG % "null", "a.yaml", env={}).inference.gpu_stack_bytes is None
    with pytest.raises(ConfigError, match=r"a\.yaml:5: inference\.gpu_stack_bytes: .*greater than or equal to 0"):
        parse_config(STACK_CONFIG % "-1", "a.yaml", env={})


def test_the_start_goes_on_when_the_stack_cannot_be_set(caplog: Any) -> None:
    """No driver here: the waits' warning says so and the stack is not tried (a GPU machine logs both as set)."""
    cfg = parse_config(STACK_CONFIG % "256", "a.yaml", env={})
    with caplog.at_level(logging.INFO, logger="pipeline.service.parts"):
        prepare_gpu(cfg)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("GPU waits left to CUDA's default") for m in said) or \
        any(m.startswith("GPU thread stack: ") or m.startswith("GPU thread stack left") for m in said)


class _FakeRuntime:
    """cuda-python's runtime API as far as set_gpu_stack uses it: no GPU here (tests/test_gpu.py runs the real one)."""

    class cudaLimit:  # noqa: N801 - cuda-python's name
        cudaLimitStackSize = 0

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.device, self.stack = 0, 1024

    def cudaGetDevice(self) -> tuple[int, int]:  # noqa: N802
        return 0, self.device

    def cudaSetDevice(self, ordinal: int) -> tuple[int]:  # noqa: N802
        self.calls.append(("set_device", ordinal))
        self.device = ordinal
        return (0,)

    def cudaDeviceSetLimit(self, limit: int, value: int) -> tuple[int]:  # noqa: N802
        self.calls.append(("set_limit", value))
        self.stack = value
        return (0,)

    def cudaDeviceGetLimit(self, limit: int) -> tuple[int, int]:  # noqa: N802
        return 0, self.stack


def test_the_stack_is_set_once_per_size_and_the_thread_keeps_its_gpu(monkeypatch: Any) -> None:
    """A reload asks for the same size again: the stack the kernels grew is left alone (setting it would shrink it
    and stall the GPU); another size is set; the calling thread's GPU is what it was."""
    from pipeline.inference.gpu import cuda

    fake = _FakeRuntime()
    monkeypatch.setattr(cuda, "_runtime", fake)
    monkeypatch.setattr(cuda, "_stack_asked", {})
    assert cuda.set_gpu_stack(0, ordinal=1) == 0
    fake.stack = 448  # a kernel needed more: CUDA grew it
    assert cuda.set_gpu_stack(0, ordinal=1) == 448
    assert [call for call in fake.calls if call[0] == "set_limit"] == [("set_limit", 0)]
    assert cuda.set_gpu_stack(256, ordinal=1) == 256
    assert fake.device == 0 and fake.calls[-1] == ("set_device", 0)
