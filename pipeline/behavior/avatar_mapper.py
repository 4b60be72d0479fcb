"""AvatarMapper: one avatar over several cameras, and BehaviorRouter, which sends each camera to its mapper.

**Attention over cameras.** The avatar looks at the faces of the latest observation of each of its cameras (cameras
that left streaming are out). `largest` rates a face by its box area as a share of its frame's area, `center` by
1 / (1 + distance to its frame's centre / the frame's diagonal), so cameras of different resolutions compare fairly.

**Stickiness rule.** The attended face is a (camera, track id). It is kept while it is seen: while its camera's
latest observation contains its track. Within that camera another face takes over only when it rates `STICKINESS`
times higher (as for one camera). A face of *another* camera takes over only when the attended face has left: not
seen for `switch_after_ms` (on the observations' capture clock), or at once when its camera stopped streaming. Then
the best face over all cameras is attended. So attention never moves back and forth while the attended face is seen.

**Decision.** The attended face's scores go through the same steps as a per-camera target (`mapper.decide`:
min_confidence and dwell to enter, exit_confidence to hold, cooldown between commands), with the avatar's own
behaviour settings; a new target starts afresh. Every command carries the avatar's name and the attended face's
camera and track.

**Idle.** One `neutral` command (`reason: idle`, target None, camera: the last attended face's camera, else the
avatar's first camera) when none of the avatar's cameras has shown a face for `idle_after_s`, and at once (at the
next tick) when every one of its cameras has left streaming after a face was seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pipeline.behavior.avatars import AvatarSettings
from pipeline.behavior.mapper import (
    STICKINESS,
    BehaviorMapper,
    TargetState,
    decide,
    distance_to,
    make_command,
    probability,
    watched,
)
from pipeline.behavior.settings import BehaviorConfig
from pipeline.core.types import Command, FaceResult, Observation

Target = tuple[str, int | None]  # (camera, track id)


@dataclass
class _Attention:
    focus: Target | None = None
    focus_seen: float = 0.0  # capture time the attended face was last seen
    last_camera: str | None = None  # camera of the last attended face, for the idle command
    state: TargetState = field(default_factory=TargetState)


class AvatarMapper:
    """Observations of the avatar's cameras in, the avatar's commands out (rules in the module docstring)."""

    def __init__(self, settings: AvatarSettings) -> None:
        self.name = settings.name
        self.cameras: tuple[str, ...] = tuple(settings.cameras)
        self.cfg: BehaviorConfig = settings.behavior
        self.attention = settings.attention
        self.switch_after_s = settings.switch_after_ms / 1000.0
        self._latest: dict[str, Observation] = {}
        self._left: set[str] = set()
        self._att = _Attention()
        self._last_face_seen: float | None = None
        self._idle_sent = False

    @property
    def focus(self) -> Target | None:
        """The attended (camera, track id), None when no face is attended."""
        return self._att.focus

    def update(self, obs: Observation) -> list[Command]:
        """Digest one observation of one of the avatar's cameras; the commands it triggers (usually none)."""
        self._latest[obs.camera] = obs
        self._left.discard(obs.camera)
        if obs.faces:
            self._last_face_seen, self._idle_sent = obs.t_mono, False
        elif self._idle_due(obs.t_mono):
            return [self._go_idle(obs.t_mono, obs.t_wall)]
        self._attend(obs.t_mono)
        face = self._attended_in(obs)
        if face is None:
            return []
        scores = face.smoothed or face.scores
        emotion = decide(self._att.state, self.cfg, obs.t_mono, scores)
        if emotion is None:
            return []
        return [make_command(self.cfg, obs.camera, obs.t_wall, obs.t_mono, face.track_id, emotion,
                             probability(scores, emotion), "emotion", avatar=self.name,
                             looked_at=watched([face]))]

    def tick(self, now: float, wall: float) -> list[Command]:
        """Advance on time alone: the idle command when it is due (see the module docstring)."""
        return [self._go_idle(now, wall)] if self._idle_due(now) else []

    def camera_left(self, camera: str) -> None:
        """The camera stopped streaming: its faces are gone, so an attended face there has left at once."""
        self._latest.pop(camera, None)
        self._left.add(camera)
        if self._att.focus is not None and self._att.focus[0] == camera:
            self._set_focus(None, 0.0)

    def _attend(self, now: float) -> None:
        """Apply the stickiness rule: keep, move within the camera, or (once the face left) pick over all."""
        focus = self._att.focus
        if focus is not None:
            seen = self._seen(focus)
            if seen is not None:
                self._att.focus_seen = seen.t_mono
                challenger = self._challenger(seen, focus[1])
                if challenger is not None:
                    self._set_focus((seen.camera, challenger), seen.t_mono)
                return
            if now - self._att.focus_seen < self.switch_after_s:
                return  # the attended face may be back: hold attention
        best = self._best_overall()
        self._set_focus(best[0] if best else None, best[1] if best else 0.0)

    def _seen(self, target: Target) -> Observation | None:
        """The latest observation of the target's camera when it contains the target's track."""
        obs = self._latest.get(target[0])
        if obs is not None and any(f.track_id == target[1] for f in obs.faces):
            return obs
        return None

    def _challenger(self, obs: Observation, track: int | None) -> int | None:
        """Another face of the attended face's camera that rates STICKINESS times higher, if any."""
        rated = {f.track_id: self._merit(obs, f) for f in obs.faces}
        best = max(rated, key=lambda k: rated[k])
        return best if best != track and rated[best] >= STICKINESS * rated[track] else None

    def _best_overall(self) -> tuple[Target, float] | None:
        """The best-rated face over the latest observations of all cameras still streaming, and when it was seen."""
        candidates = [(self._merit(obs, f), (obs.camera, f.track_id), obs.t_mono)
                      for obs in self._latest.values() for f in obs.faces]
        if not candidates:
            return None
        _, target, seen = max(candidates, key=lambda c: c[0])
        return target, seen

    def _merit(self, obs: Observation, face: FaceResult) -> float:
        """Size as a share of the frame, or nearness to the frame's centre relative to its diagonal."""
        width, height = obs.frame_size
        if self.attention == "largest":
            return face.detection.area / max(1.0, float(width * height))
        diagonal = max(1.0, float(width * width + height * height) ** 0.5)
        return 1.0 / (1.0 + distance_to(face, width / 2, height / 2) / diagonal)

    def _set_focus(self, target: Target | None, seen: float) -> None:
        if target != self._att.focus:
            last = target[0] if target is not None else self._att.last_camera
            self._att = _Attention(focus=target, focus_seen=seen, last_camera=last)

    def _attended_in(self, obs: Observation) -> FaceResult | None:
        focus = self._att.focus
        if focus is None or focus[0] != obs.camera:
            return None
        return next((f for f in obs.faces if f.track_id == focus[1]), None)

    def _idle_due(self, now: float) -> bool:
        if self.cfg.idle_after_s <= 0 or self._idle_sent or self._last_face_seen is None:
            return False
        if self._left.issuperset(self.cameras):
            return True
        return now - self._last_face_seen >= self.cfg.idle_after_s

    def _go_idle(self, t_mono: float, t_wall: float) -> Command:
        """One neutral command; attention and the decision state are dropped so a returning face starts afresh."""
        self._idle_sent = True
        camera = self._att.last_camera or self.cameras[0]
        self._att = _Attention(last_camera=camera)
        return make_command(self.cfg, camera, t_wall, t_mono, None, "neutral", 1.0, "idle", avatar=self.name)


