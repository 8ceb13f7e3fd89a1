"""Load nodes: simulated workers and PS that speak the real master protocol without training,
and a job master in its own process to point them at (issue 34: the control plane at scale).

A :class:`LoadNode` is one thread with its own :class:`~.master_client.MasterClient` (its own
channel, as a pod has): it registers, heartbeats every ``heartbeat_s`` (phases spread at
random), and a worker takes a shard, "trains" it for ``shard_s`` (+-20 %, sleeping), reports
it done and its metrics, and takes the next. A PS registers with an address, a generation and
a restored tag and heartbeats its rows. Each call's round trip is recorded per method. A
:class:`LoadFleet` holds hundreds of them in one process (small thread stacks).

``kill`` stops a node at once, as SIGKILL would: its doing shards stay with it at the master.

:class:`MasterProcess` runs ``python -m dlrover_core.runtime.loadgen master`` over a run
directory: a real :class:`~.state.MasterState` served by the real ``serve_master``, plus a
control loop shaped like the job master's tick (liveness checks every ``tick_s``, the shard
counts, an observation every heartbeat interval), so the CPU and memory psutil reads on its pid
are the master's own. Commands go as JSON lines on its stdin, answers come back on its stdout:
``launch`` (write ahead every node's launch, as the controller does), ``relaunch`` (new
incarnations, what a storm's replacements cost), ``requeue_after`` (a PS restored an older
checkpoint), ``stats`` (registered nodes, heartbeat ages, dead verdicts, per-method handler
times, the shard summary), ``reset`` (start a new measuring window), ``quit``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import math
import os
import pstats
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from dlrover_core.faults.health import HangPolicy, HeartbeatPolicy
from dlrover_core.runtime.master_client import (
    MasterClient,
    MasterRejectedError,
    MasterUnavailableError,
)
from dlrover_core.runtime.service import master_handlers
from dlrover_core.runtime.state import MasterState
from dlrover_core.runtime.wire import Message, serve
from dlrover_core.types import NodeResources, NodeState, Role

WORKER_RES = NodeResources(4000, 8192)
PS_RES = NodeResources(8000, 32768)
_STACK_BYTES = 512 * 1024


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by nearest rank; NaN for no values."""
    v = sorted(values)
    if not v:
        return math.nan
    k = max(0, min(len(v) - 1, math.ceil(q / 100.0 * len(v)) - 1))
    return v[k]


def summarize_ms(values: list[float]) -> dict[str, float]:
    """Seconds in, ``{n, p50_ms, p99_ms, max_ms}`` out."""
    return {
        "n": len(values),
        "p50_ms": percentile(values, 50) * 1e3,
        "p99_ms": percentile(values, 99) * 1e3,
        "max_ms": max(values) * 1e3 if values else math.nan,
    }


# --- load nodes ---------------------------------------------------------------------------------


@dataclass
class Latencies:
    """Round trips per method, in seconds, and when each was taken (monotonic)."""

    by_method: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, method: str, at: float, seconds: float) -> None:
        self.by_method.setdefault(method, []).append((at, seconds))

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def window(self, start: float, end: float = math.inf) -> dict[str, list[float]]:
        return {m: [d for t, d in v if start <= t < end] for m, v in list(self.by_method.items())}


