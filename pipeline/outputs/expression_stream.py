"""The avatar's current expression weights over time: pure logic, the clock passed in (no threads, no sockets).

A command sets a *target* ({name: weight}); from the weights shown at that moment every name moves linearly to its
target over the command's `blend_ms`: names that rise (attack) and names that fall (release) take the same time, so
an old expression fades out while the new one fades in, and each name's weight is monotonic between two commands.
A command that arrives mid-blend starts from where the face is, never jumps. The streaming OSC output samples
`weights(now)` at its frame rate; whatever a lost datagram carried, the next one carries the whole face again.
"""

from __future__ import annotations

import math

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Blend:
    """One move: from `start` (the weights when the command arrived, at `t0`) to `target` in `duration_s`."""

    start: Mapping[str, float] = field(default_factory=dict)
    target: Mapping[str, float] = field(default_factory=dict)
    t0: float = 0.0
    duration_s: float = 0.0

    def progress(self, now: float) -> float:
        """0 at t0, 1 at t0 + duration_s and after (a zero duration is a jump)."""
        if self.duration_s <= 0:
            return 1.0
        return min(1.0, max(0.0, (now - self.t0) / self.duration_s))

    def at(self, now: float) -> dict[str, float]:
        """Every name of start and target at `now` (a name missing on one side is 0 there)."""
        done = self.progress(now)
        names = dict.fromkeys([*self.start, *self.target])
        return {name: self.start.get(name, 0.0) + (self.target.get(name, 0.0) - self.start.get(name, 0.0)) * done
                for name in names}


class ExpressionStream:
    """The weights one avatar shows; `command` retargets it, `weights` samples it.

    Each state is one immutable Blend replaced in a single assignment, so one thread may call `command` while another
    samples `weights` without a lock."""

    def __init__(self) -> None:
        self._blend = Blend()

    def command(self, target: Mapping[str, float], blend_ms: float, now: float) -> None:
        """Move from the weights shown at `now` to `target` over `blend_ms` milliseconds."""
        start = {name: value for name, value in self._blend.at(now).items() if value != 0.0}
        self._blend = Blend(start, dict(target), now, max(0.0, float(blend_ms)) / 1000.0)

    def weights(self, now: float) -> dict[str, float]:
        """The weights shown at `now` (names ever set and not yet back at 0; absent names are 0)."""
        return self._blend.at(now)

    @property
    def target(self) -> Mapping[str, float]:
        """Where the face is heading (the last command's weights)."""
        return self._blend.target


GAZE_OMEGA = 16.0  # rad/s: a critically damped step is within 10 % of its size after 0.24 s, 1 % after 0.42 s


class GazeFollower:
    """Where the avatar looks, following its target (yaw, pitch in degrees) as a critically damped spring: no
    overshoot, no visible lag, and a target's detection jitter smoothed away (a low-pass of ~2 Hz).

    Pure logic with the clock passed in; `sample(now)` advances it. One thread commands, another samples: each state
    is one tuple replaced in a single assignment (see ExpressionStream)."""

    def __init__(self, omega: float = GAZE_OMEGA) -> None:
        self.omega = omega
        self._target = (0.0, 0.0)
        self._state: tuple[float, float, float, float, float] | None = None  # yaw, pitch, their rates, time

    def command(self, yaw: float, pitch: float) -> None:
        self._target = (float(yaw), float(pitch))

    def sample(self, now: float) -> tuple[float, float]:
        """The direction at `now` (the first sample starts at the target)."""
        target = self._target
        if self._state is None:
            self._state = (target[0], target[1], 0.0, 0.0, now)
            return target
        yaw, pitch, v_yaw, v_pitch, then = self._state
        dt = max(0.0, min(now - then, 0.25))  # a stalled ticker resumes without a jump
        yaw, v_yaw = _spring(yaw, v_yaw, target[0], self.omega, dt)
        pitch, v_pitch = _spring(pitch, v_pitch, target[1], self.omega, dt)
        self._state = (yaw, pitch, v_yaw, v_pitch, now)
        return yaw, pitch


def _spring(x: float, v: float, target: float, omega: float, dt: float) -> tuple[float, float]:
    """Exact critically damped step of x'' = omega^2 (target - x) - 2 omega x' over dt (stable at any dt)."""
    e = x - target
    decay = math.exp(-omega * dt)
    c = v + omega * e
    return target + (e + c * dt) * decay, (v - omega * c * dt) * decay
