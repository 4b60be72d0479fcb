"""One camera's per-frame walk: detect → crop → classify → track → smooth, as plain sequential code.

Batching is invisible here: the detector and classifier are shared BatchedModels; this code hands frames over and
collects their results in frame order, with up to `frames_in_flight` of them in the engine at once (one, on the OpenCV
path; two by default on the GPU frame graphs path, see inference.pending).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.capture.stats import RateMeter
from pipeline.capture.thread import CaptureThread
from pipeline.core.logrepeat import RepeatLimiter
from pipeline.core.types import Detection, EmotionScores, FaceResult, Frame, Observation
from pipeline.inference.batching import ModelClosedError, QueueFullError
from pipeline.inference.pending import PendingAnalysis
from pipeline.inference.perception import Analyzer
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

    def run(self) -> None:
        last_index = 0
        depth = max(1, self.perception.frames_in_flight)
        pending: deque[tuple[Frame, PendingAnalysis]] = deque()
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
            begun = self._begin(frame)
            if begun is not None:
                begun.add_done_callback(slot.wake)  # the wait above also ends when this frame's batch has run
                pending.append((frame, begun))
                self.stats.most_in_flight = max(self.stats.most_in_flight, len(pending))

    def _begin(self, frame: Frame) -> PendingAnalysis | None:
        try:
            return self.perception.begin(frame.image)
        except QueueFullError:
            self.stats.skipped_busy += 1
        except ModelClosedError:
            pass
        except Exception as exc:  # noqa: BLE001 - one bad frame must not end the camera
            self._failed(frame, exc)
        return None

    def _collect(self, frame: Frame, pending: PendingAnalysis) -> None:
        try:
            faces, scores, timings = pending.result()
        except ModelClosedError:
            return
        except Exception as exc:  # noqa: BLE001 - one bad frame must not end the camera
            self._failed(frame, exc)
            return
        self.publish(self.observe(frame, faces, scores, timings))

    def _failed(self, frame: Frame, exc: Exception) -> None:
        self.stats.errors += 1
        self._failures.log(logging.WARNING, type(exc).__name__, "camera %s frame %d: analysis failed: %s",
                           frame.camera, frame.index, exc)

    def observe(self, frame: Frame, faces: list[Detection], scores: list[EmotionScores],
                timings: dict[str, float]) -> Observation:
        """Attach track ids and smoothed scores; build the Observation."""
        ids = self.tracker.update(faces, frame.t_mono)
        results = tuple(
            FaceResult(face, score, track_id, self.tracker.smooth(track_id, score, frame.t_mono))
            for face, score, track_id in zip(faces, scores, ids)
        )
        width, height = frame.size
        self.stats.analysed.mark()
        self.stats.faces = len(results)
        self.stats.last_latency_ms = (time.monotonic() - frame.t_mono) * 1e3
        return Observation(frame.camera, frame.index, frame.t_mono, frame.t_wall, (width, height), results, timings)
