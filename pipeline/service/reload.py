"""What a SIGHUP reload has to restart: a pure comparison of the running and the new configuration.

Cameras are compared by name (enabled ones only): a camera whose settings are equal keeps its threads, frame counter
and track ids; a changed camera is stopped and started again; added and removed ones are started and stopped.
A change of detector, emotion model or inference settings rebuilds the shared models (every worker is restarted on
the new ones; captures keep running and trackers keep their ids). A tracking change restarts the workers with fresh
trackers. Behaviour, outputs, logging and server changes replace just that part. A changed `avatars:` section
replaces behaviour (every mapper: attention and shown emotions start afresh) and reopens every output, the
top-level ones too (simple, and an output's route follows its avatar's cameras).

The daemon applies the plan itself (pipeline.service.daemon); this module only decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config.app import AppConfig, CameraConfig


@dataclass(frozen=True)
class ReloadPlan:
    """What differs between the running and the new configuration, i.e. what a reload has to replace."""

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
    avatars: bool = False  # the avatars section changed: behaviour and every output are replaced

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
                           (self.logging, "logging reconfigured"), (self.avatars, "avatars replaced")):
            if flag:
                parts.append(text)
        if self.server == "live":
            parts.append("server settings updated")
        elif self.server == "restart":
            parts.append("status server restarted")
        return parts or ["no change"]


def enabled_cameras(cfg: AppConfig) -> dict[str, CameraConfig]:
    """The cameras that run, by name (a disabled camera is as good as absent, for start and for reload)."""
    return {c.name: c for c in cfg.cameras if c.enabled}


def plan_reload(old: AppConfig, new: AppConfig) -> ReloadPlan:
    """Compare two configurations; pure, so the decision can be tested without a running daemon."""
    before, after = enabled_cameras(old), enabled_cameras(new)
    common = [name for name in after if name in before]
    avatars = old.avatars != new.avatars
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
        # the models are sized for the cameras (InferenceConfig.for_cameras): a count that changes the size reloads
        models=(old.detector, old.emotion, old.inference.for_cameras(len(before)))
        != (new.detector, new.emotion, new.inference.for_cameras(len(after))),
        tracking=old.tracking != new.tracking,
        behavior=old.behavior != new.behavior or avatars,
        # the VMC output resets every preset the rules use: new rule presets reopen the outputs
        outputs=old.outputs != new.outputs or old.behavior.rule_presets() != new.behavior.rule_presets() or avatars,
        server=server,
        logging=old.logging != new.logging,
        avatars=avatars,
    )
