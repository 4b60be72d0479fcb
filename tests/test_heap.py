"""Freed heap given back to the system (pipeline/core/heap.py): glibc's malloc_trim on a really fragmented heap, and
the trimmer's period on a fake clock. The daemon and its camera groups trimming: tests/test_groups.py."""

from __future__ import annotations

import ctypes

import pytest

from pipeline.core.heap import HeapTrimmer, can_trim, resident_bytes, trim_heap
from pipeline.core.libc import LIBC

needs_glibc = pytest.mark.skipif(not can_trim(), reason="the C library here has no malloc_trim (not glibc)")

CHUNK = 96 << 10  # under glibc's mmap threshold (128 KiB at start): served from the heap, not mapped apart
CHUNKS = 1200  # ~112 MB


def _fragmented_heap() -> list[int]:
    """Allocate and touch CHUNKS chunks, then free all but every 50th: the freed pages lie between live chunks, where
    glibc keeps them (it gives back only the top of the heap by itself). Returns the chunks still held."""
    LIBC.malloc.restype = ctypes.c_void_p
    LIBC.free.argtypes = [ctypes.c_void_p]
    chunks = [LIBC.malloc(CHUNK) for _ in range(CHUNKS)]
    for chunk in chunks:
        ctypes.memset(chunk, 1, CHUNK)
    kept = chunks[::50]
    for chunk in chunks:
        if chunk not in kept:
            LIBC.free(chunk)
    return kept


@needs_glibc
def test_freed_heap_between_live_chunks_goes_back_to_the_system() -> None:
    kept = _fragmented_heap()
    try:
        before = resident_bytes()
        released = trim_heap()
        after = resident_bytes()
        assert before is not None and after is not None and released is not None
        assert released >= 60 << 20, f"only {released / 2**20:.1f} MB given back of ~110 MB freed"
        assert abs((before - after) - released) < 1 << 20  # what the process itself lost
        assert trim_heap() < 8 << 20  # nothing much left to give back
    finally:
        for chunk in kept:
            LIBC.free(chunk)


@needs_glibc
def test_the_trimmer_trims_once_a_period_from_its_start_and_never_at_period_zero() -> None:
    now = [100.0]
    trimmer = HeapTrimmer("test", clock=lambda: now[0])
    assert trimmer.tick(30) is None  # not yet: the first trim is one period after the start
    now[0] = 129.0
    assert trimmer.tick(30) is None
    kept = _fragmented_heap()
    try:
        now[0] = 130.0
        released = trimmer.tick(30)
        assert released is not None and released >= 60 << 20
        assert trimmer.trims == 1 and trimmer.released_bytes == released
        now[0] = 159.0
        assert trimmer.tick(30) is None  # the next period counts from this trim
        now[0] = 160.5
        assert trimmer.tick(30) is not None and trimmer.trims == 2
        now[0] = 10_000.0
        assert trimmer.tick(0) is None and trimmer.trims == 2  # inference.trim_heap_s: 0 = never
    finally:
        for chunk in kept:
            LIBC.free(chunk)
