"""`bench soak`: the daemon's resident memory over a long run in which every camera reconnects periodically.

Why (issue 12, item 9): with four cameras each reconnect raised the daemon's resident memory by a few MB, growth that
a short benchmark never shows. This mode runs the real daemon (`run_pipeline.py run`, as a subprocess, so that its
memory is measured alone, without this process's) with N cameras on one looping RTSP stream, forces every camera to
reconnect every --reconnect-every-s seconds, and samples the daemon's RSS and threads from /proc every few seconds.

The outage is made on the server side, as a camera makes it: `restart` kills the RTSP server and starts it again on
the same port (a camera rebooting: every read fails at once), `freeze` stops it with SIGSTOP for --outage-s seconds
and resumes it (a network outage: reads block until the daemon declares the camera stalled). The figure reported is
the RSS change from minute --warmup-min to the end; each figure is the median of the samples of one minute, so that
one sample taken while frames are in flight does not decide it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pipeline.tools.usage import UsageError

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RTSP_SCRIPT = PROJECT_ROOT / "tests" / "servers" / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"  # the RTSP server needs GStreamer's Python bindings, from Debian packages
RTSP_PACKAGES = ("python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good "
                 "gstreamer1.0-plugins-bad")
READY_TIMEOUT_S = 30.0
STREAMING_TIMEOUT_S = 180.0  # the daemon prepares and warms its models before its cameras stream
STOP_TIMEOUT_S = 20.0
MALLOC_HEAP = 1 << 26  # glibc's HEAP_MAX_SIZE on 64-bit: every heap of a non-main malloc arena is one such region


class SoakError(UsageError):
    """The soak cannot run or went wrong (server or daemon failed): the CLI prints the message, which says what to
    do, as one line (exit 2) instead of a traceback."""


def add_soak_args(parser: argparse.ArgumentParser) -> None:
    stream = parser.add_mutually_exclusive_group(required=True)
    stream.add_argument("--rtsp-server", type=Path, default=None, metavar="VIDEO.mp4",
                        help="start the test RTSP server (tests/servers/rtsp_server.py, system python with "
                             f"GStreamer: apt-get install {RTSP_PACKAGES}) looping this H.264 mp4; outages are "
                             "made by restarting or freezing it")
    stream.add_argument("--url", default=None, metavar="rtsp://…",
                        help="an RTSP stream that is already running; no outage can be forced on it (the soak then "
                             "only watches memory)")
    parser.add_argument("--cameras", type=int, default=4, help="cameras on the stream (default 4)")
    parser.add_argument("--duration-min", type=float, default=40.0, help="length of the soak in minutes (default 40)")
    parser.add_argument("--reconnect-every-s", type=float, default=300.0,
                        help="force an outage this often, in seconds (default 300; 0: never)")
    parser.add_argument("--outage", choices=["restart", "freeze"], default="restart",
                        help="restart: kill the server and start it again (a camera rebooting); freeze: SIGSTOP "
                             "for --outage-s, then SIGCONT (a network outage, found by the stall watch)")
    parser.add_argument("--outage-s", type=float, default=None,
                        help="how long the server stays down or frozen (default: 2 s for restart, stall_s + 3 s "
                             "for freeze)")
    parser.add_argument("--warmup-min", type=float, default=5.0,
                        help="the growth is reported from this minute to the end (default 5)")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between two RSS samples (default 5)")
    parser.add_argument("--fps", type=float, default=15.0, help="camera fps (analysed frames per second, at most)")
    parser.add_argument("--stall-s", type=float, default=5.0, help="the cameras' reconnect.stall_s (default 5)")
    parser.add_argument("--detector-input", default="320x192", metavar="WxH|auto",
                        help="detector.input_size of the daemon (default 320x192)")
    parser.add_argument("--malloc-arena-max", type=int, default=None, metavar="N",
                        help="run the daemon with MALLOC_ARENA_MAX=N (glibc), for comparison")
    parser.add_argument("--label", default="", help="a free text stored in the JSON, e.g. the code measured")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")


# ------------------------------------------------------------------------------------------------ the RTSP server


class RtspServer:
    """The test RTSP server as a child process on a fixed port: killed and restarted, or frozen, for outages."""

    def __init__(self, video: Path, port: int) -> None:
        self.video, self.port = video, port
        self.url = f"rtsp://127.0.0.1:{port}/cam"
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None

    def start(self) -> None:
        """Start the server and wait for its READY line (SoakError with its stderr if none comes)."""
        if not Path(SYSTEM_PYTHON).exists() or not RTSP_SCRIPT.exists():
            raise SoakError(f"--rtsp-server needs {SYSTEM_PYTHON} and {RTSP_SCRIPT}")
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        cmd = [SYSTEM_PYTHON, str(RTSP_SCRIPT), "--port", str(self.port), "--path", "/cam", "--video", str(self.video)]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        if not _ready_line(self._proc, READY_TIMEOUT_S):
            self.close()
            raise SoakError(f"the RTSP server did not start: {self.stderr_tail()} (it needs: apt-get install "
                            f"{RTSP_PACKAGES})")

    def stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-1500:]

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP (connections stay open, nothing is sent: a network outage) or SIGCONT."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def close(self) -> None:
        """Kill the server (a camera that loses power) and release its pipes; safe to call twice."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait(timeout=10)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _ready_line(proc: subprocess.Popen[str], timeout: float) -> bool:
    """Wait for the server's `READY rtsp://…` line; False if it exits or stays silent."""
    if proc.stdout is None:
        return False
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(timeout=left):
                continue
            line = proc.stdout.readline()
            if line.startswith("READY "):
                return True
            if line == "":
                return False
    return False


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------------------------ the daemon


