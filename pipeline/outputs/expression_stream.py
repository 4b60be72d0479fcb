"""The avatar's current expression weights over time: pure logic, the clock passed in (no threads, no sockets).

A command sets a *target* ({name: weight}); from the weights shown at that moment every name moves linearly to its
target over the command's `blend_ms`: names that rise (attack) and names that fall (release) take the same time, so
an old expression fades out while the new one fades in, and each name's weight is monotonic between two commands.
A command that arrives mid-blend starts from where the face is, never jumps. The streaming OSC output samples
`weights(now)` at its frame rate; whatever a lost datagram carried, the next one carries the whole face again.
"""

from __future__ import annotations

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