class BehaviorRouter:
    """Each camera's observations go to its avatar's mapper, or (a camera in no avatar) to the per-camera mapper."""

    def __init__(self, cfg: BehaviorConfig, avatars: Sequence[AvatarSettings] = ()) -> None:
        self.per_camera = BehaviorMapper(cfg)
        self.avatars = {a.name: AvatarMapper(a) for a in avatars}
        self._by_camera = {camera: m for m in self.avatars.values() for camera in m.cameras}

    def update(self, obs: Observation) -> list[Command]:
        """The commands one observation triggers."""
        mapper = self._by_camera.get(obs.camera)
        return mapper.update(obs) if mapper is not None else self.per_camera.update(obs)

    def tick(self, now: float, wall: float) -> list[Command]:
        """Every mapper's time-driven (idle) commands."""
        commands = self.per_camera.tick(now, wall)
        for mapper in self.avatars.values():
            commands += mapper.tick(now, wall)
        return commands

    def camera_left(self, camera: str) -> None:
        """Tell the camera's mapper that its faces are gone."""
        mapper = self._by_camera.get(camera)
        if mapper is not None:
            mapper.camera_left(camera)
        else:
            self.per_camera.camera_left(camera)

    def focus(self, camera: str) -> tuple[str, str | None, str | None, int | None]:
        """For look-at: (stream, avatar, attended camera, attended track id) of `camera`'s stream; the camera is
        None when nobody is attended (see behavior.lookat)."""
        mapper = self._by_camera.get(camera)
        if mapper is not None:
            focus = mapper.focus
            return mapper.name, mapper.name, (focus[0] if focus else None), (focus[1] if focus else None)
        focus_camera, track = self.per_camera.focus(camera)
        return camera, None, focus_camera, track

    def stream_of(self, camera: str) -> tuple[str, str | None, BehaviorConfig]:
        """The stream `camera` feeds (its avatar, else itself), the avatar's name (None) and its behaviour settings."""
        mapper = self._by_camera.get(camera)
        if mapper is not None:
            return mapper.name, mapper.name, mapper.cfg
        return camera, None, self.per_camera.cfg

    def cameras(self) -> list[str]:
        """Every camera a mapper has seen or watches."""
        return [*self._by_camera, *self.per_camera.cameras()]

    def avatar_of(self, camera: str) -> str | None:
        """The name of the avatar that watches `camera`, None when it has its per-camera stream."""
        mapper = self._by_camera.get(camera)
        return mapper.name if mapper is not None else None

    def names(self, cameras: Iterable[str]) -> list[str]:
        """The streams (avatar names, then cameras in no avatar) over `cameras`, for the WebSocket snapshot."""
        return [*self.avatars, *(c for c in cameras if c not in self._by_camera)]
