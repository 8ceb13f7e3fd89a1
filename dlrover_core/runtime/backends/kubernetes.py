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
  watch does not stream). A delete of ours does not end the watch (its events come through
  it): API calls per pod event stay at zero on the watch, one per finished pod (its delete).
  Each exit is queued once and handed out by ``poll``.
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
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import urllib3
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from dlrover_core.errors import InputError
from dlrover_core.runtime.backends.base import (
    DELETED_REASON,
    FATAL_WAITING_REASONS,
    NodeExit,
    NodeHandle,
    NodeSpec,
    NodeUsage,
)
from dlrover_core.runtime.backends.kubernetes_api import (
    KubernetesUnavailableError,
    RetryPolicy,
    _as_dict,
    _Caller,
    _default_client,
    _status_message,
    _transient,
    fit_pool,
    owner_for_master,
)
from dlrover_core.runtime.backends.kubernetes_events import EventSender
from dlrover_core.runtime.backends.kubernetes_lease import KubernetesLease
from dlrover_core.runtime.backends.kubernetes_pods import (
    BIND_ALL,
    CONTAINER_NAME,
    LABEL_INCARNATION,
    LABEL_JOB,
    OwnerRef,
    PodConfig,
    _identity,
    _parse_time,
    _pod_resources,
    cpu_usage_millicores,
    job_selector,
    node_to_pod,
    pod_exit,
    pod_resize_state,
)
from dlrover_core.types import NodeResources, Role
from dlrover_core.units import format_cpu, memory_mib

# job.py reads KubernetesLease and owner_for_master from here (homes: .kubernetes_lease,
# .kubernetes_api)
__all__ = [
    "KubernetesBackend",
    "KubernetesLease",
    "backend_from_spec",
    "owner_for_master",
]

