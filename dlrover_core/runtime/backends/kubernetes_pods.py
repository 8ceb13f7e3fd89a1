"""The pure half of the Kubernetes backend: a ``NodeSpec`` -> its pod, a pod -> its
``NodeExit``; the labels and names every part agrees on. No API calls here."""

from __future__ import annotations

import datetime as _dt
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes import client as k8s

from dlrover_core.errors import InputError
from dlrover_core.runtime.backends.base import (
    DISRUPTED_REASON,
    ENV_ADVERTISE_HOST,
    ENV_BIND_HOST,
    ENV_POD_NAME,
    FATAL_WAITING_REASONS,
    OMP_WAIT_POLICY,
    OOM_REASON,
    NodeExit,
    NodeSpec,
)
from dlrover_core.types import NodeResources, Role
from dlrover_core.units import cpu_millicores, format_cpu, memory_mib

APP = "dlrover-rm"
LABEL_APP = "app.kubernetes.io/name"
LABEL_JOB = "dlrover-rm/job"
LABEL_ROLE = "dlrover-rm/role"
LABEL_NODE_ID = "dlrover-rm/node-id"
LABEL_INCARNATION = "dlrover-rm/incarnation"
CONTAINER_NAME = "node"
STATE_VOLUME = "state"
TOKEN_VOLUME = "token"
TOKEN_MOUNT_PATH = "/var/run/dlrover-rm/token"

ENV_NAMESPACE = "DLROVER_RM_NAMESPACE"
ENV_STATE_DIR = "DLROVER_RM_STATE_DIR"
ENV_STATE_URL = "DLROVER_RM_STATE_URL"
ENV_STATE_MOUNT = "DLROVER_RM_STATE_MOUNT"  # with a URL and no claim: the scratch mount path
ENV_TOKEN = "DLROVER_RM_TOKEN"
ENV_TOKEN_FILE = "DLROVER_RM_TOKEN_FILE"
BIND_ALL = "0.0.0.0"

_RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
_REFUSED_RESIZE = frozenset({400, 403, 404, 405, 415, 422})
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# Pod-level reasons (status.reason) that say why the whole pod ended.
_POD_REASONS = frozenset(
    {"Evicted", "Shutdown", "NodeShutdown", "Terminated", "NodeLost", "Preempting"}
)

# --------------------------------------------------------------------------- pure mapping


@dataclass(frozen=True)
class OwnerRef:
    """What the node pods are owned by (the master pod): deleting it garbage-collects them."""

    name: str
    uid: str
    kind: str = "Pod"
    api_version: str = "v1"


