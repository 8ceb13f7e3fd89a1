"""Kubernetes backend: every node is a pod, created with the official ``kubernetes`` client.

The mapping (DESIGN.md "On Kubernetes"); choices recorded here:

- **Pod.** ``node_to_pod`` (pure) builds it: labels ``app.kubernetes.io/name=dlrover-rm``,
  ``dlrover-rm/job``, ``dlrover-rm/role``, ``dlrover-rm/node-id``, ``dlrover-rm/incarnation``;
  an owner reference to the master pod (garbage collection: nothing outlives the job);
  ``restartPolicy: Never`` (the master relaunches, as a new incarnation); requests = limits =
  ``NodeSpec.resources`` (Guaranteed QoS); the container command is ``NodeSpec.argv`` and its
  env ``NodeSpec.env`` + the identity env (``base.ENV_*``) + ``ENV_BIND_HOST=0.0.0.0`` +
  ``ENV_ADVERTISE_HOST`` from the downward API (``status.podIP``); CPU ``resizePolicy``
  ``NotRequired`` (in-place CPU resize without a restart); the durable-state volume (a PVC)
  mounted at ``state_mount_path``, or ``ENV_STATE_URL`` (an fsspec URL). ``NodeSpec.log_path``
  is not used: a pod logs to stdout (``kubectl logs``).
- **Exits.** ``pod_exit`` (pure) reads a pod: every container's ``terminated`` state
  (OOMKilled wins, then the first non-zero exit), ``status.reason`` (Evicted, Shutdown, ...),
  the ``DisruptionTarget`` condition (preemption, taint eviction), fatal waiting reasons
  (ImagePullBackOff, ErrImagePull, InvalidImageName, CreateContainerConfigError,
  CreateContainerError: no relaunch can fix them) and ``PodScheduled=False/Unschedulable``
  (``"pending"``: the master's pending rule, ``faults.pending_action``, decides). A pod that
  vanishes without a terminal status was deleted: by us (``requested``) or by someone else
  (reason ``"Deleted"`` -> KILLED). Container exit codes are reported as the runtime gives them
  (``137`` = 128 + SIGKILL); ``classify_exit`` reads both spellings.
- **Observation.** A watcher thread lists the job's pods (label selector), then watches from
  the list's ``resourceVersion`` for ``resync_s``; ``410 Gone`` -> relist; every watch end ->
  relist (the periodic resync, which is also what keeps it correct against an API server whose
  watch does not stream, such as kmock). Each exit is queued once and handed out by ``poll``.
- **Failures of the API.** Every call retries on connection errors, 409 (where a retry can
  succeed), 429 and 5xx with exponential backoff and full jitter (tenacity). The job is never
  failed for that; only an outage longer than ``outage_s`` surfaces, as
  ``KubernetesUnavailableError`` from the call (or from ``poll`` for the watcher), naming the
  server and the last error.
- **Resize.** ``PATCH .../pods/{name}/resize`` (Kubernetes >= 1.33) through
  ``api_client.call_api`` (client 30.x has no method for it); refused (404/403/405/422, or
  disabled) -> ``False``: the caller relaunches.
- **Usage.** ``metrics.k8s.io/v1beta1`` PodMetrics (metrics-server); ``None`` where none is
  served.

Thread-safe: one lock guards the pod table; API calls run outside it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import math
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import tenacity
import urllib3
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from dlrover_core.errors import DLRoverError, ErrorKind, InputError
from dlrover_core.runtime.backends.base import (
    DELETED_REASON,
    DISRUPTED_REASON,
    ENV_ADVERTISE_HOST,
    ENV_BIND_HOST,
    FATAL_WAITING_REASONS,
    OOM_REASON,
    NodeExit,
    NodeHandle,
    NodeSpec,
    NodeUsage,
)
from dlrover_core.types import NodeResources, Role
from dlrover_core.units import cpu_millicores, format_cpu, memory_mib

__all__ = [
    "CONTAINER_NAME",
    "ENV_NAMESPACE",
    "ENV_POD_NAME",
    "ENV_STATE_DIR",
    "ENV_STATE_URL",
    "ENV_TOKEN",
    "LABEL_APP",
    "LABEL_INCARNATION",
    "LABEL_JOB",
    "LABEL_NODE_ID",
    "LABEL_ROLE",
    "KubernetesBackend",
    "KubernetesLease",
    "KubernetesUnavailableError",
    "OwnerRef",
    "PodConfig",
    "RetryPolicy",
    "backend_from_spec",
    "job_selector",
    "node_to_pod",
    "owner_for_master",
    "pod_exit",
    "pod_name",
]

log = logging.getLogger(__name__)

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

ENV_POD_NAME = "DLROVER_RM_POD_NAME"
ENV_NAMESPACE = "DLROVER_RM_NAMESPACE"
ENV_STATE_DIR = "DLROVER_RM_STATE_DIR"
ENV_STATE_URL = "DLROVER_RM_STATE_URL"
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
_T = TypeVar("_T")


class KubernetesUnavailableError(DLRoverError):
    """The Kubernetes API server stayed unreachable (or overloaded) past the outage bound."""

    kind = ErrorKind.UNAVAILABLE


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
    threads = str(max(1, round(spec.resources.cpu_cores)))
    plain: dict[str, str] = {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        ENV_BIND_HOST: BIND_ALL,
        **spec.identity_env(),
        ENV_NAMESPACE: cfg.namespace,
        **spec.env,
    }
    if cfg.state_pvc:
        plain.setdefault(ENV_STATE_DIR, cfg.state_mount_path)
    if cfg.state_url:
        plain.setdefault(ENV_STATE_URL, cfg.state_url)
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


# --------------------------------------------------------------------------- retries


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for API calls: exponential from ``initial_s`` up to ``max_s`` with full jitter;
    a call gives up (``KubernetesUnavailableError``) once the server has failed for
    ``outage_s`` in a row."""

    initial_s: float = 0.2
    max_s: float = 10.0
    outage_s: float = 300.0
    request_timeout_s: float = 15.0

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s or self.outage_s <= 0:
            raise InputError(f"retry policy {self}: need 0 < initial_s <= max_s and outage_s > 0")


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in _RETRY_STATUSES or exc.status == 0
    return isinstance(
        exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError | socket.error
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}".strip()
    return f"{type(exc).__name__}: {exc}"


