"""``dlrover-rm submit / status / cancel`` on Kubernetes: the master as a Kubernetes Job.

The pure half builds the objects one job needs (plain JSON-able dicts, validated against the
official schemas in the tests), in the order they are created:

1. the state ``PersistentVolumeClaim`` (``<job>-state``, ReadWriteMany: a new PS pod on another
   machine reads the checkpoints the old one wrote) — unless the spec names an existing claim
   or an fsspec URL;
2. the token ``Secret`` (``<job>-token``, key ``token``): every node's and the master's gRPC
   endpoint checks it;
3. the spec ``ConfigMap`` (``<job>-spec``, key ``spec.yaml``, and ``plan.json`` when a plan
   is given) the master reads;
4. the master ``Service`` (``<job>-master``, headless): a DNS name the nodes keep reaching
   when the Job replaces the master pod;
5. a ``NetworkPolicy`` (``<job>-isolation``): the job's pods admit traffic only from the job's
   own pods;
6. the master ``Job`` (``<job>-master``): ``restartPolicy: Never`` with a ``backoffLimit``, so
   the control plane starts a new master pod (on any machine) when one dies; it resumes from
   its durable state on the volume and adopts the node pods, which the Job owns.

With a history store URL (it may hold a password) ``submit`` also creates the history
``Secret`` (``<job>-history``, key ``url``) before the Job and makes the Job its owner after,
so it is garbage-collected with the Job; the master reads it as ``$DLROVER_RM_HISTORY``
(``secretKeyRef``). A Secret of the user's own (``history_secret``) is referenced the same way.
The URL never goes into the ConfigMap, the master's command line or a log line.

``follow`` (and the pure ``new_log_lines`` / ``job_outcome`` under it) waits for a submitted
job through the API, streaming its master's log: the KFP train task and the Airflow trigger
use the same rules.

The IO half (``submit``, ``status``, ``cancel``) talks to the API server with the official
client; the CLI calls them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from dlrover_core.errors import InputError
from dlrover_core.runtime.backends.base import NodeExit
from dlrover_core.runtime.backends.kubernetes_pods import (
    APP,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_STATE_DIR,
    ENV_STATE_MOUNT,
    ENV_STATE_URL,
    ENV_TOKEN,
    ENV_TOKEN_FILE,
    LABEL_APP,
    LABEL_INCARNATION,
    LABEL_JOB,
    LABEL_NODE_ID,
    LABEL_ROLE,
    TOKEN_MOUNT_PATH,
    job_selector,
    pod_exit,
)
from dlrover_core.units import format_cpu

__all__ = [
    "ENV_HISTORY",
    "ENV_LEASE",
    "ENV_MASTER_SERVICE",
    "ENV_POD_IP",
    "ENV_POD_UID",
    "ENV_TOKEN_SECRET",
    "MasterConfig",
    "cancel",
    "history_secret",
    "job_network_policy",
    "job_outcome",
    "master_job",
    "master_logs",
    "master_service",
    "new_log_lines",
    "spec_configmap",
    "state_pvc",
    "status",
    "submit",
    "submit_objects",
    "token_secret",
]

MASTER_ROLE = "master"
SPEC_MOUNT_PATH = "/etc/dlrover-rm"
ENV_POD_UID = "POD_UID"
ENV_POD_IP = "POD_IP"
ENV_MASTER_SERVICE = "DLROVER_RM_MASTER_SERVICE"
ENV_TOKEN_SECRET = "DLROVER_RM_TOKEN_SECRET"
ENV_LEASE = "DLROVER_RM_LEASE"
ENV_HISTORY = "DLROVER_RM_HISTORY"  # = dlrover_core.history.store.ENV_VAR (no SQLAlchemy here)
HISTORY_SECRET_KEY = "url"


class JobExistsError(InputError):
    """A job of that name is already submitted (a retried pipeline step may attach to it)."""


class JobGoneError(InputError):
    """No master Job of that name (never submitted, cancelled or deleted)."""


@dataclass(frozen=True)
class MasterConfig:
    """What ``submit`` needs besides the spec itself: ``job_name`` and the backend fields come
    from the validated spec (``MasterConfig.from_spec``); the master's own size from the
    plan's master share."""

    job_name: str
    namespace: str
    image: str
    spec_yaml: str
    state_pvc: str | None = None  # None: create <job>-state (unless state_url is given)
    state_url: str | None = None
    state_mount_path: str = "/var/lib/dlrover-rm"
    cpu_millicores: int = 1000
    memory_mib: int = 2048
    service_account: str = "dlrover-rm-master"
    image_pull_policy: str = "IfNotPresent"
    port: int = 50051
    backoff_limit: int = 6
    ttl_after_finished_s: int = 7 * 86400
    pvc_size: str = "20Gi"
    storage_class: str | None = None
    metrics_port: int | None = None  # pacing.metrics_port: scraped through prometheus.io/*
    plan_json: str | None = None  # a plan from `plan` (None: the master plans the job itself)
    # (Secret name, key) holding the history store URL: the master's $DLROVER_RM_HISTORY
    history_secret: tuple[str, str] | None = None

    @classmethod
    def from_spec(cls, spec: Any, spec_yaml: str, **overrides: Any) -> MasterConfig:
        b = spec.backend
        if b.kind != "kubernetes":
            raise InputError(
                f"backend.kind is {b.kind!r}: submit runs the master on Kubernetes; set "
                "backend.kind: kubernetes (with namespace, image and state_pvc or state_url)"
            )
        kw: dict[str, Any] = {
            "job_name": spec.name,
            "namespace": b.namespace,
            "image": b.image,
            "spec_yaml": spec_yaml,
            "state_pvc": b.state_pvc,
            "state_url": b.state_url,
            "state_mount_path": b.state_mount_path,
            "image_pull_policy": b.image_pull_policy,
            "metrics_port": spec.pacing.metrics_port,
        }
        kw.update(overrides)
        if kw["metrics_port"] == 0:
            raise InputError(
                "pacing.metrics_port is 0 (any free port): on Kubernetes a scraper must know "
                "the port; set a fixed one (e.g. 9100), or null for no metrics"
            )
        return cls(**kw)

    @property
    def master_name(self) -> str:
        return f"{self.job_name}-master"

    @property
    def token_name(self) -> str:
        return f"{self.job_name}-token"

    @property
    def spec_name(self) -> str:
        return f"{self.job_name}-spec"

    @property
    def pvc_name(self) -> str | None:
        if self.state_pvc:
            return self.state_pvc
        return None if self.state_url else default_pvc_name(self.job_name)

    @property
    def history_secret_name(self) -> str:
        """The history Secret ``submit`` makes from a URL (``<job>-history``)."""
        return f"{self.job_name}-history"

    @property
    def lease_name(self) -> str:
        return f"{self.job_name}-master"

    def labels(self, role: str = MASTER_ROLE) -> dict[str, str]:
        return {LABEL_APP: APP, LABEL_JOB: self.job_name, LABEL_ROLE: role}


