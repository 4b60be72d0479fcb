"""Issue 27's measurements: head pose on real photos, and the look-at stream as an avatar app receives it.

    python tools/lookat_check.py [--photos ../shared/data/faces/wild] [--video ../shared/data/video/woman2.mp4]

1. Head pose: the detector on every photo and on its mirror image; |yaw + yaw'|, |pitch - pitch'| and |roll + roll'|
   (0 for a perfect, symmetric estimate), the share of faces with symmetric landmarks that come out frontal, and the
   cost per face.
2. The stream: the real OSC output (VMC, 30 Hz, look_at) sending to a real UDP socket on this machine.
   - step: the target jumps 20° to the side; when the received direction is within 2° of it, and whether it ever
     passed it;
   - rate: bundles received per second over 5 s;
   - still face: one frame of the video with camera-like noise (σ 2 grey levels) at 15 fps through the detector,
     each detection's direction a target: the spread (σ) of the targets and of the streamed direction.
Prints one JSON object (BENCHMARKS.md quotes it). Needs the prepared models (run_pipeline.py prepare-models).
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pythonosc import osc_packet  # noqa: E402

from pipeline.behavior.lookat import angles, face_point  # noqa: E402
from pipeline.capture.settings import Placement  # noqa: E402
from pipeline.config.app import load_config  # noqa: E402
from pipeline.core.types import EmotionScores, FaceResult, HeadPose  # noqa: E402
from pipeline.inference.perception import Perception  # noqa: E402
from pipeline.outputs.osc import VMC_EYE, OscOutput, OscSink  # noqa: E402
from pipeline.vision.head_pose import head_pose  # noqa: E402


@dataclass(frozen=True)
class MirroredPose:
    """One photo's largest face: its landmarks, the frame size, its pose, the pose of the mirrored photo's largest
    face (each from its own detection), and whether its landmarks are symmetric (nose within 5 % of the eye distance
    from the eyes' midpoint)."""

    landmarks: np.ndarray
    size: tuple[int, int]
    pose: HeadPose | None
    mirrored: HeadPose | None
    symmetric: bool


def mirrored_poses(perception: Perception, paths: list[Path]) -> list[MirroredPose]:
    """The detector on each photo and on its mirror image (photos where either has no face are left out)."""
    found = []
    for path in paths:
        image = cv2.imread(str(path))
        if image is None:
            continue
        faces = perception.detector.detect(image, 30)
        mirrored = perception.detector.detect(np.ascontiguousarray(image[:, ::-1]), 30)
        if not faces or not mirrored:
            continue
        a, b = max(faces, key=lambda d: d.area), max(mirrored, key=lambda d: d.area)
        size = (image.shape[1], image.shape[0])
        eye_a, eye_b, nose = a.landmarks[0], a.landmarks[1], a.landmarks[2]
        symmetric = bool(abs(nose[0] - (eye_a[0] + eye_b[0]) / 2) < 0.05 * abs(eye_b[0] - eye_a[0]))
        found.append(MirroredPose(a.landmarks, size, head_pose(a.landmarks, size), head_pose(b.landmarks, size),
                                  symmetric))
    return found


def head_pose_figures(perception: Perception, photos: Path) -> dict[str, Any]:
    found = mirrored_poses(perception, sorted(photos.rglob("*.*")))
    pairs = [(m.pose, m.mirrored) for m in found if m.pose is not None and m.mirrored is not None]
    yaw = [abs(a.yaw + b.yaw) for a, b in pairs]
    pitch = [abs(a.pitch - b.pitch) for a, b in pairs]
    roll = [abs(a.roll + b.roll) for a, b in pairs]
    frontal = [abs(m.pose.yaw) < 10 for m in found if m.symmetric and m.pose is not None and m.mirrored is not None]
    seen = [(m.landmarks, m.size) for m in found]

    def spread(values: list[float]) -> dict[str, float]:
        v = np.asarray(values)
        return {"median": round(float(np.median(v)), 2), "p90": round(float(np.percentile(v, 90)), 2),
                "max": round(float(v.max()), 2), "within_3": round(float((v <= 3).mean()), 3)}
    return {"faces": len(yaw), "mirror_yaw_sum": spread(yaw), "mirror_pitch_diff": spread(pitch),
            "mirror_roll_sum": spread(roll), "symmetric_faces": len(frontal),
            "symmetric_frontal_share": round(float(np.mean(frontal)), 3), "ms_per_face": _cost_ms(seen),
            "detect_ms_per_photo": _detect_ms(perception, sorted(photos.rglob("*.*"))[:40])}


def _detect_ms(perception: Perception, paths: list[Path]) -> float:
    """Wall time of the detector per photo (with detector.flip: both runs), median of 3 passes over `paths`."""
    images = [image for image in (cv2.imread(str(path)) for path in paths) if image is not None]
    passes = []
    for _ in range(3):
        started = time.perf_counter()
        for image in images:
            perception.detector.detect(image, 30)
        passes.append((time.perf_counter() - started) / max(len(images), 1) * 1e3)
    return round(float(np.median(passes)), 2)


def _cost_ms(seen: list[tuple[np.ndarray, tuple[int, int]]], rounds: int = 20) -> float:
    """CPU time of head_pose per face, over every face found, `rounds` times (process time: the cost, not waits)."""
    started = time.process_time()
    for _ in range(rounds):
        for landmarks, size in seen:
            head_pose(landmarks, size)
    return round((time.process_time() - started) / (rounds * len(seen)) * 1e3, 3)


class Receiver:
    """A UDP socket on 127.0.0.1 recording (arrival time, yaw, pitch) of each bundle's /VMC/Ext/Set/Eye."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.eyes: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            for message in osc_packet.OscPacket(data).messages:
                if message.message.address == VMC_EYE:
                    _, x, y, z = message.message.params
                    self.eyes.append((time.monotonic(), *angles((x, y, z))))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1)
        self.sock.close()


def _look(sink: OscSink, yaw: float, pitch: float = 0.0) -> None:
    sink.offer({"type": "lookat", "camera": "c", "avatar": None, "stream": "c", "ts": time.time(), "target": 1,
                "yaw": yaw, "pitch": pitch, "point": [0.0, 0.0, 1.0]})


def stream_figures(perception: Perception, video: Path) -> dict[str, Any]:
    receiver = Receiver()
    sink = OscSink(OscOutput(port=receiver.port, rate_hz=30))
    sink.start()
    try:
        _look(sink, 0.0)
        time.sleep(1.0)
        stepped = time.monotonic()
        _look(sink, 20.0)
        time.sleep(1.5)
        after = [(t - stepped, yaw) for t, yaw, _ in receiver.eyes if t >= stepped]
        settle = next((t for t, yaw in after if abs(yaw - 20.0) <= 2.0), None)
        overshoot = max(yaw for _, yaw in after) - 20.0
        counted = len(receiver.eyes)
        time.sleep(5.0)
        rate = (len(receiver.eyes) - counted) / 5.0
        still = _still_face(sink, receiver, perception, video)
    finally:
        sink.close()
        receiver.close()
    return {"step_20deg_within_2deg_ms": None if settle is None else round(settle * 1e3),
            "overshoot_deg": round(max(0.0, overshoot), 3), "rate_hz": round(rate, 2), "rate_wanted_hz": 30,
            **still}


def _still_face(sink: OscSink, receiver: Receiver, perception: Perception, video: Path) -> dict[str, Any]:
    capture = cv2.VideoCapture(str(video))
    ok, frame = capture.read()
    capture.release()
    if not ok:
        return {}
    rng = np.random.default_rng(27)
    size, targets = (frame.shape[1], frame.shape[0]), []
    scores = EmotionScores(np.full(7, 1 / 7, np.float32))
    started = time.monotonic()
    for index in range(60):  # 4 s at 15 fps
        noisy = np.clip(frame.astype(np.float32) + rng.normal(0, 2, frame.shape), 0, 255).astype(np.uint8)
        faces = perception.detector.detect(noisy, 30)
        if faces:
            face = max(faces, key=lambda d: d.area)
            yaw, pitch = angles(face_point(FaceResult(face, scores), size, Placement()))
            targets.append(yaw)
            _look(sink, yaw, pitch)
        time.sleep(max(0.0, started + (index + 1) / 15.0 - time.monotonic()))
    streamed = [yaw for t, yaw, _ in receiver.eyes if t >= started + 1.0]
    return {"still_face_target_sd_deg": round(float(np.std(targets)), 3),
            "still_face_streamed_sd_deg": round(float(np.std(streamed)), 3), "still_face_targets": len(targets)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, default=ROOT.parent / "shared/data/faces/wild")
    parser.add_argument("--video", type=Path, default=ROOT.parent / "shared/data/video/woman2.mp4")
    parser.add_argument("--detector-flip", action="store_true",
                        help="with detector.flip: the detector also run on each image's mirror (head pose only)")
    args = parser.parse_args()
    config = load_config(ROOT / "config/default.yaml")
    if args.detector_flip:
        config = config.model_copy(update={"detector": config.detector.model_copy(update={"flip": True})})
    perception = Perception.from_config(config)
    try:
        result: dict[str, Any] = {"detector_flip": args.detector_flip,
                                  "head_pose": head_pose_figures(perception, args.photos)}
        if not args.detector_flip:
            result["stream"] = stream_figures(perception, args.video)
    finally:
        perception.close()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
