"""The SQL run-history store: SQLite always, PostgreSQL when DLROVER_RM_TEST_PG_URL is set."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlrover_core.api import load_history, plan
from dlrover_core.errors import StoreUnavailableError
from dlrover_core.history.store import HistoryStore
from dlrover_core.spec import spec_to_dict
from dlrover_core.types import Sample
from tests.factories import make_plan, make_spec

PG_ENV = "DLROVER_RM_TEST_PG_URL"
PG_URL = os.environ.get(PG_ENV)
NOW = 1_700_000_000.0


def _report(state: str = "succeeded", **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "job": "job-a",
        "state": state,
        "throughput_sps": 1234.5,
        "wall_s": 60.0,
        "auc": 0.71,
        "cpu_util": 0.6,
        "mem_util": 0.5,
        "samples_done": 1000,
        "plans": [{"stage": "cold_start", "time_s": 1.0, "reasons": ["cold"]}],
        "faults": [{"time_s": 2.0, "role": "worker", "node_id": 0, "reason": "OOMKilled"}],
    }
    r.update(kw)
    return r


SAMPLES = [
    Sample(2, 1, 1.0, 2.0, 900.0, batch_size=512, worker_memory_mib=800.0, timestamp_s=10.0),
    Sample(4, 1, 1.0, 2.0, 1500.0, batch_size=512, ps_cpu_util=0.7),
]
PEAKS = {
    "worker_cpu_used_millicores": 950,
    "worker_memory_used_mib": 820,
    "ps_cpu_used_millicores": 1700,
    "ps_memory_used_mib": 2100,
}


def _record(store: HistoryStore, sig: str, finished: float, state: str = "succeeded") -> int:
    spec = make_spec()
    return store.record_run(
        spec_to_dict(spec),
        sig,
        _report(state),
        make_plan((4, 1000, 2048), (1, 2000, 4096)),
        SAMPLES,
        PEAKS,
        finished_at_s=finished,
    )


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'h' / 'history.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return _sqlite(tmp_path)
    if not PG_URL:
        pytest.skip(f"no PostgreSQL server: set {PG_ENV} (e.g. postgresql://u:p@127.0.0.1/db)")
    return PG_URL


@pytest.fixture
def store(store_url: str) -> Iterator[HistoryStore]:
    s = HistoryStore(store_url)
    yield s
    s.close()


def _sig() -> str:  # unique per test, so a shared PostgreSQL database needs no cleanup
    return f"pipe/model-{uuid.uuid4().hex[:8]}/criteo"


def test_round_trip_gives_the_run_back_with_its_samples(store: HistoryStore) -> None:
    sig = _sig()
    run_id = _record(store, sig, NOW - 100)
    recs = store.similar(sig, NOW, 3600)
    assert len(recs) == 1
    r = recs[0]
    assert r.signature == sig and r.succeeded
    assert r.finished_at_s == pytest.approx(NOW - 100)
    assert r.final_plan == make_plan((4, 1000, 2048), (1, 2000, 4096))
    assert r.extra["run_id"] == run_id
    assert r.extra["samples"] == SAMPLES
    assert all(isinstance(s, Sample) for s in r.extra["samples"])
    assert r.worker_cpu_used_millicores == 950 and r.ps_memory_used_mib == 2100
    assert r.throughput_sps == pytest.approx(1234.5) and r.wall_s == pytest.approx(60.0)
    (summary,) = store.runs(signature=sig)
    assert summary["id"] == run_id
    assert summary["signature"] == sig and summary["job"] == "job-a"
    assert summary["started_at_s"] == pytest.approx(NOW - 160)
    assert summary["samples"] == 2 and summary["plans"] == 1 and summary["faults"] == 1


def test_the_planners_model_choice_comes_back_for_the_next_run(store: HistoryStore) -> None:
    """The report's ``model_choice`` (the form the planner chose and from which
    configurations) is kept with the run and read back into the record's ``extra``."""
    sig = _sig()
    choice = {"form": "ps_overlap", "configs": [[w, 1, 1.0, 2.0] for w in range(1, 6)]}
    spec = make_spec()
    plan_ = make_plan((4, 1000, 2048), (1, 2000, 4096))
    store.record_run(
        spec_to_dict(spec), sig, _report(model_choice=choice), plan_, SAMPLES, PEAKS,
        finished_at_s=NOW - 20,
    )  # fmt: skip
    _record(store, sig, NOW - 10)  # a report without one (an all-reduce run, an old master)
    with_choice, without = store.similar(sig, NOW, 3600)
    assert with_choice.extra["model_choice"] == choice
    assert "model_choice" not in without.extra


def test_window_and_signature_filter(store: HistoryStore) -> None:
    sig, other = _sig(), _sig()
    inside = _record(store, sig, NOW - 50)
    _record(store, sig, NOW - 5000)  # too old
    _record(store, sig, NOW + 50)  # after "now"
    _record(store, other, NOW - 10)  # another signature
    assert [r.extra["run_id"] for r in store.similar(sig, NOW, 1000)] == [inside]
    assert len(store.similar(sig, NOW, 10_000)) == 2
    assert len(store.similar(other, NOW, 1000)) == 1


