"""The `websocket` output: events streamed to any number of clients at the status server's `/ws`.

Two halves on two threads. `WebsocketSink` is an ordinary Sink (own queue, own thread): it serialises each event
once and hands it to the `EventHub`. The hub lives on the status server's event loop and keeps one bounded asyncio
queue per client; a client whose queue is full (it reads more slowly than events arrive) is disconnected and
counted, never waited for, so one stuck browser tab cannot delay the others or the pipeline.

A client may ask for some event types only: `/ws?types=command` or `/ws?types=command,camera`.

Late joiners: every client first gets one `snapshot` event (a client with `?types=` only when it names
`snapshot`, e.g. `/ws?types=snapshot,command`: clients written before it existed see nothing new), built by the hub's `snapshot`
callable (the daemon's) on the server's loop before the client joins the fan-out: each camera's state and each
avatar's current expression and tone, and where each avatar looks (`looks`: its last `lookat` event, whatever the
output's `events`). Events already on their way may repeat what the snapshot says; none is lost
between the snapshot and the stream, because the client is added to the fan-out in the same loop step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from aiohttp import WSMsgType, web
from pydantic import Field

from pipeline.core.registry import Plugin
from pipeline.outputs.base import ALL_EVENTS, EventName, OutputSettings, Sink
from pipeline.outputs.events import Event

log = logging.getLogger(__name__)

EVENT_TYPES = frozenset({*get_args(EventName), "config", "snapshot"})
DEFAULT_QUEUE = 256
# How much may sit in buffers for one client before its queue starts to fill: the kernel's send buffer (fixed, so
# that autotuning cannot hide a stuck client behind megabytes; 64 KiB allows > 1 MB/s at 50 ms round trip, far
# above any event stream) and asyncio's/aiohttp's own write buffers.
SEND_BUFFER = 64 * 1024
WRITE_BUFFER_HIGH = 16 * 1024
WRITER_LIMIT = 16 * 1024
CLOSE_WAIT_S = 0.5


@dataclass(eq=False)
class _Client:
    ws: web.WebSocketResponse
    request: web.Request
    peer: str
    types: frozenset[str] | None
    queue: asyncio.Queue[str]
    sender: asyncio.Task[None] | None = None
    dropped: bool = False
    sent: int = field(default=0)


class EventHub:
    """The clients of `/ws`. `publish` may be called from any thread; everything else runs on the server's loop."""

    def __init__(self) -> None:
        self.enabled = False
        self.queue_size = DEFAULT_QUEUE
        self.clients_dropped = 0
        self.clients_total = 0
        self.events_published = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: set[_Client] = set()
        self._lock = threading.Lock()
        self.snapshot: Callable[[], Event] | None = None  # the late joiner's first message (see the module doc)

    # ---------------------------------------------------------------- configuration (any thread)

    def configure(self, output: Any | None) -> None:
        """Serve /ws for this `websocket` output config, or stop serving it (None)."""
        self.enabled = output is not None
        if output is not None:
            self.queue_size = int(getattr(output, "queue_size", DEFAULT_QUEUE))
        elif self._loop is not None and self._clients:
            self._call(self._drop_all, "the websocket output was removed from the configuration")

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The status server's loop, once it serves."""
        with self._lock:
            self._loop = loop

    def detach(self, loop: asyncio.AbstractEventLoop) -> None:
        """That server stopped (a newer one may already be attached: then nothing changes)."""
        with self._lock:
            if self._loop is loop:
                self._loop = None
                self._clients.clear()

    @property
    def client_count(self) -> int:
        return len(self._clients)

    # ---------------------------------------------------------------- publishing (pipeline threads)

    def publish(self, event: Event) -> None:
        """Queue an event for every interested client; cheap when nobody is connected."""
        if not self._clients or not self.enabled:
            return
        text = json.dumps(event, separators=(",", ":"))
        self._call(self._fan_out, event.get("type", ""), text)

    def _call(self, fn: Any, *args: Any) -> None:
        with self._lock:
            loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed while we were publishing: nobody to tell
            loop.call_soon_threadsafe(fn, *args)

    # ---------------------------------------------------------------- the loop's side

    def _fan_out(self, event_type: str, text: str) -> None:
        self.events_published += 1
        for client in list(self._clients):
            if client.dropped or (client.types is not None and event_type not in client.types):
                continue
            try:
                client.queue.put_nowait(text)
            except asyncio.QueueFull:
                self._drop(client, f"too slow: {client.queue.maxsize} events waiting")

    def _drop(self, client: _Client, reason: str) -> None:
        client.dropped = True
        self._clients.discard(client)
        self.clients_dropped += 1
        log.warning("websocket client %s disconnected: %s", client.peer, reason)
        asyncio.get_running_loop().create_task(self._disconnect(client))

    def _drop_all(self, reason: str) -> None:
        for client in list(self._clients):
            client.dropped = True
            self._clients.discard(client)
            asyncio.get_running_loop().create_task(self._disconnect(client))
        if reason:
            log.info("websocket clients disconnected: %s", reason)

    async def _disconnect(self, client: _Client, code: int = 1013, message: bytes = b"too slow") -> None:
        if client.sender is not None:
            client.sender.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.ws.close(code=code, message=message, drain=False), CLOSE_WAIT_S)
        transport = client.request.transport
        if transport is not None:
            transport.abort()  # whatever is still buffered for a client that does not read is thrown away

    async def close_all(self) -> None:
        """Server shutdown: say goodbye to every client (bounded)."""
        clients = list(self._clients)
        self._clients.clear()
        for client in clients:
            client.dropped = True
        await asyncio.gather(*(self._disconnect(c, 1001, b"server shutting down") for c in clients),
                             return_exceptions=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """GET /ws: a WebSocket of JSON events, optionally `?types=a,b`."""
        if not self.enabled:
            return web.json_response({"error": "no websocket output configured: add {type: websocket} to outputs"},
                                     status=404)
        types = _parse_types(request.query.get("types"))
        if isinstance(types, str):
            return web.json_response({"error": types}, status=400)
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=64 * 1024, writer_limit=WRITER_LIMIT)
        await ws.prepare(request)
        _bound_buffers(request)
        peer = _peer(request)
        client = _Client(ws, request, peer, types, asyncio.Queue(maxsize=self.queue_size + 1))
        self._queue_snapshot(client)
        client.sender = asyncio.get_running_loop().create_task(self._send_loop(client))
        self._clients.add(client)
        self.clients_total += 1
        log.debug("websocket client %s connected (types: %s)", peer, ",".join(sorted(types)) if types else "all")
        try:
            async for message in ws:  # clients have nothing to say; read until they close
                if message.type == WSMsgType.ERROR:
                    break
        finally:
            self._clients.discard(client)
            if client.sender is not None:
                client.sender.cancel()
        return ws

    def _queue_snapshot(self, client: _Client) -> None:
        """The snapshot first, in the same loop step that adds the client to the fan-out (so nothing is missed)."""
        if self.snapshot is None or (client.types is not None and "snapshot" not in client.types):
            return
        try:
            text = json.dumps(self.snapshot(), separators=(",", ":"))
        except (TypeError, ValueError, RuntimeError) as exc:
            log.warning("websocket client %s: no snapshot (%s)", client.peer, exc)
            return
        client.queue.put_nowait(text)

    async def _send_loop(self, client: _Client) -> None:
        try:
            while True:
                text = await client.queue.get()
                await client.ws.send_str(text)
                client.sent += 1
        except (asyncio.CancelledError, ConnectionError):
            pass
        except Exception as exc:  # noqa: BLE001 - a broken client is that client's problem only
            log.debug("websocket client %s: %s", client.peer, exc)