def _meta(cfg: MasterConfig, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": cfg.namespace, "labels": cfg.labels(), **extra}


def _scrape_annotations(cfg: MasterConfig) -> dict[str, Any]:
    """``prometheus.io/*`` annotations (the convention Prometheus' example Kubernetes
    configuration and most charts relabel on) when the master serves metrics."""
    if not cfg.metrics_port:
        return {}
    return {
        "annotations": {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(cfg.metrics_port),
            "prometheus.io/path": "/metrics",
        }
    }


def _metrics_port(cfg: MasterConfig, container: bool) -> list[dict[str, Any]]:
    if not cfg.metrics_port:
        return []
    if container:
        return [{"name": "metrics", "containerPort": cfg.metrics_port}]
    return [{"name": "metrics", "port": cfg.metrics_port, "targetPort": cfg.metrics_port}]


def default_pvc_name(job_name: str) -> str:
    """The claim ``submit`` creates for a job that names neither a claim nor a state URL."""
    return f"{job_name}-state"


def state_pvc(cfg: MasterConfig) -> dict[str, Any] | None:
    """The job's state claim (``None`` when the spec names its own or uses a URL)."""
    if cfg.state_pvc or cfg.state_url:
        return None
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": cfg.pvc_size}},
    }
    if cfg.storage_class:
        spec["storageClassName"] = cfg.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(cfg, default_pvc_name(cfg.job_name)),
        "spec": spec,
    }


