"""`inference.backend: triton` against a real Triton Inference Server (issue 15, items 1 and 3).

The server is the `tritonserver` 2.51 binary of the nvidia-pytriton wheel (tests/servers/triton.py), serving our
prepared ONNX through Python-backend models with the production repository's tensors. What is checked:
- the same faces (within a pixel) and probabilities (within 1e-4) through Triton as in-process, on real video frames;
- a server killed and restarted under a running daemon: batches fail only while it is down, /healthz and /metrics
  say so, the camera keeps running and the daemon recovers by itself;
- a server whose model has another input name: a clear error naming model, tensor, expected and got;
- `prepare-models --triton-repo DIR` writes config.pbtxt files that parse as Triton's ModelConfig and name our
  tensors, beside a copy of the prepared ONNX;
- the settings: url required, frame graphs refused, the token never shown.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.conftest import ROOT, data_path, run_cli
from tests.running_daemon import RunningDaemon, free_port, wait_until, write_config
from tests.servers.triton import TritonServer, triton_missing, write_test_repository
from tests.test_frames_path import _frames

DETECTOR, EMOTION = "retinaface_mnet025", "mini_xception_fer2013"  # the 64 px model: serving mechanics, cheaply
PIN_EMOTION = f"emotion: {{model: {EMOTION}}}\n"  # the configs below run it instead of the default model
RENAMED = "emotion_renamed_input"  # the emotion model served with another input name


def _model_file(name: str) -> Path:
    return ROOT / "models" / f"{name}.fp32.onnx"


def _config_with_emotion_model(tmp_path: Path) -> Path:
    """config/default.yaml with the emotion model these tests serve."""
    path = tmp_path / "default-with-model.yaml"
    path.write_text((ROOT / "config" / "default.yaml").read_text().replace(
        "model: dlibface_emotion150", f"model: {EMOTION}"))
    return path


def _rename_input(repo: Path, name: str, old: str, new: str) -> None:
    config = repo / name / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{old}"', f'name: "{new}"'))


@pytest.fixture(scope="module")
def triton(prepared_models: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One server for the module: detector, emotion, and the emotion model with a renamed input."""
    missing = triton_missing()
    if missing:
        pytest.skip(missing)
    repo = write_test_repository(tmp_path_factory.mktemp("triton-repo"), [
        (DETECTOR, _model_file(DETECTOR)), (EMOTION, _model_file(EMOTION)), (RENAMED, _model_file(EMOTION))])
    _rename_input(repo, RENAMED, "image", "input_1")
    with TritonServer(repo) as server:
        yield server


def _triton_settings(url: str, **extra: Any) -> Any:
    from pipeline.inference.settings import InferenceConfig

    return InferenceConfig.model_validate({"backend": "triton", "triton": {"url": url, **extra}})


def test_results_through_triton_equal_in_process(triton: TritonServer, perception: Any, app_config: Any) -> None:
    from pipeline.inference.perception import Perception

    frames = _frames(data_path("video", "woman_short.mp4"), 8, 7)
    assert len(frames) == 8
    cfg = SimpleNamespace(detector=app_config.detector, emotion=app_config.emotion,
                          inference=_triton_settings(triton.url))
    remote = Perception.from_config(cfg, auto_prepare=False)
    try:
        assert remote.detector.model.backend.name == "triton"
        faces_seen = 0
        for frame in frames:
            local_faces, local_scores, _ = perception.analyze(frame)
            faces, scores, _ = remote.analyze(frame)
            assert len(faces) == len(local_faces)
            for face, local in zip(faces, local_faces):
                assert np.allclose(face.box, local.box, atol=1.0), (face.box, local.box)
            for score, local_score in zip(scores, local_scores):
                assert np.allclose(score.probs, local_score.probs, atol=1e-4), (score.probs, local_score.probs)
            faces_seen += len(faces)
        assert faces_seen >= 6  # the clip has a face in (almost) every frame: the comparison compared something
    finally:
        remote.close()


def test_metadata_mismatch_is_a_clear_error(triton: TritonServer, app_config: Any) -> None:
    from pipeline.inference.backend import BackendError
    from pipeline.inference.perception import load_batched_model
    from pipeline.modelprep.manifest import load_manifest

    cfg = _triton_settings(triton.url, models={EMOTION: {"name": RENAMED}})
    with pytest.raises(BackendError) as caught:
        load_batched_model(load_manifest(EMOTION), cfg, auto_prepare=False)
    message = str(caught.value)
    assert f"model {RENAMED}: input image: expected UINT8 [-1, 64, 64, 1], got no such input" in message
    assert "input_1" in message and triton.url in message


