"""Example Airflow DAG: the recurring DLRM retrain, profile → plan → train, every day.

Each run measures (short real trials), plans from what it measured (and the run history, via
the ``dlrover_default`` connection when one exists), then trains on that plan; the train step
defers while the job runs, so it holds no worker slot.

Params (``dag.test(run_conf=...)``, ``airflow dags trigger --conf``):
- ``spec``: the job spec (default: ``pipelines/specs/small.yaml``);
- ``overrides``: spec overrides, ``["data.rows=50000", ...]``;
- ``n_configs``: profiling trials (each ~10 s);
- ``work_dir``: where samples, plan and the run directory go (default ``/tmp/dlrover-rm``);
- ``min_auc`` / ``max_auc_drop``: the quality gate (default 0.55 / 0.1): a model below it, or
  that far below the last good one, ends the train task ``rejected`` and publishes nothing;
- ``init_from``: the model the run starts from (default ``last``: the newest model of the
  job's signature in the run history, yesterday's; a fresh start, said in the task log and
  the report, when there is none; ``""``: the spec's own setting, a fresh start by default).
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from dlrover_rm.operators.operators import (
    DLRoverPlanOperator,
    DLRoverProfileOperator,
    DLRoverTrainOperator,
)

SPEC = str(Path(__file__).resolve().parent / "specs" / "small.yaml")
RUN = "{{ params.work_dir }}/{{ dag.dag_id }}/{{ safe(run_id) }}"
OVERRIDES = r"{{ params.overrides | join('\n') }}"
# the quality gate: a model below min_auc, or more than max_auc_drop below the previous good
# model, ends the train task "rejected" (kept under rejected/, no model_url XCom)
GATE = "\nquality.min_auc={{ params.min_auc }}\nquality.max_auc_drop={{ params.max_auc_drop }}"

with DAG(
    dag_id="dlrm_recurring_retrain",
    description="Recurring DLRM retrain, auto-sized by DLRover-RM: profile → plan → train",
    schedule="@daily",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["dlrover-rm", "dlrm"],
    user_defined_macros={"safe": lambda s: re.sub(r"[^A-Za-z0-9_.-]", "_", str(s))},
    params={
        "spec": Param(SPEC, type="string"),
        "overrides": Param([], type="array", items={"type": "string"}),
        "n_configs": Param(6, type="integer", minimum=1),
        "work_dir": Param("/tmp/dlrover-rm", type="string"),
        "init_from": Param("last", type="string"),
        "min_auc": Param(0.55, type="number", minimum=0, maximum=1),
        "max_auc_drop": Param(0.1, type="number", minimum=0, maximum=1),
    },
) as dag:
    profile = DLRoverProfileOperator(
        task_id="profile",
        spec="{{ params.spec }}",
        overrides=OVERRIDES,
        n_configs="{{ params.n_configs }}",
        out=f"{RUN}/samples.csv",
    )
    plan = DLRoverPlanOperator(
        task_id="plan",
        spec="{{ params.spec }}",
        overrides=OVERRIDES,
        samples=profile.output,
        out=f"{RUN}/plan.json",
    )
    train = DLRoverTrainOperator(
        task_id="train",
        spec="{{ params.spec }}",
        plan=plan.output,
        overrides=OVERRIDES + GATE,
        run_dir=f"{RUN}/run",
        poll_interval=2.0,
        init_from="{{ params.init_from or None }}",
    )
    profile >> plan >> train
