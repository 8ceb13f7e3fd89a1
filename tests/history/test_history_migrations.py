"""The history schema under Alembic: a fresh database ends at head with exactly the tables the
store's metadata describes; a database made by the code before migrations (create_all, no
version row) is stamped and upgraded with its rows intact; the version table does not clash
with another application's Alembic history; the baseline downgrades and upgrades again."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from dlrover_core.history.store import (
    BASELINE,
    MIGRATIONS,
    RUNS_TABLE,
    VERSION_TABLE,
    HistoryStore,
    _alembic_config,
    _prepare_url,
    head_revision,
    metadata,
    runs_table,
    schema_revision,
)
from tests.factories import make_plan, make_spec

NOW = 1_700_000_000.0
PG_URL = os.environ.get("DLROVER_RM_TEST_PG_URL")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, or a schema of its own in the PostgreSQL test
    database (``search_path`` set through the URL), dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'history.db'}"
        return
    if not PG_URL:
        pytest.skip("no PostgreSQL server: set DLROVER_RM_TEST_PG_URL")
    schema = f"mig_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(_prepare_url(PG_URL))
    with admin.begin() as con:
        con.execute(sa.text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as con:
            con.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(_prepare_url(url))


def _diff(engine: sa.Engine) -> list[object]:
    with engine.connect() as con:
        ctx = MigrationContext.configure(
            con, opts={"version_table": VERSION_TABLE, "compare_type": True}
        )
        return list(compare_metadata(ctx, metadata))


def _revision(engine: sa.Engine) -> str | None:
    with engine.connect() as con:
        return schema_revision(con)


def _record(store: HistoryStore, sig: str = "p/m/d") -> int:
    from dlrover_core.spec import spec_to_dict

    return store.record_run(
        spec_to_dict(make_spec()),
        sig,
        {"job": "j", "state": "succeeded", "wall_s": 10.0, "throughput_sps": 5.0},
        make_plan((2, 1000, 2048), (1, 1000, 2048)),
        [],
        {},
        finished_at_s=NOW,
    )


def test_the_baseline_is_the_head_and_has_no_parent() -> None:
    assert head_revision() == BASELINE
    assert (MIGRATIONS / "versions" / f"{BASELINE}.py").is_file()


def test_a_fresh_database_ends_at_head_with_the_metadata_tables(db_url: str) -> None:
    url = db_url
    with HistoryStore(url) as s:
        run_id = _record(s)
        assert [r["id"] for r in s.runs()] == [run_id]
    engine = _engine(url)
    try:
        assert _revision(engine) == head_revision()
        assert _diff(engine) == []  # the migrations build exactly what the store describes
        names = set(sa.inspect(engine).get_table_names())
        assert names == {RUNS_TABLE, VERSION_TABLE}
        indexes = {i["name"] for i in sa.inspect(engine).get_indexes(RUNS_TABLE)}
        assert indexes == {"ix_dlrover_runs_signature", "ix_dlrover_runs_finished_at_s"}
    finally:
        engine.dispose()


def test_a_database_made_before_migrations_is_stamped_and_upgraded(db_url: str) -> None:
    url = db_url
    engine = _engine(url)
    metadata.create_all(engine)  # what HistoryStore did before it used Alembic
    with engine.begin() as con:
        con.execute(
            sa.insert(runs_table).values(
                signature="p/m/d", job="old", state="succeeded", succeeded=True,
                finished_at_s=NOW - 5, spec={}, final_plan=make_plan().to_dict(), plans=[],
                samples=[], faults=[], metrics={},
            )
        )  # fmt: skip
    assert _revision(engine) is None
    with HistoryStore(url) as s:
        (old,) = s.similar("p/m/d", NOW, 100)
        assert old.extra["job"] == "old"  # its rows are intact and readable
        _record(s)
        assert len(s.similar("p/m/d", NOW, 100)) == 2
    assert _revision(engine) == head_revision()
    assert _diff(engine) == []
    engine.dispose()


def test_reopening_at_head_changes_nothing(db_url: str) -> None:
    url = db_url
    for _ in range(3):
        with HistoryStore(url) as s:
            _record(s)
    with HistoryStore(url) as s:
        assert len(s.runs()) == 3
    engine = _engine(url)
    with engine.connect() as con:
        rows = con.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    assert rows == [(head_revision(),)]
    engine.dispose()


def test_another_applications_alembic_history_is_left_alone(db_url: str) -> None:
    url = db_url
    engine = _engine(url)
    with engine.begin() as con:
        con.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        con.execute(sa.text("INSERT INTO alembic_version VALUES ('their_rev_42')"))
        con.execute(sa.text("CREATE TABLE their_table (x INTEGER)"))
    with HistoryStore(url) as s:
        _record(s)
    with engine.connect() as con:
        assert con.execute(sa.text("SELECT version_num FROM alembic_version")).all() == [
            ("their_rev_42",)
        ]
    assert {"their_table", RUNS_TABLE, VERSION_TABLE} <= set(sa.inspect(engine).get_table_names())
    assert _revision(engine) == head_revision()
    engine.dispose()


def test_the_baseline_downgrades_and_upgrades_again(db_url: str) -> None:
    url = db_url
    HistoryStore(url).runs()
    engine = _engine(url)
    with engine.begin() as con:
        command.downgrade(_alembic_config(con), "base")
    assert RUNS_TABLE not in sa.inspect(engine).get_table_names()
    assert _revision(engine) is None
    with engine.begin() as con:
        command.upgrade(_alembic_config(con), "head")
    assert _revision(engine) == head_revision() and _diff(engine) == []
    engine.dispose()


def test_the_alembic_command_line_finds_the_migrations(tmp_path: Path) -> None:
    ini = MIGRATIONS / "alembic.ini"
    p = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), "-x", "unused=1", "heads"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert f"{BASELINE} (head)" in p.stdout


@pytest.mark.parametrize("bad", [b"not a database" * 100])
def test_a_broken_file_is_still_one_clear_error(tmp_path: Path, bad: bytes) -> None:
    from dlrover_core.errors import StoreUnavailableError

    p = tmp_path / "bad.db"
    p.write_bytes(bad)
    with pytest.raises(StoreUnavailableError, match="unavailable"):
        HistoryStore(f"sqlite:///{p}").runs()
