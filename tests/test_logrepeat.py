"""RepeatLimiter: the first failure of a kind is logged at once, repeats within the interval are held back and
counted in the next line; other kinds are not held back by it. The clock is the only fake."""

from __future__ import annotations

import logging

import pytest

from pipeline.core.logrepeat import RepeatLimiter


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_repeats_are_held_back_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    limiter = RepeatLimiter(logging.getLogger("test.repeat"), interval_s=30.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.repeat"):
        assert limiter.log(logging.WARNING, "Unreachable", "frame %d failed", 1)
        for index in range(2, 42):
            clock.now += 0.5
            assert not limiter.log(logging.WARNING, "Unreachable", "frame %d failed", index)
        assert limiter.log(logging.ERROR, "ValueError", "another kind")  # its own run
        clock.now += 10.1  # 30.1 s after the first line
        assert limiter.log(logging.WARNING, "Unreachable", "frame %d failed", 99)
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["frame 1 failed", "another kind", "frame 99 failed (and 40 more like it in the last 30 s)"]


def test_a_quiet_kind_logs_again_without_a_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    limiter = RepeatLimiter(logging.getLogger("test.repeat"), interval_s=30.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.repeat"):
        limiter.log(logging.WARNING, "Timeout", "first")
        clock.now += 31
        limiter.log(logging.WARNING, "Timeout", "second")
    assert [record.getMessage() for record in caplog.records] == ["first", "second"]
