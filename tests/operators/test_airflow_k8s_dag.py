"""The Airflow train step on the Kubernetes backend, end to end against the test harness (the
test API server, the Job controller and kubelet stand-ins, all in this process; real
processes for the master and its nodes):

- a DAG under ``dag.test()`` (a subprocess with its own AIRFLOW_HOME and a KUBECONFIG pointing
  at the test API server) trains ``small.yaml``: the operator submits the master Job, defers,
  the trigger streams the master's log and returns its report; nothing is left running;
- a job cancelled through the operator's ``on_kill`` while it trains leaves no Job, no pod
  and no process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("airflow")

from _k8s import K8S_OVERRIDES, NAMESPACE, SLACK, SPEC, cluster, until
from airflow.sdk.exceptions import TaskDeferred
from test_airflow_dag import RUNNER, _airflow_env

from dlrover_core import api
from dlrover_rm.operators.operators import DLRoverTrainOperator
from dlrover_rm.operators.triggers import DLRoverKubernetesJobTrigger

pytestmark = pytest.mark.slow
DAGS = Path(__file__).resolve().parent / "dags"
SMALL_RUN = ["data.rows=20000", "data.eval_rows=2000"]


@pytest.mark.timeout(600)
def test_dag_trains_on_kubernetes_through_the_api(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    with cluster(tmp_path / "k8s") as c:
        env = _airflow_env(home)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.update(AIRFLOW__CORE__DAGS_FOLDER=str(DAGS), KUBECONFIG=str(c.kubeconfig))
        # the connection's history store: the master gets it from a Secret the Job owns (the
        # kubelet's own default store is another file, so a record here came that way)
        conn_store = f"sqlite:///{tmp_path / 'connection-history.db'}"
        env["AIRFLOW_CONN_DLROVER_DEFAULT"] = json.dumps(
            {"conn_type": "dlrover", "extra": {"history_url": conn_store}}
        )
        mig = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert mig.returncode == 0, mig.stdout[-3000:] + mig.stderr[-3000:]
        conf = {"overrides": [*K8S_OVERRIDES, *SLACK, *SMALL_RUN]}
        t0 = time.monotonic()
        run = subprocess.run(
            [sys.executable, str(RUNNER), json.dumps(conf), str(DAGS / "dlrm_k8s_train.py")],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=480,
        )  # fmt: skip
        wall = time.monotonic() - t0
        out = run.stdout + run.stderr
        assert c.kubelet is not None
        live, procs = c.live_pods(), dict(c.kubelet.procs)
        masters = [
            p for p in c.pods() if p["metadata"]["labels"].get("dlrover-rm/role") == "master"
        ]
        (job,) = c.job_objects()
        (cm,) = c.server.api.objects_of("configmaps", NAMESPACE)
        secrets = {s["metadata"]["name"]: s for s in c.server.api.objects_of("secrets", NAMESPACE)}
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert run.returncode == 0 and lines, out[-6000:]
    res = json.loads(lines[-1].removeprefix("RESULT "))
    assert res["tis"] == {"plan": "success", "train": "success"}, out[-6000:]
    report = res["report"]
    assert report["state"] == "succeeded", report
    assert report["shards_done"] == report["shards_total"] > 0
    assert report["samples_done"] == report["samples_total"] >= 20000
    assert report["shards_completed_twice"] == report["shards_lost"] == 0
    assert report["auc"] is not None and report["auc"] > 0.6, report["auc"]
    # the model is on the job's state volume (the stand-in maps the claim to a local dir)
    assert res["model_dir"] == report["model_dir"]
    assert (Path(report["model_dir"]) / "model_card.json").exists()
    assert "Pausing task as DEFERRED" in out  # the train step really deferred
    assert "submitted job small to namespace dlrover" in out
    assert f"{masters[0]['metadata']['name']} | job small succeeded" in out  # the master's log
    # the plan task's plan travelled to the master in the ConfigMap, and it trained on it
    plan = json.loads(cm["data"]["plan.json"])
    assert plan["stage"] == "cold_start" and plan["workers"]["count"] >= 1, plan
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--plan", "/etc/dlrover-rm/plan.json"]
    # the master's progress records name the plan it runs
    assert re.search(r"plan:? cold_start", out), out[-3000:]
    # the Job completed with one master pod; every node pod was deleted by the master
    assert [c["type"] for c in job["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert len(masters) == 1 and live == [] and procs == {}, (live, procs)
    # the run is recorded in the connection's store, through the Job's history Secret
    (owner,) = secrets["small-history"]["metadata"]["ownerReferences"]
    assert owner["uid"] == job["metadata"]["uid"]
    env_refs = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env_refs["DLROVER_RM_HISTORY"]["valueFrom"]["secretKeyRef"]["name"] == "small-history"
    from dlrover_core.history.store import HistoryStore

    store = HistoryStore(conn_store)
    try:
        runs = store.runs(limit=10)
    finally:
        store.close()
    assert [r["job"] for r in runs] == ["small"] and report["history_run_id"] == runs[0]["id"]
    print(f"dag.test() on Kubernetes: {wall:.0f} s, auc {report['auc']:.4f}", file=sys.stderr)


@pytest.mark.timeout(420)
def test_on_kill_while_training_leaves_nothing_running(tmp_path: Path) -> None:
    with cluster(tmp_path / "k8s") as c:
        assert c.kubelet is not None
        op = DLRoverTrainOperator(
            task_id="train",
            spec=SPEC,
            overrides=[*K8S_OVERRIDES, *SLACK, "data.rows=400000"],
            dlrover_conn_id=None,
            poll_interval=0.5,
        )
        with pytest.raises(TaskDeferred) as deferred:
            op.execute({})  # type: ignore[arg-type]
        trigger = deferred.value.trigger
        assert isinstance(trigger, DLRoverKubernetesJobTrigger)
        assert (trigger.job, trigger.namespace) == ("small", NAMESPACE)

        def training() -> bool:
            st = api.job_status("small", NAMESPACE)
            running = [n for n in st["nodes"] if n["phase"] == "Running"]
            assert c.kubelet is not None
            return st["state"] == "running" and len(running) >= 2 and len(c.kubelet.procs) >= 3

        until(training, 240, "the master and its PS and worker pods running")
        assert c.kubelet is not None
        pids = [p.popen.pid for p in c.kubelet.procs.values()]  # master, PS, worker
        tree = [q for pid in pids for q in _tree(pid)]

        op.on_kill()

        assert c.job_objects() == []
        until(lambda: c.pods() == [], 30, "every pod gone")
        until(lambda: c.kubelet is not None and c.kubelet.procs == {}, 30, "no pod process")
        until(lambda: not [q for q in tree if _alive(q)], 30, "every process of the job ended")
        assert c.server.api.objects_of("services", NAMESPACE) == []
        assert c.server.api.objects_of("secrets", NAMESPACE) == []


def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
