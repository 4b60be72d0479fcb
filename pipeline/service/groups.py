"""Camera groups in processes of their own (`inference.processes` > 1): one GIL and one engine per group.

Why: one Python process runs out of GIL long before a big GPU runs out of work. At 64 cameras of 1080p an H200
analysed 64-68 % of the frames in one process while its GPU was 37-44 % busy; the same cameras as 4 processes of 16
analysed every frame (p99 21 ms), provided the processes shared the GPU through NVIDIA's Multi-Process Service.
Without MPS the GPU time-slices between the processes' contexts and 2 or 4 processes analysed no more than one
(BENCHMARKS.md, "Camera groups in processes"). These groups themselves, on the H200 under MPS: 64 such cameras
99.9 % analysed as 2 groups (p99 62 ms, 3.6 cores), 100 % as 4 (BENCHMARKS.md, "The daemon's camera groups").

A group process runs exactly what the daemon runs per camera in one process (capture thread, worker, tracker) over
its own engine. The daemon keeps behaviour, outputs, status, metrics and reloads; it never sees a frame. Each group
sends it, on one queue: observations and camera events as they happen, and twice a second the views of its cameras
and models (what status, metrics and the watchdog read). A group that dies is started again with backoff (1 s
doubling to 30 s) while the others keep running; its cameras' views then age, which status and the systemd
watchdog report as they would a wedged thread. (A group killed in the very microseconds its queue's feeder thread is
writing a message longer than a pipe writes at once leaves the daemon's reader waiting for the rest: the group is
then not started again, its views age, and the watchdog has systemd restart the daemon.)

Start-up is two-step so a reload can prepare new groups before it stops the old ones: a group loads its models and
says "ready" (or why it failed), then starts its cameras only when told to go.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

from pipeline.config.app import AppConfig, CameraConfig
from pipeline.core.heap import HeapTrimmer
from pipeline.core.redact import mask_secrets
from pipeline.core.types import CameraEvent, Frame, Observation
from pipeline.inference.backend import BackendError
from pipeline.inference.batching import BatchStats
from pipeline.inference.perception import Analyzer
from pipeline.inference.settings import InferenceConfig
from pipeline.modelprep.manifest import ManifestError, ModelError
from pipeline.service.cameras import PreviewingWorker, new_camera, stop_cameras
from pipeline.service.group_send import GroupSender
from pipeline.service.lifecycle import run_bounded
from pipeline.service.logs import setup_logging
from pipeline.service.metrics import deque_tail
from pipeline.service.parts import (
    limit_opencv_threads,
    load_perception,
    new_tracker,
    open_camera_source,
    set_rtsp_transport,
    sized_for_cameras,
)
from pipeline.service.preview import PreviewStore, RenderedPreview
from pipeline.service.snapshot import CameraView, ModelView, model_view

log = logging.getLogger(__name__)

VIEW_INTERVAL_S = 0.5
PREVIEW_WAIT_S = 1.0  # how long the status page waits for a group's preview before it shows the last one
QUEUE_SIZE = 1024  # messages a group may have in flight to the daemon; observations beyond are dropped (counted)
BACKOFF_S = (1.0, 30.0)  # first and longest wait before a dead group is started again
STEADY_S = 60.0  # a group that ran this long starts its backoff over when it dies
# The group's own shutdown shares, within the daemon's budget for cameras, workers and models (1.9 s).
GROUP_STOP = {"cameras": 0.8, "workers": 0.4, "models": 0.4}
MODEL_ERRORS = (ModelError, BackendError, ManifestError)
MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"  # where MPS's control daemon and its clients meet without CUDA_MPS_PIPE_DIRECTORY
CAMERAS_PER_GROUP = 32  # 1080p x 25 fps cameras one process analysed every frame of, H200 (BENCHMARKS.md)
CAMERAS_PER_GPU_EVERY_FRAME = 64  # ... one H200 analysed every frame of with the detector on every frame (round 13:
# 96 gave 78 %)
CAMERAS_PER_GPU_UNCAPTURED = 96  # past this a GPU's lanes launching the frame graphs node by node cost cores that
# inference.cuda_graphs saves (150 cameras: 1.2-1.3 lane cores instead of 2.6-2.8, BENCHMARKS.md round 16)
CAMERAS_PER_PROCESS_LOOKING = 16  # the most cameras one process followed by look on NVDEC frames with every frame
# analysed (an H100, searched in the lanes' batches: 16 in one process every frame, 64 in groups of 32 81 %;
# BENCHMARKS.md round 19)
# BatchStats' recent lists and the counter each grows with: one entry per batch, or per item for the queue wait.
_RECENT = {"batch_sizes": "batches", "recent_compute_ms": "batches", "recent_queue_ms": "items"}


def mps_problem(inference: InferenceConfig, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why camera groups on a GPU will share it badly here: NVIDIA's MPS control daemon is not running (its pipe
    directory, $CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps, has no `control` pipe). None when all is well, or when
    there are no groups or no GPU."""
    if inference.processes <= 1 or inference.device == "cpu":
        return None
    control = Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DEFAULT) / "control"
    if control.exists():
        return None
    return (f"{inference.processes} camera groups on {inference.device} without NVIDIA MPS (no {control}): the "
            f"groups' processes would time-slice the GPU, and 2 or 4 of them analysed no more frames than one on an "
            f"H200; start deploy/nvidia-mps.service (README, \"Running as a service\") or set processes: 1")


