"""``dlrover-rm submit / status / cancel`` on Kubernetes: the master as a Kubernetes Job.

:mod:`.manifests` builds the objects one job needs (the state claim, the token Secret, the
spec ConfigMap, the master Service, the NetworkPolicy, the master Job, and the history Secret
made from a URL); ``submit`` creates them (the history Secret before the Job, owned by the Job
after, so it is garbage-collected with it), ``cancel`` deletes them (the claim is kept).

``follow`` (and the pure ``new_log_lines`` / ``job_outcome`` under it) waits for a submitted
job through the API, streaming its master's log: the KFP train task and the Airflow trigger
use the same rules.

The IO half (``submit``, ``status``, ``cancel``) talks to the API server with the official
client; the CLI calls them.

``master_problem`` (pure) says why a submitted job's master cannot start.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from dlrover_core.errors import InputError
from dlrover_core.runtime.backends.base import NodeExit
from dlrover_core.runtime.backends.kubernetes_pods import (
    APP,
    ENV_POD_NAME,
    LABEL_APP,
    LABEL_INCARNATION,
    LABEL_NODE_ID,
    LABEL_ROLE,
    job_selector,
    pod_exit,
)
from dlrover_core.runtime.backends.manifests import (
    ENV_HISTORY,
    ENV_LEASE,
    ENV_MASTER_SERVICE,
    ENV_POD_IP,
    ENV_POD_UID,
    ENV_TOKEN_SECRET,
    HISTORY_SECRET_KEY,
    MASTER_ROLE,
    MasterConfig,
    default_pvc_name,
    parse_secret_ref,
    submit_objects,
)
from dlrover_core.runtime.report_line import parse_report_line

# api.py and job.py read these through this module (``submit as k8s``); their home is
# :mod:`.manifests`.
__all__ = [
    "ENV_HISTORY",
    "ENV_LEASE",
    "ENV_MASTER_SERVICE",
    "ENV_POD_IP",
    "ENV_POD_NAME",
    "ENV_POD_UID",
    "ENV_TOKEN_SECRET",
    "HISTORY_SECRET_KEY",
    "JobExistsError",
    "JobGoneError",
    "MasterConfig",
    "cancel",
    "default_pvc_name",
    "follow",
    "job_outcome",
    "master_logs",
    "master_problem",
    "new_log_lines",
    "parse_secret_ref",
    "status",
    "submit",
]


class JobExistsError(InputError):
    """A job of that name is already submitted (a retried pipeline step may attach to it)."""


class JobGoneError(InputError):
    """No master Job of that name (never submitted, cancelled or deleted)."""


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