def test_metadata_mismatch_names_dtype_and_shape() -> None:
    from pipeline.inference.triton import metadata_mismatches
    from pipeline.modelprep.triton_repo import onnx_signature

    served = {"inputs": [{"name": "image", "datatype": "FP32", "shape": ["-1", "48", "48", "1"]}],
              "outputs": [{"name": "probs", "datatype": "FP32", "shape": ["-1", "7"]}]}
    problems = metadata_mismatches("m", onnx_signature(_model_file(EMOTION)), served)
    assert problems == ["model m: input image: expected UINT8 [-1, 64, 64, 1], got FP32 [-1, 48, 48, 1]"]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _get_json(url: str) -> dict[str, Any]:
    try:
        return dict(json.loads(_get(url)[1]))
    except (OSError, ValueError):
        return {}


def _metric(text: str, name: str, model: str) -> float:
    match = re.search(rf'^{name}{{model="{model}"}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def test_server_killed_and_restarted_the_daemon_recovers(triton: TritonServer, tmp_path: Path) -> None:
    port = free_port()
    extra = ("inference: {backend: triton, max_delay_ms: 2, triton: {url: '%s', timeout_ms: 1000, "
             "reconnect_min_s: 0.2, reconnect_max_s: 0.5, token: s3cret-triton-token}}\n" % triton.url) + PIN_EMOTION
    config = write_config(tmp_path / "config.yaml", [f"{{name: lobby, source: '{data_path('video', 'woman_short.mp4')}',"
                                                     " fps: 10, loop: true}"], extra, port=port)
    base = f"http://127.0.0.1:{port}"
    triton.kill()  # the daemon starts without its server: it runs, and says so
    daemon = RunningDaemon(config)
    try:
        daemon.wait_for(lambda: _get_json(base + "/healthz").get("backends", {}).get(DETECTOR) == "failing", 60,
                        "/healthz naming the unreachable server after start")
        assert daemon.proc.poll() is None and not daemon.of("observation")
        triton.start()
        daemon.wait_for(lambda: len(daemon.of("observation")) >= 3, 60, "observations through Triton")
        triton.kill()
        assert wait_until(lambda: _get(base + "/healthz")[0] == 503, 20), _get(base + "/healthz")
        status, body = _get(base + "/healthz")
        health = json.loads(body)
        assert any(f"model {DETECTOR}" in p and "unreachable" in p for p in health["problems"]), health
        assert health["cameras"]["lobby"] == "ok" and health["backends"][DETECTOR] == "failing"
        assert all(state == "ok" for state in health["stages"].values()), health["stages"]  # nothing wedged
        assert _metric(_get(base + "/metrics")[1], "emotion_backend_up", DETECTOR) == 0.0
        seen = len(daemon.of("observation"))
        triton.start()
        daemon.wait_for(lambda: len(daemon.of("observation")) >= seen + 5, 30, "observations after the restart")
        assert wait_until(lambda: _get(base + "/healthz")[0] == 200, 10), _get(base + "/healthz")
        metrics = _get(base + "/metrics")[1]
        assert _metric(metrics, "emotion_backend_up", DETECTOR) == 1.0
        assert _metric(metrics, "emotion_backend_reconnects_total", DETECTOR) >= 2.0  # after start, after the kill
        failed = _metric(metrics, "emotion_model_failed_total", DETECTOR)
        assert failed >= 1.0  # batches failed while it was down …
        daemon.wait_for(lambda: len(daemon.of("observation")) >= seen + 15, 30, "more observations")
        assert _metric(_get(base + "/metrics")[1], "emotion_model_failed_total", DETECTOR) == failed  # … only then
        assert daemon.proc.poll() is None
        code, _ = daemon.terminate(timeout=15)
        stderr = daemon.stderr_text()
        assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
        assert "s3cret-triton-token" not in stderr + daemon.stdout_text()
    finally:
        daemon.kill()
        if triton.proc is None:  # leave the module's server running for the other tests
            triton.start()


def test_prepare_models_writes_a_triton_repository(prepared_models: None, tmp_path: Path) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    repo = tmp_path / "repo"
    done = run_cli("prepare-models", "--triton-repo", str(repo), "--config", str(_config_with_emotion_model(tmp_path)))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = {DETECTOR: (["image"], ["top_score", "top_anchor", "top_loc", "top_landmarks"]),
                EMOTION: (["image"], ["probs"])}
    for name, (inputs, outputs) in expected.items():
        config = text_format.Parse((repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        assert config.name == name and config.platform == "onnxruntime_onnx" and config.max_batch_size == 32
        assert config.HasField("dynamic_batching") and config.instance_group[0].count == 1
        assert [t.name for t in config.input] == inputs and [t.name for t in config.output] == outputs
        assert (repo / name / "1" / "model.onnx").read_bytes() == _model_file(name).read_bytes()
    emotion = text_format.Parse((repo / EMOTION / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert list(emotion.input[0].dims) == [64, 64, 1] and list(emotion.output[0].dims) == [7]
    assert model_config_pb2.DataType.Name(emotion.input[0].data_type) == "TYPE_UINT8"
    assert model_config_pb2.DataType.Name(emotion.output[0].data_type) == "TYPE_FP32"
    assert emotion.dynamic_batching.max_queue_delay_microseconds == 0  # merge what is queued, hold nothing back


def test_triton_repository_with_a_queue_delay(prepared_models: None, tmp_path: Path) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    repo = tmp_path / "repo"
    done = run_cli("prepare-models", "--triton-repo", str(repo), "--triton-queue-delay-us", "500",
                   "--config", str(_config_with_emotion_model(tmp_path)))
    assert done.returncode == 0, done.stderr[-2000:]
    for name in (DETECTOR, EMOTION):
        config = text_format.Parse((repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        assert config.dynamic_batching.max_queue_delay_microseconds == 500
    refused = run_cli("prepare-models", "--triton-repo", str(repo), "--triton-queue-delay-us", "-1")
    assert refused.returncode == 2 and "--triton-queue-delay-us" in refused.stderr and "Traceback" not in refused.stderr


def test_triton_settings_rules(tmp_path: Path) -> None:
    from pipeline.config.app import ConfigError, load_config, summarize

    config = tmp_path / "c.yaml"
    cameras = "cameras:\n  - {name: a, source: demo}\n"
    config.write_text(cameras + "inference:\n  backend: triton\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert "inference.triton: backend triton needs the server's gRPC address" in str(caught.value)
    config.write_text(cameras + "inference:\n  backend: triton\n  frame_path: graph\n  triton: {url: 'h:8001'}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert "c.yaml:5: inference.frame_path: frame_path graph is not supported with backend triton" in \
        str(caught.value)
    config.write_text(cameras + "inference:\n  backend: triton\n  triton: {url: 'h:8001', token: t0ken-xyz}\n")
    loaded = load_config(config)
    shown = summarize(loaded) + repr(loaded) + str(loaded.model_dump())
    assert "t0ken-xyz" not in shown and "token ***" in summarize(loaded)
    assert loaded.inference.triton.token.get_secret_value() == "t0ken-xyz"


def test_fleet_example_uses_triton() -> None:
    from pipeline.config.app import load_config, summarize

    example = ROOT / "config" / "examples" / "kiosk-fleet-triton.yaml"
    config = load_config(example, env={"MQTT_PASSWORD": "pw", "KIOSK_SITE": "k1", "TRITON_TOKEN": "tok-9f2e"})
    assert config.inference.backend == "triton" and config.inference.triton.url == "triton.store.lan:8001"
    assert "tok-9f2e" not in summarize(config) and "token ***" in summarize(config)


@pytest.mark.slow
def test_bench_pipeline_reports_tritons_batching(triton: TritonServer, tmp_path: Path) -> None:
    """`bench pipeline --backend triton`: the cameras' frames go through the server, and the figures include the
    server's own counters over the measured window (items per model execution: its dynamic batcher at work)."""
    video = data_path("video", "woman_short.mp4")
    out = tmp_path / "bench.json"
    done = run_cli("bench", "pipeline", "--video", str(video), "--cameras", "2", "--fps", "10", "--duration", "3",
                   "--mode", "batched", "--backend", "triton", "--triton-url", triton.url, "--log-level", "warning",
                   "--json", str(out), "--config", str(_config_with_emotion_model(tmp_path)), timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(out.read_text())["results"][0]
    assert run["backend"] == "triton" and run["analysed_per_s"] > 0
    for model in (DETECTOR, EMOTION):
        window = run["triton"][model]
        assert window["items"] > 0 and window["executions"] > 0, window
        assert window["items_per_execution"] >= 1.0 and window["requests"] > 0
        assert window["items"] >= window["requests"] >= window["executions"]  # batches of frames, merged requests
    assert f"Triton {DETECTOR} (all its clients):" in done.stdout
