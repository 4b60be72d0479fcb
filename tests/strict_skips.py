"""A pytest plugin: with EMOTION_STRICT_SKIPS=1 (set by .ci/run), a skipped test fails the run unless it is marked
`gpu` or `tensorrt` (hardware CI does not have).

Why: a skip is silent. A broken prepare-models, a missing Debian package or absent test data would otherwise turn
dozens of tests into skips while CI stays green. Locally (no variable) skips stay skips, with their reasons (-ra).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

ENV = "EMOTION_STRICT_SKIPS"
ALLOWED_MARKERS = ("gpu", "tensorrt")
UNEXPECTED = pytest.StashKey[list[str]]()  # per session (a pytester session inside a test keeps its own)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not any(item.get_closest_marker(name) for name in ALLOWED_MARKERS):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        item.config.stash.setdefault(UNEXPECTED, []).append(f"{item.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    unexpected = session.config.stash.get(UNEXPECTED, [])
    if os.environ.get(ENV) != "1" or not unexpected:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{ENV}=1: {len(unexpected)} test(s) skipped without a gpu/tensorrt marker:", red=True)
        for line in unexpected:
            reporter.write_line(f"  {line}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
