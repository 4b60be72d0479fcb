"""systemd's notify protocol (sd_notify), written from its documentation: one datagram of `KEY=VALUE` lines.

`$NOTIFY_SOCKET` names an AF_UNIX datagram socket: a filesystem path, or an abstract socket written `@name`
(sent as a leading NUL byte). Without the variable (not started by systemd) every call is a no-op, so the daemon
runs the same way from a terminal. `$WATCHDOG_USEC` (and `$WATCHDOG_PID`, when set, must be our pid) asks for a
`WATCHDOG=1` at least that often; we send one at half the interval, as sd_watchdog_enabled(3) recommends.

Reference: sd_notify(3), https://www.freedesktop.org/software/systemd/man/latest/sd_notify.html
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)

MAX_STATUS_CHARS = 200


def _address(value: str) -> str | bytes | None:
    if value.startswith("@"):
        return b"\0" + value[1:].encode()  # abstract namespace (Linux)
    if value.startswith("/"):
        return value
    return None  # e.g. vsock: addresses, which only VMs hand out; not ours to support


class Notifier:
    """Sends state changes to the service manager; silent when there is none. Thread-safe (one sendto each)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        if env.get("NOTIFY_SOCKET") and self._address is None:
            log.warning("NOTIFY_SOCKET %r is not a path or @abstract socket; not notifying systemd",
                        env["NOTIFY_SOCKET"])
        self._socket: socket.socket | None = None
        if self._address is not None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_interval_s = _watchdog_interval(env)
        self._failed_once = False

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def send(self, **fields: object) -> bool:
        """Send one datagram of KEY=VALUE lines; False when there is no manager or it could not be reached."""
        if self._socket is None or self._address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            self._socket.sendto(payload, self._address)
        except OSError as exc:
            if not self._failed_once:  # say it once; the journal must not fill with the same line
                log.warning("cannot notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET", "?"), exc)
                self._failed_once = True
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send(READY=1, **({"STATUS": _one_line(status)} if status else {}))

    def status(self, text: str) -> bool:
        return self.send(STATUS=_one_line(text))

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def reloading(self) -> bool:
        # systemd wants the monotonic time with RELOADING=1 (Type=notify-reload); harmless for Type=notify.
        return self.send(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self) -> bool:
        return self.send(STOPPING=1)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of $WATCHDOG_USEC in seconds, or None when no watchdog is asked of this process."""
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid.strip() != str(os.getpid())):
        return None
    return usec / 2 / 1e6


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_STATUS_CHARS else line[: MAX_STATUS_CHARS - 1] + "…"
