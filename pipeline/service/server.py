"""The status server: /healthz, /metrics, /api/status, /ws, the status page and its live previews (aiohttp).

It runs on its own thread with its own event loop, so nothing it does (a slow browser, a scrape) can block a camera.
Pipeline threads reach it only through `loop.call_soon_threadsafe` (the event hub) or by having their latest
frame read from the preview store. Anything that takes a lock or draws pixels runs on a small thread pool.

| path | answer |
|---|---|
| GET /healthz | 200 {"status": "ok", …} or 503 naming what is not; never needs the token |
| GET /metrics | Prometheus text (pipeline.service.metrics) |
| GET /api/status | JSON (pipeline.service.status.status_document) |
| GET /ws | WebSocket of events (the `websocket` output; `?types=command,camera`) |
| GET / | status page (pipeline/static) |
| GET /preview/ws | WebSocket of annotated JPEGs: binary messages `camera name \\n JPEG bytes`, at most preview_fps |
| GET /preview/{camera}.jpg | the newest annotated JPEG of one camera |
| GET /api/config | the configuration file as text (YAML) |
| POST /api/config/check | the text in the body checked as the file: 200 {"errors": []} or 422 {"errors": [...]} |
| PUT /api/config | the body saved as the file and reloaded: 200 with the reload's outcome, 422 with every error (nothing written), 403 when server.config_editor is false |
| GET /api/history | the newest commands, camera changes and reloads, newest first: ?types=command,camera,config &q=TEXT &limit=N |
| GET /api/logs | the newest WARNING-and-up log lines of the daemon (masked): ?limit=N |
| POST /api/streams/{stream}/test | {"expression": "happy"}: that emotion's command (or an expression at weight 1) sent to one avatar's (or camera's) outputs, neutral after 3 s |
| POST /api/cameras/{camera}/enabled | {"enabled": bool}: that camera's `enabled:` set in the file (comments kept), saved and reloaded as PUT /api/config |

With `server.token` set, every path but /healthz needs `Authorization: Bearer TOKEN` or `?token=TOKEN`. A browser
that opens / without it gets the token page (static/login.html, still a 401) instead of a JSON 401, which API clients
keep getting. That page keeps the token in the tab's sessionStorage and fetches the status page with the header; the
status page comes with its script and styles inlined (a <script src> cannot carry a header) and sends the token as
the Authorization header, or to /preview/ws as the WebSocket subprotocol `emotion-pipeline.token.<base64url>`, the
one header a browser lets a page set on a WebSocket: never in a URL, where history, proxies and screenshots keep it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import errno
import hmac
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web
from prometheus_client import CONTENT_TYPE_LATEST

from pipeline.service.status import check_health, status_document

if TYPE_CHECKING:
    from pipeline.config.app import ServerConfig
    from pipeline.outputs.history import EventHistory
    from pipeline.service.config_editor import ConfigEditor
    from pipeline.outputs.websocket import EventHub
    from pipeline.service.preview import PreviewStore
    from pipeline.service.snapshot import DaemonSnapshot

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
START_TIMEOUT_S = 10.0
SHUTDOWN_S = 0.5
PREVIEW_SEND_TIMEOUT_S = 5.0
NO_CACHE = {"Cache-Control": "no-store"}
UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="emotion-pipeline"', **NO_CACHE}
# The status page's WebSocket subprotocols (static/app.js): the one the server selects, and the token's prefix.
PREVIEW_PROTOCOL = "emotion-pipeline.preview"
TOKEN_PROTOCOL = "emotion-pipeline.token."
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ServerStartError(RuntimeError):
    """The server could not listen (port in use, address not on this machine, permission)."""


class StatusServer:
    """Serves what its collaborators give it; it never sees the daemon, only a snapshot of it per request.

    `snapshot` is called per request (on the pool, since it reads locks), `metrics` renders /metrics, `hub` is the
    /ws event hub (attached to this server's loop) and `previews` draws the annotated JPEGs.
    """

    def __init__(self, cfg: ServerConfig, snapshot: Callable[[], DaemonSnapshot], metrics: Callable[[], bytes],
                 hub: EventHub, previews: PreviewStore, editor: ConfigEditor | None = None,
                 trial: Callable[[str, str, float | None], dict[str, Any]] | None = None,
                 history: EventHistory | None = None) -> None:
        self.cfg = cfg
        self._history = history
        self._editor = editor
        self._trial = trial
        self._snapshot = snapshot
        self._render_metrics = metrics
        self._hub = hub
        self._previews = previews
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="status")
        self.port: int = cfg.port  # the bound port (differs from cfg.port when that is 0)

    # ------------------------------------------------------------------ lifetime (called from the main thread)

    def start(self) -> None:
        """Bind and serve; raises ServerStartError with one clear sentence when it cannot listen."""
        self._thread = threading.Thread(target=self._serve, name="status-server", daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise ServerStartError(f"status server did not start within {START_TIMEOUT_S:g} s")
        if self._error is not None:
            self._thread.join(1.0)
            raise ServerStartError(_bind_message(self.cfg.host, self.cfg.port, self._error))
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        log.info("status server on http://%s:%d/ (%s)", host, self.port,
                 "token required" if self.cfg.token else "no token")

    def update(self, cfg: ServerConfig) -> None:
        """Settings that apply without rebinding (token, preview_fps)."""
        self.cfg = cfg

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 1.5) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self._startup())
                self._loop = loop
                self._hub.attach(loop)
            except Exception as exc:  # noqa: BLE001 - reported by start() as one line
                self._error = exc
                loop.run_until_complete(self._cleanup())
                return
            finally:
                self._started.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
        finally:
            self._hub.detach(loop)
            loop.close()

    async def _startup(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/status", self._status)
        app.router.add_get("/ws", self._hub.handle)
        app.router.add_get("/", self._index)
        app.router.add_get("/preview/ws", self._preview_ws)
        app.router.add_get("/preview/{camera}.jpg", self._preview_jpeg)
        app.router.add_get("/api/config", self._config_text)
        app.router.add_post("/api/config/check", self._config_check)
        app.router.add_put("/api/config", self._config_save)
        app.router.add_post("/api/cameras/{camera}/enabled", self._camera_switch)
        app.router.add_post("/api/streams/{stream}/test", self._send_trial)
        app.router.add_get("/api/history", self._event_history)
        app.router.add_get("/api/logs", self._recent_logs)
        app.router.add_static("/static", STATIC_DIR, append_version=False)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, backlog=64)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._closing is not None:
            self._closing.set()
        await self._hub.close_all()
        await self._cleanup()

    async def _cleanup(self) -> None:
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._runner.cleanup(), SHUTDOWN_S * 3)

    # ------------------------------------------------------------------ handlers

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        token = self.cfg.token
        if token and request.path != "/healthz":
            given = _given_token(request)
            if not given or not hmac.compare_digest(given.encode(), token.encode()):
                if request.path == "/" and "text/html" in request.headers.get("Accept", ""):
                    page = (STATIC_DIR / "login.html").read_text(encoding="utf-8")
                    return web.Response(text=page, status=401, content_type="text/html", headers=UNAUTHORIZED)
                return web.json_response({"error": "unauthorized: send Authorization: Bearer TOKEN (or ?token=)"},
                                         status=401, headers=UNAUTHORIZED)
        return await handler(request)

    async def _in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _health(self) -> tuple[bool, dict[str, Any]]:
        snapshot = self._snapshot()
        report = check_health(snapshot)
        return report.ok, report.as_dict(snapshot.uptime_s)

    def _status_document(self) -> dict[str, Any]:
        return status_document(self._snapshot())

    def _camera_names(self) -> list[str]:
        return self._snapshot().camera_names

    async def _healthz(self, request: web.Request) -> web.Response:
        ok, body = await self._in_pool(self._health)
        return web.json_response(body, status=200 if ok else 503, headers=NO_CACHE)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await self._in_pool(self._render_metrics)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST, **NO_CACHE})

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(await self._in_pool(self._status_document), headers=NO_CACHE)

    async def _index(self, request: web.Request) -> web.Response:
        """The page, its script and styles inlined: the token page fetches it with the Authorization header, and a
        <script src> or <link href> in it could not send one."""
        return web.Response(text=status_page(), content_type="text/html", headers=NO_CACHE)

    def _no_editor(self) -> web.Response:
        return web.json_response({"error": "no configuration file: the daemon was started without one"},
                                 status=404, headers=NO_CACHE)

    async def _config_text(self, request: web.Request) -> web.Response:
        if self._editor is None:
            return self._no_editor()
        text = await self._in_pool(self._editor.read)
        reason = self._editor.read_only_reason()
        headers = {"X-Config-Path": str(self._editor.path), "X-Config-Writable": str(reason is None).lower()}
        if reason is not None:
            headers["X-Config-Read-Only-Reason"] = reason
        return web.Response(text=text, content_type="application/yaml", headers={**headers, **NO_CACHE})

    async def _config_check(self, request: web.Request) -> web.Response:
        from pipeline.service.config_editor import issue_json

        if self._editor is None:
            return self._no_editor()
        issues = await self._in_pool(self._editor.check, await request.text())
        return web.json_response({"errors": [issue_json(issue) for issue in issues]},
                                 status=422 if issues else 200, headers=NO_CACHE)

    async def _config_save(self, request: web.Request) -> web.Response:
        if self._editor is None:
            return self._no_editor()
        text = await request.text()  # the save waits for the reload: off the small pool status requests share
        result = await asyncio.get_running_loop().run_in_executor(None, self._editor.save, text)
        if result.status == 200:
            log.info("configuration saved from the status page (%s): %s", self._editor.path,
                     result.body["reload"].get("result"))
        return web.json_response(result.body, status=result.status, headers=NO_CACHE)

    async def _camera_switch(self, request: web.Request) -> web.Response:
        """The page's on/off switch of a camera: {"enabled": bool} written into the file like any edit, then applied."""
        if self._editor is None:
            return self._no_editor()
        try:
            wanted = (await request.json())["enabled"]
        except (ValueError, KeyError, TypeError):
            wanted = None
        if not isinstance(wanted, bool):
            return web.json_response({"error": 'send {"enabled": true} or {"enabled": false}'}, status=400,
                                     headers=NO_CACHE)
        camera = request.match_info["camera"]
        result = await asyncio.get_running_loop().run_in_executor(None, self._editor.set_camera_enabled, camera,
                                                                  wanted)
        if result.status == 200:
            log.info("camera %s %s from the status page", camera, "enabled" if wanted else "disabled")
        return web.json_response(result.body, status=result.status, headers=NO_CACHE)

    async def _event_history(self, request: web.Request) -> web.Response:
        """The newest commands, camera changes and reloads: ?types=command,camera,config &q=TEXT &limit=N."""
        types = [t for t in request.query.get("types", "").split(",") if t]
        limit = _limit(request.query.get("limit"), 100, 500)
        events = self._history.recent(types, request.query.get("q", ""), limit) if self._history else []
        return web.json_response({"events": events}, headers=NO_CACHE)

    async def _recent_logs(self, request: web.Request) -> web.Response:
        """The daemon's newest WARNING-and-up log lines (masked; a camera group's own lines stay in its process)."""
        from pipeline.service.logs import RECENT_LOGS

        return web.json_response({"lines": RECENT_LOGS.recent(_limit(request.query.get("limit"), 50, 200))},
                                 headers=NO_CACHE)

    async def _send_trial(self, request: web.Request) -> web.Response:
        """The page's "send test expression": {"expression": "happy"} (an emotion, or an expression name) to one
        avatar or camera stream; 200 with the command sent, 404 for an unknown stream or name."""
        from pipeline.service.trial import UnknownStream

        if self._trial is None:
            return web.json_response({"error": "no behaviour here"}, status=404, headers=NO_CACHE)
        try:
            body = await request.json()
            expression, weight = str(body["expression"]), body.get("weight")
            weight = None if weight is None else float(weight)
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'send {"expression": "happy"} (and optionally "weight": 0..1)'},
                                     status=400, headers=NO_CACHE)
        try:
            command = await self._in_pool(self._trial, request.match_info["stream"], expression, weight)
        except UnknownStream as exc:
            return web.json_response({"error": str(exc)}, status=404, headers=NO_CACHE)
        return web.json_response({"sent": command}, headers=NO_CACHE)

    async def _preview_jpeg(self, request: web.Request) -> web.Response:
        name = request.match_info["camera"]
        if name not in await self._in_pool(self._camera_names):
            return web.json_response({"error": f"no camera named {name!r}"}, status=404)
        if self._previews.fps <= 0:
            return web.json_response({"error": "previews are disabled (server.preview_fps: 0)"}, status=404)
        rendered = await self._in_pool(self._previews.jpeg, name)
        if rendered is None:
            return web.json_response({"error": f"camera {name} has no frame yet"}, status=503)
        return web.Response(body=rendered.jpeg, content_type="image/jpeg", headers=NO_CACHE)

    async def _preview_ws(self, request: web.Request) -> web.StreamResponse:
        """Annotated JPEGs of every camera (or `?cameras=a,b`), each at most preview_fps, skipping repeats.

        Selects PREVIEW_PROTOCOL when the page offers it (with its token): a browser drops a WebSocket whose
        server selects none of the subprotocols it offered."""
        if self._previews.fps <= 0:
            return web.json_response({"error": "previews are disabled (server.preview_fps: 0)"}, status=404)
        wanted = {c for c in request.query.get("cameras", "").split(",") if c}
        # compress=False: JPEGs do not deflate, and aiohttp sends a large compressed frame from a shielded task that
        # outlives our sender's cancellation at shutdown and then fails on the closed transport ("Task exception was
        # never retrieved" with a traceback in the daemon's log, seen with a browser, which offers permessage-deflate).
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=4096, protocols=(PREVIEW_PROTOCOL,), compress=False)
        await ws.prepare(request)
        sender = asyncio.get_running_loop().create_task(self._send_previews(ws, wanted))
        try:
            async for message in ws:
                if message.type == WSMsgType.ERROR:
                    break
        finally:
            sender.cancel()
        return ws

    async def _send_previews(self, ws: web.WebSocketResponse, wanted: set[str]) -> None:
        previews, closing = self._previews, self._closing
        if closing is None:  # the server is not running (start() sets it)
            return
        shown: dict[str, tuple[int, int]] = {}
        try:
            while not ws.closed and not closing.is_set() and previews.fps > 0:
                for name in await self._in_pool(self._camera_names):
                    if wanted and name not in wanted:
                        continue
                    rendered = await self._in_pool(previews.jpeg, name)
                    if rendered is None or shown.get(name) == rendered.key:
                        continue
                    await asyncio.wait_for(ws.send_bytes(name.encode() + b"\n" + rendered.jpeg),
                                           PREVIEW_SEND_TIMEOUT_S)
                    shown[name] = rendered.key
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(closing.wait(), 1.0 / max(previews.fps, 0.1))
        except (asyncio.CancelledError, ConnectionError):
            pass
        except asyncio.TimeoutError:
            log.info("preview client too slow, disconnected")
            await ws.close(code=1013, message=b"too slow")
        except Exception as exc:  # noqa: BLE001 - a broken viewer is that viewer's problem only
            log.debug("preview client: %s", exc)
        finally:
            if closing.is_set() and not ws.closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ws.close(code=1001, message=b"server shutting down"), SHUTDOWN_S)


