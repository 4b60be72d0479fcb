"""The base every settings model builds on, wherever it lives (each wing declares its own section of the YAML).

`StrictModel` makes unknown keys errors (a typo must not pass silently), values immutable and finite.
`ConfigValueError` lets a model-level validator point at the key that is wrong, so the loader
(`pipeline.config.loader`) can print `FILE:LINE: key: message` for the line an operator has to edit.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

Loc = tuple[str | int, ...]

PRESET_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
"""Expression names go into OSC addresses and JSON: letters, digits, '_', '.' and '-' only."""


class _Missing:
    """Sentinel type: an issue without a value to echo (a missing key has none; `None` is a real YAML value)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class ConfigValueError(ValueError):
    """A ValueError raised by a model validator that knows which sub-key is wrong.

    Pydantic locates a model-level validator's error at the model itself; `key` (relative to that model) lets the
    error point at the line of the offending key instead, and `value` says what to echo in `(got …)`.
    """

    def __init__(self, message: str, key: str | Loc = (), value: object = MISSING) -> None:
        super().__init__(message)
        self.key: Loc = (key,) if isinstance(key, str) else tuple(key)
        self.value = value


class StrictModel(BaseModel):
    """Base of every section: unknown keys are errors (typos must not pass silently), values immutable and finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
