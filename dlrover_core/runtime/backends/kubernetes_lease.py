"""One master per run on Kubernetes: a ``coordination.k8s.io/v1`` Lease (``RunLease``)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from dlrover_core.errors import InputError
from dlrover_core.runtime.backends.kubernetes_api import (
    KubernetesUnavailableError,
    RetryPolicy,
    _as_dict,
    _Caller,
    _default_client,
)
from dlrover_core.runtime.backends.kubernetes_pods import APP, LABEL_APP, _micro_time, _parse_time

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
