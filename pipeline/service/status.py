"""What the daemon says about itself: health (for /healthz and the systemd watchdog), the /api/status document, and
the one-line summary for systemd's STATUS=.

Two kinds of trouble are kept apart on purpose:
- a *stage* problem (a worker that stopped beating, a dead batcher, mapper, output or server thread) means the
  process is wedged: the watchdog ping is withheld and systemd restarts the service;
- a *camera* problem (no frame within stall_s) is the outside world's: /healthz fails and names the camera, but a
  restart would not bring a dead RTSP server back, so the watchdog keeps being fed and capture keeps retrying;
- an *output* problem (a webhook that cannot be reached, an OSC receiver that is gone: events given up on) is the
  outside world's too: /healthz fails (503) naming the output and its last error, the watchdog is still fed.

An output counts as failing once OUTPUT_FAILURES deliveries in a row failed (events, or a stream's bundles), or when nothing was delivered
for OUTPUT_FAILING_S since a delivery failed (an output that gets one command a minute still shows up); it is
healthy again with its next delivered event. A `websocket` output with no clients connected is not a problem: it
has nobody to deliver to, which is not a failure (clients come and go; one too slow is dropped and counted in
`websocket.clients_dropped`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.core.redact import mask_secrets
from pipeline.inference.perception import RESULT_TIMEOUT_S
from pipeline.service.snapshot import (
    CameraView,
    DaemonSnapshot,
    ModelView,
    OutputView,
    now_or,
)

# A worker beats once per loop: at least every 0.25 s when idle, once per frame otherwise; one frame may wait for
# two model results (RESULT_TIMEOUT_S each) before the worker gives up on it.
WORKER_STALE_S = 2 * RESULT_TIMEOUT_S + 5.0
MAPPER_STALE_S = 5.0
OUTPUT_FAILURES = 3
OUTPUT_FAILING_S = 30.0


@dataclass
class HealthReport:
    status: str  # ok | failing | starting
    cameras: dict[str, str] = field(default_factory=dict)
    stages: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)  # remote backends only (triton), by model name
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self, uptime_s: float) -> dict[str, Any]:
        return {"status": self.status, "uptime_s": round(uptime_s, 1), "problems": self.problems,
                "cameras": self.cameras, "stages": self.stages, "outputs": self.outputs, "backends": self.backends}


def camera_problem(cam: CameraView, now: float) -> str | None:
    """Why this camera is not healthy now, or None. An ended file is not a problem; a camera is healthy once frames
    flow, and stays so while the newest is at most stall_s old."""
    stall_s = cam.stall_s
    if cam.state == "ended":
        return None
    if cam.last_frame_mono is not None:
        age = now - cam.last_frame_mono
        if age <= stall_s:
            return None
        return f"camera {cam.name}: no frame for {age:.1f} s (stall_s {stall_s:g}, {cam.state})"
    # Never connected: not healthy, from the start (it used to pass as ok for its first stall_s); the wording says
    # whether it is still opening or has already failed.
    since = now - cam.started_mono
    if since <= stall_s and cam.state == "starting":
        return f"camera {cam.name}: connecting, no frame yet ({since:.1f} s)"
    return f"camera {cam.name}: no frame since start {since:.1f} s ago ({cam.state})"


def output_problem(out: OutputView, now: float) -> str | None:
    """Why this output is not delivering, or None: OUTPUT_FAILURES events in a row given up on, or no delivery for
    OUTPUT_FAILING_S since one failed. A dead thread is a stage problem instead (see stage_problems)."""
    delivery = out.delivery
    if not delivery.failures_in_row or delivery.failing_since_mono is None:
        return None
    failing_for = max(0.0, now - delivery.failing_since_mono)
    if delivery.failures_in_row < OUTPUT_FAILURES and failing_for < OUTPUT_FAILING_S:
        return None
    return (f"output {out.label}: {delivery.failures_in_row} deliveries in a row failed "
            f"(failing for {failing_for:.0f} s): {delivery.last_error}")


def backend_problem(model: ModelView) -> str | None:
    """Why this model's batches cannot run now (a Triton server that cannot be reached), or None. The outside
    world's trouble, like a camera's: /healthz fails naming it, the watchdog is still fed, the backend retries."""
    health = model.health
    if health.up:
        return None
    return f"model {model.name}: {health.problem or 'backend down'}"


def _camera_stage_problems(cam: CameraView, now: float) -> dict[str, str]:
    """A capture thread that died early, or a worker that died (while its capture still delivers) or stopped beating."""
    problems: dict[str, str] = {}
    ended = cam.state == "ended"
    if not ended and not cam.capture_alive:
        problems[f"capture-{cam.name}"] = "thread ended"
    if not cam.worker_alive:
        if not ended and not cam.slot_closed:
            problems[f"worker-{cam.name}"] = "thread ended"
    elif now - cam.worker_heartbeat > WORKER_STALE_S:
        problems[f"worker-{cam.name}"] = f"no heartbeat for {now - cam.worker_heartbeat:.0f} s"
    return problems


def stage_problems(snapshot: DaemonSnapshot, now: float | None = None) -> dict[str, str]:
    """Every pipeline stage with a stale heartbeat or a dead thread, as {stage: reason}; empty when all is well."""
    now = now_or(snapshot, now)
    problems: dict[str, str] = {}
    for cam in snapshot.cameras:
        problems.update(_camera_stage_problems(cam, now))
    for model in snapshot.models:
        if not model.alive:
            problems[f"batcher-{model.name}"] = "a batching thread ended"
    if snapshot.started:
        if not snapshot.mapper_alive:
            problems["behavior"] = "thread ended"
        elif now - snapshot.mapper_heartbeat > MAPPER_STALE_S:
            problems["behavior"] = f"no heartbeat for {now - snapshot.mapper_heartbeat:.0f} s"
        for out in snapshot.outputs:
            if not out.alive:
                problems[f"output-{out.label}"] = "thread ended"
    if snapshot.server_present and not snapshot.server_alive:
        problems["server"] = "thread ended"
    return problems


def check_health(snapshot: DaemonSnapshot, now: float | None = None) -> HealthReport:
    """The /healthz answer: every camera fresh (or ended) and every stage beating."""
    now = now_or(snapshot, now)
    report = HealthReport("ok")
    for cam in snapshot.cameras:
        problem = camera_problem(cam, now)
        report.cameras[cam.name] = "ok" if problem is None else "failing"
        if problem:
            report.problems.append(problem)
    stages = stage_problems(snapshot, now)
    for stage, reason in stages.items():
        report.problems.append(f"{stage}: {reason}")
    for model in snapshot.models:
        problem = backend_problem(model)
        if model.health.remote:
            report.backends[model.name] = "ok" if problem is None else "failing"
        if problem:
            report.problems.append(problem)
    for out in snapshot.outputs:
        problem = output_problem(out, now)
        dead = snapshot.started and not out.alive  # named among the stage problems above
        report.outputs[out.label] = "failing" if problem or dead else "ok"
        if problem:
            report.problems.append(problem)
    report.stages = {name: "ok" for name in _stage_names(snapshot)} | {k: "failing" for k in stages}
    if not snapshot.ready:
        report.status = "starting"
        report.problems.insert(0, "starting: models loading or cameras opening")
    elif report.problems:
        report.status = "failing"
    return report


def _stage_names(snapshot: DaemonSnapshot) -> list[str]:
    names = []
    for cam in snapshot.cameras:
        names += [f"capture-{cam.name}", f"worker-{cam.name}"]
    names += [f"batcher-{model.name}" for model in snapshot.models]
    if snapshot.started:
        names.append("behavior")
        names += [f"output-{out.label}" for out in snapshot.outputs]
    if snapshot.server_present:
        names.append("server")
    return names


def _model_status(model: ModelView, cfg: Any) -> dict[str, Any]:
    stats = model.stats
    batches = max(1, stats.batches)
    described = model.described
    return {
        "name": model.name, "backend": described.get("backend", model.backend_name or cfg.backend),
        "device": described.get("device", cfg.device), "precision": described.get("precision", cfg.precision),
        "file": described.get("file"), "max_batch": model.max_batch, "lanes": model.lanes,
        "batches": stats.batches, "items": stats.items, "mean_batch": round(stats.items / batches, 2),
        "rejected": stats.rejected, "failed": stats.failed,
        "mean_queue_ms": round(stats.queue_s * 1000.0 / max(1, stats.items), 2),
        "mean_compute_ms": round(stats.compute_s * 1000.0 / batches, 2),
        "providers": described.get("providers"),
        "backend_up": model.health.up, "backend_problem": model.health.problem,
    }


def _disabled_cameras(snapshot: DaemonSnapshot) -> list[dict[str, Any]]:
    """Cameras the configuration lists with `enabled: false`: shown (greyed, with a switch), not analysed."""
    running = set(snapshot.camera_names)
    return [{"name": cam.name, "state": "disabled", "quality": "disabled", "enabled": False,
             "source": mask_secrets(str(cam.source))}
            for cam in snapshot.cfg.cameras if not cam.enabled and cam.name not in running]


def _camera_status(cam: CameraView) -> dict[str, Any]:
    entry = cam.health.as_dict()
    entry["enabled"] = True
    entry["stall_s"] = cam.stall_s
    entry["fps_max"] = cam.fps_max
    entry["latency_ms"] = round(cam.latency_ms, 1)
    entry["last_failure"] = cam.last_failure
    entry["last_failure_ts"] = None if cam.last_failure_ts is None else round(cam.last_failure_ts, 3)
    return entry


def _sink_status(out: OutputView, now: float) -> dict[str, Any]:
    """One output in /api/status: counters, whether it delivers, and its last error (masked by the sink)."""
    delivery = out.delivery
    problem = output_problem(out, now)
    return {"output": out.label, "type": out.type, "target": out.target, "streamed": out.streamed,
            "sent": out.sent, "dropped": out.dropped,
            "failed": out.failed, "messages_sent": out.messages, "messages_failed": out.messages_failed,
            "alive": out.alive, "healthy": out.alive and problem is None, "problem": problem,
            "failures_in_row": delivery.failures_in_row, "last_error": delivery.last_error,
            "last_error_ts": None if delivery.last_error_ts is None else round(delivery.last_error_ts, 3),
            "last_sent_ts": None if delivery.last_sent_ts is None else round(delivery.last_sent_ts, 3)}


def _models_status(snapshot: DaemonSnapshot) -> dict[str, Any]:
    """By role: the detector (with its input size) and the emotion model; on the frame graphs path one `frames`
    model (both graphs, with the detector's input size)."""
    cfg = snapshot.cfg
    models: dict[str, Any] = {}
    for model in snapshot.models:
        models[model.role] = _model_status(model, cfg.inference)
        if model.role in ("detector", "frames"):
            fixed = cfg.detector.fixed_input_size  # None with auto: each camera shape gets its own size
            models[model.role]["input_size"] = list(fixed) if fixed else f"auto (long side {cfg.detector.max_input_side})"
    return models


def status_document(snapshot: DaemonSnapshot, now: float | None = None) -> dict[str, Any]:
    """GET /api/status: cameras, models, outputs, WebSocket clients, recent commands, health, uptime."""
    now = now_or(snapshot, now)
    sinks = [_sink_status(out, now) for out in snapshot.outputs]
    health = check_health(snapshot, now)
    return {
        "status": health.status,
        "problems": health.problems,
        "uptime_s": round(now - snapshot.started_mono, 1),
        "config": {"path": snapshot.config_path, "reloads": dict(snapshot.reloads),
                   "loaded_at": round(snapshot.config_loaded_at, 3),
                   "last_reload": dict(snapshot.last_reload) if snapshot.last_reload else None,
                   "editor": snapshot.cfg.server.config_editor and snapshot.config_path is not None},
        "cameras": [_camera_status(cam) for cam in snapshot.cameras] + _disabled_cameras(snapshot),
        "models": _models_status(snapshot),
        "sinks": sinks,
        "websocket": {"enabled": snapshot.ws_enabled, "clients": snapshot.ws_clients,
                      "clients_dropped": snapshot.ws_clients_dropped},
        "observations_dropped": snapshot.observations_dropped,
        "preview_fps": snapshot.preview_fps,
        "recent_commands": list(snapshot.recent_commands)[::-1],
        "avatars": _avatars_status(snapshot),
        "visitors": dict(snapshot.visitors),
        "processes": [{"name": proc.name, "pid": proc.pid,
                       "rss_mb": None if proc.rss_bytes is None else round(proc.rss_bytes / 2**20, 1),
                       "cpu_s": None if proc.cpu_seconds is None else round(proc.cpu_seconds, 1)}
                      for proc in snapshot.processes],
    }


def _avatars_status(snapshot: DaemonSnapshot) -> list[dict[str, Any]]:
    """Each command stream (avatar, or camera in no avatar): what it was last told, and what each VMC stream of it
    sends now (an avatar's own outputs, and the top-level ones, which carry every stream)."""
    avatars = {a.name for a in snapshot.cfg.avatars}
    rows = []
    for name in snapshot.streams:
        own = [out for out in snapshot.outputs if out.streamed is not None
               and (out.label.startswith(f"{name}.") or "." not in out.label)]
        rows.append({"name": name, "kind": "avatar" if name in avatars else "camera",
                     "current": snapshot.current.get(name),
                     "streamed": {out.label: dict(out.streamed or {}) for out in own}})
    return rows


def status_line(snapshot: DaemonSnapshot) -> str:
    """systemd STATUS=: e.g. `2/3 cameras streaming (door reconnecting), 19.5 fps analysed, 1 face, 4 commands`."""
    cams = snapshot.cameras
    streaming = [c for c in cams if c.state == "streaming"]
    others = [f"{c.name} {c.state}" for c in cams if c.state != "streaming"]
    fps = sum(c.health.fps_analysed for c in cams)
    faces = sum(c.health.faces for c in streaming)
    text = f"{len(streaming)}/{len(cams)} cameras streaming"
    if others:
        text += f" ({', '.join(others[:3])}{', …' if len(others) > 3 else ''})"
    text += f", {fps:.1f} fps analysed, {faces} face{'s' if faces != 1 else ''}, {snapshot.commands_sent} commands"
    if snapshot.ws_enabled:
        text += f", {snapshot.ws_clients} ws client{'s' if snapshot.ws_clients != 1 else ''}"
    return text
