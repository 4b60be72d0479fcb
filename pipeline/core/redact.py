"""Credentials in URLs: the one rule that finds them, so that what is masked for display is exactly what is sent.

Operators paste camera passwords as they are, and camera UIs allow `/`, `@`, `#`, `:` and `?` in them, which plain
URL syntax does not (`rtsp://admin:p@ss/w:rd#1@host/x` would make FFmpeg connect to host `ss`). The rule here:

- the user name runs from `//` to the first `:`; the password from there to the LAST `@` that comes before the
  query string and is followed by a host (a name or address, an optional `:port`, then `/`, `?`, `#` or the end);
- a URL where that finds nothing, but the same search past a `?` would, has a password containing `?`
  (`split_userinfo(url, include_query=True)` says so; the config refuses it, masking still hides all of it);
- `%` followed by two hex digits is percent-encoding already; anything else is the character itself.

`mask_secrets` replaces every such password with `***`, and the value of every secret-looking parameter (`pwd=`,
`api_key=`, `token=` …, in the query or in a path of `name=value&…` pairs as some DVRs use) too, for every URL in a
text. `url_for_opening` builds the URL handed to FFmpeg or NVDEC, with user and password percent-encoded.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import quote

MASK = "***"

_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
# A URL in free text: a scheme, then up to the next whitespace or the next URL (compact text may join two).
_URL = re.compile(rf"(?P<scheme>{_SCHEME})(?P<rest>(?:(?!{_SCHEME})\S)*)")
# What follows the userinfo's '@': a host (empty in a broken URL, still masked whole) and an optional port, ended by
# the path, query, fragment, the end, or anything a host cannot contain; not by '&', '=' or '+', so that
# `?mail=a@b.com&pwd=…` is not taken for a userinfo.
_HOST_AFTER = re.compile(r"(?:\[[0-9A-Za-z:.%]*\]|[A-Za-z0-9._~%-]*)(?::\d*)?(?=$|[^A-Za-z0-9._~%:@&=+-])")
# Names of parameters whose value is a secret (case-insensitive, searched within the name).
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|cred|auth|signature|session|key$|^sig$|^pw$|^sid$",
                          re.IGNORECASE)
# `name=value` after `?`, `&`, `;` or `/`: the value runs to the next `&` or whitespace.
_PARAM = re.compile(r"(?P<lead>[/?&;])(?P<name>[^=&/?#;\s]+)=(?P<value>[^&\s]*)")
_ENCODED = re.compile(r"(%[0-9A-Fa-f]{2})")


class Userinfo(NamedTuple):
    """A URL split by the rule above: `prefix` is `scheme://`, `rest` what follows the userinfo's `@`."""

    prefix: str
    user: str
    password: str | None
    rest: str


def _userinfo_end(rest: str, include_query: bool) -> int:
    """Index of the `@` that ends the userinfo in `rest` (the URL after `scheme://`), or -1 when there is none."""
    query = rest.find("?")
    stop = len(rest) if include_query or query < 0 else query
    at = rest.rfind("@", 0, stop)
    while at >= 0:
        user = rest[:at].split(":", 1)[0]
        if not any(c in user for c in "/?#") and _HOST_AFTER.match(rest, at + 1):
            return at
        at = rest.rfind("@", 0, at)
    return -1


def split_userinfo(url: str, include_query: bool = False) -> Userinfo | None:
    """User, password and the rest of `url` by the rule of this module; None when it has no `user[:password]@`.

    include_query: also look for the `@` past the first `?` (how a password containing `?` is recognised)."""
    match = re.match(_SCHEME, url)
    if match is None:
        return None
    rest = url[match.end():]
    at = _userinfo_end(rest, include_query)
    if at < 0:
        return None
    user, colon, password = rest[:at].partition(":")
    return Userinfo(match.group(), user, password if colon else None, rest[at + 1:])


def _encode(text: str) -> str:
    """Percent-encode every character but letters, digits and `-._~`, leaving `%XX` escapes as they are."""
    return "".join(part if _ENCODED.fullmatch(part) else quote(part, safe="") for part in _ENCODED.split(text))


def url_for_opening(url: str) -> str:
    """The URL as FFmpeg (and PyNvVideoCodec's demuxer) must receive it: scheme in lower case, user and password
    percent-encoded, so that `/ @ # : ?` in a password stay in the password (FFmpeg decodes them for the login)."""
    parts = split_userinfo(url)
    if parts is None:
        match = re.match(_SCHEME, url)
        return url if match is None else match.group().lower() + url[match.end():]
    password = "" if parts.password is None else ":" + _encode(parts.password)
    return f"{parts.prefix.lower()}{_encode(parts.user)}{password}@{parts.rest}"


def _mask_params(text: str) -> str:
    """Mask the value of every secret-looking `name=value` parameter in `text`."""

    def mask(m: re.Match[str]) -> str:
        if not _SECRET_NAME.search(m.group("name")) or not m.group("value"):
            return m.group()
        return f"{m.group('lead')}{m.group('name')}={MASK}"

    return _PARAM.sub(mask, text)


def _mask_url(m: re.Match[str]) -> str:
    """One URL of a text, masked; a password with `?` in it is found too (masking errs on hiding more)."""
    rest = m.group("rest")
    at = _userinfo_end(rest, include_query=False)
    if at < 0:
        at = _userinfo_end(rest, include_query=True)
    head = ""
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        head = f"{user}:{MASK}@" if colon else f"{user}@"
        rest = rest[at + 1:]
    return m.group("scheme") + head + _mask_params(rest)


def mask_secrets(text: str) -> str:
    """`text` with the password of every URL in it, and every secret-looking URL parameter, replaced by `***`."""
    if "://" not in text:
        return text
    return _URL.sub(_mask_url, text)
