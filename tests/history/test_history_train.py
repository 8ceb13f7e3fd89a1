"""A finished `train` run is recorded in the history store and read back for warm start."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dlrover_core import api
from dlrover_core.errors import StoreUnavailableError
from dlrover_core.history.store import HistoryStore
from dlrover_core.types import Sample

pytestmark = pytest.mark.slow
SMALL = str(Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml")


def test_train_records_the_run_and_the_next_plan_reads_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    report = api.train(SMALL, run_dir=tmp_path / "run", history=url, progress=False)
    assert report["state"] == "succeeded", report.get("failure")
    assert isinstance(report["history_run_id"], int)
    assert isinstance(report["samples"], list)
    spec = api.resolve_spec(SMALL)
    recs = api.load_history(url, spec)
    assert [r.extra["run_id"] for r in recs] == [report["history_run_id"]]
    r = recs[0]
    assert r.signature == report["signature"]
    assert len(r.extra["samples"]) == len(report["samples"])
    assert all(isinstance(s, Sample) for s in r.extra["samples"])
    assert r.worker_memory_used_mib and r.ps_memory_used_mib
    with HistoryStore(url) as s:
        (row,) = s.runs()
    assert row["plans"] == len(report["plans"]) and row["job"] == report["job"]


def test_train_with_an_unreachable_store_fails_at_once_unless_told_to_start_cold(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = "postgresql://u:p@127.0.0.1:1/x"
    # a typo in a recurring pipeline's history URL must not cold-start every run silently
    with pytest.raises(StoreUnavailableError, match=r"history\.on_error"):
        api.train(SMALL, run_dir=tmp_path / "refused", history=url, progress=False)
    assert not (tmp_path / "refused").exists()  # nothing started
    with caplog.at_level(logging.WARNING):
        report = api.train(
            SMALL,
            overrides=["history.on_error=cold_start"],
            run_dir=tmp_path / "run",
            history=url,
            progress=False,
        )
    assert report["state"] == "succeeded", report.get("failure")
    assert report["history_run_id"] is None
    assert report["history"]["records"] == 0 and "unavailable" in report["history"]["error"]
    msgs = [r.getMessage() for r in caplog.records]
    assert any("cold start" in m for m in msgs) and any("not recorded" in m for m in msgs)
