"""Honest health (issue 12, item 5): outputs that fail to deliver, and why a camera fails, are shown to operators.

A webhook whose endpoint refuses connections and an OSC receiver whose UDP port is closed make /healthz answer 503
naming them, /api/status gives each output's counters, health and last error, and the status page shows them; once
real receivers listen on those ports the outputs are healthy again. A camera that cannot be opened carries its
reason (password masked) in /api/status and on its tile. Real daemon, real HTTP, real aiohttp and python-osc
receivers, real headless Chromium; nothing is faked.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pythonosc import dispatcher, osc_server

from pipeline.config.app import OscOutput
from pipeline.outputs.events import observation_event
from pipeline.outputs.osc import OscSink
from tests.running_daemon import RunningDaemon, free_port, wait_until, write_config
from tests.test_behavior import observation, result
from tests.test_sinks_osc_webhook import HookServer

SECRET = "h3alth-S3cret"
HOOK_KEY = "h00k-K3y"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (OSError, ValueError):
        return 0, {}


class OscListener:
    """python-osc's UDP server on a given port, counting the messages it dispatches."""

    def __init__(self, port: int) -> None:
        self.messages = 0
        handlers = dispatcher.Dispatcher()
        handlers.set_default_handler(self._count)
        self.server = osc_server.ThreadingOSCUDPServer(("127.0.0.1", port), handlers)
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def _count(self, address: str, *args: Any) -> None:
        self.messages += 1

    def __enter__(self) -> OscListener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------------------ the OSC sink


def test_osc_counts_datagrams_a_closed_port_refuses_then_recovers() -> None:
    """UDP has no answer, but a closed port on a reachable host says "port unreachable": that is a failure."""
    port = _free_udp_port()
    sink = OscSink(OscOutput(port=port, protocol="plain", events=["observation"]))
    sink.start()
    try:
        for frame in range(6):
            sink.offer(observation_event(observation(frame, result(1, "happy"))))
        assert wait_until(lambda: sink.sent + sink.failed == 6, 30), (sink.sent, sink.failed)
        assert sink.failed >= 5, (sink.sent, sink.failed)  # at most the very first may have left unrefused
        assert sink.delivery.failures_in_row == sink.failed and "refused" in (sink.delivery.last_error or "")
        with OscListener(port) as listener:
            for frame in range(6, 9):
                sink.offer(observation_event(observation(frame, result(1, "happy"))))
            assert wait_until(lambda: sink.sent + sink.failed == 9 and listener.messages > 0, 30)
            assert sink.delivery.failures_in_row == 0 and sink.delivery.last_error  # the last error is kept
    finally:
        sink.close()


# ------------------------------------------------------------------------------------------------ the health rule


def test_health_rule_fails_outputs_on_failures_in_a_row_or_long_silence() -> None:
    """Read from a plain snapshot at a given time (the clock is the test's): 3 failures in a row, or one failure
    with nothing delivered for 30 s, is a problem; one fresh failure is not; a delivery clears it."""
    from pipeline.config.app import parse_config
    from pipeline.outputs.base import Delivery
    from pipeline.service.snapshot import DaemonSnapshot, OutputView
    from pipeline.service.status import check_health, status_document

    now = 1000.0
    outputs = (OutputView("webhook", "webhook", 0, 0, 3, True, Delivery(3, now - 2.0, "POST refused", 1.5e9)),
               OutputView("osc", "osc", 5, 0, 1, True, Delivery(1, now - 31.0, "port closed", 1.5e9)),
               OutputView("osc-2", "osc", 5, 0, 2, True, Delivery(2, now - 1.0, "port closed", 1.5e9)),
               OutputView("stdout", "stdout", 9, 0, 1, True, Delivery(0, None, "old trouble", 1.4e9, 1.6e9)))
    snapshot = DaemonSnapshot(
        taken_mono=now, cfg=parse_config("cameras: [{name: lobby, source: demo}]\n"), ready=True, started=True,
        started_mono=now - 60.0, config_path=None, config_loaded_at=0.0, reloads={}, commands_sent=0,
        recent_commands=(), observations_dropped=0, preview_fps=0.0, preview_renders=0, ws_enabled=False,
        ws_clients=0, ws_clients_dropped=0, mapper_alive=True, mapper_heartbeat=now, server_present=False,
        server_alive=False, outputs=outputs)
    report = check_health(snapshot)
    assert report.status == "failing"
    assert report.outputs == {"webhook": "failing", "osc": "failing", "osc-2": "ok", "stdout": "ok"}
    assert report.problems == [
        "output webhook: 3 deliveries in a row failed (failing for 2 s): POST refused",
        "output osc: 1 deliveries in a row failed (failing for 31 s): port closed"]
    assert all(state == "ok" for state in report.stages.values())  # the watchdog keeps being fed
    sinks = {s["output"]: s for s in status_document(snapshot)["sinks"]}
    assert [sinks[k]["healthy"] for k in ("webhook", "osc", "osc-2", "stdout")] == [False, False, True, True]
    assert sinks["stdout"]["last_error"] == "old trouble" and sinks["stdout"]["problem"] is None
    assert {"sent", "dropped", "failed", "last_error", "last_error_ts"} <= set(sinks["webhook"])


