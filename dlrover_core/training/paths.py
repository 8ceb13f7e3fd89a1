"""Where training data lives: a local path or an fsspec URL, resolved to (filesystem, path).

Used by the readers (:mod:`.data`) and the input pins (:mod:`.pin`); imports fsspec only when
a path is resolved."""

from __future__ import annotations

import os
from typing import Any

from dlrover_core.errors import InputError
from dlrover_core.history.redact import redact_url


def is_local(fs: Any) -> bool:
    """Whether an fsspec filesystem is the local one."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def is_url(path: str) -> bool:
    """True for an fsspec URL (``s3://b/k``, ``memory://x``); False for a local path or
    ``file://``."""
    head, sep, _ = str(path).partition("://")
    return bool(sep) and head not in ("", "file", "local")


def resolve_path(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """``(filesystem, path inside it)`` for a local path (``~`` expanded) or an fsspec URL.

    An unknown protocol, or one whose package is not installed, is one clear line."""
    import fsspec
    from fsspec.core import url_to_fs

    text = str(path)
    if not is_url(text):
        text = os.path.expanduser(text.removeprefix("file://"))
        return fsspec.filesystem("file"), os.path.abspath(text)
    try:
        fs, inner = url_to_fs(text)
    except (ValueError, ImportError) as e:
        raise InputError(
            f"data.path {redact_url(text)!r}: cannot open this URL ({e}); use a local path, or "
            "install the fsspec backend for its protocol (e.g. s3fs for s3://, gcsfs for gs://)"
        ) from None
    return fs, str(inner)