def _parse_types(raw: str | None) -> frozenset[str] | None | str:
    if raw is None or not raw.strip():
        return None
    wanted = frozenset(t.strip() for t in raw.split(",") if t.strip())
    unknown = wanted - EVENT_TYPES
    if unknown:
        return f"unknown event type(s) {', '.join(sorted(unknown))} (choose from {', '.join(sorted(EVENT_TYPES))})"
    return wanted


def _bound_buffers(request: web.Request) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    with contextlib.suppress(AttributeError, NotImplementedError):
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)


def _peer(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "?")


class WebsocketOutput(OutputSettings):
    """Events streamed by the status server at /ws."""

    type: Literal["websocket"] = Field("websocket", description="Output kind.")
    events: list[EventName] = Field(default_factory=lambda: list(ALL_EVENTS), min_length=1,
                                    description="Event types sent: observation, command, camera.")
    queue_size: int = Field(256, ge=1, le=100_000, description="Events buffered per /ws client; a client that "
                                                               "falls this far behind is disconnected (and counted) "
                                                               "rather than waited for.")


class WebsocketSink(Sink):
    """Hands events to the hub of the status server (bound by the daemon); drops them when none is bound."""

    type_name = "websocket"

    def __init__(self, cfg: Any, queue_size: int = 1024) -> None:
        super().__init__(cfg, queue_size)
        self.hub: EventHub | None = None

    def bind(self, hub: EventHub) -> None:
        """The daemon's hub; the daemon also calls `hub.configure(cfg)` once this sink replaces the previous one."""
        self.hub = hub

    def write(self, event: Event) -> None:
        if self.hub is None:
            raise RuntimeError("no status server to serve /ws")
        self.hub.publish(event)


PLUGIN = Plugin("websocket", WebsocketOutput, WebsocketSink)