log = logging.getLogger(__name__)
_REFUSED_RESIZE = frozenset({400, 403, 404, 405, 415, 422})


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
        lease_name: str | None = None,
        launch_concurrency: int = 16,
    ) -> None:
        if launch_concurrency < 1:
            raise InputError(f"launch_concurrency must be >= 1, got {launch_concurrency}")
        self.launch_concurrency = launch_concurrency
        self.lease_name = lease_name or f"{job_name}-master"  # job events go there, unowned
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
        fit_pool(api_client, launch_concurrency)  # a batch of creates, each on a connection
        self.api = api_client
        self.core = k8s.CoreV1Api(api_client)
        self._stopping = threading.Event()
        self._call = _Caller(
            str(api_client.configuration.host),
            retry or RetryPolicy(),
            self._stopping,
            max_inflight=launch_concurrency + 4,  # a batch, the lists, the control loop
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
        self._rewatch = threading.Event()  # end the watch at its next event (tests)
        self._watcher: threading.Thread | None = None
        self._closed = False
        self._resource_version: str | None = None
        self.relists = 0  # how many full lists the watcher made (tests, metrics)
        # Events go out from a thread of their own: the control loop never waits on them
        self._events = EventSender(self.core, namespace, self._timeout)

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
        return self._create(spec, pod, name)

    def launch_many(self, specs: Sequence[NodeSpec]) -> list[NodeHandle | Exception]:
        """Create the pods of ``specs`` with at most ``launch_concurrency`` creates in flight
        (each with the retry policy of ``launch``: 429 and 5xx back off). Returns one entry
        per spec, in order: its handle, or the exception its launch raised (the others are
        still created; the caller records what started). A spec named twice in the batch,
        or already running, gets ``InputError`` without a call."""
        out: list[NodeHandle | Exception | None] = [None] * len(specs)
        todo: list[tuple[int, NodeSpec, k8s.V1Pod, str]] = []
        names: set[str] = set()
        with self._lock:
            for i, spec in enumerate(specs):
                pod = node_to_pod(spec, self.cfg)
                name = str(pod.metadata.name)
                old = self._pods.get(name)
                if self._closed:
                    out[i] = InputError("the Kubernetes backend is shut down; create a new one")
                elif name in names or (old is not None and old.exit is None):
                    out[i] = InputError(
                        f"{spec.name} is already running or twice in the batch (pod {name}); "
                        "relaunch it with the next incarnation or stop it first"
                    )
                else:
                    names.add(name)
                    todo.append((i, spec, pod, name))

        def one(item: tuple[int, NodeSpec, k8s.V1Pod, str]) -> None:
            i, spec, pod, name = item
            try:
                out[i] = self._create(spec, pod, name)
            except Exception as exc:  # handed back to the caller, in order
                out[i] = exc

        workers = min(self.launch_concurrency, len(todo))
        if workers <= 1:
            for item in todo:
                one(item)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="pod-create") as pool:
                list(pool.map(one, todo))
        return [r if r is not None else InputError("not launched") for r in out]

    def _create(self, spec: NodeSpec, pod: k8s.V1Pod, name: str) -> NodeHandle:
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
                cpu_m += cpu_usage_millicores(str(u.get("cpu", "0")))
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
        self._flush_events(timeout_s=min(5.0, self._timeout))
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

    def resize_state(self, handle: NodeHandle) -> str | None:
        """From the pod as last observed: the ``PodResizePending`` condition (reason
        ``Infeasible`` or ``Deferred``, Kubernetes 1.33+) or ``PodResizeInProgress``, else
        the older ``status.resize`` field (1.27-1.32)."""
        with self._lock:
            node = self._pods.get(handle.ref)
            pod = node.last if node is not None and node.handle == handle else None
        return pod_resize_state(pod) if pod is not None else None

    def pending_since(self, handle: NodeHandle) -> float | None:
        """When (this backend's clock, wall seconds by default) the pod was first seen
        unschedulable; ``None`` when it is not pending. The planner's pending rule acts on it;
        the master gives up on it per ``faults.pending_action``."""
        with self._lock:
            node = self._pods.get(handle.ref)
            return node.pending_since if node is not None and node.exit is None else None

    # ------------------------------------------------------------------ extras

    def pod(self, handle: NodeHandle) -> dict[str, Any] | None:
        """The pod as last observed (JSON form)."""
        with self._lock:
            node = self._pods.get(handle.ref)
            return node.last if node is not None else None

    def handles(self) -> list[NodeHandle]:
        with self._lock:
            return [n.handle for n in self._pods.values() if n.exit is None]

    def event(
        self, handle: NodeHandle | None, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """Record a Kubernetes Event on the node's pod, or with ``handle`` None on the master's
        own pod (the owner), so that ``kubectl describe pod`` and ``kubectl get events`` show
        why the master relaunched, resized or stopped a node and what it planned. Queued and
        sent by a thread of its own (never blocks the caller); best effort: an API error is
        logged, a full queue drops the event."""
        if handle is not None:
            obj = {"apiVersion": "v1", "kind": "Pod", "name": handle.ref}
        elif self.cfg.owner is not None:  # the master's pod or Job
            o = self.cfg.owner
            obj = {"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid}
        else:  # a master outside a pod: the run's Lease, which it holds
            obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": self.lease_name}
        self._events.post(obj, reason, message, warning)

    @property
    def events_dropped(self) -> int:
        """Events dropped because the queue was full."""
        return self._events.dropped

    def _flush_events(self, timeout_s: float) -> None:
        """Send the queued Events (at most ``timeout_s``), then end the sender thread."""
        self._events.flush(timeout_s)

    def restart_watch(self) -> None:
        """End the current watch at its next event; the watcher relists and watches again
        from the list's version (tests: a watch resumed from an expired version)."""
        self._rewatch.set()

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
                # a kick (a delete of ours) does not end the watch: its events come through
                # it; a relist per delete listed every pod per exit (benchmarks/k8s_scale.py)
                self._kick.clear()
                if self._stopping.is_set() or self._rewatch.is_set():
                    self._rewatch.clear()
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


def backend_from_spec(
    backend: Any,
    job_name: str,
    *,
    owner: OwnerRef | None = None,
    token_secret: str | None = None,
    master_service: str | None = None,
    api_client: k8s.ApiClient | None = None,
    clock: Callable[[], float] = time.time,
    lease_name: str | None = None,
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
        lease_name=lease_name,
    )
