"""Who is there: visitors arriving and leaving each camera, and whether they look at the avatar (issue 27 item 4).

Why from tracks: the tracker already keeps one id per face while it stays; a visitor is a track that held for
`arrive_frames` observations (a face glimpsed for a frame or two is not a visit), and has left when its track is not
seen for `leave_after_s` (a face the detector misses for a moment has not left). Dwell is the time between its first
and last sighting. `looking` / `looking_away` follow the head pose's `looking` once it holds for `looking_frames`
observations, so a glance does not flap. Everything runs on the behaviour thread; the clock is the observations'
(and the caller's for `tick`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeline.behavior.settings import BehaviorConfig, PresenceConfig
from pipeline.core.types import Command, Expression, Observation, Tone


@dataclass(frozen=True)
class PresenceChange:
    """A visitor arrived, left (with how long it stayed), started or stopped looking at the camera."""

    kind: str  # arrived | left | looking | looking_away
    camera: str
    track_id: int
    t_wall: float
    dwell_s: float | None = None  # left: seconds between the first and the last sighting


@dataclass
class _Visitor:
    first_seen: float
    last_seen: float
    first_wall: float
    last_wall: float
    frames: int = 0
    arrived: bool = False
    looking: bool = False
    votes: int = 0  # consecutive observations whose `looking` differs from the state


@dataclass
class _Camera:
    visitors: dict[int, _Visitor] = field(default_factory=dict)


class Presence:
    """Arrivals, departures and looks of every camera's visitors."""

    def __init__(self, cfg: PresenceConfig) -> None:
        self.cfg = cfg
        self._cameras: dict[str, _Camera] = {}

    def update(self, obs: Observation) -> list[PresenceChange]:
        """The changes one observation brings: its faces' tracks seen, those not seen for leave_after_s gone."""
        camera = self._cameras.setdefault(obs.camera, _Camera())
        changes: list[PresenceChange] = []
        for face in obs.faces:
            if face.track_id is None:
                continue
            visitor = camera.visitors.get(face.track_id)
            if visitor is None:
                visitor = camera.visitors[face.track_id] = _Visitor(obs.t_mono, obs.t_mono, obs.t_wall, obs.t_wall)
            visitor.last_seen, visitor.last_wall, visitor.frames = obs.t_mono, obs.t_wall, visitor.frames + 1
            if not visitor.arrived and visitor.frames >= self.cfg.arrive_frames:
                visitor.arrived = True
                changes.append(PresenceChange("arrived", obs.camera, face.track_id, obs.t_wall))
            looking = face.head is not None and face.head.looking
            changes += self._look(obs.camera, face.track_id, visitor, looking, obs.t_wall)
        return changes + self._departures(obs.camera, camera, obs.t_mono)

    def tick(self, now: float) -> list[PresenceChange]:
        """Departures due by the clock alone (a camera that stopped sending observations)."""
        changes: list[PresenceChange] = []
        for name, camera in self._cameras.items():
            changes += self._departures(name, camera, now)
        return changes

    def looking_cameras(self) -> set[str]:
        """The cameras where a visitor (arrived) looks at the camera now."""
        return {name for name, camera in self._cameras.items()
                if any(v.arrived and v.looking for v in camera.visitors.values())}

    def cameras(self) -> set[str]:
        """The cameras whose observations arrive (until the camera leaves)."""
        return set(self._cameras)

    def camera_left(self, camera: str) -> list[PresenceChange]:
        """The camera stopped streaming: its visitors are gone now."""
        state = self._cameras.pop(camera, None)
        if state is None:
            return []
        return [self._left(camera, track, visitor) for track, visitor in state.visitors.items() if visitor.arrived]

    def _look(self, camera: str, track: int, visitor: _Visitor, looking: bool, wall: float) -> list[PresenceChange]:
        if looking == visitor.looking:
            visitor.votes = 0
            return []
        visitor.votes += 1
        if visitor.votes < self.cfg.looking_frames:
            return []
        visitor.looking, visitor.votes = looking, 0
        if not visitor.arrived:
            return []
        return [PresenceChange("looking" if looking else "looking_away", camera, track, wall)]

    def _departures(self, name: str, camera: _Camera, now: float) -> list[PresenceChange]:
        gone = [track for track, v in camera.visitors.items() if now - v.last_seen > self.cfg.leave_after_s]
        changes = []
        for track in gone:
            visitor = camera.visitors.pop(track)
            if visitor.arrived:
                changes.append(self._left(name, track, visitor))
        return changes

    @staticmethod
    def _left(camera: str, track: int, visitor: _Visitor) -> PresenceChange:
        return PresenceChange("left", camera, track, visitor.last_wall,
                              round(visitor.last_seen - visitor.first_seen, 2))


