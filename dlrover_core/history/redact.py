"""Keep credentials out of log lines, argv, reports and model cards."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^/@:\s]*):(?P<pw>[^/@\s]*)@"
)


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``postgresql://u:***@host/db``).

    Anything that is not a URL with a password comes back unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact_text(text: str) -> str:
    """Every ``scheme://user:password@`` inside ``text`` with the password hidden."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
