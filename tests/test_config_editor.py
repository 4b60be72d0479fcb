"""The configuration from the status page's API (issue 26 item 1): GET/PUT /api/config and POST /api/config/check on a
real daemon (real models on the CPU, a real video camera, the real server with a token), SIGHUP reloads shown in
/api/status's config.last_reload, the read-only mode, and the file written atomically (a writer killed at random
moments leaves the old file or the new one, never neither)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.running_daemon import RunningDaemon, clip, free_port, wait_until, write_config

TOKEN = "edit-t0ken"


def _call(port: int, method: str, path: str, body: str | None = None) -> tuple[int, Any, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=body.encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=150) as response:
            status, raw, headers = response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        status, raw, headers = exc.code, exc.read().decode(), dict(exc.headers)
    parsed = json.loads(raw) if headers.get("Content-Type", "").startswith("application/json") else raw
    return status, parsed, headers


def _last_reload(port: int) -> dict[str, Any] | None:
    return _call(port, "GET", "/api/status")[1]["config"]["last_reload"]


@pytest.mark.slow
def test_config_is_read_checked_saved_and_applied_from_the_api(prepared_models: None, tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: '{clip()}', fps: 5, loop: true}}"],
                          port=port, server=f"token: {TOKEN}")
    original = config.read_text()
    daemon = RunningDaemon(config)
    try:
        daemon.wait_for(lambda: _ready(port), 60, "the status server")
        status, text, headers = _call(port, "GET", "/api/config")
        assert status == 200 and text == original and headers["X-Config-Writable"] == "true"
        with pytest.raises(urllib.error.HTTPError) as refused:  # every route but /healthz needs the token
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/config", timeout=10)
        assert refused.value.code == 401

        # a mistake: 422 with each error at its line, as check-config says it; nothing written
        broken = original.replace("fps: 5", "fps: -5").replace("cameras:", "camera_list: 1\ncameras:")
        status, body, _ = _call(port, "PUT", "/api/config", broken)
        assert status == 422, body
        lines = {error["line"] for error in body["errors"]}
        assert {1, 3} <= lines, body  # camera_list on line 1, the camera (fps) on line 3
        assert all(error["text"].startswith(f"{config}:") for error in body["errors"])
        assert config.read_text() == original and not (tmp_path / "config.yaml.bak").exists()
        assert _call(port, "POST", "/api/config/check", broken)[0] == 422
        assert _call(port, "POST", "/api/config/check", original)[:2] == (200, {"errors": []})

        # a good edit: written, the old file kept, applied, and the outcome in /api/status
        edited = original.replace("fps: 5", "fps: 6")
        status, body, _ = _call(port, "PUT", "/api/config", edited)
        assert status == 200 and body["reload"]["result"] == "applied", body
        assert body["reload"]["trigger"] == "page" and any("lobby" in c for c in body["reload"]["changes"])
        assert config.read_text() == edited and (tmp_path / "config.yaml.bak").read_text() == original
        assert _last_reload(port)["result"] == "applied"

        # a bad file by hand, then SIGHUP: rejected, every error kept for the page
        config.write_text(edited + "behavior: {dwell_ms: fast}\n")
        daemon.signal(signal.SIGHUP)
        assert wait_until(lambda: (_last_reload(port) or {}).get("result") == "rejected", 30), _last_reload(port)
        last = _last_reload(port)
        assert last["trigger"] == "signal" and any("dwell_ms" in e and ":" in e for e in last["errors"]), last

        # the history keeps the reloads and the camera's changes; the log view the rejection's ERROR lines
        reloads = _call(port, "GET", "/api/history?types=config")[1]["events"]
        assert [e["status"] for e in reloads[:2]] == ["rejected", "applied"], reloads
        cameras = _call(port, "GET", "/api/history?types=camera&q=lobby")[1]["events"]
        assert cameras and all(e["type"] == "camera" and e["camera"] == "lobby" for e in cameras)
        assert _call(port, "GET", "/api/history?types=camera&q=nobody")[1]["events"] == []
        lines = _call(port, "GET", "/api/logs")[1]["lines"]
        assert any(line["level"] == "error" and "rejected" in line["message"] for line in lines), lines

        # "send test expression": the rule's command for that emotion, marked as a test, then neutral again
        status, body, _ = _call(port, "POST", "/api/streams/lobby/test", json.dumps({"expression": "surprise"}))
        assert status == 200 and body["sent"]["reason"] == "test", body
        assert wait_until(lambda: any(e["reason"] == "test" and e["emotion"] == "surprise"
                                      for e in daemon.of("command")), 10)
        lobby = next(a for a in _call(port, "GET", "/api/status")[1]["avatars"] if a["name"] == "lobby")
        assert lobby["kind"] == "camera" and lobby["current"] is not None
        assert wait_until(lambda: any(e["reason"] == "test" and e["emotion"] == "neutral"
                                      for e in daemon.of("command")), 15)
        assert _call(port, "POST", "/api/streams/nobody/test", json.dumps({"expression": "happy"}))[0] == 404
        assert _call(port, "POST", "/api/streams/lobby/test", "{}")[0] == 400

        # read-only mode, applied through the editor itself
        status, body, _ = _call(port, "PUT", "/api/config", edited.replace(f"token: {TOKEN}",
                                                                           f"token: {TOKEN}, config_editor: false"))
        assert status == 200 and body["reload"]["result"] == "applied", body
        status, body, _ = _call(port, "PUT", "/api/config", edited)
        assert status == 403 and "read-only" in body["error"]
        assert _call(port, "GET", "/api/config")[2]["X-Config-Writable"] == "false"
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        daemon.kill()


def _ready(port: int) -> bool:
    try:
        return _call(port, "GET", "/api/status")[0] == 200
    except OSError:
        return False


WRITER = """
import sys
from pathlib import Path
from pipeline.service.config_editor import write_atomically
path, texts = Path(sys.argv[1]), [Path(sys.argv[2]).read_text(), Path(sys.argv[3]).read_text()]
print("ready", flush=True)
index = 0
while True:
    write_atomically(path, texts[index % 2])
    index += 1
