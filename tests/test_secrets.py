"""Secrets in camera and webhook URLs never reach an operator's screen, and passwords as camera UIs make them work.

Issue 12, items 1-3 and 19: a password in an HTTP camera's query string (`?user=admin&pwd=…`), a webhook's
`?api_key=…`, a password containing `/ @ # :` (which broke the URL for FFmpeg and the masking), and a camera URL that
lost its `rtsp://` (taken for a file path). The fast tests call the masking and the config checks; the slow ones run
`check-config` and the daemon as an operator would, against a real RTSP server that requires the password and a real
HTTP MJPEG server, and read stdout, stderr, `/api/status`, `/ws`, `/metrics` and the status page.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import numpy as np
import pytest

import pipeline.core.redact as redact
from pipeline.capture.sources import open_source
from pipeline.config.app import CameraConfig, parse_config, summarize
from pipeline.config.loader import ConfigError
from pipeline.core.redact import mask_secrets
from tests.conftest import run_cli
from tests.running_daemon import (
    RunningDaemon,
    clip,
    free_port,
    wait_until,
    write_config,
)
from tests.servers.fixtures import RtspProcess, rtsp_unavailable_reason
from tests.servers.mjpeg_server import MjpegServer

# Passwords as an operator pastes them from a camera UI.
RTSP_PASSWORD = "p@ss/w:rd#1"
WRONG_PASSWORD = "wr0ng/p@ss:x"
HTTP_PASSWORD = "ht/tp@pw#2"
QUERY_PASSWORD = "Qu3ry-pw"
SECRETS = (RTSP_PASSWORD, WRONG_PASSWORD, HTTP_PASSWORD, QUERY_PASSWORD)


def leaked(text: str, secrets: tuple[str, ...] = SECRETS) -> list[str]:
    """The pieces of `secrets` found in `text`: each whole, percent-encoded, and cut at any of `/ @ # :`.

    A cut piece counts because a masking that stops at the wrong character shows the rest (`***@ss/w:rd#1@host`)."""
    found = []
    for secret in secrets:
        pieces = {secret, quote(secret, safe="")}
        for cut in (m.start() for m in re.finditer(r"[/@#:]", secret)):
            pieces |= {secret[:cut], secret[cut + 1:]}
        found += [piece for piece in pieces if len(piece) >= 4 and piece in text]
    return found


# ------------------------------------------------------------------------------------------------ masking


def test_every_secret_of_two_urls_in_one_text_is_masked() -> None:
    text = (f"cannot connect to rtsp://admin:{RTSP_PASSWORD}@10.0.0.5:554/Streaming/Channels/101 (host down); "
            f"fallback http://viewer:{HTTP_PASSWORD}@cam.local:8080/video.cgi?user=admin&pwd={QUERY_PASSWORD}"
            "&API_KEY=k3y-of-the-hook&channel=1 failed too")
    masked = mask_secrets(text)
    assert masked == ("cannot connect to rtsp://admin:***@10.0.0.5:554/Streaming/Channels/101 (host down); "
                      "fallback http://viewer:***@cam.local:8080/video.cgi?user=admin&pwd=***&API_KEY=***"
                      "&channel=1 failed too")
    assert leaked(masked, (*SECRETS, "k3y-of-the-hook")) == []
    assert mask_secrets(masked) == masked  # masking a masked text changes nothing (logs mask what events masked)


def test_password_with_url_delimiters_is_masked_whole() -> None:
    for password in ("p@ss/w:rd#1", "a/b", "x#y/z", "c:d@e", "@@/", "pa?ss/1", "100%/", "p%40ss/x"):
        url = f"rtsp://admin:{password}@10.0.0.5:554/Streaming/Channels/101"
        assert mask_secrets(url) == "rtsp://admin:***@10.0.0.5:554/Streaming/Channels/101", password
        assert mask_secrets(f"('{url}', 3)") == "('rtsp://admin:***@10.0.0.5:554/Streaming/Channels/101', 3)"


def test_secret_query_parameters_are_masked_whatever_their_case() -> None:
    names = ("pwd", "PWD", "password", "Pass", "passwd", "key", "api_key", "apikey", "X-Api-Key", "token",
             "access_token", "secret", "client_secret", "auth", "signature", "sig", "Sig", "loginpass")
    for name in names:
        url = f"http://cam/snapshot.cgi?user=admin&{name}=s3cr3t-value&channel=2"
        assert mask_secrets(url) == f"http://cam/snapshot.cgi?user=admin&{name}=***&channel=2", name
    # some DVRs take the login as `name=value&…` in the path, with no '?'
    dvr = "rtsp://10.0.0.9:554/user=admin&password=s3cr3t-value&channel=1&stream=0.sdp"
    assert mask_secrets(dvr) == "rtsp://10.0.0.9:554/user=admin&password=***&channel=1&stream=0.sdp"


def test_url_for_opening_percent_encodes_user_and_password() -> None:
    opened = redact.url_for_opening(f"rtsp://admin:{RTSP_PASSWORD}@10.0.0.5:554/Streaming/Channels/101?tcp")
    assert opened == "rtsp://admin:p%40ss%2Fw%3Ard%231@10.0.0.5:554/Streaming/Channels/101?tcp"
    # already-encoded escapes are left alone, a lone '%' and a space are encoded, the scheme is lower-cased
    assert redact.url_for_opening("RTSP://me%40x.com:p%2Fw 100%@h/x") == "rtsp://me%40x.com:p%2Fw%20100%25@h/x"
    assert redact.url_for_opening("http://cam/video.cgi?user=a&pwd=b") == "http://cam/video.cgi?user=a&pwd=b"
    parts = redact.split_userinfo(f"http://me@x.com:{HTTP_PASSWORD}@cam:8080/v?mail=a@b.com")
    assert parts == ("http://", "me@x.com", HTTP_PASSWORD, "cam:8080/v?mail=a@b.com")


# ------------------------------------------------------------------------------------------------ config


def issues(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "cfg.yaml", env={})
    return [issue.format() for issue in caught.value.issues]


def test_url_with_delimiters_in_its_password_is_valid_with_its_real_host() -> None:
    config = parse_config(f"cameras:\n  - {{name: lobby, source: 'rtsp://admin:{RTSP_PASSWORD}@10.0.0.5/x'}}\n"
                          f"  - {{name: door, source: 'HTTP://u:{HTTP_PASSWORD}@[fd00::5]:8080/v.mjpg'}}\n", env={})
    assert [c.source_kind for c in config.cameras] == ["rtsp", "http"]
    summary = summarize(config)
    assert "lobby: rtsp://admin:***@10.0.0.5/x (rtsp)" in summary
    assert "door: HTTP://u:***@[fd00::5]:8080/v.mjpg (http)" in summary
    # the host is what follows the password's last '@', not its first: here there is none
    assert issues(f"cameras:\n  - {{name: gone, source: 'rtsp://admin:{RTSP_PASSWORD}@/x'}}\n") == [
        "cfg.yaml:2: cameras[0].source: URL has no host (expected e.g. rtsp://user:pass@10.0.0.5/stream1) "
        "(got 'rtsp://admin:***@/x')"]


def test_open_source_reads_an_http_camera_with_secrets_in_userinfo_and_query() -> None:
    with MjpegServer(clip(), max_frames=10) as server:
        path = server.url.removeprefix("http://")
        cfg = CameraConfig(name="cheap", decode="cpu",
                           source=f"HTTP://admin:{HTTP_PASSWORD}@{path}?user=admin&pwd={QUERY_PASSWORD}")
        source = open_source(cfg)
        try:
            assert source.grab(5)
            image = source.retrieve()
            assert isinstance(image, np.ndarray) and image.ndim == 3
            assert source.describe().startswith(f"HTTP://admin:***@{path}?user=admin&pwd=*** ")
        finally:
            source.close()


def test_url_without_scheme_is_refused_with_the_password_masked() -> None:
    text = ("cameras:\n"
            "  - name: lobby\n"
            "    source: admin:Secret-1@10.0.0.5:554/Streaming/Channels/101\n"
            "  - name: door\n"
            "    source: 10.0.0.6:554/stream1?pwd=Secret-2\n"
            "  - {name: file, source: ./admin:Secret@clip.mp4}\n")
    found = issues(text)
    hint = ("looks like a camera URL without its scheme: write rtsp:// (or http:// for an HTTP camera) in front "
            "of it; a video file named like this: start it with ./")
    assert found == [f"cfg.yaml:3: cameras[0].source: {hint} (got 'admin:***@10.0.0.5:554/Streaming/Channels/101')",
                     f"cfg.yaml:5: cameras[1].source: {hint} (got '10.0.0.6:554/stream1?pwd=***')"]
    assert "Secret" not in "\n".join(found)


def test_password_with_question_mark_or_space_is_refused_with_how_to_write_it() -> None:
    text = ("cameras:\n  - {name: q, source: 'rtsp://admin:pa?ss-1@10.0.0.5/x'}\n"
            "  - {name: s, source: 'rtsp://admin:pa ss-2@10.0.0.5/x'}\n")
    found = issues(text)
    assert found == [
        "cfg.yaml:2: cameras[0].source: the password seems to contain '?', which starts a URL's query: write it as "
        "%3F (or, if the '@' belongs to the query, write that '@' as %40) (got 'rtsp://admin:***@10.0.0.5/x')",
        "cfg.yaml:3: cameras[1].source: a URL cannot contain spaces: write a space in a password as %20"]


@pytest.mark.slow
def test_check_config_and_run_show_no_secret(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("cameras:\n"
                    f"  - {{name: lobby, source: 'rtsp://admin:{RTSP_PASSWORD}@10.0.0.5:554/Streaming/Channels/1'}}\n"
                    f"  - {{name: cheap, source: 'http://cam.local/videostream.cgi?user=admin&pwd={QUERY_PASSWORD}'}}\n"
                    "outputs:\n  - {type: webhook, url: 'http://127.0.0.1:9000/emotion?api_key=Hook-K3y'}\n")
    checked = run_cli("check-config", str(good))
    assert checked.returncode == 0, checked.stderr
    assert leaked(checked.stdout + checked.stderr, (*SECRETS, "Hook-K3y")) == []
    assert "lobby: rtsp://admin:***@10.0.0.5:554/Streaming/Channels/1 (rtsp)" in checked.stdout
    assert "cheap: http://cam.local/videostream.cgi?user=admin&pwd=*** (http)" in checked.stdout
    assert "webhook http://127.0.0.1:9000/emotion?api_key=*** [command]" in checked.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text("cameras:\n  - name: lobby\n    source: admin:Secret-1@10.0.0.5:554/Streaming/Channels/101\n"
                   "server: {enabled: false}\n")
    for args in (("check-config", str(bad)), ("run", "--config", str(bad), "--duration", "5")):
        done = run_cli(*args, timeout=120)
        assert done.returncode == 2, (args, done.stderr[-2000:])
        assert f"{bad}:3: cameras[0].source: looks like a camera URL without its scheme" in done.stderr
        assert "Secret-1" not in done.stdout + done.stderr


# ------------------------------------------------------------------------------------------------ the daemon


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except OSError:
        return 0, ""


@pytest.fixture(scope="module")
def served(prepared_models: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, str]]:
    """A daemon with three cameras whose URLs hold every kind of secret, its status server and `/ws`.

    `rtsp`: a real RTSP server that requires `viewer` / RTSP_PASSWORD, written in the URL as pasted; `wrong`: the same
    server with a wrong password (reconnecting forever: error details quoting its URL); `http`: an MJPEG camera with a
    password in the userinfo and one in the query string."""
    reason = rtsp_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("secrets")
    rtsp = RtspProcess(clip(), free_port(), user="viewer", password=RTSP_PASSWORD)
    mjpeg = MjpegServer(clip())
    try:
        rtsp.start()
        mjpeg.start()
        host = f"127.0.0.1:{rtsp.port}"
        mjpeg_path = mjpeg.url.removeprefix("http://")
        reconnect = "reconnect: {initial_s: 0.5, max_s: 1, stall_s: 3}"
        port = free_port()
        config = write_config(tmp / "config.yaml", [
            f"{{name: rtsp, source: 'rtsp://viewer:{RTSP_PASSWORD}@{host}/cam', fps: 5, {reconnect}}}",
            f"{{name: wrong, source: 'rtsp://viewer:{WRONG_PASSWORD}@{host}/cam', fps: 5, {reconnect}}}",
            f"{{name: http, source: 'http://admin:{HTTP_PASSWORD}@{mjpeg_path}?user=admin&pwd={QUERY_PASSWORD}', "
            f"fps: 5, {reconnect}}}"],
            port=port, outputs="[{type: stdout}, {type: websocket}]")
        assert all(secret in config.read_text() for secret in SECRETS)
        daemon = RunningDaemon(config, args=("--log-level", "debug"))
        try:
            yield daemon, f"http://127.0.0.1:{port}"
        finally:
            daemon.kill()
    finally:
        mjpeg.stop()
        rtsp.close()


def _states(daemon: RunningDaemon, camera: str) -> list[str]:
    return [e["state"] for e in daemon.of("camera", camera)]


@pytest.mark.slow
def test_passwords_with_url_delimiters_open_the_stream(served: tuple[RunningDaemon, str]) -> None:
    daemon, _ = served
    # before: FFmpeg took `ss` for the host (`viewer:p@ss/…`) and `tp@pw#2@127…` for the path; neither opened
    daemon.wait_for(lambda: "streaming" in _states(daemon, "rtsp") and "streaming" in _states(daemon, "http"),
                    90, "both cameras streaming")
    daemon.wait_for(lambda: daemon.of("observation", "rtsp") and daemon.of("observation", "http"), 60,
                    "observations from both cameras")
    daemon.wait_for(lambda: _states(daemon, "wrong").count("reconnecting") >= 2, 60, "the wrong password retried")
    assert "streaming" not in _states(daemon, "wrong")
    opened = next(e for e in daemon.of("camera", "rtsp") if e["state"] == "streaming")["detail"]
    assert re.match(r"rtsp://viewer:\*\*\*@127\.0\.0\.1:\d+/cam \d+x\d+$", opened), opened
    refused = next(e for e in daemon.of("camera", "wrong") if e["state"] == "reconnecting")["detail"]
    assert re.match(r"cannot connect to rtsp://viewer:\*\*\*@127\.0\.0\.1:\d+/cam \(", refused), refused
    streaming = next(e for e in daemon.of("camera", "http") if e["state"] == "streaming")["detail"]
    assert re.match(r"http://admin:\*\*\*@127\.0\.0\.1:\d+/stream\.mjpg\?user=admin&pwd=\*\*\* ", streaming)


async def _collect(url: str, until: Any, seconds: float) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not until(received):
            try:
                message = await ws.receive(timeout=max(0.05, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            received.append(json.loads(message.data))
    return received


@pytest.mark.slow
def test_secrets_never_reach_status_ws_metrics_or_page(served: tuple[RunningDaemon, str]) -> None:
    daemon, base = served
    daemon.wait_for(lambda: "streaming" in _states(daemon, "http"), 90, "the HTTP camera streaming")

    def wrong_retried(events: list[dict[str, Any]]) -> bool:
        return any(e.get("camera") == "wrong" and "***" in e.get("detail", "") for e in events)

    async def both() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ws = base.replace("http", "ws")
        return await asyncio.gather(_collect(f"{ws}/ws", lambda r: False, 3),
                                    _collect(f"{ws}/ws?types=camera", wrong_retried, 30))

    everything, cameras = asyncio.run(both())
    assert wrong_retried(cameras), cameras
    assert everything, "no event on /ws within 3 s"
    assert leaked(json.dumps(everything + cameras)) == []

    status, body = _get(base + "/api/status")
    assert status == 200 and leaked(body) == [], leaked(body)
    sources = {c["name"]: c["source"] for c in json.loads(body)["cameras"]}
    assert sources["rtsp"].startswith("rtsp://viewer:***@127.0.0.1:") and sources["rtsp"].endswith("/cam")
    assert re.fullmatch(r"http://admin:\*\*\*@127\.0\.0\.1:\d+/stream\.mjpg\?user=admin&pwd=\*\*\*", sources["http"])
    for path in ("/", "/static/app.js", "/metrics", "/healthz"):
        status, text = _get(base + path)
        assert status in (200, 503) and leaked(text) == [], (path, leaked(text))


@pytest.mark.slow
def test_secrets_never_reach_stdout_or_stderr(served: tuple[RunningDaemon, str]) -> None:
    daemon, _ = served
    daemon.wait_for(lambda: _states(daemon, "wrong").count("reconnecting") >= 3, 60, "the wrong password retried")
    assert wait_until(lambda: daemon.of("observation", "http"), 60)
    stdout, stderr = daemon.stdout_text(), daemon.stderr_text()
    assert leaked(stdout) == [], leaked(stdout)
    assert leaked(stderr) == [], [line for line in stderr.splitlines() if leaked(line)]
    assert "viewer:***@" in stderr and "pwd=***" in stderr  # the URLs are logged, masked
    assert "Traceback" not in stderr
