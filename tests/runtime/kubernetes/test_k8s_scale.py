"""The Kubernetes backend at scale (issue 34 item 3): pods created in bounded-concurrency
batches that back off on 429, a watch that costs no API call per pod event, and (slow tier)
``benchmarks/k8s_scale.py`` at 100 pods."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from apiserver import ApiServerThread
from conftest import NAMESPACE

from dlrover_core.errors import InputError
from dlrover_core.runtime.backends.base import NodeHandle, NodeSpec, launch_each
from dlrover_core.runtime.backends.kubernetes import KubernetesBackend, RetryPolicy
from dlrover_core.types import NodeResources, Role

ROOT = Path(__file__).resolve().parents[3]
MakeBackend = Callable[..., KubernetesBackend]


def _spec(node_id: int, incarnation: int = 0) -> NodeSpec:
    return NodeSpec(Role.WORKER, node_id, incarnation, NodeResources(1000, 1024), ["python"])


def test_launch_each_hands_back_each_result_in_order() -> None:
    def launch(spec: NodeSpec) -> NodeHandle:
        if spec.node_id == 1:
            raise InputError("no room")
        return NodeHandle(spec.role, spec.node_id, spec.incarnation, str(spec.node_id), 0.0)

    out = launch_each(launch, [_spec(0), _spec(1), _spec(2)])
    assert isinstance(out[0], NodeHandle) and out[0].ref == "0"
    assert isinstance(out[1], InputError)
    assert isinstance(out[2], NodeHandle) and out[2].ref == "2"


@pytest.mark.parametrize(("concurrency", "throttled"), [(4, False), (12, True)])
def test_launch_many_keeps_creates_in_flight_bounded(
    make_backend: MakeBackend, apiserver: ApiServerThread, concurrency: int, throttled: bool
) -> None:
    """The server answers 429 beyond 5 requests in flight (4 creates + the watcher's list):
    at 4 it never has to; at 12 it does, and every pod is still created (backoff)."""
    apiserver.api.latency_s = 0.02
    apiserver.api.max_inflight = 5
    b = make_backend(launch_concurrency=concurrency)
    out = b.launch_many([_spec(i) for i in range(24)])
    assert [h.node_id for h in out if isinstance(h, NodeHandle)] == list(range(24))
    assert len(apiserver.api.objects_of("pods", NAMESPACE)) == 24
    assert (apiserver.api.throttled > 0) is throttled


def test_a_throttle_narrows_the_window_of_calls_in_flight_and_honours_retry_after() -> None:
    """A 429 with ``Retry-After``: that call waits it out and succeeds; the window of calls
    in flight (every thread's) halves once per burst of 429s, then grows back on
    successes; a call made inside a call (a create reading the pod on 409) reuses its slot."""
    import time

    from kubernetes.client.rest import ApiException

    from dlrover_core.runtime.backends.kubernetes_api import RetryPolicy, _Caller, retry_after_s

    caller = _Caller("test", RetryPolicy(initial_s=0.01, max_s=0.05, outage_s=30.0), None, 8)
    tries = [0]

    def throttled_twice() -> str:
        tries[0] += 1
        if tries[0] <= 2:
            e = ApiException(status=429, reason="TooManyRequests")
            e.headers = {"Retry-After": "1"}
            raise e
        return caller("read pod", lambda: "created")  # nested: no second slot needed

    t0 = time.monotonic()
    assert caller("create pod", throttled_twice) == "created"
    assert time.monotonic() - t0 >= 2.0 and tries[0] == 3 and caller.throttled == 2
    assert caller.window < 8.0  # narrowed (twice: the 429s were a second apart)
    for _ in range(200):
        caller("get", lambda: None)
    assert caller.window == 8.0  # grown back to the most in flight
    caller.window = 1.0  # one slot: a nested call that asked for another would deadlock
    assert caller("create", lambda: caller("read", lambda: "nested")) == "nested"
    e = ApiException(status=429)
    e.headers = {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}
    assert retry_after_s(e) is None  # a date: the backoff applies
    assert retry_after_s(ApiException(status=500)) is None


def test_a_throttled_batch_honours_retry_after_and_sizes_its_pool(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    """The stand-in sheds load like API priority and fairness (429 + ``Retry-After: 1``):
    every pod is still created, and the batch does not keep hitting the limit (the window
    of creates in flight narrows). The client's pool holds the batch's connections."""
    apiserver.api.latency_s = 0.02
    apiserver.api.max_inflight = 5
    apiserver.api.retry_after_s = 1
    patient = RetryPolicy(initial_s=0.02, max_s=0.1, outage_s=60.0, request_timeout_s=5.0)
    b = make_backend(launch_concurrency=12, retry=patient)
    assert b.api.configuration.connection_pool_maxsize >= 12
    out = b.launch_many([_spec(i) for i in range(24)])
    assert [h.node_id for h in out if isinstance(h, NodeHandle)] == list(range(24))
    assert apiserver.api.throttled > 0
    assert b._call.throttled == apiserver.api.throttled  # every 429 was seen as a throttle
    assert apiserver.api.throttled <= 3 * 12, apiserver.api.throttled  # not a retry storm


def test_launch_many_reports_refusals_and_duplicates_per_spec(
    make_backend: MakeBackend, apiserver: ApiServerThread
) -> None:
    b = make_backend(launch_concurrency=3)
    running = b.launch(_spec(0))
    apiserver.api.inject(403, method="POST", path=r"/pods$", times=1)
    out: list[Any] = b.launch_many([_spec(0), _spec(1), _spec(2), _spec(2), _spec(3)])
    assert isinstance(out[0], InputError) and "already running" in str(out[0])
    assert isinstance(out[3], InputError) and "twice in the batch" in str(out[3])
    refused = [r for r in out[1:3] + out[4:] if isinstance(r, InputError)]
    assert len(refused) == 1 and "HTTP 403" in str(refused[0])  # not retried
    made = [r for r in out if isinstance(r, NodeHandle)]
    assert len(made) == 2 and b.alive(running)
    assert len(apiserver.api.objects_of("pods", NAMESPACE)) == 3


@pytest.mark.slow
def test_k8s_scale_benchmark_at_100_pods() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import k8s_scale

    k8s_scale.LATENCY["s"] = 0.02  # a slow server: a batch must beat the loop
    r = k8s_scale.run_k8s_scale(pods=100, concurrency=16, exits=20, faults=30, resync_s=3.0)
    loop, batch = r["launch"]
    for x in (loop, batch):
        assert x["failed"] == 0 and x["pods_stored"] == 100 and x["creates_per_pod"] == 1.0
    assert batch["seconds"] < 0.6 * loop["seconds"], r["launch"]
    ev = r["events"]
    assert ev["running"]["all_seen"] and ev["running"]["calls_per_event"] <= 0.05
    assert ev["exits_failed"]["reported"] == 20 and ev["exits_failed"]["calls_per_event"] <= 0.1
    ok = ev["exits_succeeded"]
    # one call per finished pod (its delete); no relist per exit
    assert ok["reported"] == 20 and ok["calls"].get("delete") == 20 and ok["relists"] <= 1
    for k in ("exits_failed", "exits_succeeded"):
        assert ev[k]["status_to_poll_ms"]["p50"] < 500, ev[k]
    assert ev["stop_storm"]["reported"] == 20 and ev["stop_storm"]["relists"] <= 1
    assert ev["unschedulable"]["all_detected"]
    assert r["api_errors"]["launched"] == 100 and r["api_errors"]["retries"] == 30
    assert r["api_errors"]["watcher_listed_after_503s"]
    th = r["api_throttled"]
    assert th["launched"] == 100 and th["pods_stored"] == 100
