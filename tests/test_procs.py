"""What each of the daemon's processes holds (pipeline/service/procs.py): read from this very process's /proc, and
from /proc files whose command name has spaces and parentheses (proc(5): the name is not split on)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from pipeline.service.procs import process_view

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")


def test_this_process_reads_as_the_kernel_counts_it() -> None:
    view = process_view("daemon", os.getpid())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    vm_rss = int(status["VmRSS"].split()[0]) * 1024  # kB
    assert view.name == "daemon" and view.pid == os.getpid()
    assert view.rss_bytes is not None and abs(view.rss_bytes - vm_rss) <= 0.05 * vm_rss
    assert view.cpu_seconds is not None
    assert abs(view.cpu_seconds - (usage.ru_utime + usage.ru_stime)) < 0.5


def test_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    pid_dir = tmp_path / "4242"
    pid_dir.mkdir()
    ticks = os.sysconf("SC_CLK_TCK")
    fields = ["S", "1", "4242", "4242", "0", "-1", "4194304", "10", "0", "0", "0", str(3 * ticks), str(ticks)]
    (pid_dir / "stat").write_text("4242 (emotion (x) y) " + " ".join(fields + ["0"] * 30) + "\n")
    (pid_dir / "statm").write_text("5000 1234 100 10 0 200 0\n")
    view = process_view("cameras-1", 4242, proc=tmp_path)
    assert view.cpu_seconds == pytest.approx(4.0)
    assert view.rss_bytes == 1234 * os.sysconf("SC_PAGE_SIZE")


def test_a_process_that_is_gone_reads_as_unknown(tmp_path: Path) -> None:
    view = process_view("cameras-2", 999_999, proc=tmp_path)
    assert view.rss_bytes is None and view.cpu_seconds is None