@dataclass
class CameraCounts:
    """The daemon's cameras as its status server reports them (/api/status): state, reconnects, stalls in the last
    hour."""

    states: dict[str, str] = field(default_factory=dict)
    reconnects: int = 0
    stalls_1h: int = 0

    def all_streaming(self, cameras: list[str]) -> bool:
        return all(self.states.get(name) == "streaming" for name in cameras)


def _daemon_config(args: argparse.Namespace, url: str, folder: Path) -> tuple[Path, list[str], int]:
    """A config with `--cameras` cameras on `url`, camera events on stdout (not read: observations would flood it),
    and the status server on a free port, as in production: the soak reads the cameras from its /api/status."""
    names = [f"cam{i}" for i in range(args.cameras)]
    size = "auto" if args.detector_input == "auto" else "[" + ", ".join(args.detector_input.lower().split("x")) + "]"
    cameras = "".join(f"  - {{name: {name}, source: '{url}', fps: {args.fps:g}, "
                      f"reconnect: {{initial_s: 1, max_s: 30, stall_s: {args.stall_s:g}}}}}\n" for name in names)
    path, port = folder / "soak.yaml", _free_port()
    path.write_text(f"cameras:\n{cameras}detector: {{input_size: {size}}}\n"
                    "outputs: [{type: stdout, format: json, events: [camera]}]\n"
                    f"server: {{port: {port}}}\nlogging: {{level: warning}}\n", encoding="utf-8")
    return path, names, port


