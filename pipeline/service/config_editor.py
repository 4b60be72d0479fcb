"""The configuration file as the status page edits it: read, check, save atomically, then reload (issue 26).

Why here and not in the server: the server only moves text and JSON; what a save means (the same loader as
`check-config` and SIGHUP, nothing written when anything is wrong, the previous file kept, the reload's outcome
waited for) belongs to the daemon's side. The daemon hands the server a ConfigEditor; the server never sees the
daemon.

A save is: check the new text with `parse_config` under the file's own name (so every error reads
`FILE:LINE: key: message`, as check-config prints it) → write it beside the file, flushed to disk → copy the current
file to `FILE.bak` (the same way: written then renamed) → rename the new text over the file (atomic: a reader or a
crash sees the old file or the new one, never neither) → ask the daemon to reload, and wait for its outcome.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from pipeline.config.app import parse_config
from pipeline.config.loader import ConfigError, ConfigIssue

RELOAD_WAIT_S = 120.0  # a reload that loads models on a GPU takes tens of seconds; the page says "pending" after this
MAX_CONFIG_BYTES = 1_000_000  # a configuration file is a few KB; anything this large is a mistake


@dataclass(frozen=True)
class SaveResult:
    """What a save did: HTTP status and the JSON body the server sends."""

    status: int
    body: dict[str, Any]


def issue_json(issue: ConfigIssue) -> dict[str, Any]:
    """One problem as the page shows it: its line (to jump to), key, message and the line check-config prints."""
    return {"line": issue.line, "key": issue.key, "message": issue.message, "text": issue.format()}


def write_atomically(path: Path, text: str) -> None:
    """`text` becomes `path`'s content in one rename, after it reached the disk; the file keeps its mode."""
    temporary = path.with_name(f".{path.name}.saving")
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):  # no half-written temporary left beside the file
            temporary.unlink()
        raise
    _sync_directory(path.parent)


def _sync_directory(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX: the directory entry is written with the directory)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _round_trip_yaml() -> YAML:
    """ruamel.yaml in round-trip mode: comments, order, quotes and this project's layout kept, `null` written out."""
    handler = YAML()
    handler.preserve_quotes = True
    handler.width = 4096  # never fold a long line
    handler.indent(mapping=2, sequence=4, offset=2)
    handler.representer.add_representer(
        type(None), lambda representer, _: representer.represent_scalar("tag:yaml.org,2002:null", "null"))
    return handler


def with_camera_enabled(text: str, camera: str, enabled: bool) -> str:
    """`text` with `enabled:` of the camera named `camera` set, everything else (comments included) as it was.
    KeyError when no camera has that name."""
    handler = _round_trip_yaml()
    data = handler.load(text)
    cameras = data.get("cameras") if hasattr(data, "get") else None
    for entry in cameras or []:
        if hasattr(entry, "get") and entry.get("name") == camera:
            entry["enabled"] = enabled
            break
    else:
        raise KeyError(camera)
    out = io.StringIO()
    handler.dump(data, out)
    return out.getvalue()


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


class ConfigEditor:
    """Read, check and save one configuration file; `reload` asks the daemon to reload and returns a future of its
    outcome (the daemon's `last_reload` dict). `writable` says whether saving is allowed now
    (server.config_editor)."""

    def __init__(self, path: Path, reload: Callable[[str], Future[dict[str, Any]]],
                 writable: Callable[[], bool]) -> None:
        self.path = path
        self._reload = reload
        self._writable = writable
        self._lock = threading.Lock()  # one save at a time: two pages saving at once each get a whole outcome

    @property
    def writable(self) -> bool:
        return self.read_only_reason() is None

    def read_only_reason(self) -> str | None:
        """Why the page cannot save here, or None: the setting, or the file system (a save writes FILE.bak and a
        temporary file beside FILE, then renames: the folder must be writable to the daemon's user)."""
        if not self._writable():
            return "server.config_editor is false"
        folder = self.path.parent
        if not os.access(folder, os.W_OK) or (self.path.exists() and not os.access(self.path, os.W_OK)):
            return (f"the daemon's user cannot write {self.path} and its folder {folder}: give it write access "
                    f"(docs/operations.md, 'Editing the configuration from the page') or edit the file by hand")
        return None

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8")

    def check(self, text: str) -> list[ConfigIssue]:
        """Every problem of `text` as the file's own (empty when it would load)."""
        if len(text.encode("utf-8")) > MAX_CONFIG_BYTES:
            return [ConfigIssue(str(self.path), None, "", f"the text is over {MAX_CONFIG_BYTES} bytes: not a "
                                                         f"configuration file")]
        try:
            parse_config(text, str(self.path), os.environ)
        except ConfigError as exc:
            return exc.issues
        return []

    def set_camera_enabled(self, camera: str, enabled: bool) -> SaveResult:
        """The page's camera switch: the file with that camera's `enabled:` changed, saved like any edit."""
        try:
            text = with_camera_enabled(self.read(), camera, enabled)
        except KeyError:
            return SaveResult(404, {"error": f"no camera named {camera!r} in {self.path}"})
        except YAMLError as exc:  # the file on disk no longer parses: the editor shows why
            return SaveResult(422, {"result": "invalid", "errors": [
                {"line": None, "key": "", "message": str(exc), "text": f"{self.path}: cannot edit it: {exc}"}]})
        return self.save(text)

    def save(self, text: str, wait_s: float = RELOAD_WAIT_S) -> SaveResult:
        """Check, write (the old file kept as FILE.bak), reload and report; 422 with every problem and nothing
        written when the text would not load, 403 when saving is off."""
        reason = self.read_only_reason()
        if reason is not None:
            return SaveResult(403, {"error": f"the configuration editor is read-only here: {reason}"})
        with self._lock:
            issues = self.check(text)
            if issues:
                return SaveResult(422, {"result": "invalid", "errors": [issue_json(i) for i in issues]})
            try:
                if self.path.exists():
                    write_atomically(backup_path(self.path), self.read())
                write_atomically(self.path, text)
            except OSError as exc:  # the old file is still whole: each write is a rename of a finished file
                return SaveResult(500, {"error": f"cannot write {self.path}: {exc.strerror or exc}; the file on "
                                                 f"disk is unchanged"})
            outcome = self._reload("page")
        try:
            return SaveResult(200, {"saved": True, "backup": str(backup_path(self.path)),
                                    "reload": outcome.result(timeout=wait_s)})
        except FutureTimeout:
            return SaveResult(202, {"saved": True, "backup": str(backup_path(self.path)),
                                    "reload": {"result": "pending", "trigger": "page"}})
