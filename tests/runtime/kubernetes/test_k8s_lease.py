"""KubernetesLease: one master per run, through a coordination.k8s.io/v1 Lease."""

from __future__ import annotations

import json

import pytest
from apiserver import ApiServerThread
from conftest import FAST_RETRY, NAMESPACE
from kubernetes import client as k8s

from dlrover_core.runtime.backends.base import RunLease
from dlrover_core.runtime.backends.kubernetes import KubernetesLease


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _lease(srv: ApiServerThread, who: str, clock: Clock, duration_s: float = 15) -> KubernetesLease:
    return KubernetesLease(
        NAMESPACE,
        "ctr-job-master",
        who,
        duration_s=duration_s,
        api_client=srv.client(),
        clock=clock,
        retry=FAST_RETRY,
    )


def _stored(srv: ApiServerThread) -> dict:
    resp = k8s.CoordinationV1Api(srv.client()).read_namespaced_lease(
        "ctr-job-master", NAMESPACE, _preload_content=False
    )
    return json.loads(resp.data)["spec"]


def test_acquire_refuse_renew_release(apiserver: ApiServerThread) -> None:
    clock = Clock()
    a, b = _lease(apiserver, "master-a", clock), _lease(apiserver, "master-b", clock)
    assert isinstance(a, RunLease)
    assert a.acquire() is None
    spec = _stored(apiserver)
    assert spec["holderIdentity"] == "master-a" and spec["leaseDurationSeconds"] == 15
    refusal = b.acquire()
    assert refusal is not None and refusal.startswith("master-a since ")
    assert "expires in 15 s" in refusal
    clock.t += 10
    assert a.renew()
    clock.t += 10  # 20 s after acquiring, 10 s after renewing: still held
    assert b.acquire() is not None
    assert a.acquire() is None  # re-acquiring one's own lease is a renewal
    a.release()
    a.release()  # idempotent
    assert b.acquire() is None
    assert _stored(apiserver)["holderIdentity"] == "master-b"


def test_an_expired_lease_is_taken_over_and_the_old_holder_learns_it(
    apiserver: ApiServerThread,
) -> None:
    clock = Clock()
    a, b = _lease(apiserver, "master-a", clock), _lease(apiserver, "master-b", clock)
    assert a.acquire() is None
    clock.t += 16  # master-a stopped renewing (it died, or hangs)
    assert b.acquire() is None
    spec = _stored(apiserver)
    assert spec["holderIdentity"] == "master-b" and spec["leaseTransitions"] == 1
    assert not a.renew()  # it must stop acting at once
    assert not a.renew()
    assert b.renew()


def test_two_masters_racing_for_an_expired_lease_cannot_both_win(
    apiserver: ApiServerThread,
) -> None:
    clock = Clock()
    a, b = _lease(apiserver, "master-a", clock), _lease(apiserver, "master-b", clock)
    assert a.acquire() is None
    clock.t += 16
    # b read the lease, then someone else wrote it before b's write: b's write is stale
    apiserver.api.inject(409, method="PUT", path="/leases/", times=1)
    refusal = b.acquire()
    assert refusal is not None and "took the lease first" in refusal


@pytest.mark.slow  # over 3 s here: the full tier (make test-all)
def test_renew_survives_a_short_api_outage_but_not_past_the_duration(
    apiserver: ApiServerThread,
) -> None:
    clock = Clock()
    a = _lease(apiserver, "master-a", clock, duration_s=15)
    assert a.acquire() is None
    apiserver.api.inject(503, times=100_000)
    clock.t += 5
    assert a.renew()  # cannot reach the API, but nobody else can have it yet
    clock.t += 11
    assert not a.renew()  # past the duration: another master may hold it now
    apiserver.api.clear_faults()
