"""One camera's per-frame walk: detect → crop → classify → track → smooth, as plain sequential code.

Batching is invisible here: the detector and classifier are shared BatchedModels; this code hands frames over and
collects their results in frame order, with up to `frames_in_flight` of them in the engine at once (one, on the OpenCV
path; two by default on the GPU frame graphs path, see inference.pending).

With `detector.interval` N > 1 only every Nth frame goes through the detector (the camera's phase within N comes from
its name, so cameras sharing the engine detect on different frames); the others classify the faces the tracker
expects there (`IouTracker.predict`) and leave the tracks as they are: only detections keep a track alive. Such a
face keeps the head pose its track had at the last detection: its landmarks there are the detection's, moved, so a fit
on them would say the same, and the fit (OpenCV's SQPnP, ~0.1 ms a face) was the largest share of a camera group's
CPU at 160 cameras on the H200 after decoding (BENCHMARKS.md).
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.capture.stats import RateMeter
from pipeline.capture.thread import CaptureThread
from pipeline.core.logrepeat import RepeatLimiter
from pipeline.core.threads import name_native_thread
from pipeline.core.types import Detection, EmotionScores, FaceResult, Frame, FrameImage, HeadPose, Observation
from pipeline.inference.batching import ModelClosedError, QueueFullError
from pipeline.inference.pending import PendingAnalysis
from pipeline.inference.perception import Analyzer
from pipeline.vision.follow import BatchLook
from pipeline.vision.head_pose import head_pose
from pipeline.vision.track import IouTracker

log = logging.getLogger(__name__)


@dataclass
class WorkerStats:
    analysed: RateMeter = field(default_factory=RateMeter)
    skipped_busy: int = 0
    errors: int = 0
    faces: int = 0
    last_latency_ms: float = 0.0
    most_in_flight: int = 0  # the most frames this camera had handed to the engine and not yet collected
    heartbeat: float = field(default_factory=time.monotonic)


class CameraWorker(threading.Thread):
    """Takes the newest frame of one camera (capture already applies the fps cap) and publishes an Observation."""

    def __init__(self, capture: CaptureThread, perception: Analyzer, tracker: IouTracker,
                 publish: Callable[[Observation], None], stop: threading.Event) -> None:
        super().__init__(name=f"worker-{capture.cfg.name}", daemon=True)
        self.capture = capture
        self.perception = perception
        self.tracker = tracker
        self.publish = publish
        self.stats = WorkerStats()
        self._failures = RepeatLimiter(log)  # every frame fails alike while a backend is down
        self._stop_event = stop
        self._frames_begun = zlib.crc32(capture.cfg.name.encode())  # the detection phase: staggered by name
        self._poses: dict[int, HeadPose | None] = {}  # each track's head pose at the last detection frame
        self._detections = 0  # detection frames observed: tracking.pose_every counts them
        self._followed = 0  # frames without detection begun: emotion.flip_followed alternates by them

    def run(self) -> None:
        name_native_thread()
        last_index = 0
        depth = max(1, self.perception.frames_in_flight)
        pending: deque[tuple[Frame, PendingAnalysis, list[int] | None]] = deque()
        slot = self.capture.slot
        while not self._stop_event.is_set():
            self.stats.heartbeat = time.monotonic()
            if pending and (pending[0][1].done() or len(pending) >= depth or slot.closed):
                self._collect(*pending.popleft())
                continue
            oldest = pending[0][1] if pending else None
            frame = slot.take_newer(last_index, timeout=0.25, unless=oldest.done if oldest else None)
            if frame is None:
                if slot.closed and not pending:
                    break
                continue
            last_index = frame.index
            begun, tracked = self._begin(frame)
            if begun is not None:
                begun.add_done_callback(slot.wake)  # the wait above also ends when this frame's batch has run
                pending.append((frame, begun, tracked))
                self.stats.most_in_flight = max(self.stats.most_in_flight, len(pending))

    def _begin(self, frame: Frame) -> tuple[PendingAnalysis | None, list[int] | None]:
        """The frame handed to the engine, and for a frame without detection the track ids of its faces."""
        self._frames_begun += 1
        detect = self.perception.interval <= 1 or self._frames_begun % self.perception.interval == 0
        batched = self.tracker.looks_in_batches(self.perception.searches_in_batches)
        try:
            if detect:
                return self.perception.begin(frame.image, templates=batched), None
            tracked = self.tracker.predict(frame.t_mono, None if batched else self._pixels(frame))
            faces, ids = [face for _, face in tracked], [track_id for track_id, _ in tracked]
            turn, self._followed = self._followed, self._followed + 1
            templates = self.tracker.templates_for(ids) if batched else None
            return self.perception.begin_tracked(frame.image, faces, turn, templates), ids
        except QueueFullError:
            self.stats.skipped_busy += 1
        except ModelClosedError:
            pass
        except Exception as exc:  # noqa: BLE001 - one bad frame must not end the camera
            self._failed(frame, exc)
        return None, None

    def _pixels(self, frame: Frame) -> FrameImage | None:
        """The frame for a tracker that follows faces by their look (None: it does not; `tracking.follow_by`)."""
        return self.tracker.searchable(frame.image)

    def _collect(self, frame: Frame, pending: PendingAnalysis, tracked: list[int] | None = None) -> None:
        try:
            faces, scores, timings = pending.result()
        except ModelClosedError:
            return
        except Exception as exc:  # noqa: BLE001 - one bad frame must not end the camera
            self._failed(frame, exc)
            return
        try:
            self.publish(self.observe(frame, faces, scores, timings, tracked, pending.look()))
        except Exception as exc:  # noqa: BLE001 - nor one bad observation: a raise here ended the worker's thread
            self._failed(frame, exc)

    def _failed(self, frame: Frame, exc: Exception) -> None:
        self.stats.errors += 1
        self._failures.log(logging.WARNING, type(exc).__name__, "camera %s frame %d: analysis failed: %s",
                           frame.camera, frame.index, exc)

    def observe(self, frame: Frame, faces: list[Detection], scores: list[EmotionScores],
                timings: dict[str, float], tracked: list[int] | None = None,
                look: BatchLook | None = None) -> Observation:
        """Attach track ids (a detection frame's from the tracker's matching; a frame without detection's are the
        ones its faces were predicted for, `tracked`) and smoothed scores; build the Observation. `look`: what the
        engine's batch search gave the frame (templates, or which faces it found), for the tracker."""
        ids = self._tracked_ids(frame, faces, tracked, look)
        poses = self._head_poses(frame, faces, ids, followed=tracked is not None)
        results = tuple(
            FaceResult(face, score, track_id, self.tracker.smooth(track_id, score, frame.t_mono), pose)
            for face, score, track_id, pose in zip(faces, scores, ids, poses)
        )
        width, height = frame.size
        self.stats.analysed.mark()
        self.stats.faces = len(results)
        self.stats.last_latency_ms = (time.monotonic() - frame.t_mono) * 1e3
        return Observation(frame.camera, frame.index, frame.t_mono, frame.t_wall, (width, height), results, timings)

    def _tracked_ids(self, frame: Frame, faces: list[Detection], tracked: list[int] | None,
                     look: BatchLook | None) -> list[int]:
        """A detection frame's track ids from the tracker (its faces' looks kept: cut by the engine when `look` has
        them, else by the tracker from the frame); a followed frame's are `tracked`, the tracks moved to the faces
        the engine found by their look."""
        if tracked is not None:
            if look is not None and look.found is not None:
                self.tracker.found_at(tracked, faces, look.found, frame.t_mono)
            return tracked
        if look is not None and look.templates is not None:
            return self.tracker.update(faces, frame.t_mono, templates=look.templates)
        return self.tracker.update(faces, frame.t_mono, self._pixels(frame))

    def _head_poses(self, frame: Frame, faces: list[Detection], ids: list[int],
                    followed: bool) -> list[HeadPose | None]:
        """Each face's head pose: fitted on a detection frame (and remembered per track), the track's last one on a
        frame without detection; a track without a pose yet is always fitted. With tracking.pose_every N a track is
        refitted on every Nth detection only, staggered by track id so that each detection fits about 1/N of the
        faces."""
        hfov = self.capture.cfg.placement.hfov_deg
        if followed:
            return [self._poses[track_id] if track_id in self._poses else head_pose(face.landmarks, frame.size, hfov)
                    for face, track_id in zip(faces, ids)]
        self._detections += 1
        every = self.tracker.pose_every
        poses = [self._poses[track_id] if track_id in self._poses and (self._detections + track_id) % every
                 else head_pose(face.landmarks, frame.size, hfov) for face, track_id in zip(faces, ids)]
        self._poses = dict(zip(ids, poses))  # only the tracks seen now: ended ones are dropped
        return poses