def crowded_process(cameras: Sequence[CameraConfig], inference: InferenceConfig) -> str | None:
    """Advice when a GPU's process carries more cameras than one Python process keeps up with (its GIL): on an
    H200, 32 cameras of 1080p at 25 fps were every frame analysed in one process and 64 only 47-68 %, while 64 as 2
    groups under MPS were 99.9 % (BENCHMARKS.md). None on the CPU (the cores are the limit there) or when the
    groups are small enough."""
    crowd = crowded_processes(cameras, inference.processes, CAMERAS_PER_GROUP)
    if inference.device == "cpu" or crowd is None:
        return None
    wanted = -(-sum(1 for cam in cameras if cam.enabled) // CAMERAS_PER_GROUP)
    return (f"{crowd}: past about "
            f"{CAMERAS_PER_GROUP} cameras of 1080p one process's GIL is the limit (an H200 analysed 47-68 % of the "
            f"frames of 64 cameras in one process, 99.9 % as 2 groups under NVIDIA MPS); consider processes: "
            f"{wanted} with MPS running (README, \"Many cameras: what to tune\")")


def crowded_processes(cameras: Sequence[CameraConfig], processes: int, most: int) -> str | None:
    """The opening of each too-many-cameras-a-process advice, `N cameras in P process(es), C a process`, when a
    camera process (groups of the config's order, spread evenly) carries more than `most` enabled cameras; else
    None."""
    enabled = sum(1 for cam in cameras if cam.enabled)
    per_process = -(-enabled // max(1, processes))
    return f"{enabled} cameras in {processes} process(es), {per_process} a process" if per_process > most else None


def crowded_gpus(cameras: Sequence[CameraConfig], gpus: int, most: int) -> str | None:
    """The opening of each many-cameras advice, `N cameras on G GPU(s), P a GPU`, when the busiest of `gpus` GPUs
    (groups spread evenly) carries more than `most` enabled cameras; else None."""
    enabled = sum(1 for cam in cameras if cam.enabled)
    per_gpu = -(-enabled // max(1, gpus))
    return f"{enabled} cameras on {gpus} GPU(s), {per_gpu} a GPU" if per_gpu > most else None


def detector_interval_advice(cameras: Sequence[CameraConfig], interval: int, inference: InferenceConfig,
                             gpus: int = 1) -> str | None:
    """Advice when `gpus` GPUs would run the detector on every frame (detector.interval 1) of more cameras than
    one keeps up with: an H200 analysed 78 % of the frames of 96 cameras of 1080p at 25 fps at interval 1, and
    every frame of 150 at interval 3 (the student model, BENCHMARKS.md rounds 9 and 13). None on the CPU, with
    interval > 1, or at most CAMERAS_PER_GPU_EVERY_FRAME cameras a GPU."""
    crowd = crowded_gpus(cameras, gpus, CAMERAS_PER_GPU_EVERY_FRAME)
    if inference.device == "cpu" or interval > 1 or crowd is None:
        return None
    return (f"{crowd}, with the detector on every frame: one H200 analysed 78 % of the frames of 96 cameras of "
            f"1080p at 25 fps that way, and every frame of 150 with interval: 3 and emotion.model: "
            f"dlibface_student64; consider interval: 3 (README, \"Many cameras: what to tune\")")


def follow_look_advice(cameras: Sequence[CameraConfig], interval: int, follow_by: str,
                       inference: InferenceConfig) -> str | None:
    """Advice when each camera process follows faces by their look (tracking.follow_by: look) on frames that stay
    on the GPU for more than CAMERAS_PER_PROCESS_LOOKING cameras: there each batch's search holds up its lane.
    None on the CPU, on the OpenCV frame path, with every frame detected, or without look."""
    crowd = crowded_processes(cameras, inference.processes, CAMERAS_PER_PROCESS_LOOKING)
    if inference.device != "cuda" or not inference.graph_frames or interval <= 1 or follow_by != "look" or not crowd:
        return None
    return (f"{crowd}, follow faces by their look on GPU frames: an H100 analysed every frame of 16 cameras in one "
            f"process that way but 81 % of 64 in groups of 32 (each batch's search holds up its lane); consider "
            f"follow_by: auto, or processes of at most {CAMERAS_PER_PROCESS_LOOKING} cameras (inference.processes)")


def cuda_graphs_advice(cameras: Sequence[CameraConfig], inference: InferenceConfig, gpus: int = 1) -> str | None:
    """Advice when `gpus` GPUs run the frame graphs node by node (inference.cuda_graphs off) for more than
    CAMERAS_PER_GPU_UNCAPTURED cameras a GPU, where the lanes' kernel launches are the CPU that replaying them as
    CUDA graphs saves. None on the CPU, on the OpenCV frame path, with cuda_graphs on, or for fewer cameras."""
    crowd = crowded_gpus(cameras, gpus, CAMERAS_PER_GPU_UNCAPTURED)
    if inference.device != "cuda" or not inference.graph_frames or inference.cuda_graphs or crowd is None:
        return None
    return (f"{crowd}, with the frame graphs launched node by node: at 150 cameras of 1080p their lanes took "
            f"2.6-2.8 CPU cores that way and 1.2-1.3 replayed as CUDA graphs (7.8-8.4 cores in all against 6.2-7.1, "
            f"~0.4 GB more GPU memory a camera group); consider cuda_graphs: true if the host's cores are the limit "
            f"(README, \"Many cameras: what to tune\")")


def gpus_in_use(inference: InferenceConfig, visible: Sequence[str]) -> int:
    """How many GPUs the camera groups spread over (one for a single process, or when none is found)."""
    if inference.processes <= 1:
        return 1
    try:
        return max(1, len({gpu for gpu in group_gpus(inference, inference.processes, visible) if gpu is not None}))
    except GroupStartError:  # a device number that is not there: the daemon's start says so
        return 1


def visible_gpus(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPUs this process may use, each as CUDA_VISIBLE_DEVICES would name it to a child: the entries of
    CUDA_VISIBLE_DEVICES when it is set, else every GPU `nvidia-smi -L` lists (by index); [] when there is none.
    Read without touching CUDA: the daemon's own process never uses the GPU when cameras run in groups."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(index) for index, line in enumerate(line for line in out.splitlines() if line.startswith("GPU "))]


def group_gpus(inference: InferenceConfig, groups: int, visible: Sequence[str]) -> list[str | None]:
    """The GPU of each camera group (as its CUDA_VISIBLE_DEVICES), round-robin over `inference.devices` (numbers
    into `visible`; default: all of them). None for every group on the CPU or with no GPU found (CUDA's own default
    then applies). ConfigError-like ValueError for a device number that is not visible."""
    if inference.device == "cpu" or not visible:
        return [None] * groups
    wanted = inference.devices if inference.devices is not None else list(range(len(visible)))
    missing = [number for number in wanted if number >= len(visible)]
    if missing:
        raise GroupStartError(f"inference.devices {wanted}: GPU {missing[0]} does not exist here ({len(visible)} "
                              f"visible: {', '.join(visible)}); number them from 0 within CUDA_VISIBLE_DEVICES")
    return [visible[wanted[index % len(wanted)]] for index in range(groups)]


def camera_groups(cameras: Sequence[CameraConfig], processes: int) -> list[list[CameraConfig]]:
    """Cameras dealt round-robin into at most `processes` groups (in config order, so a group's cameras are the same
    at every start); no group is empty."""
    groups: list[list[CameraConfig]] = [[] for _ in range(min(processes, len(cameras)))]
    for index, cam in enumerate(cameras):
        groups[index % len(groups)].append(cam)
    return groups


# ---------------------------------------------------------------------------------------------------- in the group


class _GroupCameras:
    """The group process's cameras over its own engine; what it learns goes to the daemon through `out`."""

    def __init__(self, cfg: AppConfig, cameras: list[CameraConfig], perception: Analyzer, out: Any) -> None:
        self.cfg, self.perception = cfg, perception
        self.sender = GroupSender(out)  # every message to the daemon, observations in batches (group_send)
        self._sent: dict[str, tuple[int, int]] = {}  # per model: batches and items already described
        self.cameras = {cam_cfg.name: new_camera(
            cam_cfg, self._on_event, lambda c: open_camera_source(cfg.inference, c),
            lambda capture, stop: PreviewingWorker(capture, perception, new_tracker(cfg), self._on_observation, stop))
            for cam_cfg in cameras}
        self.previews = PreviewStore(cfg.server.preview_fps, self._raw_frame)

    def start(self) -> None:
        for cam in self.cameras.values():
            cam.start()

    def _on_event(self, event: CameraEvent) -> None:
        cam = self.cameras.get(event.camera)
        if cam is not None:
            cam.note_event(event)
        self._send(("event", event))

    def _raw_frame(self, camera: str) -> Frame | None:
        cam = self.cameras.get(camera)
        return cam.capture.slot.latest if cam is not None else None

    def _on_observation(self, obs: Observation) -> None:
        cam = self.cameras.get(obs.camera)
        frame = cam.analysed_frame(obs) if cam is not None else None
        if frame is not None:
            self.previews.update(frame, obs)
        self.sender.observation(obs)

    def _send(self, message: tuple[Any, ...]) -> None:
        self.sender.send(message)

    def send_preview(self, camera: str) -> None:
        """The camera's annotated JPEG for the daemon's status page (rendered here, where the frames are)."""
        self._send(("preview", camera, self.previews.jpeg(camera)))

    def send_views(self) -> None:
        now = time.monotonic()
        cams = tuple(cam.view(now) for cam in self.cameras.values())
        models = tuple(self._since_last(model_view(role, model)) for role, model in self.perception.models())
        self._send(("views", cams, models, self.sender.dropped))

    def _since_last(self, view: ModelView) -> ModelView:
        """The view with a copy of its counters, whose recent-batch lists hold only batches not sent before (the
        daemon keeps the history; a message stays a few kB)."""
        stats = view.stats
        batches, items = self._sent.get(view.name, (0, 0))
        self._sent[view.name] = (stats.batches, stats.items)
        copy = replace(stats)
        for name, fresh in _RECENT.items():
            count = max(0, getattr(stats, fresh) - (batches if fresh == "batches" else items))
            setattr(copy, name, deque(deque_tail(getattr(stats, name), count) if count else ()))
        return replace(view, stats=copy)

    def ended(self) -> bool:
        return not any(cam.capture.is_alive() for cam in self.cameras.values())

    def stop(self) -> None:
        stop_cameras(list(self.cameras.values()), GROUP_STOP["cameras"], GROUP_STOP["workers"])
        self.sender.close()  # the last observations go before the views and "ended" that follow
        run_bounded(self.perception.close, GROUP_STOP["models"], "models")


def _ignore_signals() -> None:
    """The daemon alone decides when a group stops, and tells it on the control pipe: Ctrl-C in a terminal and
    systemd's SIGTERM reach every process of the group or unit, and SIGHUP is the daemon's to act on."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def _next_command(control: Connection, timeout: float | None) -> str | None:
    """The daemon's next command ("go", "preview:CAMERA" or "stop"), None if none came within `timeout`; "stop" when
    the daemon is gone (its end of the pipe closed). A pipe, not a shared Event: no lock that a killed process could
    leave held."""
    try:
        if not control.poll(timeout):
            return None
        return str(control.recv())
    except (EOFError, OSError):
        return "stop"


def _serve(group: _GroupCameras, control: Connection) -> None:
    """Views every VIEW_INTERVAL_S, previews when asked ("preview:CAMERA"), until "stop" or every camera ended."""
    due = time.monotonic()
    heap = HeapTrimmer(multiprocessing.current_process().name)  # emotion-cameras-N
    while True:
        command = _next_command(control, max(0.0, due - time.monotonic()))
        if command == "stop":
            return
        if command is not None and command.startswith("preview:"):
            group.send_preview(command.split(":", 1)[1])
        if time.monotonic() >= due:
            group.send_views()
            heap.tick(group.cfg.inference.trim_heap_s)
            due = time.monotonic() + VIEW_INTERVAL_S
            if group.ended():
                return


def run_group(cfg: AppConfig, cameras: list[CameraConfig], out: Any, control: Connection,
              log_level: str | None, gpu: str | None = None) -> None:
    """A group process's main: load the models, say ready, start the cameras on "go", send views until "stop" (or
    until every camera ended, or the daemon is gone). `gpu`: the one GPU this group uses, made the only one CUDA
    sees here (set before anything in this process touches CUDA: the models load below)."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    _ignore_signals()
    setup_logging(log_level or cfg.logging.level, cfg.logging.format)
    cfg = sized_for_cameras(cfg, len(cameras), "camera group")  # max_batch: what its cameras can fill
    set_rtsp_transport(cfg)
    limit_opencv_threads(cfg)
    try:
        perception = load_perception(cfg)
    except MODEL_ERRORS as exc:
        out.put(("failed", mask_secrets(str(exc))))
        return
    group = _GroupCameras(cfg, cameras, perception, out)
    out.put(("ready", os.environ.get("CUDA_VISIBLE_DEVICES")))
    command = _next_command(control, None)
    while command not in ("go", "stop"):  # nothing to preview before the cameras start
        command = _next_command(control, None)
    if command == "stop":
        run_bounded(perception.close, GROUP_STOP["models"], "models")
        return
    group.start()
    try:
        _serve(group, control)
    finally:
        group.stop()
        group.send_views()
        out.put(("ended",))


# ------------------------------------------------------------------------------------------------- in the daemon


@dataclass(frozen=True)
class GroupHandlers:
    """What the daemon does with a group's news (called on the group's reader thread)."""

    observation: Callable[[Observation], None]
    camera_event: Callable[[CameraEvent], None]


class GroupStartError(ModelError):
    """A group process could not load its models (the message says why) or died while loading them."""


class CameraGroup:
    """One group process as the daemon sees it: started, read on a thread, started again when it dies, stopped."""

    def __init__(self, index: int, cfg: AppConfig, cameras: list[CameraConfig], handlers: GroupHandlers,
                 log_level: str | None = None, gpu: str | None = None) -> None:
        self.name = f"cameras-{index}"
        self.cfg, self.cameras, self.handlers, self.log_level = cfg, cameras, handlers, log_level
        self.gpu = gpu  # the GPU given to its process (CUDA_VISIBLE_DEVICES there); None: CUDA's default
        self.gpu_seen: str | None = None  # what the process reported it runs on (CUDA_VISIBLE_DEVICES), when ready
        self.views: tuple[CameraView, ...] = ()
        self.models: tuple[ModelView, ...] = ()
        self.observations_dropped = 0  # over every process the group had (each counts from 0)
        self._dropped_earlier = 0
        self.ended = False
        self._stats: dict[str, BatchStats] = {}  # one object per model for metrics' cursors, fed by each view
        self._ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads, CUDA or locks
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._exited = threading.Event()  # the reader is done: the group stopped, ended or failed before go()
        self._failure: str | None = None
        self._launched_mono = 0.0
        self._backoff = BACKOFF_S[0]
        self._process: SpawnProcess | None = None
        self._queue: Any = None
        self._go = False  # the cameras may start (a process started again is told at once)
        self._control: Connection | None = None
        self._control_lock = threading.Lock()  # the status server's threads ask for previews at once
        self._previews: dict[str, RenderedPreview | None] = {}
        self._preview_arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read_loop, name=f"group-{self.name}", daemon=True)

    def start(self) -> None:
        """Spawn the process and its reader; the process loads its models, then waits for go()."""
        self._launch()
        self._reader.start()

    def _launch(self) -> None:
        self._queue = self._ctx.Queue(QUEUE_SIZE)
        self._dropped_earlier = self.observations_dropped
        self._ready.clear()
        self._failure = None
        receive, self._control = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(target=run_group, name=f"emotion-{self.name}", daemon=True,
                                    args=(self.cfg, self.cameras, self._queue, receive, self.log_level, self.gpu))
        process.start()
        receive.close()
        self._process, self._launched_mono = process, time.monotonic()
        if self._go:
            self._command("go")
        log.info("%s: process %d started for %s%s", self.name, process.pid, ", ".join(c.name for c in self.cameras),
                 f" on GPU {self.gpu}" if self.gpu is not None else "")

    def wait_ready(self, stop: threading.Event) -> None:
        """Block until the group's models are loaded, or until `stop` is set (SIGTERM while starting: the daemon then
        stops as usual, exit 0); GroupStartError if the group failed."""
        while not self._ready.wait(0.1):
            if self._failure is not None:
                raise GroupStartError(f"{self.name}: {self._failure}")
            if self._exited.is_set():
                code = self._process.exitcode if self._process is not None else None
                raise GroupStartError(f"{self.name}: its process ended (exit code {code}) while loading the models; "
                                      f"the log above says why")
            if stop.is_set():
                return

    def go(self) -> None:
        """Let the group start its cameras (at once, or as soon as its models are loaded)."""
        self._go = True
        self._command("go")

    def preview(self, camera: str, timeout_s: float = PREVIEW_WAIT_S) -> RenderedPreview | None:
        """The camera's annotated JPEG, rendered by the group (None when it has no frame yet or does not answer)."""
        with self._preview_arrived:
            self._previews.pop(camera, None)
        self._command(f"preview:{camera}")
        with self._preview_arrived:
            self._preview_arrived.wait_for(lambda: camera in self._previews, timeout_s)
            return self._previews.get(camera)

    def _command(self, command: str) -> None:
        control = self._control
        if control is None:
            return
        try:
            with self._control_lock:
                control.send(command)
        except OSError as exc:  # the process is gone: the reader starts it again, or the group is over
            log.debug("%s: %s not delivered (%s)", self.name, command, exc)

    @property
    def pid(self) -> int | None:
        """The group's current process id (a new one after each restart)."""
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        process = self._process
        return process is not None and process.is_alive()

    def view_cameras(self) -> tuple[CameraView, ...]:
        """The group's cameras as it last described them; while its process is down, marked as not running."""
        if self.alive():
            return self.views
        return tuple(replace(view, capture_alive=False, worker_alive=False) for view in self.views)

    # ------------------------------------------------------------------ reading

    def _read_loop(self) -> None:
        while True:
            try:
                message = self._queue.get(timeout=0.25)
            except queue.Empty:
                if self._process is not None and not self._process.is_alive() and not self._died():
                    self._exited.set()
                    return
                continue
            except (EOFError, OSError):  # the queue's pipe closed with a killed process
                if not self._died():
                    self._exited.set()
                    return
                continue
            self._dispatch(message)

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "observations":  # a few at a time, in the order they were made (group_send)
            for obs in message[1]:
                self.handlers.observation(obs)
        elif kind == "event":
            self.handlers.camera_event(message[1])
        elif kind == "views":
            self.views, self.observations_dropped = message[1], self._dropped_earlier + message[3]
            self.models = tuple(self._absorb(view) for view in message[2])
        elif kind == "preview":
            with self._preview_arrived:
                self._previews[message[1]] = message[2]
                self._preview_arrived.notify_all()
        elif kind == "ready":
            self.gpu_seen = message[1] if len(message) > 1 else None
            self._ready.set()
        elif kind == "failed":
            self._failure = message[1]
        elif kind == "ended":
            self.ended = not self._stopping.is_set()

    def _absorb(self, view: ModelView) -> ModelView:
        """The group's model under a name of its own, with a BatchStats that lives as long as the group's process
        does (metrics count batches since their last pull by the identity of that object)."""
        stats = self._stats.get(view.name)
        remote = view.stats
        if stats is None or remote.batches < stats.batches:  # new, or the process was started again
            stats = self._stats[view.name] = BatchStats()
        for name, fresh in _RECENT.items():
            count = getattr(remote, fresh) - getattr(stats, fresh)
            if count > 0:
                getattr(stats, name).extend(deque_tail(getattr(remote, name), count))
        for name in ("batches", "items", "rejected", "failed", "queue_s", "compute_s"):
            setattr(stats, name, getattr(remote, name))
        return replace(view, role=f"{view.role}@{self.name}", name=f"{view.name}@{self.name}", stats=stats)

    def _died(self) -> bool:
        """The process is gone: start it again after a backoff unless the daemon stops it, its cameras ended, or it
        never got to start them (start-up reports that instead). False when the group is over."""
        if self._stopping.is_set() or self.ended or not self._go:
            return False
        code = self._process.exitcode if self._process is not None else None
        if self._failure is not None:
            log.error("%s: could not load its models: %s", self.name, self._failure)
        if time.monotonic() - self._launched_mono >= STEADY_S:
            self._backoff = BACKOFF_S[0]
        log.error("%s: process ended unexpectedly (exit code %s); starting it again in %.0f s", self.name, code,
                  self._backoff)
        if self._stopping.wait(self._backoff):
            return False
        self._backoff = min(BACKOFF_S[1], self._backoff * 2)
        self._launch()
        return True

    # ------------------------------------------------------------------ stopping

    def signal_stop(self) -> None:
        self._stopping.set()
        self._command("stop")

    def join(self, deadline: float) -> None:
        """Wait for the process until `deadline` (monotonic), then end it the hard way; then stop reading."""
        process = self._process
        if process is not None:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("%s: did not stop in time; terminating it", self.name)
                process.terminate()
                process.join(0.2)
        self._reader.join(max(0.0, deadline - time.monotonic()) + 0.3)


def start_groups(cfg: AppConfig, cameras: Sequence[CameraConfig], handlers: GroupHandlers, stop: threading.Event,
                 log_level: str | None = None) -> list[CameraGroup]:
    """Every group process started and its models loaded (not yet its cameras: call go() on each). If one fails,
    all are stopped again and GroupStartError says which and why."""
    problem = mps_problem(cfg.inference)
    if problem:
        log.warning("%s", problem)
    members = camera_groups(cameras, cfg.inference.processes)
    gpus = group_gpus(cfg.inference, len(members), visible_gpus())
    groups = [CameraGroup(index + 1, cfg, cams, handlers, log_level, gpu)
              for index, (cams, gpu) in enumerate(zip(members, gpus))]
    try:
        for group in groups:
            group.start()
        for group in groups:
            group.wait_ready(stop)
    except BaseException:
        stop_groups(groups, 2.0)
        raise
    log.info("%d camera groups ready (inference.processes %d)", len(groups), cfg.inference.processes)
    return groups


def stop_groups(groups: Sequence[CameraGroup], budget_s: float) -> None:
    """Ask every group to stop at once, then wait for all of them against one deadline."""
    deadline = time.monotonic() + budget_s
    for group in groups:
        group.signal_stop()
    for group in groups:
        group.join(deadline)