def _limit(text: str | None, default: int, most: int) -> int:
    try:
        return max(1, min(most, int(text))) if text else default
    except ValueError:
        return default


def _given_token(request: web.Request) -> str:
    """The token a request carries: `Authorization: Bearer`, else the status page's WebSocket subprotocol, else
    `?token=` (scripts and old links); "" when none."""
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    for offered in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        offered = offered.strip()
        if offered.startswith(TOKEN_PROTOCOL):
            encoded = offered[len(TOKEN_PROTOCOL):]
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (binascii.Error, UnicodeDecodeError):
                return ""
    return request.query.get("token", "")


def status_page() -> str:
    """static/index.html with static/style.css and static/app.js inlined (read per request, like the files)."""
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    style = (STATIC_DIR / "style.css").read_text(encoding="utf-8")
    script = (STATIC_DIR / "app.js").read_text(encoding="utf-8").replace("</", "<\\/")  # cannot end the element
    return page.replace("__STYLE__", style).replace("__SCRIPT__", script)


def _bind_message(host: str, port: int, exc: BaseException) -> str:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    code = getattr(exc, "errno", None)
    if code == errno.EADDRINUSE:
        return (f"status server cannot listen on {where}: address already in use "
                "(another instance running? change server.port)")
    if code == errno.EADDRNOTAVAIL:
        return f"status server cannot listen on {where}: no such address on this machine (check server.host)"
    if code == errno.EACCES:
        return f"status server cannot listen on {where}: permission denied (ports below 1024 need privileges)"
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"status server cannot listen on {where}: {reason}"
