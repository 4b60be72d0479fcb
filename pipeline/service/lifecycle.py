"""Bounded waiting for threads: every join shares a deadline, so a wedged stage cannot hold a stop or a reload."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def join_all(threads: list[threading.Thread], budget_s: float) -> None:
    """Join threads against one shared deadline; name the ones that did not stop in time."""
    deadline = time.monotonic() + budget_s
    for thread in threads:
        if thread.ident is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
    late = [t.name for t in threads if t.is_alive()]
    if late:
        log.warning("did not stop within %.1f s: %s", budget_s, ", ".join(late))


def run_bounded(fn: Callable[[], Any], budget_s: float, what: str) -> None:
    """Run fn on a helper thread and wait at most budget_s (a backend that hangs in close must not hold us)."""
    helper = threading.Thread(target=fn, name=f"close-{what}", daemon=True)
    helper.start()
    helper.join(budget_s)
    if helper.is_alive():
        log.warning("%s did not close within %.1f s", what, budget_s)


def close_sinks(sinks: list[Any], budget_s: float) -> None:
    """Flush every output at once (each on a helper thread), sharing one budget."""
    helpers = [threading.Thread(target=sink.close, kwargs={"timeout": budget_s}, name=f"close-{sink.type_name}",
                                daemon=True) for sink in sinks]
    for helper in helpers:
        helper.start()
    join_all(helpers, budget_s + 0.05)
