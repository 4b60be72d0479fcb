"""The C library, for the few calls the standard library does not wrap (thread names, giving heap back)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def _load() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


LIBC = _load()  # None off Linux, or where no C library could be opened
