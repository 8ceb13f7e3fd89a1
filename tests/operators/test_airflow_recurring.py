"""Two scheduled runs of the example DAG under ``dag.test()`` with one persisted history store
(a SQLite file outside the runs, as a connection or ``DLROVER_RM_HISTORY`` gives it): the first
run is recorded, and the second one's plan starts from it. Real Airflow, real training; slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("airflow")

from tests.operators.test_airflow_dag import airflow_home, run_dag


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_second_scheduled_run_warm_starts_from_the_first(tmp_path: Path) -> None:
    env = airflow_home(tmp_path)  # its DLROVER_RM_HISTORY: one store for both runs
    conf = {"overrides": ["data.rows=40000"], "n_configs": 1, "work_dir": str(tmp_path / "w")}
    first, _ = run_dag(tmp_path, env, conf)
    second, _ = run_dag(tmp_path, env, conf)
    third, _ = run_dag(tmp_path, env, conf)
    assert first["state"] == second["state"] == "success", (first["tis"], second["tis"])
    assert third["state"] == "success", third["tis"]
    # the model carried forward (the DAG's init_from: last): the first run starts fresh and
    # says so, each later one from the model of the run before it
    inits = [r["report"]["init_from"] for r in (first, second, third)]
    assert inits[0]["model"] is None and "fresh start" in inits[0]["note"], inits[0]
    assert inits[1]["model"] == first["report"]["model_dir"], inits[1]
    assert inits[2]["model"] == second["report"]["model_dir"], inits[2]
    cards = [
        json.loads((Path(r["report"]["model_dir"]) / "model_card.json").read_text())
        for r in (first, second, third)
    ]
    assert [c["lineage"]["generation"] for c in cards] == [0, 1, 2]
    assert [c["lineage"]["rows_trained_total"] for c in cards] == [40000, 80000, 120000]
    assert first["report"]["state"] == second["report"]["state"] == "succeeded"
    # the XCom report is the complete one: its history record and its model are in it
    for res in (first, second):
        assert res["report"]["complete"] and res["report"]["history_run_id"] is not None
        assert res["report"]["model_dir"], res["report"].get("export_error")
    # each run's report.json, complete once its train step has ended: both were recorded
    r1, r2, _ = (json.loads(p.read_text()) for p in sorted((tmp_path / "w").rglob("report.json")))
    assert r1["history_run_id"] is not None and r2["history_run_id"] is not None
    assert r2["history_run_id"] != r1["history_run_id"]
    # the plan step of each run (its XCom is this file): the second read the first's record
    # and fitted its model on the first run's samples too
    plans = [json.loads(p.read_text()) for p in sorted((tmp_path / "w").rglob("plan.json"))]
    assert [p["history"]["records"] for p in plans] == [0, 1, 2], [p["history"] for p in plans]
    assert "similar past runs" not in plans[0]["reasons"][0], plans[0]["reasons"]
    from dlrover_core.history.store import HistoryStore

    with HistoryStore(env["DLROVER_RM_HISTORY"]) as store:
        first_samples = store.runs()[-1]["samples"]  # newest first
    if first_samples:  # a first run too short for a steady sample window records none
        assert "similar past runs" in plans[1]["reasons"][0], plans[1]["reasons"]
    assert r2["plans"][0]["reasons"] == plans[1]["reasons"]  # the job trained on that plan
