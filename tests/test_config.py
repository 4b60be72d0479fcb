"""Configuration models and loader: every invalid fixture fails at the line and key its `# expect:` comment names."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from pipeline.config.app import (
    AppConfig,
    CameraConfig,
    ConfigError,
    ConfigIssue,
    ServerConfig,
    WebsocketOutput,
    default_rules,
    load_config,
    parse_config,
    summarize,
)
from pipeline.core.types import EMOTIONS

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "config"
EXPECT = re.compile(r"^# expect: (?P<line>\d+): (?P<key>\S+): (?P<fragment>.+)$")
EXAMPLE_ENV = {"CAM_USER": "viewer", "CAM_PASS": "hunter2", "EMOTION_TOKEN": "tok-123"}
MINIMAL = "cameras:\n  - {name: lobby, source: demo}\n"


def _fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.yaml"))


def _expectation(path: Path) -> tuple[int, str, str]:
    first = path.read_bytes().split(b"\n", 1)[0].decode("ascii")
    match = EXPECT.match(first)
    assert match, f"{path.name}: first line must be '# expect: LINE: key.path: fragment'"
    key = "" if match["key"] == "-" else match["key"]
    return int(match["line"]), key, match["fragment"]


def test_there_are_many_invalid_fixtures() -> None:
    assert len(_fixtures()) >= 25


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.stem)
def test_invalid_fixture_reports_line_and_key(path: Path) -> None:
    line, key, fragment = _expectation(path)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    matching = [issue for issue in caught.value.issues if issue.line == line and issue.key == key]
    assert matching, f"no issue at line {line} key {key!r}; got:\n{caught.value}"
    texts = [issue.format() for issue in matching]
    assert any(fragment in text and str(path) in text for text in texts), "\n".join(texts)


@pytest.mark.parametrize(
    ("name", "env"),
    [("default.yaml", {}), ("examples/kiosk-webcam.yaml", {}), ("examples/gpu-8-rtsp.yaml", EXAMPLE_ENV),
     ("examples/gpu-64-cameras.yaml", EXAMPLE_ENV), ("examples/gpu-150-cameras.yaml", EXAMPLE_ENV)],
)
def test_shipped_configs_load(name: str, env: dict[str, str]) -> None:
    config = load_config(ROOT / "config" / name, env=env)
    assert config.cameras
    assert summarize(config)


def test_default_config_runs_anywhere() -> None:
    config = load_config(ROOT / "config" / "default.yaml", env={})
    assert [(c.name, c.source, c.fps) for c in config.cameras] == [("demo", "demo", 10)]
    assert config.detector.input_size == "auto" and config.detector.max_input_side == 640
    assert (config.inference.backend, config.inference.device, config.inference.precision) == (
        "onnxruntime", "cpu", "fp32")
    assert [o.type for o in config.outputs] == ["stdout"]
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8080)


def test_gpu_example_substitutes_environment() -> None:
    config = load_config(ROOT / "config" / "examples" / "gpu-8-rtsp.yaml", env=EXAMPLE_ENV)
    assert len(config.cameras) == 8
    assert config.cameras[0].source == "rtsp://viewer:hunter2@10.0.0.11:554/stream1"
    assert config.cameras[0].source_kind == "rtsp"
    assert config.server.token == "tok-123"
    assert (config.inference.device, config.inference.precision, config.inference.max_batch) == ("cuda", "fp16", 64)
    assert config.inference.lanes == 1 and config.inference.graph_frames  # the frame graphs path: one lane


def test_kiosk_example_hints() -> None:
    config = load_config(ROOT / "config" / "examples" / "kiosk-webcam.yaml", env={})
    camera = config.cameras[0]
    assert (camera.source, camera.source_kind, camera.width, camera.height, camera.fourcc) == (
        0, "index", 1280, 720, "MJPG")
    assert {o.type for o in config.outputs} == {"websocket", "osc"}


def test_env_default_used_when_unset_or_empty_and_value_when_set() -> None:
    text = "cameras:\n  - name: lobby\n    source: ${CAM:-demo}\n    fps: ${FPS:-12}\n"
    assert parse_config(text, env={}).cameras[0].source == "demo"
    assert parse_config(text, env={"CAM": ""}).cameras[0].source == "demo"
    config = parse_config(text, env={"CAM": "clip.mp4", "FPS": "7.5"})
    assert (config.cameras[0].source, config.cameras[0].fps) == ("clip.mp4", 7.5)
    assert parse_config(text, env={"CAM": "2"}).cameras[0].source == 2  # digit strings are camera indexes


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFIG_TEST_SOURCE", "/dev/video2")
    config = parse_config("cameras:\n  - {name: usb, source: '${CONFIG_TEST_SOURCE}'}\n")
    assert (config.cameras[0].source, config.cameras[0].source_kind) == ("/dev/video2", "device")


def test_unset_variable_names_variable_and_line() -> None:
    text = "cameras:\n  - name: lobby\n    source: demo\n    fps: ${NO_SUCH_FPS}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "cfg.yaml", env={})
    assert [issue.format() for issue in caught.value.issues] == [
        "cfg.yaml:4: cameras[0].fps: environment variable NO_SUCH_FPS is not set "
        "(export it, or write ${NO_SUCH_FPS:-default})"]


def test_password_never_appears_in_errors() -> None:
    text = "cameras:\n  - name: lobby\n    source: rtsp://u:secret@h/x\n    fps: 0\n    nope: rtsp://a:secret@h\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "cfg.yaml", env={})
    message = str(caught.value)
    assert "cameras[0].fps" in message and "cameras[0].nope" in message
    assert "secret" not in message


def test_password_from_environment_is_scrubbed_even_when_unmaskable() -> None:
    # '@' in a password is not valid URL syntax, so mask_secrets cannot find its end; the env value is scrubbed.
    text = "cameras:\n  - name: lobby\n    source: rtmp://u:${CAM_PASS}@h/x\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={"CAM_PASS": "p@ss/word"})
    assert "p@ss" not in str(caught.value) and "ss/word" not in str(caught.value)


def test_summarize_masks_password() -> None:
    config = parse_config("cameras:\n  - {name: lobby, source: 'rtsp://u:secret@h/x'}\n", env={})
    summary = summarize(config)
    assert "secret" not in summary
    assert "rtsp://u:***@h/x" in summary
    assert "http://127.0.0.1:8080/" in summary


def test_rules_merge_over_defaults() -> None:
    text = MINIMAL + (
        "behavior:\n  rules:\n    happy:\n      expression: {preset: happy, weight: 0.5}\n"
        "      tone: {style: excited, rate: 1.2}\n")
    behavior = parse_config(text, env={}).behavior
    assert list(behavior.rules) == list(EMOTIONS)
    assert behavior.rule_for("happy").expression.weight == 0.5
    assert behavior.rule_for("happy").tone.rate == "1.2"
    assert behavior.rule_for("sad") == default_rules()["sad"]
    assert behavior.rule_for("angry").expression.preset == "relaxed"
    assert behavior.rule_for("something-else") == behavior.rules["neutral"]


def test_defaults_without_rules_cover_every_emotion() -> None:
    behavior = parse_config(MINIMAL, env={}).behavior
    assert set(behavior.rules) == set(EMOTIONS)
    assert behavior.rules["fear"].expression.preset == "relaxed"


def test_source_kinds() -> None:
    kinds = {"demo": "demo", 0: "index", "/dev/video0": "device", "clip.mp4": "file",
             "rtsps://h/x": "rtsp", "https://h/mjpg": "http"}
    for source, kind in kinds.items():
        assert CameraConfig(name="c", source=source).source_kind == kind


def test_outputs_default_to_stdout_and_parse_union() -> None:
    assert [o.type for o in parse_config(MINIMAL, env={}).outputs] == ["stdout"]
    config = parse_config(MINIMAL + "outputs:\n  - {type: websocket, queue_size: 8}\n", env={})
    assert isinstance(config.outputs[0], WebsocketOutput) and config.outputs[0].queue_size == 8


def test_loopback_hosts_need_no_token() -> None:
    for host in ("127.0.0.1", "127.3.2.1", "::1", "localhost"):
        assert ServerConfig(host=host).token is None
    assert ServerConfig(host="0.0.0.0", token="t").token == "t"


def test_missing_file_has_no_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(missing)
    assert caught.value.issues == [ConfigIssue(str(missing), None, "", "file not found")]
    assert str(caught.value) == f"{missing}: file not found"


def test_issue_format_variants() -> None:
    assert ConfigIssue("f.yaml", 3, "a.b", "bad", 5).format() == "f.yaml:3: a.b: bad (got 5)"
    assert ConfigIssue("f.yaml", 3, "a.b", "bad").format() == "f.yaml:3: a.b: bad"
    assert ConfigIssue("f.yaml", None, "a", "bad", None).format() == "f.yaml: a: bad (got null)"
    long_value = ConfigIssue("f", 1, "k", "m", "x" * 500).format()
    assert len(long_value) < 120 and long_value.endswith("...)")


def test_all_errors_reported_together() -> None:
    text = "cameras:\n  - {name: Bad, source: demo}\ndetector: {score_threshold: 2}\nlogging: {level: loud}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={})
    assert [(i.line, i.key) for i in caught.value.issues] == [
        (2, "cameras[0].name"), (3, "detector.score_threshold"), (4, "logging.level")]


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def test_every_field_has_a_description() -> None:
    seen: set[type[BaseModel]] = set()
    pending: list[type[BaseModel]] = [AppConfig]
    undocumented = []
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            if not (info.description or "").strip():
                undocumented.append(f"{model.__name__}.{name}")
            pending.extend(_models_in(info.annotation))
    assert len(seen) >= 15  # walked into every section, rule and output model
    assert not undocumented, f"fields without description: {undocumented}"
