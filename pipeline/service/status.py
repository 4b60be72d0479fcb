"""What the daemon says about itself: health (for /healthz and the systemd watchdog), the /api/status document, and
the one-line summary for systemd's STATUS=.

Two kinds of trouble are kept apart on purpose:
- a *stage* problem (a worker that stopped beating, a dead batcher, mapper, output or server thread) means the
  process is wedged: the watchdog ping is withheld and systemd restarts the service;
- a *camera* problem (no frame within stall_s) is the outside world's: /healthz fails and names the camera, but a
  restart would not bring a dead RTSP server back, so the watchdog keeps being fed and capture keeps retrying.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.inference.perception import RESULT_TIMEOUT_S

if TYPE_CHECKING:
    from pipeline.service.daemon import Camera, Daemon

# A worker beats once per loop: at least every 0.25 s when idle, once per frame otherwise; one frame may wait for
# two model results (RESULT_TIMEOUT_S each) before the worker gives up on it.
WORKER_STALE_S = 2 * RESULT_TIMEOUT_S + 5.0
MAPPER_STALE_S = 5.0


@dataclass
class HealthReport:
    status: str  # ok | failing | starting
    cameras: dict[str, str] = field(default_factory=dict)
    stages: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self, uptime_s: float) -> dict[str, Any]:
        return {"status": self.status, "uptime_s": round(uptime_s, 1), "problems": self.problems,
                "cameras": self.cameras, "stages": self.stages}


def _alive(thread: threading.Thread | None) -> bool:
    return thread is not None and thread.is_alive()


def camera_problem(cam: Camera, now: float) -> str | None:
    """Why this camera is not healthy now, or None. An ended file is not a problem; a fresh start has stall_s."""
    capture = cam.capture
    stall_s = cam.cfg.reconnect.stall_s
    if capture.state == "ended":
        return None
    if capture.last_frame_mono is not None:
        age = now - capture.last_frame_mono
        if age <= stall_s:
            return None
        return f"camera {cam.cfg.name}: no frame for {age:.1f} s (stall_s {stall_s:g}, {capture.state})"
    if now - cam.started_mono <= stall_s:
        return None
    return f"camera {cam.cfg.name}: no frame since start {now - cam.started_mono:.1f} s ago ({capture.state})"


def stage_problems(daemon: Daemon, now: float | None = None) -> dict[str, str]:
    """Every pipeline stage with a stale heartbeat or a dead thread, as {stage: reason}; empty when all is well."""
    now = time.monotonic() if now is None else now
    problems: dict[str, str] = {}
    for name, cam in list(daemon.cameras.items()):
        ended = cam.capture.state == "ended"
        if not ended and not _alive(cam.capture):
            problems[f"capture-{name}"] = "thread ended"
        if not _alive(cam.worker):
            if not ended and not cam.capture.slot.closed:
                problems[f"worker-{name}"] = "thread ended"
        elif now - cam.worker.stats.heartbeat > WORKER_STALE_S:
            problems[f"worker-{name}"] = f"no heartbeat for {now - cam.worker.stats.heartbeat:.0f} s"
    perception = daemon.perception
    if perception is not None:
        for model in (perception.detector.model, perception.classifier.model):
            if not model.is_alive():
                problems[f"batcher-{model.name}"] = "a batching thread ended"
    if daemon.started:
        if not _alive(daemon.mapper_thread):
            problems["behavior"] = "thread ended"
        elif now - daemon.mapper_heartbeat > MAPPER_STALE_S:
            problems["behavior"] = f"no heartbeat for {now - daemon.mapper_heartbeat:.0f} s"
        for label, sink in daemon.sink_labels():
            if not sink.is_alive():
                problems[f"output-{label}"] = "thread ended"
    if daemon.server is not None and not daemon.server.is_alive():
        problems["server"] = "thread ended"
    return problems


def check_health(daemon: Daemon) -> HealthReport:
    """The /healthz answer: every camera fresh (or ended) and every stage beating."""
    now = time.monotonic()
    report = HealthReport("ok")
    for name, cam in list(daemon.cameras.items()):
        problem = camera_problem(cam, now)
        report.cameras[name] = "ok" if problem is None else "failing"
        if problem:
            report.problems.append(problem)
    stages = stage_problems(daemon, now)
    for stage, reason in stages.items():
        report.problems.append(f"{stage}: {reason}")
    report.stages = {name: "ok" for name in _stage_names(daemon)} | {k: "failing" for k in stages}
    if not daemon.ready:
        report.status = "starting"
        report.problems.insert(0, "starting: models loading or cameras opening")
    elif report.problems:
        report.status = "failing"
    return report


def _stage_names(daemon: Daemon) -> list[str]:
    names = []
    for name in daemon.cameras:
        names += [f"capture-{name}", f"worker-{name}"]
    if daemon.perception is not None:
        names += [f"batcher-{daemon.perception.detector.model.name}",
                  f"batcher-{daemon.perception.classifier.model.name}"]
    if daemon.started:
        names.append("behavior")
        names += [f"output-{label}" for label, _ in daemon.sink_labels()]
    if daemon.server is not None:
        names.append("server")
    return names


def _model_status(model: Any, cfg: Any) -> dict[str, Any]:
    backend = model.backend
    stats = model.stats
    batches = max(1, stats.batches)
    described: dict[str, Any] = {}
    try:
        described = dict(backend.describe())
    except Exception:  # noqa: BLE001 - descriptive only
        described = {}
    return {
        "name": model.name, "backend": described.get("backend", getattr(backend, "name", cfg.backend)),
        "device": described.get("device", cfg.device), "precision": described.get("precision", cfg.precision),
        "file": described.get("file"), "max_batch": model.max_batch, "lanes": model.lanes,
        "batches": stats.batches, "items": stats.items, "mean_batch": round(stats.items / batches, 2),
        "rejected": stats.rejected, "failed": stats.failed,
        "mean_queue_ms": round(stats.queue_s * 1000.0 / max(1, stats.items), 2),
        "mean_compute_ms": round(stats.compute_s * 1000.0 / batches, 2),
        "providers": described.get("providers"),
    }


def status_document(daemon: Daemon) -> dict[str, Any]:
    """GET /api/status: cameras, models, outputs, WebSocket clients, recent commands, health, uptime."""
    cfg = daemon.cfg
    cameras = []
    for name, cam in list(daemon.cameras.items()):
        entry = cam.health().as_dict()
        entry["stall_s"] = cam.cfg.reconnect.stall_s
        entry["fps_max"] = cam.cfg.fps
        entry["latency_ms"] = round(cam.worker.stats.last_latency_ms, 1)
        cameras.append(entry)
    models: dict[str, Any] = {}
    if daemon.perception is not None:
        models["detector"] = _model_status(daemon.perception.detector.model, cfg.inference)
        models["detector"]["input_size"] = list(cfg.detector.input_size)
        models["emotion"] = _model_status(daemon.perception.classifier.model, cfg.inference)
    sinks = [{"output": label, "type": sink.type_name, "sent": sink.sent, "dropped": sink.dropped,
              "failed": sink.failed, "alive": sink.is_alive()}
             for label, sink in daemon.sink_labels()]
    health = check_health(daemon)
    return {
        "status": health.status,
        "problems": health.problems,
        "uptime_s": round(time.monotonic() - daemon.started_mono, 1),
        "config": {"path": str(daemon.config_path) if daemon.config_path else None,
                   "reloads": dict(daemon.reloads), "loaded_at": round(daemon.config_loaded_at, 3)},
        "cameras": cameras,
        "models": models,
        "sinks": sinks,
        "websocket": {"enabled": daemon.hub.enabled, "clients": daemon.hub.client_count,
                      "clients_dropped": daemon.hub.clients_dropped},
        "observations_dropped": daemon.counters.observations_dropped,
        "preview_fps": cfg.server.preview_fps,
        "recent_commands": list(daemon.recent_commands)[::-1],
    }


def status_line(daemon: Daemon) -> str:
    """systemd STATUS=: e.g. `2/3 cameras streaming (door reconnecting), 19.5 fps analysed, 1 face, 4 commands`."""
    cams = list(daemon.cameras.values())
    streaming = [c for c in cams if c.capture.state == "streaming"]
    others = [f"{c.cfg.name} {c.capture.state}" for c in cams if c.capture.state != "streaming"]
    now = time.monotonic()
    fps = sum(c.worker.stats.analysed.rate(now) for c in cams)
    faces = sum(c.worker.stats.faces for c in streaming)
    text = f"{len(streaming)}/{len(cams)} cameras streaming"
    if others:
        text += f" ({', '.join(others[:3])}{', …' if len(others) > 3 else ''})"
    text += f", {fps:.1f} fps analysed, {faces} face{'s' if faces != 1 else ''}, {daemon.commands_sent} commands"
    if daemon.hub.enabled:
        text += f", {daemon.hub.client_count} ws client{'s' if daemon.hub.client_count != 1 else ''}"
    return text
