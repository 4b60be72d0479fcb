"""Small immutable records passed between the pipeline's stages.

They carry numpy arrays but never a reference back to a stage, so any of them can cross a queue or a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np

EMOTIONS: tuple[str, ...] = ("angry", "disgust", "fear", "happy", "sad", "surprise", "neutral")
"""The canonical seven emotions, in the order every probability vector uses."""

CameraState = Literal["starting", "streaming", "stalled", "reconnecting", "stopped", "ended"]


ChannelOrder = Literal["rgb", "bgr"]


@runtime_checkable
class DeviceImage(Protocol):
    """A decoded frame that stays in GPU memory (NVDEC's output): H x W x 3 uint8, interleaved, in `order`.

    Its memory is the image's own and stays valid while the object is referenced; dropping the last reference gives
    it back to the camera's pool. Only the GPU frame path reads `ptr`; anything that needs pixels on the host (the
    preview) calls `to_host()`, which copies."""

    @property
    def shape(self) -> tuple[int, int, int]: ...

    @property
    def order(self) -> ChannelOrder: ...

    @property
    def ptr(self) -> int: ...

    def to_host(self) -> np.ndarray:
        """The pixels as a host BGR array (a copy from the GPU)."""
        ...

    def windows(self, boxes: Sequence[tuple[int, int, int, int]]) -> list[np.ndarray]:
        """For each (x1, y1, x2, y2) (whole pixels, end excluded, within the image) the pixels of that window as a
        host BGR array: copies of the windows alone, in one round trip, for following faces by their look without
        bringing the frame down."""
        ...


FrameImage = np.ndarray | DeviceImage
"""What a camera delivers: host BGR pixels (H x W x 3 uint8) or a DeviceImage."""


@dataclass(frozen=True)
class Frame:
    """One decoded image from a camera, stamped when it was read."""

    camera: str
    index: int
    image: FrameImage  # host: H x W x 3, uint8, BGR (OpenCV order); or a DeviceImage on the GPU frame path
    t_mono: float  # time.monotonic() at capture, for latency
    t_wall: float  # time.time() at capture, for events

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        height, width = self.image.shape[:2]
        return int(width), int(height)

    def host_image(self) -> np.ndarray:
        """BGR pixels on the host; a frame on the GPU is copied down (only the preview needs this)."""
        image = self.image
        return image if isinstance(image, np.ndarray) else image.to_host()


@dataclass(frozen=True)
class Detection:
    """A face found by the detector, in pixels of the original frame."""

    box: tuple[float, float, float, float]  # x1, y1, x2, y2
    score: float
    landmarks: np.ndarray  # 5 x 2: right eye, left eye, nose, right mouth corner, left mouth corner

    @property
    def width(self) -> float:
        return self.box[2] - self.box[0]

    @property
    def height(self) -> float:
        return self.box[3] - self.box[1]

    @property
    def area(self) -> float:
        return max(0.0, self.width) * max(0.0, self.height)


@dataclass(frozen=True)
class EmotionScores:
    """A probability vector over EMOTIONS with its top label."""

    probs: np.ndarray  # shape (7,), float32, sums to 1

    @property
    def emotion(self) -> str:
        return EMOTIONS[int(np.argmax(self.probs))]

    @property
    def confidence(self) -> float:
        return float(np.max(self.probs))

    def as_dict(self) -> dict[str, float]:
        return {name: round(float(p), 4) for name, p in zip(EMOTIONS, self.probs)}


@dataclass(frozen=True)
class HeadPose:
    """A head's rotation in the camera's frame, degrees (vision.head_pose), and whether it faces the camera."""

    yaw: float
    pitch: float
    roll: float
    looking: bool


@dataclass(frozen=True)
class FaceResult:
    """One face of one frame: where it is, who it is (track), how it feels now and smoothed, where it faces."""

    detection: Detection
    scores: EmotionScores
    track_id: int | None = None
    smoothed: EmotionScores | None = None
    head: HeadPose | None = None


@dataclass(frozen=True)
class Observation:
    """Everything one camera saw in one analysed frame."""

    camera: str
    frame_index: int
    t_mono: float  # capture time (monotonic)
    t_wall: float  # capture time (wall clock)
    frame_size: tuple[int, int]  # width, height
    faces: tuple[FaceResult, ...]
    latency_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Expression:
    """An avatar facial expression: a VRM 1.0 preset or custom name, its weight and blend time."""

    preset: str
    weight: float
    blend_ms: int


@dataclass(frozen=True)
class Tone:
    """How the avatar's voice should sound, in SSML prosody terms."""

    style: str
    pitch: str = "+0%"
    rate: str = "+0%"
    volume: str = "+0%"
    style_degree: float = 1.0


@dataclass(frozen=True)
class Command:
    """What the behaviour mapper decided the avatar should do."""

    camera: str
    ts: float  # wall clock
    target: int | None  # track id the avatar reacts to; None for room mood or idle
    emotion: str
    confidence: float
    expression: Expression
    tone: Tone
    t_mono: float = 0.0  # capture time of the observation that caused it, for latency
    reason: str = "emotion"  # emotion | idle
    avatar: str | None = None  # the avatar (avatars: section) the command is for; None for a per-camera stream


@dataclass(frozen=True)
class CameraEvent:
    """A camera changed lifecycle state."""

    camera: str
    ts: float
    state: CameraState
    detail: str = ""
