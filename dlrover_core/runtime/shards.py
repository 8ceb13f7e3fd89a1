"""The dynamic data-shard queue, persisted in SQLite so a master killed with SIGKILL and
restarted on the same run directory neither loses nor repeats a shard.

A shard is a contiguous row range of one epoch: shard ``i`` of epoch ``e`` covers rows
``[i*shard_size, min((i+1)*shard_size, total_rows))`` and has id ``e*shards_per_epoch + i``.
States move ``todo -> doing -> done``; a worker that dies gives its ``doing`` shards back
(``doing -> todo``), and a shard that failed ``max_attempts`` times goes to ``failed``: it is
reported, never silently dropped.

Durability: the database is in WAL mode and every state change is one ``BEGIN IMMEDIATE``
transaction, so a crash leaves either the state before a call or the state after it. With
``synchronous="FULL"`` (the default) a committed change also survives an OS crash; ``"NORMAL"``
survives a process crash (SIGKILL) and is faster.

Exactly-once accounting:

- ``take(worker, held=...)`` first re-delivers a ``doing`` shard of that worker that the worker
  does not know it holds (the reply of an earlier take was lost, e.g. the master died between
  commit and reply), so a lost reply cannot strand a shard.
- ``complete`` of a shard that is not yet done marks it done, whoever reports it (the rows were
  trained; refusing a late report would only train them again). Completing a done shard is a
  duplicate: it returns False, is recorded and counted in ``completed_twice``; the caller must
  not count its samples. A retried report of the *same* take (same worker and ``attempt``, as
  when the reply to the first report was lost) is the same completion: it returns True again
  and records nothing, so the caller, which saw no earlier reply, counts it once.

After a master restart, ``doing`` shards stay with their worker: it may still be alive and will
report. The master keeps them when the worker re-registers or heartbeats, and calls
``release_worker`` when the worker is found dead.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from dlrover_core.errors import DLRoverError, InputError

SCHEMA_VERSION = 2


class ShardState(StrEnum):
    TODO = "todo"
    DOING = "doing"
    DONE = "done"
    FAILED = "failed"


class ShardConservationError(DLRoverError):
    """The queue no longer accounts for every shard: a bug, never expected at runtime."""


@dataclass(frozen=True)
class Shard:
    """One row range handed to a worker. ``attempt`` counts takes of this shard (1 = first)."""

    shard_id: int
    epoch: int
    start: int
    end: int
    attempt: int = 0
    worker_id: int | None = None

    @property
    def rows(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "epoch": self.epoch,
            "start": self.start,
            "end": self.end,
            "attempt": self.attempt,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], worker_id: int | None = None) -> Shard:
        return cls(
            int(d["shard_id"]),
            int(d["epoch"]),
            int(d["start"]),
            int(d["end"]),
            int(d.get("attempt", 0)),
            worker_id,
        )


_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE shards (
    id INTEGER PRIMARY KEY,
    epoch INTEGER NOT NULL,
    start_row INTEGER NOT NULL,
    end_row INTEGER NOT NULL,
    state TEXT NOT NULL,
    worker_id INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    taken_at REAL,
    done_at REAL,
    done_by INTEGER,
    done_attempt INTEGER,
    done_seq INTEGER,
    last_reason TEXT
);
CREATE INDEX shards_by_state ON shards(state, id);
CREATE INDEX shards_by_worker ON shards(worker_id, state);
CREATE TABLE replays (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    shard_id INTEGER NOT NULL,
    done_seq INTEGER NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE duplicates (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    shard_id INTEGER NOT NULL,
    worker_id INTEGER NOT NULL,
    attempt INTEGER,
    at REAL NOT NULL
);
"""

_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


