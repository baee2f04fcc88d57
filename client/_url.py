"""The collector URL a client and ``logitwatch push`` are given: checked once, up front.

The rule (also in README, *Use it in your training job*):

* The URL is the collector's base, ``http(s)://host[:port][/prefix]``; the client adds
  ``/api/v1/ingest``.
* Two slips are corrected, with one warning each: a URL without a scheme
  (``127.0.0.1:8000`` becomes ``http://127.0.0.1:8000``) and a URL that already ends in the
  API path (``.../api/v1`` or ``.../api/v1/ingest``, which is cut off).
* A URL that cannot name a collector (not a string, another scheme, no host, a port that is
  not a number, spaces, a query or fragment) is a :class:`ValueError` at construction, so
  ``logitwatch.attach`` fails before training starts, never during it. A well-formed URL
  where no collector answers is not an error: frames wait in the spool for it.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit

__all__ = ["normalize_url"]

log = logging.getLogger("logitwatch.client")

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_API_SUFFIX = re.compile(r"/api/v1(/ingest)?/*$")


def normalize_url(url: object, *, warn: bool = True) -> str:
    """The collector base URL for ``url``: checked, the two slips of the module docstring
    corrected (with a warning on the ``logitwatch.client`` logger when ``warn``), without a
    trailing slash.

    Raises:
        ValueError: ``url`` cannot be a collector's URL; the message says what to pass.
    """
    example = "e.g. url='http://127.0.0.1:8000'"
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"collector url must be a non-empty string ({example}), got {url!r}")
    given = url
    url = url.strip()
    if any(c.isspace() for c in url):
        raise ValueError(f"collector url {given!r} contains spaces ({example})")
    fixes: list[str] = []
    if not _SCHEME.match(url):
        url = "http://" + url
        fixes.append("added the scheme http://")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"collector url {given!r}: the scheme must be http or https ({example})")
    if not parts.hostname:
        raise ValueError(f"collector url {given!r} names no host ({example})")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError(f"collector url {given!r}: the port is not a number between 0 and "
                         f"65535 ({example})") from None
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError(f"collector url {given!r}: a collector's base URL has no query or "
                         f"fragment ({example})")
    path = parts.path
    if _API_SUFFIX.search(path):
        path = _API_SUFFIX.sub("", path)
        fixes.append("removed the API path (the client adds /api/v1/ingest)")
    base = f"{parts.scheme}://{parts.netloc}{path}".rstrip("/")
    if fixes and warn:
        log.warning("logitwatch: collector url %r taken as %r (%s); pass the collector's base "
                    "URL to silence this", given, base, "; ".join(fixes))
    return base
