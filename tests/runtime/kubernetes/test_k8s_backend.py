"""KubernetesBackend against the test API server (kmock, extended): the protocol's contract
without a kubelet. Pod statuses are written the way a kubelet writes them (the status
subresource), from recorded shapes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import kmock
import pytest
from apiserver import ApiServerThread
from conftest import FAST_RETRY, JOB, NAMESPACE
from kubernetes import client as k8s

from dlrover_core.errors import InputError
from dlrover_core.faults.classify import ExitClass
from dlrover_core.runtime.backends.base import Backend, NodeExit, NodeSpec
from dlrover_core.runtime.backends.kubernetes import (
    KubernetesBackend,
    KubernetesUnavailableError,
    RetryPolicy,
    node_to_pod,
)
from dlrover_core.types import NodeResources, Role

MakeBackend = Callable[..., KubernetesBackend]


def _spec(role: Role = Role.WORKER, node_id: int = 0, incarnation: int = 0, **kw: Any) -> NodeSpec:
    return NodeSpec(
        role,
        node_id,
        incarnation,
        kw.pop("resources", NodeResources(1000, 1024)),
        ["dlrover-rm", "node", role.value],
        **kw,
    )


def _set_status(srv: ApiServerThread, name: str, status: dict[str, Any]) -> None:
    k8s.CoreV1Api(srv.client()).patch_namespaced_pod_status(
        name, NAMESPACE, {"status": status}, _preload_content=False
    )


def _terminated(code: int, reason: str) -> dict[str, Any]:
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [
            {
                "name": "node",
                "image": "i",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "reason": reason}},
            }
        ],
    }


def _wait_exits(b: KubernetesBackend, n: int, timeout_s: float = 20.0) -> list[NodeExit]:
    got: list[NodeExit] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += b.poll()
        time.sleep(0.05)
    return got


def _pods(srv: ApiServerThread) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in srv.api.objects_of("pods", NAMESPACE)}


def test_is_a_backend(make_backend: MakeBackend) -> None:
    assert isinstance(make_backend(), Backend)


def test_launch_creates_the_pod(make_backend: MakeBackend, apiserver: ApiServerThread) -> None:
    b = make_backend()
    h = b.launch(_spec(Role.PS, 1, 2))
    assert h.ref == f"{JOB}-ps-1-2"
    pod = _pods(apiserver)[h.ref]
    assert pod["metadata"]["labels"]["dlrover-rm/incarnation"] == "2"
    assert pod["spec"]["containers"][0]["command"] == ["dlrover-rm", "node", "ps"]
    assert b.alive(h)
    with pytest.raises(InputError, match="already running"):
        b.launch(_spec(Role.PS, 1, 2))


def test_each_exit_is_reported_once(make_backend: MakeBackend, apiserver: ApiServerThread) -> None:
    b = make_backend()
    ok, oom = b.launch(_spec(node_id=0)), b.launch(_spec(node_id=1))
    _set_status(apiserver, ok.ref, _terminated(0, "Completed"))
    _set_status(apiserver, oom.ref, _terminated(137, "OOMKilled"))
    got = {e.ref: e for e in _wait_exits(b, 2)}
    assert got[ok.ref].exit_class is ExitClass.SUCCEEDED
    assert got[oom.ref].exit_class is ExitClass.OOM
    assert not got[oom.ref].requested
    b.sync()
    _set_status(apiserver, oom.ref, _terminated(137, "OOMKilled"))  # seen again: not re-reported
    time.sleep(0.3)
    assert b.poll() == []
    assert not b.alive(ok) and not b.alive(oom)


def test_finished_pods_are_cleaned_failed_kept(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend()
    ok, bad = b.launch(_spec(node_id=0)), b.launch(_spec(node_id=1))
    _set_status(apiserver, ok.ref, _terminated(0, "Completed"))
    _set_status(apiserver, bad.ref, _terminated(1, "Error"))
    _wait_exits(b, 2)
    deadline = time.monotonic() + 10
    while ok.ref in _pods(apiserver) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ok.ref not in _pods(apiserver)  # succeeded: deleted
    assert bad.ref in _pods(apiserver)  # failed: kept for `kubectl logs` until the owner goes


def test_stop_and_kill_delete_the_pod_and_report_requested(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend()
    a, c = b.launch(_spec(node_id=0)), b.launch(_spec(node_id=1))
    b.stop(a, grace_s=1)
    b.kill(c)
    got = {e.ref: e for e in _wait_exits(b, 2)}
    assert set(got) == {a.ref, c.ref}
    for e in got.values():
        assert e.requested and e.exit_class is ExitClass.KILLED
    deletes = [r for r in apiserver.api.requests if r.method == kmock.method.DELETE]
    grace = {
        str(r.url.path).rsplit("/", 1)[-1]: r.params.get("gracePeriodSeconds") for r in deletes
    }
    assert grace == {a.ref: "1", c.ref: "0"}
    b.stop(a)  # idempotent on an ended node
    assert b.poll() == []


def test_a_pod_deleted_by_someone_else_is_killed_not_requested(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend()
    h = b.launch(_spec())
    k8s.CoreV1Api(apiserver.client()).delete_namespaced_pod(h.ref, NAMESPACE)
    (e,) = _wait_exits(b, 1)
    assert e.reason == "Deleted" and not e.requested
    assert e.exit_class is ExitClass.KILLED


def test_fatal_waiting_reason_ends_the_node_and_deletes_the_pod(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend()
    h = b.launch(_spec())
    waiting = {
        "name": "node",
        "image": "i",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
    }
    _set_status(apiserver, h.ref, {"phase": "Pending", "containerStatuses": [waiting]})
    (e,) = _wait_exits(b, 1)
    assert e.exit_class is ExitClass.FATAL and e.reason == "ImagePullBackOff"
    deadline = time.monotonic() + 10
    while h.ref in _pods(apiserver) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.ref not in _pods(apiserver)  # it would retry the pull forever


def test_unschedulable_is_pending_until_it_schedules(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    t = [1000.0]
    b = make_backend(clock=lambda: t[0])
    h = b.launch(_spec())
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    _set_status(apiserver, h.ref, {"phase": "Pending", "conditions": [cond]})
    deadline = time.monotonic() + 10
    while b.pending_since(h) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.pending_since(h) == 1000.0
    t[0] = 1500.0
    b.sync()
    assert b.pending_since(h) == 1000.0  # since the first sighting
    assert b.poll() == [] and b.alive(h)
    _set_status(apiserver, h.ref, {"phase": "Running", "conditions": [{**cond, "status": "True"}]})
    b.sync()
    assert b.pending_since(h) is None


def test_adopt_by_pod_name_after_a_master_restart(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    first = make_backend()
    h = first.launch(_spec(Role.PS, 0, 1))
    first._stopping.set()  # the first master dies (its pods stay)
    second = make_backend()
    assert second.adopt(Role.PS, 0, 1, "no-such-pod") is None
    assert second.adopt(Role.PS, 0, 2, h.ref) is None  # another incarnation: not that node
    assert second.adopt(Role.WORKER, 0, 1, h.ref) is None
    other_job = make_backend(job_name="other")
    assert other_job.adopt(Role.PS, 0, 1, h.ref) is None
    adopted = second.adopt(Role.PS, 0, 1, h.ref)
    assert adopted is not None and adopted.ref == h.ref and second.alive(adopted)
    _set_status(apiserver, h.ref, _terminated(143, "Error"))
    (e,) = _wait_exits(second, 1)
    assert e.ref == h.ref and e.exit_class is ExitClass.KILLED
    assert second.adopt(Role.PS, 0, 1, h.ref) is None  # ended: nothing to adopt


@pytest.mark.slow  # over 3 s here: the full tier (make test-all)
def test_watch_resumes_and_relists_on_410(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend(resync_s=30.0)  # only the watch (and a 410) can make it see changes
    h1 = b.launch(_spec(node_id=0))
    deadline = time.monotonic() + 10
    while apiserver.api.watches_served < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    _set_status(apiserver, h1.ref, _terminated(0, "Completed"))
    (e,) = _wait_exits(b, 1, timeout_s=10)  # streamed by the watch, long before a resync
    assert e.ref == h1.ref
    lists = b.relists
    h2 = b.launch(_spec(node_id=1))
    apiserver.api.compact()  # etcd compaction: the watch's resourceVersion is now too old
    b.restart_watch()  # make the watcher resume from its (old) version now
    _set_status(apiserver, h2.ref, _terminated(1, "Error"))
    (e2,) = _wait_exits(b, 1, timeout_s=10)
    assert e2.ref == h2.ref and e2.exit_class is ExitClass.FATAL
    assert b.relists > lists


@pytest.mark.parametrize("status", [409, 429, 500, 503])
def test_transient_api_errors_are_retried(
    make_backend: MakeBackend, apiserver: ApiServerThread, status: int
) -> None:
    b = make_backend()
    apiserver.api.inject(status, method="POST", path="/pods$", times=3)
    h = b.launch(_spec())  # succeeds after three failures
    assert h.ref in _pods(apiserver)
    apiserver.api.inject(status, method="GET", path="/pods$", times=5)  # the watcher's lists
    _set_status(apiserver, h.ref, _terminated(137, "OOMKilled"))
    b.sync()
    (e,) = _wait_exits(b, 1)
    assert e.exit_class is ExitClass.OOM


def test_create_whose_answer_was_lost_is_not_an_error(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend()
    spec = _spec()
    pod = node_to_pod(spec, b.cfg)
    k8s.CoreV1Api(apiserver.client()).create_namespaced_pod(NAMESPACE, pod)  # "the first try"
    h = b.launch(spec)  # 409 AlreadyExists, and it is ours
    assert h.ref == pod.metadata.name


def test_a_foreign_pod_under_our_name_is_refused(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend()
    spec = _spec()
    pod = node_to_pod(spec, b.cfg)
    pod.metadata.labels["dlrover-rm/job"] = "someone-else"
    k8s.CoreV1Api(apiserver.client()).create_namespaced_pod(NAMESPACE, pod)
    with pytest.raises(InputError, match="already exists"):
        b.launch(spec)


def test_a_bounded_outage_surfaces_as_a_clear_error(make_backend: MakeBackend) -> None:
    policy = RetryPolicy(initial_s=0.02, max_s=0.1, outage_s=1.0, request_timeout_s=1.0)
    cfg = k8s.Configuration()
    cfg.host = "http://127.0.0.1:9"  # nothing listens: connection refused
    cfg.retries = False
    b = make_backend(api_client=k8s.ApiClient(cfg), retry=policy)
    t0 = time.monotonic()
    with pytest.raises(KubernetesUnavailableError, match=r"127\.0\.0\.1:9 failed for 1 s") as err:
        b.launch(_spec())
    assert 0.9 <= time.monotonic() - t0 < 10
    assert "raise backend.api_outage_s" in str(err.value)


def test_watcher_outage_surfaces_through_poll(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    policy = RetryPolicy(initial_s=0.02, max_s=0.1, outage_s=1.0, request_timeout_s=2.0)
    b = make_backend(retry=policy, watch=False, resync_s=0.2)
    b.launch(_spec())
    apiserver.api.inject(503, method="GET", times=10_000)
    deadline = time.monotonic() + 15
    with pytest.raises(KubernetesUnavailableError, match="list pods"):
        while time.monotonic() < deadline:
            b.poll()
            time.sleep(0.05)


def test_a_short_outage_does_not_fail_the_job(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend(watch=False, resync_s=0.2)
    h = b.launch(_spec())
    apiserver.api.inject(503, method="GET", times=20)  # ~ a second of 503s, under outage_s
    _set_status(apiserver, h.ref, _terminated(0, "Completed"))
    (e,) = _wait_exits(b, 1)
    assert e.exit_class is ExitClass.SUCCEEDED


def test_resize_in_place(make_backend: MakeBackend, apiserver: ApiServerThread) -> None:
    b = make_backend()
    h = b.launch(_spec(resources=NodeResources(1000, 1024)))
    assert b.resize(h, NodeResources(2500, 1024))
    c = _pods(apiserver)[h.ref]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"cpu": "2500m", "memory": "1024Mi"}
    assert c["resources"]["requests"] == {"cpu": "2500m", "memory": "1024Mi"}
    assert c["command"] == ["dlrover-rm", "node", "worker"]  # only resources changed
    (req,) = [r for r in apiserver.api.requests if str(r.url.path).endswith("/resize")]
    assert req.method == kmock.method.PATCH
    assert not b.resize(h, NodeResources(2500, 2048))  # memory: relaunch instead
    assert len([r for r in apiserver.api.requests if str(r.url.path).endswith("/resize")]) == 1


@pytest.mark.parametrize("mode", ["refuse", "absent"])
def test_resize_refused_means_relaunch(
    make_backend: MakeBackend, apiserver: ApiServerThread, mode: str
) -> None:
    apiserver.api.resize_mode = mode
    b = make_backend()
    h = b.launch(_spec())
    assert not b.resize(h, NodeResources(2000, 1024))
    assert _pods(apiserver)[h.ref]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1"


def _events(srv: ApiServerThread) -> list[dict[str, Any]]:
    return list(srv.api.objects_of("events", NAMESPACE))


def test_events_on_the_node_pod_and_for_the_job(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    """Why the master acted, as Kubernetes Events: on the node's pod; the job's own on the
    master's owner when it has one, else on the run's Lease. Sent off the caller's thread."""
    b = make_backend(lease_name="small-master")
    h = b.launch(_spec())
    b.event(h, "Killing", "worker-0.0: no heartbeat for 8 s", warning=True)
    b.event(None, "Planned", "cold_start: 2 worker(s)")
    b._flush_events(5.0)
    by_reason = {e["reason"]: e for e in _events(apiserver)}
    kill, plan = by_reason["Killing"], by_reason["Planned"]
    assert kill["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": h.ref,
                                      "namespace": NAMESPACE}  # fmt: skip
    assert kill["type"] == "Warning" and kill["source"] == {"component": "dlrover-rm-master"}
    assert plan["involvedObject"]["kind"] == "Lease" and plan["type"] == "Normal"
    assert plan["involvedObject"]["name"] == "small-master"

    from dlrover_core.runtime.backends.kubernetes_pods import OwnerRef

    owned = make_backend(owner=OwnerRef("small-master-abc", "uid-1", "Job", "batch/v1"))
    owned.event(None, "JobSucceeded", "succeeded: 1/1 samples")
    owned._flush_events(5.0)
    (ev,) = [e for e in _events(apiserver) if e["reason"] == "JobSucceeded"]
    assert ev["involvedObject"]["kind"] == "Job" and ev["involvedObject"]["uid"] == "uid-1"


