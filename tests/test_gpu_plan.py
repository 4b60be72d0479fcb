"""deploy/gpu-plan.sh, the runner of a lease's plan of gpu-bench steps: steps run in order with their variables, a step
that would not fit the time left is skipped and one that overruns is stopped, and every result comes back in one
archive. The GPU machine is the boundary here: the plan runs a stand-in for gpu-bench.sh that records what it was
asked (BENCH); deploy/gpu-bench.sh itself is run for its answer to an unknown step."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from tests.conftest import ROOT

RUNNER = ROOT / "deploy" / "gpu-plan.sh"
STAND_IN = """#!/usr/bin/env bash
# records the step and its variables, then sleeps NAP seconds (default 0)
echo "step=$1 cams=${CAMS:-unset} extra=${EXTRA:-unset}" > "$OUT/ran_$1.txt"
echo "last line of $1"
sleep "${NAP:-0}"
"""


def run_plan(tmp_path: Path, plan: str, end_s: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The plan run by deploy/gpu-plan.sh against the stand-in; its results unpacked under tmp_path/unpacked."""
    bench = tmp_path / "bench.sh"
    bench.write_text(STAND_IN)
    plan_file = tmp_path / "lease.sh"
    plan_file.write_text(plan)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "END": str(end_s), "BENCH": str(bench)}
    done = subprocess.run(["bash", str(RUNNER), str(plan_file)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "plan_lease.tgz") as archive:
        archive.extractall(unpacked, filter="data")
    return done, unpacked


def test_steps_run_in_order_with_their_variables_and_come_back_in_one_archive(tmp_path: Path) -> None:
    plan = ('step 0 groups CAMS=150 EXTRA="--set emotion.model=dlibface_student64 --interval 3"\n'
            "step 0 session-probe\n")
    done, unpacked = run_plan(tmp_path, plan, end_s=300)
    assert done.returncode == 0, done.stderr
    assert (unpacked / "ran_groups.txt").read_text().strip() == \
        "step=groups cams=150 extra=--set emotion.model=dlibface_student64 --interval 3"
    assert (unpacked / "ran_session-probe.txt").read_text().strip() == "step=session-probe cams=unset extra=unset"
    log = (unpacked / "log_lease.txt").read_text()
    assert log.index("gpu-plan: groups") < log.index("gpu-plan: session-probe")
    assert "last line of groups" in done.stdout  # each step's last lines on stdout, for the call's reply
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["plan_lease.tgz"]  # one file back, not dozens


def test_a_step_that_does_not_fit_is_skipped_and_one_that_overruns_is_stopped(tmp_path: Path) -> None:
    plan = ("step 100000 groups-sweep CAMS=160\n"
            "step 0 groups NAP=600\n"
            "step 0 memory\n")
    done, unpacked = run_plan(tmp_path, plan, end_s=12)
    assert done.returncode == 0, done.stderr
    log = (unpacked / "log_lease.txt").read_text()
    assert "gpu-plan: skipped groups-sweep CAMS=160" in log
    assert not (unpacked / "ran_groups-sweep.txt").exists()
    assert (unpacked / "ran_groups.txt").exists()
    assert "gpu-plan: groups ended with status 124" in log  # stopped by the plan's end, not the call's
    assert "gpu-plan: skipped memory" in log  # nothing left after the overrun
    assert "gpu-plan: done in" in log


def test_a_plan_that_is_missing_is_named(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(RUNNER), str(tmp_path / "nope.sh")], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2
    assert f"gpu-plan: no plan file {tmp_path / 'nope.sh'}" in done.stderr


def test_gpu_bench_refuses_a_step_it_does_not_have(tmp_path: Path) -> None:
    """A misspelt step in a plan used to do nothing and say nothing, while the lease's minutes ran."""
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(ROOT / "deploy" / "gpu-bench.sh"), "group"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "gpu-bench: no step 'group'" in done.stderr
