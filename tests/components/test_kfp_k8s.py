"""The KFP pipeline's Kubernetes shape: the train task submits the job's master as a
Kubernetes Job and follows it through the API (its pod sized for that alone), the run
history's URL comes from a Secret (never a pipeline parameter, a log line or the master's
command line), and the whole pipeline runs under kfp.local against the test harness of the
Airflow tests (the test API server, the Job controller and kubelet stand-ins:
``tests/operators/_k8s.py``)."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("kfp")
pytest.importorskip("kfp.kubernetes")

_OPS = str(Path(__file__).resolve().parents[1] / "operators")
if _OPS not in sys.path:
    sys.path.append(_OPS)

from _k8s import K8S_OVERRIDES, NAMESPACE, SLACK, cluster  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from dlrover_core import api  # noqa: E402
from dlrover_core.runtime.backends import submit as k8s_submit  # noqa: E402
from pipelines import kfp_recurring_retrain as pipeline  # noqa: E402

COMMITTED = pipeline.COMPILED_K8S
PASSWORD = "s3cr3t-Pa55"


def _docs(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    spec, platform = yaml.safe_load_all(path.read_text())
    return spec, platform


def test_committed_k8s_yaml_is_fresh(tmp_path: Path) -> None:
    out = pipeline.compile_pipeline(tmp_path / "p.yaml", kubernetes=True)
    assert out.read_text() == COMMITTED.read_text(), (
        "pipelines/kfp_recurring_retrain_k8s.yaml is stale; run `python "
        "pipelines/kfp_recurring_retrain.py --kubernetes --compile "
        "pipelines/kfp_recurring_retrain_k8s.yaml`"
    )


def test_k8s_train_task_is_sized_for_the_submitter_with_history_from_a_secret() -> None:
    doc, platform = _docs(COMMITTED)
    res = doc["deploymentSpec"]["executors"]["exec-dlrover-train"]["container"]["resources"]
    # the train pod hosts neither the master nor a node: a fixed, small size (not the plan's)
    assert (res["resourceCpuRequest"], res["resourceCpuLimit"]) == ("250m", "250m")
    assert (res["resourceMemoryRequest"], res["resourceMemoryLimit"]) == ("512Mi", "512Mi")
    assert api.SUBMITTER_RESOURCES.cpu_millicores == 250
    assert api.SUBMITTER_RESOURCES.memory_mib == 512
    ex = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    # warm start: the plan step reads the store from the Secret (optional: cold without one)
    (sec,) = ex["exec-dlrover-plan"]["secretAsEnv"]
    assert sec["keyToEnv"] == [{"envVar": "DLROVER_RM_HISTORY", "secretKey": "url"}]
    assert sec["secretNameParameter"] == {"componentInputParameter": "history_secret"}
    # the train step mounts the job's state claim where the master writes the run
    (pvc,) = ex["exec-dlrover-train"]["pvcMount"]
    assert pvc["mountPath"] == "/var/lib/dlrover-rm"
    assert pvc["pvcNameParameter"] == {"componentInputParameter": "state_pvc"}
    # no pipeline parameter carries a URL: the history is a Secret's name
    params = doc["root"]["inputDefinitions"]["parameters"]
    assert "history" not in params and params["history_secret"]["defaultValue"]
    assert "://" not in json.dumps({k: v for k, v in params.items() if k != "spec_yaml"})
    tasks = doc["root"]["dag"]["tasks"]
    train_params = tasks["dlrover-train"]["inputs"]["parameters"]
    assert train_params["history_secret"] == {"componentInputParameter": "history_secret"}
    assert train_params["run_id"] == {"runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}}
    assert doc["root"]["inputDefinitions"]["parameters"]["overrides"]["defaultValue"][0] == (
        "backend.kind=kubernetes"
    )
    # the local shape keeps its plan-sized train pod and has no platform section
    assert len(list(yaml.safe_load_all(pipeline.COMPILED.read_text()))) == 1


@pytest.mark.parametrize(
    ("logs", "logged", "final", "lines", "counts"),
    [
        ({"m-0": "a\nb\n"}, {}, False, [("m-0", "a"), ("m-0", "b")], {"m-0": 2}),
        ({"m-0": "a\nb"}, {}, False, [("m-0", "a")], {"m-0": 1}),  # b is still being written
        ({"m-0": "a\nb"}, {"m-0": 1}, True, [("m-0", "b")], {"m-0": 2}),  # ended: b is done
        ({"m-0": "a\n\nc\n"}, {"m-0": 1}, False, [("m-0", "c")], {"m-0": 3}),  # blank skipped
        ({"m-0": "a\n", "m-1": "x\n"}, {"m-0": 1}, False, [("m-1", "x")], {"m-0": 1, "m-1": 1}),
    ],
)
def test_new_log_lines(
    logs: dict[str, str],
    logged: dict[str, int],
    final: bool,
    lines: list[tuple[str, str]],
    counts: dict[str, int],
) -> None:
    got, seen = k8s_submit.new_log_lines(logs, logged, final)
    assert (got, seen) == (lines, counts)


def test_job_outcome_reads_the_report_line() -> None:
    st = {"job": "j", "namespace": "n", "state": "running", "master": {"failed_pods": 0}}
    rep = api.report_line({"job": "j", "state": "succeeded", "auc": 0.75})
    assert k8s_submit.job_outcome(st, {"m": rep + "\n"}) is None
    assert k8s_submit.job_outcome({**st, "state": "succeeded"}, {"m": "x\n" + rep + "\n"}) == (
        "succeeded",
        "job j in namespace n succeeded",
        {"job": "j", "state": "succeeded", "auc": 0.75},
    )
    failed = {**st, "state": "failed", "master": {"failed_pods": 7}}
    status, msg, report = k8s_submit.job_outcome(failed, {"m": "boom\n"}) or ("", "", None)
    assert (status, report) == ("failed", None)
    assert msg == (
        "job j in namespace n failed: the master Job failed (7 master pod(s) failed); "
        "last log lines: boom"
    )
    line = api.report_line({"job": "j", "state": "failed", "failure": "worker OOM"})
    assert k8s_submit.job_outcome(failed, {"m": line})[1].endswith("failed: worker OOM")  # type: ignore[index]


def test_follow_gives_one_clear_line_when_no_master_starts_or_the_job_is_gone(
    tmp_path: Path,
) -> None:
    spec = pipeline.DEFAULT_SPEC
    with cluster(tmp_path, run_pods=False):  # the Job controller makes the pod; nobody runs it
        gone = api.follow("nope", NAMESPACE, poll_interval=0.1)
        assert gone["status"] == "failed" and "is gone" in gone["message"], gone
        api.submit(yaml.safe_load(spec), overrides=K8S_OVERRIDES, history_url="sqlite:////x.db")
        ev = api.follow("small", NAMESPACE, poll_interval=0.1, start_timeout=1.0)
    assert ev["status"] == "failed"
    assert ev["message"].startswith(
        "no master of job small in namespace dlrover started within 1 s"
    )


def test_submit_puts_the_history_in_a_secret_the_job_owns(tmp_path: Path) -> None:
    url = f"postgresql://dlrover:{PASSWORD}@db.example:5432/hist"
    with cluster(tmp_path, run_pods=False) as c:
        res = api.submit(
            yaml.safe_load(pipeline.DEFAULT_SPEC),
            overrides=[*K8S_OVERRIDES, f"history.url={url}"],  # a spec URL with a password
        )
        assert res["history"] == {"secret": "small-history:url"}
        (job,) = c.job_objects()
        secrets = {s["metadata"]["name"]: s for s in c.server.api.objects_of("secrets", NAMESPACE)}
        (cm,) = c.server.api.objects_of("configmaps", NAMESPACE)
        hist = secrets["small-history"]
        assert base64.b64decode(hist["data"]["url"]).decode() == url
        (owner,) = hist["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "Job",
            "small-master",
            job["metadata"]["uid"],
        )
        env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["DLROVER_RM_HISTORY"]["valueFrom"] == {
            "secretKeyRef": {"name": "small-history", "key": "url"}
        }
        # nowhere in clear but the Secret: the ConfigMap's spec has no URL, nor the Job
        assert PASSWORD not in json.dumps(cm) and PASSWORD not in json.dumps(job)
        assert yaml.safe_load(cm["data"]["spec.yaml"])["history"]["url"] is None
        # garbage-collected with the Job (owner reference)
        k8s.BatchV1Api(c.server.client()).delete_namespaced_job("small-master", NAMESPACE)
        names = [s["metadata"]["name"] for s in c.server.api.objects_of("secrets", NAMESPACE)]
        assert "small-history" not in names, names
        api.cancel("small", NAMESPACE)


def test_a_secret_of_ones_own_is_referenced_and_a_bad_one_refused(tmp_path: Path) -> None:
    from dlrover_core.errors import InputError

    spec = yaml.safe_load(pipeline.DEFAULT_SPEC)
    with pytest.raises(InputError, match=r"--history-secret 'Bad_Name' is not NAME or NAME:KEY"):
        api.submit(spec, overrides=K8S_OVERRIDES, history_secret="Bad_Name")
    with pytest.raises(InputError, match="not both"):
        api.submit(spec, overrides=K8S_OVERRIDES, history_secret="h", history_url="sqlite://")
    with cluster(tmp_path, run_pods=False) as c:
        api.submit(spec, overrides=K8S_OVERRIDES, history_secret="team-history:pg")
        (job,) = c.job_objects()
        assert [s["metadata"]["name"] for s in c.server.api.objects_of("secrets", NAMESPACE)] == [
            "small-token"
        ]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DLROVER_RM_HISTORY"]["valueFrom"]["secretKeyRef"] == {
        "name": "team-history",
        "key": "pg",
    }


def _history_url() -> tuple[str, str, bool]:
    """``(url, secret, real)``: a PostgreSQL URL with a password and the text that must
    never appear in clear. ``$DLROVER_RM_TEST_PG_URL`` when set (a real server: its own
    password, else the test's, which trust auth lets through; the secret is then
    ``:password@``, the URL form, as a short CI password may be a common word), else a URL
    nothing listens on (with ``history.on_error: cold_start`` the master then warns, redacted,
    and plans cold)."""
    real = os.environ.get("DLROVER_RM_TEST_PG_URL")
    if not real:
        return f"postgresql://dlrover:{PASSWORD}@127.0.0.1:9/dlrover", PASSWORD, False
    from sqlalchemy import make_url

    u = make_url(real)
    if u.password is None:
        u = u.set(password=PASSWORD)
        return u.render_as_string(hide_password=False), PASSWORD, True
    return u.render_as_string(hide_password=False), f":{u.password}@", True


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_k8s_pipeline_runs_under_kfp_local(
    tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, secret, real = _history_url()
    # kfp.local ignores the kfp-kubernetes settings: the plan task reads this process's env,
    # as the Secret would give it on a cluster
    monkeypatch.setenv("DLROVER_RM_HISTORY", url)
    with cluster(tmp_path / "k8s") as c:
        assert c.kubelet is not None
        k8s.CoreV1Api(c.server.client()).create_namespaced_secret(
            NAMESPACE,
            {"metadata": {"name": "team-history"}, "stringData": {"url": url}},
        )
        # the train task's mount of the claim: the kubelet's folder for it, so the task (which
        # stages the data-prep step's Dataset there) and the pods see one path
        claim = c.kubelet.root / "pvc" / "dlrover-rm-state"
        claim.mkdir(parents=True, exist_ok=True)
        over = [
            f"backend.namespace={NAMESPACE}",
            "backend.image=registry.example/dlrover-rm:test",
            f"backend.state_mount_path={claim}",
            *SLACK,
            "data.rows=20000",
            "data.eval_rows=2000",
            # no real store: the steps still try the URL (and must redact it), then plan cold
            *([] if real else ["history.on_error=cold_start"]),
        ]
        # two scheduled runs when a real store is there: the second warm-starts from the first
        roots = [tmp_path / "root1", tmp_path / "root2"] if real else [tmp_path / "root1"]
        for root in roots:
            pipeline.run_local(
                overrides=over,
                pipeline_root=str(root),
                kubernetes=True,
                history_secret="team-history",
                state_pvc="dlrover-rm-state",
                poll_interval=0.5,
            )  # kfp.local raises if a task fails
        jobs = sorted(c.job_objects(), key=lambda j: j["metadata"]["creationTimestamp"])
        job = jobs[0]
        cm = next(
            m
            for m in c.server.api.objects_of("configmaps", NAMESPACE)
            if m["metadata"]["name"] == job["metadata"]["name"].removesuffix("-master") + "-spec"
        )
        masters = [
            p for p in c.pods() if p["metadata"]["labels"].get("dlrover-rm/role") == "master"
        ]
        live, procs = c.live_pods(), dict(c.kubelet.procs)
        master_log = "".join(
            (c.kubelet.root / "logs" / f"{p['metadata']['name']}.log").read_text() for p in masters
        )
    log = capfd.readouterr()
    text = log.out + log.err
    (run,) = [p for p in (tmp_path / "root1").iterdir() if p.is_dir()]
    train_out = json.loads((run / "dlrover-train" / "executor_output.json").read_text())
    assert train_out["parameterValues"]["Output"] == "succeeded", text[-5000:]
    # a job of this run's own (the run id's hash in its name), on the plan the plan step made
    name = job["metadata"]["name"]
    assert name.startswith("small-") and name.endswith("-master") and len(name) == 21, name
    plan = json.loads((run / "dlrover-plan" / "plan").read_text())
    assert plan["backend"] == "kubernetes" and plan["train_step"] == {
        "cpu_millicores": 250,
        "memory_mib": 512,
    }
    assert json.loads(cm["data"]["plan.json"])["workers"] == plan["workers"]
    # the master's log streamed into the task's log, and its report came back
    job_name = name.removesuffix("-master")
    (first,) = [p for p in masters if p["metadata"]["labels"]["dlrover-rm/job"] == job_name]
    assert f"{first['metadata']['name']} | job {job_name} succeeded" in text
    report = json.loads((run / "dlrover-train" / "run" / "report.json").read_text())
    assert report["state"] == "succeeded" and report["shards_done"] == report["shards_total"]
    # data in: the data-prep step's Dataset, staged on the claim, read by the job's pods
    staged = claim / "datasets" / job_name / "dataset"
    assert staged.is_file()
    assert report["data"]["files"][0]["path"] == str(staged), report["data"]
    assert report["data"]["records"] == 20000 and report["samples_done"] == 20000
    assert report["auc"] is not None and report["auc"] > 0.6
    (metrics,) = train_out["artifacts"]["metrics"]["artifacts"]
    assert metrics["metadata"]["auc"] == pytest.approx(report["auc"])
    # the model came back from the state volume as the Model artifact
    model_dir = run / "dlrover-train" / "model"
    card = json.loads((model_dir / "model_card.json").read_text())
    assert abs(card["held_out"]["auc"] - report["auc"]) < 0.005
    (model_art,) = train_out["artifacts"]["model"]["artifacts"]
    assert model_art["metadata"]["framework"] == "torch"
    assert (run / "dlrover-train" / "run" / "report.png").stat().st_size > 1000
    # the history: from the Secret into the master's env; the password nowhere in clear
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DLROVER_RM_HISTORY"]["valueFrom"]["secretKeyRef"] == {
        "name": "team-history",
        "key": "url",
    }
    for where, blob in (
        ("the task logs", text),
        ("the master's log", master_log),
        ("the master Job", json.dumps(job)),
        ("the ConfigMap", json.dumps(cm)),
        ("the report", json.dumps(report)),
        ("the plan", json.dumps(plan)),
    ):
        assert secret not in blob, f"the history password is in {where}"
    if real:  # the runs were recorded in the store the Secret names; the second read the first
        from dlrover_core.history.store import HistoryStore

        assert len(jobs) == 2 and report["history_run_id"] is not None
        store = HistoryStore(url)
        try:
            recorded = {r["job"] for r in store.runs(limit=50)}
        finally:
            store.close()
        second = jobs[1]["metadata"]["name"].removesuffix("-master")
        assert {job_name, second} <= recorded, recorded
        (run2,) = [p for p in (tmp_path / "root2").iterdir() if p.is_dir()]
        plan2 = json.loads((run2 / "dlrover-plan" / "plan").read_text())
        assert plan2["history"]["records"] >= 1, plan2["history"]
        assert plan2["history"]["store"].startswith("postgresql://dlrover:***@"), plan2["history"]
        assert secret not in json.dumps(plan2)
        print(f"second run's plan: {plan2['stage']}, {plan2['history']}", file=sys.stderr)
    else:  # the master tried the store it read from the Secret (redacted in its warning)
        assert "dlrover:***@127.0.0.1:9" in master_log, master_log[-3000:]
    assert live == [] and procs == {}, (live, procs)


def test_a_retried_step_follows_its_job_instead_of_submitting_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = yaml.safe_load(pipeline.DEFAULT_SPEC)
    with cluster(tmp_path, run_pods=False) as c, caplog.at_level("INFO"):
        api.submit(spec, overrides=K8S_OVERRIDES)
        uid = c.job_objects()[0]["metadata"]["uid"]
        # the retried step: the same job name; nobody runs the master pod here
        report = api.submit_and_follow(
            spec, overrides=K8S_OVERRIDES, poll_interval=0.1, start_timeout=1.0
        )
        (job,) = c.job_objects()
    assert job["metadata"]["uid"] == uid  # not submitted again
    assert "job small is already submitted in namespace dlrover: following it" in caplog.text
    assert report["state"] == "failed" and (report["job"], report["namespace"]) == (
        "small",
        NAMESPACE,
    )
    assert report["failure"].startswith("no master of job small in namespace dlrover started")
