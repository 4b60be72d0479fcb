"""Issue 12, item 9, the mechanism: glibc malloc arenas of one process, per forced reconnect of N capture threads.

Not part of the product: the measurement behind BENCHMARKS.md, "Memory at reconnects". Runs N CaptureThreads (capture
only, no models) on the test RTSP server, forces every camera to reconnect (`--how kill`: the server is killed and
restarted; `--how stall`: it is frozen until every camera declared the stall, then resumed) and prints, after each
outage, RSS, the reader threads ever started and glibc's own arena figures (malloc_info): arenas, arenas holding 8 MB
or more, their memory and how much of it is free (cached). `--filler N` starts N idle threads that allocate once, so
that the arenas are all taken (8 per core), as in the daemon with its model, worker and server threads.

    PROJ=/path/to/checkout python arenas_inprocess.py --how kill --filler 24 --outages 12 --every 5
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("PROJ", str(Path(__file__).resolve().parents[3])))

from pipeline.capture.sources import configure_ffmpeg  # noqa: E402
from pipeline.capture.thread import CaptureThread  # noqa: E402
from pipeline.config.app import CameraConfig, ReconnectConfig  # noqa: E402
from tests.servers.fixtures import RtspProcess, free_port  # noqa: E402

LIBC = ctypes.CDLL("libc.so.6")
LIBC.fopen.restype = ctypes.c_void_p
LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
LIBC.fclose.argtypes = [ctypes.c_void_p]
LIBC.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]


def arenas() -> list[tuple[float, float]]:
    """(MB of system memory, MB free in bins) per arena, from glibc's malloc_info XML."""
    fd, path = tempfile.mkstemp()
    os.close(fd)
    stream = LIBC.fopen(path.encode(), b"w")
    LIBC.malloc_info(0, stream)
    LIBC.fclose(stream)
    xml = Path(path).read_text()
    os.unlink(path)
    out = []
    for body in re.findall(r'<heap nr="\d+">(.*?)</heap>', xml, re.S):
        current = re.search(r'<system type="current" size="(\d+)"/>', body)
        free = re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', body)
        out.append((int(current.group(1)) / 2**20 if current else 0.0, sum(int(x) for x in free) / 2**20))
    return out


def describe() -> str:
    found = arenas()
    return (f"arenas={len(found)} big_arenas={sum(1 for mb, _ in found if mb >= 8)} "
            f"arena_MB={sum(mb for mb, _ in found):.0f} arena_free_MB={sum(free for _, free in found):.0f}")


def rss_mb() -> float:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--video", default=str(Path(__file__).resolve().parents[4] / "shared/data/video/group_1080p.mp4"))
    parser.add_argument("--cameras", type=int, default=4)
    parser.add_argument("--outages", type=int, default=10)
    parser.add_argument("--every", type=float, default=15, help="seconds of streaming between two outages")
    parser.add_argument("--fps", type=float, default=5)
    parser.add_argument("--how", choices=["kill", "stall"], default="kill")
    parser.add_argument("--filler", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    configure_ffmpeg("tcp")
    hold, kept = threading.Event(), []
    for _ in range(args.filler):
        threading.Thread(target=lambda: (kept.append(bytearray(4096)), hold.wait()), daemon=True).start()
    readers: set[int] = set()
    original_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        original_start(self)
        if self.name.startswith("reader-"):
            readers.add(id(self))

    threading.Thread.start = counting_start  # type: ignore[method-assign]
    server = RtspProcess(Path(args.video), free_port()).start()
    stop = threading.Event()
    caps = [CaptureThread(CameraConfig(name=f"c{i}", source=server.url, fps=args.fps,
                                       reconnect=ReconnectConfig(initial_s=1, max_s=5, stall_s=5)),
                          stop, lambda _e: None) for i in range(args.cameras)]
    for cap in caps:
        cap.start()

    def all_streaming() -> bool:
        return all(c.state == "streaming" and c.frames_in.total for c in caps)

    while not all_streaming():
        time.sleep(0.2)
    time.sleep(args.every)
    print("outage rss_mb threads readers_started", flush=True)
    print(f"0 {rss_mb():.1f} {threading.active_count()} {len(readers)} {describe()}", flush=True)
    for k in range(1, args.outages + 1):
        if args.how == "kill":
            server.kill()
            time.sleep(0.5)
            server.start()
        else:
            server.stall()
            while not all(c.reconnects.total >= k for c in caps):
                time.sleep(0.2)
            time.sleep(2)
            server.resume()
        while not (all_streaming() and all(c.reconnects.total >= k for c in caps)):
            time.sleep(0.2)
        time.sleep(args.every)
        print(f"{k} {rss_mb():.1f} {threading.active_count()} {len(readers)} {describe()}", flush=True)
    stop.set()
    for cap in caps:
        cap.join(5)
    server.close()


if __name__ == "__main__":
    main()