"""


def test_a_save_killed_at_any_moment_leaves_the_old_or_the_new_file(tmp_path: Path) -> None:
    """write_atomically under SIGKILL at random moments: the file always reads whole, as one text or the other."""
    import random
    import time

    old, new = "cameras: []\n" + "# old\n" * 40_000, "cameras: []\n" + "# new\n" * 60_000  # wide write windows
    (tmp_path / "a").write_text(old)
    (tmp_path / "b").write_text(new)
    target = tmp_path / "config.yaml"
    target.write_text(old)
    for _ in range(12):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(tmp_path / "a"), str(tmp_path / "b")],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        time.sleep(random.uniform(0.0, 0.05))
        writer.kill()
        writer.wait(10)
        assert target.read_text() in (old, new)


def _editor(path: Path, writable: bool = True) -> Any:
    from concurrent.futures import Future

    from pipeline.service.config_editor import ConfigEditor

    def reload(trigger: str) -> Future[dict[str, Any]]:
        done: Future[dict[str, Any]] = Future()
        done.set_result({"result": "applied", "trigger": trigger})
        return done
    return ConfigEditor(path, reload, lambda: writable)


def test_a_save_that_cannot_write_answers_500_and_changes_nothing(tmp_path: Path) -> None:
    """A write that fails (here: the temporary file's name taken by a folder; under systemd a read-only folder)
    leaves the file whole and says so."""
    path = tmp_path / "config.yaml"
    old = "cameras: [{name: a, source: demo}]\nserver: {enabled: false}\n"
    path.write_text(old)
    (tmp_path / ".config.yaml.saving").mkdir()
    result = _editor(path).save(old.replace("name: a", "name: b"))
    assert result.status == 500 and "unchanged" in result.body["error"], result
    assert path.read_text() == old


def test_the_editor_says_why_it_is_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """server.config_editor: false, or a folder the daemon's user may not write (faked: the tests run as root, for
    whom every folder is writable): a save answers 403 with the reason, nothing written."""
    import os

    path = tmp_path / "config.yaml"
    old = "cameras: [{name: a, source: demo}]\nserver: {enabled: false}\n"
    path.write_text(old)
    assert _editor(path).read_only_reason() is None
    assert "config_editor is false" in (_editor(path, writable=False).read_only_reason() or "")
    monkeypatch.setattr(os, "access", lambda target, mode: Path(target) != tmp_path)
    result = _editor(path).save(old)
    assert result.status == 403 and "cannot write" in result.body["error"] and "operations.md" in result.body["error"]
    assert path.read_text() == old and not (tmp_path / "config.yaml.bak").exists()
