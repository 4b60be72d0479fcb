"""Logging for operators: text or JSON lines on stderr (stdout carries events), secrets always masked."""

from __future__ import annotations

import json
import logging
import sys
import time

from pipeline.core.redact import mask_secrets


class _MaskingFilter(logging.Filter):
    """Masks `user:password@` in every formatted message, whatever module logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class _MaskedTextFormatter(logging.Formatter):
    """Tracebacks can quote URLs too: mask the whole formatted record, not only the message."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = mask_secrets(self.formatException(record.exc_info))
        return json.dumps(entry)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """(Re)configure the root logger; safe to call again once the config is known."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_MaskingFilter())
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        formatter = _MaskedTextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
