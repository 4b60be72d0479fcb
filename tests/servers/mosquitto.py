"""A real mosquitto broker for tests (Debian's `mosquitto`, installed by .ci/run), started from a config file.

Loopback listener on a given port, `persistence true` with its database in a directory of its own, so that a broker
stopped with SIGTERM (it saves then) and started again on the same port and directory has the clients' sessions and
queued messages back: a real broker restart.

Running as root, mosquitto drops privileges to the `mosquitto` user after reading its config. Rather than `user
root` (a test that passes only because the broker runs as root), the persistence directory is made under /tmp (whose
sticky, world-searchable permissions let that user reach it, unlike pytest's 0700 tmp_path root) and given to
`mosquitto`, as a packaged broker's /var/lib/mosquitto is.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.running_daemon import wait_until

log = logging.getLogger(__name__)

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


def mosquitto_missing() -> bool:
    return not os.access(MOSQUITTO, os.X_OK)


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Mosquitto:
    """One broker configuration (port, persistence, optional password file) that can be started and stopped."""

    def __init__(self, port: int, users: dict[str, str] | None = None) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="mosquitto-test-"))
        self.dir.chmod(0o755)
        self.log_path = self.dir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None
        lines = [f"listener {port} 127.0.0.1", "persistence true", f"persistence_location {self.dir}/",
                 "autosave_interval 1", f"log_dest file {self.log_path}", "log_type all",
                 "max_queued_messages 100000", "connection_messages true"]
        if users:
            lines += [f"password_file {self._password_file(users)}", "allow_anonymous false"]
        else:
            lines.append("allow_anonymous true")
        self.config = self.dir / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")
        if os.geteuid() == 0:
            entry = pwd.getpwnam("mosquitto")
            for path in [self.dir, *self.dir.iterdir()]:
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def _password_file(self, users: dict[str, str]) -> Path:
        path = self.dir / "passwords"
        for user, password in users.items():
            subprocess.run([MOSQUITTO_PASSWD, "-b", *([] if path.exists() else ["-c"]), str(path), user, password],
                           check=True, capture_output=True)
        path.chmod(0o600)
        return path

    def start(self, timeout: float = 20.0) -> Mosquitto:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        if not wait_until(lambda: _port_open(self.port) or self.proc.poll() is not None, timeout) \
                or self.proc.poll() is not None:
            raise RuntimeError(f"mosquitto did not start on port {self.port}: {self.log_text()[-2000:]}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the broker saves its persistence database), then wait for the port to be free again."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)
        self.proc = None
        wait_until(lambda: not _port_open(self.port), timeout)

    def log_text(self) -> str:
        stderr = b""
        if self.proc is not None and self.proc.poll() is not None and self.proc.stderr is not None:
            stderr = self.proc.stderr.read()
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text + stderr.decode(errors="replace")

    def __enter__(self) -> Mosquitto:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