class _Caller:
    """Runs API calls with the retry policy; ``no_retry`` statuses are returned to the caller
    as the ``ApiException`` (e.g. 409 on create means 'already there')."""

    def __init__(self, host: str, policy: RetryPolicy, stop: threading.Event | None = None) -> None:
        self.host = host
        self.policy = policy
        self.stop = stop  # set: give up retrying at once (the backend is shutting down)

    def __call__(self, what: str, fn: Callable[[], _T], *, no_retry: Sequence[int] = ()) -> _T:
        p = self.policy

        def retryable(exc: BaseException) -> bool:
            if isinstance(exc, ApiException) and exc.status in no_retry:
                return False
            return _transient(exc)

        def before_sleep(rs: tenacity.RetryCallState) -> None:
            exc = rs.outcome.exception() if rs.outcome else None
            log.warning(
                "kubernetes API %s: %s; retry %d in %.1f s",
                what,
                _describe(exc) if exc else "?",
                rs.attempt_number,
                rs.next_action.sleep if rs.next_action else 0.0,
            )

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(retryable),
            wait=tenacity.wait_random_exponential(multiplier=p.initial_s, max=p.max_s),
            stop=tenacity.stop_after_delay(p.outage_s)
            | tenacity.stop_when_event_set(self.stop or threading.Event()),
            before_sleep=before_sleep,
            reraise=False,
        )
        try:
            return retrying(fn)
        except tenacity.RetryError as err:
            last = err.last_attempt.exception()
            raise KubernetesUnavailableError(
                f"the Kubernetes API at {self.host} failed for {p.outage_s:.0f} s while "
                f"trying to {what} (last: {_describe(last) if last else 'unknown'}); check "
                "the API server and this pod's network, or raise backend.api_outage_s"
            ) from last


# --------------------------------------------------------------------------- the backend


@dataclass
class _Pod:
    handle: NodeHandle
    resources: NodeResources
    created_mono: float
    seen: bool = False
    requested: bool = False
    fatal_deleting: bool = False
    pending_since: float | None = None
    last: dict[str, Any] | None = None
    exit: NodeExit | None = None


def _as_dict(obj: Any) -> dict[str, Any]:
    """The JSON form of an API answer: a raw response (``_preload_content=False``), a model
    object, or a dict already."""
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, urllib3.response.BaseHTTPResponse):
        out = json.loads(obj.data or b"{}")
    else:
        out = k8s.ApiClient().sanitize_for_serialization(obj)
    return out if isinstance(out, dict) else {}