HOUR_S = 3600.0


@dataclass
class _Visits:
    arrivals: deque[float] = field(default_factory=deque)  # clock times of the arrivals within the last hour
    dwell_s: float = 0.0
    departures: int = 0
    looked_s: float = 0.0  # time with a visitor looking at the camera
    watched_s: float = 0.0  # time the camera was streaming


class VisitorTally:
    """Per camera: visitors in the last hour, their mean dwell, and the share of time someone looked at the camera
    (issue 27 item 5, for the status page; Prometheus gets the same from its own counters).

    Time is counted between calls of `advance` (the behaviour loop's, at least every MAPPER_WAKE_S): a camera adds
    the step to its streaming time, and to its looked-at time when a visitor looked at the start of the step."""

    def __init__(self) -> None:
        self._cameras: dict[str, _Visits] = {}
        self._last: float | None = None
        self._looking: set[str] = set()
        self._lock = threading.Lock()  # the behaviour thread counts, the status server reads

    def record(self, change: PresenceChange, now: float) -> None:
        with self._lock:
            visits = self._cameras.setdefault(change.camera, _Visits())
            if change.kind == "arrived":
                visits.arrivals.append(now)
                while now - visits.arrivals[0] > HOUR_S:
                    visits.arrivals.popleft()
            elif change.kind == "left" and change.dwell_s is not None:
                visits.dwell_s += change.dwell_s
                visits.departures += 1

    def advance(self, now: float, looking: set[str], streaming: Iterable[str]) -> dict[str, float]:
        """Count the time since the last call; returns each camera's looked-at seconds added (for the counter)."""
        with self._lock:
            step = 0.0 if self._last is None else max(0.0, now - self._last)
            added = {}
            for camera in streaming:
                visits = self._cameras.setdefault(camera, _Visits())
                visits.watched_s += step
                if camera in self._looking and step:
                    visits.looked_s += step
                    added[camera] = step
            self._last, self._looking = now, set(looking)
            return added

    def summary(self, now: float) -> dict[str, dict[str, float | int | None]]:
        """Per camera: `visitors_last_hour`, `mean_dwell_s` (None before anyone left), `looked_at_share` (of the
        time it streamed; None before any)."""
        rows: dict[str, dict[str, float | int | None]] = {}
        with self._lock:
            for camera, visits in sorted(self._cameras.items()):
                rows[camera] = {
                    "visitors_last_hour": sum(1 for t in visits.arrivals if now - t <= HOUR_S),
                    "mean_dwell_s": round(visits.dwell_s / visits.departures, 1) if visits.departures else None,
                    "looked_at_share": round(visits.looked_s / visits.watched_s, 3) if visits.watched_s > 0 else None}
        return rows

    def forget(self, camera: str) -> None:
        """A camera removed by a reload."""
        with self._lock:
            self._cameras.pop(camera, None)


class Greeter:
    """The greeting (behavior.on_arrival) for an arrival: once per visitor (arrivals come once per track) and at most
    once per greet_cooldown_s per stream, so a group walking in is greeted once."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def greet(self, change: PresenceChange, stream: str, avatar: str | None, cfg: BehaviorConfig,
              now: float) -> Command | None:
        rule = cfg.on_arrival
        if change.kind != "arrived" or rule is None:
            return None
        last = self._last.get(stream)
        if last is not None and now - last < cfg.greet_cooldown_s:
            return None
        self._last[stream] = now
        expression = Expression(rule.expression.preset, rule.expression.weight, rule.expression.blend_ms)
        tone = Tone(rule.tone.style, rule.tone.pitch, rule.tone.rate, rule.tone.volume, rule.tone.style_degree)
        return Command(change.camera, change.t_wall, change.track_id, "neutral", 1.0, expression, tone,
                       reason="greeting", avatar=avatar)
