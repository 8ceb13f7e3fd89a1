"""Fixtures for the Kubernetes backend: the test API server (kmock, extended), a backend
pointed at it with short retry and resync bounds, and the kubelet stand-in."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # apiserver.py and kubelet.py sit next to the tests
    sys.path.insert(0, _HERE)

from apiserver import ApiServerThread  # noqa: E402
from kubelet import KubeletStandIn  # noqa: E402

from dlrover_core.runtime.backends.kubernetes import KubernetesBackend, RetryPolicy  # noqa: E402

NAMESPACE = "jobs"
JOB = "ctr-job"
FAST_RETRY = RetryPolicy(initial_s=0.02, max_s=0.1, outage_s=3.0, request_timeout_s=5.0)


@pytest.fixture()
def apiserver() -> Iterator[ApiServerThread]:
    with ApiServerThread() as srv:
        yield srv


@pytest.fixture()
def api_client(apiserver: ApiServerThread) -> k8s.ApiClient:
    return apiserver.client()


@pytest.fixture()
def make_backend(
    apiserver: ApiServerThread,
) -> Iterator[Callable[..., KubernetesBackend]]:
    made: list[KubernetesBackend] = []

    def make(**overrides: Any) -> KubernetesBackend:
        kw: dict[str, Any] = {
            "namespace": NAMESPACE,
            "image": "dlrover-rm:test",
            "job_name": JOB,
            "api_client": apiserver.client(),
            "retry": FAST_RETRY,
            "resync_s": 1.0,
        }
        kw.update(overrides)
        b = KubernetesBackend(**kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b._stopping.set()  # end watchers without deleting pods (tests check what is left)
        b._kick.set()


@pytest.fixture()
def kubelet(apiserver: ApiServerThread, tmp_path: Path) -> Iterator[KubeletStandIn]:
    with KubeletStandIn(apiserver.client(), NAMESPACE, tmp_path / "node") as kl:
        yield kl
    assert kl.errors == [], f"the kubelet stand-in failed: {kl.errors}"
