"""Annotated camera previews for the status page: the newest analysed frame with boxes, track ids and emotion bars.

Cheap by construction: workers only store a reference to their latest Frame and Observation (no copy, no drawing);
a JPEG is drawn and encoded only when a client asks, at most `preview_fps` times a second per camera however many
clients watch, and scaled down to at most MAX_WIDTH pixels first.

The analysed frame is kept only while someone watches the camera (asked within WATCH_S): a kept frame pins its
pixels, and on the GPU frame path that is one of the camera's pool buffers (6.2 MB at 1080p; 64 cameras took 1 GB
less GPU memory without them: BENCHMARKS.md, issue 25, round 12) for a page nobody may open. The first tile after a
quiet spell shows the capture's newest frame with the latest observation drawn on it (at most a frame or two newer
than what was analysed); the tiles after it show the analysed frame itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from pipeline.core.types import EMOTIONS, Frame, Observation

MAX_WIDTH = 640
JPEG_QUALITY = 70
ATTENDED_COLOUR = (255, 255, 255)  # BGR: the second frame around the face the avatar looks at
STALE_ANALYSIS_S = 2.0  # an analysed frame older than this is replaced by the raw newest frame (analysis stuck)
WATCH_S = 10.0  # a camera whose preview was asked for within this many seconds is watched: its frames are kept

# BGR colours per emotion, so a tile reads at a glance.
COLOURS: dict[str, tuple[int, int, int]] = {
    "angry": (60, 60, 230), "disgust": (60, 150, 60), "fear": (170, 90, 170), "happy": (40, 200, 250),
    "sad": (200, 120, 40), "surprise": (230, 200, 60), "neutral": (190, 190, 190),
}


@dataclass(frozen=True)
class RenderedPreview:
    jpeg: bytes
    key: tuple[int, ...]  # (frame index, annotated?, attended track or -1): what it shows, so senders skip repeats
    rendered_mono: float


class PreviewStore:
    """Latest frame + observation per camera, and a per-camera cache of the rendered JPEG."""

    def __init__(self, fps: float, raw_frame: Callable[[str], Frame | None] | None = None,
                 remote: Callable[[str], RenderedPreview | None] | None = None,
                 attended: Callable[[str], int | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`attended(camera)`: the track the avatar looks at on that camera (marked on its tile), None: nobody.
        `clock`: monotonic seconds (frames' and observations' `t_mono` are on the same clock)."""
        self.fps = fps
        self._clock = clock
        self._attended = attended or (lambda _name: None)
        self.renders = 0
        self._raw_frame = raw_frame or (lambda _name: None)
        self._remote = remote  # a camera whose frames are in another process (a camera group) renders there
        self._latest: dict[str, tuple[Frame | None, Observation]] = {}
        self._asked: dict[str, float] = {}  # camera -> when its preview was last asked for (monotonic)
        self._cache: dict[str, RenderedPreview] = {}
        self._lock = threading.Lock()
        self._render_locks: dict[str, threading.Lock] = {}

    def update(self, frame: Frame, obs: Observation) -> None:
        """Called by a worker for every observation: one dict assignment; the frame is kept only while watched."""
        self._latest[frame.camera] = (frame if self.watched(frame.camera, self._clock()) else None, obs)

    def watched(self, camera: str, now: float) -> bool:
        """Whether a client asked for this camera's preview within WATCH_S of `now` (monotonic)."""
        asked = self._asked.get(camera)
        return self.fps > 0 and asked is not None and now - asked <= WATCH_S

    def forget(self, camera: str) -> None:
        with self._lock:
            self._latest.pop(camera, None)
            self._asked.pop(camera, None)
            self._cache.pop(camera, None)

    def jpeg(self, camera: str) -> RenderedPreview | None:
        """The camera's preview, re-rendered only when the cached one is older than 1/fps and a newer frame exists."""
        if self.fps <= 0:
            return None
        with self._lock:
            lock = self._render_locks.setdefault(camera, threading.Lock())
        with lock:  # two clients asking at once share one render
            cached = self._cache.get(camera)
            now = self._clock()
            self._asked[camera] = now
            if cached is not None and now - cached.rendered_mono < 1.0 / self.fps:
                return cached
            frame, obs = self._pick(camera, now)
            if frame is None:
                return self._remote_jpeg(camera) or cached
            attended = self._attended(camera) if obs is not None else None
            key = (frame.index, int(obs is not None), -1 if attended is None else attended)
            if cached is not None and cached.key == key:
                return cached
            image = annotate(frame.host_image(), obs, attended=attended)
            ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
            if not ok:
                return cached
            rendered = RenderedPreview(encoded.tobytes(), key, now)
            self._cache[camera] = rendered
            self.renders += 1
            return rendered

    def _remote_jpeg(self, camera: str) -> RenderedPreview | None:
        """A camera of another process: its preview from there, cached here like a local one (same rate limit)."""
        rendered = self._remote(camera) if self._remote is not None else None
        if rendered is not None:
            self._cache[camera] = rendered
        return rendered

    def _pick(self, camera: str, now: float) -> tuple[Frame | None, Observation | None]:
        """The latest analysed frame and its observation; the capture's newest frame alone when the analysis is
        stale, or with the latest observation when its frame was not kept (nobody was watching)."""
        frame, obs = self._latest.get(camera, (None, None))
        if obs is None or now - obs.t_mono > STALE_ANALYSIS_S:
            return self._raw_frame(camera), None
        if frame is None:
            raw = self._raw_frame(camera)
            return (raw, obs) if raw is not None else (None, None)
        return frame, obs


