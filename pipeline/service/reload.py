"""What a SIGHUP reload has to restart: a pure comparison of the running and the new configuration.

Cameras are compared by name (enabled ones only): a camera whose settings are equal keeps its threads, frame counter
and track ids; a changed camera is stopped and started again; added and removed ones are started and stopped.
A change of detector, emotion model or inference settings rebuilds the shared models (every worker is restarted on
the new ones; captures keep running and trackers keep their ids). A tracking change restarts the workers with fresh
trackers. Behaviour, outputs, logging and server changes replace just that part.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pipeline.inference.backend import BackendError
from pipeline.behavior.mapper import BehaviorMapper
from pipeline.config.app import AppConfig, CameraConfig, ConfigError, load_config
from pipeline.service.lifecycle import close_sinks, join_all, run_bounded
from pipeline.service.logs import setup_logging
from pipeline.modelprep.manifest import ManifestError
from pipeline.modelprep.prepare import ModelError
from pipeline.core.redact import mask_secrets
from pipeline.service.server import ServerStartError, StatusServer
from pipeline.service.status import status_line

if TYPE_CHECKING:
    from pipeline.service.daemon import Daemon
    from pipeline.inference.perception import Perception
    from pipeline.outputs.base import Sink

log = logging.getLogger(__name__)

RELOAD_ERRORS = (ModelError, BackendError, ManifestError, ServerStartError, ValueError, OSError)
JOIN_TIMEOUT_S = 2.0  # a camera or worker stopped by a reload
CLOSE_TIMEOUT_S = 2.0  # previous models and outputs


@dataclass(frozen=True)
class ReloadPlan:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    models: bool  # detector / emotion / inference changed: rebuild Perception
    tracking: bool  # new trackers for every worker
    behavior: bool
    outputs: bool
    server: str  # same | live (token, preview_fps) | restart (host, port, enabled)
    logging: bool

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.models or self.tracking or self.behavior
                    or self.outputs or self.server != "same" or self.logging)

    def describe(self) -> list[str]:
        """Short phrases for the log line and the `config` event."""
        parts = [f"{verb} camera(s) {', '.join(names)}" for verb, names in
                 (("added", self.added), ("removed", self.removed), ("restarted", self.changed)) if names]
        for flag, text in ((self.models, "models reloaded"), (self.tracking, "trackers reset"),
                           (self.behavior, "behaviour rules replaced"), (self.outputs, "outputs reopened"),
                           (self.logging, "logging reconfigured")):
            if flag:
                parts.append(text)
        if self.server == "live":
            parts.append("server settings updated")
        elif self.server == "restart":
            parts.append("status server restarted")
        return parts or ["no change"]


def enabled_cameras(cfg: AppConfig) -> dict[str, CameraConfig]:
    return {c.name: c for c in cfg.cameras if c.enabled}


def plan_reload(old: AppConfig, new: AppConfig) -> ReloadPlan:
    before, after = enabled_cameras(old), enabled_cameras(new)
    common = [name for name in after if name in before]
    server = "same"
    if old.server != new.server:
        same_socket = (old.server.enabled, old.server.host, old.server.port) == \
                      (new.server.enabled, new.server.host, new.server.port)
        server = "live" if same_socket else "restart"
    return ReloadPlan(
        added=tuple(n for n in after if n not in before),
        removed=tuple(n for n in before if n not in after),
        changed=tuple(n for n in common if before[n] != after[n]),
        unchanged=tuple(n for n in common if before[n] == after[n]),
        models=(old.detector, old.emotion, old.inference) != (new.detector, new.emotion, new.inference),
        tracking=old.tracking != new.tracking,
        behavior=old.behavior != new.behavior,
        outputs=old.outputs != new.outputs,
        server=server,
        logging=old.logging != new.logging,
    )


class ConfigReloader:
    """Applies a new configuration file to a running daemon (on its main loop, after SIGHUP)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def reload(self) -> bool:
        daemon = self.daemon
        if daemon.config_path is None:
            log.warning("SIGHUP: no configuration file to reload (the daemon was given a config object)")
            return False
        log.info("SIGHUP: reloading %s", daemon.config_path)
        daemon.notifier.reloading()
        try:
            new = load_config(daemon.config_path)
            plan = plan_reload(daemon.cfg, new)
            self._apply(new, plan)
        except ConfigError as exc:
            self._reject([issue.format() for issue in exc.issues])
            return False
        except RELOAD_ERRORS as exc:
            self._reject([mask_secrets(str(exc))])
            return False
        except Exception as exc:  # noqa: BLE001 - a failed reload must never end a running daemon
            log.error("reload failed unexpectedly: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
            self._reject([mask_secrets(f"{type(exc).__name__}: {exc}")])
            return False
        finally:
            daemon.notifier.ready(status_line(daemon))
        daemon.reloads["applied"] += 1
        daemon.config_loaded_at = time.time()
        changes = plan.describe()
        log.info("configuration %s applied: %s", daemon.config_path, "; ".join(changes))
        daemon.bus.publish({"type": "config", "camera": None, "ts": round(time.time(), 3), "status": "applied",
                            "path": str(daemon.config_path), "changes": changes})
        return True

    def _reject(self, errors: list[str]) -> None:
        daemon = self.daemon
        daemon.reloads["rejected"] += 1
        log.error("configuration %s rejected, the running configuration stays in force:", daemon.config_path)
        for line in errors:
            log.error("%s", line)
        daemon.bus.publish({"type": "config", "camera": None, "ts": round(time.time(), 3), "status": "rejected",
                            "path": str(daemon.config_path), "errors": errors})

    def _apply(self, new: AppConfig, plan: ReloadPlan) -> None:
        """Prepare what can fail (models, outputs, server) first; only then swap, so a failure changes nothing."""
        daemon = self.daemon
        perception = daemon.load_perception(new) if plan.models else None
        sinks: list[Sink] | None = None
        try:
            if plan.outputs:
                sinks = daemon.open_sinks(new.outputs)
            if plan.server == "restart":
                self._restart_server(new)
        except BaseException:
            if perception is not None:
                perception.close()
            if sinks:
                close_sinks(sinks, CLOSE_TIMEOUT_S)
            raise
        if plan.server == "live" and daemon.server is not None:
            daemon.server.update(new.server)
        daemon.previews.fps = new.server.preview_fps
        if sinks is not None:
            old_sinks, daemon.sinks = daemon.sinks, sinks
            daemon.bus.sinks = sinks
            daemon.configure_hub(new)
            close_sinks(old_sinks, CLOSE_TIMEOUT_S)
        if plan.logging:
            setup_logging(daemon.log_level or new.logging.level, new.logging.format)
        if plan.behavior:
            daemon.mapper = BehaviorMapper(new.behavior)
        daemon.cfg = new
        for name in plan.removed + plan.changed:
            daemon.stop_camera(name)
        if perception is not None or plan.tracking:
            self._restart_workers(perception, fresh_trackers=plan.tracking)
        daemon.set_rtsp_transport(new)
        cams = enabled_cameras(new)
        for name in plan.changed + plan.added:
            daemon.start_camera(cams[name])

    def _restart_server(self, new: AppConfig) -> None:
        """Host, port or enabled changed: rebind. If the new address fails, the old server comes back."""
        daemon = self.daemon
        old = daemon.server
        if old is not None:
            old.stop()
            daemon.server = None
        if not new.server.enabled:
            return
        try:
            server = StatusServer(new.server, daemon)
            server.start()
        except ServerStartError:
            if old is not None:
                revived = StatusServer(daemon.cfg.server, daemon)
                try:
                    revived.start()
                    daemon.server = revived
                except ServerStartError as exc:
                    log.error("the previous status server could not be restarted either: %s", exc)
            raise
        daemon.server = server

    def _restart_workers(self, perception: Perception | None, fresh_trackers: bool) -> None:
        """New workers for every running camera (new models and/or trackers); captures keep running."""
        daemon = self.daemon
        cams = list(daemon.cameras.values())
        for cam in cams:
            cam.worker_stop.set()
        join_all([cam.worker for cam in cams], JOIN_TIMEOUT_S)
        if perception is not None:
            old, daemon.perception = daemon.perception, perception
            if old is not None:
                run_bounded(old.close, CLOSE_TIMEOUT_S, "previous models")
        replaced = {}
        for cam in cams:
            tracker = daemon.new_tracker() if fresh_trackers else cam.worker.tracker
            stop = threading.Event()
            worker = daemon.new_worker(cam.capture, tracker, stop)
            replaced[cam.cfg.name] = replace(cam, worker=worker, worker_stop=stop)
            worker.start()
        daemon.cameras = {**daemon.cameras, **replaced}
