"""The pure half of the Kubernetes backend: NodeSpec -> pod, pod -> NodeExit."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client as k8s

from dlrover_core.errors import InputError
from dlrover_core.faults.classify import PENDING_REASONS, ExitClass, classify_exit
from dlrover_core.runtime.backends.base import (
    ENV_ADVERTISE_HOST,
    ENV_BIND_HOST,
    ENV_INCARNATION,
    ENV_NODE_ID,
    ENV_ROLE,
    NodeExit,
    NodeSpec,
)
from dlrover_core.runtime.backends.kubernetes_pods import (
    ENV_STATE_DIR,
    ENV_STATE_URL,
    ENV_TOKEN,
    OwnerRef,
    PodConfig,
    node_to_pod,
    pod_exit,
    pod_name,
)
from dlrover_core.types import NodeResources, Role

K8S_VERSION = "1.33"


def _spec(**kw: Any) -> NodeSpec:
    base: dict[str, Any] = {
        "role": Role.PS,
        "node_id": 2,
        "incarnation": 3,
        "resources": NodeResources(1500, 2048),
        "argv": ["dlrover-rm", "node", "ps", "--id", "2"],
        "env": {"DLROVER_RM_MASTER": "master.jobs.svc:50051"},
    }
    base.update(kw)
    return NodeSpec(**base)


def _cfg(**kw: Any) -> PodConfig:
    base: dict[str, Any] = {
        "namespace": "jobs",
        "image": "registry.example/dlrover-rm:0.1",
        "job_name": "ctr-job",
        "owner": OwnerRef(name="ctr-job-master-x7k2p", uid="5a4b9c1e-0000-4000-8000-000000000001"),
        "service_account": "dlrover-rm-node",
        "state_pvc": "ctr-job-state",
        "token_secret": "ctr-job-token",
    }
    base.update(kw)
    return PodConfig(**base)


def _as_json(pod: k8s.V1Pod) -> dict[str, Any]:
    return k8s.ApiClient().sanitize_for_serialization(pod)


def test_pod_carries_identity_resources_and_ownership() -> None:
    pod = _as_json(node_to_pod(_spec(), _cfg()))
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "ctr-job-ps-2-3"
    assert meta["labels"] == {
        "app.kubernetes.io/name": "dlrover-rm",
        "dlrover-rm/job": "ctr-job",
        "dlrover-rm/role": "ps",
        "dlrover-rm/node-id": "2",
        "dlrover-rm/incarnation": "3",
    }
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "ctr-job-master-x7k2p",
        "uid": "5a4b9c1e-0000-4000-8000-000000000001",
        "blockOwnerDeletion": True,
        "controller": False,
    }
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    assert c["command"] == ["dlrover-rm", "node", "ps", "--id", "2"]
    want = {"cpu": "1500m", "memory": "2048Mi"}
    assert c["resources"] == {"requests": want, "limits": want}  # Guaranteed QoS
    assert {"resourceName": "cpu", "restartPolicy": "NotRequired"} in c["resizePolicy"]
    env = {e["name"]: e for e in c["env"]}
    assert env[ENV_BIND_HOST]["value"] == "0.0.0.0"
    assert env[ENV_ADVERTISE_HOST]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env[ENV_ROLE]["value"] == "ps"
    assert env[ENV_NODE_ID]["value"] == "2"
    assert env[ENV_INCARNATION]["value"] == "3"
    assert env["DLROVER_RM_MASTER"]["value"] == "master.jobs.svc:50051"
    assert env["OMP_NUM_THREADS"]["value"] == "1"  # 1.5 CPU: whole cores, rounded down
    assert env[ENV_STATE_DIR]["value"] == "/var/lib/dlrover-rm"
    assert env[ENV_TOKEN]["valueFrom"]["secretKeyRef"] == {"name": "ctr-job-token", "key": "token"}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["state"] == "/var/lib/dlrover-rm"
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["state"]["persistentVolumeClaim"] == {"claimName": "ctr-job-state"}


def test_pod_validates_against_the_official_schema() -> None:
    for spec in (_spec(), _spec(role=Role.WORKER, resources=NodeResources(250, 0))):
        for cfg in (
            _cfg(),
            _cfg(owner=None, state_pvc=None, token_secret=None, state_url="s3://b/p"),
        ):
            kubernetes_validate.validate(_as_json(node_to_pod(spec, cfg)), K8S_VERSION, strict=True)


def test_state_url_instead_of_a_volume() -> None:
    pod = _as_json(node_to_pod(_spec(), _cfg(state_pvc=None, state_url="s3://bucket/run")))
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[ENV_STATE_URL] == "s3://bucket/run"
    assert ENV_STATE_DIR not in env  # nothing is shared through the volume
    # the run directory is scratch the pod's user can write (an emptyDir), its path told
    assert env["DLROVER_RM_STATE_MOUNT"] == "/var/lib/dlrover-rm"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["state"] == {"name": "state", "emptyDir": {}}
    assert {"name": "state", "mountPath": "/var/lib/dlrover-rm"} in c["volumeMounts"]


def test_no_memory_limit_means_no_memory_quantity() -> None:
    pod = _as_json(node_to_pod(_spec(resources=NodeResources(2000, 0)), _cfg()))
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "2"}


@pytest.mark.parametrize(
    "job",
    ["a", "job_with_underscores", "x" * 63, "very.long.job.name-" * 3],
)
def test_pod_names_are_dns_labels_and_unique(job: str) -> None:
    names = {pod_name(job[:63], Role.WORKER, i, 12) for i in range(3)}
    assert len(names) == 3
    for n in names:
        assert len(n) <= 63
        assert n == n.lower() and "_" not in n and "." not in n
    assert pod_name("x" * 60 + "a", Role.PS, 0, 0) != pod_name("x" * 60 + "b", Role.PS, 0, 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("namespace", "Bad_NS"),
        ("image", ""),
        ("job_name", "no spaces"),
        ("state_mount_path", "rel"),
    ],
)
def test_bad_pod_config_names_the_field(field: str, value: str) -> None:
    with pytest.raises(InputError, match=field):
        _cfg(**{field: value})


# ------------------------------------------------------------------ exits from recorded pods

_LABELS = {
    "app.kubernetes.io/name": "dlrover-rm",
    "dlrover-rm/job": "ctr-job",
    "dlrover-rm/role": "worker",
    "dlrover-rm/node-id": "1",
    "dlrover-rm/incarnation": "0",
}


def _pod(phase: str, *, statuses: list[dict[str, Any]] | None = None, **status: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ctr-job-worker-1-0", "namespace": "jobs", "labels": _LABELS},
        "status": {"phase": phase, "containerStatuses": statuses or [], **status},
    }


def _term(code: int, reason: str, name: str = "node", **kw: Any) -> dict:
    return {
        "name": name,
        "ready": False,
        "restartCount": 0,
        "image": "img",
        "imageID": "",
        "state": {"terminated": {"exitCode": code, "reason": reason, **kw}},
    }


def _wait(reason: str) -> dict:
    return {
        "name": "node",
        "ready": False,
        "restartCount": 0,
        "image": "img",
        "imageID": "",
        "state": {"waiting": {"reason": reason, "message": "..."}},
    }


def _running() -> dict:
    return {
        "name": "node",
        "ready": True,
        "restartCount": 0,
        "image": "img",
        "imageID": "",
        "state": {"running": {"startedAt": "2026-12-01T10:00:00Z"}},
    }


_DISRUPTED = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "PreemptionByScheduler",
    "message": "Kubernetes Scheduler: preempting to accommodate a higher priority pod",
}
_UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/12 nodes are available: 12 Insufficient cpu.",
}

EXIT_TABLE: list[tuple[str, dict, int | None, str | None, ExitClass]] = [
    (
        "succeeded",
        _pod("Succeeded", statuses=[_term(0, "Completed")]),
        0,
        None,
        ExitClass.SUCCEEDED,
    ),
    ("code error", _pod("Failed", statuses=[_term(1, "Error")]), 1, "Error", ExitClass.FATAL),
    ("abort", _pod("Failed", statuses=[_term(134, "Error")]), 134, "Error", ExitClass.FATAL),
    ("oom", _pod("Failed", statuses=[_term(137, "OOMKilled")]), 137, "OOMKilled", ExitClass.OOM),
    (
        "oom in a sidecar wins over the main container's error",
        _pod("Failed", statuses=[_term(1, "Error"), _term(137, "OOMKilled", name="side")]),
        137,
        "OOMKilled",
        ExitClass.OOM,
    ),
    ("sigkill", _pod("Failed", statuses=[_term(137, "Error")]), 137, "Error", ExitClass.KILLED),
    ("sigterm", _pod("Failed", statuses=[_term(143, "Error")]), 143, "Error", ExitClass.KILLED),
    (
        "evicted (no container status left)",
        _pod("Failed", reason="Evicted", message="The node was low on resource: memory."),
        None,
        "Evicted",
        ExitClass.KILLED,
    ),
    (
        "evicted with the container's code",
        _pod("Failed", statuses=[_term(137, "Error")], reason="Evicted"),
        137,
        "Evicted",
        ExitClass.KILLED,
    ),
    (
        "graceful node shutdown",
        _pod("Failed", statuses=[_term(143, "Error")], reason="Shutdown"),
        143,
        "Shutdown",
        ExitClass.KILLED,
    ),
    (
        "node shutdown (1.26+)",
        _pod("Failed", reason="NodeShutdown"),
        None,
        "NodeShutdown",
        ExitClass.KILLED,
    ),
    (
        "terminated by kubelet",
        _pod("Failed", reason="Terminated"),
        None,
        "Terminated",
        ExitClass.KILLED,
    ),
    (
        "preempted (DisruptionTarget)",
        _pod("Failed", statuses=[_term(137, "Error")], conditions=[_DISRUPTED]),
        137,
        "DisruptionTarget",
        ExitClass.KILLED,
    ),
    (
        "preempted with an exit code that alone reads as fatal",
        _pod("Failed", statuses=[_term(1, "Error")], conditions=[_DISRUPTED]),
        1,
        "DisruptionTarget",
        ExitClass.KILLED,
    ),
    ("node lost", _pod("Failed", reason="NodeLost"), None, "NodeLost", ExitClass.HARDWARE),
    (
        "image pull backoff",
        _pod("Pending", statuses=[_wait("ImagePullBackOff")]),
        None,
        "ImagePullBackOff",
        ExitClass.FATAL,
    ),
    (
        "image pull error",
        _pod("Pending", statuses=[_wait("ErrImagePull")]),
        None,
        "ErrImagePull",
        ExitClass.FATAL,
    ),
    (
        "invalid image",
        _pod("Pending", statuses=[_wait("InvalidImageName")]),
        None,
        "InvalidImageName",
        ExitClass.FATAL,
    ),
    (
        "missing secret/configmap",
        _pod("Pending", statuses=[_wait("CreateContainerConfigError")]),
        None,
        "CreateContainerConfigError",
        ExitClass.FATAL,
    ),
    (
        "container create error",
        _pod("Pending", statuses=[_wait("CreateContainerError")]),
        None,
        "CreateContainerError",
        ExitClass.FATAL,
    ),
]


@pytest.mark.parametrize(
    ("case", "pod", "code", "reason", "cls"), EXIT_TABLE, ids=[c[0] for c in EXIT_TABLE]
)
def test_exit_from_recorded_pod(
    case: str, pod: dict, code: int | None, reason: str | None, cls: ExitClass
) -> None:
    before = copy.deepcopy(pod)
    out = pod_exit(pod, at_s=12.5, requested=False)
    assert isinstance(out, NodeExit), case
    assert (out.role, out.node_id, out.incarnation) == (Role.WORKER, 1, 0)
    assert out.ref == "ctr-job-worker-1-0"
    assert out.exit_code == code
    assert out.reason == reason
    assert out.at_s == 12.5
    assert out.exit_class is cls, out.explain()
    assert pod == before  # pure


@pytest.mark.parametrize(
    "pod",
    [
        _pod("Pending"),
        _pod("Pending", statuses=[_wait("ContainerCreating")]),
        _pod("Pending", statuses=[_wait("PodInitializing")]),
        _pod("Running", statuses=[_running()]),
        _pod("Running", statuses=[_running()], conditions=[_DISRUPTED]),  # still terminating
    ],
)
def test_starting_or_running_pod_has_no_exit(pod: dict) -> None:
    assert pod_exit(pod) is None


def test_unschedulable_is_pending_not_an_exit() -> None:
    assert pod_exit(_pod("Pending", conditions=[_UNSCHEDULABLE])) == "pending"
    assert "Unschedulable" in PENDING_REASONS


def test_requested_flag_is_carried() -> None:
    out = pod_exit(_pod("Failed", statuses=[_term(143, "Error")]), requested=True)
    assert isinstance(out, NodeExit) and out.requested


def test_a_pod_without_node_labels_is_refused_clearly() -> None:
    pod = _pod("Running")
    pod["metadata"]["labels"] = {}
    with pytest.raises(InputError, match="dlrover-rm/role"):
        pod_exit(pod)


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        ("Deleted", ExitClass.KILLED),
        ("DisruptionTarget", ExitClass.KILLED),
        ("Shutdown", ExitClass.KILLED),
        ("NodeShutdown", ExitClass.KILLED),
        ("Evicted", ExitClass.KILLED),
        ("ImagePullBackOff", ExitClass.FATAL),
        ("ErrImagePull", ExitClass.FATAL),
        ("InvalidImageName", ExitClass.FATAL),
        ("CreateContainerConfigError", ExitClass.FATAL),
        ("NodeLost", ExitClass.HARDWARE),
    ],
)
def test_classifier_reads_the_kubernetes_reasons(reason: str, cls: ExitClass) -> None:
    assert classify_exit(None, reason) is cls
    assert classify_exit(137, reason) is cls


@pytest.mark.parametrize(
    ("status", "want"),
    [
        ({}, None),
        ({"conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]},
         "infeasible"),
        ({"conditions": [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}]},
         "deferred"),
        ({"conditions": [{"type": "PodResizePending", "status": "False", "reason": "Deferred"}]},
         None),
        ({"conditions": [{"type": "PodResizeInProgress", "status": "True"}]}, "in_progress"),
        ({"resize": "Infeasible"}, "infeasible"),  # Kubernetes 1.27-1.32
        ({"resize": "InProgress"}, "in_progress"),
    ],
)  # fmt: skip
def test_pod_resize_state(status: dict, want: str | None) -> None:
    from dlrover_core.runtime.backends.kubernetes_pods import pod_resize_state

    assert pod_resize_state({"status": status}) == want
