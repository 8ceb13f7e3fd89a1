"""DLRoverTrainOperator on the Kubernetes backend, without training (the test API server and
the Job controller stand-in, no kubelet): execute submits and defers to the Kubernetes
trigger; execute_complete returns the report (model_dir in XCom) or fails naming the job;
on_kill of a fresh operator instance (another worker) cancels by the spec's job name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

from _k8s import K8S_OVERRIDES, NAMESPACE, SPEC, cluster, until
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from dlrover_rm.operators.operators import DLRoverTrainOperator
from dlrover_rm.operators.triggers import DLRoverJobTrigger, DLRoverKubernetesJobTrigger


class _TI:
    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def _op(**kw: Any) -> DLRoverTrainOperator:
    kw.setdefault("overrides", K8S_OVERRIDES)
    return DLRoverTrainOperator(task_id="train", spec=SPEC, dlrover_conn_id=None, **kw)


def test_execute_submits_and_defers_then_a_fresh_instance_cancels(tmp_path: Path) -> None:
    with cluster(tmp_path, run_pods=False) as c:
        with pytest.raises(TaskDeferred) as d:
            _op(poll_interval=2.5).execute({})  # type: ignore[arg-type]
        trig = d.value.trigger
        assert isinstance(trig, DLRoverKubernetesJobTrigger)
        assert (trig.job, trig.namespace, trig.poll_interval) == ("small", NAMESPACE, 2.5)
        (job,) = c.job_objects()
        assert job["metadata"]["name"] == "small-master"
        until(lambda: c.pods(), 30, "the master pod")
        _op().on_kill()  # another process: it knows only the spec
        assert c.job_objects() == [] and c.pods() == []


def test_the_plan_travels_to_the_master(tmp_path: Path) -> None:
    from dlrover_core import api

    plan = api.plan(SPEC, overrides=K8S_OVERRIDES, history="none")
    with cluster(tmp_path, run_pods=False) as c:
        with pytest.raises(TaskDeferred):
            _op(plan=json.dumps(plan)).execute({})  # type: ignore[arg-type]
        (cm,) = c.server.api.objects_of("configmaps", NAMESPACE)
        (job,) = c.job_objects()
    sent = json.loads(cm["data"]["plan.json"])
    assert sent["workers"] == plan["workers"] and sent["ps"] == plan["ps"]
    assert sent["stage"] == plan["stage"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][-2:] == ["--plan", "/etc/dlrover-rm/plan.json"]


def test_a_bad_plan_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    from dlrover_core.errors import InputError

    with cluster(tmp_path, run_pods=False) as c:
        with pytest.raises(InputError, match="does not exist"):
            _op(plan=str(tmp_path / "nope.json")).execute({})  # type: ignore[arg-type]
        assert c.job_objects() == []


def test_local_backend_still_runs_locally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlrover_core import api

    def no_submit(*a: Any, **k: Any) -> None:
        raise AssertionError("the local backend must not submit")

    monkeypatch.setattr(api, "submit", no_submit)
    op = _op(overrides=["data.rows=2000"], run_dir=str(tmp_path / "run"))
    with pytest.raises(TaskDeferred) as d:
        op.execute({})  # type: ignore[arg-type]
    assert isinstance(d.value.trigger, DLRoverJobTrigger)
    op.on_kill()  # stops the local process it started


def test_execute_complete_on_kubernetes() -> None:
    op = _op()
    ti = _TI()
    report = {"state": "succeeded", "model_dir": "/state/runs/small/model", "auc": 0.7}
    event = {"status": "succeeded", "job": "small", "namespace": NAMESPACE, "report": report}
    assert op.execute_complete({"ti": ti}, event) == report  # type: ignore[arg-type]
    assert ti.pushed == {"model_dir": "/state/runs/small/model"}
    failed = {
        "status": "failed",
        "job": "small",
        "namespace": NAMESPACE,
        "report": {"state": "failed", "failure": "PS ps-0 OOM-killed 3 times"},
        "message": "job small failed",
    }
    with pytest.raises(AirflowException, match=r"small in namespace dlrover failed: PS ps-0 OOM"):
        op.execute_complete({"ti": ti}, failed)  # type: ignore[arg-type]
    gone = {**failed, "report": None, "message": "job small in namespace dlrover is gone"}
    with pytest.raises(AirflowException, match="is gone"):
        op.execute_complete({"ti": ti}, gone)  # type: ignore[arg-type]


def test_execute_complete_with_a_state_url_gives_the_models_url() -> None:
    """No claim (backend.state_url): the master wrote the model to the URL; XCom names it
    there (model_dir and model_url), and a model that did not get there fails the task."""
    op = _op()
    ti = _TI()
    url = "s3://bucket/dlrover/runs/small"
    report = {
        "state": "succeeded",
        "model_dir": "/var/lib/dlrover-rm/runs/small/model",  # the master pod's scratch
        "run_url": url,
        "model_url": f"{url}/model",
    }
    event = {"status": "succeeded", "job": "small", "namespace": NAMESPACE, "report": report}
    out = op.execute_complete({"ti": ti}, event)  # type: ignore[arg-type]
    assert out["model_dir"] == f"{url}/model"
    assert ti.pushed == {"model_dir": f"{url}/model", "model_url": f"{url}/model"}
    lost = {
        **report,
        "model_url": None,
        "export_error": f"the model and report could not be written to {url}: denied",
    }
    with pytest.raises(AirflowException, match=r"its model is not at s3://.*: the model and"):
        op.execute_complete({"ti": _TI()}, {**event, "report": lost})  # type: ignore[arg-type]


def test_the_connections_history_goes_to_the_master_in_a_secret_the_job_owns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import base64

    import dlrover_rm.operators.operators as ops

    password = "s3cret-in-airflow"
    url = f"postgresql://user:{password}@db.example/hist"
    monkeypatch.setattr(ops.DLRoverHook, "history_url", property(lambda self: url))
    with cluster(tmp_path, run_pods=False) as c, caplog.at_level("INFO"):
        with pytest.raises(TaskDeferred):
            _op().execute({})  # type: ignore[arg-type]
        (job,) = c.job_objects()
        secrets = {s["metadata"]["name"]: s for s in c.server.api.objects_of("secrets", NAMESPACE)}
        (cm,) = c.server.api.objects_of("configmaps", NAMESPACE)
        _op().on_kill()
        left = [s["metadata"]["name"] for s in c.server.api.objects_of("secrets", NAMESPACE)]
    hist = secrets["small-history"]
    assert base64.b64decode(hist["data"]["url"]).decode() == url
    assert [(o["kind"], o["uid"]) for o in hist["metadata"]["ownerReferences"]] == [
        ("Job", job["metadata"]["uid"])
    ]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DLROVER_RM_HISTORY"]["valueFrom"] == {
        "secretKeyRef": {"name": "small-history", "key": "url"}
    }
    for where, blob in (("the Job", job), ("the ConfigMap", cm), ("the task log", caplog.text)):
        assert password not in json.dumps(blob), where
    assert "small-history" in caplog.text  # the submit line names what was created
    assert left == []  # cancelled: the token and the history Secret are gone
