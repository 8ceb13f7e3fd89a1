"""The run-history store: one row per training run (SQLAlchemy 2).

The embedded default is a SQLite file (``~/.dlrover-rm/history.db``, or ``$DLROVER_RM_HISTORY``),
opened in WAL mode with a busy timeout so several processes can write to it at once; any other
SQLAlchemy URL works too (PostgreSQL through psycopg2). The schema is kept by Alembic
(:mod:`dlrover_core.history.migrations`): opening a store brings its database to the head
revision, creating the tables in a fresh one and stamping one made before migrations existed
(its tables, no version row) at the baseline first. A store that cannot be reached raises
:class:`StoreUnavailableError`; callers that plan fall back to a cold start on it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from dlrover_core.errors import StoreUnavailableError
from dlrover_core.types import HistoryRecord, ResourcePlan, Sample
from dlrover_core.units import milliseconds

ENV_VAR = "DLROVER_RM_HISTORY"
DEFAULT_URL = "sqlite:///~/.dlrover-rm/history.db"
SQLITE_BUSY_TIMEOUT_S = 30.0

RUNS_TABLE = "dlrover_runs"
VERSION_TABLE = "dlrover_rm_alembic_version"  # not alembic_version: the database may be shared
BASELINE = "0001_baseline"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"

metadata = sa.MetaData()
runs_table = sa.Table(
    RUNS_TABLE,
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("signature", sa.String(512), nullable=False, index=True),
    sa.Column("job", sa.String(256), nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("succeeded", sa.Boolean, nullable=False),
    sa.Column("started_at_s", sa.Float, nullable=True),
    sa.Column("finished_at_s", sa.Float, nullable=False, index=True),
    sa.Column("wall_s", sa.Float, nullable=True),
    sa.Column("throughput_sps", sa.Float, nullable=True),
    sa.Column("auc", sa.Float, nullable=True),
    sa.Column("worker_cpu_used_millicores", sa.Integer, nullable=True),
    sa.Column("worker_memory_used_mib", sa.Integer, nullable=True),
    sa.Column("ps_cpu_used_millicores", sa.Integer, nullable=True),
    sa.Column("ps_memory_used_mib", sa.Integer, nullable=True),
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("final_plan", sa.JSON, nullable=False),
    sa.Column("plans", sa.JSON, nullable=False),
    sa.Column("samples", sa.JSON, nullable=False),
    sa.Column("faults", sa.JSON, nullable=False),
    sa.Column("metrics", sa.JSON, nullable=False),
)

_PEAK_KEYS = (
    "worker_cpu_used_millicores",
    "worker_memory_used_mib",
    "ps_cpu_used_millicores",
    "ps_memory_used_mib",
)
_METRIC_KEYS = ("throughput_sps", "wall_s", "auc", "cpu_util", "mem_util", "samples_done")
_SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(Sample))


def measured_pauses(changes: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The seconds each plan change of a run lost (``report.plan_changes``: its ``lost_s``),
    by kind (``ps``, ``worker``); changes that could not be measured are left out."""
    out: dict[str, list[float]] = {}
    for c in changes:
        lost, kind = c.get("lost_s"), c.get("kind")
        if isinstance(lost, (int, float)) and math.isfinite(lost) and kind in ("ps", "worker"):
            out.setdefault(str(kind), []).append(round(max(0.0, float(lost)), 3))
    return out


def default_url() -> str:
    return os.environ.get(ENV_VAR) or DEFAULT_URL


def _prepare_url(url: str) -> sa.URL:
    try:
        u = sa.make_url(url)
    except sa_exc.ArgumentError as e:
        raise StoreUnavailableError(
            f"history store URL {url!r} is not a valid SQLAlchemy URL ({e}); pass e.g. "
            "sqlite:///path/history.db or postgresql://user:pass@host/db"
        ) from None
    if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:"):
        p = Path(u.database or "").expanduser()
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreUnavailableError(
                f"history store {str(p)!r}: cannot create its folder ({e}); pass a writable path "
                f"in history.url or ${ENV_VAR}"
            ) from None
        u = u.set(database=str(p))
    if u.drivername == "postgresql":
        # SQLAlchemy 2.1 defaults to psycopg 3; the project ships psycopg2-binary
        import importlib.util

        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2"):
            u = u.set(drivername="postgresql+psycopg2")
    return u


