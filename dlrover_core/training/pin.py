"""Inputs pinned: a file the job trains on must not change while it trains.

When a job starts, every input file (a Criteo TSV, each Parquet file of a folder; local or an
fsspec URL) is fingerprinted: its size, its modification time or object version (``mtime``,
``LastModified``, ``ETag``, ``generation``, whichever the filesystem reports) and a SHA-256 of
its first and last MiB. The pins go to ``RUN/data_pin.json``; every process of the job that
reads the data (workers, ranks, the master's evaluation) loads them through
``$DLROVER_RM_DATA_PIN`` and checks the file's size and version before each read (a stat,
at most every :data:`CHECK_EVERY_S`), the master on every tick, and a resumed job the whole
fingerprint. A change fails the job at once, naming the file and what changed, instead of
training on a mix of two files and publishing the result. ``data.snapshot: true`` copies the
inputs into the run directory at the start and trains on the copy instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dlrover_core.errors import DLRoverError, ErrorKind
from dlrover_core.training.paths import resolve_path

PIN_ENV = "DLROVER_RM_DATA_PIN"
PIN_FILE = "data_pin.json"
SNAPSHOT_DIR = "data-snapshot"
CHECK_EVERY_S = 0.5
EDGE_BYTES = 1 << 20
_VERSION_KEYS = ("generation", "ETag", "etag", "version_id", "VersionId", "md5Hash")
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "modified")


class InputChangedError(DLRoverError):
    """An input file changed while the job read it; ``changes``: which, and how."""

    kind = ErrorKind.CONFLICT

    def __init__(self, changes: list[dict[str, str]]) -> None:
        self.changes = changes
        super().__init__(message(changes))


@dataclass(frozen=True)
class FilePin:
    url: str  # as the filesystem names it (with its protocol for a URL)
    show: str  # for messages (credentials hidden)
    size: int
    mtime: str | None
    version: str | None
    edges_sha256: str


def _info(fs: Any, path: str) -> tuple[int, str | None, str | None]:
    info = fs.info(path)
    size = int(info.get("size") or 0)
    mtime = next((str(info[k]) for k in _MTIME_KEYS if info.get(k) is not None), None)
    version = next((str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None), None)
    return size, mtime, version


def _edges(fs: Any, path: str, size: int) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        h.update(f.read(EDGE_BYTES))
        if size > 2 * EDGE_BYTES:
            f.seek(size - EDGE_BYTES)
            h.update(f.read(EDGE_BYTES))
        elif size > EDGE_BYTES:
            h.update(f.read())
    return h.hexdigest()


def _fs(url: str) -> tuple[Any, str]:
    fs, path = resolve_path(url)
    return fs, str(path)


def pin_file(url: str, show: str) -> FilePin:
    fs, path = _fs(url)
    size, mtime, version = _info(fs, path)
    return FilePin(url, show, size, mtime, version, _edges(fs, path, size))


def input_files(source: Any) -> list[tuple[str, str]]:
    """``(url, shown name)`` of every file a data source reads (none for generated data)."""
    from dlrover_core.history.redact import redact_url

    paths = getattr(source, "_paths", None)
    if paths is None and hasattr(source, "_fpath"):
        paths = [source._fpath]
    if not paths:
        return []
    url = str(getattr(source, "url", ""))
    proto = url.split("://")[0] + "://" if "://" in url and not url.startswith("file://") else ""
    out = []
    for p in paths:
        full = p if "://" in str(p) or not proto else f"{proto}{p}"
        out.append((str(full), redact_url(str(full))))
    return out


def what_changed(pin: FilePin, *, deep: bool = False) -> str | None:
    """How ``pin``'s file differs from when it was pinned (None: it does not). ``deep`` also
    compares the content of its first and last MiB."""
    try:
        fs, path = _fs(pin.url)
        size, mtime, version = _info(fs, path)
    except FileNotFoundError:
        return "it was deleted"
    except OSError as e:
        return f"it cannot be read ({type(e).__name__}: {e})"
    if size != pin.size:
        verb = "truncated" if size < pin.size else "grown"
        return f"{verb}: {pin.size:,} -> {size:,} bytes"
    if version is not None and pin.version is not None and version != pin.version:
        return f"rewritten: version {pin.version} -> {version}"
    if mtime != pin.mtime:
        return f"rewritten: modified at {mtime} (was {pin.mtime})"
    if deep and _edges(fs, path, size) != pin.edges_sha256:
        return "rewritten: same size and time, other content"
    return None


class Pins:
    """The pinned inputs of one job; :meth:`check` raises on a change."""

    def __init__(self, pins: list[FilePin]) -> None:
        self.pins = pins
        self._next = 0.0

    @classmethod
    def of(cls, source: Any) -> Pins:
        return cls([pin_file(u, s) for u, s in input_files(source)])

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps([asdict(p) for p in self.pins], indent=1) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Pins:
        return cls([FilePin(**d) for d in json.loads(Path(path).read_text(encoding="utf-8"))])

    def changes(self, *, deep: bool = False) -> list[dict[str, str]]:
        out = []
        for p in self.pins:
            why = what_changed(p, deep=deep)
            if why is not None:
                out.append({"file": p.show, "change": why})
        return out

    def check(self, *, deep: bool = False, force: bool = False) -> None:
        """Raise :class:`InputChangedError` naming the first changed file (a stat at most
        every :data:`CHECK_EVERY_S` unless ``force`` or ``deep``)."""
        now = time.monotonic()
        if not (force or deep) and now < self._next:
            return
        self._next = now + CHECK_EVERY_S
        ch = self.changes(deep=deep)
        if ch:
            raise InputChangedError(ch)

    def covers(self, source: Any) -> bool:
        return {u for u, _ in input_files(source)} <= {p.url for p in self.pins}


def message(changes: list[dict[str, str]]) -> str:
    c = changes[0]
    more = f" (and {len(changes) - 1} other file(s))" if len(changes) > 1 else ""
    return (
        f"input {c['file']} changed since the job started: {c['change']}{more}; the job "
        "stopped rather than train on a mix of two files. Restore the file and resume, train "
        "in a new run directory, or set data.snapshot: true to train on a copy taken at the start"
    )


def attach(source: Any) -> Any:
    """Give a data source the job's pins (``$DLROVER_RM_DATA_PIN``), when they cover its files."""
    p = os.environ.get(PIN_ENV)
    if not p or not os.path.exists(p) or not input_files(source):
        return source
    pins = Pins.load(p)
    if pins.covers(source):
        source.pins = pins
    return source


def snapshot(url: str, dest: Path) -> str:
    """Copy the input at ``url`` (a file or a folder) into ``dest``; returns the copy's path."""
    fs, path = _fs(url)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / Path(path.rstrip("/")).name
    if target.exists():  # a resumed job: the copy it took at its start
        return str(target)
    tmp = dest / f".{target.name}.tmp"
    if fs.isdir(path):
        fs.get(path.rstrip("/") + "/", str(tmp), recursive=True)
    else:
        fs.get(path, str(tmp))
    os.replace(tmp, target)
    return str(target)
