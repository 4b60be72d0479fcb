"""systemd integration, end to end: sd_notify over a real datagram socket, SIGHUP reloads, SIGTERM, the unit file.

The daemon runs as systemd would run it: `run_pipeline.py run` with NOTIFY_SOCKET and WATCHDOG_USEC in its
environment. The exit time after SIGTERM is printed (`-s` shows it); the assertion is only a generous hang guard.
No pass/fail bound is a tight time window: tests wait for the event itself, with time-outs that only catch a hang.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.config.credentials import export_credentials
from pipeline.service.notify import Notifier
from tests.conftest import ROOT
from tests.running_daemon import (  # noqa: F401
    NotifyListener,
    RunningDaemon,
    clip,
    daemons,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.slow

HANG_GUARD_S = 15.0  # the target is 3 s (printed); this only catches a hang: the unit's TimeoutStopSec, past which
#                     systemd would kill the process
WATCHDOG_S = 1.0  # WATCHDOG_USEC given to the daemon: it must ping at least this often, and pings every half of it
JSON_LOGS = "logging: {format: json}\n"


def _notify_env(listener: NotifyListener) -> dict[str, str]:
    return {"NOTIFY_SOCKET": listener.env_value, "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6))}


def test_notify_path_socket_ready_status_watchdog_stopping(prepared_models: None, tmp_path: Path,
                                                           daemons: Callable[..., RunningDaemon]) -> None:
    listener = NotifyListener(tmp_path / "notify.sock")
    try:
        config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: '{clip()}', fps: 10, loop: true}}"])
        daemon = daemons(config, env=_notify_env(listener))
        daemon.wait_for(lambda: listener.with_key("READY", "1"), 60, "READY=1")
        ready_at, ready = listener.with_key("READY", "1")[0]
        # READY=1 itself carries STATUS=, the one-line summary of the one configured camera (starting or streaming)
        assert re.match(r"[01]/1 cameras streaming\b", ready.get("STATUS", "")), ready
        # WATCHDOG_USEC=1 s: a ping every 0.5 s while every stage beats. Counted, not timed per gap: at least one ping
        # per WATCHDOG_USEC on average (what systemd needs: the wait's time-out), and never a flood (no more pings than
        # one per 0.5 s allows; 2 s of slack for the listener reading two datagrams late, together)
        wanted = 12
        daemon.wait_for(lambda: len(listener.with_key("WATCHDOG", "1")) >= wanted, wanted * WATCHDOG_S + 5,
                        f"{wanted} WATCHDOG=1, one per WATCHDOG_USEC")
        pings = [t for t, _ in listener.with_key("WATCHDOG", "1")]
        assert len(pings) - 1 <= (pings[-1] - pings[0] + 2.0) / (WATCHDOG_S / 2), \
            f"{len(pings)} pings in {pings[-1] - pings[0]:.2f} s: more often than every {WATCHDOG_S / 2:g} s"
        daemon.wait_for(lambda: daemon.of("observation", "lobby"), 60, "an observation")
        daemon.wait_for(lambda: any("1/1 cameras streaming" in m["STATUS"] for _, m in listener.with_key("STATUS")),
                        30, "STATUS= naming the streaming camera")
        code, seconds = daemon.terminate(timeout=HANG_GUARD_S + 5)
        print(f"\nSIGTERM to exit: {seconds:.2f} s")
        assert code == 0, daemon.stderr_text()[-2000:]
        assert seconds < HANG_GUARD_S
        assert listener.with_key("STOPPING", "1"), "no STOPPING=1"
        assert listener.with_key("STOPPING")[0][0] > ready_at
        assert "Traceback" not in daemon.stderr_text()
    finally:
        listener.close()


def test_notify_abstract_socket(prepared_models: None, tmp_path: Path,
                                daemons: Callable[..., RunningDaemon]) -> None:
    listener = NotifyListener(f"@emotion-test-{uuid.uuid4().hex}")
    try:
        config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: '{clip()}', fps: 5, loop: true}}"])
        daemon = daemons(config, env=_notify_env(listener))
        daemon.wait_for(lambda: listener.with_key("READY", "1") and listener.with_key("WATCHDOG", "1"), 60,
                        "READY=1 and WATCHDOG=1 on an abstract socket")
        code, _ = daemon.terminate()
        assert code == 0
        assert listener.with_key("STOPPING", "1")
    finally:
        listener.close()


def test_sighup_adds_camera_rejects_broken_file_then_applies_fix(prepared_models: None, tmp_path: Path,
                                                                  daemons: Callable[..., RunningDaemon]) -> None:
    lobby = f"{{name: lobby, source: '{clip()}', fps: 8, loop: true}}"
    door = f"{{name: door, source: '{clip()}', fps: 8, loop: true}}"
    # A track lives one frame here (max_age_s 10 ms; lobby's frames come about 125 ms apart at 8 fps): the tracker
    # hands out a new id for (nearly) every face it sees, 1, 2, 3 ... So a tracker kept across a reload goes on
    # counting, and a fresh one starts again at 1. (With the default max_age_s the clip's one face is track 1 either
    # way, and a reset would not show.)
    extra = JSON_LOGS + "tracking: {max_age_s: 0.01}\n"
    config = write_config(tmp_path / "config.yaml", [lobby], extra=extra)
    listener = NotifyListener(tmp_path / "notify.sock")
    try:
        daemon = daemons(config, env=_notify_env(listener))

        def track_ids(events: list[dict]) -> list[int]:
            return [f["track_id"] for o in events for f in o["faces"]]

        daemon.wait_for(lambda: max(track_ids(daemon.of("observation", "lobby")), default=0) >= 5, 60,
                        "lobby's tracker past track id 5 (observations with faces)")
        before = daemon.of("observation", "lobby")
        last_frame = before[-1]["frame"]

        def tracker_kept(since: int, what: str) -> None:
            """lobby's track ids after observation `since` continue the count instead of starting again at 1."""
            daemon.wait_for(lambda: len(track_ids(daemon.of("observation", "lobby")[since:])) >= 3, 30,
                            f"faces from lobby after {what}")
            earlier = track_ids(daemon.of("observation", "lobby")[:since])
            later = track_ids(daemon.of("observation", "lobby")[since:])
            assert min(later) >= max(earlier), f"lobby's track ids went back after {what}: its tracker was reset " \
                                               f"(before {earlier[-5:]}, after {later[:5]})"

        # 1. a valid change: a camera added
        write_config(config, [lobby, door], extra=extra)
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: daemon.of("observation", "door"), 30, "observations from the added camera")
        applied = daemon.of("config")
        assert applied and applied[-1]["status"] == "applied" and "added camera(s) door" in applied[-1]["changes"]
        assert listener.with_key("RELOADING", "1") and "MONOTONIC_USEC" in listener.with_key("RELOADING")[0][1]
        daemon.wait_for(lambda: len(daemon.of("observation", "lobby")) > len(before) + 5, 30, "lobby keeps going")
        after = daemon.of("observation", "lobby")[len(before):]
        assert after[0]["frame"] > last_frame, "lobby's frame counter restarted: the camera was restarted"
        tracker_kept(len(before), "a camera was added")
        lobby_states = [e["state"] for e in daemon.of("camera", "lobby")]
        assert lobby_states == ["streaming"], f"lobby was restarted: {lobby_states}"

        # 2. a broken file: located error, `config` rejected event, both cameras keep running
        config.write_text(config.read_text().replace("fps: 8, loop: true}\n  - {name: door",
                                                     "fps: 0, loop: true}\n  - {name: door"))
        count = len(daemon.of("observation", "door"))
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: any(e["status"] == "rejected" for e in daemon.of("config")), 30, "a rejected event")
        rejected = [e for e in daemon.of("config") if e["status"] == "rejected"][0]
        located = rf"{re.escape(str(config))}:\d+: cameras\[0\]\.fps: "
        assert any(re.match(located, line) for line in rejected["errors"]), rejected
        assert rejected["camera"] is None and rejected["ts"] > 0
        logs = [json.loads(line) for line in daemon.stderr if line.startswith("{")]  # logging.format: json
        assert any(entry["level"] == "error" and re.match(located, entry["message"]) for entry in logs), logs[-5:]
        daemon.wait_for(lambda: len(daemon.of("observation", "door")) > count + 3, 30, "door keeps running")

        # 3. the fix (door removed again) applies
        write_config(config, [lobby], extra=extra)
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: [e for e in daemon.of("config") if e["status"] == "applied"
                                 and "removed camera(s) door" in e["changes"]], 30, "the fixed file applied")
        daemon.wait_for(lambda: "stopped" in [e["state"] for e in daemon.of("camera", "door")], 30, "door stopped")
        assert [e["state"] for e in daemon.of("camera", "lobby")] == ["streaming"]

        # 4. a model change rebuilds the models and lobby's worker; its capture keeps running, its tracker too
        config.write_text(config.read_text().replace("input_size: [320, 192]", "input_size: [320, 224]"))
        count = len(daemon.of("observation", "lobby"))
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: [e for e in daemon.of("config") if "models reloaded" in e.get("changes", [])], 60,
                        "models reloaded")
        daemon.wait_for(lambda: len(daemon.of("observation", "lobby")) > count + 5, 30, "lobby on the new models")
        assert [e["state"] for e in daemon.of("camera", "lobby")] == ["streaming"]
        tracker_kept(count, "the models were reloaded")
        ready_after_reload = [t for t, _ in listener.with_key("READY", "1")]
        assert len(ready_after_reload) >= 5, "READY=1 after each reload"

        code, seconds = daemon.terminate(timeout=HANG_GUARD_S + 5)
        print(f"\nSIGTERM to exit after reloads: {seconds:.2f} s")
        assert code == 0 and seconds < HANG_GUARD_S
        assert "Traceback" not in daemon.stderr_text()
    finally:
        listener.close()