# ------------------------------------------------------------------------------------------------ the daemon


def _output_health_metric(base: str) -> dict[str, float]:
    """emotion_output_healthy per output, read from /metrics with Prometheus's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        text = response.read().decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == "emotion_output_healthy")
    return {sample.labels["output"]: sample.value for sample in family.samples}


def test_dead_receivers_fail_healthz_until_real_ones_listen(prepared_models: None, tmp_path: Path) -> None:
    hook_port, osc_port, port = free_port(), _free_udp_port(), free_port()
    config = write_config(
        tmp_path / "config.yaml", ["{name: lobby, source: demo, fps: 10}"], port=port,
        outputs=(f"[{{type: stdout, events: [camera]}}, "
                 f"{{type: webhook, url: 'http://127.0.0.1:{hook_port}/emotion?api_key={HOOK_KEY}', "
                 f"events: [observation], retries: 0, timeout_s: 2}}, "
                 f"{{type: osc, port: {osc_port}, protocol: plain, events: [observation]}}]"))
    daemon = RunningDaemon(config)
    base = f"http://127.0.0.1:{port}"
    try:
        def outputs_failing() -> bool:
            code, body = _get(base + "/healthz")
            return code == 503 and body.get("outputs") == {"stdout": "ok", "webhook": "failing", "osc": "failing"}

        daemon.wait_for(outputs_failing, 90, "/healthz 503 naming the webhook and the OSC output")
        _, health = _get(base + "/healthz")
        problems = health["problems"]
        assert any(p.startswith("output webhook: ") and f"127.0.0.1:{hook_port}" in p for p in problems), problems
        assert any(p.startswith("output osc: ") and "refused" in p for p in problems), problems
        assert health["cameras"] == {"lobby": "ok"} and set(health["stages"].values()) == {"ok"}, health
        _, status = _get(base + "/api/status")
        sinks = {s["output"]: s for s in status["sinks"]}
        assert sinks["stdout"]["healthy"] and sinks["stdout"]["last_error"] is None
        for name in ("webhook", "osc"):
            assert not sinks[name]["healthy"] and sinks[name]["failed"] >= 3 and sinks[name]["last_error"], sinks
        assert HOOK_KEY not in json.dumps(status) + json.dumps(health)
        assert _output_health_metric(base) == {"stdout": 1.0, "webhook": 0.0, "osc": 0.0}

        with HookServer(port=hook_port) as hook, OscListener(osc_port) as osc:
            daemon.wait_for(lambda: _get(base + "/healthz")[0] == 200, 90, "/healthz 200 once the receivers listen")
            _, status = _get(base + "/api/status")
            sinks = {s["output"]: s for s in status["sinks"]}
            assert all(s["healthy"] for s in sinks.values()), sinks
            assert sinks["webhook"]["sent"] > 0 and sinks["osc"]["sent"] > 0
            assert hook.requests and osc.messages > 0
            assert _output_health_metric(base) == {"stdout": 1.0, "webhook": 1.0, "osc": 1.0}
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        daemon.kill()


@pytest.fixture(scope="module")
def failing(prepared_models: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, str]]:
    """A daemon with a good camera, an RTSP camera whose port refuses (password in its URL), an absent USB device,
    and a webhook nobody listens to."""
    if Path("/dev/video57").exists():
        pytest.skip("this machine has a /dev/video57")
    tmp = tmp_path_factory.mktemp("failing")
    port = free_port()
    quick = "reconnect: {initial_s: 0.5, max_s: 1, stall_s: 1}"
    config = write_config(
        tmp / "config.yaml",
        ["{name: lobby, source: demo, fps: 10}",
         f"{{name: door, source: 'rtsp://viewer:{SECRET}@127.0.0.1:{free_port()}/stream1', {quick}}}",
         f"{{name: kiosk, source: /dev/video57, {quick}}}"],
        port=port,
        outputs=(f"[{{type: stdout, events: [camera]}}, {{type: webhook, url: 'http://127.0.0.1:{free_port()}/e', "
                 "events: [observation], retries: 0}]"))
    daemon = RunningDaemon(config)
    base = f"http://127.0.0.1:{port}"

    def reasons_known() -> bool:
        cameras = _get(base + "/api/status")[1].get("cameras") or []
        return sum(bool(c.get("last_failure")) for c in cameras) == 2

    try:
        daemon.wait_for(reasons_known, 90, "both failing cameras with a reason in /api/status")
        yield daemon, base
    finally:
        daemon.kill()


def test_api_status_gives_each_failing_camera_its_masked_reason(failing: tuple[RunningDaemon, str]) -> None:
    _, base = failing
    _, status = _get(base + "/api/status")
    cameras = {c["name"]: c for c in status["cameras"]}
    assert cameras["door"]["last_failure"].startswith("cannot connect to rtsp://viewer:***@127.0.0.1:"), cameras
    assert "retry in" not in cameras["door"]["last_failure"]
    assert cameras["kiosk"]["last_failure"] == "/dev/video57 does not exist (camera unplugged?)"
    assert isinstance(cameras["kiosk"]["last_failure_ts"], float)
    assert cameras["lobby"]["last_failure"] is None and cameras["lobby"]["state"] == "streaming"
    assert SECRET not in json.dumps(status)


def test_status_page_shows_failing_outputs_and_camera_reasons(failing: tuple[RunningDaemon, str],
                                                              tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from tests.test_status_page import _browser

    daemon, base = failing
    daemon.wait_for(lambda: not next(s for s in _get(base + "/api/status")[1]["sinks"]
                                     if s["output"] == "webhook")["healthy"], 60, "the webhook output failing")
    browser = _browser(tmp_path / "profile")
    try:
        browser.get(base + "/")

        def cell_texts(output: str) -> list[str]:  # output, target, state, events, messages, dropped, failed, ok, error
            from selenium.common.exceptions import StaleElementReferenceException

            try:  # the table is redrawn every second: a row found may be replaced before it is read
                rows = browser.find_elements(By.CSS_SELECTOR, f'#outputs tbody tr[data-output="{output}"]')
                return [td.text for td in rows[0].find_elements(By.CSS_SELECTOR, "td")] if rows else []
            except StaleElementReferenceException:
                return []

        def cell(output: str, column: int) -> str:  # "" while the row is being redrawn
            texts = cell_texts(output)
            return texts[column] if len(texts) > column else ""

        assert wait_until(lambda: len(cell_texts("webhook")) == 9, 60), browser.page_source[:3000]
        assert wait_until(lambda: cell("webhook", 2) == "failing", 60), cell_texts("webhook")
        assert wait_until(lambda: "127.0.0.1" in cell("webhook", 8), 60), cell_texts("webhook")  # last error
        assert wait_until(lambda: cell("webhook", 1).startswith("webhook http://"), 30), cell_texts("webhook")
        assert SECRET not in cell("webhook", 1)
        assert wait_until(lambda: cell_texts("stdout")[2:3] == ["ok"], 60), cell_texts("stdout")

        def texts(selector: str) -> list[str]:  # [] while the elements are being redrawn
            from selenium.common.exceptions import StaleElementReferenceException

            try:
                return [found.text for found in browser.find_elements(By.CSS_SELECTOR, selector)]
            except StaleElementReferenceException:
                return []

        def failure(camera: str) -> str:
            return next(iter(texts(f'.tile[data-camera="{camera}"] .failure')), "")

        assert wait_until(lambda: "cannot connect to rtsp://viewer:***@" in failure("door"), 60), failure("door")
        assert wait_until(lambda: "/dev/video57 does not exist" in failure("kiosk"), 10), failure("kiosk")
        assert failure("lobby") == ""
        assert wait_until(lambda: any("output webhook:" in text for text in texts("#problems li")), 10), \
            texts("#problems li")
        assert SECRET not in browser.page_source
    finally:
        browser.quit()
