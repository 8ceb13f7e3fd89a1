"""The Kubernetes test harness for the Airflow tests: the test API server (kmock, extended),
the Job controller and kubelet stand-ins from ``tests/runtime/kubernetes``, and a kubeconfig
pointing at the server, which any process (an Airflow ``dag.test()`` subprocess, a master pod
the kubelet runs) uses through ``KUBECONFIG``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_STANDINS = str(ROOT / "tests" / "runtime" / "kubernetes")
if _STANDINS not in sys.path:
    sys.path.insert(0, _STANDINS)

from apiserver import ApiServerThread  # noqa: E402
from jobs import JobControllerStandIn  # noqa: E402
from kubelet import KubeletStandIn  # noqa: E402

NAMESPACE = "dlrover"
SPEC = str(ROOT / "pipelines" / "specs" / "small.yaml")
K8S_OVERRIDES = [
    "backend.kind=kubernetes",
    f"backend.namespace={NAMESPACE}",
    "backend.image=registry.example/dlrover-rm:test",
    "backend.state_pvc=dlrover-rm-state",
]
# a loaded 2-core machine: a node importing torch can take well over the spec's 30 s
SLACK = ["pacing.pending_timeout_s=240", "pacing.dead_after_s=60"]


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": url}}],
                "users": [{"name": "test", "user": {"token": "test"}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return path


@dataclass
class Cluster:
    server: ApiServerThread
    kubeconfig: Path
    jobs: JobControllerStandIn
    kubelet: KubeletStandIn | None

    def pods(self) -> list[dict[str, Any]]:
        return self.server.api.objects_of("pods", NAMESPACE)

    def live_pods(self) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in self.pods()
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def job_objects(self) -> list[dict[str, Any]]:
        return self.server.api.objects_of("jobs", NAMESPACE, group="batch")


@contextlib.contextmanager
def cluster(tmp: Path, *, run_pods: bool = True, interval_s: float = 0.1) -> Iterator[Cluster]:
    """The harness, with ``KUBECONFIG`` set for this process (restored after). With
    ``run_pods`` the kubelet stand-in runs every pod's command (``dlrover-rm`` from this
    venv), its logs served by the API server; the run history goes to a store under ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    old = {k: os.environ.get(k) for k in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    with ApiServerThread() as srv:
        kc = write_kubeconfig(tmp / "kubeconfig", srv.url)
        os.environ["KUBECONFIG"] = str(kc)
        os.environ.pop("KUBERNETES_SERVICE_HOST", None)
        try:
            with JobControllerStandIn(srv.client(), NAMESPACE, interval_s) as jc:
                kl = None
                if run_pods:
                    keep = ("PYTHONPATH", "HOME", "LANG", "TMPDIR")
                    env = {k: v for k, v in os.environ.items() if k in keep}
                    env.update(
                        PATH=os.pathsep.join(
                            [str(Path(sys.executable).parent), os.environ["PATH"]]
                        ),
                        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                        KUBECONFIG=str(kc),
                        DLROVER_RM_HISTORY=f"sqlite:///{tmp / 'history.db'}",
                    )
                    kl = KubeletStandIn(srv.client(), NAMESPACE, tmp / "node", base_env=env)
                    kl.interval_s = interval_s
                    srv.api.log_dir = kl.root / "logs"
                    kl.start()
                else:
                    srv.api.log_dir = tmp / "logs"
                try:
                    yield Cluster(srv, kc, jc, kl)
                finally:
                    if kl is not None:
                        kl.stop()
                assert jc.errors == [], f"the Job controller stand-in failed: {jc.errors}"
                if kl is not None:
                    assert kl.errors == [], f"the kubelet stand-in failed: {kl.errors}"
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def until(pred: Callable[[], Any], timeout_s: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout_s:g} s")
