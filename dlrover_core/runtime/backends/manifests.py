"""The objects of a job submitted to Kubernetes (pure: plain JSON-able dicts, validated against
the official schemas in the tests), in the order :func:`~.submit.submit` creates them:


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

:func:`submit_objects` lists them; :mod:`.submit` creates them and reads a submitted job back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dlrover_core.errors import InputError
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
    LABEL_JOB,
    LABEL_ROLE,
    TOKEN_MOUNT_PATH,
)
from dlrover_core.units import format_cpu

MASTER_ROLE = "master"
SPEC_MOUNT_PATH = "/etc/dlrover-rm"
ENV_POD_UID = "POD_UID"
ENV_POD_IP = "POD_IP"
ENV_MASTER_SERVICE = "DLROVER_RM_MASTER_SERVICE"
ENV_TOKEN_SECRET = "DLROVER_RM_TOKEN_SECRET"
ENV_LEASE = "DLROVER_RM_LEASE"
ENV_HISTORY = "DLROVER_RM_HISTORY"  # = dlrover_core.history.store.ENV_VAR (no SQLAlchemy here)
HISTORY_SECRET_KEY = "url"


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