def test_wedged_worker_withholds_the_watchdog(prepared_models: None, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """A worker stuck inside analysis (a hung backend call, injected here) stops the WATCHDOG=1 pings, so systemd
    restarts the service instead of leaving it hung; when the stage beats again the pings resume."""
    import threading
    import time

    import pipeline.service.status
    from pipeline.config.app import load_config
    from pipeline.service.daemon import Daemon

    monkeypatch.setattr(pipeline.service.status, "WORKER_STALE_S", 1.0)
    listener = NotifyListener(tmp_path / "notify.sock")
    config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: '{clip()}', fps: 10, loop: true}}"],
                          outputs="[]")
    daemon = Daemon(load_config(config), notifier=Notifier(_notify_env(listener)))
    release = threading.Event()

    def start_and_run() -> None:  # off the main thread, so pytest's own signal handlers stay in place
        daemon.start()
        daemon.run(60)

    runner = threading.Thread(target=start_and_run, daemon=True)
    try:
        runner.start()
        assert wait_until(lambda: len(listener.with_key("WATCHDOG", "1")) >= 2, 60), "no WATCHDOG=1"
        assert daemon.perception is not None
        analyze = daemon.perception.analyze

        def hung(image):  # type: ignore[no-untyped-def]
            release.wait(30)
            return analyze(image)

        monkeypatch.setattr(daemon.perception, "analyze", hung)
        assert wait_until(lambda: "withholding the systemd watchdog" in caplog.text, 30), caplog.text[-2000:]
        assert "worker-lobby: no heartbeat" in caplog.text
        pings_before = len(listener.with_key("WATCHDOG", "1"))
        time.sleep(1.5)  # three ping intervals (a slow machine only makes fewer pings: nothing to flake on)
        assert len(listener.with_key("WATCHDOG", "1")) == pings_before, "watchdog fed while the worker is wedged"
        release.set()
        assert wait_until(lambda: len(listener.with_key("WATCHDOG", "1")) > pings_before, 30), "pings did not resume"
    finally:
        release.set()
        daemon.stop_event.set()
        runner.join(10)
        daemon.stop()
        listener.close()


