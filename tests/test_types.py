"""The package type-checks: mypy (pinned in requirements-dev.txt, configured in pyproject.toml with pydantic's
plugin, so config models' fields and defaults are checked as pydantic reads them) over `pipeline/` and
`run_pipeline.py`. A wrong attribute, a None passed where a value is required, or a dtype mix-up fails here, not on an
operator's machine. (The TensorRT backend is checked again against TensorRT's stubs in tests/test_tensorrt.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pipeline_type_checks(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is in requirements-dev.txt")
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "pipeline",
                           "run_pipeline.py"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
