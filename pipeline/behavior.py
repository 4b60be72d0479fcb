"""BehaviorMapper: turns observations into calm avatar commands.

Pure logic over observations; time comes from each observation's capture timestamp, so tests drive it with prepared
observations and no real clock. For each attention target it keeps a candidate emotion and when it began:
a command is sent when the candidate has held for `dwell_ms` with at least `min_confidence`, differs from what the
avatar is already showing, and `cooldown_ms` has passed since the last command for that target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.types import Command, EmotionScores, Expression, FaceResult, Observation, Tone

if TYPE_CHECKING:
    from pipeline.config import BehaviorConfig

STICKINESS = 1.2  # a new face must be this much larger (or closer to the centre) to take attention away


@dataclass
class _TargetState:
    candidate: str | None = None
    since: float = 0.0
    shown: str | None = None
    last_command: float = float("-inf")


@dataclass
class _CameraState:
    focus: int | None = None
    last_face_seen: float | None = None
    idle_sent: bool = False


class BehaviorMapper:
    def __init__(self, cfg: BehaviorConfig) -> None:
        self.cfg = cfg
        self._targets: dict[tuple[str, int | None], _TargetState] = {}
        self._cameras: dict[str, _CameraState] = {}

    def update(self, obs: Observation) -> list[Command]:
        """Digest one observation; return the commands it triggers (usually none)."""
        camera = self._cameras.setdefault(obs.camera, _CameraState())
        now = obs.t_mono
        if not obs.faces:
            return self._maybe_idle(obs, camera)
        camera.last_face_seen, camera.idle_sent = now, False
        commands = []
        for face in self._attended(obs, camera):
            command = self._consider(obs, face.track_id, face.smoothed or face.scores)
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
            merit = {f.track_id: 1.0 / (1.0 + _distance_to(f, width / 2, height / 2)) for f in obs.faces}
        best = max(merit, key=lambda k: merit[k])
        if camera.focus in merit and merit[best] < STICKINESS * merit[camera.focus]:
            best = camera.focus
        camera.focus = best
        return [f for f in obs.faces if f.track_id == best]

    def _consider(self, obs: Observation, target: int | None, scores: EmotionScores) -> Command | None:
        state = self._targets.setdefault((obs.camera, target), _TargetState())
        now = obs.t_mono
        emotion = scores.emotion if scores.confidence >= self.cfg.min_confidence else None
        if emotion != state.candidate:
            state.candidate, state.since = emotion, now
        if emotion is None or emotion == state.shown:
            return None
        if (now - state.since) * 1000.0 < self.cfg.dwell_ms:
            return None
        if (now - state.last_command) * 1000.0 < self.cfg.cooldown_ms:
            return None
        state.shown, state.last_command = emotion, now
        return self._command(obs, target, emotion, scores.confidence, "emotion")

    def _maybe_idle(self, obs: Observation, camera: _CameraState) -> list[Command]:
        """After `idle_after_s` without faces, return the avatar to neutral once."""
        if self.cfg.idle_after_s <= 0 or camera.idle_sent or camera.last_face_seen is None:
            return []
        if obs.t_mono - camera.last_face_seen < self.cfg.idle_after_s:
            return []
        camera.idle_sent, camera.focus = True, None
        for key in [k for k in self._targets if k[0] == obs.camera]:
            del self._targets[key]
        return [self._command(obs, None, "neutral", 1.0, "idle")]

    def _command(self, obs: Observation, target: int | None, emotion: str, confidence: float, reason: str) -> Command:
        rule = self.cfg.rule_for(emotion)
        expression = Expression(rule.expression.preset, rule.expression.weight, rule.expression.blend_ms)
        tone = Tone(rule.tone.style, rule.tone.pitch, rule.tone.rate, rule.tone.volume, rule.tone.style_degree)
        return Command(obs.camera, obs.t_wall, target, emotion, round(confidence, 4), expression, tone,
                       t_mono=obs.t_mono, reason=reason)


def _distance_to(face: FaceResult, x: float, y: float) -> float:
    x1, y1, x2, y2 = face.detection.box
    return float(((x1 + x2) / 2 - x) ** 2 + ((y1 + y2) / 2 - y) ** 2) ** 0.5
