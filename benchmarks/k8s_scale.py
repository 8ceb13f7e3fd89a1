"""The Kubernetes backend at scale (issue 34 item 3) on the kmock API server stand-in
(``tests/runtime/kubernetes/apiserver.py``; no kubelet: this script writes pod statuses through
the API the way a kubelet does, with a client of its own whose requests are not counted).

Phases, each on the real ``KubernetesBackend`` and each counting the API requests the backend
made (the server's request log, the driver's own requests left out):

1. launch: ``--pods`` pods created one by one (``launch`` in a loop: what the controller did)
   and as one batch (``launch_many``, ``--concurrency`` creates in flight), each on a fresh
   server: seconds, creates, other calls, relists.
2. running: every pod set Running by the driver: backend calls per pod event.
3. exits: ``--exits`` pods set Failed (kept) and ``--exits`` set Succeeded (the backend deletes
   a finished pod), ``--exit-rate`` per second: the time from the status write to the
   backend's ``poll()`` reporting the exit (p50/p99/max), calls per exit, relists.
4. stop storm: ``--exits`` running pods stopped at once (``stop(wait=False)``): calls, relists.
5. unschedulable: ``--exits`` pods left Pending with ``PodScheduled=False/Unschedulable``: the
   time until ``pending_since`` reports each.
6. API errors: a batch launch of ``--pods`` while the server answers the first
   ``--faults`` creates with 429 and the first lists with 503: it completes; seconds, retries.
7. throttled: a batch launch of ``--pods`` against a server that answers 429 to any request
   beyond 4 in flight (API priority and fairness' concurrency limit): seconds, 429s; then
   the same with ``Retry-After: 1`` on each 429, as API priority and fairness sends it (one
   throttle holds every create of the batch for that long).

The stand-in adds ``--latency-ms`` to each answer (not to a watch): kmock alone answers in
about a millisecond, a real API server's write waits on etcd.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/k8s_scale.py --pods 1000 \\
        --json benchmarks/results/k8s_scale.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "runtime" / "kubernetes"))

from apiserver import ApiServerThread  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from dlrover_core.runtime.backends.base import NodeHandle, NodeSpec  # noqa: E402
from dlrover_core.runtime.backends.kubernetes import KubernetesBackend, RetryPolicy  # noqa: E402
from dlrover_core.types import NodeResources, Role  # noqa: E402

NAMESPACE = "jobs"
JOB = "scale-job"
DRIVER_AGENT = "k8s-scale-driver"
# added to each answer: kmock answers in ~1 ms, a real server's write waits on etcd
LATENCY = {"s": 0.005}


class _Server(ApiServerThread):
    def __enter__(self) -> _Server:
        super().__enter__()
        self.api.latency_s = LATENCY["s"]
        return self


def _spec(i: int, incarnation: int = 0) -> NodeSpec:
    return NodeSpec(Role.WORKER, i, incarnation, NodeResources(1000, 1024), ["python", "-V"])


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Counter:
    """The backend's requests to one server (the driver's are left out), by kind."""

    def __init__(self, srv: ApiServerThread) -> None:
        self.srv = srv
        self.mark = 0

    def _backend(self) -> list[Any]:
        return [
            r for r in self.srv.api.requests if str(r.headers.get("User-Agent", "")) != DRIVER_AGENT
        ]

    def start(self) -> None:
        self.mark = len(self._backend())

    def since(self) -> dict[str, int]:
        reqs = self._backend()[self.mark :]
        out: dict[str, int] = {"total": len(reqs)}
        for r in reqs:
            m = str(r.method.value).upper()
            watch = str(r.params.get("watch", "")).lower() in ("true", "1")
            kind = "watch" if watch else ("list" if m == "GET" and r.name is None else m.lower())
            if r.resource is not None and r.resource.plural == "events":
                kind = "event"
            out[kind] = out.get(kind, 0) + 1
        return out


def _driver(srv: ApiServerThread) -> k8s.CoreV1Api:
    c = srv.client()
    c.user_agent = DRIVER_AGENT
    return k8s.CoreV1Api(c)


def _status(core: k8s.CoreV1Api, name: str, status: dict[str, Any]) -> None:
    core.patch_namespaced_pod_status(name, NAMESPACE, {"status": status}, _preload_content=False)


def _container(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "node",
        "image": "i",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": state,
    }


RUNNING = {
    "phase": "Running",
    "podIP": "10.0.0.1",
    "containerStatuses": [_container({"running": {"startedAt": "2026-01-01T00:00:00Z"}})],
}


def _ended(code: int) -> dict[str, Any]:
    reason = "Completed" if code == 0 else "Error"
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [_container({"terminated": {"exitCode": code, "reason": reason}})],
    }


UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient cpu.",
        }
    ],
}


def _backend(
    srv: ApiServerThread, concurrency: int, resync_s: float, retry: RetryPolicy | None = None
) -> KubernetesBackend:
    return KubernetesBackend(
        NAMESPACE,
        "dlrover-rm:bench",
        JOB,
        api_client=srv.client(),
        retry=retry or RetryPolicy(),
        resync_s=resync_s,
        launch_concurrency=concurrency,
    )


def _close(b: KubernetesBackend) -> None:
    b._stopping.set()  # end the watcher; the server goes with its pods
    b._kick.set()


class Exits(threading.Thread):
    """Calls ``poll()`` every 5 ms and notes when each pod's exit was handed out."""

    def __init__(self, b: KubernetesBackend) -> None:
        super().__init__(daemon=True)
        self.b = b
        self.seen: dict[str, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for e in self.b.poll():
                self.seen[e.ref] = time.monotonic()
            time.sleep(0.005)


def _wait(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def _launch(pods: int, concurrency: int, batch: bool, resync_s: float) -> dict[str, Any]:
    with _Server() as srv:
        b = _backend(srv, concurrency, resync_s)
        cnt = Counter(srv)
        cnt.start()
        t0 = time.monotonic()
        specs = [_spec(i) for i in range(pods)]
        if batch:
            res = b.launch_many(specs)
            failed = [r for r in res if not isinstance(r, NodeHandle)]
        else:
            failed = []
            for s in specs:
                b.launch(s)
        took = time.monotonic() - t0
        calls = cnt.since()
        stored = len(srv.api.objects_of("pods", NAMESPACE))
        _close(b)
    return {
        "mode": "launch_many" if batch else "launch loop",
        "concurrency": concurrency if batch else 1,
        "seconds": round(took, 3),
        "pods_per_s": round(pods / took, 1),
        "failed": len(failed),
        "pods_stored": stored,
        "calls": calls,
        "creates_per_pod": round(calls.get("post", 0) / pods, 3),
        "relists": b.relists,
    }


def _events(
    pods: int, exits: int, concurrency: int, resync_s: float, exit_rate: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _Server() as srv:
        b = _backend(srv, concurrency, resync_s)
        core = _driver(srv)
        handles = [
            h for h in b.launch_many([_spec(i) for i in range(pods)]) if isinstance(h, NodeHandle)
        ]
        cnt = Counter(srv)
        time.sleep(1.0)  # the watcher's first list
        # running
        cnt.start()
        r0 = b.relists
        t0 = time.monotonic()
        for h in handles:
            _status(core, h.ref, RUNNING)
        seen_all = _wait(
            lambda: all(
                (b.pod(h) or {}).get("status", {}).get("phase") == "Running" for h in handles
            ),
            60,
        )
        calls = cnt.since()
        out["running"] = {
            "events": len(handles),
            "seconds_to_all_seen": round(time.monotonic() - t0, 3),
            "all_seen": seen_all,
            "calls": calls,
            "relists": b.relists - r0,
            "calls_per_event": round(calls["total"] / len(handles), 4),
        }
        # exits: failed (kept), then succeeded (deleted by the backend)
        ex = Exits(b)
        ex.start()
        gap = 1.0 / exit_rate
        for label, code, group in (
            ("failed", 1, handles[:exits]),
            ("succeeded", 0, handles[exits : 2 * exits]),
        ):
            cnt.start()
            r0 = b.relists
            wrote: dict[str, float] = {}
            t0 = time.monotonic()
            for h in group:
                _status(core, h.ref, _ended(code))
                wrote[h.ref] = time.monotonic()
                time.sleep(gap)
            _wait(lambda g=group: all(h.ref in ex.seen for h in g), 60)  # type: ignore[misc]
            time.sleep(0.5)  # the deletes of finished pods
            lat = [1000 * (ex.seen[r] - w) for r, w in wrote.items() if r in ex.seen]
            calls = cnt.since()
            out[f"exits_{label}"] = {
                "events": len(group),
                "reported": len(lat),
                "seconds": round(time.monotonic() - t0, 2),
                "status_to_poll_ms": {
                    "p50": round(_pct(lat, 0.5), 1),
                    "p99": round(_pct(lat, 0.99), 1),
                    "max": round(max(lat, default=float("nan")), 1),
                },
                "calls": calls,
                "calls_per_event": round(calls["total"] / len(group), 3),
                "relists": b.relists - r0,
            }
        # a storm of stops (the master ends many nodes at once)
        group = handles[2 * exits : 3 * exits]
        cnt.start()
        r0 = b.relists
        t0 = time.monotonic()
        for h in group:
            b.stop(h, grace_s=0, wait=False)
        _wait(lambda: all(h.ref in ex.seen for h in group), 60)
        calls = cnt.since()
        out["stop_storm"] = {
            "stops": len(group),
            "seconds_to_all_exits": round(time.monotonic() - t0, 3),
            "reported": sum(h.ref in ex.seen for h in group),
            "calls": calls,
            "calls_per_stop": round(calls["total"] / len(group), 3),
            "relists": b.relists - r0,
        }
        # unschedulable
        group = handles[3 * exits : 4 * exits]
        cnt.start()
        wrote = {}
        seen: dict[str, float] = {}

        def all_pending() -> bool:
            for h in group:
                if h.ref not in seen and b.pending_since(h) is not None:
                    seen[h.ref] = time.monotonic()
            return len(seen) == len(group)

        det = threading.Thread(target=_wait, args=(all_pending, 60), daemon=True)
        det.start()  # watches while the driver writes
        for h in group:
            wrote[h.ref] = time.monotonic()
            _status(core, h.ref, UNSCHEDULABLE)
        det.join()
        ok = len(seen) == len(group)
        lat = [1000 * (seen[r] - w) for r, w in wrote.items() if r in seen]
        out["unschedulable"] = {
            "pods": len(group),
            "all_detected": ok,
            "status_to_pending_since_ms": {
                "p50": round(_pct(lat, 0.5), 1),
                "max": round(max(lat, default=float("nan")), 1),
            },
            "calls": cnt.since(),
        }
        ex.done.set()
        out["relists_total"] = b.relists
        out["watches_served"] = srv.api.watches_served
        _close(b)
    return out


def _faults(pods: int, concurrency: int, faults: int, resync_s: float) -> dict[str, Any]:
    with _Server() as srv:
        srv.api.inject(429, method="POST", path=r"/pods$", times=faults)
        srv.api.inject(503, method="GET", path=r"/pods$", times=3)
        b = _backend(srv, concurrency, resync_s)
        cnt = Counter(srv)
        cnt.start()
        t0 = time.monotonic()
        res = b.launch_many([_spec(i) for i in range(pods)])
        took = time.monotonic() - t0
        calls = cnt.since()
        stored = len(srv.api.objects_of("pods", NAMESPACE))
        listed = _wait(lambda: b.relists >= 1, 30)
        _close(b)
    return {
        "pods": pods,
        "injected_429_on_create": faults,
        "injected_503_on_list": 3,
        "seconds": round(took, 3),
        "launched": sum(isinstance(r, NodeHandle) for r in res),
        "pods_stored": stored,
        "creates": calls.get("post", 0),
        "retries": calls.get("post", 0) - pods,
        "watcher_listed_after_503s": listed,
        "policy": "RetryPolicy() default: exponential from 0.2 s to 10 s, full jitter",
    }


def _throttled(
    pods: int, concurrency: int, max_inflight: int, resync_s: float, retry_after: int | None = None
) -> dict[str, Any]:
    with _Server() as srv:
        srv.api.max_inflight = max_inflight
        srv.api.retry_after_s = retry_after
        b = _backend(srv, concurrency, resync_s)
        cnt = Counter(srv)
        cnt.start()
        t0 = time.monotonic()
        res = b.launch_many([_spec(i) for i in range(pods)])
        took = time.monotonic() - t0
        calls = cnt.since()
        stored = len(srv.api.objects_of("pods", NAMESPACE))
        throttled = srv.api.throttled
        _close(b)
    return {
        "pods": pods,
        "server_max_inflight": max_inflight,
        "retry_after_s": retry_after,
        "seconds": round(took, 3),
        "launched": sum(isinstance(r, NodeHandle) for r in res),
        "pods_stored": stored,
        "answered_429": throttled,
        "creates": calls.get("post", 0),
    }


def run_k8s_scale(
    pods: int = 1000,
    concurrency: int = 16,
    exits: int = 100,
    exit_rate: float = 50.0,
    faults: int | None = None,
    resync_s: float = 10.0,
    loop_baseline: bool = True,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pods": pods,
        "concurrency": concurrency,
        "resync_s": resync_s,
        "latency_ms": LATENCY["s"] * 1000,
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    launches = []
    if loop_baseline:
        launches.append(_launch(pods, concurrency, False, resync_s))
    launches.append(_launch(pods, concurrency, True, resync_s))
    out["launch"] = launches
    out["events"] = _events(pods, exits, concurrency, resync_s, exit_rate)
    out["api_errors"] = _faults(
        pods, concurrency, pods // 3 if faults is None else faults, resync_s
    )
    out["api_throttled"] = _throttled(pods, concurrency, 4, resync_s)
    # what API priority and fairness answers: 429 with Retry-After (the whole batch holds)
    out["api_throttled_retry_after"] = _throttled(pods, concurrency, 4, resync_s, retry_after=1)
    out["load_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--exits", type=int, default=100, help="pods per event phase")
    ap.add_argument("--exit-rate", type=float, default=50.0, help="status writes per second")
    ap.add_argument("--faults", type=int, default=None, help="429s on create (default pods/3)")
    ap.add_argument("--resync-s", type=float, default=10.0)
    ap.add_argument("--no-loop", action="store_true", help="skip the one-by-one launch")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--latency-ms",
        type=float,
        default=LATENCY["s"] * 1000,
        help="added to every answer of the stand-in (not to a watch)",
    )
    a = ap.parse_args()
    LATENCY["s"] = a.latency_ms / 1000
    logging.getLogger("dlrover_core").setLevel(logging.ERROR)  # the retries' warnings
    r = run_k8s_scale(
        a.pods, a.concurrency, a.exits, a.exit_rate, a.faults, a.resync_s, not a.no_loop
    )
    text = json.dumps(r, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
