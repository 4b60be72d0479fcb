"""The ONNX Runtime sessions prepare-models' checks open (verification, calibration): quiet, as the daemon's are."""

from __future__ import annotations

from typing import Any


def quiet_options(ort: Any) -> Any:
    """Session options with ONNX Runtime's own warnings off (e.g. "Removing initializer ... not used by any node" for
    each constant the graph optimiser drops, on every first run), as the daemon's sessions have."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return options