def test_an_event_the_api_refuses_never_reaches_the_caller(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend()
    apiserver.api.inject(503, method="POST", path=".*/events", times=1000)
    t0 = time.monotonic()
    for i in range(300):  # more than the queue holds: the rest are dropped, not waited for
        b.event(None, "Planned", f"plan {i}")
    assert time.monotonic() - t0 < 2.0
    b._flush_events(5.0)
    assert b.events_dropped > 0
    assert _events(apiserver) == []


def test_resize_disabled(make_backend: MakeBackend) -> None:
    b = make_backend(resize_enabled=False)
    assert not b.resize(b.launch(_spec()), NodeResources(2000, 1024))


def test_usage_from_pod_metrics(make_backend: MakeBackend, apiserver: ApiServerThread) -> None:
    b = make_backend()
    h = b.launch(_spec())
    assert b.usage(h) is None  # no metrics-server answer yet
    k8s.CustomObjectsApi(apiserver.client()).create_namespaced_custom_object(
        "metrics.k8s.io",
        "v1beta1",
        NAMESPACE,
        "pods",
        {
            "metadata": {"name": h.ref},
            "containers": [{"name": "node", "usage": {"cpu": "1250000000n", "memory": "524288Ki"}}],
        },
    )
    u = b.usage(h)
    assert u is not None and u.cpu_millicores == 1250 and u.rss_mib == 512.0


def test_endpoint(make_backend: MakeBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    assert make_backend().endpoint() == ("0.0.0.0", "10.1.2.3")
    assert make_backend(master_service="ctr-job-master").endpoint() == (
        "0.0.0.0",
        f"ctr-job-master.{NAMESPACE}.svc",
    )


def test_shutdown_deletes_live_pods(make_backend: MakeBackend, apiserver: ApiServerThread) -> None:
    b = make_backend()
    live, done = b.launch(_spec(node_id=0)), b.launch(_spec(node_id=1))
    _set_status(apiserver, done.ref, _terminated(1, "Error"))
    _wait_exits(b, 1)
    b.shutdown(grace_s=0)
    assert live.ref not in _pods(apiserver)
    (e,) = b.poll()
    assert e.ref == live.ref and e.requested
    with pytest.raises(InputError, match="shut down"):
        b.launch(_spec(node_id=2))


def test_reconcile_by_list_against_stock_kmock() -> None:
    """kmock's own emulator (no resourceVersion, no selectors, no usable watch): with
    ``watch=False`` the backend still creates, observes and deletes correctly."""
    import asyncio
    import threading

    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with kmock.KubernetesEmulator() as api, kmock.Server(api) as srv:
            api.resources["v1/pods"] = {}
            box["url"], box["api"], box["loop"] = (
                str(srv.url).rstrip("/"),
                api,
                asyncio.get_running_loop(),
            )
            box["stop"] = asyncio.Event()
            ready.set()
            await box["stop"].wait()

    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    t.start()
    assert ready.wait(20)
    try:
        cfg = k8s.Configuration()
        cfg.host = box["url"]
        client = k8s.ApiClient(cfg)
        b = KubernetesBackend(
            NAMESPACE, "img", JOB, api_client=client, retry=FAST_RETRY, resync_s=0.2, watch=False
        )
        h, g = b.launch(_spec(node_id=0)), b.launch(_spec(node_id=1))
        k8s.CoreV1Api(client).patch_namespaced_pod_status(
            h.ref, NAMESPACE, {"status": _terminated(137, "OOMKilled")}, _preload_content=False
        )
        b.kill(g)
        got = {e.ref: e for e in _wait_exits(b, 2)}
        assert got[h.ref].exit_class is ExitClass.OOM
        assert got[g.ref].requested
        b._stopping.set()
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        t.join(10)
