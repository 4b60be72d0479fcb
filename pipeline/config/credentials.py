"""systemd credentials (LoadCredential=) as environment variables, so the YAML's `${VAR}` can use them.

systemd puts each credential in a file under `$CREDENTIALS_DIRECTORY`, readable only by the service. A file named like
an environment variable (`CAM_PASS`) becomes that variable; one loaded from a directory with
`LoadCredential=env:/etc/emotion-pipeline/credentials` arrives as `env_CAM_PASS` and becomes `CAM_PASS` too.
A variable the environment already sets wins. One trailing newline is stripped (what `echo secret > file` adds).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import MutableMapping
from pathlib import Path

log = logging.getLogger(__name__)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PREFIX = "env_"
MAX_BYTES = 64 * 1024


def export_credentials(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Copy credentials into `environ` (default os.environ); the names exported (never the values)."""
    environ = os.environ if environ is None else environ
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory or not Path(directory).is_dir():
        return []
    exported = []
    for path in sorted(Path(directory).iterdir()):
        name = path.name[len(PREFIX):] if path.name.startswith(PREFIX) else path.name
        if not _ENV_NAME.match(name) or name in environ or not path.is_file():
            continue
        try:
            data = path.read_bytes()[:MAX_BYTES].decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("credential %s cannot be read: %s", path.name, type(exc).__name__)
            continue
        environ[name] = data[:-1] if data.endswith("\n") else data
        exported.append(name)
    return exported
