"""A read-only picture of the running daemon: what status, metrics, the status server and the watchdog read.

Why a snapshot and not the Daemon itself: the readers then depend on plain values instead of the daemon's
attributes (no import circle, no chance of a reader writing a field), and one answer is computed from one set of
figures (a reload swapping cameras or outputs while /api/status is being written cannot mix old and new).

`Daemon.snapshot()` builds one per HTTP request, scrape and watchdog tick, so building is cheap: references and
counters are copied, nothing is drawn or encoded. The one live object inside is `ModelView.stats`, the model's
BatchStats, which metrics needs for its histogram cursor (it reads the recent windows); readers must treat it as
read-only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.inference.backend import BackendHealth, runner_health
from pipeline.outputs.base import Delivery
from pipeline.service.procs import ProcessView

if TYPE_CHECKING:
    from pipeline.capture.stats import CameraHealth
    from pipeline.config.app import AppConfig
    from pipeline.inference.batching import BatchedModel, BatchStats
    from pipeline.outputs.events import Event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CameraView:
    """One camera: its configured limits, its health figures and the state of its two threads."""

    name: str
    stall_s: float
    fps_max: float
    health: CameraHealth
    capture_alive: bool
    state: str  # the capture's lifecycle state
    last_frame_mono: float | None
    started_mono: float
    slot_closed: bool  # the capture closed its frame slot (the worker then ends by design)
    worker_alive: bool
    worker_heartbeat: float
    latency_ms: float  # of the last analysed frame
    stalls_total: int
    busy_skips: int
    errors: int
    # Why the camera last failed (masked, without the retry delay) and when (Unix time); kept after it recovers.
    last_failure: str | None = None
    last_failure_ts: float | None = None


@dataclass(frozen=True)
class ModelView:
    """One shared batched model. `stats` is the live BatchStats (read-only to readers; see the module docstring)."""

    role: str  # detector | emotion
    name: str
    described: Mapping[str, Any]  # backend.describe(), empty if that failed
    backend_name: str | None
    max_batch: int
    lanes: int
    alive: bool
    stats: BatchStats
    health: BackendHealth = BackendHealth()  # a remote backend (Triton) is down while its server is unreachable


@dataclass(frozen=True)
class OutputView:
    """One output with its unique label (type, then type-2, type-3 … for repeats), its counters and how its
    deliveries are going (failures in a row, since when, the last error: see outputs.base.Delivery)."""

    label: str
    type: str
    sent: int
    dropped: int
    failed: int
    alive: bool
    delivery: Delivery = Delivery()
    target: str = ""  # where it sends (host:port, URL, name set), credentials masked
    messages: int = 0  # what went over the wire (a VMC stream's bundles included)
    messages_failed: int = 0
    streamed: Mapping[str, float] | None = None  # the weights a VMC stream sends now; None when it does not stream


@dataclass(frozen=True)
class DaemonSnapshot:
    """Everything the daemon shows about itself at `taken_mono`."""

    taken_mono: float
    cfg: AppConfig  # the configuration in force (immutable; a reload replaces it)
    ready: bool
    started: bool
    started_mono: float
    config_path: str | None
    config_loaded_at: float
    reloads: Mapping[str, int]  # a copy: {"applied": n, "rejected": n}
    commands_sent: int
    recent_commands: tuple[Event, ...]  # oldest first
    observations_dropped: int
    preview_fps: float
    preview_renders: int
    ws_enabled: bool
    ws_clients: int
    ws_clients_dropped: int
    mapper_alive: bool
    mapper_heartbeat: float
    server_present: bool
    server_alive: bool
    cameras: tuple[CameraView, ...] = ()
    models: tuple[ModelView, ...] = ()
    outputs: tuple[OutputView, ...] = ()
    last_reload: Mapping[str, Any] | None = None  # the newest reload's outcome (result, at, trigger, changes, errors)
    streams: tuple[str, ...] = ()  # the command streams: each avatar, then each camera in no avatar
    current: Mapping[str, Any] = field(default_factory=dict)  # stream → its last command (current_json)
    visitors: Mapping[str, Any] = field(default_factory=dict)  # camera → VisitorTally.summary's row
    processes: tuple[ProcessView, ...] = ()  # the daemon's own process, then each running camera group's

    def has_camera(self, name: str) -> bool:
        """Whether a camera of that name runs (the status server's 404 check)."""
        return any(cam.name == name for cam in self.cameras)

    @property
    def camera_names(self) -> list[str]:
        return [cam.name for cam in self.cameras]

    @property
    def uptime_s(self) -> float:
        return self.taken_mono - self.started_mono


def model_view(role: str, model: BatchedModel) -> ModelView:
    """A model's view; describe() is descriptive only, so a backend that cannot describe itself shows nothing."""
    backend = model.backend
    try:
        described: dict[str, Any] = dict(backend.describe())
    except Exception as exc:  # noqa: BLE001 - descriptive only; a broken describe() must not break /api/status
        log.debug("%s: describe() failed: %s", model.name, exc)
        described = {}
    return ModelView(role=role, name=model.name, described=described, backend_name=getattr(backend, "name", None),
                     max_batch=model.max_batch, lanes=model.lanes, alive=model.is_alive(), stats=model.stats,
                     health=runner_health(backend))


def now_or(snapshot: DaemonSnapshot, now: float | None) -> float:
    """`now` when given, else the moment the snapshot was taken."""
    return snapshot.taken_mono if now is None else now