def annotate(image: np.ndarray, obs: Observation | None, max_width: int = MAX_WIDTH,
             attended: int | None = None) -> np.ndarray:
    """A scaled copy of `image` with each face's box, track id, top emotion and the seven probabilities as bars; the
    face whose track is `attended` (the one the avatar reads and looks at) framed twice and labelled "looked at"."""
    height, width = image.shape[:2]
    scale = min(1.0, max_width / float(width))
    out = cv2.resize(image, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA) \
        if scale < 1.0 else image.copy()
    if obs is None:
        return out
    for face in obs.faces:
        scores = face.smoothed or face.scores
        colour = COLOURS.get(scores.emotion, (255, 255, 255))
        x1, y1, x2, y2 = (int(round(v * scale)) for v in face.detection.box)
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, 2)
        tid = "" if face.track_id is None else f"#{face.track_id} "
        mark = ""
        if attended is not None and face.track_id == attended:
            cv2.rectangle(out, (x1 - 5, y1 - 5), (x2 + 5, y2 + 5), ATTENDED_COLOUR, 2)
            mark = " looked at"
        _label(out, f"{tid}{scores.emotion} {scores.confidence:.2f}{mark}", (x1, max(12, y1 - 4)), colour)
        _bars(out, scores.probs, x2 + 4 if x2 + 96 < out.shape[1] else max(0, x1 - 96), max(0, y1))
    return out


def _label(image: np.ndarray, text: str, origin: tuple[int, int], colour: tuple[int, int, int]) -> None:
    (tw, th), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.45, 1)
    x, y = origin
    cv2.rectangle(image, (x, y - th - 4), (x + tw + 4, y + 2), colour, -1)
    cv2.putText(image, text, (x + 2, y - 2), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)


def _bars(image: np.ndarray, probs: np.ndarray, x: int, y: int) -> None:
    """Seven labelled horizontal bars, 90 px wide, on a dark backing so they read on any picture."""
    row = 11
    bottom = min(image.shape[0], y + row * len(EMOTIONS) + 2)
    if bottom - y < row * 2:
        return
    region = image[y:bottom, x:x + 92]
    region[:] = (region * 0.35).astype(np.uint8)
    for i, (name, p) in enumerate(zip(EMOTIONS, probs)):
        top = y + 1 + i * row
        if top + row > image.shape[0]:
            break
        length = int(round(float(p) * 60))
        cv2.rectangle(image, (x + 30, top + 2), (x + 30 + max(1, length), top + row - 2), COLOURS[name], -1)
        cv2.putText(image, name[:3], (x + 2, top + row - 2), cv2.FONT_HERSHEY_SIMPLEX, 0.33, (235, 235, 235), 1,
                    cv2.LINE_AA)
