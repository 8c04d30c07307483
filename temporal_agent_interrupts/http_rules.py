"""The rules both HTTP servers of the product keep: the codec server and the web app
(``client/web.py``), both served by :mod:`temporal_agent_interrupts.http_server`. Which ``Host``
they answer to (DNS rebinding), and which browser origins they may give CORS headers to.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
"""The names a loopback server answers to in ``Host``, with its port."""

HOST = re.compile(r"(?P<name>\[[0-9a-f:.]+\]|[a-z0-9._~!$&'()*+,;=%-]+)(?::[0-9]*)?")
"""RFC 3986's host (an IP literal in brackets, or a reg-name: no ":", "@", "/" or space) and an
optional port, as RFC 9110 spells a ``Host``: ``uri-host [":" port]`` and nothing looser, so
``localhost:8081:1`` or ``a@localhost:8081`` names no host of ours. Match it lower-cased."""


def host_allowed(value: str | None, hosts: frozenset[str]) -> bool:
    """Whether a ``Host`` value names one of ``hosts`` (lower-case: ``name:port`` exactly, or
    a name given without a port, with any port or none). Read as :data:`HOST` spells one, and
    nothing looser."""
    # Not str.strip(): "\xa0" is no part of a Host (h11 has trimmed spaces and tabs).
    found = HOST.fullmatch((value or "").strip(" \t").lower())
    if found is None:
        return False
    return found[0] in hosts or found["name"] in hosts


ORIGIN = re.compile(
    r"[a-z][a-z0-9+.-]*://([a-z0-9.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?", re.IGNORECASE
)
"""One site's origin as a browser sends it: a scheme (http, https, an extension's or an app
shell's own), a host, a port, nothing else."""


def origin(value: str) -> str:
    """An ``Origin`` value (or a configured one) as compared: spaces and tabs and a trailing
    slash trimmed. Not ``str.strip()``: a parser may let bytes 0x80-0xff through in a header,
    and ``strip()`` would take ``"\\xa0"`` for whitespace."""
    return value.strip(" \t").rstrip("/")


def site_origins(values: Iterable[str], *, what: str) -> frozenset[str]:
    """The configured CORS origins, each checked to be one site's origin.

    Raises:
        ValueError: one is not (``null``, ``*``, a path): "null" above all, the origin of every
            sandboxed frame and ``file:`` page on any site, so allowing it would let them all
            act here; a wildcard or a path would never match, silently.
    """
    found = []
    for value in values:
        given = origin(value)
        if not ORIGIN.fullmatch(given):
            raise ValueError(
                f"{what}: {value[:100]!r} is not one site's origin (scheme://host[:port], no "
                "path, no wildcard, not 'null')"
            )
        found.append(given)
    return frozenset(found)


def cors_headers(
    sent: list[str],
    allowed: frozenset[str],
    *,
    methods: str,
    headers: str,
    credentials: bool = False,
) -> list[tuple[str, str]]:
    """The CORS headers for a request that sent the ``Origin`` values ``sent``: none unless it
    sent exactly one, and that one is ``allowed`` (as :func:`origin` compares them). The
    origin goes back as configured, not as sent: only what was checked goes back."""
    if len(sent) != 1 or (found := origin(sent[0])) not in allowed:
        return []
    return [
        ("Access-Control-Allow-Origin", found),
        ("Access-Control-Allow-Methods", methods),
        ("Access-Control-Allow-Headers", headers),
        *([("Access-Control-Allow-Credentials", "true")] if credentials else []),
        ("Access-Control-Max-Age", "600"),
        ("Vary", "Origin"),
    ]