class DaemonProcess:
    """`run_pipeline.py run` as a child process: its cameras from its status server, its memory from /proc."""

    def __init__(self, config: Path, port: int, arena_max: int | None, stderr: IO[str]) -> None:
        env = dict(os.environ)
        if arena_max is not None:
            env["MALLOC_ARENA_MAX"] = str(arena_max)
        cmd = [sys.executable, str(PROJECT_ROOT / "run_pipeline.py"), "run", "--config", str(config)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=PROJECT_ROOT)
        self.status_url = f"http://127.0.0.1:{port}/api/status"
        self.cameras = CameraCounts()
        self.tids_seen: set[int] = set()

    def poll_cameras(self) -> CameraCounts:
        """The cameras now; the last answer while the server does not answer (starting, or busy for a moment)."""
        try:
            with urllib.request.urlopen(self.status_url, timeout=5) as answer:
                cameras = json.load(answer)["cameras"]
        except (OSError, ValueError, KeyError) as exc:
            log.debug("no status from the daemon: %s", exc)
            return self.cameras
        self.cameras = CameraCounts({c["name"]: c["state"] for c in cameras},
                                    sum(int(c.get("reconnects_total", 0)) for c in cameras),
                                    sum(int(c.get("stalls_1h", 0)) for c in cameras))
        return self.cameras

    def alive(self) -> bool:
        return self.proc.poll() is None

    def sample(self) -> dict[str, float]:
        """RSS (MB) and threads now; remembers every thread id seen, to count the threads started during the run."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text(encoding="utf-8")
            tids = {int(t) for t in os.listdir(f"/proc/{self.proc.pid}/task")}
            heaps = malloc_heaps(self.proc.pid)
        except OSError as exc:  # it exited between the liveness check and this read
            raise SoakError(f"the daemon exited ({exc})") from exc
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        self.tids_seen |= tids
        return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "threads": len(tids),
                "thread_ids_seen": len(self.tids_seen), "malloc_heaps": heaps}

    def stop(self) -> int | None:
        """SIGTERM and wait (the daemon's ordered stop); SIGKILL if it does not end in time."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("the daemon ignored SIGTERM for %.0f s; killing it", STOP_TIMEOUT_S)
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def malloc_heaps(pid: int) -> int:
    """glibc malloc heaps of process `pid`: anonymous 64 MiB-aligned regions of exactly 64 MiB in its maps.

    Each non-main arena (glibc makes one for a new thread that allocates, up to 8 per core) lives in such heaps, so
    this counts the arenas, from outside the process; checked against malloc_info() in-process, it matched."""
    rows = []
    for line in Path(f"/proc/{pid}/maps").read_text(encoding="utf-8").splitlines():
        parts = line.split()
        low, high = (int(x, 16) for x in parts[0].split("-"))
        rows.append((low, high, len(parts) > 5))
    count = 0
    for i, (low, high, named) in enumerate(rows):
        if named or low % MALLOC_HEAP:
            continue
        end = high
        for next_low, next_high, next_named in rows[i + 1:]:  # the heap's used part, then its reserved rest
            if next_low != end or next_named or end >= low + MALLOC_HEAP:
                break
            end = next_high
        count += end == low + MALLOC_HEAP
    return count


# ------------------------------------------------------------------------------------------------ the soak


@dataclass
class Outage:
    """One forced outage: when it began (seconds into the soak) and when every camera streamed again."""

    at_s: float
    kind: str
    recovered_s: float | None = None


def _make_outage(server: RtspServer, kind: str, outage_s: float) -> None:
    """Take the stream away for `outage_s` seconds the way `kind` says, then give it back."""
    if kind == "freeze":
        server.freeze(True)
        time.sleep(outage_s)
        server.freeze(False)
        return
    server.close()
    time.sleep(outage_s)
    server.start()


class Soak:
    """The soak's loop: samples on a fixed period, outages in their own thread so that sampling never waits."""

    def __init__(self, args: argparse.Namespace, daemon: DaemonProcess, cameras: list[str],
                 server: RtspServer | None) -> None:
        self.args, self.daemon, self.cameras, self.server = args, daemon, cameras, server
        self.samples: list[dict[str, float]] = []
        self.outages: list[Outage] = []
        self._outage_thread: threading.Thread | None = None
        self._outage_error: Exception | None = None

    def run(self, progress: Any) -> None:
        duration_s, every = self.args.duration_min * 60.0, self.args.reconnect_every_s
        t0 = time.monotonic()
        next_sample, next_outage = t0, (t0 + every if every > 0 and self.server is not None else float("inf"))
        while (now := time.monotonic()) - t0 < duration_s:
            if not self.daemon.alive():
                raise SoakError(f"the daemon exited with status {self.daemon.proc.returncode}")
            if self._outage_error is not None:
                raise SoakError(f"an outage could not be made: {self._outage_error}")
            self._note_recovery(now - t0)
            if now >= next_outage and self._outage_done():
                self._start_outage(now - t0)
                next_outage += every
            if now >= next_sample:
                self._take_sample(now - t0, progress)
                next_sample += self.args.sample_s
            time.sleep(min(0.2, max(0.0, next_sample - time.monotonic())))
        if self._outage_thread is not None:
            self._outage_thread.join(READY_TIMEOUT_S + 60)

    def _take_sample(self, t_s: float, progress: Any) -> None:
        sample = {"t_s": round(t_s, 1), **self.daemon.sample(),
                  "reconnects": self.daemon.poll_cameras().reconnects, "outages": len(self.outages)}
        self.samples.append(sample)
        if progress is not None:
            progress.n = min(int(t_s), progress.total)
            progress.set_postfix(rss_mb=sample["rss_mb"], outages=len(self.outages), refresh=False)
            progress.refresh()

    def _outage_done(self) -> bool:
        return self._outage_thread is None or not self._outage_thread.is_alive()

    def _start_outage(self, t_s: float) -> None:
        if self.server is None:
            return
        kind = self.args.outage
        default_s = 2.0 if kind == "restart" else self.args.stall_s + 3.0
        outage_s = self.args.outage_s if self.args.outage_s is not None else default_s
        self.outages.append(Outage(round(t_s, 1), kind))
        log.info("outage %d at %.0f s: %s for %.1f s", len(self.outages), t_s, kind, outage_s)

        def make() -> None:
            try:
                _make_outage(self.server, kind, outage_s)  # type: ignore[arg-type]
            except SoakError as exc:
                self._outage_error = exc

        self._outage_thread = threading.Thread(target=make, name="soak-outage", daemon=True)
        self._outage_thread.start()

    def _note_recovery(self, t_s: float) -> None:
        """The last outage is over once the server is back and every camera streams again."""
        if not self.outages or self.outages[-1].recovered_s is not None or not self._outage_done():
            return
        if self.daemon.poll_cameras().all_streaming(self.cameras):
            self.outages[-1].recovered_s = round(t_s - self.outages[-1].at_s, 1)


def _wait_streaming(daemon: DaemonProcess, cameras: list[str]) -> None:
    deadline = time.monotonic() + STREAMING_TIMEOUT_S
    while not daemon.poll_cameras().all_streaming(cameras):
        if not daemon.alive():
            raise SoakError(f"the daemon exited with status {daemon.proc.returncode} before its cameras streamed")
        if time.monotonic() > deadline:
            raise SoakError(f"the cameras did not all stream within {STREAMING_TIMEOUT_S:.0f} s")
        time.sleep(0.5)


def bench_soak(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server and the daemon, soak, stop both; the results for the table and the JSON."""
    _check_args(args)
    server = RtspServer(args.rtsp_server.resolve(), _free_port()) if args.rtsp_server else None
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as folder, \
            open(Path(folder) / "daemon.stderr", "w+", encoding="utf-8") as stderr:
        try:
            if server is not None:
                server.start()
            config, cameras, port = _daemon_config(args, server.url if server else args.url, Path(folder))
            daemon = DaemonProcess(config, port, args.malloc_arena_max, stderr)
            try:
                soak = _soak(args, daemon, cameras, server)
            finally:
                status = daemon.stop()
        except SoakError as exc:
            stderr.seek(0)
            raise SoakError(f"{exc}; daemon stderr:\n{stderr.read()[-3000:]}") from exc
        finally:
            if server is not None:
                server.close()
    return _results(args, soak, status, daemon)


def _check_args(args: argparse.Namespace) -> None:
    """Refuse what cannot give a figure before starting anything (a soak is long)."""
    if args.rtsp_server is not None and not args.rtsp_server.is_file():
        raise SoakError(f"--rtsp-server: {args.rtsp_server} is not a file")
    if args.cameras < 1 or args.sample_s <= 0 or args.reconnect_every_s < 0:
        raise SoakError("--cameras must be 1 or more, --sample-s above 0 and --reconnect-every-s 0 or more")
    if not 0 < args.warmup_min < args.duration_min:
        raise SoakError(f"--warmup-min ({args.warmup_min:g}) must lie between 0 and --duration-min "
                        f"({args.duration_min:g})")


def _soak(args: argparse.Namespace, daemon: DaemonProcess, cameras: list[str],
          server: RtspServer | None) -> Soak:
    log.info("waiting for %d cameras to stream", len(cameras))
    _wait_streaming(daemon, cameras)
    log.info("all %d cameras stream: soaking for %g min%s", len(cameras), args.duration_min,
             f", an outage ({args.outage}) every {args.reconnect_every_s:g} s" if server and args.reconnect_every_s
             else ", no outage")
    soak = Soak(args, daemon, cameras, server)
    progress = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        progress = tqdm(total=int(args.duration_min * 60), unit="s", file=sys.stderr, desc="soak")
    try:
        soak.run(progress)
    finally:
        if progress is not None:
            progress.close()
    return soak


# ------------------------------------------------------------------------------------------------ results


def _minute_median(samples: list[dict[str, float]], minute: float) -> float | None:
    """Median RSS of the samples in the minute that ends at `minute` (None if there is none)."""
    values = [s["rss_mb"] for s in samples if minute * 60 - 60 < s["t_s"] <= minute * 60]
    return round(statistics.median(values), 1) if values else None


def _results(args: argparse.Namespace, soak: Soak, status: int | None, daemon: DaemonProcess) -> dict[str, Any]:
    samples = soak.samples
    minutes = [m for m in range(1, int(args.duration_min) + 1)]
    table = [{"minute": m, "rss_mb": _minute_median(samples, m),
              "reconnects": max([s["reconnects"] for s in samples if s["t_s"] <= m * 60], default=0),
              "outages": max([s["outages"] for s in samples if s["t_s"] <= m * 60], default=0),
              "threads": max([s["threads"] for s in samples if m * 60 - 60 < s["t_s"] <= m * 60], default=0),
              "malloc_heaps": max([s["malloc_heaps"] for s in samples if s["t_s"] <= m * 60], default=0)}
             for m in minutes]
    start, end = _minute_median(samples, args.warmup_min), _minute_median(samples, args.duration_min)
    first_ids = next((s["thread_ids_seen"] for s in samples if s["t_s"] >= args.warmup_min * 60), None)
    return {"mode": "soak", "label": args.label, "cameras": args.cameras, "duration_min": args.duration_min,
            "reconnect_every_s": args.reconnect_every_s, "outage": args.outage, "fps": args.fps,
            "stall_s": args.stall_s, "detector_input": args.detector_input, "warmup_min": args.warmup_min,
            "malloc_arena_max": args.malloc_arena_max, "stream": "rtsp-server" if args.rtsp_server else "url",
            "video": str(args.rtsp_server) if args.rtsp_server else None, "daemon_exit": status,
            "camera_reconnects": daemon.cameras.reconnects, "camera_stalls_1h": daemon.cameras.stalls_1h,
            "outages": [vars(o) for o in soak.outages], "minutes": table, "samples": samples,
            "rss_start_mb": start, "rss_end_mb": end,
            "rss_change_pct": round(100 * (end - start) / start, 2) if start and end else None,
            "threads_started_after_warmup": (samples[-1]["thread_ids_seen"] - first_ids)
            if samples and first_ids is not None else None}


def print_soak_table(result: dict[str, Any]) -> None:
    print(f"soak: {result['cameras']} cameras, {result['duration_min']:g} min, outage ({result['outage']}) every "
          f"{result['reconnect_every_s']:g} s{'' if not result['label'] else ', ' + result['label']}")
    print(f"{'minute':>6} {'RSS MB':>8} {'outages':>8} {'reconnects':>11} {'threads':>8} {'malloc heaps':>13}")
    for row in result["minutes"]:
        rss = "-" if row["rss_mb"] is None else f"{row['rss_mb']:.1f}"
        print(f"{row['minute']:>6} {rss:>8} {row['outages']:>8} {row['reconnects']:>11} {row['threads']:>8} "
              f"{row.get('malloc_heaps', '-'):>13}")
    recovered = [o["recovered_s"] for o in result["outages"] if o["recovered_s"] is not None]
    print(f"outages {len(result['outages'])} (all cameras streaming again after {max(recovered, default=0):.1f} s at "
          f"most), camera reconnects {result['camera_reconnects']}, threads started after minute "
          f"{result['warmup_min']:g}: {result['threads_started_after_warmup']}")
    change = result["rss_change_pct"]
    print(f"RSS from minute {result['warmup_min']:g} to end: "
          + ("n/a (too few samples)" if change is None else
             f"{change:+.1f} % ({result['rss_start_mb']:.1f} -> {result['rss_end_mb']:.1f} MB)"))