class ShardQueue:
    """The shard table of one job. Thread-safe; open with :meth:`open`."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        total_rows: int,
        shard_size: int,
        epochs: int,
        max_attempts: int,
        clock: Callable[[], float],
    ) -> None:
        self._conn = conn
        self._lock = threading.RLock()
        self.path = path
        self.total_rows = total_rows
        self.shard_size = shard_size
        self.epochs = epochs
        self.max_attempts = max_attempts
        self._clock = clock
        self.shards_per_epoch = -(-total_rows // shard_size)

    # --- opening ------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | Path,
        total_rows: int,
        shard_size: int,
        epochs: int = 1,
        max_attempts: int = 3,
        *,
        clock: Callable[[], float] = time.time,
        synchronous: str = "FULL",
    ) -> ShardQueue:
        """Create the shard table at ``path`` on first open, or resume the one there.

        Resuming checks that ``total_rows``, ``shard_size`` and ``epochs`` match what the table
        was created with; ``max_attempts`` may change between runs (the new value is stored).
        ``clock`` gives wall-clock seconds (stored times must be comparable across restarts).
        """
        problems = []
        if total_rows <= 0:
            problems.append(f"total_rows={total_rows} must be > 0")
        if shard_size <= 0:
            problems.append(f"shard_size={shard_size} must be > 0")
        if epochs <= 0:
            problems.append(f"epochs={epochs} must be > 0")
        if max_attempts <= 0:
            problems.append(f"max_attempts={max_attempts} must be > 0")
        if synchronous.upper() not in _SYNC_MODES:
            problems.append(f"synchronous={synchronous!r} must be one of {_SYNC_MODES}")
        if problems:
            raise InputError("invalid shard queue parameters", problems=problems)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(
                str(p), isolation_level=None, check_same_thread=False, timeout=30
            )
        except sqlite3.Error as e:
            raise InputError(
                f"cannot open the shard queue {p}: {e}; check the run directory"
            ) from None
        try:
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            q = cls(conn, p, total_rows, shard_size, epochs, max_attempts, clock)
            q._create_or_resume()
        except sqlite3.DatabaseError as e:
            conn.close()
            raise InputError(
                f"the shard queue {p} is unreadable ({e}): restore it from a backup, or start "
                "the job in a new run directory"
            ) from None
        except BaseException:
            conn.close()
            raise
        return q

    def _create_or_resume(self) -> None:
        with self._tx() as c:
            exists = c.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
            ).fetchone()
            if exists:
                meta = dict(c.execute("SELECT key, value FROM meta").fetchall())
                try:
                    stored = {k: int(meta[k]) for k in ("total_rows", "shard_size", "epochs")}
                except (KeyError, ValueError) as e:
                    raise sqlite3.DatabaseError(f"its meta table lacks {e}") from None
                if int(meta.get("schema_version", 1)) != SCHEMA_VERSION:
                    raise InputError(
                        f"the shard queue at {self.path} has schema "
                        f"{meta.get('schema_version')}, this version needs {SCHEMA_VERSION}: "
                        "finish the job with the version that started it, or start anew"
                    )
                wanted = {
                    "total_rows": self.total_rows,
                    "shard_size": self.shard_size,
                    "epochs": self.epochs,
                }
                diff = [
                    f"{k}: stored {stored[k]}, asked {wanted[k]}"
                    for k in stored
                    if stored[k] != wanted[k]
                ]
                if diff:
                    raise InputError(
                        f"the shard queue at {self.path} was made for another dataset; resume "
                        "with the same spec, or start in a new run directory",
                        problems=diff,
                    )
                c.execute(
                    "UPDATE meta SET value=? WHERE key='max_attempts'", (str(self.max_attempts),)
                )
                return
            for stmt in _SCHEMA.strip().split(";"):
                if stmt.strip():
                    c.execute(stmt)
            c.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?)",
                [
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("total_rows", str(self.total_rows)),
                    ("shard_size", str(self.shard_size)),
                    ("epochs", str(self.epochs)),
                    ("max_attempts", str(self.max_attempts)),
                    ("shards_total", str(self.shards_per_epoch * self.epochs)),
                    ("created_at", repr(self._clock())),
                    ("done_seq", "0"),
                ],
            )
            c.executemany(
                "INSERT INTO shards(id, epoch, start_row, end_row, state) VALUES (?,?,?,?,'todo')",
                self._ranges(),
            )

    def _ranges(self) -> Iterator[tuple[int, int, int, int]]:
        for e in range(self.epochs):
            for i in range(self.shards_per_epoch):
                start = i * self.shard_size
                end = min(start + self.shard_size, self.total_rows)
                yield (e * self.shards_per_epoch + i, e, start, end)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken before reading so no two writers interleave."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ShardQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- state changes ------------------------------------------------------------------------

    def take(self, worker_id: int, held: Iterable[int] | None = None) -> Shard | None:
        """Give ``worker_id`` a shard (todo -> doing), or None when no todo shard is left.

        With ``held`` (the shard ids the worker knows it holds, possibly empty), a doing shard
        of this worker not in ``held`` is handed back first, unchanged: its earlier take's
        reply was lost."""
        now = self._clock()
        with self._tx() as c:
            if held is not None:
                known = {int(h) for h in held}
                rows = c.execute(
                    "SELECT id, epoch, start_row, end_row, attempts FROM shards "
                    "WHERE state='doing' AND worker_id=? ORDER BY id",
                    (worker_id,),
                ).fetchall()
                for sid, epoch, start, end, attempts in rows:
                    if sid not in known:
                        return Shard(sid, epoch, start, end, attempts, worker_id)
            row = c.execute(
                "SELECT id, epoch, start_row, end_row, attempts FROM shards "
                "WHERE state='todo' ORDER BY id LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            sid, epoch, start, end, attempts = row
            c.execute(
                "UPDATE shards SET state='doing', worker_id=?, attempts=attempts+1, taken_at=? "
                "WHERE id=?",
                (worker_id, now, sid),
            )
            return Shard(sid, epoch, start, end, attempts + 1, worker_id)

    def complete(self, shard_id: int, worker_id: int, attempt: int | None = None) -> bool:
        """Mark ``shard_id`` done by ``worker_id``. True if this completion counts.

        False for a shard already done: recorded as a duplicate (``completed_twice``), unless
        it repeats the very completion that made it done (same worker and ``attempt``, as a
        retried RPC does): that returns True again and records nothing. Raises InputError for
        an unknown shard."""
        now = self._clock()
        with self._tx() as c:
            row = c.execute(
                "SELECT state, worker_id, attempts, done_by, done_attempt FROM shards WHERE id=?",
                (shard_id,),
            ).fetchone()
            if row is None:
                raise InputError(
                    f"shard {shard_id} does not exist (0..{self.shards_total - 1}): the worker "
                    "reported a shard from another job or run directory"
                )
            state, holder, attempts, done_by, done_attempt = row
            if state == ShardState.DONE:
                if attempt is not None and done_by == worker_id and done_attempt == attempt:
                    return True
                c.execute(
                    "INSERT INTO duplicates(shard_id, worker_id, attempt, at) VALUES (?,?,?,?)",
                    (shard_id, worker_id, attempt, now),
                )
                return False
            if attempt is None and state == ShardState.DOING and holder == worker_id:
                attempt = attempts
            seq = int(c.execute("SELECT value FROM meta WHERE key='done_seq'").fetchone()[0]) + 1
            c.execute("UPDATE meta SET value=? WHERE key='done_seq'", (str(seq),))
            c.execute(
                "UPDATE shards SET state='done', done_by=?, done_attempt=?, done_at=?, "
                "done_seq=? WHERE id=?",
                (worker_id, attempt, now, seq, shard_id),
            )
            return True

    @property
    def done_seq(self) -> int:
        """The sequence number of the latest completion (0: none yet). Completions are
        numbered 1, 2, ... in the order they were recorded; a PS checkpoint tagged with a
        sequence number holds the updates of every shard done at or before it."""
        return int(self._query("SELECT value FROM meta WHERE key='done_seq'")[0][0])

    def requeue_done_after(self, seq: int, reason: str) -> list[int]:
        """Done shards completed after sequence ``seq`` go back to todo (a PS restored a
        checkpoint tagged ``seq`` and lost their updates: they are trained again). Each is
        logged in ``replays``; the failure budget is not charged. Returns their ids."""
        now = self._clock()
        with self._tx() as c:
            rows = c.execute(
                "SELECT id, done_seq FROM shards WHERE state='done' AND done_seq>? ORDER BY id",
                (seq,),
            ).fetchall()
            for sid, dseq in rows:
                c.execute(
                    "INSERT INTO replays(shard_id, done_seq, reason, at) VALUES (?,?,?,?)",
                    (sid, dseq, reason, now),
                )
                c.execute(
                    "UPDATE shards SET state='todo', worker_id=NULL, taken_at=NULL, done_by=NULL, "
                    "done_attempt=NULL, done_at=NULL, done_seq=NULL, last_reason=? WHERE id=?",
                    (reason, sid),
                )
            return [int(r[0]) for r in rows]

    @property
    def replayed(self) -> int:
        """Shards trained again because a restored PS had lost their updates."""
        return int(self._query("SELECT COUNT(*) FROM replays")[0][0])

    def release_worker(self, worker_id: int, reason: str) -> list[int]:
        """Give back every doing shard of ``worker_id`` (it died or left); each counts one
        failure, and a shard with ``max_attempts`` failures goes to failed. Returns their ids."""
        with self._tx() as c:
            ids = [
                r[0]
                for r in c.execute(
                    "SELECT id FROM shards WHERE state='doing' AND worker_id=? ORDER BY id",
                    (worker_id,),
                )
            ]
            self._give_back(c, ids, reason)
            return ids

    def requeue_stale(self, now: float, timeout_s: float) -> list[int]:
        """Give back shards that have been doing for ``timeout_s`` or longer (a hung or lost
        worker); each counts one failure. Returns their ids."""
        with self._tx() as c:
            ids = [
                r[0]
                for r in c.execute(
                    "SELECT id FROM shards WHERE state='doing' AND taken_at<=? ORDER BY id",
                    (now - timeout_s,),
                )
            ]
            self._give_back(c, ids, f"doing for >= {timeout_s:g} s")
            return ids

    def _give_back(self, c: sqlite3.Connection, ids: list[int], reason: str) -> None:
        for sid in ids:
            c.execute(
                "UPDATE shards SET failures=failures+1, last_reason=?, worker_id=NULL, "
                "taken_at=NULL, state=CASE WHEN failures+1>=? THEN 'failed' ELSE 'todo' END "
                "WHERE id=?",
                (reason, self.max_attempts, sid),
            )

    def retry_failed(self) -> list[int]:
        """Put failed shards back to todo with a fresh failure budget (an operator's call)."""
        with self._tx() as c:
            ids = [r[0] for r in c.execute("SELECT id FROM shards WHERE state='failed'")]
            c.execute("UPDATE shards SET state='todo', failures=0 WHERE state='failed'")
            return ids

    # --- reading ------------------------------------------------------------------------------

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    @property
    def shards_total(self) -> int:
        return self.shards_per_epoch * self.epochs

    @property
    def samples_total(self) -> int:
        return self.total_rows * self.epochs

    def counts(self) -> dict[str, int]:
        """``{todo, doing, done, failed, total}`` (total = shards the job has)."""
        out = {s.value: 0 for s in ShardState}
        for state, n in self._query("SELECT state, COUNT(*) FROM shards GROUP BY state"):
            out[state] = n
        out["total"] = self.shards_total
        return out

    @property
    def samples_done(self) -> int:
        (n,) = self._query(
            "SELECT COALESCE(SUM(end_row-start_row), 0) FROM shards WHERE state='done'"
        )[0]
        return int(n)

    @property
    def completed_twice(self) -> int:
        """Completions of shards already done (rows trained twice, as far as is known)."""
        return int(self._query("SELECT COUNT(*) FROM duplicates")[0][0])

    @property
    def samples_retrained(self) -> int:
        """Rows of the duplicate completions."""
        (n,) = self._query(
            "SELECT COALESCE(SUM(s.end_row-s.start_row), 0) FROM duplicates d "
            "JOIN shards s ON s.id=d.shard_id"
        )[0]
        return int(n)

    @property
    def lost(self) -> int:
        """Shards the table no longer accounts for: total - done - todo - doing - failed.
        Always 0 unless the database was damaged; see :meth:`check_conservation`."""
        c = self.counts()
        return c["total"] - c["done"] - c["todo"] - c["doing"] - c["failed"]

    def conservation_problems(self) -> list[str]:
        problems = []
        c = self.counts()
        lost = c["total"] - c["done"] - c["todo"] - c["doing"] - c["failed"]
        if lost:
            problems.append(f"{lost} shard(s) unaccounted for in {c}")
        (n_ids, rows, bad) = self._query(
            "SELECT COUNT(DISTINCT id), COALESCE(SUM(end_row-start_row), 0), "
            "SUM(state NOT IN ('todo','doing','done','failed')) FROM shards"
        )[0]
        if n_ids != self.shards_total:
            problems.append(f"{n_ids} shard rows, expected {self.shards_total}")
        if rows != self.samples_total:
            problems.append(f"shards cover {rows} rows, expected {self.samples_total}")
        if bad:
            problems.append(f"{bad} shard(s) in an unknown state")
        orphans = self._query(
            "SELECT COUNT(*) FROM shards WHERE state='doing' AND worker_id IS NULL"
        )[0][0]
        if orphans:
            problems.append(f"{orphans} doing shard(s) without a worker")
        return problems

    def check_conservation(self) -> None:
        """Raise :class:`ShardConservationError` unless every shard is accounted for once."""
        problems = self.conservation_problems()
        if problems:
            raise ShardConservationError(
                f"shard queue {self.path} is inconsistent", problems=problems
            )

    def done_by_worker(self) -> dict[int, int]:
        """Shards completed (counted completions) per worker id."""
        return {
            int(w): int(n)
            for w, n in self._query(
                "SELECT done_by, COUNT(*) FROM shards WHERE state='done' GROUP BY done_by"
            )
        }

    def doing_by_worker(self) -> dict[int, list[int]]:
        """Doing shard ids per worker: after a restart, whom the master must hear from."""
        out: dict[int, list[int]] = {}
        for sid, w in self._query(
            "SELECT id, worker_id FROM shards WHERE state='doing' ORDER BY id"
        ):
            out.setdefault(int(w), []).append(int(sid))
        return out

    def failed_shards(self) -> list[dict[str, Any]]:
        """Failed shards with their failure count and last reason (for the report)."""
        return [
            {"shard_id": sid, "failures": f, "reason": r}
            for sid, f, r in self._query(
                "SELECT id, failures, last_reason FROM shards WHERE state='failed' ORDER BY id"
            )
        ]

    def shard(self, shard_id: int) -> tuple[Shard, ShardState]:
        rows = self._query(
            "SELECT id, epoch, start_row, end_row, attempts, worker_id, state FROM shards "
            "WHERE id=?",
            (shard_id,),
        )
        if not rows:
            raise InputError(f"shard {shard_id} does not exist (0..{self.shards_total - 1})")
        sid, epoch, start, end, attempts, worker, state = rows[0]
        return Shard(sid, epoch, start, end, attempts, worker), ShardState(state)

    def summary(self) -> dict[str, int]:
        """Counts plus the exactly-once figures, JSON-able (for status and the report)."""
        return {
            **self.counts(),
            "completed_twice": self.completed_twice,
            "lost": self.lost,
            "samples_done": self.samples_done,
            "samples_total": self.samples_total,
            "samples_retrained": self.samples_retrained,
            "replayed": self.replayed,
            "done_seq": self.done_seq,
        }
