"""Logging for operators: text or JSON lines on stderr (stdout carries events), secrets always masked.

OpenCV, FFmpeg (inside OpenCV) and ONNX Runtime print straight to file descriptor 2 (`[ WARN:1@0.4] global
cap_v4l.cpp:914 ...`, `[tcp @ 0x...] Connection refused`, coloured `[W:onnxruntime:...]`). Two measures:

- Their thresholds follow the daemon's level (`_tune_native_levels`): OpenCV through OPENCV_LOG_LEVEL or
  `cv2.utils.logging.setLogLevel` (an operator's own OPENCV_LOG_LEVEL wins), ONNX Runtime's default logger once it is
  imported (its sessions already log errors only: pipeline.inference.onnxruntime). FFmpeg's is deliberately left at
  OpenCV's default (errors): setting OPENCV_FFMPEG_LOGLEVEL makes OpenCV print FFmpeg's messages with `printf`, on
  stdout, in the middle of the events.
- Unless the level is debug (or with `logging.format: json` at any level), fd 2 becomes a pipe read by the
  `native-stderr` thread (`NativeStderr`): each line becomes a record of logger `native` at the level its prefix
  names (`_native_level`), while our own handler writes to a duplicate of the original stderr. Python's own stray
  writes to sys.stderr (warnings, a thread's traceback) take the same path, so in JSON every line is JSON. Lines that
  only detail a failure the daemon reports itself in one line of its own (FFmpeg's `[tcp @ 0x...] Connection ...
  failed` on every retry of a dead camera, OpenCV's `VIDEOIO(FFMPEG): backend is generally available but can't be
  used to capture by name`) are DEBUG: at the operator's levels a dead camera reads as one WARNING line, not as if
  FFmpeg were broken. At debug in text mode fd 2 is left alone: everything native shows as printed, and a crash's
  last native words cannot be lost in the pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import fcntl
import json
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from typing import BinaryIO, TextIO

from pipeline.core.redact import mask_secrets

NATIVE_LOGGER = "native"
PIPE_BYTES = 1 << 20  # room for bursts while the reader waits for the GIL (the kernel's default is 64 KiB)
DRAIN_TIMEOUT_S = 2.0  # at exit or a switch to text: how long the reader may take for the lines still in the pipe
_OPERATOR_OPENCV_LEVEL = os.environ.get("OPENCV_LOG_LEVEL")
# the daemon's level -> OpenCV's threshold (its INFO and below are for OpenCV's developers; below INFO only if asked
# for with OPENCV_LOG_LEVEL) and ONNX Runtime's default logger severity (0 verbose ... 4 fatal)
_OPENCV_THRESHOLD = {"debug": "INFO", "info": "WARNING", "warning": "WARNING", "error": "ERROR"}
# ONNX Runtime's warnings on loading a model (e.g. "Removing initializer ... not used by any node" while a model is
# prepared) are for model authors: shown at debug only.
_ORT_SEVERITY = {"debug": 1, "info": 3, "warning": 3, "error": 3}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A line our own handlers wrote (text `2026-12-02T12:00:00 WARNING name: ...`, or a JSON record), in a child process
# whose fd 2 is this process's capture pipe: passed through, not logged again as a native line.
_OWN_LINE = re.compile(r'^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) |\{"ts": )')
_OPENCV_LINE = re.compile(r"^\[\s*(FATAL|ERROR|WARN|INFO|DEBUG|VERBOSE)[:\]]")
_ORT_LINE = re.compile(r"\[([VIWEF]):onnxruntime:")
# Native lines that only detail a failure the daemon handles and reports itself (see the module docstring).
_HANDLED_DETAIL = re.compile(r"^\[[\w.-]+ @ 0x[0-9a-fA-F]+\]|can't be used to capture by name|"
                             r"VIDEOIO\(\w+\): (?:can't|backend is generally available)")
_OPENCV_LEVELS = {"FATAL": logging.CRITICAL, "ERROR": logging.ERROR, "WARN": logging.WARNING, "INFO": logging.INFO,
                  "DEBUG": logging.DEBUG, "VERBOSE": logging.DEBUG}
_ORT_LEVELS = {"F": logging.CRITICAL, "E": logging.ERROR, "W": logging.WARNING, "I": logging.INFO, "V": logging.DEBUG}


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


class _StderrHandler(logging.StreamHandler[TextIO]):
    """A StreamHandler that stays quiet when stderr itself is gone (closed pipe, journal restarted).

    The default would print a traceback to sys.stderr, which under the JSON capture is the pipe whose lines come
    back through this handler: one failing write would turn into an endless loop."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handleError(record)


def _native_level(line: str) -> int:
    """The level a native line names: OpenCV `[ WARN:...]`, ONNX Runtime `[W:onnxruntime:...]`; FFmpeg's
    `[tcp @ 0x...]` carries none and is printed only at its error threshold, but each is the detail of a failure
    the daemon handles (and reports) itself, so warning; anything else (a stray write) warning too."""
    if _HANDLED_DETAIL.search(line):
        return logging.DEBUG
    match = _OPENCV_LINE.match(line)
    if match:
        return _OPENCV_LEVELS[match.group(1)]
    match = _ORT_LINE.search(line)
    if match:
        return _ORT_LEVELS[match.group(1)]
    return logging.WARNING


