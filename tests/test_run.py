"""The daemon end to end, as an operator runs it: real models, a real video file, JSON lines on stdout."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, data_path, run_cli
from tests.running_daemon import (  # noqa: F401  (daemons: a fixture)
    RunningDaemon,
    daemons,
)

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, cameras: str, extra: str = "") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"cameras:\n{cameras}\n"
                    "detector: {input_size: [320, 192]}\n"
                    "behavior: {dwell_ms: 300, cooldown_ms: 800}\n"
                    "server: {enabled: false}\n" + extra)
    return path


def test_run_on_video_prints_observations_and_commands(prepared_models: None, tmp_path: Path) -> None:
    video = data_path("video", "woman_short.mp4")
    config = _config(tmp_path, f"  - {{name: lobby, source: {video}, fps: 10, loop: true}}")
    daemon = RunningDaemon(config)
    try:
        # until 20 observations and a command have come (not a fixed --duration: a slow machine only takes longer)
        daemon.wait_for(lambda: len(daemon.of("observation")) >= 20 and daemon.of("command"), 120,
                        "20 observations and a command of the smiling face")
        code, _ = daemon.terminate(timeout=15)
    finally:
        daemon.kill()
    assert code == 0, daemon.stderr_text()[-2000:]
    assert "Traceback" not in daemon.stderr_text()
    events = daemon.events
    observations = [e for e in events if e["type"] == "observation"]
    commands = [e for e in events if e["type"] == "command"]
    assert len(observations) >= 20
    with_faces = [o for o in observations if o["faces"]]
    assert len(with_faces) >= 0.8 * len(observations)
    face = with_faces[-1]["faces"][0]  # type: ignore[index]
    assert set(face) >= {"track_id", "box", "score", "landmarks", "emotion", "confidence", "probs", "smoothed"}
    assert len(face["landmarks"]) == 5 and len(face["probs"]) == 7
    assert {"total", "detect", "emotion"} <= set(with_faces[-1]["latency_ms"])  # type: ignore[arg-type]
    assert commands, "no command for a smiling face"
    command = commands[0]
    assert command["camera"] == "lobby" and command["emotion"] in face["probs"]
    assert set(command["expression"]) == {"preset", "weight", "blend_ms"}  # type: ignore[arg-type]
    assert {"style", "pitch", "rate", "volume"} <= set(command["tone"])  # type: ignore[arg-type]
    states = [e["state"] for e in events if e["type"] == "camera"]
    assert states[0] == "streaming" and states[-1] == "stopped"


def test_file_camera_that_ends_leaves_others_running(prepared_models: None, tmp_path: Path) -> None:
    video = data_path("video", "woman_short.mp4")
    cameras = (f"  - {{name: once, source: {video}, fps: 5, loop: false}}\n"
               f"  - {{name: looping, source: {video}, fps: 5, loop: true}}\n"
               f"  - {{name: missing, source: {tmp_path / 'nope.mp4'}, fps: 5, reconnect: {{initial_s: 0.5, max_s: 1}}}}")
    daemon = RunningDaemon(_config(tmp_path, cameras))

    def after_the_end() -> list[dict[str, object]]:
        """The looping camera's observations printed after `once` reported `ended` (in the order they came)."""
        events = daemon.events
        end = next((i for i, e in enumerate(events) if e["type"] == "camera" and e["state"] == "ended"), None)
        return [] if end is None else [e for e in events[end:] if e["type"] == "observation"
                                       and e["camera"] == "looping"]

    try:
        daemon.wait_for(lambda: "ended" in [e["state"] for e in daemon.of("camera", "once")], 120,
                        "the non-looping file camera ended")
        daemon.wait_for(lambda: len(after_the_end()) >= 5, 60,
                        "observations from the looping camera after the other one ended")
        daemon.wait_for(lambda: len(daemon.of("camera", "missing")) >= 3, 60, "three retries of the missing file")
        assert daemon.proc.poll() is None, "the daemon stopped while a looping camera was still running"
        code, _ = daemon.terminate(timeout=15)
    finally:
        daemon.kill()
    assert code == 0, daemon.stderr_text()[-2000:]
    events = daemon.events
    assert [e["state"] for e in daemon.of("camera", "looping")] == ["streaming", "stopped"]
    retries = [e for e in events if e["type"] == "camera" and e["camera"] == "missing"]
    assert len(retries) >= 3 and all(e["state"] == "reconnecting" for e in retries[:-1])
    assert "not found" in str(retries[0]["detail"])


def test_sigterm_stops_cleanly_with_exit_0(prepared_models: None, tmp_path: Path,
                                          daemons: Callable[..., RunningDaemon]) -> None:
    video = data_path("video", "woman_short.mp4")
    config = _config(tmp_path, f"  - {{name: lobby, source: {video}, fps: 10, loop: true}}")
    daemon = daemons(config)
    # the first observation (models loaded, camera running): SIGTERM must find the daemon running, not starting
    daemon.wait_for(lambda: daemon.of("observation"), 120, "the first observation")
    code, _ = daemon.terminate(timeout=15)
    stderr = daemon.stderr_text()
    assert code == 0, stderr[-2000:]
    assert "SIGTERM received" in stderr and "Traceback" not in stderr


def test_bad_config_exits_2_with_location_and_no_traceback(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("cameras:\n  - name: lobby\n    source: demo\n    fps: 0\n")
    done = run_cli("run", "--config", str(config), "--duration", "1")
    assert done.returncode == 2
    assert f"{config}:4: cameras[0].fps:" in done.stderr
    assert "Traceback" not in done.stderr


def test_check_config_valid_and_invalid(tmp_path: Path) -> None:
    done = run_cli("check-config", str(ROOT / "config" / "default.yaml"))
    assert done.returncode == 0 and "valid" in done.stdout
    missing = run_cli("check-config", str(tmp_path / "absent.yaml"))
    assert missing.returncode == 2 and "absent.yaml" in missing.stderr and "Traceback" not in missing.stderr


def test_corrupt_model_at_run_exits_3_naming_file(tmp_path: Path) -> None:
    """A model that ONNX Runtime cannot load is a model problem (exit 3) that names the file."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "broken.onnx").write_bytes(b"not an onnx file")
    config = _config(tmp_path, "  - {name: lobby, source: demo}")
    code = (
        "import sys, pipeline.modelprep.manifest as m, pipeline.modelprep.prepare as mm\n"
        f"m.MODELS_DIR = mm.MODELS_DIR = __import__('pathlib').Path({str(models)!r})\n"
        "import shutil, pathlib\n"
        f"for p in pathlib.Path({str(ROOT / 'models')!r}).glob('*.yaml'): shutil.copy(p, m.MODELS_DIR)\n"
        "man = m.load_manifest('retinaface_mnet025')\n"
        "man.file_for('fp32').write_bytes(b'garbage')\n"
        "man.sidecar_for('fp32').write_text('{\"sha256\": \"0\"}')\n"
        "from pipeline.tools.cli import main\n"
        f"sys.exit(main(['run', '--config', {str(config)!r}, '--duration', '1']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "retinaface_mnet025.fp32.onnx" in done.stderr and "prepare-models" in done.stderr
    assert "Traceback" not in done.stderr
