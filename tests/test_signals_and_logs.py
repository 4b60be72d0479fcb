"""Signals during start-up, native libraries' stderr, exits systemd must not restart (issue 12, items 6 to 8).

The start-up window is found from the outside: /proc/PID/maps shows which shared libraries the process has loaded,
so a signal is sent once pydantic-core is loaded (the command line's imports are under way) and before NumPy is.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.running_daemon import (
    RunningDaemon,
    clip,
    free_port,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.slow

IMPORTING = "_pydantic_core"  # loaded early by `from pipeline.tools.cli import main`
NUMPY = "_multiarray_umath"  # NumPy's core: loaded later in the same imports
ATTEMPTS = 5  # a machine too busy for the poll to see the window gets another process, not a false result


@pytest.fixture
def start() -> Iterator[Callable[[Path], RunningDaemon]]:
    """`run --config FILE` processes, each killed at the end if it is still running, started with SIGINT and SIGHUP
    as a terminal leaves them. A suite launched as a shell's background job (`cmd &` without job control) inherits
    SIGINT ignored, one launched under nohup SIGHUP; an ignored signal stays ignored across exec, and the daemon then
    rightly leaves it so while it imports: a caught handler here makes the children start with the default
    disposition instead."""
    caught = {signal.SIGINT: signal.default_int_handler, signal.SIGHUP: lambda _signum, _frame: None}
    inherited = {signum: signal.getsignal(signum) for signum in caught}
    for signum, handler in caught.items():
        if inherited[signum] is signal.SIG_IGN:
            signal.signal(signum, handler)
    started: list[RunningDaemon] = []

    def run(config: Path) -> RunningDaemon:
        started.append(RunningDaemon(config))
        return started[-1]

    try:
        yield run
    finally:
        for daemon in started:
            daemon.kill()
        for signum, previous in inherited.items():
            if previous is not None:  # None: a handler not set from Python, left alone
                signal.signal(signum, previous)


def _loaded(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # the process has exited
        return False


def _signal_while_importing(start: Callable[[], RunningDaemon], signum: int) -> RunningDaemon:
    """Start the process and send `signum` while it is importing, before NumPy is loaded."""
    for _ in range(ATTEMPTS):
        daemon = start()
        pid = daemon.proc.pid
        wait_until(lambda: _loaded(pid, IMPORTING) or daemon.proc.poll() is not None, timeout=60, interval=0.001)
        if daemon.proc.poll() is None and not _loaded(pid, NUMPY):
            daemon.signal(signum)
            return daemon
        daemon.kill()
    pytest.fail(f"never caught the process between loading {IMPORTING} and {NUMPY} in {ATTEMPTS} attempts")


def test_sigterm_while_importing_exits_0_without_starting(tmp_path: Path,
                                                         start: Callable[[Path], RunningDaemon]) -> None:
    config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: {clip()}, fps: 5, loop: true}}"])
    daemon = _signal_while_importing(lambda: start(config), signal.SIGTERM)
    code = daemon.wait(timeout=120)
    stderr = daemon.stderr_text()
    assert code == 0, f"exit {code} (143 or -15: killed by the signal); stderr:\n{stderr[-2000:]}"
    assert "SIGTERM received" in stderr and "Traceback" not in stderr
    assert not daemon.of("camera"), "a stop requested before the daemon existed still started the cameras"


def test_sighup_while_importing_is_ignored_and_the_daemon_runs(prepared_models: None, tmp_path: Path,
                                                              start: Callable[[Path], RunningDaemon]) -> None:
    config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: {clip()}, fps: 5, loop: true}}"])
    daemon = _signal_while_importing(lambda: start(config), signal.SIGHUP)
    daemon.wait_for(lambda: daemon.of("observation"), timeout=120, what="an observation after an early SIGHUP")
    code, _ = daemon.terminate(timeout=30)
    stderr = daemon.stderr_text()
    assert code == 0, stderr[-2000:]
    assert "SIGHUP received before the daemon started" in stderr
    assert "reloading" not in stderr and not daemon.of("config")  # nothing to reload: no reload happened


def test_ctrl_c_while_importing_exits_130_without_traceback(tmp_path: Path,
                                                           start: Callable[[Path], RunningDaemon]) -> None:
    config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: {clip()}, fps: 5, loop: true}}"])
    daemon = _signal_while_importing(lambda: start(config), signal.SIGINT)
    code = daemon.wait(timeout=60)
    stderr = daemon.stderr_text()
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-2000:]
    assert code == 130, stderr[-2000:]


def _json_lines(text: str) -> list[dict[str, object]]:
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a stderr line is not JSON: {line!r}")
    return records


def test_json_logs_stay_json_while_opencv_and_ffmpeg_complain(prepared_models: None, tmp_path: Path,
                                                              start: Callable[[Path], RunningDaemon]) -> None:
    """USB camera 57 (V4L2 warnings from OpenCV) and RTSP to a closed port (FFmpeg's `[tcp @ 0x...]`), at debug,
    where the native details of a failure are shown too: every line still JSON."""
    retry = "reconnect: {initial_s: 0.2, max_s: 0.5}"
    config = write_config(tmp_path / "config.yaml",
                          [f"{{name: usb, source: 57, fps: 5, {retry}}}",
                           f"{{name: net, source: 'rtsp://127.0.0.1:{free_port()}/stream', fps: 5, {retry}}}"],
                          extra="logging: {format: json, level: debug}\n")
    daemon = start(config)

    def complained() -> bool:
        text = daemon.stderr_text()
        return "cap_v4l" in text and "Connection refused" in text and len(daemon.of("camera")) >= 4

    daemon.wait_for(complained, timeout=120, what="OpenCV and FFmpeg complaining about the two cameras")
    code, _ = daemon.terminate(timeout=30)
    assert code == 0, daemon.stderr_text()[-2000:]
    native = [r for r in _json_lines(daemon.stderr_text()) if r["logger"] == "native"]
    assert any("cap_v4l" in str(r["message"]) and r["level"] == "warning" for r in native), native[:5]
    assert any("Connection refused" in str(r["message"]) and r["level"] == "debug" for r in native), native[:5]


def test_a_dead_camera_is_one_warning_per_reason_without_native_noise(prepared_models: None, tmp_path: Path,
                                                                      start: Callable[[Path], RunningDaemon]) -> None:
    """Issue 26: at logging.level warning an RTSP camera to a closed port leaves a trace, one WARNING line for its
    reason however often it is retried, and none of FFmpeg's or OpenCV's per-retry lines."""
    retry = "reconnect: {initial_s: 0.2, max_s: 0.4}"
    config = write_config(tmp_path / "config.yaml",
                          [f"{{name: live, source: '{clip()}', fps: 5, loop: true}}",
                           f"{{name: gate, source: 'rtsp://127.0.0.1:{free_port()}/stream', fps: 5, {retry}}}"],
                          extra="logging: {level: warning}\n")
    daemon = start(config)
    daemon.wait_for(lambda: len([e for e in daemon.of("camera", "gate") if e["state"] == "reconnecting"]) >= 4,
                    timeout=120, what="four retries of the dead camera")
    code, _ = daemon.terminate(timeout=30)
    assert code == 0, daemon.stderr_text()[-2000:]
    lines = daemon.stderr_text().splitlines()
    about_gate = [line for line in lines if "camera gate" in line]
    assert len(about_gate) == 1 and "WARNING" in about_gate[0] and "reconnecting (" in about_gate[0], lines
    assert not [line for line in lines if "@ 0x" in line or "VIDEOIO" in line or "Connection refused" in line], lines


def test_onnxruntime_warnings_are_debug_and_json_records_without_colour(prepared_models: None) -> None:
    """ONNX Runtime warns (in colour) about the prepared detector's unused constants: shown only at debug (as JSON
    records without colour there), not at the operator's levels."""
    model = ROOT / "models" / "retinaface_mnet025.fp32.onnx"

    def native_lines(level: str) -> list[dict[str, object]]:
        code = ("import onnxruntime\n"
                "from pipeline.service.logs import setup_logging\n"
                f"setup_logging({level!r}, 'json')\n"
                f"onnxruntime.InferenceSession({str(model)!r}, providers=['CPUExecutionProvider'])\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return [r for r in _json_lines(done.stderr) if r["logger"] == "native"]

    native = native_lines("debug")
    warnings = [r for r in native if "onnxruntime" in str(r["message"]) and r["level"] == "warning"]
    assert warnings, native[:5]
    assert not any("\x1b" in str(r["message"]) for r in native)
    assert not [r for r in native_lines("info") if "onnxruntime" in str(r["message"])]


def _unit_values(key: str) -> set[str]:
    text = (ROOT / "deploy" / "emotion-pipeline.service").read_text()
    return {word for line in text.splitlines() if line.startswith(f"{key}=") for word in line.split("=", 1)[1].split()}


def test_unit_does_not_restart_exits_that_cannot_mend(tmp_path: Path) -> None:
    """A bad config and a model that does not exist (check-config cannot see that) are exits systemd must not
    restart: the codes the daemon really exits with are the unit's RestartPreventExitStatus=."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("cameras:\n  - {name: lobby, source: demo, fps: 0}\nserver: {enabled: false}\n")
    no_model = tmp_path / "no_model.yaml"
    no_model.write_text("cameras:\n  - {name: lobby, source: demo}\ndetector: {model: no_such_model}\n"
                        "server: {enabled: false}\n")
    codes = {run_cli("run", "--config", str(path), "--duration", "1").returncode for path in (bad, no_model)}
    assert codes == {2, 3}
    assert "on-failure" in _unit_values("Restart")
    assert codes <= {int(word) for word in _unit_values("RestartPreventExitStatus") if word.isdigit()}