def token_secret(cfg: MasterConfig, token: str) -> dict[str, Any]:
    """The per-job token (``token`` is made by the caller: this function stays pure)."""
    if len(token) < 16:
        raise InputError("the job token must be at least 16 characters; use secrets.token_hex")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(cfg, cfg.token_name),
        "type": "Opaque",
        "stringData": {"token": token},
    }


def history_secret(cfg: MasterConfig, url: str) -> dict[str, Any]:
    """The history store URL as a Secret (``<job>-history``, key ``url``); ``submit`` makes
    the master Job its owner once the Job exists, so it goes with the Job."""
    if not url.strip():
        raise InputError("the history store URL is empty; give a SQLAlchemy URL or none")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(cfg, cfg.history_secret_name),
        "type": "Opaque",
        "stringData": {HISTORY_SECRET_KEY: url},
    }


def parse_secret_ref(value: str, what: str = "--history-secret") -> tuple[str, str]:
    """``NAME`` or ``NAME:KEY`` (key ``url`` by default) -> ``(name, key)``; one clear line
    for anything that is not a Secret name."""
    name, _, key = value.strip().partition(":")
    key = key or HISTORY_SECRET_KEY
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name) or not re.fullmatch(
        r"[-._a-zA-Z0-9]{1,253}", key
    ):
        raise InputError(
            f"{what} {value!r} is not NAME or NAME:KEY of a Secret (a lowercase DNS name, "
            f"then a data key; e.g. dlrover-rm-history:url)"
        )
    return name, key


def spec_configmap(cfg: MasterConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cfg, cfg.spec_name),
        "data": {
            "spec.yaml": cfg.spec_yaml,
            **({"plan.json": cfg.plan_json} if cfg.plan_json else {}),
        },
    }


def master_service(cfg: MasterConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(cfg, cfg.master_name, **_scrape_annotations(cfg)),
        "spec": {
            # headless: the name resolves to the master pod's IP, so nodes reach the port the
            # master actually listens on (it binds an ephemeral one and advertises
            # <service>:<port>; a ClusterIP would forward only the port declared here)
            "clusterIP": "None",
            "selector": cfg.labels(),
            "ports": [
                {"name": "grpc", "port": cfg.port, "targetPort": cfg.port},
                *_metrics_port(cfg, container=False),
            ],
            "publishNotReadyAddresses": True,  # nodes may register before readiness
        },
    }


