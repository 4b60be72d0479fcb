"""Kernel names for the pipeline's own threads, so per-thread CPU can be told apart from outside the process.

Why: Python 3.11/3.12 leave every thread's kernel name (`comm`) as the interpreter's, so `top -H`, py-spy and
/proc/PID/task cannot tell a camera's reader from a lane or a library's pool. Camera groups run in processes of
their own, where only /proc can see them (pipeline/tools/thread_cpu.py); a thread that names itself after its
`threading` name (cut to the kernel's 15 bytes) can be counted by role there too.
"""

from __future__ import annotations

import ctypes
import threading

from pipeline.core.libc import LIBC

_PR_SET_NAME = 15  # linux/prctl.h
_COMM_BYTES = 15  # the kernel keeps 16 bytes, the last a NUL


def name_native_thread() -> bool:
    """Give the calling thread's kernel name its `threading` name (first 15 bytes); whether that was done (not on
    other systems than Linux). Call it first thing in a thread's run loop."""
    if LIBC is None:
        return False
    name = threading.current_thread().name.encode("utf-8", "replace")[:_COMM_BYTES]
    return LIBC.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0) == 0
