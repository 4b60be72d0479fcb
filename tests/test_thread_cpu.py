"""bench pipeline's CPU per thread role (pipeline/tools/thread_cpu.py), read from the kernel's per-thread counters."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.core.threads import name_native_thread
from pipeline.service.procs import stat_seconds
from pipeline.tools.thread_cpu import cores_by_role, cpu_by_role, cpu_by_role_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU is read from /proc")


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))


def test_a_busy_thread_is_counted_under_its_role_and_an_idle_one_is_not() -> None:
    """Two burners and a sleeper read while all three are alive (time in ended threads is not counted): the burners
    wait, once they have burned, until the reading is done, so a loaded machine that keeps the main thread off the
    CPU for a while cannot let them end first (it did in CI, running beside the other tests)."""
    before = cpu_by_role()
    started = time.monotonic()
    burned, read = threading.Barrier(3), threading.Event()

    def burn_then_wait() -> None:
        _burn(0.15)
        burned.wait(10)
        read.wait(10)

    busy = [threading.Thread(target=burn_then_wait, name=f"burner-cam{i}") for i in (3, 12)]
    idle = threading.Thread(target=read.wait, args=(10,), name="sleeper-7")
    idle.start()
    for thread in busy:
        thread.start()
    burned.wait(10)
    middle = cpu_by_role()
    read.set()
    for thread in [*busy, idle]:
        thread.join()
    # both burners fold into one row
    assert "burner-camN" in middle and "sleeper-N" in middle
    assert middle["burner-camN"] >= 0.25 and middle["sleeper-N"] < 0.05
    cores = cores_by_role(before, middle, time.monotonic() - started)
    assert cores["burner-camN"] > cores["sleeper-N"]


def test_stat_lines_with_spaces_and_parentheses_in_the_name() -> None:
    fields = " ".join(["S"] + ["0"] * 10 + ["250", "50"] + ["0"] * 30)
    name, seconds = stat_seconds(f"1234 (odd) name (x)) {fields}")
    assert name == "odd) name (x)"
    assert seconds == pytest.approx(300 / os.sysconf("SC_CLK_TCK"))


def test_roles_beyond_the_top_are_summed_as_other() -> None:
    after = {f"role-{c}": 1.0 + i for i, c in enumerate("abcde")}
    cores = cores_by_role({}, after, wall_s=2.0, top=2)
    assert cores == {"role-e": 2.5, "role-d": 2.0, "other": 3.0}


def test_no_proc_gives_no_roles(tmp_path: Path) -> None:
    assert cpu_by_role(tmp_path / "missing") == {}
    assert cores_by_role({}, {}, wall_s=1.0) == {}


def test_a_thread_that_names_itself_is_counted_by_that_name_from_outside() -> None:
    """What a camera group's threads look like to the bench's process: only kernel names, which the pipeline's
    threads set to their `threading` names (cut to 15 bytes)."""
    names: dict[str, str] = {}
    release = threading.Event()

    def named() -> None:
        assert name_native_thread()
        _burn(0.1)
        names["comm"] = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
        release.wait(5)

    thread = threading.Thread(target=named, name="reader-cam12-with-a-long-name")
    thread.start()
    while "comm" not in names and thread.is_alive():
        time.sleep(0.01)
    roles = cpu_by_role_of(os.getpid())  # as for another process: kernel names only
    release.set()
    thread.join()
    assert names["comm"] == "reader-cam12-wi"
    assert roles.get("reader-camN-wi", 0.0) >= 0.05, roles
    assert cpu_by_role_of(2**22 + 12345) == {}  # a process that is not there
