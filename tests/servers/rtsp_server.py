#!/usr/bin/python3
"""A real RTSP server (GStreamer's gst-rtsp-server) that loops an H.264 mp4 file, for camera robustness tests.

Run it with the *system* python, which has PyGObject and the GStreamer introspection data
(`apt-get install -y --no-install-recommends gir1.2-gst-rtsp-server-1.0 python3-gi`):

    /usr/bin/python3 tests/servers/rtsp_server.py --port 8554 --path /cam --video clip.mp4 [--user U --password P]

Why it works the way it does:

* The mp4 is demuxed once into memory (H.264 access units, no re-encode), then pushed into an ``appsrc`` with
  timestamps shifted by one clip length per loop.  Looping this way is gap-free and costs almost no CPU;
  ``filesrc ! qtdemux`` cannot loop and re-encoding with x264 would eat a core.
* The media is shared (``set_shared(True)``) so several captures of one URL see one stream, like a real camera.
  Each newly constructed media (after all clients left) starts the clip from the beginning.
* ``READY rtsp://127.0.0.1:PORT/PATH`` goes to stdout once the socket is listening, so a test harness can wait for
  it instead of sleeping.  SIGTERM/SIGINT quit the main loop and the process exits with status 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

LOG = logging.getLogger("rtsp_server")

# appsrc gets the demuxed AVC access units; rtph264pay re-sends SPS/PPS before every IDR (config-interval=-1) so a
# client that joins a shared stream mid-clip can start decoding at the next keyframe.
LAUNCH = ("( appsrc name=src format=time is-live=false max-bytes=2000000 "
          "! h264parse ! rtph264pay name=pay0 pt=96 config-interval=-1 )")

COPY_ALL = (Gst.BufferCopyFlags.FLAGS | Gst.BufferCopyFlags.TIMESTAMPS | Gst.BufferCopyFlags.META
            | Gst.BufferCopyFlags.MEMORY)


@dataclass
class Clip:
    """The demuxed clip held in memory: caps with codec_data, access units, and one loop's length in ns."""

    caps: Gst.Caps
    units: list[Gst.Buffer]
    loop_ns: int


@dataclass
class Feeder:
    """Per-media playback position; a fresh one per constructed media so each new session starts at frame 0."""

    clip: Clip
    index: int = 0
    loop: int = 0


def load_clip(video: Path, timeout_s: float = 30.0) -> Clip:
    """Demux every H.264 access unit of `video` (fast, no decoding) so the server can loop it forever."""
    if not video.is_file():
        raise FileNotFoundError(video)
    pipeline = Gst.parse_launch(
        f'filesrc location="{video}" ! qtdemux ! h264parse '
        "! video/x-h264,stream-format=avc,alignment=au ! appsink name=sink sync=false")
    pipeline.set_state(Gst.State.PLAYING)
    try:
        caps, units = pull_all(pipeline, timeout_s)
    finally:
        pipeline.set_state(Gst.State.NULL)
    last = units[-1]
    loop_ns = last.dts + last.duration if last.dts != Gst.CLOCK_TIME_NONE else last.pts + last.duration
    LOG.info("loaded %s: %d access units, %.2f s per loop", video, len(units), loop_ns / 1e9)
    return Clip(caps=caps, units=units, loop_ns=loop_ns)


