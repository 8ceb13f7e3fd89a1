"""Where a job runs, picked here and nowhere else (``spec.backend.kind``): what differs
between running its nodes as local processes and as Kubernetes pods, for the code that starts
a job (``runtime/job.py``, ``api.run``):

- ``master_backend(spec)``: the :class:`~.base.Backend` a job master in this process drives,
  and the controller arguments that go with it (a lease, the node command);
- ``run_dir(spec)``: where the run directory must be (None: wherever the caller says);
- ``shares_container``: every node shares this process's container (its cgroup limits the
  job's quota);
- ``submits``: the job's master itself runs elsewhere (a Kubernetes Job): outside that pod,
  ``api.run`` submits the job; inside it, the master runs here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlrover_core.errors import InputError
from dlrover_core.spec import JobSpec


def _local_backend(spec: JobSpec) -> tuple[Any, dict[str, Any]]:
    from dlrover_core.runtime.backends.local import LocalBackend

    return LocalBackend(cpu_limit=spec.backend.cpu_limit), {}


def _kubernetes_backend(spec: JobSpec) -> tuple[Any, dict[str, Any]]:
    """Pods owned by the master's Job or pod (the master in a pod: a KFP task, an Airflow
    pod, `dlrover-rm submit`'s Job), a Kubernetes Lease as the run lease, and ``dlrover-rm
    node`` as every node's command."""
    import socket

    from dlrover_core.runtime.backends import manifests
    from dlrover_core.runtime.backends.base import ENV_POD_NAME
    from dlrover_core.runtime.backends.kubernetes import (
        KubernetesLease,
        backend_from_spec,
        owner_for_master,
    )
    from dlrover_core.runtime.backends.kubernetes_api import _default_client

    ns = spec.backend.namespace
    pod = os.environ.get(ENV_POD_NAME)
    owner = owner_for_master(_default_client(), ns, pod) if pod else None
    lease_name = os.environ.get(manifests.ENV_LEASE, f"{spec.name}-master")
    backend = backend_from_spec(
        spec.backend,
        spec.name,
        owner=owner,
        token_secret=os.environ.get(manifests.ENV_TOKEN_SECRET),
        master_service=os.environ.get(manifests.ENV_MASTER_SERVICE),
        lease_name=lease_name,
    )
    lease = KubernetesLease(
        ns,
        lease_name,
        identity=pod or socket.gethostname(),
        duration_s=max(15.0, 3 * spec.pacing.heartbeat_interval_s),
    )
    return backend, {"lease": lease, "node_command": lambda: ["dlrover-rm", "node"]}


def _kubernetes_run_dir(spec: JobSpec) -> Path:
    return Path(spec.backend.state_mount_path) / "runs" / spec.name


def master_here_request(
    spec: JobSpec,
    plan: dict[str, Any],
    run_dir: str | os.PathLike[str] | None,
    *,
    plan_given: bool,
) -> dict[str, Any]:
    """A dry run of a job whose master runs in this process: its command and the nodes of its
    first plan (``plan``: the one given, or the one the master would make)."""
    cmd = ["dlrover-rm", "train", "--spec", "SPEC"]
    if run_dir:
        cmd += ["--run-dir", str(run_dir)]
    if plan_given:
        cmd += ["--plan", "PLAN"]
    nodes: list[dict[str, Any]] = []
    for role, name in (("ps", "ps"), ("workers", "worker")):
        rp = dict(plan.get(role) or {})
        for i in range(int(rp.pop("count", 0))):
            nodes.append({"node": f"{name}-{i}", "command": "dlrover-rm node ...", **rp})
    return {"master": {"command": cmd, "where": "this process"}, "nodes": nodes}


@dataclass(frozen=True)
class Target:
    """One ``backend.kind`` (see the module)."""

    kind: str
    shares_container: bool
    submits: bool
    master_backend: Callable[[JobSpec], tuple[Any, dict[str, Any]]]
    run_dir: Callable[[JobSpec], Path | None]


TARGETS: dict[str, Target] = {
    "local": Target("local", True, False, _local_backend, lambda s: None),
    "kubernetes": Target("kubernetes", False, True, _kubernetes_backend, _kubernetes_run_dir),
}


def target_for(spec: JobSpec) -> Target:
    """The target ``spec.backend.kind`` names."""
    t = TARGETS.get(spec.backend.kind)
    if t is None:
        raise InputError(
            f"backend.kind: {spec.backend.kind!r} is not one of {', '.join(sorted(TARGETS))}"
        )
    return t