class LoadNode(threading.Thread):
    """One simulated node (see the module docstring)."""

    def __init__(
        self,
        address: str,
        token: str,
        role: Role,
        node_id: int,
        *,
        incarnation: int = 0,
        heartbeat_s: float = 15.0,
        shard_s: float = 5.0,
        metrics_s: float = 5.0,
        wait_s: float = 1.0,
        retry_for_s: float = 60.0,
        latencies: Latencies,
        seed: int = 0,
    ) -> None:
        super().__init__(name=f"load-{role.value}-{node_id}", daemon=True)
        self.address = address
        self.token = token
        self.role = role
        self.node_id = node_id
        self.incarnation = incarnation
        self.heartbeat_s = heartbeat_s
        self.shard_s = shard_s
        self.metrics_s = metrics_s
        self.wait_s = wait_s
        self.retry_for_s = retry_for_s
        self.lat = latencies
        self.rng = random.Random(seed * 1_000_003 + node_id * 7 + (role is Role.PS))
        self._stop_event = threading.Event()
        self._killed = False
        self.registered_mono: float | None = None
        self.client: MasterClient | None = None
        self.shards_done = 0
        self.steps = 0
        self.holding: int | None = None
        self.exit_reason: str | None = None
        # (when, how late) each heartbeat left against its schedule (monotonic, seconds)
        self.hb_late_s: list[tuple[float, float]] = []

    def kill(self) -> None:
        """Stop at once, reporting nothing (SIGKILL)."""
        self._killed = True
        self._stop_event.set()

    def stop(self) -> None:
        self._stop_event.set()

    def _timed(self, method: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        out = fn()
        self.lat.add(method, t0, time.monotonic() - t0)
        return out

    def run(self) -> None:
        try:
            self._run()
        except MasterUnavailableError:
            self.exit_reason = "master unavailable"
            self.lat.error("unavailable")
        except MasterRejectedError as e:
            self.exit_reason = "superseded" if e.superseded else f"rejected: {e.code.name}"
            self.lat.error("superseded" if e.superseded else e.code.name)
        finally:
            if self.client is not None:
                self.client.close()

    def _run(self) -> None:
        c = self.client = MasterClient(
            self.address, self.token, retry_for_s=self.retry_for_s, backoff_max_s=1.0
        )
        extra: dict[str, Any] = {}
        if self.role is Role.PS:
            extra = {"address": f"sim-ps-{self.node_id}:2222", "generation": 0,
                     "restored_seq": -1}  # fmt: skip
        pid = 100_000 + self.node_id * 10 + self.incarnation
        self._timed("Register", lambda: c.register(self.role, self.node_id, pid,
                                                   self.incarnation, **extra))  # fmt: skip
        now = time.monotonic()
        self.registered_mono = now
        next_hb = now + self.rng.uniform(0.0, self.heartbeat_s)
        next_work = now if self.role is Role.WORKER else math.inf
        next_metrics = now + self.metrics_s
        while not self._stop_event.is_set():
            now = time.monotonic()
            if now >= next_hb:
                self.hb_late_s.append((now, now - next_hb))
                extra_hb = {"rows": 1000.0 * self.node_id} if self.role is Role.PS else {}
                reply = self._timed("Heartbeat", partial(
                    c.heartbeat, cpu_percent=350.0, rss_mib=4096.0, step=self.steps,
                    samples_per_s=2000.0 if self.role is Role.WORKER else 0.0, **extra_hb,
                ))  # fmt: skip
                if self._killed:
                    return
                if reply.stop:
                    self.exit_reason = "stop"
                    return
                next_hb += self.heartbeat_s
                if next_hb <= now:
                    next_hb = now + self.heartbeat_s
            if now >= next_work:
                if self.holding is not None:
                    self._timed("ShardDone", partial(c.shard_done, self.holding, 1000, 0.5))
                    if self._killed:
                        return
                    self.holding = None
                    self.shards_done += 1
                    self.steps += 10
                    if now >= next_metrics:
                        self._timed("ReportMetrics", lambda: c.report_metrics(
                            step=self.steps, samples=1000 * self.shards_done,
                            samples_per_s=2000.0, window_s=self.metrics_s))  # fmt: skip
                        next_metrics = now + self.metrics_s
                r = self._timed("GetShard", c.get_shard)
                if self._killed:
                    return
                if r.shard is not None:
                    self.holding = r.shard.shard_id
                    next_work = now + self.shard_s * self.rng.uniform(0.8, 1.2)
                elif r.wait:
                    next_work = now + self.wait_s
                else:
                    self.exit_reason = "stop" if r.stop else "done"
                    return
            wake = min(next_hb, next_work) - time.monotonic()
            if wake > 0:
                self._stop_event.wait(wake)


class LoadFleet:
    """Hundreds of :class:`LoadNode` threads in this process."""

    def __init__(self, address: str, token: str, **node_kw: Any) -> None:
        self.address = address
        self.token = token
        self.node_kw = node_kw
        self.lat = Latencies()
        self.nodes: dict[tuple[Role, int], LoadNode] = {}
        self.retired: list[LoadNode] = []

    def start(self, role: Role, ids: Iterable[int], incarnation: int = 0) -> list[LoadNode]:
        old = threading.stack_size()
        threading.stack_size(_STACK_BYTES)
        try:
            out = []
            for i in ids:
                prev = self.nodes.get((role, i))
                if prev is not None:
                    self.retired.append(prev)
                n = LoadNode(self.address, self.token, role, i, incarnation=incarnation,
                             latencies=self.lat, **self.node_kw)  # fmt: skip
                self.nodes[(role, i)] = n
                n.start()
                out.append(n)
            return out
        finally:
            threading.stack_size(old)

    def kill(self, role: Role, ids: Iterable[int]) -> None:
        for i in ids:
            self.nodes[(role, i)].kill()

    def registered(self, nodes: Iterable[LoadNode] | None = None) -> int:
        ns = list(self.nodes.values()) if nodes is None else list(nodes)
        return sum(n.registered_mono is not None and n.is_alive() for n in ns)

    def wait_registered(self, nodes: list[LoadNode], timeout_s: float) -> float | None:
        """Seconds until every one of ``nodes`` registered (None: not within ``timeout_s``)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if all(n.registered_mono is not None for n in nodes):
                return max(n.registered_mono or t0 for n in nodes) - t0
            time.sleep(0.05)
        return None

    def stop_all(self, join_s: float = 10.0) -> None:
        for n in [*self.nodes.values(), *self.retired]:
            n.stop()
        deadline = time.monotonic() + join_s
        for n in [*self.nodes.values(), *self.retired]:
            n.join(max(0.0, deadline - time.monotonic()))


# --- the master, in its own process ---------------------------------------------------------------


class _Timed:
    """Handler wall times per method, inside the master (its own view of each call)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: dict[str, list[float]] = {}

    def wrap(self, name: str, fn: Callable[[Message], Any]) -> Callable[[Message], Any]:
        def call(msg: Message) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(msg)
            finally:
                d = time.perf_counter() - t0
                with self.lock:
                    self.times.setdefault(name, []).append(d)

        return call

    def take(self) -> dict[str, list[float]]:
        with self.lock:
            out, self.times = self.times, {}
            return out


class _Profiled:
    """cProfile of every handler thread (one profiler per thread, merged at the end)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.all: list[cProfile.Profile] = []
        self.lock = threading.Lock()

    def wrap(self, fn: Callable[[Message], Any]) -> Callable[[Message], Any]:
        def call(msg: Message) -> Any:
            p = getattr(self.local, "p", None)
            if p is None:
                p = self.local.p = cProfile.Profile()
                with self.lock:
                    self.all.append(p)
            p.enable()
            try:
                return fn(msg)
            finally:
                p.disable()

        return call

    def text(self, limit: int = 30) -> str:
        if not self.all:
            return ""
        buf = io.StringIO()
        st = pstats.Stats(self.all[0], stream=buf)
        for p in self.all[1:]:
            st.add(p)
        st.sort_stats("cumulative").print_stats(limit)
        return buf.getvalue()


def _master_main(args: argparse.Namespace) -> int:
    token = "load-token"
    state = MasterState(
        args.run_dir,
        total_rows=args.total_rows,
        shard_size=args.shard_size,
        synchronous="NORMAL",
    )
    state.persist()
    timed = _Timed()
    prof = _Profiled() if args.profile else None
    handlers = {}
    for name, fn in master_handlers(state).items():
        h = prof.wrap(fn) if prof is not None else fn
        handlers[name] = timed.wrap(name, h)
    server, port = serve(
        "dlrover.Master", handlers, token, "127.0.0.1", args.port, args.max_workers
    )
    hb = HeartbeatPolicy(interval_s=args.heartbeat_s, dead_after_s=args.dead_after_s)
    strict = HeartbeatPolicy(interval_s=args.heartbeat_s, dead_after_s=3 * args.heartbeat_s)
    hang = HangPolicy()
    allocated: dict[tuple[Role, int], NodeResources] = {}
    mon: dict[str, Any] = {"dead": set(), "dead_strict": set(), "max_age_s": 0.0,
                           "ticks": 0, "tick_s": []}  # fmt: skip
    mon_lock = threading.Lock()
    stop = threading.Event()

    def tick_loop() -> None:
        next_obs = time.monotonic()
        while not stop.wait(args.tick_s):
            t0 = time.perf_counter()
            dead = state.dead_nodes(hb)
            dead_s = state.dead_nodes(strict)
            state.unregistered_nodes(900.0)
            state.hung_nodes(hang, allocated)
            state.shards.counts()
            now = time.monotonic()
            if now >= next_obs:
                state.observation(time.time(), allocated)
                next_obs = now + args.heartbeat_s
            with state._lock:
                ages = [
                    now - r.last_heartbeat_s
                    for r in state.nodes.values()
                    if r.state is NodeState.RUNNING and r.last_heartbeat_s is not None
                ]
            with mon_lock:
                mon["dead"].update(dead)
                mon["dead_strict"].update(dead_s)
                mon["max_age_s"] = max(mon["max_age_s"], max(ages, default=0.0))
                mon["ticks"] += 1
                mon["tick_s"].append(time.perf_counter() - t0)

    threading.Thread(target=tick_loop, name="tick", daemon=True).start()

    def answer(obj: Mapping[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    answer({"port": port, "pid": os.getpid(), "master_id": state.master_id,
            "restored": state.restored})  # fmt: skip
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd["op"]
        t0 = time.perf_counter()
        if op == "launch" or op == "relaunch":
            role = Role(cmd["role"])
            released: list[int] = []
            doing = state.shards.doing_by_worker() if role is Role.WORKER else {}
            ids, size = list(cmd["ids"]), int(cmd.get("batch", 0))
            res = WORKER_RES if role is Role.WORKER else PS_RES
            for chunk in (
                [ids[k : k + size] for k in range(0, len(ids), size)]
                if size
                else [[i] for i in ids]
            ):
                incs = {}
                with state.batch():  # write ahead, one write for the chunk (the controller's
                    for i in chunk:  # launch() today writes per node: batch=0)
                        rec = state.node(role, i)
                        inc = incs[i] = 0 if rec is None or op == "launch" else rec.incarnation + 1
                        state.record_launch(role, i, inc, res)
                        released.extend(doing.get(i, []))
                        allocated[(role, i)] = res
                # ... the backend starts the chunk here ...
                with state.batch():
                    for i in chunk:
                        state.record_launch(role, i, incs[i], res,
                                            ref=f"sim-{role.value}-{i}-{incs[i]}")  # fmt: skip
            answer({"op": op, "seconds": time.perf_counter() - t0, "released": released})
        elif op == "requeue_after":
            ids = state.shards.requeue_done_after(int(cmd["seq"]), "PS restored an older state")
            answer({"op": op, "seconds": time.perf_counter() - t0, "ids": ids})
        elif op == "stats":
            with mon_lock:
                m = {"dead": sorted(f"{r.value}-{i}" for r, i in mon["dead"]),
                     "dead_strict": sorted(f"{r.value}-{i}" for r, i in mon["dead_strict"]),
                     "max_heartbeat_age_s": mon["max_age_s"], "ticks": mon["ticks"],
                     "tick": summarize_ms(mon["tick_s"])}  # fmt: skip
            with state._lock:
                reg = sum(r.registered and r.state is NodeState.RUNNING
                          for r in state.nodes.values())  # fmt: skip
                incs = {f"{r.role.value}-{r.node_id}": r.incarnation
                        for r in state.nodes.values()}  # fmt: skip
            summary = state.shards.summary()
            replays = state.shards._query(
                "SELECT shard_id, COUNT(*) FROM replays GROUP BY shard_id"
            )
            failures = state.shards._query(
                "SELECT failures, COUNT(*) FROM shards GROUP BY failures"
            )
            answer({"op": op, "registered": reg, "incarnations": incs, "monitor": m,
                    "handlers": {k: summarize_ms(v) for k, v in timed.take().items()},
                    "shards": summary, "doing_by_worker": state.shards.doing_by_worker(),
                    "replays_per_shard": dict(replays), "failures_hist": dict(failures),
                    "done_seq": state.shards.done_seq})  # fmt: skip
        elif op == "reset":
            timed.take()
            with mon_lock:
                mon.update(dead=set(), dead_strict=set(), max_age_s=0.0, ticks=0, tick_s=[])
            answer({"op": op})
        elif op == "profile":
            answer({"op": op, "text": prof.text(int(cmd.get("limit", 30))) if prof else ""})
        elif op == "quit":
            break
        else:
            answer({"op": op, "error": "unknown op"})
    stop.set()
    server.stop(grace=None)
    state.close()
    answer({"op": "quit"})
    return 0


class MasterProcess:
    """The load master in a child process (see the module docstring)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        total_rows: int,
        shard_size: int,
        heartbeat_s: float = 15.0,
        dead_after_s: float = 600.0,
        port: int = 0,
        tick_s: float = 0.2,
        max_workers: int = 16,
        profile: bool = False,
    ) -> None:
        argv = [sys.executable, "-m", "dlrover_core.runtime.loadgen", "master",
                "--run-dir", str(run_dir), "--total-rows", str(total_rows),
                "--shard-size", str(shard_size), "--heartbeat-s", repr(heartbeat_s),
                "--dead-after-s", repr(dead_after_s), "--port", str(port),
                "--tick-s", repr(tick_s), "--max-workers", str(max_workers)]  # fmt: skip
        if profile:
            argv.append("--profile")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)  # fmt: skip
        hello = self._read()
        self.ready_s = time.monotonic() - self.t_start
        self.port = int(hello["port"])
        self.pid = int(hello["pid"])
        self.master_id = str(hello["master_id"])
        self.restored = bool(hello["restored"])
        self.address = f"127.0.0.1:{self.port}"
        self.token = "load-token"

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the load master exited (rc {self.proc.poll()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def quit(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, ValueError):
                self.ask("quit")
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlrover_core.runtime.loadgen")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("master", help="a load master on stdin/stdout (see the module doc)")
    m.add_argument("--run-dir", type=Path, required=True)
    m.add_argument("--total-rows", type=int, required=True)
    m.add_argument("--shard-size", type=int, required=True)
    m.add_argument("--heartbeat-s", type=float, default=15.0)
    m.add_argument("--dead-after-s", type=float, default=600.0)
    m.add_argument("--port", type=int, default=0)
    m.add_argument("--tick-s", type=float, default=0.2)
    m.add_argument("--max-workers", type=int, default=16)
    m.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    return _master_main(args)


if __name__ == "__main__":
    sys.exit(main())
