"""BehaviorMapper: turns observations into calm avatar commands.

Pure logic over observations; time comes from each observation's capture timestamp (`t_mono`), and from the `now`
handed to `tick`, so tests drive it with prepared observations and times and no real clock.

**Attention** (`behavior.attention`) picks the targets of one observation. `largest` and `center` pick one face (its
track id is the target) and are sticky: another face takes over only when it is `STICKINESS` times larger (area) or
closer to the centre (1 / (1 + distance)). `all` makes every face a target. `room` makes the camera itself the one
target (`target` None): its scores are the mean of all faces' smoothed probabilities, each face weighted by its box
area, so the larger (nearer) faces count more.

**Decision**, per target and per observation, on the target's scores `p` (a face's smoothed probabilities, its raw
ones when it has none; the weighted mean for `room`):

1. *Enter.* The *candidate* is the top emotion E of `p` when `p[E] >= min_confidence`, else nothing. The candidate's
   clock restarts whenever the candidate changes (a different emotion, or from/to nothing).
2. *Hold / exit (hysteresis).* The *shown* emotion S is the emotion of the target's last command (none before the
   first). S is *held* while `p[S] >= exit_confidence`, whether or not it is still the top emotion, and *gone* in an
   observation where `p[S] < exit_confidence`.
3. *Command.* A command for E is emitted when, in this observation: E has been the candidate for at least `dwell_ms`;
   E differs from S; S is none or gone; and `cooldown_ms` have passed since the target's last command.

So the avatar never repeats what it shows; a blip of another emotion changes nothing; a challenger must pass
`min_confidence` for `dwell_ms` *and* the shown emotion must have fallen below `exit_confidence` (a challenger that
has dwelt long enough fires at the first observation where S is gone, if it is still the candidate). When S is gone
and nothing qualifies, the avatar keeps S until some emotion qualifies; S coming back later is not re-sent.

**Idle.** After `idle_after_s` without any face on a camera, one `neutral` command (`reason: idle`, target None) is
sent and the camera's targets are forgotten, so a returning face is answered afresh. Idle is a matter of time, not of
observations: a camera that ended, stalled or dropped out sends none, so the daemon also calls `tick(now, wall)`
on its own clock, which sends the idle command of every camera whose last face is `idle_after_s` old. A camera that
leaves `streaming` is reported with `camera_left`: its targets are forgotten at once (their faces are gone), and
the idle command follows `idle_after_s` after the last face, as for a camera that shows an empty room.

This mapper keeps one command stream per camera (`avatar` None). An avatar that spans cameras (`avatars:`) has its
own mapper, `pipeline.behavior.avatar_mapper.AvatarMapper`, which reuses steps 1-3 (`decide`, `make_command`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.types import (
    EMOTIONS,
    Command,
    EmotionScores,
    Expression,
    FaceResult,
    Observation,
    Tone,
)

if TYPE_CHECKING:
    from pipeline.behavior.settings import BehaviorConfig

STICKINESS = 1.2  # a new face must be this much larger (or closer to the centre) to take attention away
FORGET_AFTER_S = 30.0  # a target (track) not seen for this long is forgotten, so "all" does not grow without bound


@dataclass
class TargetState:
    """The decision state of one target (see the module docstring's steps 1-3)."""

    candidate: str | None = None
    since: float = 0.0
    shown: str | None = None
    last_command: float = float("-inf")
    last_seen: float = 0.0


@dataclass
class _CameraState:
    focus: int | None = None
    last_face_seen: float | None = None
    idle_sent: bool = False
    last_pruned: float = float("-inf")


class BehaviorMapper:
    def __init__(self, cfg: BehaviorConfig) -> None:
        self.cfg = cfg
        self._targets: dict[tuple[str, int | None], TargetState] = {}
        self._cameras: dict[str, _CameraState] = {}

    def cameras(self) -> list[str]:
        return list(self._cameras)

    def focus(self, camera_name: str) -> tuple[str | None, int | None]:
        """(camera, track id) of the face this camera's stream attends to: its focus with `largest` or `center`, any
        face (None: the largest) with `all` or `room`; (None, None) before a face or once the camera went idle."""
        camera = self._cameras.get(camera_name)
        if camera is None or camera.last_face_seen is None or camera.idle_sent:
            return None, None
        track = camera.focus if self.cfg.attention in ("largest", "center") else None
        return camera_name, track

    def update(self, obs: Observation) -> list[Command]:
        """Digest one observation; return the commands it triggers (usually none)."""
        camera = self._cameras.setdefault(obs.camera, _CameraState())
        now = obs.t_mono
        if not obs.faces:
            return self._maybe_idle(obs, camera)
        camera.last_face_seen, camera.idle_sent = now, False
        self._forget_stale(obs.camera, camera, now)
        if self.cfg.attention == "room":
            command = self._consider(obs, None, room_scores(obs.faces), watched(obs.faces))
            return [command] if command is not None else []
        commands = []
        for face in self._attended(obs, camera):
            command = self._consider(obs, face.track_id, face.smoothed or face.scores, watched([face]))
            if command is not None:
                commands.append(command)
        return commands

    def _attended(self, obs: Observation, camera: _CameraState) -> list[FaceResult]:
        if self.cfg.attention == "all":
            return list(obs.faces)
        if self.cfg.attention == "largest":
            merit = {f.track_id: f.detection.area for f in obs.faces}
        else:
            width, height = obs.frame_size
            merit = {f.track_id: 1.0 / (1.0 + distance_to(f, width / 2, height / 2)) for f in obs.faces}
        best = max(merit, key=lambda k: merit[k])
        if camera.focus in merit and merit[best] < STICKINESS * merit[camera.focus]:
            best = camera.focus
        camera.focus = best
        return [f for f in obs.faces if f.track_id == best]

    def _consider(self, obs: Observation, target: int | None, scores: EmotionScores,
                  looked_at: bool | None = None) -> Command | None:
        """Steps 1-3 of the module docstring for one target (`looked_at`: whether its face looks at the camera)."""
        state = self._targets.setdefault((obs.camera, target), TargetState())
        emotion = decide(state, self.cfg, obs.t_mono, scores)
        if emotion is None:
            return None
        return make_command(self.cfg, obs.camera, obs.t_wall, obs.t_mono, target, emotion,
                            probability(scores, emotion), "emotion", looked_at=looked_at)

    def tick(self, now: float, wall: float) -> list[Command]:
        """Advance on time alone (`now` monotonic, `wall` Unix seconds): the idle command of every camera whose last
        face is `idle_after_s` old. Observations alone cannot do it: a camera that ended or dropped out sends none,
        and the avatar would keep its last expression forever."""
        commands = []
        for name, camera in self._cameras.items():
            if self._idle_due(camera, now):
                commands.append(self._go_idle(name, camera, now, wall))
        return commands

    def camera_left(self, camera_name: str) -> None:
        """The camera stopped streaming (ended, stalled, reconnecting, stopped): its faces are gone, so its targets
        are forgotten now; the idle command still follows `idle_after_s` after the last face (see `tick`)."""
        camera = self._cameras.get(camera_name)
        if camera is not None:
            camera.focus = None
        self._forget_targets(camera_name)

    def _maybe_idle(self, obs: Observation, camera: _CameraState) -> list[Command]:
        """After `idle_after_s` without faces, return the avatar to neutral once."""
        if not self._idle_due(camera, obs.t_mono):
            return []
        return [self._go_idle(obs.camera, camera, obs.t_mono, obs.t_wall)]

    def _idle_due(self, camera: _CameraState, now: float) -> bool:
        if self.cfg.idle_after_s <= 0 or camera.idle_sent or camera.last_face_seen is None:
            return False
        return now - camera.last_face_seen >= self.cfg.idle_after_s

    def _go_idle(self, camera_name: str, camera: _CameraState, t_mono: float, t_wall: float) -> Command:
        """One neutral command; the camera's targets are forgotten so a returning face is answered afresh."""
        camera.idle_sent, camera.focus = True, None
        self._forget_targets(camera_name)
        return make_command(self.cfg, camera_name, t_wall, t_mono, None, "neutral", 1.0, "idle")

    def _forget_targets(self, camera_name: str) -> None:
        for key in [k for k in self._targets if k[0] == camera_name]:
            del self._targets[key]

    def _forget_stale(self, camera_name: str, camera: _CameraState, now: float) -> None:
        """Drop the state of targets (tracks) not seen for FORGET_AFTER_S; checked at most once a second."""
        if now - camera.last_pruned < 1.0:
            return
        camera.last_pruned = now
        for key in [k for k, s in self._targets.items() if k[0] == camera_name and now - s.last_seen > FORGET_AFTER_S]:
            del self._targets[key]


def decide(state: TargetState, cfg: BehaviorConfig, now: float, scores: EmotionScores) -> str | None:
    """Steps 1-3 of the module docstring for one target at `now`: the emotion to command, or None. Records the
    command in `state` when there is one (shared by the per-camera and the avatar mappers)."""
    state.last_seen = now
    emotion = scores.emotion if scores.confidence >= cfg.min_confidence else None
    if emotion != state.candidate:
        state.candidate, state.since = emotion, now
    if emotion is None or emotion == state.shown:
        return None
    if state.shown is not None and probability(scores, state.shown) >= cfg.exit_confidence:
        return None  # the shown emotion is still held
    if (now - state.since) * 1000.0 < cfg.dwell_ms:
        return None
    if (now - state.last_command) * 1000.0 < cfg.cooldown_ms:
        return None
    state.shown, state.last_command = emotion, now
    return emotion


def make_command(cfg: BehaviorConfig, camera: str, t_wall: float, t_mono: float, target: int | None, emotion: str,
                 confidence: float, reason: str, avatar: str | None = None, looked_at: bool | None = None) -> Command:
    """The command for `emotion` under `cfg`'s rule (expression and tone); the tone takes `unwatched_volume` when
    the face it answers is known not to look at the camera (`looked_at` False; None: unknown, the rule's own)."""
    rule = cfg.rule_for(emotion)
    expression = Expression(rule.expression.preset, rule.expression.weight, rule.expression.blend_ms)
    volume = cfg.unwatched_volume if looked_at is False and cfg.unwatched_volume is not None else rule.tone.volume
    tone = Tone(rule.tone.style, rule.tone.pitch, rule.tone.rate, volume, rule.tone.style_degree)
    return Command(camera, t_wall, target, emotion, round(confidence, 4), expression, tone, t_mono=t_mono,
                   reason=reason, avatar=avatar)


def watched(faces: Iterable[FaceResult]) -> bool | None:
    """Whether any of `faces` looks at the camera (head pose), None when none has a head pose."""
    poses = [f.head for f in faces if f.head is not None]
    return any(pose.looking for pose in poses) if poses else None


def room_scores(faces: tuple[FaceResult, ...] | list[FaceResult]) -> EmotionScores:
    """The room mood: the mean of the faces' smoothed (else raw) probabilities, weighted by box area.

    Faces with no area (degenerate boxes) count equally when no face has any area.
    """
    probs = np.stack([(f.smoothed or f.scores).probs for f in faces]).astype(np.float64)
    weights = np.array([f.detection.area for f in faces], np.float64)
    if weights.sum() <= 0:
        weights = np.ones(len(faces))
    mean = weights @ probs / weights.sum()
    return EmotionScores(mean.astype(np.float32))


def probability(scores: EmotionScores, emotion: str) -> float:
    return float(scores.probs[EMOTIONS.index(emotion)])


def distance_to(face: FaceResult, x: float, y: float) -> float:
    x1, y1, x2, y2 = face.detection.box
    return float(((x1 + x2) / 2 - x) ** 2 + ((y1 + y2) / 2 - y) ** 2) ** 0.5
