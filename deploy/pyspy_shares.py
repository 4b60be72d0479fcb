"""Shares of a py-spy raw profile (`py-spy record --format raw`, as deploy/gpu-bench.sh's PROFILER writes): the
functions that most samples are in (anywhere on the stack, each counted once per sample) and the innermost frames.

Used for BENCHMARKS.md's "where a camera group's CPU goes". py-spy samples threads it sees running; a thread asleep
in native code may still be counted, so shares are of samples, not exact CPU.
    python3 deploy/pyspy_shares.py PROFILE.txt[.gz] [TOP]
"""

from __future__ import annotations

import gzip
import re
import sys
from collections import Counter

LINE = re.compile(r":\d+\)")  # a frame's line number: the same function at two lines counts once
FRAME = re.compile(r"^\S.* \(.+\)$")  # "function (file:line)"; the process's command line may hold ';' too


def shares(lines: list[str]) -> tuple[int, Counter[str], Counter[str]]:
    total, anywhere, innermost = 0, Counter(), Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [LINE.sub(")", frame) for frame in stack.split(";") if FRAME.match(frame)]
        if frames:
            innermost[frames[-1]] += samples
        for frame in set(frames):
            anywhere[frame] += samples
    return total, anywhere, innermost


def main(argv: list[str]) -> int:
    path, top = argv[0], int(argv[1]) if len(argv) > 1 else 25
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as profile:
        total, anywhere, innermost = shares(profile.readlines())
    for title, counter in (("innermost", innermost), ("anywhere on the stack", anywhere)):
        print(f"# {title} ({total} samples)")
        for frame, samples in counter.most_common(top):
            print(f"{100 * samples / max(total, 1):5.1f} %  {frame[:140]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