@dataclass(frozen=True)
class PodConfig:
    """Everything about a node pod that does not come from its ``NodeSpec``."""

    namespace: str
    image: str
    job_name: str
    owner: OwnerRef | None = None
    service_account: str | None = None
    state_pvc: str | None = None  # a PersistentVolumeClaim mounted at state_mount_path
    state_mount_path: str = "/var/lib/dlrover-rm"
    state_url: str | None = None  # an fsspec URL instead of (or besides) the volume
    token_secret: str | None = None  # Secret with key "token": env + file
    image_pull_policy: str = "IfNotPresent"
    termination_grace_s: int = 30
    node_selector: Mapping[str, str] = field(default_factory=dict)
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if not _DNS_LABEL.match(self.namespace):
            problems.append(f"namespace {self.namespace!r}: use a DNS label (a-z, 0-9, '-')")
        if not self.image:
            problems.append("image: give the container image that holds dlrover-rm")
        if not self.job_name or not _LABEL_VALUE.match(self.job_name):
            problems.append(
                f"job_name {self.job_name!r}: use at most 63 of a-z, A-Z, 0-9, '-', '_', '.'"
            )
        if not self.state_mount_path.startswith("/"):
            problems.append(f"state_mount_path {self.state_mount_path!r}: use an absolute path")
        if problems:
            raise InputError("invalid Kubernetes pod configuration", problems=problems)


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def _dns_part(s: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", s.lower()).strip("-") or "job"


def pod_name(job_name: str, role: Role, node_id: int, incarnation: int) -> str:
    """``<job>-<role>-<id>-<incarnation>``, a DNS label (<= 63 chars: a long job name is cut
    and given a short hash so two jobs never share a name)."""
    tail = f"-{role.value}-{node_id}-{incarnation}"
    head = _dns_part(job_name)
    if len(head) + len(tail) > 63:
        digest = hashlib.sha1(job_name.encode()).hexdigest()[:6]
        head = head[: 63 - len(tail) - 7].rstrip("-") + "-" + digest
    return head + tail


def job_selector(job_name: str) -> str:
    """The label selector of every node pod of ``job_name``."""
    return f"{LABEL_APP}={APP},{LABEL_JOB}={job_name}"


def node_labels(job_name: str, role: Role, node_id: int, incarnation: int) -> dict[str, str]:
    return {
        LABEL_APP: APP,
        LABEL_JOB: job_name,
        LABEL_ROLE: role.value,
        LABEL_NODE_ID: str(node_id),
        LABEL_INCARNATION: str(incarnation),
    }


def _quantities(res: NodeResources) -> dict[str, str]:
    out: dict[str, str] = {}
    if res.cpu_millicores > 0:
        out["cpu"] = format_cpu(res.cpu_millicores)
    if res.memory_mib > 0:
        out["memory"] = f"{res.memory_mib}Mi"
    return out


def node_to_pod(spec: NodeSpec, cfg: PodConfig) -> k8s.V1Pod:
    """The pod that runs ``spec`` (pure: no API call). See the module docstring."""
    name = pod_name(cfg.job_name, spec.role, spec.node_id, spec.incarnation)
    labels = {
        **cfg.extra_labels,
        **node_labels(cfg.job_name, spec.role, spec.node_id, spec.incarnation),
    }
    threads = str(spec.resources.threads)
    plain: dict[str, str] = {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "OMP_WAIT_POLICY": OMP_WAIT_POLICY,
        ENV_BIND_HOST: BIND_ALL,
        **spec.identity_env(),
        ENV_NAMESPACE: cfg.namespace,
        **spec.env,
    }
    if cfg.state_pvc:
        plain.setdefault(ENV_STATE_DIR, cfg.state_mount_path)
    if cfg.state_url:
        plain.setdefault(ENV_STATE_URL, cfg.state_url)
        if not cfg.state_pvc:
            plain.setdefault(ENV_STATE_MOUNT, cfg.state_mount_path)
    if cfg.token_secret:
        plain.setdefault(ENV_TOKEN_FILE, f"{TOKEN_MOUNT_PATH}/token")
    env = [
        k8s.V1EnvVar(
            name=ENV_ADVERTISE_HOST,
            value_from=k8s.V1EnvVarSource(
                field_ref=k8s.V1ObjectFieldSelector(field_path="status.podIP")
            ),
        ),
        k8s.V1EnvVar(
            name=ENV_POD_NAME,
            value_from=k8s.V1EnvVarSource(
                field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.name")
            ),
        ),
    ]
    if cfg.token_secret:
        env.append(
            k8s.V1EnvVar(
                name=ENV_TOKEN,
                value_from=k8s.V1EnvVarSource(
                    secret_key_ref=k8s.V1SecretKeySelector(name=cfg.token_secret, key="token")
                ),
            )
        )
    taken = {e.name for e in env}
    env += [k8s.V1EnvVar(name=k, value=v) for k, v in plain.items() if k not in taken]
    quantities = _quantities(spec.resources)
    mounts: list[k8s.V1VolumeMount] = []
    volumes: list[k8s.V1Volume] = []
    if cfg.state_pvc:
        mounts.append(k8s.V1VolumeMount(name=STATE_VOLUME, mount_path=cfg.state_mount_path))
        volumes.append(
            k8s.V1Volume(
                name=STATE_VOLUME,
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                    claim_name=cfg.state_pvc
                ),
            )
        )
    elif cfg.state_url:  # scratch, writable by the pod's user; the URL holds what must last
        mounts.append(k8s.V1VolumeMount(name=STATE_VOLUME, mount_path=cfg.state_mount_path))
        volumes.append(k8s.V1Volume(name=STATE_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource()))
    if cfg.token_secret:
        mounts.append(
            k8s.V1VolumeMount(name=TOKEN_VOLUME, mount_path=TOKEN_MOUNT_PATH, read_only=True)
        )
        volumes.append(
            k8s.V1Volume(
                name=TOKEN_VOLUME,
                secret=k8s.V1SecretVolumeSource(secret_name=cfg.token_secret, default_mode=0o400),
            )
        )
    container = k8s.V1Container(
        name=CONTAINER_NAME,
        image=cfg.image,
        image_pull_policy=cfg.image_pull_policy,
        command=list(spec.argv),
        env=env,
        resources=k8s.V1ResourceRequirements(requests=quantities, limits=dict(quantities)),
        resize_policy=[
            k8s.V1ContainerResizePolicy(resource_name="cpu", restart_policy="NotRequired"),
            k8s.V1ContainerResizePolicy(resource_name="memory", restart_policy="RestartContainer"),
        ],
        volume_mounts=mounts or None,
        security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        ),
    )
    owners = None
    if cfg.owner is not None:
        owners = [
            k8s.V1OwnerReference(
                api_version=cfg.owner.api_version,
                kind=cfg.owner.kind,
                name=cfg.owner.name,
                uid=cfg.owner.uid,
                block_owner_deletion=True,
                controller=False,
            )
        ]
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(
            name=name, namespace=cfg.namespace, labels=labels, owner_references=owners
        ),
        spec=k8s.V1PodSpec(
            containers=[container],
            restart_policy="Never",
            service_account_name=cfg.service_account,
            automount_service_account_token=False,  # nodes never talk to the API server
            enable_service_links=False,
            termination_grace_period_seconds=cfg.termination_grace_s,
            node_selector=dict(cfg.node_selector) or None,
            security_context=k8s.V1PodSecurityContext(
                run_as_non_root=True, run_as_user=1000, fs_group=1000
            ),
            volumes=volumes or None,
        ),
    )