def test_mps_unit_and_drop_in_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` on deploy/nvidia-mps.service (its binary, absent here, stood in by /bin/true) and on
    the daemon's unit with the MPS drop-in applied."""
    import subprocess

    mps = (ROOT / "deploy" / "nvidia-mps.service").read_text().replace("/usr/bin/nvidia-cuda-mps-control", "/bin/true")
    (tmp_path / "nvidia-mps.service").write_text(mps)
    unit = (ROOT / "deploy" / "emotion-pipeline.service").read_text()
    unit = unit.replace("/opt/emotion-pipeline/venv/bin/python", sys.executable).replace("/opt/emotion-pipeline",
                                                                                          str(ROOT))
    (tmp_path / "emotion-pipeline.service").write_text(unit)
    drop_in = tmp_path / "emotion-pipeline.service.d"
    drop_in.mkdir()
    (drop_in / "mps.conf").write_text((ROOT / "deploy" / "emotion-pipeline-mps.conf").read_text())
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "nvidia-mps.service"),
                           str(tmp_path / "emotion-pipeline.service")], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "nvidia-mps.service" not in done.stderr and "mps.conf" not in done.stderr, done.stderr
    assert "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps" in mps and "RuntimeDirectory=nvidia-mps" in mps


def test_notifier_without_systemd_is_silent() -> None:
    notifier = Notifier({})
    assert not notifier.enabled and notifier.watchdog_interval_s is None
    assert notifier.ready("x") is False
    assert Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid() + 1)}).watchdog_interval_s is None
    assert Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_interval_s == 0.5


def test_credentials_become_environment_variables(tmp_path: Path) -> None:
    (tmp_path / "env_CAM_PASS").write_text("s3cret\n")
    (tmp_path / "EMOTION_TOKEN").write_text("tok")
    (tmp_path / "not-a-name").write_text("x")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "EMOTION_TOKEN": "from-env"}
    assert export_credentials(env) == ["CAM_PASS"]
    assert env["CAM_PASS"] == "s3cret" and env["EMOTION_TOKEN"] == "from-env"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_file_verifies(tmp_path: Path) -> None:
    """`systemd-analyze verify` on the unit, its /opt paths pointed at this checkout (verify checks the binaries)."""
    import subprocess

    text = (ROOT / "deploy" / "emotion-pipeline.service").read_text()
    text = text.replace("/opt/emotion-pipeline/venv/bin/python", sys.executable).replace("/opt/emotion-pipeline",
                                                                                          str(ROOT))
    unit = tmp_path / "emotion-pipeline.service"
    unit.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "emotion-pipeline.service" not in done.stderr, done.stderr  # no warning about our unit
    for line in ("Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "WatchdogSec=", "Restart=on-failure",
                 "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "check-config"):
        assert line in text
