"""A Kubernetes API server for the tests: kmock's emulator, extended where the backend relies
on API semantics kmock does not have (ENVIRONMENT.md: it stores plain JSON, merges patches
simplistically, has no resourceVersion, no label selectors and a watch the client cannot use).

What this adds on top of ``kmock.KubernetesEmulator`` (kmock still parses every request,
renders errors as Kubernetes ``Status`` bodies, logs requests for assertions and serves
discovery):

- a store with ``metadata.resourceVersion`` (one counter for all objects), ``uid``,
  ``creationTimestamp``; ``409 AlreadyExists`` on create, ``409 Conflict`` on a PUT whose
  resourceVersion is stale;
- list with equality-based ``labelSelector`` and the list's ``resourceVersion``;
- watch (``watch=true|True``) from a resourceVersion with ``timeoutSeconds``; a version older
  than the last ``compact()`` gets the ``ERROR`` event with ``410 Gone``, as etcd compaction
  does;
- PATCH as strategic merge (lists of dicts merged by ``name``, conditions by ``type``) or
  JSON merge; the ``status`` subresource changes only ``status``, the main resource never
  does; the ``resize`` subresource changes only container resources and can be made absent
  (404, a cluster before 1.33) or refusing (422);
- graceful pod deletion: a bound, running pod deleted with a grace gets ``deletionTimestamp``
  and stays until its kubelet (the stand-in) deletes it with grace 0; owner-reference garbage
  collection of dependants when an owner goes;
- fault injection: ``inject(status, method=, path=, times=)`` answers the next matching
  requests with that status (409/429/5xx), for the retry tests;
- a Secret's ``stringData`` is stored base64-encoded in ``data``, as the real API server does;
- the pod ``log`` subresource (``GET .../pods/{name}/log``, with ``tailLines`` and
  ``limitBytes``), served from ``log_dir/<pod>.log`` (the kubelet stand-in writes there: set
  ``log_dir = kubelet.root / "logs"``).

``ApiServerThread`` runs it on its own event loop in a thread so synchronous code (the
official client, the backend, the kubelet stand-in) can talk to it over real HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import json
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock import KubernetesError
from kubernetes import client as k8s

_Key = tuple[str, str, str, str | None, str]  # group, version, plural, namespace, name


@dataclass
class _Fault:
    status: int
    method: str | None
    path: re.Pattern[str]
    times: int


def _now() -> str:
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge(base: Any, patch: Any, strategic: bool) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = _merge(base.get(k), v, strategic)
        return out
    if strategic and isinstance(base, list) and isinstance(patch, list):
        for key in ("name", "type", "resourceName"):
            if all(isinstance(x, dict) and key in x for x in base + patch):
                out_l = [dict(x) for x in base]
                for item in patch:
                    for i, old in enumerate(out_l):
                        if old[key] == item[key]:
                            out_l[i] = _merge(old, item, strategic)
                            break
                    else:
                        out_l.append(item)
                return out_l
    return copy.deepcopy(patch)


def _encode_string_data(key: _Key, obj: dict[str, Any]) -> None:
    """A Secret's write-only ``stringData`` goes into ``data``, base64-encoded."""
    if key[2] != "secrets" or not obj.get("stringData"):
        return
    data = dict(obj.get("data") or {})
    for k, v in obj.pop("stringData").items():
        data[k] = base64.b64encode(str(v).encode()).decode()
    obj["data"] = data


def selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    """Equality-based label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a`` (exists), ``!a``."""
    if not selector:
        return True
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """See the module docstring."""

    resize_mode: str = "accept"  # accept | refuse | absent
    latency_s: float = 0.0  # added to every answer but a watch's (a real server's etcd write)
    max_inflight: int = 0  # > 0: a request beyond that many in flight gets 429 (API priority
    # and fairness' concurrency limit); watches are not counted
    retry_after_s: int | None = None  # the throttle's Retry-After header (APF sends one)
    throttled: int = attrs.field(default=0, init=False)
    _inflight: int = attrs.field(default=0, init=False)
    log_dir: Path | None = None  # where pod logs are read from (the kubelet's root/logs)
    store: dict[_Key, dict[str, Any]] = attrs.field(factory=dict, init=False)
    events: list[tuple[int, _Key, str, dict[str, Any]]] = attrs.field(factory=list, init=False)
    rv: int = attrs.field(default=0, init=False)
    compacted_rv: int = attrs.field(default=0, init=False)
    faults: list[_Fault] = attrs.field(factory=list, init=False)
    watches_served: int = attrs.field(default=0, init=False)
    _changed: asyncio.Condition | None = attrs.field(default=None, init=False)
    _guard: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    # ------------------------------------------------------------- test controls (any thread)

    @property
    def requests(self) -> list[kmock.Request]:
        """Every request served so far (kmock's log), for assertions."""
        return list(self._requests)

    def inject(
        self, status: int, *, method: str | None = None, path: str = ".*", times: int = 1
    ) -> None:
        with self._guard:
            self.faults.append(_Fault(status, method and method.upper(), re.compile(path), times))

    def clear_faults(self) -> None:
        with self._guard:
            self.faults.clear()

    def compact(self) -> None:
        """Forget the event history (etcd compaction): older watches get 410."""
        with self._guard:
            self.compacted_rv = self.rv
            self.events.clear()

    def objects_of(
        self, plural: str, namespace: str | None = None, group: str = ""
    ) -> list[dict[str, Any]]:
        """Stored objects of one resource (``group`` "" is the core API: ``pods`` are Pods,
        not metrics.k8s.io PodMetrics)."""
        with self._guard:
            return [
                copy.deepcopy(o)
                for (g, v, p, ns, _), o in self.store.items()
                if p == plural and g == group and (namespace is None or ns == namespace)
            ]

    # ------------------------------------------------------------- serving

    def _take_fault(self, request: kmock.Request) -> _Fault | None:
        with self._guard:
            for f in self.faults:
                if f.method and f.method != str(request.method.value).upper():
                    continue
                if not f.path.search(str(request.url.path)):
                    continue
                f.times -= 1
                if f.times <= 0:
                    self.faults.remove(f)
                return f
        return None

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if self._changed is None:
            self._changed = asyncio.Condition()
        fault = self._take_fault(request)
        if fault is not None:
            raise KubernetesError(
                status=fault.status, reason="Injected", message=f"injected {fault.status}"
            )
        if str(request.params.get("watch", "")).lower() not in ("true", "1"):
            if self.max_inflight > 0 and self._inflight >= self.max_inflight:
                self.throttled += 1
                if self.retry_after_s is None:
                    raise KubernetesError(
                        status=429, reason="TooManyRequests", message="too many requests in flight"
                    )
                return aiohttp.web.json_response(
                    {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
                     "reason": "TooManyRequests", "message": "too many requests in flight"},
                    status=429,
                    headers={"Retry-After": str(self.retry_after_s)},
                )  # fmt: skip
            self._inflight += 1
            try:
                if self.latency_s > 0:
                    await asyncio.sleep(self.latency_s)
                return await self._serve(request)
            finally:
                self._inflight -= 1
        return await self._serve(request)

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        assert self._changed is not None
        res = request.resource
        if res is None or res.plural is None:
            return await super()._handle(request)
        method = str(request.method.value).upper()
        base = (str(res.group or ""), str(res.version), str(res.plural))
        ns = request.namespace
        name = request.name
        if method == "GET" and str(request.params.get("watch", "")).lower() in ("true", "1"):
            return await self._watch(request, base, ns)
        if method == "GET" and name is None:
            return aiohttp.web.json_response(self._list(base, ns, request.params))
        if method == "GET" and base[2] == "pods" and request.subresource == "log":
            return aiohttp.web.Response(
                text=self._pod_log((*base, ns, name), request.params), content_type="text/plain"
            )
        if method == "GET":
            return aiohttp.web.json_response(self._get((*base, ns, name)))
        if method == "POST":
            body = request.data or {}
            body_name = (body.get("metadata") or {}).get("name")
            out = self._create(
                (*base, ns or (body.get("metadata") or {}).get("namespace"), body_name), body
            )
            await self._notify()
            return aiohttp.web.json_response(out, status=201)
        if name is None:
            raise KubernetesError(status=405, reason="MethodNotAllowed", message=method)
        key: _Key = (*base, ns, name)
        if method == "PATCH":
            ctype = str(request.headers.get("Content-Type", ""))
            out = self._patch(key, request.data or {}, request.subresource, ctype)
        elif method == "PUT":
            out = self._replace(key, request.data or {}, request.subresource)
        elif method == "DELETE":
            out = self._delete(key, request.params, request.data)
        else:
            raise KubernetesError(status=405, reason="MethodNotAllowed", message=method)
        await self._notify()
        return aiohttp.web.json_response(out)

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------- store operations (sync)

    def _bump(self, key: _Key, kind: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.events.append((self.rv, key, kind, copy.deepcopy(obj)))

    def _get(self, key: _Key) -> dict[str, Any]:
        with self._guard:
            obj = self.store.get(key)
            if obj is None:
                raise KubernetesError(
                    status=404, reason="NotFound", message=f'{key[2]} "{key[4]}" not found'
                )
            return copy.deepcopy(obj)

    def _pod_log(self, key: _Key, params: Any) -> str:
        self._get(key)  # 404 for a pod that is not there
        path = self.log_dir / f"{key[4]}.log" if self.log_dir is not None else None
        if path is None or not path.exists():
            raise KubernetesError(
                status=400,
                reason="BadRequest",
                message=f'container in pod "{key[4]}" is waiting to start: ContainerCreating',
            )
        text = path.read_bytes().decode("utf-8", errors="replace")
        if params.get("tailLines") is not None:
            n = int(params["tailLines"])
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-n:]) if n > 0 else ""
        if params.get("limitBytes") is not None:
            text = text.encode()[: int(params["limitBytes"])].decode("utf-8", errors="ignore")
        return text

    def _list(self, base: tuple[str, str, str], ns: str | None, params: Any) -> dict[str, Any]:
        sel = params.get("labelSelector")
        with self._guard:
            items = [
                copy.deepcopy(o)
                for (g, v, p, ons, _), o in sorted(self.store.items(), key=lambda kv: str(kv[0]))
                if (g, v, p) == base
                and (ns is None or ons == ns)
                and selector_matches(sel, (o.get("metadata") or {}).get("labels") or {})
            ]
            return {
                "apiVersion": f"{base[0]}/{base[1]}".lstrip("/"),
                "kind": "List",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }

    def _create(self, key: _Key, body: dict[str, Any]) -> dict[str, Any]:
        if not key[4]:
            raise KubernetesError(status=422, reason="Invalid", message="metadata.name: Required")
        with self._guard:
            if key in self.store:
                raise KubernetesError(
                    status=409,
                    reason="AlreadyExists",
                    message=f'{key[2]} "{key[4]}" already exists',
                )
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            meta["namespace"] = key[3]
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            if key[2] == "pods":
                obj.setdefault("status", {"phase": "Pending"})
            _encode_string_data(key, obj)
            self.store[key] = obj
            self._bump(key, "ADDED", obj)
            return copy.deepcopy(obj)

    def _patch(
        self, key: _Key, body: dict[str, Any], sub: str | None, ctype: str
    ) -> dict[str, Any]:
        if "json-patch" in ctype:
            raise KubernetesError(status=415, reason="UnsupportedMediaType", message=ctype)
        strategic = "strategic" in ctype
        if sub == "resize":
            if self.resize_mode == "absent":
                raise KubernetesError(
                    status=404, reason="NotFound", message="no resize subresource"
                )
            if self.resize_mode == "refuse":
                raise KubernetesError(
                    status=422, reason="Invalid", message="pod resize is not allowed here"
                )
            containers = (body.get("spec") or {}).get("containers") or []
            body = {
                "spec": {
                    "containers": [
                        {"name": c["name"], "resources": c.get("resources", {})} for c in containers
                    ]
                }
            }
            strategic = True
        elif sub == "status":
            body = {"status": body.get("status", {})}
        elif key[2] == "pods":
            body = {k: v for k, v in body.items() if k != "status"}
        with self._guard:
            obj = self.store.get(key)
            if obj is None:
                raise KubernetesError(
                    status=404, reason="NotFound", message=f'"{key[4]}" not found'
                )
            new = _merge(obj, body, strategic)
            for k in ("uid", "creationTimestamp", "namespace", "name"):
                new["metadata"][k] = obj["metadata"].get(k)
            self.store[key] = new
            self._bump(key, "MODIFIED", new)
            return copy.deepcopy(new)

    def _replace(self, key: _Key, body: dict[str, Any], sub: str | None) -> dict[str, Any]:
        with self._guard:
            obj = self.store.get(key)
            if obj is None:
                raise KubernetesError(
                    status=404, reason="NotFound", message=f'"{key[4]}" not found'
                )
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want and want != obj["metadata"]["resourceVersion"]:
                raise KubernetesError(
                    status=409,
                    reason="Conflict",
                    message=f'Operation cannot be fulfilled on {key[2]} "{key[4]}": the object '
                    "has been modified; please apply your changes to the latest version",
                )
            new = copy.deepcopy(body)
            for k in ("uid", "creationTimestamp", "namespace", "name"):
                new.setdefault("metadata", {})[k] = obj["metadata"].get(k)
            _encode_string_data(key, new)
            self.store[key] = new
            self._bump(key, "MODIFIED", new)
            return copy.deepcopy(new)

    def _delete(self, key: _Key, params: Any, body: Any) -> dict[str, Any]:
        grace: int | None = None
        if params.get("gracePeriodSeconds") is not None:
            grace = int(params["gracePeriodSeconds"])
        elif isinstance(body, dict) and body.get("gracePeriodSeconds") is not None:
            grace = int(body["gracePeriodSeconds"])
        with self._guard:
            obj = self.store.get(key)
            if obj is None:
                raise KubernetesError(
                    status=404, reason="NotFound", message=f'"{key[4]}" not found'
                )
            if key[2] == "pods":
                spec = obj.get("spec") or {}
                if grace is None:
                    grace = int(spec.get("terminationGracePeriodSeconds", 30))
                phase = (obj.get("status") or {}).get("phase")
                bound = bool(spec.get("nodeName"))
                if grace > 0 and bound and phase not in ("Succeeded", "Failed"):
                    meta = obj["metadata"]
                    if not meta.get("deletionTimestamp"):
                        meta["deletionTimestamp"] = _now()
                        meta["deletionGracePeriodSeconds"] = grace
                        self._bump(key, "MODIFIED", obj)
                    return copy.deepcopy(obj)
            self._remove(key)
            return copy.deepcopy(obj)

    def _remove(self, key: _Key) -> None:
        obj = self.store.pop(key)
        self._bump(key, "DELETED", obj)
        uid = obj["metadata"].get("uid")
        for k, o in list(self.store.items()):  # owner-reference garbage collection
            owners = (o.get("metadata") or {}).get("ownerReferences") or []
            if k in self.store and any(r.get("uid") == uid for r in owners):
                self._remove(k)

    # ------------------------------------------------------------- watch

    async def _watch(
        self, request: kmock.Request, base: tuple[str, str, str], ns: str | None
    ) -> aiohttp.web.StreamResponse:
        params = request.params
        sel = params.get("labelSelector")
        timeout = float(params.get("timeoutSeconds") or 30)
        since = params.get("resourceVersion")
        raw = request._raw_request
        assert raw is not None
        self.watches_served += 1
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(raw)

        def matches(key: _Key, obj: dict[str, Any]) -> bool:
            return (
                key[:3] == base
                and (ns is None or key[3] == ns)
                and selector_matches(sel, (obj.get("metadata") or {}).get("labels") or {})
            )

        pending: list[dict[str, Any]] = []
        with self._guard:
            if not since or since == "0":
                cursor = self.rv
                pending = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for k, o in self.store.items()
                    if matches(k, o)
                ]
            elif int(since) < self.compacted_rv:
                pending = [
                    {
                        "type": "ERROR",
                        "object": {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "code": 410,
                            "reason": "Expired",
                            "message": f"too old resource version: {since} ({self.compacted_rv})",
                        },
                    }
                ]
                cursor = -1
            else:
                cursor = int(since)
        for ev in pending:
            await resp.write(json.dumps(ev).encode() + b"\n")
        if cursor < 0:
            await resp.write_eof()
            return resp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        assert self._changed is not None
        try:
            while True:
                with self._guard:
                    fresh = [
                        {"type": kind, "object": copy.deepcopy(obj)}
                        for rv, key, kind, obj in self.events
                        if rv > cursor and matches(key, obj)
                    ]
                    cursor = self.rv
                for ev in fresh:
                    await resp.write(json.dumps(ev).encode() + b"\n")
                left = deadline - loop.time()
                if left <= 0:
                    break
                async with self._changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), timeout=min(left, 0.5))
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        await resp.write_eof()
        return resp


