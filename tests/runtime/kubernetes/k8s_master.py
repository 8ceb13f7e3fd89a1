"""Run one job master with the Kubernetes backend against the test API server: what
``dlrover-rm train`` with ``backend.kind: kubernetes`` will do in a pod, as a function (the
in-process e2e test) and as a process (``python k8s_master.py ...``, the master-restart test,
which SIGKILLs it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from dlrover_core.runtime.backends.kubernetes import KubernetesBackend, KubernetesLease, RetryPolicy
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.spec import JobSpec, load_spec
from dlrover_core.types import ResourcePlan


def make_master(
    spec: JobSpec,
    api_url: str,
    namespace: str,
    state_dir: Path,
    *,
    plan: ResourcePlan | None = None,
    identity: str = "master-0",
    lease_s: float = 6.0,
    on_tick: Callable[[JobMaster], None] | None = None,
    strategy: Any = None,
) -> JobMaster:
    cfg = k8s.Configuration()
    cfg.host = api_url
    cfg.retries = False
    os.environ["POD_IP"] = "127.0.0.1"  # the downward API of the master's own pod
    backend = KubernetesBackend(
        namespace,
        "dlrover-rm:test",
        spec.name,
        api_client=k8s.ApiClient(cfg),
        state_pvc="state",
        state_mount_path=str(state_dir),  # the stand-in maps the claim to this very dir
        retry=RetryPolicy(initial_s=0.05, max_s=1.0, outage_s=30.0),
        resync_s=2.0,
        termination_grace_s=5,
    )
    lease = KubernetesLease(
        namespace,
        f"{spec.name}-master",
        identity,
        duration_s=lease_s,
        api_client=k8s.ApiClient(cfg),
    )
    return JobMaster(
        spec,
        state_dir / "runs" / spec.name,
        backend,
        plan=plan,
        lease=lease,
        on_tick=on_tick,
        tick_s=0.2,
        strategy=strategy,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--api", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--identity", default="master-0")
    a = p.parse_args(argv)
    spec = load_spec(a.spec, a.set)
    report: dict[str, Any] = make_master(
        spec, a.api, a.namespace, Path(a.state_dir), identity=a.identity
    ).run()
    print(json.dumps({"state": report.get("state")}))
    return 0 if report.get("state") == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
