"""The JSON events of SPEC.md: observation, command, camera, config. One function per event type, nothing else."""

from __future__ import annotations

import time
from os import PathLike
from typing import Any

from pipeline.core.redact import mask_secrets
from pipeline.core.types import CameraEvent, Command, FaceResult, Observation

Event = dict[str, Any]


def face_json(face: FaceResult, with_track: bool = True) -> dict[str, Any]:
    det = face.detection
    out: dict[str, Any] = {}
    if with_track and face.track_id is not None:
        out["track_id"] = face.track_id
    out.update({
        "box": [round(v, 1) for v in det.box],
        "score": round(det.score, 4),
        "landmarks": [[round(float(x), 1), round(float(y), 1)] for x, y in det.landmarks],
        "emotion": face.scores.emotion,
        "confidence": round(face.scores.confidence, 4),
        "probs": face.scores.as_dict(),
    })
    if face.smoothed is not None:
        out["smoothed"] = {"emotion": face.smoothed.emotion, "confidence": round(face.smoothed.confidence, 4)}
    if face.head is not None:
        out["head"] = {"yaw": face.head.yaw, "pitch": face.head.pitch, "roll": face.head.roll,
                       "looking": face.head.looking}
    return out


def observation_event(obs: Observation) -> Event:
    latency = dict(obs.latency_ms)
    latency["total"] = round((time.monotonic() - obs.t_mono) * 1000.0, 1)
    return {
        "type": "observation",
        "camera": obs.camera,
        "ts": round(obs.t_wall, 3),
        "frame": obs.frame_index,
        "latency_ms": {k: round(v, 1) for k, v in latency.items()},
        "faces": [face_json(f) for f in obs.faces],
    }


def command_event(cmd: Command) -> Event:
    return {
        "type": "command",
        "camera": cmd.camera,
        "avatar": cmd.avatar,
        "ts": round(time.time(), 3),
        "target": cmd.target,
        "emotion": cmd.emotion,
        "confidence": cmd.confidence,
        "reason": cmd.reason,
        "expression": {"preset": cmd.expression.preset, "weight": cmd.expression.weight,
                       "blend_ms": cmd.expression.blend_ms},
        "tone": {"style": cmd.tone.style, "style_degree": cmd.tone.style_degree, "pitch": cmd.tone.pitch,
                 "rate": cmd.tone.rate, "volume": cmd.tone.volume},
        "latency_ms": {"total": round((time.monotonic() - cmd.t_mono) * 1000.0, 1)} if cmd.t_mono else {},
    }


def lookat_event(stream: str, avatar: str | None, camera: str, track_id: int | None, yaw: float, pitch: float,
                 point: tuple[float, float, float]) -> Event:
    """Where a stream's avatar should look (behavior.lookat): the attended face's direction from the avatar's eyes,
    in degrees (yaw positive to the avatar's right, pitch up), and its position in metres; `target` None: ahead."""
    return {"type": "lookat", "camera": camera, "avatar": avatar, "stream": stream, "ts": round(time.time(), 3),
            "target": track_id, "yaw": yaw, "pitch": pitch, "point": list(point)}


def presence_event(kind: str, camera: str, avatar: str | None, track_id: int, t_wall: float,
                   dwell_s: float | None = None) -> Event:
    """A visitor `arrived`, `left` (with `dwell_s`), or started (`looking`) or stopped (`looking_away`) looking at
    the camera (behavior.presence)."""
    event: Event = {"type": "presence", "camera": camera, "avatar": avatar, "ts": round(t_wall, 3), "event": kind,
                    "track_id": track_id}
    if dwell_s is not None:
        event["dwell_s"] = dwell_s
    return event


def current_json(command: Event) -> dict[str, Any]:
    """What a WebSocket snapshot says of one stream's current command: emotion, expression, tone, and which camera
    and when (the command event's fields)."""
    return {key: command[key] for key in ("emotion", "expression", "tone", "camera", "target", "ts")}


def snapshot_event(cameras: dict[str, str], current: dict[str, dict[str, Any] | None],
                   looks: dict[str, dict[str, Any] | None] | None = None) -> Event:
    """The first message of every /ws client: each camera's state and each avatar's (without avatars: each
    camera's) current expression and tone, None before its first command, and where it looks (its last lookat
    event, None before the first), so a late joiner starts in step."""
    return {"type": "snapshot", "camera": None, "ts": round(time.time(), 3), "cameras": cameras,
            "avatars": current, "looks": looks or {}}


def camera_event(event: CameraEvent) -> Event:
    return {"type": "camera", "camera": event.camera, "ts": round(event.ts, 3), "state": event.state,
            "detail": mask_secrets(event.detail)}


def config_event(status: str, path: str | PathLike[str] | None, changes: list[str] | None = None,
                 errors: list[str] | None = None) -> Event:
    """A SIGHUP reload's outcome: `applied` with the phrases of what changed, or `rejected` with every error."""
    event: Event = {"type": "config", "camera": None, "ts": round(time.time(), 3), "status": status,
                    "path": str(path)}
    if changes is not None:
        event["changes"] = changes
    if errors is not None:
        event["errors"] = errors
    return event