class ApiServerThread:
    """``ApiServer`` on an HTTP port, served from its own thread. Use as a context manager."""

    def __init__(self, *, resize_mode: str = "accept") -> None:
        self.resize_mode = resize_mode
        self.server: ApiServer | None = None
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kmock-apiserver", daemon=True)
        self._failure: BaseException | None = None

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with ApiServer(resize_mode=self.resize_mode) as api, kmock.Server(api) as srv:
                self.server = api
                self.url = str(srv.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by __enter__
            self._failure = exc
            self._ready.set()

    def __enter__(self) -> ApiServerThread:
        self._thread.start()
        if not self._ready.wait(30) or self._failure is not None or self.server is None:
            raise RuntimeError(f"the kmock API server did not start: {self._failure!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    @property
    def api(self) -> ApiServer:
        assert self.server is not None
        return self.server

    def client(self) -> k8s.ApiClient:
        """An official-client ApiClient pointed at this server (no urllib3 retries of its
        own: the backend's retry policy is what is under test)."""
        cfg = k8s.Configuration()
        cfg.host = self.url
        cfg.retries = False
        return k8s.ApiClient(cfg)


def iter_pods(server: ApiServer, namespace: str | None = None) -> Iterator[dict[str, Any]]:
    yield from server.objects_of("pods", namespace)