class NativeStderr:
    """File descriptor 2 redirected to a pipe whose lines a thread logs as records of logger `native`."""

    def __init__(self) -> None:
        self._original: TextIO | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        atexit.register(self.release)  # drain the pipe before the interpreter goes (lines written at exit too)

    def original_stream(self) -> TextIO:
        """The stderr the process was started with, as a stream of its own (fd 2 itself may become the pipe)."""
        with self._lock:
            if self._original is None:
                self._original = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
            return self._original

    def capture(self) -> None:
        """Start the capture (no-op if running); call after the handler writes to original_stream()."""
        original = self.original_stream()
        with self._lock:
            if self._thread is not None:
                return
            read_fd, write_fd = os.pipe()
            _enlarge_pipe(write_fd)
            thread = threading.Thread(target=self._pump, args=(os.fdopen(read_fd, "rb"),), name="native-stderr",
                                      daemon=True)
            thread.start()
            sys.stderr.flush()
            os.dup2(write_fd, 2)
            os.close(write_fd)
            self._thread = thread
        if faulthandler.is_enabled():  # a crash's traceback must not wait in a pipe whose reader dies with it
            faulthandler.enable(file=original)
        logging.getLogger(__name__).debug("what OpenCV, FFmpeg and ONNX Runtime print on stderr is logged as %r",
                                          NATIVE_LOGGER)

    def release(self) -> None:
        """Give fd 2 back its original file and let the thread log what is still in the pipe."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None or self._original is None:
                return
            sys.stderr.flush()
            os.dup2(self._original.fileno(), 2)  # closes the pipe's write end: the reader reaches its end
        thread.join(DRAIN_TIMEOUT_S)

    def _pump(self, pipe: BinaryIO) -> None:
        logger = logging.getLogger(NATIVE_LOGGER)
        with pipe:
            for raw in pipe:
                line = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip()
                if not line:
                    continue
                if _OWN_LINE.match(line):  # a camera group process's own log line (it shares this fd 2): as it is
                    with contextlib.suppress(OSError):
                        self.original_stream().write(line + "\n")
                    continue
                try:
                    logger.log(_native_level(line), "%s", line)
                except Exception:  # this thread must live on, or fd 2 fills up and blocks every writer
                    with contextlib.suppress(OSError):
                        self.original_stream().write(line + "\n")


def _enlarge_pipe(fd: int) -> None:
    """Best effort: a bigger pipe, so a native burst while the reader waits for the GIL does not block the writer."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:
        pass  # over /proc/sys/fs/pipe-max-size: the default size still works


def _tune_native_levels(level: str) -> None:
    """OpenCV and ONNX Runtime print no more than the daemon logs (see the module docstring for FFmpeg)."""
    if _OPERATOR_OPENCV_LEVEL is None:
        threshold = _OPENCV_THRESHOLD.get(level, "WARNING")
        cv2 = sys.modules.get("cv2")
        cv2_logging = getattr(getattr(cv2, "utils", None), "logging", None)
        if cv2 is None:
            os.environ["OPENCV_LOG_LEVEL"] = threshold  # read when cv2 is first imported
        elif cv2_logging is not None:
            cv2_logging.setLogLevel(getattr(cv2_logging, f"LOG_LEVEL_{threshold}"))
    set_severity = getattr(sys.modules.get("onnxruntime"), "set_default_logger_severity", None)
    if callable(set_severity):
        set_severity(_ORT_SEVERITY.get(level, 2))


class RecentLogs(logging.Handler):
    """The newest WARNING-and-up lines, masked, for the status page (a deque: appends need no lock of ours)."""

    def __init__(self, size: int = 200) -> None:
        super().__init__(logging.WARNING)
        self._lines: deque[dict[str, object]] = deque(maxlen=size)
        self.addFilter(_MaskingFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self._lines.append({"ts": round(record.created, 3), "level": record.levelname.lower(),
                            "logger": record.name, "message": mask_secrets(record.getMessage())})

    def recent(self, limit: int = 100) -> list[dict[str, object]]:
        """Newest first."""
        return list(reversed(list(self._lines)))[:limit]


_NATIVE = NativeStderr()
RECENT_LOGS = RecentLogs()


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """(Re)configure the root logger; safe to call again once the config is known, and on every reload."""
    level = level.lower()
    json_lines = fmt == "json"
    capture = json_lines or level != "debug"
    if not capture:
        _NATIVE.release()  # before the handler moves back to fd 2, which must then be the original stderr again
    handler = _StderrHandler(_NATIVE.original_stream() if capture else sys.stderr)
    handler.addFilter(_MaskingFilter())
    if json_lines:
        handler.setFormatter(_JsonFormatter())
    else:
        formatter = _MaskedTextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler, RECENT_LOGS]
    root.setLevel(level.upper())
    _tune_native_levels(level)
    if capture:
        _NATIVE.capture()  # after the handler writes to the original stderr: its lines must not come back here
    # In text mode Python's own writes (a command's `print(..., file=sys.stderr)`, a progress bar) go straight to the
    # original stderr, terminal and all: only what native code writes to fd 2 is captured. In JSON they take the
    # pipe too, so that every line is JSON.
    sys.stderr = _NATIVE.original_stream() if capture and not json_lines else sys.__stderr__
