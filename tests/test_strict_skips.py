"""The CI guard against silent skips (tests/strict_skips.py), run in a throw-away pytest session."""

from __future__ import annotations

from pathlib import Path

import pytest

INNER = """
import pytest

def test_runs():
    pass

def test_skipped_for_no_reason_ci_accepts():
    pytest.skip("some data is absent")

@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("no GPU here")
"""


def test_an_unmarked_skip_fails_a_strict_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(INNER)
    monkeypatch.setenv("EMOTION_STRICT_SKIPS", "1")
    result = pytester.runpytest("-p", "tests.strict_skips")
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*1 test(s) skipped without a gpu/tensorrt marker*",
                                 "*test_skipped_for_no_reason_ci_accepts*some data is absent*"])
    assert "test_needs_a_gpu" not in result.stdout.str().split("skipped without")[1]


def test_skips_stay_skips_outside_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(INNER)
    monkeypatch.delenv("EMOTION_STRICT_SKIPS", raising=False)
    result = pytester.runpytest("-p", "tests.strict_skips")
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.OK


def test_an_unmarked_skip_fails_a_strict_run_on_xdist_workers(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """As the suite runs (`-n 2`): the skips happen in worker processes and the controller must still fail."""
    pytester.makepyfile(INNER)
    monkeypatch.setenv("EMOTION_STRICT_SKIPS", "1")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    result = pytester.runpytest_subprocess("-p", "tests.strict_skips", "-p", "xdist", "-n", "2")
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*1 test(s) skipped without a gpu/tensorrt marker*",
                                 "*test_skipped_for_no_reason_ci_accepts*some data is absent*"])
