"""DLRoverKubernetesJobTrigger against the test API server and the Job controller stand-in
(no kubelet: the test plays the master pod, writing its log and ending it): serialize round
trip, the master's log lines logged once each, exactly one event with the parsed report, a
failed Job (backoff limit), a cancelled job, and on_kill cancelling."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

import structlog
from _k8s import K8S_OVERRIDES, NAMESPACE, SPEC, Cluster, cluster, until
from kubernetes import client as k8s

from dlrover_core import api
from dlrover_rm.operators.triggers import DLRoverKubernetesJobTrigger

JOB = "small"


def _events(trigger: DLRoverKubernetesJobTrigger, timeout_s: float = 60) -> list[Any]:
    async def collect() -> list[Any]:
        return [e async for e in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=timeout_s))


def _master_pods(c: Cluster) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in c.pods()
        if (p["metadata"].get("labels") or {}).get("dlrover-rm/role") == "master"
    ]


def _end_pod(c: Cluster, name: str, phase: str) -> None:
    k8s.CoreV1Api(c.server.client()).patch_namespaced_pod_status(
        name, NAMESPACE, {"status": {"phase": phase}}, _preload_content=False
    )


def _play_master(c: Cluster, log_dir: Path, lines: list[str], phase: str) -> Callable[[], None]:
    """A thread that waits for the master pod, writes ``lines`` to its log one by one, then
    ends the pod in ``phase``."""

    def run() -> None:
        (pod,) = until(lambda: _master_pods(c), 30, "a master pod")
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{pod}.log", "a") as f:
            for line in lines:
                f.write(line + "\n")
                f.flush()
                threading.Event().wait(0.05)
        _end_pod(c, pod, phase)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t.join


def test_serialize_round_trips() -> None:
    t = DLRoverKubernetesJobTrigger("j", "ns", 3.5, start_timeout=9, outage_s=7)
    path, kwargs = t.serialize()
    mod, _, name = path.rpartition(".")
    cls = getattr(__import__(mod, fromlist=[name]), name)
    assert cls is DLRoverKubernetesJobTrigger
    assert cls(**kwargs).serialize() == (path, kwargs)
    json.dumps(kwargs)  # the triggerer stores the kwargs


def test_streams_the_master_log_once_and_yields_one_event(tmp_path: Path) -> None:
    report = {"job": JOB, "state": "succeeded", "failure": None, "auc": 0.71, "wall_s": 3.0}
    lines = [f"progress {i}" for i in range(20)] + [api.report_line(report)]
    with cluster(tmp_path, run_pods=False) as c:
        api.submit(SPEC, overrides=K8S_OVERRIDES)
        join = _play_master(c, tmp_path / "logs", lines, "Succeeded")
        with structlog.testing.capture_logs() as logs:
            (ev,) = _events(DLRoverKubernetesJobTrigger(JOB, NAMESPACE, 0.05))
        join()
        assert c.job_objects()[0]["status"]["succeeded"] == 1
    assert ev.payload["status"] == "succeeded"
    assert ev.payload["report"] == report
    assert (ev.payload["job"], ev.payload["namespace"]) == (JOB, NAMESPACE)
    streamed = [str(e["event"]) for e in logs if "progress" in str(e.get("event"))]
    assert len(streamed) == 20 and len(set(streamed)) == 20, streamed  # each line once
    assert all(" | progress " in s for s in streamed)


def test_a_failed_job_fails_with_the_master_failure(tmp_path: Path) -> None:
    report = {"job": JOB, "state": "failed", "failure": "data: every line malformed"}
    with cluster(tmp_path, run_pods=False, interval_s=0.05) as c:
        api.submit(SPEC, overrides=[*K8S_OVERRIDES])
        stop = threading.Event()

        def fail_every_master() -> None:  # the Job retries the master up to backoffLimit
            ended: set[str] = set()
            while not stop.is_set():
                for pod in _master_pods(c):
                    if pod not in ended:
                        (tmp_path / "logs").mkdir(exist_ok=True)
                        (tmp_path / "logs" / f"{pod}.log").write_text(
                            api.report_line(report) + "\n"
                        )
                        _end_pod(c, pod, "Failed")
                        ended.add(pod)
                stop.wait(0.05)

        t = threading.Thread(target=fail_every_master, daemon=True)
        t.start()
        try:
            (ev,) = _events(DLRoverKubernetesJobTrigger(JOB, NAMESPACE, 0.05))
        finally:
            stop.set()
            t.join()
        (job,) = c.job_objects()
        assert job["status"]["failed"] == 7  # backoffLimit 6: the 7th failure fails the Job
        assert {x["type"] for x in job["status"]["conditions"]} >= {"Failed"}
    assert ev.payload["status"] == "failed"
    assert "every line malformed" in ev.payload["message"]


@pytest.mark.parametrize(
    ("exit_code", "disrupted", "masters"),
    [(1, False, 1), (2, False, 1), (3, False, 7), (1, True, 2), (3, True, 8)],
)
def test_the_master_failure_policy(
    tmp_path: Path, exit_code: int, disrupted: bool, masters: int
) -> None:
    """A master that failed the job (exit 1) or its input (2) fails the Job at once; a bug
    (3) is retried up to backoffLimit; a disrupted master pod (eviction) is not counted."""
    report = {"job": JOB, "state": "failed", "failure": "the data is unusable"}
    with cluster(tmp_path, run_pods=False, interval_s=0.05) as c:
        api.submit(SPEC, overrides=K8S_OVERRIDES)
        core = k8s.CoreV1Api(c.server.client())
        stop = threading.Event()

        def end_masters() -> None:
            ended: set[str] = set()
            while not stop.is_set():
                for pod in _master_pods(c):
                    if pod in ended:
                        continue
                    (tmp_path / "logs").mkdir(exist_ok=True)
                    (tmp_path / "logs" / f"{pod}.log").write_text(api.report_line(report) + "\n")
                    first = not ended
                    term = {"terminated": {"exitCode": exit_code, "reason": "Error"}}
                    status: dict[str, Any] = {
                        "phase": "Failed",
                        "containerStatuses": [{"name": "master", "state": term}],
                    }
                    if disrupted and first:  # evicted: then it fails for real, every time
                        status["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
                    core.patch_namespaced_pod_status(
                        pod, NAMESPACE, {"status": status}, _preload_content=False
                    )
                    ended.add(pod)
                stop.wait(0.05)

        t = threading.Thread(target=end_masters, daemon=True)
        t.start()
        try:
            (ev,) = _events(DLRoverKubernetesJobTrigger(JOB, NAMESPACE, 0.05))
        finally:
            stop.set()
            t.join()
        (job,) = c.job_objects()
    assert ev.payload["status"] == "failed"
    assert "the data is unusable" in ev.payload["message"]
    assert job["status"]["failed"] == masters, job["status"]
    reason = "BackoffLimitExceeded" if exit_code == 3 else "PodFailurePolicy"
    assert {x["reason"] for x in job["status"]["conditions"]} == {reason}


def test_a_cancelled_job_ends_the_wait(tmp_path: Path) -> None:
    with cluster(tmp_path, run_pods=False) as c:
        api.submit(SPEC, overrides=K8S_OVERRIDES)
        until(lambda: _master_pods(c), 30, "a master pod")
        timer = threading.Timer(0.5, api.cancel, (JOB, NAMESPACE))
        timer.start()
        (ev,) = _events(DLRoverKubernetesJobTrigger(JOB, NAMESPACE, 0.05, start_timeout=60))
        timer.join()
    assert ev.payload["status"] == "failed"
    assert "is gone" in ev.payload["message"]


def test_on_kill_cancels_the_job(tmp_path: Path) -> None:
    with cluster(tmp_path, run_pods=False) as c:
        api.submit(SPEC, overrides=K8S_OVERRIDES)
        until(lambda: _master_pods(c), 30, "a master pod")
        asyncio.run(DLRoverKubernetesJobTrigger(JOB, NAMESPACE).on_kill())
        assert c.job_objects() == []
        assert c.pods() == []  # the master pod went with its Job (owner reference)
        assert c.server.api.objects_of("secrets", NAMESPACE) == []
        asyncio.run(DLRoverKubernetesJobTrigger(JOB, NAMESPACE).on_kill())  # idempotent


def test_never_started_fails(tmp_path: Path) -> None:
    with cluster(tmp_path, run_pods=False) as c:
        c.jobs.stop()  # no Job controller: the Job never gets a pod
        api.submit(SPEC, overrides=K8S_OVERRIDES)
        (ev,) = _events(DLRoverKubernetesJobTrigger(JOB, NAMESPACE, 0.05, start_timeout=0.3))
    assert ev.payload["status"] == "failed"
    assert "no master" in ev.payload["message"]
