"""A pytest plugin: with EMOTION_STRICT_SKIPS=1 (set by .ci/run), a skipped test fails the run unless it is marked
`gpu` or `tensorrt` (hardware CI does not have).

Why: a skip is silent. A broken prepare-models, a missing Debian package or absent test data would otherwise turn
dozens of tests into skips while CI stays green. Locally (no variable) skips stay skips, with their reasons (-ra).

The skips are read from the test reports, whose `keywords` carry the markers: under pytest-xdist (the suite's
`-n 2`) the tests run in worker processes and only their reports reach the process that sets the exit status.
(Until 2026-12-07 this read the items inside the workers, so a run with `-n 2` never failed on a skip.)
"""

from __future__ import annotations

import os

import pytest

ENV = "EMOTION_STRICT_SKIPS"
ALLOWED_MARKERS = ("gpu", "tensorrt")


class StrictSkips:
    """One session's guard (a pytester session inside a test gets its own): collects the unmarked skips from the
    reports and fails the session at its end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.unexpected: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not any(name in report.keywords for name in ALLOWED_MARKERS):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.unexpected.append(f"{report.nodeid}: {reason}")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if os.environ.get(ENV) != "1" or not self.unexpected:
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"{ENV}=1: {len(self.unexpected)} test(s) skipped without a gpu/tensorrt marker:",
                                red=True)
            for line in self.unexpected:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    """Not in an xdist worker: its reports go to the controller, whose guard sees them all."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(StrictSkips(config), "strict-skips-guard")
