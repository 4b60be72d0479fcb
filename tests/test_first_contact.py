"""First contact (issue 12, items 11 and 13): what a person sees at a terminal, and what `analyze`, `bench` and
`--help` tell them. Terminal behaviour is exercised on a real pseudo-terminal (`pty`), the CLI as a subprocess, with
the real models and data."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import cv2
import pytest

from pipeline.inference.settings import EmotionConfig
from tests.conftest import ROOT, data_path, run_cli


def run_on_terminal(*args: str, stream: str = "stdout", timeout: float = 180) -> tuple[int, str, str]:
    """`python run_pipeline.py ARGS` with `stream` (stdout or stderr) on a 100x30 pseudo-terminal, as in an
    operator's shell, and the other stream piped. Returns (exit code, what the terminal showed, the piped text)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    on_tty = {"stdout": slave} if stream == "stdout" else {"stderr": slave}
    piped = {"stderr": subprocess.PIPE} if stream == "stdout" else {"stdout": subprocess.PIPE}
    proc = subprocess.Popen([sys.executable, str(ROOT / "run_pipeline.py"), *args], cwd=ROOT,
                            stdin=subprocess.DEVNULL, **on_tty, **piped)  # type: ignore[call-overload]
    os.close(slave)
    pipe = proc.stderr if stream == "stdout" else proc.stdout
    other: list[bytes] = []
    reader = threading.Thread(target=lambda: other.append(pipe.read()), daemon=True)
    reader.start()
    shown = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has gone
                break
            if not chunk:
                break
            shown += chunk
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    reader.join(10)
    text = shown.decode("utf-8", "replace").replace("\r\n", "\n")
    return code, text, b"".join(other).decode("utf-8", "replace")


def _demo_config(tmp_path: Path, stdout_output: str = "{type: stdout}") -> Path:
    """The first-run setup (the demo camera on the CPU) without the status server, whose port other tests use."""
    path = tmp_path / "config.yaml"
    path.write_text("cameras:\n  - {name: demo, source: demo, fps: 10}\n"
                    "detector: {input_size: [320, 256]}\n"
                    "behavior: {dwell_ms: 300, cooldown_ms: 800}\n"
                    f"outputs: [{stdout_output}]\n"
                    "server: {enabled: false}\n")
    return path


def _summary(stderr: str) -> dict[str, object]:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("summary: "))
    return json.loads(line[len("summary: "):])  # type: ignore[no-any-return]


def _dataset(root: Path, folders: dict[str, str], per_folder: int = 3) -> Path:
    """A labelled folder as people lay them out: folder name -> FER2013 emotion whose crops it links to."""
    source = data_path("faces", "fer2013")
    for folder, emotion in folders.items():
        (root / folder).mkdir(parents=True)
        for image in sorted((source / emotion).glob("*.jpg"))[:per_folder]:
            (root / folder / image.name).symlink_to(image)
    return root


# -- item 11: the daemon at a terminal ----------------------------------------------------------------------------

@pytest.mark.slow
def test_terminal_shows_readable_commands_and_camera_changes_not_json(prepared_models: None,
                                                                       tmp_path: Path) -> None:
    code, shown, stderr = run_on_terminal("run", "--config", str(_demo_config(tmp_path)), "--duration", "7")
    assert code == 0, stderr[-2000:]
    lines = [ln for ln in shown.splitlines() if ln.strip()]
    assert not [ln for ln in lines if ln.lstrip().startswith("{")], "JSON on a terminal:\n" + shown[:2000]
    camera = [ln for ln in lines if " camera " in ln]
    assert any("demo" in ln and "streaming" in ln for ln in camera), shown
    assert any("stopped" in ln for ln in camera), shown
    commands = [ln for ln in lines if " command " in ln]
    assert commands, f"no command line in 7 s of the demo's smiling faces:\n{shown}"
    assert all("-> expression" in ln and "tone" in ln for ln in commands), commands
    assert len(lines) < 40, f"{len(lines)} lines: observations are printed without being asked for"


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["format: json", "text_observations: true"])
def test_terminal_output_can_be_json_or_include_observations(prepared_models: None, tmp_path: Path,
                                                             setting: str) -> None:
    config = _demo_config(tmp_path, f"{{type: stdout, {setting}}}")
    code, shown, stderr = run_on_terminal("run", "--config", str(config), "--duration", "4")
    assert code == 0, stderr[-2000:]
    lines = [ln for ln in shown.splitlines() if ln.strip()]
    if setting == "format: json":
        events = [json.loads(ln) for ln in lines]
        assert {"observation", "camera"} <= {e["type"] for e in events}
    else:
        frames = [ln for ln in lines if " observation " in ln and "faces" in ln]
        assert len(frames) >= 10, shown[:2000]
        assert not [ln for ln in lines if ln.lstrip().startswith("{")]


