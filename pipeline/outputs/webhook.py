"""Events POSTed as JSON to an HTTP(S) endpoint, one request per event, in order.

Why aiohttp (one `ClientSession` on an event loop owned by the sink's thread) rather than `urllib.request`: the session
keeps the connection alive between events, so a receiver behind HTTPS costs one TLS handshake per connection rather
than one per event, which keeps a busy camera's commands (or observations, if configured) flowing at a few ms each;
`ClientTimeout(total=timeout_s)` bounds the whole request, connect and body included, which urllib's per-socket-
operation timeout does not. The loop runs only inside this sink's thread, one request at a time, so events arrive in
the order they were decided and nothing here touches any other loop (the status server has its own).

Delivery: a 2xx answer is success. A connection error, a timeout or a 5xx answer is retried up to `retries` times,
waiting `backoff_s`, then twice that, and so on; a 4xx (or a 3xx: redirects are not followed) is the receiver
refusing this event and is not retried. An event that still failed is counted in `failed` and logged as one line
without the token or URL credentials (that line is also the output's `last_error` in /api/status, and failures in a
row make the output a /healthz problem: see outputs.base.Delivery); events arriving while the queue is full are
counted in `dropped` (base class).
At shutdown, pending retries are cut short: each queued event gets one attempt.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from pydantic import Field, ValidationInfo, field_validator

from pipeline.core.redact import mask_secrets
from pipeline.core.registry import Plugin
from pipeline.outputs.base import EventName, OutputSettings, Sink
from pipeline.outputs.events import Event

USER_AGENT = "emotion-pipeline-webhook/1"


class WebhookError(RuntimeError):
    """A webhook event given up on; the message is safe to log (no token, no URL password)."""


class WebhookOutput(OutputSettings):
    """Events POSTed as JSON to an HTTP endpoint."""

    type: Literal["webhook"] = Field("webhook", description="Output kind.")
    url: str = Field(description="Endpoint receiving a POST per event; http:// or https://.")
    timeout_s: float = Field(2.0, gt=0, le=60, description="Timeout of one request, in seconds.")
    retries: int = Field(2, ge=0, le=10, description="Retries of a request that failed to connect, timed out "
                                                     "or got a 5xx answer, before the event is dropped (and "
                                                     "counted as failed); a 4xx answer is never retried.")
    backoff_s: float = Field(0.5, gt=0, le=60, description="Wait before the first retry, in seconds; doubles "
                                                           "before each further retry.")
    bearer_token: str | None = Field(None, description="Sent as `Authorization: Bearer TOKEN` when set; never "
                                                       "logged. Use ${VAR} to keep it out of the file.")
    events: list[EventName] = Field(default_factory=lambda: list[EventName](["command"]), min_length=1,
                                    description="Event types posted (default: commands only).")
    queue_size: int = Field(256, ge=1, le=100_000, description="Events buffered before new ones are dropped "
                                                               "(and counted).")

    def describe(self) -> str:
        return f"webhook {mask_secrets(self.url)} [{', '.join(self.events)}]"

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        """Only HTTP(S) can be posted to; a bare host is a common slip."""
        if not value.lower().startswith(("http://", "https://")) or not urlsplit(value).hostname:
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:9000/emotion")
        return value

    @field_validator("bearer_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: object) -> object:
        """`${HOOK_TOKEN:-}` with the variable unset means no token."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("bearer_token")
    @classmethod
    def _one_kind_of_auth(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A request carries one Authorization header: basic (user:password@ in the URL) or bearer, not both."""
        url = info.data.get("url")
        if value is not None and isinstance(url, str) and urlsplit(url).password is not None:
            raise ValueError("the url already has credentials (user:password@, sent as basic auth): use either "
                             "them or bearer_token, not both")
        return value


class WebhookSink(Sink):
    type_name = "webhook"

    def __init__(self, cfg: Any, queue_size: int | None = None) -> None:
        super().__init__(cfg, cfg.queue_size if queue_size is None else queue_size)
        self.attempts = 0  # requests made, first tries and retries
        self.retried = 0
        self._closing = threading.Event()
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None

    def write(self, event: Event) -> None:
        if self._event_loop is None:
            self._event_loop = asyncio.new_event_loop()
        body = json.dumps(event, separators=(",", ":")).encode()
        self._event_loop.run_until_complete(self._deliver(body))

    async def _deliver(self, body: bytes) -> None:
        retry = 0
        while True:
            retryable, problem = await self._post(body)
            if problem is None:
                return
            if not retryable or retry >= self.cfg.retries or self._closing.is_set():
                tries = f" (after {retry + 1} attempts)" if retry else ""
                raise WebhookError(f"POST {self.display_url} failed: {self._safe(problem)}{tries}")
            await self._sleep(self.cfg.backoff_s * 2**retry)
            retry += 1
            self.retried += 1

    async def _post(self, body: bytes) -> tuple[bool, str | None]:
        """One request: (False, None) on success, else (whether to retry, what went wrong)."""
        self.attempts += 1
        try:
            async with self._client().post(self.cfg.url, data=body, allow_redirects=False) as response:
                await response.read()  # drain, so the connection goes back to the pool
                if 200 <= response.status < 300:
                    return False, None
                return response.status >= 500, f"HTTP {response.status} {response.reason or ''}".rstrip()
        except asyncio.TimeoutError:
            return True, f"no answer within {self.cfg.timeout_s:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            return True, f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # aiohttp's own refusal of the request (e.g. an unusable URL): retrying cannot help
            return False, f"{type(exc).__name__}: {exc}"

    def _client(self) -> aiohttp.ClientSession:
        """The session, created on first use inside the sink's loop (aiohttp binds it to the running loop)."""
        if self._session is None:
            headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
            if self.cfg.bearer_token:
                headers["Authorization"] = f"Bearer {self.cfg.bearer_token}"
            self._session = aiohttp.ClientSession(headers=headers,
                                                  timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s))
        return self._session

    async def _sleep(self, seconds: float) -> None:
        """Back off, but wake up at once when the sink is closing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self._closing.is_set() and loop.time() < deadline:
            await asyncio.sleep(min(0.05, deadline - loop.time()))

    @property
    def display_url(self) -> str:
        """The URL as logs may show it: password masked, query string (often a key) left out."""
        parts = urlsplit(self.cfg.url)
        return mask_secrets(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")))

    def _safe(self, text: str) -> str:
        text = mask_secrets(text.replace(self.cfg.url, self.display_url))
        if self.cfg.bearer_token:
            text = text.replace(self.cfg.bearer_token, "***")
        return text

    def flush_close(self) -> None:
        if self._event_loop is None:
            return
        if self._session is not None:
            self._event_loop.run_until_complete(self._session.close())
            self._session = None
        self._event_loop.close()
        self._event_loop = None

    def close(self, timeout: float = 2.0) -> None:
        """Cut backoff waits short, deliver what is queued (one attempt each), then stop."""
        self._closing.set()
        super().close(timeout)


PLUGIN = Plugin("webhook", WebhookOutput, WebhookSink)
