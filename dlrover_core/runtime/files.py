"""Files the runtime writes: one atomic-write helper, the run lease (one master per run
directory), and a small disk reserve so the last report can still be written when the disk
fills up.

``atomic_write`` writes a temporary file next to the target, fsyncs it, renames it over the
target and fsyncs the directory: a reader (or a crash) sees the old file or the new one, never
half of one; on any error the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from dlrover_core.errors import DLRoverError, ErrorKind

__all__ = [
    "DiskReserve",
    "FileLease",
    "LeaseHeldError",
    "atomic_write",
    "atomic_write_json",
    "fsync_dir",
    "is_disk_full",
]

RESERVE_FILE = ".disk-reserve"
RESERVE_BYTES = 4 << 20  # room for report.json, report.png and a last master.json


class LeaseHeldError(DLRoverError):
    """Another live master holds this run's lease."""

    kind = ErrorKind.CONFLICT


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes | str, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (see the module docstring)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
            os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(p.parent)


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> None:
    """``atomic_write`` of ``data`` as indented, key-sorted JSON (NaN refused: JSON has none)."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=False))


def is_disk_full(e: BaseException | None) -> bool:
    """A write failed for want of space: ``ENOSPC``/``EDQUOT``, or SQLite's ``SQLITE_FULL``
    (its errors carry no errno), here or in what caused it."""
    import sqlite3

    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


class DiskReserve:
    """A few MiB set aside in the run directory at start; :meth:`release` frees them so the
    final report and state can be written after the disk filled up."""

    def __init__(self, run_dir: str | os.PathLike[str], nbytes: int = RESERVE_BYTES) -> None:
        self.path = Path(run_dir) / RESERVE_FILE
        self.nbytes = nbytes

    def create(self) -> None:
        try:
            with open(self.path, "wb") as f:
                f.write(b"\0" * self.nbytes)  # real blocks, not a sparse file
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


class FileLease:
    """The local run lease: an exclusive ``flock`` on ``RUN_DIR/master.lock``, held for the
    master's life (the kernel drops it when the process dies, however it dies). The file says
    who holds it, so a refused second master can name the running one."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / "master.lock"
        self._f: IO[str] | None = None

    def holder(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return "another master"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
        return f"pid {info.get('pid')} on {info.get('host')} since {since}"

    def acquire(self) -> str | None:
        if self._f is not None:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held until release
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return self.holder()
        f.seek(0)
        f.truncate()
        f.write(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
        )
        f.flush()
        self._f = f
        return None

    def renew(self) -> bool:
        return self._f is not None

    def release(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)
            self._f.close()
            self._f = None
