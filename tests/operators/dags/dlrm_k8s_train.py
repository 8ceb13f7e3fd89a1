"""A plan → train DAG for the Kubernetes test: plan ``small.yaml``, then train it with
``backend.kind: kubernetes`` on that plan (the job master runs as a Kubernetes Job, the plan
in its ConfigMap; the task defers on the trigger that watches it through the API). The
example DAG's profile step runs trials on the Airflow worker, which is left out here.

Params: ``overrides`` (spec overrides, the backend's among them), ``poll_interval``. The train
task reads the ``dlrover_default`` connection (none: the spec as is); its history store goes
to the master in a Secret the Job owns."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from dlrover_rm.operators.operators import DLRoverPlanOperator, DLRoverTrainOperator

SPEC = str(Path(__file__).resolve().parents[3] / "pipelines" / "specs" / "small.yaml")

with DAG(
    dag_id="dlrm_k8s_train",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    params={"overrides": Param([], type="array", items={"type": "string"})},
) as dag:
    plan = DLRoverPlanOperator(
        task_id="plan",
        spec=SPEC,
        overrides=r"{{ params.overrides | join('\n') }}",
        history="none",
        dlrover_conn_id=None,
    )
    train = DLRoverTrainOperator(
        task_id="train",
        spec=SPEC,
        overrides=r"{{ params.overrides | join('\n') }}",
        plan=plan.output,
        poll_interval=1.0,
        dlrover_conn_id="dlrover_default",
    )
    plan >> train