def _json_safe(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _json_safe(dataclasses.asdict(v))
    return str(v)


def _opt_float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _opt_int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _sample_from_dict(d: Any) -> Sample | None:
    if isinstance(d, Sample):
        return d
    if not isinstance(d, dict):
        return None
    try:
        return Sample(**{k: d[k] for k in _SAMPLE_FIELDS if k in d})
    except TypeError:
        return None


def _alembic_config(connection: sa.Connection | None = None) -> Any:
    """Alembic's configuration for the history migrations, in code (no ini file needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")  # a path may hold spaces
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def schema_revision(connection: sa.Connection) -> str | None:
    """The database's revision (``None``: never migrated, fresh or made before migrations)."""
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    heads = ctx.get_current_heads()
    return heads[0] if heads else None


def head_revision() -> str:
    """The newest revision of the history schema."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"the history migrations in {MIGRATIONS} have no head revision")
    return head


def migrate(engine: sa.Engine, attempts: int = 5) -> str:
    """Bring the database to the head revision; returns it. A database with the runs table
    but no version row (made before migrations existed) is stamped at the baseline first.
    Several processes may open one fresh database at once: the loser of a race (a CREATE or
    a version row that the other wrote first) checks again."""
    from alembic import command

    head = head_revision()
    for attempt in range(attempts):
        try:
            with engine.begin() as con:
                current = schema_revision(con)
                if current == head:
                    return head
                cfg = _alembic_config(con)
                if current is None and sa.inspect(con).has_table(RUNS_TABLE):
                    command.stamp(cfg, BASELINE)
                command.upgrade(cfg, "head")
            return head
        except (sa_exc.OperationalError, sa_exc.ProgrammingError, sa_exc.IntegrityError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    return head


class HistoryStore:
    """Run history in a SQL database. Thread- and process-safe for writers."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_url()
        self._url = _prepare_url(self.url)
        self._engine: sa.Engine | None = None

    @property
    def display_url(self) -> str:
        return self._url.render_as_string(hide_password=True)

    # --- connection ----------------------------------------------------------------------
    def _unavailable(self, e: BaseException) -> StoreUnavailableError:
        lines = str(getattr(e, "orig", None) or e).strip().splitlines()
        why = lines[0] if lines else type(e).__name__
        return StoreUnavailableError(
            f"history store {self.display_url} is unavailable: {why}"
            "; check that the database is running and reachable, or point history.url / "
            f"${ENV_VAR} at another store"
        )

    def _engine_or_raise(self) -> sa.Engine:
        if self._engine is not None:
            return self._engine
        backend = self._url.get_backend_name()
        kwargs: dict[str, Any] = {"future": True}
        connect_args: dict[str, Any] = {}
        if backend == "sqlite":
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
        elif backend == "postgresql" and self._url.get_driver_name() in ("psycopg2", "psycopg"):
            connect_args["connect_timeout"] = 5
            kwargs["pool_pre_ping"] = True
        try:
            engine = sa.create_engine(self._url, connect_args=connect_args, **kwargs)
        except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as e:
            raise StoreUnavailableError(
                f"history store {self.display_url}: cannot open it ({e}); install its driver "
                "(pip install 'dlrover-rm[history]') or pass a sqlite:/// or postgresql:// URL"
            ) from None
        if backend == "sqlite":

            @sa.event.listens_for(engine, "connect")
            def _sqlite_pragmas(dbapi_con: Any, _rec: Any) -> None:
                cur = dbapi_con.cursor()
                cur.execute(f"PRAGMA busy_timeout = {int(milliseconds(SQLITE_BUSY_TIMEOUT_S))}")
                cur.execute("PRAGMA journal_mode = WAL")
                cur.execute("PRAGMA synchronous = NORMAL")
                cur.close()

        try:
            migrate(engine)
        except sa_exc.SQLAlchemyError as e:
            engine.dispose()
            raise self._unavailable(e) from None
        self._engine = engine
        return engine

    # --- writes --------------------------------------------------------------------------
    def record_run(
        self,
        spec_dict: dict[str, Any],
        signature: str,
        report: dict[str, Any],
        final_plan: ResourcePlan,
        samples: list[Sample],
        peaks: dict[str, Any],
        *,
        finished_at_s: float | None = None,
    ) -> int:
        """Store one finished run; returns its id."""
        finished = float(finished_at_s if finished_at_s is not None else time.time())
        wall = _opt_float(report.get("wall_s"))
        state = str(report.get("state") or "unknown")
        row: dict[str, Any] = {
            "signature": signature,
            "job": str(report.get("job") or spec_dict.get("name") or ""),
            "state": state,
            "succeeded": state == "succeeded",
            "started_at_s": finished - wall if wall is not None else None,
            "finished_at_s": finished,
            "wall_s": wall,
            "throughput_sps": _opt_float(report.get("throughput_sps")),
            "auc": _opt_float(report.get("auc")),
            "spec": _json_safe(spec_dict),
            "final_plan": _json_safe(final_plan.to_dict()),
            "plans": _json_safe(report.get("plans") or []),
            "samples": [_json_safe(dataclasses.asdict(s)) for s in samples],
            "faults": _json_safe(report.get("faults") or []),
            "metrics": _json_safe(
                {k: report.get(k) for k in _METRIC_KEYS}
                | {"failure": report.get("failure"), "run_dir": report.get("run_dir")}
                # the planner's model-form choice: the job's next run starts from it
                | {"model_choice": report.get("model_choice")}
                # the exported model: the next run of a recurring job starts from it
                # (training.init_from: last)
                | {"model": report.get("model_url") or report.get("model_dir")}
                # what each kind of plan change cost this run (the planner prices the next
                # run's changes with it instead of its constants)
                | {"pauses": measured_pauses(report.get("plan_changes") or [])}
            ),
        }
        for k in _PEAK_KEYS:
            row[k] = _opt_int(peaks.get(k))
        engine = self._engine_or_raise()
        try:
            with engine.begin() as con:
                res = con.execute(sa.insert(runs_table).values(**row))
                pk = res.inserted_primary_key
        except sa_exc.SQLAlchemyError as e:
            raise self._unavailable(e) from None
        assert pk is not None
        return int(pk[0])

    # --- reads ---------------------------------------------------------------------------
    def similar(self, signature: str, now_s: float, window_s: float) -> list[HistoryRecord]:
        """Successful runs of ``signature`` that finished in ``[now_s - window_s, now_s]``."""
        t = runs_table
        q = (
            sa.select(t)
            .where(
                t.c.signature == signature,
                t.c.succeeded.is_(True),
                t.c.finished_at_s >= now_s - window_s,
                t.c.finished_at_s <= now_s,
            )
            .order_by(t.c.finished_at_s, t.c.id)
        )
        rows = self._read(q)
        return [self._record(r) for r in rows]

    def recent(self, now_s: float, window_s: float, limit: int = 500) -> list[HistoryRecord]:
        """Successful runs of every signature that finished in ``[now_s - window_s, now_s]``,
        the newest ``limit``: what a new signature's similar-job prior learns from
        (planner/similar.py). Every record read carries the spec it ran (``extra["spec"]``)."""
        t = runs_table
        q = (
            sa.select(t)
            .where(
                t.c.succeeded.is_(True),
                t.c.finished_at_s >= now_s - window_s,
                t.c.finished_at_s <= now_s,
            )
            .order_by(t.c.finished_at_s.desc(), t.c.id.desc())
            .limit(int(limit))
        )
        return [self._record(r) for r in self._read(q)]

    def runs(self, limit: int = 50, signature: str | None = None) -> list[dict[str, Any]]:
        """The latest runs (of ``signature`` when given), newest first, as JSON-able
        summaries."""
        t = runs_table
        q = sa.select(t).order_by(t.c.finished_at_s.desc(), t.c.id.desc()).limit(int(limit))
        if signature is not None:
            q = q.where(t.c.signature == signature)
        out = []
        for r in self._read(q):
            m = r.metrics or {}
            out.append(
                {
                    "id": r.id,
                    "job": r.job,
                    "signature": r.signature,
                    "state": r.state,
                    "succeeded": bool(r.succeeded),
                    "started_at_s": r.started_at_s,
                    "finished_at_s": r.finished_at_s,
                    "wall_s": r.wall_s,
                    "throughput_sps": r.throughput_sps,
                    "auc": r.auc,
                    "cpu_util": m.get("cpu_util"),
                    "mem_util": m.get("mem_util"),
                    "plans": len(r.plans or []),
                    "samples": len(r.samples or []),
                    "faults": len(r.faults or []),
                    "final_plan": r.final_plan,
                }
            )
        return out

    def count(self) -> int:
        """How many runs the store holds, every state."""
        return int(self._read(sa.select(sa.func.count()).select_from(runs_table))[0][0])

    def signatures(self) -> list[str]:
        """Every signature with at least one successful run, sorted."""
        t = runs_table
        q = sa.select(t.c.signature).where(t.c.succeeded.is_(True)).distinct()
        return sorted(r[0] for r in self._read(q))

    def _read(self, q: sa.Select[Any]) -> list[sa.Row[Any]]:
        engine = self._engine_or_raise()
        try:
            with engine.connect() as con:
                return list(con.execute(q).all())
        except sa_exc.SQLAlchemyError as e:
            raise self._unavailable(e) from None

    @staticmethod
    def _record(r: sa.Row[Any]) -> HistoryRecord:
        samples = [s for s in (_sample_from_dict(d) for d in (r.samples or [])) if s is not None]
        extra: dict[str, Any] = {
            "samples": samples,
            "run_id": int(r.id),
            "job": r.job,
            "auc": r.auc,
            "spec": dict(r.spec or {}),  # what it ran: its data and tables (warm_start)
        }
        if (r.metrics or {}).get("model"):
            extra["model"] = str(r.metrics["model"])
        choice = (r.metrics or {}).get("model_choice")
        if choice is not None:
            extra["model_choice"] = choice
        pauses = (r.metrics or {}).get("pauses")
        if pauses:
            extra["pauses"] = pauses
        return HistoryRecord(
            signature=r.signature,
            finished_at_s=float(r.finished_at_s),
            final_plan=ResourcePlan.from_dict(r.final_plan),
            succeeded=bool(r.succeeded),
            throughput_sps=r.throughput_sps,
            wall_s=r.wall_s,
            extra=extra,
            strategy=str((r.spec or {}).get("strategy") or "ps"),
            **{k: getattr(r, k) for k in _PEAK_KEYS},
        )

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