def pull_all(pipeline: Gst.Pipeline, timeout_s: float) -> tuple[Gst.Caps, list[Gst.Buffer]]:
    """Every sample of the pipeline's appsink until EOS; raise on a pipeline error instead of hanging.

    A plain ``pull-sample`` blocks forever when the demuxer fails (e.g. not an mp4), since no EOS ever comes.
    """
    sink, bus = pipeline.get_by_name("sink"), pipeline.get_bus()
    units: list[Gst.Buffer] = []
    caps = None
    deadline = time.monotonic() + timeout_s
    while not sink.get_property("eos"):
        sample = sink.emit("try-pull-sample", 100 * Gst.MSECOND)
        if sample is not None:
            caps = sample.get_caps()
            units.append(sample.get_buffer())
            continue
        error = bus.pop_filtered(Gst.MessageType.ERROR)
        if error is not None:
            raise RuntimeError(f"cannot demux: {error.parse_error()[0].message}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"demuxing took more than {timeout_s} s")
    if caps is None or not units:
        raise RuntimeError("no H.264 video track found (only H.264 mp4 files are served)")
    return caps, units


def shifted(unit: Gst.Buffer, offset_ns: int) -> Gst.Buffer:
    """A new buffer sharing `unit`'s memory, with timestamps moved by `offset_ns`.

    Not ``unit.copy()``: through PyGObject that is the boxed copy, i.e. only a new reference, so setting its pts
    would shift the stored clip and make the next session start seconds in the future.
    """
    out = unit.copy_region(COPY_ALL, 0, unit.get_size())
    if unit.pts != Gst.CLOCK_TIME_NONE:
        out.pts = unit.pts + offset_ns
    if unit.dts != Gst.CLOCK_TIME_NONE:
        out.dts = unit.dts + offset_ns
    return out


def on_need_data(appsrc: Gst.Element, _length: int, feeder: Feeder) -> None:
    """Push the next access unit; the RTSP sinks sync to the clock, so this runs at the clip's frame rate."""
    clip = feeder.clip
    unit = shifted(clip.units[feeder.index], feeder.loop * clip.loop_ns)
    feeder.index += 1
    if feeder.index == len(clip.units):
        feeder.index, feeder.loop = 0, feeder.loop + 1
    appsrc.emit("push-buffer", unit)


def on_media_configure(_factory: GstRtspServer.RTSPMediaFactory, media: GstRtspServer.RTSPMedia, clip: Clip) -> None:
    """Wire a fresh feeder to the appsrc of each media the factory constructs."""
    appsrc = media.get_element().get_by_name("src")
    appsrc.set_property("caps", clip.caps)
    appsrc.connect("need-data", on_need_data, Feeder(clip))
    LOG.info("media constructed")


def add_basic_auth(server: GstRtspServer.RTSPServer, factory: GstRtspServer.RTSPMediaFactory,
                   user: str, password: str) -> None:
    """Require HTTP basic credentials, so tests can check `rtsp://user:pass@host/...` URLs and rejections."""
    auth = GstRtspServer.RTSPAuth()
    token = GstRtspServer.RTSPToken()
    token.set_string("media.factory.role", user)
    auth.add_basic(GstRtspServer.RTSPAuth.make_basic(user, password), token)
    server.set_auth(auth)
    permissions = GstRtspServer.RTSPPermissions()
    permissions.add_permission_for_role(user, "media.factory.access", True)
    permissions.add_permission_for_role(user, "media.factory.construct", True)
    factory.set_permissions(permissions)


def build_server(args: argparse.Namespace, clip: Clip) -> GstRtspServer.RTSPServer:
    """The RTSP server with one shared, looping media factory mounted at `args.path`."""
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(LAUNCH)
    factory.set_shared(True)
    factory.connect("media-configure", on_media_configure, clip)
    if args.user is not None:
        add_basic_auth(server, factory, args.user, args.password or "")
    server.get_mount_points().add_factory(args.path, factory)
    return server


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line of the standalone server."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8554, help="TCP port for RTSP (0: any free port)")
    parser.add_argument("--path", default="/cam", help="mount point, e.g. /cam")
    parser.add_argument("--video", type=Path, required=True, help="H.264 mp4 file to loop")
    parser.add_argument("--user", help="require basic auth with this user name")
    parser.add_argument("--password", help="password for --user")
    args = parser.parse_args(argv)
    if not args.path.startswith("/"):
        args.path = "/" + args.path
    return args


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; exit status 2 when the port cannot be bound."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s rtsp_server %(message)s")
    args = parse_args(argv)
    Gst.init(None)
    try:
        clip = load_clip(args.video)
    except (OSError, RuntimeError) as exc:  # missing file, not an H.264 mp4, demux timeout
        LOG.error("cannot serve %s: %s", args.video, exc)
        return 1
    server = build_server(args, clip)
    loop = GLib.MainLoop()
    if server.attach(None) == 0:  # gst-rtsp-server logs the reason, e.g. address already in use
        LOG.error("cannot listen on 127.0.0.1:%s", args.port)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, signum, loop.quit)
    print(f"READY rtsp://127.0.0.1:{server.get_bound_port()}{args.path}", flush=True)
    loop.run()
    LOG.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