class KubernetesBackend:
    """Nodes as pods in one namespace. See the module docstring for the mapping."""

    def __init__(
        self,
        namespace: str,
        image: str,
        job_name: str,
        owner: OwnerRef | None = None,
        *,
        service_account: str | None = None,
        state_pvc: str | None = None,
        state_mount_path: str = "/var/lib/dlrover-rm",
        state_url: str | None = None,
        token_secret: str | None = None,
        master_service: str | None = None,
        api_client: k8s.ApiClient | None = None,
        clock: Callable[[], float] = time.time,
        retry: RetryPolicy | None = None,
        resync_s: float = 10.0,
        watch: bool = True,
        resize_enabled: bool = True,
        keep_failed_pods: bool = True,
        termination_grace_s: int = 30,
        image_pull_policy: str = "IfNotPresent",
    ) -> None:
        self.cfg = PodConfig(
            namespace=namespace,
            image=image,
            job_name=job_name,
            owner=owner,
            service_account=service_account,
            state_pvc=state_pvc,
            state_mount_path=state_mount_path,
            state_url=state_url,
            token_secret=token_secret,
            termination_grace_s=termination_grace_s,
            image_pull_policy=image_pull_policy,
        )
        if resync_s <= 0:
            raise InputError(f"resync_s must be > 0, got {resync_s}")
        if api_client is None:
            api_client = _default_client()
        self.api = api_client
        self.core = k8s.CoreV1Api(api_client)
        self._stopping = threading.Event()
        self._call = _Caller(
            str(api_client.configuration.host), retry or RetryPolicy(), self._stopping
        )
        self._timeout = (retry or RetryPolicy()).request_timeout_s
        self._clock = clock
        self._resync_s = resync_s
        self._use_watch = watch
        self._resize_enabled = resize_enabled
        self._keep_failed = keep_failed_pods
        self._master_service = master_service
        self._lock = threading.RLock()
        self._pods: dict[str, _Pod] = {}
        self._exits: list[NodeExit] = []
        self._error: KubernetesUnavailableError | None = None
        self._kick = threading.Event()
        self._watcher: threading.Thread | None = None
        self._closed = False
        self._resource_version: str | None = None
        self.relists = 0  # how many full lists the watcher made (tests, metrics)

    # ------------------------------------------------------------------ protocol

    def launch(self, spec: NodeSpec) -> NodeHandle:
        pod = node_to_pod(spec, self.cfg)
        name = str(pod.metadata.name)
        with self._lock:
            if self._closed:
                raise InputError("the Kubernetes backend is shut down; create a new one")
            old = self._pods.get(name)
            if old is not None and old.exit is None:
                raise InputError(
                    f"{spec.name} is already running (pod {name}); relaunch it with the next "
                    "incarnation or stop it first"
                )
        created_mono = time.monotonic()

        def create() -> None:
            try:
                self.core.create_namespaced_pod(
                    self.cfg.namespace, pod, _request_timeout=self._timeout, _preload_content=False
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
                whose = self._whose(name, spec)
                if whose == "ours":
                    return  # an earlier attempt got through before its answer was lost
                if whose == "foreign":
                    raise InputError(
                        f"pod {name} already exists in namespace {self.cfg.namespace} and is "
                        f"not {spec.name} of job {self.cfg.job_name}; delete it or rename the job"
                    ) from exc
                raise  # a conflict without the pod: retried

        try:
            self._call(f"create pod {name}", create)
        except ApiException as exc:
            raise InputError(
                f"the API server refused pod {name}: HTTP {exc.status} {exc.reason}; "
                f"{_status_message(exc)}"
            ) from exc
        handle = NodeHandle(spec.role, spec.node_id, spec.incarnation, name, self._clock())
        with self._lock:
            self._pods[name] = _Pod(handle, spec.resources, created_mono)
            self._ensure_watcher()
        return handle

    def poll(self) -> list[NodeExit]:
        with self._lock:
            if self._error is not None:
                raise self._error
            out, self._exits = self._exits, []
        return out

    def stop(self, handle: NodeHandle, grace_s: float = 5.0, *, wait: bool = True) -> None:
        """Delete the pod with ``grace_s`` (the kubelet sends SIGTERM, then SIGKILL after the
        grace). With ``wait``, return once the exit has been seen (or the wait ran out)."""
        node = self._node(handle)
        with self._lock:
            if node.exit is not None:
                return
            node.requested = True
        self._delete(handle.ref, max(0, math.ceil(grace_s)))
        if wait:
            self._wait_exit(node, max(0.0, grace_s) + 10.0)

    def kill(self, handle: NodeHandle) -> None:
        """Delete the pod at once (grace 0) and wait briefly for its exit."""
        node = self._node(handle)
        with self._lock:
            if node.exit is not None:
                return
            node.requested = True
        self._delete(handle.ref, 0)
        self._wait_exit(node, 10.0)

    def usage(self, handle: NodeHandle) -> NodeUsage | None:
        with self._lock:
            node = self._pods.get(handle.ref)
            if node is None or node.handle != handle or node.exit is not None:
                return None
        custom = k8s.CustomObjectsApi(self.api)
        try:
            m = custom.get_namespaced_custom_object(
                "metrics.k8s.io",
                "v1beta1",
                self.cfg.namespace,
                "pods",
                handle.ref,
                _request_timeout=self._timeout,
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError):
            return None  # no metrics-server, or no sample yet: not worth a retry
        cpu_m = 0
        mem = 0
        try:
            for c in m.get("containers") or []:
                u = c.get("usage") or {}
                cpu_m += _cpu_usage_millicores(str(u.get("cpu", "0")))
                mem += memory_mib(str(u.get("memory", "0")))
        except (InputError, ValueError):
            return None
        return NodeUsage(cpu_percent=cpu_m / 10.0, rss_mib=float(mem))

    def alive(self, handle: NodeHandle) -> bool:
        with self._lock:
            node = self._pods.get(handle.ref)
            return node is not None and node.handle == handle and node.exit is None

    def adopt(self, role: Role, node_id: int, incarnation: int, ref: str) -> NodeHandle | None:
        """Take over pod ``ref`` after a master restart: ``None`` when it is gone, ended,
        being deleted, or is not that node of this job."""
        try:
            raw = self._call(
                f"read pod {ref}",
                lambda: self.core.read_namespaced_pod(
                    ref, self.cfg.namespace, _request_timeout=self._timeout, _preload_content=False
                ),
                no_retry=(404,),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        pod = _as_dict(raw)
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(LABEL_JOB) != self.cfg.job_name or _identity(pod) != (
            role,
            node_id,
            incarnation,
        ):
            return None
        if meta.get("deletionTimestamp") or isinstance(pod_exit(pod), NodeExit):
            return None
        created = _parse_time(meta.get("creationTimestamp"))
        age = max(0.0, time.time() - created) if created is not None else 0.0
        handle = NodeHandle(role, node_id, incarnation, ref, self._clock() - age)
        node = _Pod(handle, _pod_resources(pod), time.monotonic() - age, seen=True, last=pod)
        with self._lock:
            if self._closed:
                raise InputError("the Kubernetes backend is shut down; create a new one")
            self._pods[ref] = node
            self._ensure_watcher()
        return handle

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Delete every pod still running (grace ``grace_s``), wait for their exits (they stay
        available to one last ``poll``), end the watcher. Ended pods are left to the owner
        reference's garbage collection (their logs stay readable until then)."""
        with self._lock:
            self._closed = True
            live = [n for n in self._pods.values() if n.exit is None]
            for n in live:
                n.requested = True
        for n in live:
            try:
                self._delete(n.handle.ref, max(0, math.ceil(grace_s)))
            except KubernetesUnavailableError:
                log.error("cannot delete pod %s: the API is unreachable", n.handle.ref)
        deadline = time.monotonic() + max(0.0, grace_s) + 10.0
        for n in live:
            self._wait_exit(n, max(0.0, deadline - time.monotonic()))
        self._stopping.set()
        self._kick.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=self._timeout + 2.0)

    def endpoint(self) -> tuple[str, str]:
        """Bind every interface; advertise the master's Service DNS name when there is one
        (stable across master restarts), else this pod's IP (``POD_IP``, downward API), else
        this host's name."""
        if self._master_service:
            return BIND_ALL, f"{self._master_service}.{self.cfg.namespace}.svc"
        ip = os.environ.get("POD_IP")
        return BIND_ALL, ip or socket.gethostname()

    def resize(self, handle: NodeHandle, resources: NodeResources) -> bool:
        """Ask the API server to change the pod's CPU in place (``pods/resize``). ``False``
        when disabled, the memory differs, the node has ended, or the server refuses."""
        with self._lock:
            node = self._pods.get(handle.ref)
            if (
                not self._resize_enabled
                or node is None
                or node.handle != handle
                or node.exit is not None
                or resources.memory_mib != node.resources.memory_mib
                or resources.cpu_millicores <= 0
            ):
                return False
        cpu = format_cpu(resources.cpu_millicores)
        body = {
            "spec": {
                "containers": [
                    {
                        "name": CONTAINER_NAME,
                        "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}},
                    }
                ]
            }
        }

        def patch() -> Any:
            return self.api.call_api(
                "/api/v1/namespaces/{namespace}/pods/{name}/resize",
                "PATCH",
                path_params={"namespace": self.cfg.namespace, "name": handle.ref},
                header_params={
                    "Content-Type": "application/strategic-merge-patch+json",
                    "Accept": "application/json",
                },
                body=body,
                response_type="object",
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=self._timeout,
            )

        try:
            self._call(f"resize pod {handle.ref}", patch, no_retry=tuple(_REFUSED_RESIZE))
        except ApiException as exc:
            log.info("resize of %s refused: HTTP %s %s", handle.ref, exc.status, exc.reason)
            return False
        with self._lock:
            node.resources = resources
        return True

    # ------------------------------------------------------------------ extras

    def pending_since(self, handle: NodeHandle) -> float | None:
        """When (this backend's clock) the pod was first seen unschedulable; ``None`` when it
        is not pending. The master applies ``faults.pending_action`` to it."""
        with self._lock:
            node = self._pods.get(handle.ref)
            return node.pending_since if node is not None and node.exit is None else None

    def pod(self, handle: NodeHandle) -> dict[str, Any] | None:
        """The pod as last observed (JSON form)."""
        with self._lock:
            node = self._pods.get(handle.ref)
            return node.last if node is not None else None

    def handles(self) -> list[NodeHandle]:
        with self._lock:
            return [n.handle for n in self._pods.values() if n.exit is None]

    def event(
        self, handle: NodeHandle, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """Record a Kubernetes Event on the node's pod (``kubectl describe pod`` shows why the
        master relaunched, resized or stopped it). Best effort: never raises for the API."""
        now = _dt.datetime.now(tz=_dt.UTC)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{handle.ref}.",
                "name": f"{handle.ref}.{int(now.timestamp() * 1e6):x}",
                "namespace": self.cfg.namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": handle.ref,
                "namespace": self.cfg.namespace,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "dlrover-rm-master"},
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(
                self.cfg.namespace, body, _request_timeout=self._timeout, _preload_content=False
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.info("could not record event %s on %s: %s", reason, handle.ref, _describe(exc))

    def sync(self) -> None:
        """One reconcile by list now (the watcher does this on its own; tests call it to
        avoid waiting)."""
        self._relist()

    # ------------------------------------------------------------------ internals

    def _whose(self, name: str, spec: NodeSpec) -> Literal["ours", "foreign"] | None:
        """Whether pod ``name`` is this very node of this job, someone else's, or absent."""
        try:
            pod = _as_dict(
                self._call(
                    f"read pod {name}",
                    lambda: self.core.read_namespaced_pod(
                        name,
                        self.cfg.namespace,
                        _request_timeout=self._timeout,
                        _preload_content=False,
                    ),
                    no_retry=(404,),
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        labels = (pod.get("metadata") or {}).get("labels") or {}
        ours = labels.get(LABEL_JOB) == self.cfg.job_name and _identity(pod) == (
            spec.role,
            spec.node_id,
            spec.incarnation,
        )
        return "ours" if ours else "foreign"

    def _node(self, handle: NodeHandle) -> _Pod:
        with self._lock:
            node = self._pods.get(handle.ref)
            if node is None or node.handle != handle:
                raise InputError(
                    f"{handle.name} (pod {handle.ref}) is not managed by this backend; adopt "
                    "it first (after a master restart) or launch it"
                )
            return node

    def _delete(self, name: str, grace_s: int) -> None:
        try:
            self._call(
                f"delete pod {name}",
                lambda: self.core.delete_namespaced_pod(
                    name,
                    self.cfg.namespace,
                    grace_period_seconds=grace_s,
                    propagation_policy="Background",
                    _request_timeout=self._timeout,
                ),
                no_retry=(404,),
            )
        except ApiException as exc:
            if exc.status != 404:  # already gone: the watcher reports it
                raise
        self._kick.set()

    def _wait_exit(self, node: _Pod, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if node.exit is not None:
                    return
            try:
                self._check_one(node)
            except KubernetesUnavailableError:
                return
            with self._lock:
                if node.exit is not None:
                    return
            time.sleep(0.1)

    def _check_one(self, node: _Pod) -> None:
        """Read one pod now (stop/kill waiting for its end)."""
        name = node.handle.ref
        try:
            raw = self._call(
                f"read pod {name}",
                lambda: self.core.read_namespaced_pod(
                    name,
                    self.cfg.namespace,
                    _request_timeout=self._timeout,
                    _preload_content=False,
                ),
                no_retry=(404,),
            )
        except ApiException as exc:
            if exc.status == 404:
                with self._lock:
                    self._gone(node)
                return
            raise
        with self._lock:
            self._observe(_as_dict(raw))

    def _ensure_watcher(self) -> None:
        if self._watcher is None or not self._watcher.is_alive():
            self._stopping.clear()
            self._watcher = threading.Thread(
                target=self._run_watcher, name="kubernetes-backend-watch", daemon=True
            )
            self._watcher.start()

    def _run_watcher(self) -> None:
        while not self._stopping.is_set():
            try:
                self._relist()
                if self._use_watch:
                    self._watch()
                else:
                    self._kick.wait(self._resync_s)
                    self._kick.clear()
            except KubernetesUnavailableError as exc:
                if self._stopping.is_set():
                    return
                log.error("%s", exc)
                with self._lock:
                    self._error = exc
                return
            except Exception:  # never let the watcher die silently: resync after a pause
                log.exception("kubernetes backend watcher failed; relisting")
                self._stopping.wait(min(self._resync_s, 1.0))

    def _relist(self) -> None:
        started = time.monotonic()
        result = self._call(
            "list pods",
            lambda: self.core.list_namespaced_pod(
                self.cfg.namespace,
                label_selector=job_selector(self.cfg.job_name),
                _request_timeout=self._timeout,
                _preload_content=False,
            ),
        )
        data = _as_dict(result)
        items = data.get("items") or []
        self.relists += 1
        with self._lock:
            self._resource_version = (data.get("metadata") or {}).get("resourceVersion")
            present = set()
            for pod in items:
                name = (pod.get("metadata") or {}).get("name")
                present.add(name)
                self._observe(pod)
            suspects = [
                n
                for name, n in self._pods.items()
                if n.exit is None and name not in present and n.created_mono < started
            ]
        for n in suspects:  # confirm by name before calling it gone (a list can lag a create)
            self._check_one(n)

    def _watch(self) -> None:
        from kubernetes import watch as k8s_watch

        rv = self._resource_version
        w = k8s_watch.Watch()
        try:
            for event in w.stream(
                self.core.list_namespaced_pod,
                self.cfg.namespace,
                label_selector=job_selector(self.cfg.job_name),
                resource_version=rv,
                timeout_seconds=max(1, int(self._resync_s)),
                allow_watch_bookmarks=True,
                _request_timeout=self._resync_s + self._timeout,
            ):
                if self._stopping.is_set() or self._kick.is_set():
                    self._kick.clear()
                    break
                pod = event.get("raw_object") or {}
                with self._lock:
                    if event.get("type") == "DELETED":
                        name = (pod.get("metadata") or {}).get("name")
                        self._observe(pod)
                        node = self._pods.get(str(name))
                        if node is not None:
                            self._gone(node)
                    else:
                        self._observe(pod)
        except ApiException as exc:
            if exc.status == 410:
                log.info("watch: resourceVersion %s expired (410 Gone); relisting", rv)
                return
            if _transient(exc):
                time.sleep(min(self._resync_s, 1.0))
                return
            raise
        except (urllib3.exceptions.HTTPError, OSError):
            time.sleep(min(self._resync_s, 1.0))
        finally:
            w.stop()

    def _observe(self, pod: dict[str, Any]) -> None:
        """Fold one observed pod into the table (under the lock)."""
        name = (pod.get("metadata") or {}).get("name")
        node = self._pods.get(str(name))
        if node is None or node.exit is not None:
            return
        labels = (pod.get("metadata") or {}).get("labels") or {}
        h = node.handle
        if labels.get(LABEL_INCARNATION) != str(h.incarnation):
            return  # a different pod under a reused name
        node.seen = True
        node.last = pod
        out = pod_exit(pod, at_s=self._clock(), requested=node.requested)
        if out == "pending":
            if node.pending_since is None:
                node.pending_since = self._clock()
            return
        if out is None:
            node.pending_since = None
            return
        assert isinstance(out, NodeExit)
        self._record(node, out)
        finished_ok = out.exit_code == 0
        fatal_waiting = out.reason in FATAL_WAITING_REASONS
        if fatal_waiting or finished_ok or not self._keep_failed:
            # a pod stuck on its image would retry forever; a finished one only takes space
            threading.Thread(
                target=self._delete_quietly, args=(h.ref,), daemon=True, name="pod-cleanup"
            ).start()

    def _delete_quietly(self, name: str) -> None:
        with contextlib.suppress(ApiException, KubernetesUnavailableError):
            self._delete(name, 0)

    def _gone(self, node: _Pod) -> None:
        """The pod no longer exists and no terminal status was seen (under the lock)."""
        if node.exit is not None:
            return
        h = node.handle
        last = node.last
        code: int | None = None
        sig: int | None = None
        if last is not None:
            seen = pod_exit(last, at_s=self._clock(), requested=node.requested)
            if isinstance(seen, NodeExit):
                self._record(node, seen)
                return
        if node.requested:
            sig, reason = int(signal.SIGTERM), None
        else:
            reason = DELETED_REASON
        self._record(
            node,
            NodeExit(
                role=h.role,
                node_id=h.node_id,
                incarnation=h.incarnation,
                exit_code=code,
                signal=sig,
                reason=reason,
                at_s=self._clock(),
                ref=h.ref,
                requested=node.requested,
            ),
        )

    def _record(self, node: _Pod, exit_: NodeExit) -> None:
        if node.exit is not None:
            return
        node.exit = exit_
        node.pending_since = None
        self._exits.append(exit_)


def _cpu_usage_millicores(q: str) -> int:
    """metrics.k8s.io reports CPU in nanocores ("123456789n") or microcores ("1234u")."""
    if q.endswith("n"):
        return round(int(q[:-1]) / 1_000_000)
    if q.endswith("u"):
        return round(int(q[:-1]) / 1_000)
    return cpu_millicores(q)


def _status_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(exc.body or "")[:200]
    return str(body.get("message", ""))[:300]


def _default_client() -> k8s.ApiClient:
    """In-cluster config when running in a pod, else the local kubeconfig."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise InputError(
                "no Kubernetes API to talk to: not running in a pod and no kubeconfig "
                f"({exc}); run inside the cluster or set KUBECONFIG"
            ) from exc
    return k8s.ApiClient()


# --------------------------------------------------------------------------- the run lease


class KubernetesLease:
    """One master per run: a ``coordination.k8s.io/v1`` Lease named ``name``. A master holds
    it while it renews within ``duration_s``; another takes it over only once it has expired
    (renewTime + leaseDurationSeconds in the past). Writes use the Lease's resourceVersion,
    so two masters racing for an expired lease cannot both win (one gets 409)."""

    def __init__(
        self,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration_s: float = 15.0,
        api_client: k8s.ApiClient | None = None,
        clock: Callable[[], float] = time.time,
        retry: RetryPolicy | None = None,
    ) -> None:
        if duration_s <= 0:
            raise InputError(f"lease duration_s must be > 0, got {duration_s}")
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration_s = duration_s
        api_client = api_client or _default_client()
        self.api = k8s.CoordinationV1Api(api_client)
        # a lease that cannot be renewed within its duration is lost: never retry longer
        policy = retry or RetryPolicy(initial_s=0.2, max_s=2.0, outage_s=max(1.0, duration_s / 2))
        self._call = _Caller(str(api_client.configuration.host), policy)
        self._clock = clock
        self._held_renewed: float | None = None

    def _read(self) -> dict[str, Any] | None:
        try:
            return _as_dict(
                self._call(
                    f"read lease {self.name}",
                    lambda: self.api.read_namespaced_lease(
                        self.name, self.namespace, _preload_content=False
                    ),
                    no_retry=(404,),
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _body(self, now: float, transitions: int, acquired: str | None, rv: str | None) -> dict:
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {LABEL_APP: APP},
        }
        if rv is not None:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, math.ceil(self.duration_s)),
                "acquireTime": acquired or _micro_time(now),
                "renewTime": _micro_time(now),
                "leaseTransitions": transitions,
            },
        }

    def _write(self, body: dict, rv: str | None) -> bool:
        """Create (``rv`` None) or replace; ``False`` on 409 (someone else wrote first)."""
        try:
            if rv is None:
                self._call(
                    f"create lease {self.name}",
                    lambda: self.api.create_namespaced_lease(self.namespace, body),
                    no_retry=(409,),
                )
            else:
                self._call(
                    f"renew lease {self.name}",
                    lambda: self.api.replace_namespaced_lease(self.name, self.namespace, body),
                    no_retry=(409,),
                )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def acquire(self) -> str | None:
        now = self._clock()
        cur = self._read()
        if cur is None:
            if self._write(self._body(now, 0, None, None), None):
                self._held_renewed = now
                return None
            cur = self._read()
            if cur is None:
                return "another master is creating the lease; try again"
        spec = cur.get("spec") or {}
        rv = (cur.get("metadata") or {}).get("resourceVersion")
        holder = spec.get("holderIdentity")
        renewed = _parse_time(spec.get("renewTime")) or 0.0
        duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            body = self._body(now, transitions, spec.get("acquireTime"), rv)
        elif not holder or renewed + duration < now:
            body = self._body(now, transitions + 1, None, rv)
        else:
            return (
                f"{holder} since {spec.get('acquireTime')} (renewed {spec.get('renewTime')}, "
                f"expires in {renewed + duration - now:.0f} s)"
            )
        if self._write(body, rv):
            self._held_renewed = now
            return None
        cur = self._read() or {}
        return f"{(cur.get('spec') or {}).get('holderIdentity')} took the lease first"

    def renew(self) -> bool:
        held = self._held_renewed
        if held is None:
            return False
        now = self._clock()
        try:
            cur = self._read()
            if cur is None or (cur.get("spec") or {}).get("holderIdentity") != self.identity:
                self._held_renewed = None
                return False
            spec = cur["spec"]
            rv = (cur.get("metadata") or {}).get("resourceVersion")
            body = self._body(
                now, int(spec.get("leaseTransitions") or 0), spec.get("acquireTime"), rv
            )
            if not self._write(body, rv):
                self._held_renewed = None
                return False
        except KubernetesUnavailableError:
            # cannot reach the API: still ours until the lease would have expired
            if now - held < self.duration_s:
                return True
            self._held_renewed = None
            return False
        self._held_renewed = now
        return True

    def release(self) -> None:
        if self._held_renewed is None:
            return
        self._held_renewed = None
        with contextlib.suppress(ApiException, KubernetesUnavailableError):
            cur = self._read()
            if cur is None or (cur.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            rv = (cur.get("metadata") or {}).get("resourceVersion")
            body = self._body(
                self._clock(), int(cur["spec"].get("leaseTransitions") or 0), None, rv
            )
            body["spec"]["holderIdentity"] = None
            body["spec"]["renewTime"] = None
            self._write(body, rv)


def iter_job_pods(api_client: k8s.ApiClient, namespace: str, job_name: str) -> Iterator[dict]:
    """Every node pod of ``job_name`` (JSON form): ``dlrover-rm status/cancel`` use it."""
    core = k8s.CoreV1Api(api_client)
    data = _as_dict(
        core.list_namespaced_pod(
            namespace, label_selector=job_selector(job_name), _preload_content=False
        )
    )
    yield from data.get("items") or []


def owner_for_master(api_client: k8s.ApiClient, namespace: str, pod_name: str) -> OwnerRef:
    """What the node pods should be owned by when the master runs in pod ``pod_name``: the
    Job controlling that pod when there is one (``dlrover-rm submit``: the nodes then outlive a
    master pod the Job replaces, and the new master adopts them), else the pod itself (a KFP
    or Airflow task pod: the nodes go with it)."""
    core = k8s.CoreV1Api(api_client)
    pod = _as_dict(core.read_namespaced_pod(pod_name, namespace, _preload_content=False))
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Job":
            return OwnerRef(
                name=str(ref["name"]),
                uid=str(ref["uid"]),
                kind="Job",
                api_version=str(ref.get("apiVersion", "batch/v1")),
            )
    return OwnerRef(name=pod_name, uid=str(meta.get("uid", "")))


def backend_from_spec(
    backend: Any,
    job_name: str,
    *,
    owner: OwnerRef | None = None,
    token_secret: str | None = None,
    master_service: str | None = None,
    api_client: k8s.ApiClient | None = None,
    clock: Callable[[], float] = time.time,
) -> KubernetesBackend:
    """A ``KubernetesBackend`` from a validated ``spec.BackendSpec`` (``kind: kubernetes``)."""
    if getattr(backend, "kind", None) != "kubernetes":
        raise InputError(f"backend.kind is {getattr(backend, 'kind', None)!r}, not 'kubernetes'")
    if not backend.state_pvc and not backend.state_url:
        raise InputError(
            "backend.state_pvc or backend.state_url is required to run nodes on Kubernetes: "
            "PS checkpoints and the master's state must outlive a pod (a ReadWriteMany PVC "
            "name, e.g. dlrover-rm-state from deploy/kubernetes/pvc.yaml, or an fsspec URL)"
        )
    return KubernetesBackend(
        backend.namespace,
        backend.image,
        job_name,
        owner,
        service_account=backend.service_account,
        state_pvc=backend.state_pvc,
        state_mount_path=backend.state_mount_path,
        state_url=backend.state_url,
        token_secret=token_secret,
        master_service=master_service,
        api_client=api_client,
        clock=clock,
        retry=RetryPolicy(
            initial_s=backend.api_retry_initial_s,
            max_s=backend.api_retry_max_s,
            outage_s=backend.api_outage_s,
        ),
        resync_s=backend.resync_s,
        resize_enabled=backend.resize,
        termination_grace_s=backend.termination_grace_s,
        image_pull_policy=backend.image_pull_policy,
    )
