"""Masking of credentials in camera URLs, so they never reach logs, events, status pages or error messages."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<password>[^/\s]*)@")


def mask_secrets(text: str) -> str:
    """Replace the password of every `scheme://user:password@host` in `text` with `***`."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:***@", text)
