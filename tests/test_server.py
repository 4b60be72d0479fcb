"""The status server against a running daemon: real HTTP and WebSocket clients on a real port.

One daemon serves the module: two looping file cameras (`lobby`, and `hall` at the clip's full rate for a steady
stream of events) and one whose file is missing (`door`), a token, and a `websocket` output with a small per-client
queue so that a client that never reads is found out quickly.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.config.app import ReconnectConfig
from pipeline.inference.settings import EmotionConfig
from tests.conftest import run_cli
from tests.running_daemon import (
    RunningDaemon,
    clip,
    free_port,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.slow

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WS_QUEUE = 8


@pytest.fixture(scope="module")
def served(prepared_models: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, str]]:
    tmp = tmp_path_factory.mktemp("server")
    port = free_port()
    config = write_config(
        tmp / "config.yaml",
        [f"{{name: lobby, source: '{clip()}', fps: 15, loop: true}}",
         f"{{name: hall, source: '{clip()}', fps: 25, loop: true}}",
         f"{{name: door, source: '{tmp / 'missing.mp4'}', fps: 5, "
         "reconnect: {initial_s: 0.5, max_s: 1, stall_s: 1}}"],
        port=port, server=f"token: {TOKEN}, preview_fps: 4",
        outputs=f"[{{type: stdout, events: [command, camera]}}, {{type: websocket, queue_size: {WS_QUEUE}}}]")
    daemon = RunningDaemon(config)
    base = f"http://127.0.0.1:{port}"

    def lobby_analysed() -> int:
        cameras = _get(base + "/api/status", AUTH)[1].get("cameras") or [{}]
        return int(cameras[0].get("frames_analysed", 0))

    try:
        daemon.wait_for(lambda: _get(base + "/healthz")[0] in (200, 503), 60, "the status server")
        daemon.wait_for(lambda: lobby_analysed() > 5, 60, "lobby analysing frames")
        yield daemon, base
        code, _ = daemon.terminate()
        assert code == 0 and "Traceback" not in daemon.stderr_text()
    finally:
        daemon.kill()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
            status = response.status
            kind = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        body, status, kind = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    except OSError:
        return 0, {}
    return status, json.loads(body) if "json" in kind else body


def test_token_protects_everything_but_healthz(served: tuple[RunningDaemon, str]) -> None:
    _, base = served
    for path in ("/metrics", "/api/status", "/", "/static/app.js", "/preview/lobby.jpg", "/ws"):
        assert _get(base + path)[0] == 401, path
        assert _get(base + path, {"Authorization": "Bearer wrong"})[0] == 401, path
        if path != "/ws":
            assert _get(base + path, AUTH)[0] == 200, path
            assert _get(f"{base}{path}?token={TOKEN}")[0] == 200, path
    assert _get(base + "/healthz")[0] in (200, 503)  # no token needed


def test_healthz_fails_naming_the_missing_camera(served: tuple[RunningDaemon, str]) -> None:
    _, base = served
    # `door` has had no frame since its start; once its stall_s (1 s) has passed, /healthz fails and names it
    assert wait_until(lambda: _get(base + "/healthz")[0] == 503, 30)
    status, body = _get(base + "/healthz")
    assert status == 503
    assert body["status"] == "failing" and body["cameras"] == {"lobby": "ok", "hall": "ok", "door": "failing"}
    assert any(p.startswith("camera door:") for p in body["problems"]), body
    assert all(state == "ok" for state in body["stages"].values()), body["stages"]


def test_metrics_parse_with_per_camera_series(served: tuple[RunningDaemon, str]) -> None:
    _, base = served
    status, text = _get(base + "/metrics", AUTH)
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    for name in ("emotion_camera_frames_in", "emotion_camera_frames_analysed", "emotion_camera_frames_skipped",
                 "emotion_camera_fps_in", "emotion_camera_fps_analysed", "emotion_camera_reconnects"):
        assert {s.labels["camera"] for s in families[name].samples} == {"lobby", "hall", "door"}, name
    values = {(s.name, s.labels.get("camera")): s.value for f in families.values() for s in f.samples}
    assert values[("emotion_camera_frames_analysed_total", "lobby")] > 0
    assert values[("emotion_camera_reconnects_total", "door")] >= 1
    latency = families["emotion_stage_latency_seconds"]
    assert latency.type == "histogram"
    assert {s.labels["stage"] for s in latency.samples if s.labels.get("camera") == "lobby"} >= \
           {"detect", "crop", "emotion", "total"}
    models = {s.labels["model"] for s in families["emotion_batch_size"].samples}
    assert models == {"retinaface_mnet025", EmotionConfig().model}  # the default models
    for name in ("emotion_batch_queue_seconds", "emotion_batch_compute_seconds"):
        assert families[name].type == "histogram" and any(s.value > 0 for s in families[name].samples
                                                          if s.name.endswith("_count"))
    assert {s.labels["output"] for s in families["emotion_output_events_dropped"].samples} == {"stdout", "websocket"}
    assert "emotion_websocket_clients_dropped" in families
    rss = {s.labels["process"]: s.value for s in families["emotion_process_resident_memory_bytes"].samples}
    cpu = {s.labels["process"]: s.value for s in families["emotion_process_cpu_seconds"].samples}
    assert set(rss) == set(cpu) == {"daemon"} and rss["daemon"] > 50 * 2**20 and cpu["daemon"] > 0


def test_api_status_shape(served: tuple[RunningDaemon, str]) -> None:
    _, base = served
    status, body = _get(base + "/api/status", AUTH)
    assert status == 200
    assert {"status", "uptime_s", "cameras", "models", "sinks", "websocket", "recent_commands", "config"} <= set(body)
    lobby = next(c for c in body["cameras"] if c["name"] == "lobby")
    # streaming means a frame within stall_s (lobby has the default), or the camera would have been declared stalled
    stall_s = ReconnectConfig().stall_s
    assert lobby["state"] == "streaming" and lobby["fps_analysed"] > 0 and 0 <= lobby["last_frame_age_s"] <= stall_s
    assert {"fps_in", "frames_skipped", "faces", "quality", "reconnects_1h"} <= set(lobby)
    door = next(c for c in body["cameras"] if c["name"] == "door")
    assert door["state"] == "reconnecting" and door["last_frame_age_s"] is None
    assert body["models"]["detector"]["backend"] == "onnxruntime"
    assert {"precision", "device", "mean_batch"} <= set(body["models"]["emotion"])
    assert [s["type"] for s in body["sinks"]] == ["stdout", "websocket"]
    daemon, _ = served
    (own,) = body["processes"]  # one process: no camera groups here
    assert own["name"] == "daemon" and own["pid"] == daemon.proc.pid
    assert own["rss_mb"] > 50 and own["cpu_s"] > 0  # the models alone take more


async def _collect(url: str, seconds: float, until: Any = None) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                message = await ws.receive(timeout=max(0.05, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            received.append(json.loads(message.data))
            if until is not None and until(received):
                break
    return received


def test_ws_streams_events_and_filters_by_type(served: tuple[RunningDaemon, str]) -> None:
    _, base = served
    ws_base = base.replace("http", "ws")

    def lobby_face(received: list[dict[str, Any]]) -> bool:
        return any(e["type"] == "observation" and e["camera"] == "lobby" and e["faces"] for e in received)

    async def both() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await asyncio.gather(
            _collect(f"{ws_base}/ws?token={TOKEN}", 60, until=lobby_face),
            _collect(f"{ws_base}/ws?types=command&token={TOKEN}", 60, until=lambda r: len(r) >= 1))

    everything, commands = asyncio.run(both())
    assert lobby_face(everything), f"no observation of lobby's face in {len(everything)} events"
    assert commands, "no command within 60 s"
    assert {e["type"] for e in commands} == {"command"}
    assert {"target", "emotion", "expression", "tone"} <= set(commands[0])


def test_ws_unknown_type_is_400(served: tuple[RunningDaemon, str]) -> None:
    _, base = served
    status, body = _get(f"{base}/ws?types=frames&token={TOKEN}")
    assert status == 400 and "frames" in body["error"]


def _stuck_client(port: int) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads (tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall((f"GET /ws?token={TOKEN} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_client_that_never_reads_is_dropped_without_slowing_others(served: tuple[RunningDaemon, str]) -> None:
    """The reading client is never held up: it keeps its own small queue (WS_QUEUE events), so had it waited behind
    the stuck client it would have been dropped as too slow itself (a message that is not TEXT), and a hub or event
    loop blocked on the stuck client would leave it with nothing at all (the receive time-out). Gaps are printed."""
    _, base = served
    port = int(base.rsplit(":", 1)[1])
    dropped_before = _get(base + "/api/status", AUTH)[1]["websocket"]["clients_dropped"]
    stuck = _stuck_client(port)
    try:
        async def watch() -> tuple[list[float], bool]:
            arrivals: list[float] = []
            async with aiohttp.ClientSession() as session, \
                    session.ws_connect(f"{base.replace('http', 'ws')}/ws?types=observation&token={TOKEN}") as ws:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    try:
                        message = await ws.receive(timeout=20)
                    except asyncio.TimeoutError:
                        pytest.fail(f"the reading client got nothing for 20 s after {len(arrivals)} observations: "
                                    "held up by the stuck one")
                    assert message.type == aiohttp.WSMsgType.TEXT, f"the reading client was dropped: {message}"
                    arrivals.append(time.monotonic())
                    if len(arrivals) % 10 == 0:
                        status = await (await session.get(base + "/api/status", headers=AUTH)).json()
                        if status["websocket"]["clients_dropped"] > dropped_before:
                            return arrivals, True
                return arrivals, False

        arrivals, dropped = asyncio.run(watch())
    finally:
        stuck.close()
    assert dropped, "the client that never reads was not dropped within 60 s"
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    print(f"\nreader got {len(arrivals)} observations while the stuck client was dropped; "
          f"longest gap {max(gaps):.2f} s")
    status, text = _get(base + "/metrics", AUTH)
    dropped_metric = [s.value for f in text_string_to_metric_families(text.decode()) for s in f.samples
                      if s.name == "emotion_websocket_clients_dropped_total"]
    assert dropped_metric and dropped_metric[0] >= 1


def test_preview_jpeg(served: tuple[RunningDaemon, str]) -> None:
    _, base = served
    status, body = _get(base + "/preview/lobby.jpg", AUTH)
    assert status == 200 and body[:3] == b"\xff\xd8\xff"
    assert _get(base + "/preview/nobody.jpg", AUTH)[0] == 404


def test_port_in_use_is_one_line_exit_1(served: tuple[RunningDaemon, str], tmp_path: Path) -> None:
    _, base = served
    port = int(base.rsplit(":", 1)[1])
    config = write_config(tmp_path / "config.yaml", ["{name: demo, source: demo}"], port=port)
    done = run_cli("run", "--config", str(config), "--duration", "5", timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"error: status server cannot listen on 127.0.0.1:{port}: address already in use" in done.stderr


def test_non_loopback_without_token_refuses_to_start(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", ["{name: demo, source: demo}"], port=free_port(),
                          server="host: 0.0.0.0")
    done = run_cli("run", "--config", str(config), "--duration", "5", timeout=60)
    assert done.returncode == 2 and "not loopback: set server.token" in done.stderr
    assert "Traceback" not in done.stderr


def _camera_view(name: str, state: str, last_frame_mono: float | None, now: float, **kw: Any) -> Any:
    from pipeline.capture.stats import CameraHealth
    from pipeline.service.snapshot import CameraView

    age = None if last_frame_mono is None else now - last_frame_mono
    health = CameraHealth(name=name, state=state, source="demo", fps_in=10.0, fps_analysed=kw.pop("fps", 5.0),
                          frames_in=10, frames_analysed=5, frames_skipped=5, reconnects_1h=0, stalls_1h=0,
                          reconnects_total=0, last_frame_age_s=age, faces=kw.pop("faces", 0), quality="excellent")
    fields = dict(name=name, stall_s=5.0, fps_max=15.0, health=health, capture_alive=True, state=state,
                  last_frame_mono=last_frame_mono, started_mono=now - 60.0, slot_closed=False, worker_alive=True,
                  worker_heartbeat=now, latency_ms=12.34, stalls_total=0, busy_skips=0, errors=0)
    return CameraView(**(fields | kw))


def test_status_reads_a_snapshot_not_the_daemon() -> None:
    """Health, stage problems, the document and STATUS= come from a plain DaemonSnapshot (no daemon, no threads)."""
    from pipeline.config.app import parse_config
    from pipeline.service.snapshot import DaemonSnapshot, OutputView
    from pipeline.service.status import (
        check_health,
        stage_problems,
        status_document,
        status_line,
    )

    now = 1000.0
    cfg = parse_config("cameras: [{name: lobby, source: demo}, {name: door, source: demo}]\n")
    snapshot = DaemonSnapshot(
        taken_mono=now, cfg=cfg, ready=True, started=True, started_mono=now - 60.0, config_path="site.yaml",
        config_loaded_at=1.5, reloads={"applied": 1, "rejected": 0}, commands_sent=4,
        recent_commands=({"type": "command", "n": 1}, {"type": "command", "n": 2}), observations_dropped=0,
        preview_fps=2.0, preview_renders=0, ws_enabled=True, ws_clients=1, ws_clients_dropped=0, mapper_alive=True,
        mapper_heartbeat=now, server_present=True, server_alive=True,
        cameras=(_camera_view("lobby", "streaming", now - 0.1, now, faces=1),
                 _camera_view("door", "reconnecting", None, now, worker_heartbeat=now - 100.0)),
        outputs=(OutputView("stdout", "stdout", 3, 0, 0, False),))
    assert stage_problems(snapshot) == {"worker-door": "no heartbeat for 100 s", "output-stdout": "thread ended"}
    report = check_health(snapshot)
    assert report.status == "failing" and report.cameras == {"lobby": "ok", "door": "failing"}
    assert report.problems[0] == "camera door: no frame since start 60.0 s ago (reconnecting)"
    document = status_document(snapshot)
    assert document["uptime_s"] == 60.0 and document["config"]["path"] == "site.yaml"
    assert [c["latency_ms"] for c in document["cameras"]] == [12.3, 12.3]
    assert [c["n"] for c in document["recent_commands"]] == [2, 1] and document["models"] == {}
    assert status_line(snapshot) == ("1/2 cameras streaming (door reconnecting), 10.0 fps analysed, 1 face, "
                                     "4 commands, 1 ws client")


def test_a_camera_that_never_connected_is_not_ok_from_its_first_second() -> None:
    """Issue 26: /healthz called a camera that had not delivered a frame yet `ok` for its first stall_s."""
    from pipeline.service.status import camera_problem

    now = 1000.0
    opening = _camera_view("gate", "starting", None, now, started_mono=now - 2.0)
    assert camera_problem(opening, now) == "camera gate: connecting, no frame yet (2.0 s)"
    failed = _camera_view("gate", "reconnecting", None, now, started_mono=now - 2.0)
    assert camera_problem(failed, now) == "camera gate: no frame since start 2.0 s ago (reconnecting)"
    assert camera_problem(_camera_view("lobby", "streaming", now - 0.1, now), now) is None


def test_status_document_detector_input_size() -> None:
    """/api/status names the detector's input size: the fixed [w, h], or auto (it used to list 'a', 'u', 't', 'o')."""
    from pipeline.config.app import parse_config
    from pipeline.inference.batching import BatchStats
    from pipeline.service.snapshot import DaemonSnapshot, ModelView
    from pipeline.service.status import status_document

    now = 1000.0
    detector = ModelView("detector", "retinaface_mnet025", {}, "onnxruntime", 8, 1, True, BatchStats())
    sizes = {}
    for text in ("detector: {input_size: [320, 192]}\n", "detector: {max_input_side: 480}\n"):
        cfg = parse_config("cameras: [{name: lobby, source: demo}]\n" + text)
        snapshot = DaemonSnapshot(
            taken_mono=now, cfg=cfg, ready=True, started=True, started_mono=now - 1.0, config_path="site.yaml",
            config_loaded_at=1.5, reloads={"applied": 0, "rejected": 0}, commands_sent=0, recent_commands=(),
            observations_dropped=0, preview_fps=2.0, preview_renders=0, ws_enabled=False, ws_clients=0,
            ws_clients_dropped=0, mapper_alive=True, mapper_heartbeat=now, server_present=True, server_alive=True,
            cameras=(), outputs=(), models=(detector,))
        sizes[text] = status_document(snapshot, now)["models"]["detector"]["input_size"]
    assert list(sizes.values()) == [[320, 192], "auto (long side 480)"]


def test_preview_socket_sends_jpegs_uncompressed(served: tuple[RunningDaemon, str]) -> None:
    """A client offering permessage-deflate (as browsers do) gets the previews uncompressed: JPEGs do not deflate,
    and aiohttp's shielded compression of large frames left a failing task behind at shutdown (a traceback in the
    daemon's log with a browser connected)."""
    _, base = served

    async def first_preview() -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as session, session.ws_connect(
                f"{base.replace('http', 'ws')}/preview/ws?cameras=lobby&token={TOKEN}", compress=15) as ws:
            message = await ws.receive(timeout=30)
            return ws.compress, message.data

    negotiated, data = asyncio.run(first_preview())
    name, _, jpeg = data.partition(b"\n")
    assert name == b"lobby" and jpeg[:3] == b"\xff\xd8\xff"
    assert negotiated == 0  # the server declined the deflate extension the client offered