def test_failed_runs_are_recorded_but_not_similar(store: HistoryStore) -> None:
    sig = _sig()
    ok = _record(store, sig, NOW - 20)
    bad = _record(store, sig, NOW - 10, state="failed")
    assert [r.extra["run_id"] for r in store.similar(sig, NOW, 1000)] == [ok]
    states = {x["id"]: x["state"] for x in store.runs(signature=sig)}
    assert states[bad] == "failed"


def test_counts_and_signatures_see_past_the_latest_page(store: HistoryStore) -> None:
    """A store that outgrows ``runs()``'s page (a shared database, years of runs) still counts
    every run and lists every signature that succeeded: the "all records" read and the
    Airflow hook's health check do not stop at the newest 50 or 1000."""
    sig, failed_only = _sig(), _sig()
    before = store.count()
    _record(store, sig, NOW - 10**6)  # far older than anything else in the store
    _record(store, failed_only, NOW - 10**6, state="failed")
    assert store.count() == before + 2
    sigs = store.signatures()
    assert sig in sigs and failed_only not in sigs and sigs == sorted(set(sigs))
    assert len(store.runs(signature=sig, limit=1)) == 1


def test_load_history_filters_by_spec(store_url: str) -> None:
    spec = make_spec(pacing__history_window_s=1000)
    with HistoryStore(store_url) as s:
        want = _record(s, spec.signature_key, NOW - 10)
        _record(s, spec.signature_key, NOW - 5000)
    recs = load_history(store_url, spec, now_s=NOW)
    assert want in [r.extra["run_id"] for r in recs]
    assert all(NOW - 1000 <= r.finished_at_s <= NOW for r in recs)
    assert all(r.signature == spec.signature_key for r in recs)


def test_default_url_comes_from_the_environment(tmp_path: Path, monkeypatch: Any) -> None:
    db = tmp_path / "deep" / "dir" / "h.db"
    monkeypatch.setenv("DLROVER_RM_HISTORY", f"sqlite:///{db}")
    spec = make_spec()
    with HistoryStore(None) as s:
        _record(s, spec.signature_key, NOW - 1)
    assert db.exists()
    assert len(load_history(None, spec, now_s=NOW)) == 1
    assert load_history(None) == []  # no spec, no URL: nothing to look up


def test_tilde_is_expanded(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with HistoryStore("sqlite:///~/.dlrover-rm/history.db") as s:
        _record(s, "a/b/c", NOW)
    assert (tmp_path / ".dlrover-rm" / "history.db").exists()


def _writer(url: str, worker: int, n: int) -> None:
    s = HistoryStore(url)
    try:
        for i in range(n):
            _record(s, f"sig-{worker}", NOW - i)
    finally:
        s.close()


@pytest.mark.slow  # over 3 s here: the full tier (make test-all)
def test_concurrent_writers_on_one_sqlite_file(tmp_path: Path) -> None:
    url = _sqlite(tmp_path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(url, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with HistoryStore(url) as s:
        rows = s.runs(limit=1000)
        assert len(rows) == 60
        assert len({r["id"] for r in rows}) == 60
        for w in range(4):
            assert len(s.similar(f"sig-{w}", NOW, 100)) == 15


UNREACHABLE = "postgresql://u:secret@127.0.0.1:1/x"


def test_unreachable_store_raises_a_clear_error() -> None:
    s = HistoryStore(UNREACHABLE)
    with pytest.raises(StoreUnavailableError) as ei:
        s.similar("a/b/c", NOW, 100)
    msg = str(ei.value)
    assert "unavailable" in msg and "127.0.0.1" in msg and "secret" not in msg


@pytest.mark.parametrize("url", [UNREACHABLE, "mysql://x", "garbage"])
def test_a_history_store_that_cannot_be_read_fails_planning_with_one_line(url: str) -> None:
    """A typo in a recurring pipeline's history URL must not cold-start every run silently."""
    spec = make_spec()
    for call in (lambda: load_history(url, spec), lambda: load_history(url)):
        with pytest.raises(StoreUnavailableError) as ei:
            call()
        msg = str(ei.value)
        assert "\n" not in msg and "history.on_error" in msg and "secret" not in msg
    with pytest.raises(StoreUnavailableError):
        plan(spec, history=url)


def test_on_error_cold_start_plans_cold_and_says_which_store_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = make_spec(history={"url": UNREACHABLE, "on_error": "cold_start"})
    with caplog.at_level(logging.WARNING):
        assert load_history(None, spec) == []
        out = plan(spec)  # planning goes on, cold
    assert any("cold start" in r.getMessage() for r in caplog.records)
    assert out["stage"] == "cold_start"
    assert out["history"]["records"] == 0 and "unavailable" in out["history"]["error"]
    assert "secret" not in out["history"]["store"]


def test_broken_sqlite_file_is_unavailable(tmp_path: Path) -> None:
    p = tmp_path / "bad.db"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreUnavailableError):
        HistoryStore(f"sqlite:///{p}").runs()
    with pytest.raises(StoreUnavailableError, match=r"bad\.db"):
        load_history(f"sqlite:///{p}", make_spec())


def test_json_exports_still_read(tmp_path: Path) -> None:
    p = tmp_path / "h.json"
    p.write_text("[]")
    assert load_history(str(p)) == []
