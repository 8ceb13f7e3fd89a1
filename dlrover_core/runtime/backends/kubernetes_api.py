"""Talking to the Kubernetes API: retries with backoff and jitter, the outage bound, the
client from in-cluster config or kubeconfig; the reads of a job's pods and of the master pod's
owner."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity
import urllib3
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from dlrover_core.errors import DLRoverError, ErrorKind, InputError
from dlrover_core.runtime.backends.kubernetes_pods import OwnerRef, job_selector

log = logging.getLogger(__name__)
_RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
_T = TypeVar("_T")


class KubernetesUnavailableError(DLRoverError):
    """The Kubernetes API server stayed unreachable (or overloaded) past the outage bound."""

    kind = ErrorKind.UNAVAILABLE


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


def retry_after_s(exc: BaseException | None) -> float | None:
    """The wait a 429/503 answer asks for in its ``Retry-After`` header (seconds; an HTTP
    date is not honoured, the backoff applies), or None."""
    if not isinstance(exc, ApiException) or exc.status not in (429, 503):
        return None
    headers = exc.headers or {}
    raw = headers.get("Retry-After") or headers.get("retry-after")
    try:
        value = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and 0 <= value <= 3600 else None


class _Caller:
    """Runs API calls with the retry policy; ``no_retry`` statuses are returned to the caller
    as the ``ApiException`` (e.g. 409 on create means 'already there').

    Throttling (429: the server sheds load) is handled the way TCP handles congestion, for
    every thread of this caller together: the calls in flight are limited to a window that
    halves on a 429 (at most once per ``_CUT_EVERY_S``: one burst of 429s is one signal) and
    grows by one call per window's worth of successes, up to ``max_inflight``. The throttled
    call itself waits its ``Retry-After`` (at least the backoff) and retries. A batch of
    creates then settles at what the server admits instead of finding the limit again with
    every request."""

    _CUT_EVERY_S = 0.1

    def __init__(
        self,
        host: str,
        policy: RetryPolicy,
        stop: threading.Event | None = None,
        max_inflight: int = 64,
    ) -> None:
        self.host = host
        self.policy = policy
        self.stop = stop  # set: give up retrying at once (the backend is shutting down)
        self.max_inflight = max(1, max_inflight)
        self._cond = threading.Condition()
        self._inflight = 0
        self.window = float(self.max_inflight)  # calls allowed in flight now
        self._cut_at = 0.0
        self._held = threading.local()  # a call made inside a call uses its slot
        self.throttled = 0  # 429 answers seen (tests, benchmarks)

    def _enter(self) -> None:
        with self._cond:
            while self._inflight >= max(1, int(self.window)):
                self._cond.wait(0.5)
                if self.stop is not None and self.stop.is_set():
                    break
            self._inflight += 1

    def _leave(self, exc: BaseException | None) -> None:
        with self._cond:
            self._inflight -= 1
            if isinstance(exc, ApiException) and exc.status == 429:
                self.throttled += 1
                now = time.monotonic()
                if now - self._cut_at >= self._CUT_EVERY_S:
                    self._cut_at = now
                    self.window = max(1.0, self.window / 2)
            elif exc is None and self.window < self.max_inflight:
                self.window = min(float(self.max_inflight), self.window + 1 / self.window)
            self._cond.notify_all()

    def __call__(self, what: str, fn: Callable[[], _T], *, no_retry: Sequence[int] = ()) -> _T:
        p = self.policy
        backoff = tenacity.wait_random_exponential(multiplier=p.initial_s, max=p.max_s)

        def retryable(exc: BaseException) -> bool:
            if isinstance(exc, ApiException) and exc.status in no_retry:
                return False
            return _transient(exc)

        def wait(rs: tenacity.RetryCallState) -> float:
            exc = rs.outcome.exception() if rs.outcome else None
            return max(backoff(rs), retry_after_s(exc) or 0.0)

        def before_sleep(rs: tenacity.RetryCallState) -> None:
            exc = rs.outcome.exception() if rs.outcome else None
            log.warning(
                "kubernetes API %s: %s; retry %d in %.1f s",
                what,
                _describe(exc) if exc else "?",
                rs.attempt_number,
                rs.next_action.sleep if rs.next_action else 0.0,
            )

        def attempt() -> _T:
            if getattr(self._held, "slot", False):
                return fn()  # nested (a create that reads the pod on 409): same slot
            self._enter()
            self._held.slot = True
            try:
                out = fn()
            except BaseException as e:
                self._held.slot = False
                self._leave(e)
                raise
            self._held.slot = False
            self._leave(None)
            return out

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(retryable),
            wait=wait,
            stop=tenacity.stop_after_delay(p.outage_s)
            | tenacity.stop_when_event_set(self.stop or threading.Event()),
            before_sleep=before_sleep,
            reraise=False,
        )
        try:
            return retrying(attempt)
        except tenacity.RetryError as err:
            last = err.last_attempt.exception()
            raise KubernetesUnavailableError(
                f"the Kubernetes API at {self.host} failed for {p.outage_s:.0f} s while "
                f"trying to {what} (last: {_describe(last) if last else 'unknown'}); check "
                "the API server and this pod's network, or raise backend.api_outage_s"
            ) from last


def fit_pool(api_client: k8s.ApiClient, concurrency: int) -> None:
    """Make the client's connection pool hold ``concurrency`` requests to the API server at
    once (plus the watch and a few calls of the control loop): urllib3 otherwise opens and
    discards a connection for each request past its ``maxsize`` (the client's default is
    5 × CPUs, 10 on a 2-core pod). Only pools not yet created take the new size: call it
    before the first request."""
    want = concurrency + 4
    cfg = api_client.configuration
    if (cfg.connection_pool_maxsize or 0) < want:
        cfg.connection_pool_maxsize = want
    pm = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    kw = getattr(pm, "connection_pool_kw", None)
    if isinstance(kw, dict) and int(kw.get("maxsize") or 1) < want:
        kw["maxsize"] = want


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
            # KUBECONFIG read now, not when the client was imported (a long-lived process)
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
        except (config.ConfigException, OSError) as exc:
            raise InputError(
                "no Kubernetes API to talk to: not running in a pod and no kubeconfig "
                f"({exc}); run inside the cluster or set KUBECONFIG"
            ) from exc
    return k8s.ApiClient()


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