def _identity(pod: Mapping[str, Any]) -> tuple[Role, int, int] | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    try:
        return (
            Role(labels[LABEL_ROLE]),
            int(labels[LABEL_NODE_ID]),
            int(labels[LABEL_INCARNATION]),
        )
    except (KeyError, ValueError):
        return None


def pod_resize_state(pod: Mapping[str, Any]) -> str | None:
    """How the pod's last in-place resize stands (pure): ``infeasible``, ``deferred``,
    ``in_progress`` or ``None``. Kubernetes 1.33+ says it with the ``PodResizePending``
    (reason ``Infeasible``/``Deferred``) and ``PodResizeInProgress`` conditions; 1.27-1.32
    with ``status.resize``."""
    status = pod.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "PodResizePending":
            reason = str(c.get("reason") or "").lower()
            return "infeasible" if reason == "infeasible" else "deferred"
        if c.get("type") == "PodResizeInProgress":
            return "in_progress"
    legacy = str(status.get("resize") or "").lower()
    return {"infeasible": "infeasible", "deferred": "deferred", "inprogress": "in_progress"}.get(
        legacy
    )


def pod_exit(
    pod: Mapping[str, Any], *, at_s: float = 0.0, requested: bool = False
) -> NodeExit | Literal["pending"] | None:
    """How the pod ``pod`` (its JSON form, as the API returns it) ended: a ``NodeExit``;
    ``"pending"`` when it cannot be scheduled; ``None`` while it starts or runs. Pure."""
    ident = _identity(pod)
    if ident is None:
        raise InputError(
            f"pod {(pod.get('metadata') or {}).get('name')!r} has no dlrover-rm node labels "
            f"({LABEL_ROLE}, {LABEL_NODE_ID}, {LABEL_INCARNATION}); it is not a node pod"
        )
    role, node_id, incarnation = ident
    name = str((pod.get("metadata") or {}).get("name", ""))
    status = pod.get("status") or {}
    phase = status.get("phase")
    statuses = list(status.get("containerStatuses") or []) + list(
        status.get("initContainerStatuses") or []
    )
    terminated: list[dict[str, Any]] = [
        t for cs in statuses if (t := (cs.get("state") or {}).get("terminated"))
    ]
    waiting: list[dict[str, Any]] = [
        w for cs in statuses if (w := (cs.get("state") or {}).get("waiting"))
    ]
    all_done = bool(statuses) and len(terminated) == len(statuses)

    def made(code: int | None, sig: int | None, reason: str | None) -> NodeExit:
        return NodeExit(
            role=role,
            node_id=node_id,
            incarnation=incarnation,
            exit_code=code,
            signal=sig,
            reason=reason,
            at_s=at_s,
            ref=name,
            requested=requested,
        )

    # the container that decides: an OOM-killed one, else the first failed one, else any
    decisive: dict[str, Any] | None = None
    for t in terminated:
        if str(t.get("reason", "")).lower() == OOM_REASON.lower():
            decisive = t
            break
    if decisive is None:
        decisive = next((t for t in terminated if t.get("exitCode") not in (0, None)), None)
    if decisive is None and terminated:
        decisive = terminated[0]
    code = int(decisive["exitCode"]) if decisive and decisive.get("exitCode") is not None else None
    sig = int(decisive["signal"]) if decisive and decisive.get("signal") else None
    c_reason = str(decisive.get("reason")) if decisive and decisive.get("reason") else None

    finished = phase in _TERMINAL_PHASES or all_done
    pod_reason = status.get("reason")
    disrupted = any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if finished:
        if c_reason and c_reason.lower() == OOM_REASON.lower():
            return made(code, sig, OOM_REASON)
        if code == 0 and phase != "Failed":
            return made(0, None, None)
        if pod_reason in _POD_REASONS:
            return made(code, sig, str(pod_reason))
        if disrupted:
            return made(code, sig, DISRUPTED_REASON)
        if code is not None or c_reason:
            return made(code, sig, c_reason)
        return made(None, None, str(pod_reason) if pod_reason else None)
    for w in waiting:
        reason = str(w.get("reason", ""))
        if reason in FATAL_WAITING_REASONS:
            return made(None, None, reason)
    if pod_reason in _POD_REASONS and phase not in ("Running", None):
        return made(code, sig, str(pod_reason))
    for c in status.get("conditions") or []:
        if (
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ):
            return "pending"
    return None


def _pod_resources(pod: Mapping[str, Any]) -> NodeResources:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == CONTAINER_NAME:
            lim = (c.get("resources") or {}).get("limits") or {}
            return NodeResources(
                cpu_millicores(lim["cpu"]) if "cpu" in lim else 0,
                memory_mib(lim["memory"]) if "memory" in lim else 0,
            )
    return NodeResources(0, 0)


def _parse_time(s: str | None) -> float | None:
    if not s:
        return None
    try:
        return _dt.datetime.fromisoformat(str(s).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _micro_time(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cpu_usage_millicores(q: str) -> int:
    """metrics.k8s.io reports CPU in nanocores ("123456789n") or microcores ("1234u")."""
    if q.endswith("n"):
        return round(int(q[:-1]) / 1_000_000)
    if q.endswith("u"):
        return round(int(q[:-1]) / 1_000)
    return cpu_millicores(q)
