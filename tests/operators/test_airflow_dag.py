"""The example DAG runs for real under ``dag.test()``: profile (2 short trials) → plan → train
(deferred to DLRoverJobTrigger, run inline), on a temporary AIRFLOW_HOME with SQLite.

Airflow reads its configuration once, at import, so the run happens in a subprocess whose
environment alone carries AIRFLOW_HOME (never this process's or the machine's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parent / "_dag_test_run.py"


def _airflow_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "pipelines"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        DLROVER_RM_HISTORY=f"sqlite:///{home / 'history.db'}",  # not the user's store
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    return env


def airflow_home(tmp_path: Path) -> dict[str, str]:
    """A fresh AIRFLOW_HOME under ``tmp_path`` with its database migrated; its environment."""
    home = tmp_path / "airflow"
    home.mkdir()
    env = _airflow_env(home)
    mig = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert mig.returncode == 0, mig.stdout[-3000:] + mig.stderr[-3000:]
    return env


def run_dag(
    tmp_path: Path, env: dict[str, str], conf: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """One ``dag.test()`` of the example DAG in a subprocess: its result line and its output."""
    run = subprocess.run(
        [sys.executable, str(RUNNER), json.dumps(conf)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    out = run.stdout + run.stderr
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert run.returncode == 0 and lines, out[-6000:]
    return dict(json.loads(lines[-1].removeprefix("RESULT "))), out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_example_dag_runs_end_to_end(tmp_path: Path) -> None:
    env = airflow_home(tmp_path)
    conf = {"overrides": ["data.rows=50000"], "n_configs": 2, "work_dir": str(tmp_path / "w")}
    res, out = run_dag(tmp_path, env, conf)

    assert res["tis"] == {"profile": "success", "plan": "success", "train": "success"}, out[-6000:]
    assert res["state"] == "success"
    report = res["report"]
    assert report["state"] == "succeeded"
    assert report["shards_done"] == report["shards_total"] > 0
    assert report["samples_done"] >= 50000
    run_dirs = list((tmp_path / "w" / "dlrm_recurring_retrain").glob("*/run"))
    assert len(run_dirs) == 1 and (run_dirs[0] / "report.json").exists()
    assert "Pausing task as DEFERRED" in out  # the train step really deferred
