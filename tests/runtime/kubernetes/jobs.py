"""A Job controller stand-in for the tests (what kube-controller-manager's Job controller does,
for the one shape of Job ``dlrover-rm submit`` creates: one pod at a time, ``completions`` 1).

Every ``interval_s`` it lists the ``batch/v1`` Jobs and the pods of its namespace through the
API and, for each Job not yet finished:

- counts its pods (those with a controller owner reference to the Job's uid): active
  (not Succeeded/Failed), succeeded, failed;
- one succeeded pod: the Job gets ``Complete=True`` (and ``SuccessCriteriaMet``), a
  ``completionTime``;
- a failed pod matching a ``spec.podFailurePolicy`` rule, in order: ``Ignore`` (it does not
  count against the backoff limit), ``FailJob`` (``Failed=True``, reason ``PodFailurePolicy``),
  ``Count``; rules match ``onExitCodes`` (``In``/``NotIn``, optional ``containerName``) or
  ``onPodConditions``;
- more counted failed pods than ``spec.backoffLimit`` (default 6): ``Failed=True`` with
  reason ``BackoffLimitExceeded`` (and ``FailureTarget``), its active pods deleted;
- otherwise, no active pod: a new pod from ``spec.template`` named ``<job>-<5 chars>``, with
  the template's labels plus ``job-name``/``batch.kubernetes.io/job-name`` and
  ``controller-uid``/``batch.kubernetes.io/controller-uid``, and a controller owner reference
  to the Job (so deleting the Job garbage-collects it);
- writes ``status`` (active, succeeded, failed, startTime, conditions) through the ``status``
  subresource when it changed.

What it is not: no parallelism/completions above 1, no backoff delay
between pod retries, no ``ttlSecondsAfterFinished`` clean-up, no suspend.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import logging
import secrets
import string
import threading
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)
_ALPHABET = string.ascii_lowercase + string.digits


def _now() -> str:
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owned_by(pod: dict[str, Any], uid: str) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def _condition(kind: str, reason: str, message: str) -> dict[str, Any]:
    now = _now()
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": now,
        "lastTransitionTime": now,
    }


def _policy_action(policy: dict[str, Any] | None, pod: dict[str, Any]) -> str:
    """What a Job's ``podFailurePolicy`` does with one failed pod: the first matching rule's
    action, else ``Count``."""
    status = pod.get("status") or {}
    conds = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
    codes = {
        cs.get("name"): ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
        for cs in status.get("containerStatuses") or []
    }
    for rule in (policy or {}).get("rules") or []:
        on_codes = rule.get("onExitCodes")
        if on_codes:
            name = on_codes.get("containerName")
            values = set(on_codes.get("values") or [])
            seen = [c for n, c in codes.items() if c not in (None, 0) and name in (None, n)]
            if on_codes.get("operator") == "In" and any(c in values for c in seen):
                return str(rule["action"])
            if on_codes.get("operator") == "NotIn" and any(c not in values for c in seen):
                return str(rule["action"])
        for pc in rule.get("onPodConditions") or []:
            if pc.get("type") in conds:
                return str(rule["action"])
    return "Count"


class JobControllerStandIn:
    """See the module docstring. ``start()`` runs it in a thread; ``stop()`` ends it."""

    def __init__(self, api_client: k8s.ApiClient, namespace: str, interval_s: float = 0.2):
        self.core = k8s.CoreV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self.namespace = namespace
        self.interval_s = interval_s
        self.created: list[str] = []  # pod names, in creation order (for assertions)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> JobControllerStandIn:
        self._thread = threading.Thread(target=self._run, name="job-controller", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> JobControllerStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # keep going: a test asserts on the outcome
                log.exception("job controller stand-in tick failed")
                self.errors.append(repr(exc))
            self._stop.wait(self.interval_s)

    def tick(self) -> None:
        jobs = (
            json.loads(
                self.batch.list_namespaced_job(self.namespace, _preload_content=False).data
            ).get("items")
            or []
        )
        if not jobs:
            return
        pods = (
            json.loads(
                self.core.list_namespaced_pod(self.namespace, _preload_content=False).data
            ).get("items")
            or []
        )
        for job in jobs:
            try:
                self._drive(job, [p for p in pods if _owned_by(p, job["metadata"]["uid"])])
            except ApiException as exc:
                if exc.status != 404:  # the Job was deleted meanwhile
                    raise

    def _drive(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta, spec = job["metadata"], job.get("spec") or {}
        old = job.get("status") or {}
        conditions = {c.get("type"): c for c in old.get("conditions") or []}
        if any(conditions.get(t, {}).get("status") == "True" for t in ("Complete", "Failed")):
            return
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        succeeded = phases.count("Succeeded")
        failed = phases.count("Failed")
        actions = [
            _policy_action(spec.get("podFailurePolicy"), p)
            for p, ph in zip(pods, phases, strict=True)
            if ph == "Failed"
        ]
        counted = sum(1 for a in actions if a != "Ignore")
        active = [
            p for p, ph in zip(pods, phases, strict=True) if ph not in ("Succeeded", "Failed")
        ]
        backoff = int(spec.get("backoffLimit", 6))
        status: dict[str, Any] = {"startTime": old.get("startTime") or _now()}
        new_conditions: list[dict[str, Any]] = []
        if succeeded >= 1:
            status["completionTime"] = _now()
            new_conditions = [
                _condition(
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
                _condition(
                    "Complete", "CompletionsReached", "Reached expected number of succeeded pods"
                ),
            ]
        elif "FailJob" in actions or counted > backoff:
            reason, msg = (
                ("PodFailurePolicy", "Container master for pod failed with a FailJob exit code")
                if "FailJob" in actions
                else ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            )
            new_conditions = [
                _condition("FailureTarget", reason, msg),
                _condition("Failed", reason, msg),
            ]
            for p in active:
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_pod(
                        p["metadata"]["name"], self.namespace, _preload_content=False
                    )
        elif not active:
            active = [self._create_pod(job)]
        status.update(
            active=len(active) if not new_conditions else 0,
            succeeded=succeeded,
            failed=failed,
            ready=sum(
                1
                for p in active
                if any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (p.get("status") or {}).get("conditions") or []
                )
            ),
        )
        if new_conditions:
            status["conditions"] = new_conditions
        if any(old.get(k) != v for k, v in status.items()):
            self.batch.patch_namespaced_job_status(
                meta["name"], self.namespace, {"status": status}, _preload_content=False
            )

    def _create_pod(self, job: dict[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        tmeta = template.get("metadata") or {}
        labels = dict(tmeta.get("labels") or {})
        labels.update(
            {
                "job-name": meta["name"],
                "batch.kubernetes.io/job-name": meta["name"],
                "controller-uid": meta["uid"],
                "batch.kubernetes.io/controller-uid": meta["uid"],
            }
        )
        suffix = "".join(secrets.choice(_ALPHABET) for _ in range(5))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{suffix}",
                "namespace": self.namespace,
                "labels": labels,
                "annotations": dict(tmeta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": template.get("spec") or {},
        }
        out = json.loads(
            self.core.create_namespaced_pod(self.namespace, pod, _preload_content=False).data
        )
        self.created.append(out["metadata"]["name"])
        log.info(
            "job controller stand-in: created pod %s for job %s",
            out["metadata"]["name"],
            meta["name"],
        )
        return dict(out)
