"""Prometheus metrics on the daemon's own CollectorRegistry (never the process-global one).

Most figures are read from the live stats at scrape time by a custom collector (nothing to update per frame):
per-camera frames in/analysed/skipped, rates, reconnects, stalls, faces; per-model batch counters; per-output sent,
dropped and failed events; WebSocket clients. Three histograms need every sample and are fed as they happen:
stage latency per camera (from each observation), and batch size / queue time / compute time per model (pulled from
BatchStats' recent windows by a cursor, so the batcher's hot path is untouched).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipeline.behavior.presence import PresenceChange
from pipeline.core.types import Observation
from pipeline.service.snapshot import DaemonSnapshot, ModelView
from pipeline.service.status import output_problem

PREFIX = "emotion"
DWELL_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CAMERA_STATES = ("starting", "streaming", "stalled", "reconnecting", "stopped", "ended")


class PipelineMetrics:
    """The registry and its histograms; live figures come from `snapshot()` at scrape time."""

    def __init__(self, snapshot: Callable[[], DaemonSnapshot]) -> None:
        self.registry = CollectorRegistry()
        self.stage_latency = Histogram(
            f"{PREFIX}_stage_latency_seconds", "Time spent per stage for one analysed frame (detect, crop, "
            "emotion include batching queue time; total is capture to observation).", ["camera", "stage"],
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram(f"{PREFIX}_batch_size", "Items per inference batch.", ["model"],
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.queue_time = Histogram(f"{PREFIX}_batch_queue_seconds", "Time a request waited before its batch "
                                    "ran (queue time).", ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.compute_time = Histogram(f"{PREFIX}_batch_compute_seconds", "Time the backend took for one batch "
                                      "(compute time).", ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.visitors = Counter(f"{PREFIX}_visitors", "Visitors who arrived (a track held for "
                                "behavior.presence.arrive_frames): rate()*3600 = visitors per hour.", ["camera"],
                                registry=self.registry)
        self.dwell = Histogram(f"{PREFIX}_visit_dwell_seconds", "How long each visitor stayed (first to last "
                               "sighting): _sum / _count = mean dwell.", ["camera"], buckets=DWELL_BUCKETS,
                               registry=self.registry)
        self.looks = Counter(f"{PREFIX}_visitor_looks", "Times a visitor started looking at the camera (head pose).",
                             ["camera"], registry=self.registry)
        self.looked_at = Counter(f"{PREFIX}_looked_at_seconds", "Time a visitor looked at the camera (someone "
                                 "looking counts once): rate() = the share of time the avatar is looked at.",
                                 ["camera"], registry=self.registry)
        self.registry.register(_LiveCollector(snapshot))
        self._snapshot = snapshot
        self._cursors: dict[str, tuple[int, int, int]] = {}  # model name -> (id(stats), batches seen, items seen)
        self._pull_lock = threading.Lock()

    def observe(self, obs: Observation, total_s: float) -> None:
        """Called by a worker thread for every observation."""
        for stage, ms in obs.latency_ms.items():
            self.stage_latency.labels(obs.camera, stage).observe(ms / 1000.0)
        self.stage_latency.labels(obs.camera, "total").observe(total_s)

    def presence(self, change: PresenceChange) -> None:
        """Called on the behaviour thread for every arrival, departure and look."""
        if change.kind == "arrived":
            self.visitors.labels(change.camera).inc()
        elif change.kind == "left" and change.dwell_s is not None:
            self.dwell.labels(change.camera).observe(change.dwell_s)
        elif change.kind == "looking":
            self.looks.labels(change.camera).inc()

    def looked_at_seconds(self, added: dict[str, float]) -> None:
        """Time with a visitor looking at each camera (VisitorTally.advance's steps)."""
        for camera, seconds in added.items():
            self.looked_at.labels(camera).inc(seconds)

    def forget_camera(self, camera: str) -> None:
        """A camera removed by a reload takes its latency and visitor series with it."""
        for stage in ("detect", "crop", "emotion", "total"):
            try:
                self.stage_latency.remove(camera, stage)
            except KeyError:
                pass
        for series in (self.visitors, self.dwell, self.looks, self.looked_at):
            try:
                series.remove(camera)
            except KeyError:
                pass

    def pull_batches(self, models: Iterable[ModelView] | None = None) -> None:
        """Move batches recorded since the last pull into the histograms (main loop tick and every scrape).

        `models` spares a second snapshot when the caller holds one already (the main loop's tick).
        """
        views = tuple(self._snapshot().models if models is None else models)
        with self._pull_lock:
            for model in views:
                self._pull(model.name, model.stats)

    def _pull(self, name: str, stats: Any) -> None:
        ident, seen_batches, seen_items = self._cursors.get(name, (0, 0, 0))
        if ident != id(stats):  # a new model after a reload: start over
            seen_batches = seen_items = 0
        batches, items = stats.batches, stats.items
        new_batches, new_items = batches - seen_batches, items - seen_items
        if new_batches > 0:
            for size in deque_tail(stats.batch_sizes, new_batches):
                self.batch_size.labels(name).observe(size)
            for ms in deque_tail(stats.recent_compute_ms, new_batches):
                self.compute_time.labels(name).observe(ms / 1000.0)
        if new_items > 0:
            for ms in deque_tail(stats.recent_queue_ms, new_items):
                self.queue_time.labels(name).observe(ms / 1000.0)
        self._cursors[name] = (id(stats), batches, items)

    def render(self) -> bytes:
        self.pull_batches()
        return generate_latest(self.registry)


def deque_tail(values: Iterable[float], count: int) -> list[float]:
    """The last `count` entries of a deque another thread appends to (copied first; retried if it moved)."""
    for _ in range(3):
        try:
            snapshot = list(values)
            break
        except RuntimeError:  # deque mutated during iteration
            continue
    else:
        return []
    return snapshot[-count:] if count < len(snapshot) else snapshot


class _LiveCollector(Collector):
    """Reads the pipeline's counters at scrape time, from one snapshot per scrape."""

    def __init__(self, snapshot: Callable[[], DaemonSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield from self._cameras(snap)
        yield from self._models(snap)
        yield from self._outputs(snap)
        yield from self._processes(snap)
        up = GaugeMetricFamily(f"{PREFIX}_uptime_seconds", "Seconds since the daemon started.")
        up.add_metric([], snap.uptime_s)
        yield up
        ready = GaugeMetricFamily(f"{PREFIX}_ready", "1 once models are warm and cameras started.")
        ready.add_metric([], 1.0 if snap.ready else 0.0)
        yield ready
        dropped = CounterMetricFamily(f"{PREFIX}_observations_dropped", "Observations dropped before the behaviour "
                                      "mapper because it fell behind.")
        dropped.add_metric([], snap.observations_dropped)
        yield dropped
        commands = CounterMetricFamily(f"{PREFIX}_commands", "Avatar commands decided.")
        commands.add_metric([], snap.commands_sent)
        yield commands
        reloads = CounterMetricFamily(f"{PREFIX}_config_reloads", "SIGHUP reloads by result.", labels=["result"])
        for result, count in snap.reloads.items():
            reloads.add_metric([result], count)
        yield reloads

    @staticmethod
    def _processes(snap: DaemonSnapshot) -> Iterator[Metric]:
        """Each process of the daemon (its own, each camera group's) by name: what a leak or a heavy group shows in."""
        rss = GaugeMetricFamily(f"{PREFIX}_process_resident_memory_bytes", "Resident host memory of each of the "
                                "daemon's processes (the daemon, each camera group).", labels=["process"])
        cpu = CounterMetricFamily(f"{PREFIX}_process_cpu_seconds", "User and system CPU time of each of the daemon's "
                                  "processes since it started (a restarted group starts again).", labels=["process"])
        for proc in snap.processes:
            if proc.rss_bytes is not None:
                rss.add_metric([proc.name], proc.rss_bytes)
            if proc.cpu_seconds is not None:
                cpu.add_metric([proc.name], proc.cpu_seconds)
        yield rss
        yield cpu

    @staticmethod
    def _cameras(snap: DaemonSnapshot) -> Iterator[Metric]:
        labels = ["camera"]
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "frames_in": CounterMetricFamily(f"{PREFIX}_camera_frames_in", "Frames read from the camera.",
                                             labels=labels),
            "frames_analysed": CounterMetricFamily(f"{PREFIX}_camera_frames_analysed", "Frames analysed.",
                                                   labels=labels),
            "frames_skipped": CounterMetricFamily(f"{PREFIX}_camera_frames_skipped", "Frames read but not analysed "
                                                  "(over the fps cap, or analysis busy).", labels=labels),
            "reconnects_total": CounterMetricFamily(f"{PREFIX}_camera_reconnects", "Reopen attempts after a failure.",
                                                    labels=labels),
            "fps_in": GaugeMetricFamily(f"{PREFIX}_camera_fps_in", "Frames read per second (5 s window).",
                                        labels=labels),
            "fps_analysed": GaugeMetricFamily(f"{PREFIX}_camera_fps_analysed", "Frames analysed per second "
                                              "(5 s window).", labels=labels),
            "faces": GaugeMetricFamily(f"{PREFIX}_camera_faces", "Faces in the last analysed frame.", labels=labels),
        }
        stalls = CounterMetricFamily(f"{PREFIX}_camera_stalls", "Times the camera stopped delivering frames.",
                                     labels=labels)
        age = GaugeMetricFamily(f"{PREFIX}_camera_last_frame_age_seconds", "Seconds since the last frame "
                                "(absent before the first).", labels=labels)
        busy = CounterMetricFamily(f"{PREFIX}_camera_busy_skips", "Frames skipped because a model queue was full "
                                   "or their frame size was still being prepared.", labels=labels)
        errors = CounterMetricFamily(f"{PREFIX}_camera_analysis_errors", "Frames whose analysis failed.",
                                     labels=labels)
        state = GaugeMetricFamily(f"{PREFIX}_camera_state", "1 for the camera's current lifecycle state.",
                                  labels=["camera", "state"])
        for cam in snap.cameras:
            name, health = cam.name, cam.health
            for key, family in families.items():
                family.add_metric([name], float(getattr(health, key)))
            stalls.add_metric([name], cam.stalls_total)
            if health.last_frame_age_s is not None:
                age.add_metric([name], health.last_frame_age_s)
            busy.add_metric([name], cam.busy_skips)
            errors.add_metric([name], cam.errors)
            for s in CAMERA_STATES:
                state.add_metric([name, s], 1.0 if health.state == s else 0.0)
        yield from families.values()
        yield from (stalls, age, busy, errors, state)

    @staticmethod
    def _models(snap: DaemonSnapshot) -> Iterator[Metric]:
        labels = ["model"]
        counters = {
            "batches": CounterMetricFamily(f"{PREFIX}_model_batches", "Batches run.", labels=labels),
            "items": CounterMetricFamily(f"{PREFIX}_model_items", "Items (frames or faces) inferred.", labels=labels),
            "rejected": CounterMetricFamily(f"{PREFIX}_model_rejected", "Requests refused because the queue was "
                                            "full.", labels=labels),
            "failed": CounterMetricFamily(f"{PREFIX}_model_failed", "Requests whose batch failed.", labels=labels),
            "queue_s": CounterMetricFamily(f"{PREFIX}_model_queue_seconds", "Total time requests waited for their "
                                           "batch.", labels=labels),
            "compute_s": CounterMetricFamily(f"{PREFIX}_model_compute_seconds", "Total backend time.", labels=labels),
        }
        up = GaugeMetricFamily(f"{PREFIX}_backend_up", "1 while the model's backend can run batches; 0 while a "
                               "remote one (a Triton server) cannot be reached.", labels=labels)
        reconnects = CounterMetricFamily(f"{PREFIX}_backend_reconnects", "Times a remote backend found its "
                                         "server again after losing it.", labels=labels)
        for model in snap.models:
            for key, family in counters.items():
                family.add_metric([model.name], float(getattr(model.stats, key)))
            up.add_metric([model.name], 1.0 if model.health.up else 0.0)
            reconnects.add_metric([model.name], model.health.reconnects)
        yield from counters.values()
        yield from (up, reconnects)

    @staticmethod
    def _outputs(snap: DaemonSnapshot) -> Iterator[Metric]:
        labels = ["output"]
        sent = CounterMetricFamily(f"{PREFIX}_output_events_sent", "Events delivered by an output.", labels=labels)
        dropped = CounterMetricFamily(f"{PREFIX}_output_events_dropped", "Events dropped because the output's queue "
                                      "was full.", labels=labels)
        failed = CounterMetricFamily(f"{PREFIX}_output_events_failed", "Events the output failed to deliver.",
                                     labels=labels)
        healthy = GaugeMetricFamily(f"{PREFIX}_output_healthy", "1 while the output delivers (its thread runs and "
                                    "it is not failing by /healthz's rule), else 0.", labels=labels)
        for out in snap.outputs:
            sent.add_metric([out.label], out.sent)
            dropped.add_metric([out.label], out.dropped)
            failed.add_metric([out.label], out.failed)
            healthy.add_metric([out.label], int(out.alive and output_problem(out, snap.taken_mono) is None))
        yield from (sent, dropped, failed, healthy)
        clients = GaugeMetricFamily(f"{PREFIX}_websocket_clients", "Connected /ws clients.")
        clients.add_metric([], snap.ws_clients)
        yield clients
        slow = CounterMetricFamily(f"{PREFIX}_websocket_clients_dropped", "/ws clients disconnected for falling "
                                   "behind.")
        slow.add_metric([], snap.ws_clients_dropped)
        yield slow
        previews = CounterMetricFamily(f"{PREFIX}_preview_renders", "Annotated preview JPEGs rendered.")
        previews.add_metric([], snap.preview_renders)
        yield previews