def job_network_policy(cfg: MasterConfig) -> dict[str, Any]:
    """Only the job's own pods (master and nodes) may connect to the job's pods; the metrics
    port (when the master serves one) is open to any scraper (it is read-only, no secrets)."""
    job_pods = {"matchLabels": {LABEL_APP: APP, LABEL_JOB: cfg.job_name}}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": job_pods}]}]
    if cfg.metrics_port:
        ingress.append({"ports": [{"protocol": "TCP", "port": cfg.metrics_port}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(cfg, f"{cfg.job_name}-isolation"),
        "spec": {
            "podSelector": job_pods,
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


JOB_FAILED_EXIT_CODES = (1, 2)
"""``dlrover-rm train`` exits 1 when the job failed (its report says why) and 2 on bad input:
deterministic, a new master pod would fail the same way. 3 (a bug), signals (137, 143) and
evictions are retried by the Job."""


def master_failure_policy() -> dict[str, Any]:
    """The master Job's ``podFailurePolicy``: a disrupted master pod (eviction, preemption,
    node drain: ``DisruptionTarget``) is replaced without counting against ``backoffLimit``;
    a master that failed the job or refused its input ends the Job at once."""
    return {
        "rules": [
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": "master",
                    "operator": "In",
                    "values": list(JOB_FAILED_EXIT_CODES),
                },
            },
        ]
    }


def master_job(cfg: MasterConfig) -> dict[str, Any]:
    """The master as a Job: one pod at a time, replaced up to ``backoff_limit`` times."""
    run_dir = f"{cfg.state_mount_path}/runs/{cfg.job_name}"
    quantities = {"cpu": format_cpu(cfg.cpu_millicores), "memory": f"{cfg.memory_mib}Mi"}
    env: list[dict[str, Any]] = [
        _field_env(ENV_POD_NAME, "metadata.name"),
        _field_env(ENV_POD_UID, "metadata.uid"),
        _field_env(ENV_POD_IP, "status.podIP"),
        _field_env(ENV_NAMESPACE, "metadata.namespace"),
        {"name": ENV_MASTER_SERVICE, "value": cfg.master_name},
        {"name": ENV_TOKEN_SECRET, "value": cfg.token_name},
        {"name": ENV_LEASE, "value": cfg.lease_name},
        {"name": ENV_TOKEN_FILE, "value": f"{TOKEN_MOUNT_PATH}/token"},
        {
            "name": ENV_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": cfg.token_name, "key": "token"}},
        },
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "spec", "mountPath": SPEC_MOUNT_PATH, "readOnly": True},
        {"name": "token", "mountPath": TOKEN_MOUNT_PATH, "readOnly": True},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": cfg.spec_name}},
        {"name": "token", "secret": {"secretName": cfg.token_name, "defaultMode": 0o400}},
    ]
    if cfg.pvc_name:
        env.append({"name": ENV_STATE_DIR, "value": cfg.state_mount_path})
        mounts.append({"name": "state", "mountPath": cfg.state_mount_path})
        volumes.append({"name": "state", "persistentVolumeClaim": {"claimName": cfg.pvc_name}})
    else:  # a URL holds the state; the run directory is scratch
        mounts.append({"name": "state", "mountPath": cfg.state_mount_path})
        volumes.append({"name": "state", "emptyDir": {}})
    if cfg.state_url:
        env.append({"name": ENV_STATE_URL, "value": cfg.state_url})
        if not cfg.pvc_name:
            env.append({"name": ENV_STATE_MOUNT, "value": cfg.state_mount_path})
    if cfg.history_secret:
        name, key = cfg.history_secret
        env.append({"name": ENV_HISTORY, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
    container = {
        "name": "master",
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": [
            "dlrover-rm",
            "train",
            "--spec",
            f"{SPEC_MOUNT_PATH}/spec.yaml",
            "--run-dir",
            run_dir,
            *(["--plan", f"{SPEC_MOUNT_PATH}/plan.json"] if cfg.plan_json else []),
        ],
        "env": env,
        "ports": [{"name": "grpc", "containerPort": cfg.port}, *_metrics_port(cfg, container=True)],
        "resources": {"requests": quantities, "limits": dict(quantities)},
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(cfg, cfg.master_name),
        "spec": {
            "backoffLimit": cfg.backoff_limit,
            "podFailurePolicy": master_failure_policy(),
            "ttlSecondsAfterFinished": cfg.ttl_after_finished_s,
            "template": {
                "metadata": {"labels": cfg.labels(), **_scrape_annotations(cfg)},
                "spec": {
                    "serviceAccountName": cfg.service_account,
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 60,  # stop nodes, write the report
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def submit_objects(
    cfg: MasterConfig, token: str, history_url: str | None = None
) -> list[dict[str, Any]]:
    """Every object of one job, in creation order (the Job last: it needs the others). With
    ``history_url``, the history Secret too (``cfg.history_secret`` must name it)."""
    pvc = state_pvc(cfg)
    if history_url is not None and cfg.history_secret != (
        cfg.history_secret_name,
        HISTORY_SECRET_KEY,
    ):
        raise InputError("a history URL goes into the job's own history Secret; not both")
    return [
        *([pvc] if pvc else []),
        token_secret(cfg, token),
        *([history_secret(cfg, history_url)] if history_url is not None else []),
        spec_configmap(cfg),
        master_service(cfg),
        job_network_policy(cfg),
        master_job(cfg),
    ]


def new_log_lines(
    logs: Mapping[str, str], logged: Mapping[str, int], final: bool
) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The ``(pod, line)`` pairs of ``logs`` not seen before (``logged``: pod -> complete lines
    already taken) and the new counts. A line still being written (no newline yet) waits for
    the next poll, unless the job has ended (``final``). Blank lines are counted, not given."""
    seen = dict(logged)
    out: list[tuple[str, str]] = []
    for pod, text in logs.items():
        lines = text.splitlines()
        if lines and not text.endswith("\n") and not final:
            lines = lines[:-1]
        out += [(pod, ln) for ln in lines[seen.get(pod, 0) :] if ln.strip()]
        seen[pod] = max(seen.get(pod, 0), len(lines))
    return out, seen


def job_outcome(
    status: Mapping[str, Any], logs: Mapping[str, str]
) -> tuple[str, str, dict[str, Any] | None] | None:
    """``(status, message, report)`` once the master Job has ended, None while it runs.
    ``report`` is the master's ``DLROVER-RM-REPORT`` line; a failed Job's message is the
    master's failure, else how many master pods failed and the last log lines."""
    from dlrover_core.api import parse_report_line  # the format lives with report_line

    state = status.get("state")
    if state not in ("succeeded", "failed"):
        return None
    where = f"job {status.get('job')} in namespace {status.get('namespace')}"
    report = parse_report_line("\n".join(logs.values()))
    if state == "succeeded":
        final = str((report or {}).get("state") or "succeeded")
        return final, f"{where} {final}", report
    tail = [ln for text in logs.values() for ln in text.splitlines()][-5:]
    why = (
        (report or {}).get("failure")
        or status.get("problem")
        or (
            f"the master Job failed ({(status.get('master') or {}).get('failed_pods', 0)} master "
            "pod(s) failed); last log lines: " + " / ".join(tail)
        )
    )
    return "failed", f"{where} failed: {why}", report


# --------------------------------------------------------------------------- IO


def _create(api_client: k8s.ApiClient, obj: Mapping[str, Any]) -> None:
    ns = obj["metadata"]["namespace"]
    kind = obj["kind"]
    core = k8s.CoreV1Api(api_client)
    create = {
        "PersistentVolumeClaim": core.create_namespaced_persistent_volume_claim,
        "Secret": core.create_namespaced_secret,
        "ConfigMap": core.create_namespaced_config_map,
        "Service": core.create_namespaced_service,
        "NetworkPolicy": k8s.NetworkingV1Api(api_client).create_namespaced_network_policy,
        "Job": k8s.BatchV1Api(api_client).create_namespaced_job,
    }[kind]
    create(ns, obj, _preload_content=False)


def _delete(api_client: k8s.ApiClient, kind: str, ns: str, name: str) -> bool:
    core = k8s.CoreV1Api(api_client)
    delete = {
        "Secret": core.delete_namespaced_secret,
        "ConfigMap": core.delete_namespaced_config_map,
        "Service": core.delete_namespaced_service,
        "NetworkPolicy": k8s.NetworkingV1Api(api_client).delete_namespaced_network_policy,
        "Job": k8s.BatchV1Api(api_client).delete_namespaced_job,
        "Pod": core.delete_namespaced_pod,
    }[kind]
    try:
        if kind == "Job":  # the master pod goes too, and with it (owner references) the nodes
            delete(name, ns, propagation_policy="Foreground", _preload_content=False)
        else:
            delete(name, ns, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _own_by_job(api_client: k8s.ApiClient, cfg: MasterConfig, secret: str) -> None:
    """Make the master Job the owner of ``secret`` (garbage-collected with the Job)."""
    batch = k8s.BatchV1Api(api_client)
    job = json.loads(
        batch.read_namespaced_job(cfg.master_name, cfg.namespace, _preload_content=False).data
    )
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": cfg.master_name,
        "uid": job["metadata"]["uid"],
        "blockOwnerDeletion": False,
    }
    k8s.CoreV1Api(api_client).patch_namespaced_secret(
        secret,
        cfg.namespace,
        {"metadata": {"ownerReferences": [owner]}},
        _preload_content=False,
    )


def submit(
    api_client: k8s.ApiClient, cfg: MasterConfig, token: str, history_url: str | None = None
) -> list[str]:
    """Create the job's objects; returns ``Kind/name`` of each created. A job of that name
    still present is refused (:class:`JobExistsError`: status or cancel it first); leftovers
    of a cancelled one (its Secrets, ConfigMap, ...) are replaced; an existing state claim is
    kept (the job resumes from it). With ``history_url`` the history Secret is created before
    the Job and owned by it after."""
    batch = k8s.BatchV1Api(api_client)
    try:
        batch.read_namespaced_job(cfg.master_name, cfg.namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status != 404:
            raise _api_error("read the master Job", exc) from exc
    else:
        raise JobExistsError(
            f"job {cfg.job_name} is already submitted in namespace {cfg.namespace}; see "
            f"`dlrover-rm status --job {cfg.job_name}` or run `dlrover-rm cancel --job "
            f"{cfg.job_name}` first"
        )
    done: list[str] = []
    for obj in submit_objects(cfg, token, history_url):
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            _create(api_client, obj)
        except ApiException as exc:
            if exc.status != 409:
                raise _api_error(f"create {kind} {name}", exc) from exc
            if kind == "PersistentVolumeClaim":
                continue  # the state of an earlier run: resume from it
            _delete(api_client, kind, cfg.namespace, name)
            _create(api_client, obj)
        done.append(f"{kind}/{name}")
    if history_url is not None:
        try:
            _own_by_job(api_client, cfg, cfg.history_secret_name)
        except ApiException as exc:
            raise _api_error(f"own Secret {cfg.history_secret_name} by the Job", exc) from exc
    return done


def cancel(api_client: k8s.ApiClient, namespace: str, job_name: str) -> list[str]:
    """Delete the master Job (its pod and, through owner references, its nodes), the node
    pods directly as well (a master not started by submit owns them through its own pod), and
    the job's Service, Secret, ConfigMap and NetworkPolicy. The state claim is kept (it holds
    the checkpoints and the report). Idempotent; returns what it deleted."""
    deleted: list[str] = []
    objs = [
        ("Job", f"{job_name}-master"),
        ("Service", f"{job_name}-master"),
        ("NetworkPolicy", f"{job_name}-isolation"),
        ("ConfigMap", f"{job_name}-spec"),
        ("Secret", f"{job_name}-token"),
        ("Secret", f"{job_name}-history"),  # the Job owns it too: gone already, most often
    ]
    try:
        for kind, name in objs:
            if _delete(api_client, kind, namespace, name):
                deleted.append(f"{kind}/{name}")
        for pod in _job_pods(api_client, namespace, job_name):
            name = pod["metadata"]["name"]
            if _delete(api_client, "Pod", namespace, name):
                deleted.append(f"Pod/{name}")
    except ApiException as exc:
        raise _api_error(f"cancel job {job_name}", exc) from exc
    return deleted


def follow(
    api_client_factory: Callable[[], k8s.ApiClient],
    namespace: str,
    job_name: str,
    *,
    poll_interval: float = 5.0,
    start_timeout: float = 600.0,
    outage_s: float = 300.0,
    on_line: Callable[[str, str], None] | None = None,
    on_retry: Callable[[Exception], None] | None = None,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Wait for a submitted job, passing each new master log line to ``on_line(pod, line)``;
    returns ``{"status", "job", "namespace", "message", "report"}`` (the Airflow trigger's
    event). A job that vanished, no master started within ``start_timeout`` or an API
    unreachable for ``outage_s`` end it ``failed`` with the reason; a shorter outage is
    retried (``on_retry``)."""
    import time

    now = clock or time.monotonic
    pause = sleep or time.sleep
    where = f"job {job_name} in namespace {namespace}"

    def result(status: str, message: str, report: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "status": status,
            "job": job_name,
            "namespace": namespace,
            "message": message,
            "report": report,
        }

    started = ok_at = now()
    logged: dict[str, int] = {}
    while True:
        try:
            c = api_client_factory()
            logs = master_logs(c, namespace, job_name)
            st = status(c, namespace, job_name, logs=logs)
        except JobGoneError as e:
            return result("failed", f"{where} is gone (cancelled or deleted): {e}", None)
        except Exception as e:  # the API unreachable: retried until outage_s
            if now() - ok_at > outage_s:
                return result("failed", f"cannot read {where} for {outage_s:g} s: {e}", None)
            if on_retry is not None:
                on_retry(e)
            pause(poll_interval)
            continue
        ok_at = now()
        outcome = job_outcome(st, logs)
        lines, logged = new_log_lines(logs, logged, outcome is not None)
        if on_line is not None:
            for pod, line in lines:
                on_line(pod, line)
        if outcome is not None:
            if st.get("master_blocked"):
                # the master cannot start: stop the Job retrying it (the claim stays)
                try:
                    cancel(c, namespace, job_name)
                    outcome = (outcome[0], outcome[1] + "; the job was cancelled", outcome[2])
                except Exception as e:  # best effort: the failure is what matters
                    outcome = (outcome[0], outcome[1] + f"; cancelling it failed: {e}", outcome[2])
            return result(*outcome)
        if not logs and now() - started > start_timeout:
            return result(
                "failed",
                f"no master of {where} started within {start_timeout:g} s (state "
                f"{st.get('state')}); see `kubectl describe job {job_name}-master -n {namespace}`",
                None,
            )
        pause(poll_interval)


def status(
    api_client: k8s.ApiClient,
    namespace: str,
    job_name: str,
    logs: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """JSON-able state of a submitted job: the master Job, the lease holder, every node pod
    (role, id, incarnation, phase, and how it ended)."""
    batch = k8s.BatchV1Api(api_client)
    try:
        job = json.loads(
            batch.read_namespaced_job(f"{job_name}-master", namespace, _preload_content=False).data
        )
    except ApiException as exc:
        if exc.status == 404:
            raise JobGoneError(
                f"no job {job_name} in namespace {namespace}; check the name (`kubectl get "
                f"jobs -n {namespace} -l {LABEL_APP}={APP}`)"
            ) from exc
        raise _api_error("read the master Job", exc) from exc
    js = job.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in js.get("conditions") or []}
    state = (
        "succeeded"
        if conditions.get("Complete") == "True"
        else "failed"
        if conditions.get("Failed") == "True"
        else "running"
        if js.get("active")
        else "pending"
    )
    holder = None
    try:
        lease = json.loads(
            k8s.CoordinationV1Api(api_client)
            .read_namespaced_lease(f"{job_name}-master", namespace, _preload_content=False)
            .data
        )
        holder = (lease.get("spec") or {}).get("holderIdentity")
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise _api_error("read the run lease", exc) from exc
    pods = _job_pods(api_client, namespace, job_name)
    problem, blocked = None, False
    if state in ("pending", "running", "failed"):
        import time

        failed = any(
            (p.get("status") or {}).get("phase") == "Failed"
            for p in pods
            if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) == MASTER_ROLE
        )
        if logs is None:  # the master's log says why it failed (a caller may have it already)
            logs = master_logs(api_client, namespace, job_name, tail_lines=20) if failed else {}
        found = master_problem(pods, logs, time.time())
        if found is not None:
            problem, blocking = found
            if blocking and state != "failed":
                state, blocked = "failed", True  # the Job would go on retrying, or wait forever
    nodes = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if labels.get(LABEL_ROLE) == MASTER_ROLE or LABEL_NODE_ID not in labels:
            continue
        out = pod_exit(pod)
        node: dict[str, Any] = {
            "role": labels.get(LABEL_ROLE),
            "id": int(labels[LABEL_NODE_ID]),
            "incarnation": int(labels.get(LABEL_INCARNATION, 0)),
            "ref": pod["metadata"]["name"],
            "phase": (pod.get("status") or {}).get("phase"),
            "state": "pending" if out == "pending" else "ended" if out else "running",
        }
        if isinstance(out, NodeExit):
            node["exit"] = {
                "code": out.exit_code,
                "reason": out.reason,
                "class": out.exit_class.value,
                "explain": out.explain(),
            }
        nodes.append(node)
    nodes.sort(key=lambda n: (n["role"], n["id"], n["incarnation"]))
    return {
        "job": job_name,
        "namespace": namespace,
        "state": state,
        "problem": problem,
        "master_blocked": blocked,
        "master": {
            "active": js.get("active", 0),
            "failed_pods": js.get("failed", 0),
            "succeeded": js.get("succeeded", 0),
            "lease_holder": holder,
        },
        "nodes": nodes,
    }


MASTER_CRASHES = 2
"""Master pods that crashed soon after they started (within :data:`CRASH_RUN_S`) before a job
counts as crash-looping: its master cannot start, and the Job would retry it up to its
backoffLimit, minutes apart, with the same result. A master that ran longer and then failed
(a bug mid-job) is left to the Job's retries."""
CRASH_RUN_S = 60.0
UNSCHEDULABLE_S = 45.0
"""How long a master pod may stay unschedulable before the job counts as unable to start."""


def master_problem(
    pods: Sequence[Mapping[str, Any]], logs: Mapping[str, str], now_s: float
) -> tuple[str, bool] | None:
    """Why the job's master cannot start, from its pods (their JSON) and their logs, and
    whether the Job would wait or retry forever meanwhile (``blocking``); None while nothing
    says so. Pure. Blocking: an image that cannot be pulled or a container that cannot be made
    (fatal waiting reasons); :data:`MASTER_CRASHES` master pods that crashed within
    :data:`CRASH_RUN_S` of their start; a pod unschedulable for :data:`UNSCHEDULABLE_S`. Not
    blocking (the Job's pod failure policy fails it at once; this only explains): a master that
    refused its input (exit 2). The message names the pod and the reason, with the last log line."""
    from dlrover_core.runtime.backends.base import FATAL_WAITING_REASONS
    from dlrover_core.runtime.backends.kubernetes_pods import _parse_time

    def last_line(name: str) -> str:
        lines = [ln.strip() for ln in (logs.get(name) or "").splitlines() if ln.strip()]
        return lines[-1] if lines else "no log"

    def role(p: Mapping[str, Any]) -> Any:
        return (p["metadata"].get("labels") or {}).get(LABEL_ROLE)

    masters = sorted(
        (p for p in pods if role(p) == MASTER_ROLE),
        key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]),
    )
    crashes: list[tuple[str, Any]] = []
    refused: str | None = None
    for p in masters:
        name = p["metadata"]["name"]
        st = p.get("status") or {}
        for cs in st.get("containerStatuses") or []:
            w = (cs.get("state") or {}).get("waiting") or {}
            if w.get("reason") in FATAL_WAITING_REASONS:
                why = f"{w['reason']}: {w.get('message')}" if w.get("message") else w["reason"]
                return f"master pod {name} cannot start: {why}", True
            t = (cs.get("state") or {}).get("terminated") or {}
            if st.get("phase") == "Failed" and t:
                if t.get("exitCode") == 2:
                    refused = name
                began, ended = _parse_time(t.get("startedAt")), _parse_time(t.get("finishedAt"))
                if began is not None and ended is not None and ended - began <= CRASH_RUN_S:
                    crashes.append((name, t.get("exitCode")))
        for c in st.get("conditions") or []:
            unsched = c.get("reason") == "Unschedulable" and c.get("status") == "False"
            if c.get("type") == "PodScheduled" and unsched:
                since = _parse_time(
                    c.get("lastTransitionTime") or p["metadata"].get("creationTimestamp")
                )
                if since is not None and now_s - since >= UNSCHEDULABLE_S:
                    return (
                        f"master pod {name} is unschedulable for {now_s - since:.0f} s: "
                        f"{c.get('message') or 'no node fits its requests'}; lower the master's "
                        "requests or add capacity"
                    ), True
    if refused is not None:
        return f"the master refused its input (pod {refused}, exit 2): {last_line(refused)}", False
    if len(crashes) >= MASTER_CRASHES:
        name, code = crashes[-1]
        return (
            f"the master crashed {len(crashes)} times within {CRASH_RUN_S:g} s of its start "
            f"(last: pod {name}, exit {code}): {last_line(name)}"
        ), True
    return None


def master_logs(
    api_client: k8s.ApiClient, namespace: str, job_name: str, tail_lines: int | None = None
) -> dict[str, str]:
    """``{pod: log text}`` of the job's master pods, oldest first (a pod whose container has
    not started has no log yet and is left out)."""
    core = k8s.CoreV1Api(api_client)
    pods = [
        p
        for p in _job_pods(api_client, namespace, job_name)
        if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) == MASTER_ROLE
    ]
    pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
    out: dict[str, str] = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        kw: dict[str, Any] = {"_preload_content": False}
        if tail_lines is not None:
            kw["tail_lines"] = tail_lines
        try:
            resp = core.read_namespaced_pod_log(name, namespace, **kw)
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or gone meanwhile
                continue
            raise _api_error(f"read the log of pod {name}", exc) from exc
        out[name] = resp.data.decode("utf-8", errors="replace")
    return out


def _job_pods(api_client: k8s.ApiClient, namespace: str, job_name: str) -> list[dict[str, Any]]:
    resp = k8s.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=job_selector(job_name), _preload_content=False
    )
    return list(json.loads(resp.data).get("items") or [])


def _api_error(what: str, exc: ApiException) -> InputError:
    try:
        message = json.loads(exc.body or "{}").get("message", "")
    except (TypeError, ValueError):
        message = ""
    hint = (
        "; check the RBAC in deploy/kubernetes/rbac.yaml is applied in this namespace"
        if exc.status == 403
        else ""
    )
    return InputError(f"cannot {what}: HTTP {exc.status} {exc.reason} {message}".strip() + hint)
