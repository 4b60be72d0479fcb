"""First contact (issue 12, items 10 and 15b/c): the daemon says when its events go nowhere under systemd, every
field of every event is in the README, and a browser without the token gets a page that asks for it.

The daemon runs as `run_pipeline.py run` (tests/running_daemon.py) on a real clip: once as systemd would start it
(INVOCATION_ID and JOURNAL_STREAM in its environment, stdout a pipe), once with a token behind a real HTTP server.
The token page is driven in a real headless Chromium, as in tests/test_status_page.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.types import EMOTIONS
from tests.conftest import ROOT
from tests.running_daemon import (
    RunningDaemon,
    clip,
    free_port,
    wait_until,
    write_config,
)

SYSTEMD_ENV = {"INVOCATION_ID": "5f0c1d2e3b4a49e8a7d6c5b4a3f2e1d0", "JOURNAL_STREAM": "8:4242"}
TOKEN = "t0ken/with+odd=chars"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


# ---------------------------------------------------------------- item 10: stdout-only under systemd


@pytest.fixture(scope="module")
def under_systemd(prepared_models: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """The daemon with only the stdout output, started as systemd starts a unit, run until it has sent every event
    type: observations and commands, camera states, and a config event applied and one rejected after SIGHUPs."""
    config = tmp_path_factory.mktemp("systemd") / "config.yaml"
    lobby, door = (f"{{name: {name}, source: '{clip()}', fps: 8, loop: true}}" for name in ("lobby", "door"))
    write_config(config, [lobby])
    daemon = RunningDaemon(config, env=SYSTEMD_ENV)
    try:
        daemon.wait_for(lambda: daemon.of("command"), 120, "a command for the clip's face")
        write_config(config, [lobby, door])
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: [e for e in daemon.of("config") if e["status"] == "applied"], 30, "reload applied")
        config.write_text(config.read_text().replace("fps: 8", "fps: 0", 1))
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: [e for e in daemon.of("config") if e["status"] == "rejected"], 30, "reload rejected")
        code, _ = daemon.terminate()
        assert code == 0, daemon.stderr_text()[-2000:]
        yield daemon
    finally:
        daemon.kill()


def test_stdout_only_under_systemd_warns_once_at_start(under_systemd: RunningDaemon) -> None:
    warnings = [line for line in under_systemd.stderr if "WARNING" in line and "only output is stdout" in line]
    assert len(warnings) == 1, under_systemd.stderr_text()[-3000:]
    line = warnings[0]
    assert "INVOCATION_ID" in line and "websocket, osc or webhook" in line and str(under_systemd.config) in line
    running = next(i for i, text in enumerate(under_systemd.stderr) if "running:" in text)
    assert under_systemd.stderr.index(line) < running, "the warning comes with the start, not later"


def _systemd_config(tmp_path: Path, outputs: str) -> Any:
    from pipeline.config.app import load_config

    return load_config(write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: '{clip()}'}}"],
                                    outputs=outputs))


@pytest.mark.parametrize("variable", ["INVOCATION_ID", "NOTIFY_SOCKET", "JOURNAL_STREAM"])
def test_each_systemd_variable_counts_and_others_do_not(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                        variable: str) -> None:
    """Any one of systemd's variables, with stdout a pipe, warns; none of them, or a terminal, or another output
    besides stdout, does not. The streams are real: a pipe and a pseudo-terminal."""
    from pipeline.service.parts import warn_if_events_unseen

    stdout_only = _systemd_config(tmp_path, "[{type: stdout}]")
    with_osc = _systemd_config(tmp_path, "[{type: stdout}, {type: osc, host: 127.0.0.1, port: 39539}]")
    read_end, write_end = os.pipe()
    master, slave = os.openpty()
    with os.fdopen(write_end, "w") as pipe, os.fdopen(slave, "w") as terminal:
        assert warn_if_events_unseen(stdout_only, tmp_path / "config.yaml", {variable: "x"}, pipe)
        assert not warn_if_events_unseen(stdout_only, None, {variable: ""}, pipe)
        assert not warn_if_events_unseen(stdout_only, None, {"HOME": "/root"}, pipe)
        assert not warn_if_events_unseen(stdout_only, None, {variable: "x"}, terminal)
        assert not warn_if_events_unseen(with_osc, None, {variable: "x"}, pipe)
    os.close(read_end)
    os.close(master)
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "only output is stdout" in r.getMessage()]
    assert len(warned) == 1 and variable in warned[0].getMessage()
    assert f"outputs: in {tmp_path / 'config.yaml'}" in warned[0].getMessage()


# ---------------------------------------------------------------- item 15c: every event field in the README


def _documented_fields() -> dict[str, set[str]]:
    """event type (or `all`) -> field paths, read from the README Events section's field table: a backticked name
    is a field; backticked names in parentheses after it are its sub-fields."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Events\n", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, set[str]] = defaultdict(set)
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        event, field = cells[0], cells[1]
        documented[event].update(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", field)))
        for base, inner in re.findall(r"`([^`]+)`\s*\(([^)]*)\)", field):
            documented[event].update(f"{base}.{sub}" for sub in re.findall(r"`([^`]+)`", inner))
    return documented


def _field_paths(value: object, prefix: str = "") -> set[str]:
    """Every field path of an event: `a.b` for objects, `a[].b` for lists of objects; the keys of an object keyed
    by emotion (`probs`) are data, not fields."""
    paths: set[str] = set()
    if isinstance(value, dict) and not (value and set(value) <= set(EMOTIONS)):
        for key, inner in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths |= {path} | _field_paths(inner, path)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                paths |= _field_paths(item, prefix + "[]")
    return paths


def test_every_field_of_every_event_is_in_the_readme(under_systemd: RunningDaemon) -> None:
    documented = _documented_fields()
    events = under_systemd.events
    seen = {(e["type"], e.get("status")) for e in events}
    assert {("observation", None), ("command", None), ("camera", None), ("config", "applied"),
            ("config", "rejected")} <= seen, seen
    assert any(e["faces"] for e in under_systemd.of("observation"))
    missing = {}
    for event in events:
        undocumented = _field_paths(event) - documented[event["type"]] - documented["all"]
        if undocumented:
            missing[event["type"]] = sorted(undocumented | set(missing.get(event["type"], [])))
    assert not missing, f"fields the README's Events table does not list: {missing}"


# ---------------------------------------------------------------- item 15b: the token page


@pytest.fixture(scope="module")
def with_token(prepared_models: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A daemon with `server.token` and one looping clip; yields its base URL once it serves frames."""
    port = free_port()
    config = write_config(tmp_path_factory.mktemp("token") / "config.yaml",
                          [f"{{name: lobby, source: '{clip()}', fps: 8, loop: true}}"], port=port,
                          server=f"token: '{TOKEN}', preview_fps: 4", outputs="[{type: websocket}]")
    daemon = RunningDaemon(config)
    base = f"http://127.0.0.1:{port}"
    try:
        daemon.wait_for(lambda: _get(base + "/healthz")[0] == 200, 90, "/healthz 200 with the camera streaming")
        yield base
        code, _ = daemon.terminate()
        assert code == 0 and "Traceback" not in daemon.stderr_text()
    finally:
        daemon.kill()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(status, content type, body) of a GET; 0 when nothing answers."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()
    except OSError:
        return 0, "", ""


def test_browser_without_token_gets_the_token_page_and_api_clients_json(with_token: str) -> None:
    browser_accept = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
    status, kind, body = _get(with_token + "/", browser_accept)
    assert status == 401 and kind.startswith("text/html"), (status, kind)
    assert 'id="login"' in body and "sessionStorage" in body and TOKEN not in body
    for path, headers in (("/", {}), ("/", {"Accept": "application/json"}), ("/api/status", browser_accept),
                          ("/static/app.js", browser_accept)):
        status, kind, body = _get(with_token + path, headers)
        assert status == 401 and "json" in kind and "unauthorized" in json.loads(body)["error"], (path, headers)
    status, kind, page = _get(with_token + "/", {**browser_accept, "Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and kind.startswith("text/html")
    assert 'src="static/app.js' not in page and "sessionStorage" in page and "emotion-pipeline.token." in page


def test_preview_socket_takes_the_token_as_a_subprotocol(with_token: str) -> None:
    """Browsers cannot put a header on a WebSocket: the page offers the token as a subprotocol instead."""
    import aiohttp

    encoded = base64.urlsafe_b64encode(TOKEN.encode()).decode().rstrip("=")
    url = with_token.replace("http", "ws") + "/preview/ws"

    async def first_frame(token_protocol: str) -> tuple[str | None, bytes]:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url, protocols=("emotion-pipeline.preview", token_protocol)) as ws:
                message = await ws.receive(timeout=30)
                return ws.protocol, message.data

    protocol, data = asyncio.run(first_frame(f"emotion-pipeline.token.{encoded}"))
    assert protocol == "emotion-pipeline.preview" and data.startswith(b"lobby\n\xff\xd8"), data[:16]
    wrong = base64.urlsafe_b64encode(b"wrong").decode().rstrip("=")
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        asyncio.run(first_frame(f"emotion-pipeline.token.{wrong}"))
    assert caught.value.status == 401


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements-dev.txt)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1100,820"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.slow
def test_token_page_in_a_browser_opens_the_status_page(with_token: str, browser: Any) -> None:
    """Open / without the token, as an operator does: the page asks; a wrong token is refused on the page; the
    right one opens the live status page (tiles, previews over the WebSocket), which keeps the token out of every URL
    and in the tab's sessionStorage, so a reload opens it again without asking."""
    from selenium.webdriver.common.by import By

    def tiles() -> list[Any]:
        return browser.find_elements(By.CSS_SELECTOR, "#tiles .tile")  # type: ignore[no-any-return]

    def preview_shown() -> bool:
        images = browser.find_elements(By.CSS_SELECTOR, '.tile[data-camera="lobby"] img.preview')
        return bool(images) and (images[0].get_attribute("src") or "").startswith("blob:")

    def enter(token: str) -> None:
        field = browser.find_element(By.ID, "token")
        field.clear()
        field.send_keys(token)
        browser.find_element(By.ID, "open").click()

    browser.get(with_token + "/")
    assert wait_until(lambda: browser.find_elements(By.ID, "token"), 10), browser.page_source[:1000]
    enter("not-the-token")
    assert wait_until(lambda: "wrong token" in browser.find_element(By.ID, "login-error").text, 10)
    enter(TOKEN)
    assert wait_until(lambda: len(tiles()) == 1, 20), browser.page_source[:2000]
    assert wait_until(preview_shown, 20), "no preview arrived over /preview/ws"
    assert browser.execute_script("return sessionStorage.getItem('emotion-pipeline.token')") == TOKEN
    assert "token" not in browser.current_url
    browser.refresh()
    assert wait_until(lambda: len(tiles()) == 1, 20), "a reload did not open the page with the stored token"
    overall = browser.find_element(By.ID, "overall")
    assert wait_until(lambda: overall.text not in ("", "connecting…", "unreachable"), 10), overall.text
    browser.get(with_token + "/?token=" + urllib.request.quote(TOKEN, safe=""))  # an old link still opens it ...
    assert wait_until(lambda: len(tiles()) == 1, 20)
    assert wait_until(lambda: "token" not in browser.current_url, 10), browser.current_url  # ... and is cleaned


def test_a_terminal_shows_each_camera_change_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: with stdout and the log on one terminal every camera change printed twice (the stdout text line and
    the log line). Real pseudo-terminals: one shared, then two different ones."""
    import sys

    from pipeline.outputs.stdout import StdoutOutput, StdoutSink

    master, slave = os.openpty()
    other_master, other_slave = os.openpty()
    with os.fdopen(slave, "w") as terminal, os.fdopen(os.dup(slave), "w") as same, \
            os.fdopen(other_slave, "w") as other:
        monkeypatch.setattr(sys, "stderr", same)
        assert "camera" not in StdoutSink(StdoutOutput(), stream=terminal).events
        assert "camera" in StdoutSink(StdoutOutput(format="text"), stream=terminal).events  # asked for: kept
        monkeypatch.setattr(sys, "stderr", other)
        assert "camera" in StdoutSink(StdoutOutput(), stream=terminal).events
    for fd in (master, other_master):
        os.close(fd)


def test_version() -> None:
    from pipeline import __version__

    from tests.conftest import run_cli

    done = run_cli("--version", timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"emotion-pipeline {__version__}"
