"""The recent events an operator looks back on: commands, camera state changes and configuration reloads.

Why here: they are the events the outputs send, recorded where they are published (EventBus), so the status page's
history shows exactly what went out. Observations are left out: at 15 fps per camera they would push everything else
out of a short history within seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

Event = dict[str, Any]
KEPT_TYPES = frozenset({"command", "camera", "config", "presence"})
HISTORY_SIZE = 500


class EventHistory:
    """The newest HISTORY_SIZE events of KEPT_TYPES; appended by publishers, read by the status server (a deque's
    append and a list copy of it are each one step under the GIL: no lock)."""

    def __init__(self, size: int = HISTORY_SIZE) -> None:
        self._events: deque[Event] = deque(maxlen=size)

    def record(self, event: Event) -> None:
        if event.get("type") in KEPT_TYPES:
            self._events.append(event)

    def recent(self, types: Iterable[str] = (), text: str = "", limit: int = 100) -> list[Event]:
        """Newest first: of `types` (all kept types when empty), whose camera, avatar, emotion or state contains
        `text` (case-insensitive), at most `limit`."""
        wanted = set(types) or KEPT_TYPES
        needle = text.strip().lower()
        found = []
        for event in reversed(list(self._events)):
            if event.get("type") not in wanted:
                continue
            if needle and needle not in _searchable(event):
                continue
            found.append(event)
            if len(found) >= limit:
                break
        return found


def _searchable(event: Event) -> str:
    parts = [event.get(key) for key in ("type", "camera", "avatar", "emotion", "state", "detail", "status", "reason",
                                        "event")]
    return " ".join(str(part) for part in parts if part).lower()