@pytest.mark.slow
def test_format_text_when_piped_and_json_stays_the_default_there(prepared_models: None, tmp_path: Path) -> None:
    """`format: text` is honoured off a terminal too; check-config shows the format of the stdout output."""
    config = _demo_config(tmp_path, "{type: stdout, format: text}")
    checked = run_cli("check-config", str(config))
    assert checked.returncode == 0 and "format text" in checked.stdout, checked.stdout + checked.stderr
    done = run_cli("run", "--config", str(config), "--duration", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    assert lines and not [ln for ln in lines if ln.startswith("{")]
    assert any("demo" in ln and "streaming" in ln for ln in lines)


# -- item 13: analyze ---------------------------------------------------------------------------------------------

def test_analyze_shows_progress_on_a_terminal_and_keeps_stdout_clean(prepared_models: None) -> None:
    video = data_path("video", "woman_short.mp4")
    code, shown, stdout = run_on_terminal("analyze", str(video), "--every", "10", "--log-level", "warning",
                                          stream="stderr")
    assert code == 0, shown[-2000:]
    assert "12/12" in shown and "%|" in shown, f"no progress bar on the terminal:\n{shown[-2000:]}"
    assert [json.loads(ln)["frame"] for ln in stdout.splitlines()] == list(range(0, 115, 10))
    piped = run_cli("analyze", str(video), "--every", "40", "--log-level", "warning")
    assert piped.returncode == 0 and "%|" not in piped.stderr  # no bar in a log file


@pytest.mark.parametrize("content", ["empty", "broken"])
def test_analyze_with_nothing_readable_exits_2_without_a_zero_summary(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "notes.txt").write_text("not an image")
    if content == "broken":
        (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    done = run_cli("analyze", str(folder), "--log-level", "warning")
    assert done.returncode == 2, done.stderr
    assert "summary:" not in done.stderr and "Traceback" not in done.stderr
    assert str(folder) in done.stderr or "broken.jpg" in done.stderr


def test_analyze_maps_label_synonyms_and_names_folders_it_cannot_map(prepared_models: None,
                                                                     tmp_path: Path) -> None:
    dataset = _dataset(tmp_path / "dataset", {"anger": "angry", "Happiness": "happy", "sadness": "sad",
                                              "SURPRISED": "surprise", "calm": "neutral"})
    done = run_cli("analyze", "--cropped", str(dataset), "--log-level", "warning")
    assert done.returncode == 0, done.stderr[-2000:]
    labels = {Path(r["source"]).parent.name: r.get("label") for r in map(json.loads, done.stdout.splitlines())}
    assert labels == {"anger": "angry", "Happiness": "happy", "sadness": "sad", "SURPRISED": "surprise",
                      "calm": None}
    summary = _summary(done.stderr)
    assert summary["images"] == 15 and summary["labelled"] == 12
    assert summary["unlabelled_folders"] == {"calm": 3}
    warning = next(ln for ln in done.stderr.splitlines() if "WARNING" in ln and "calm" in ln)
    assert "unlabelled" in warning


def test_analyze_says_when_photos_are_smaller_than_min_face_px(prepared_models: None, tmp_path: Path) -> None:
    crop = cv2.imread(str(sorted(data_path("faces", "fer2013", "happy").glob("*.jpg"))[0]))
    if crop is None:
        pytest.fail("cannot read the FER2013 crop")
    tiny = tmp_path / "tiny.png"
    cv2.imwrite(str(tiny), cv2.resize(crop, (24, 24)))
    done = run_cli("analyze", str(tiny), "--log-level", "warning")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _summary(done.stderr)["smaller_than_min_face_px"] == 1
    warning = next(ln for ln in done.stderr.splitlines() if "min_face_px" in ln)
    assert "tiny.png" in warning and "--cropped" in warning


def test_analyze_cropped_does_not_load_the_detector(prepared_models: None) -> None:
    image = sorted(data_path("faces", "fer2013", "happy").glob("*.jpg"))[0]
    done = run_cli("analyze", "--cropped", str(image), "--log-level", "info")
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(json.loads(done.stdout)["faces"]) == 1
    assert EmotionConfig().model in done.stderr  # the (default) emotion model is loaded (and logged) ...
    assert "retinaface" not in done.stderr  # ... the detector is not


def test_analyze_and_bench_analyze_say_which_detector_input(prepared_models: None, tmp_path: Path) -> None:
    video = data_path("video", "woman_short.mp4")
    plain = run_cli("analyze", str(video), "--every", "40", "--log-level", "warning")
    assert plain.returncode == 0, plain.stderr[-2000:]
    # config/default.yaml's detector.input_size auto: the 596x336 clip padded to multiples of 32, not enlarged
    assert _summary(plain.stderr)["detector_input"] == "608x352"
    out = tmp_path / "bench.json"
    bench = run_cli("bench", "analyze", "--video", str(video), "--repeat", "1", "--log-level", "warning",
                    "--json", str(out))
    assert bench.returncode == 0, bench.stderr[-2000:]
    said = next(ln for ln in bench.stdout.splitlines() if "detector input" in ln)
    assert "320x192" in said and "auto (long side 640)" in said
    result = json.loads(out.read_text())
    assert result["detector_input"] == "320x192" and result["analyze_detector_input"] == "auto (long side 640)"


# -- item 13: bench and --help ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_bench_pipeline_runs_without_video_on_the_demo_clip(prepared_models: None, tmp_path: Path) -> None:
    out = tmp_path / "pipeline.json"
    done = run_cli("bench", "pipeline", "--cameras", "1", "--fps", "5", "--duration", "1", "--mode", "batched",
                   "--log-level", "warning", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["video"] == "demo"
    assert result["results"][0]["analysed_per_s"] > 0


@pytest.mark.parametrize("command", [["analyze"], ["bench"], ["bench", "analyze"], ["bench", "pipeline"],
                                     ["bench", "engine"], ["run"], ["check-config"]])
def test_help_describes_config_and_paths_with_examples(command: list[str]) -> None:
    done = run_cli(*command, "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps help texts at the terminal's width
    if command != ["bench"] and command != ["check-config"]:
        assert "--config PATH YAML config" in text, done.stdout
    if command in (["analyze"], ["bench"]) or command[0] == "bench":
        assert "examples:" in done.stdout, done.stdout
    if command == ["analyze"]:
        assert "PATH image, video or folder" in text
    if command == ["check-config"]:
        assert "the YAML config file to validate" in text
