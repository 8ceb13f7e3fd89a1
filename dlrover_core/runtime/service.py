"""The job master's bookkeeping (:class:`MasterState`) and its gRPC service ``dlrover.Master``.

Pure bookkeeping: nodes, heartbeats, the shard queue, the PS set, runtime metrics. No process
control here: the control loop (in the master process) reads :meth:`MasterState.dead_nodes`,
:meth:`MasterState.observation` and friends, decides, acts through a backend, and writes its
decisions back with :meth:`MasterState.mark_node`, :meth:`MasterState.set_ps_set`,
:meth:`MasterState.record_plan`.

Survives a master restart. The run directory holds

- ``shards.db``: the shard queue (:mod:`dlrover_core.runtime.shards`), one transaction a change;
- ``master.json``: the master's own small state (nodes with pid, incarnation, restarts and
  state; the PS set and its version; plans and faults so far; global step; job state), written
  atomically (tmp + fsync + rename) on every change of it, and at most every
  ``persist_every_s`` for the global step alone.

On restart the state is restored; running nodes get a fresh heartbeat grace (their last
heartbeat counts as "now"), keep their doing shards, and re-register when their client sees the
new ``master_id``. A node that stays silent is found by :meth:`MasterState.dead_nodes`, and
marking it failed gives its shards back.

RPCs (fields in, fields out; every reply carries ``master_id``):

``Register(role, node_id, pid, incarnation)`` -> ``{ok, ps_addresses, ps_version, config}``
    ``incarnation`` counts launches of this node (0 = first). A new process (another pid or
    incarnation) takes over the node and the old process's doing shards go back to the queue;
    an older incarnation than the one known is refused (FAILED_PRECONDITION: superseded).
``Heartbeat(role, node_id, cpu_percent, rss_mib, step, samples_per_s, [rows, global_step,
    pid, incarnation, ...any numbers])`` -> ``{ps_version, ps_addresses, action}``
    ``action``: ``"stop"`` (leave gracefully: the master asked, or the node was superseded or
    marked finished), ``"register"`` (this master does not know the node), or ``""``.
``GetShard(worker_id, [held])`` -> shard fields ``{shard_id, epoch, start, end, attempt}``, or
    ``{wait: true}`` (none todo but some doing), ``{done: true}`` (none todo or doing; ``failed``
    says how many failed), ``{stop: true}`` (this worker should leave).
``ShardDone(worker_id, shard_id, samples, loss, [attempt])`` -> ``{ok, counted}``
``ReportMetrics(role, node_id, [global_step, step, samples, samples_per_s, window_s, ...])``
    -> ``{ok, global_step}``
``GetPSSet()`` -> ``{ps_addresses, ps_version}``
``Status()`` -> the JSON of :meth:`MasterState.status`.
"""

from __future__ import annotations

import collections
import copy
import json
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dlrover_core.errors import DLRoverError, InputError
from dlrover_core.faults.health import HangPolicy, HeartbeatPolicy
from dlrover_core.runtime.shards import ShardQueue
from dlrover_core.runtime.wire import Handler, Message, RpcError, serve
from dlrover_core.types import (
    NodeObservation,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
)

MASTER_SERVICE = "dlrover.Master"
STATE_FILE = "master.json"
SHARDS_FILE = "shards.db"
STATE_VERSION = 1

ACTION_NONE = ""
ACTION_STOP = "stop"
ACTION_REGISTER = "register"

_FINISHED = frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.DELETED})
_IDENTITY_FIELDS = frozenset({"role", "node_id", "worker_id"})
_CPU_HISTORY = 12
_LOG_LEN = 10_000

NodeKey = tuple[Role, int]


def node_name(role: Role | str, node_id: int) -> str:
    return f"{Role(role).value}-{node_id}"


@dataclass
class NodeRecord:
    """What the master knows about one node. ``stats`` holds the numbers of the latest
    heartbeat or metrics report (``cpu_percent``: 100 = one core busy; ``rss_mib``)."""

    role: Role
    node_id: int
    state: NodeState = NodeState.PENDING
    state_since_s: float = 0.0
    pid: int | None = None
    incarnation: int = 0
    restarts: int = 0
    stop_requested: bool = False
    registered_at_s: float | None = None
    last_heartbeat_s: float | None = None
    last_progress_s: float | None = None
    stats: dict[str, float] = field(default_factory=dict)
    cpu_percent_history: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=_CPU_HISTORY)
    )

    @property
    def key(self) -> NodeKey:
        return (self.role, self.node_id)

    @property
    def name(self) -> str:
        return node_name(self.role, self.node_id)

    def persisted(self) -> dict[str, Any]:
        return {
            "role": self.role.value,
            "node_id": self.node_id,
            "state": self.state.value,
            "state_since_s": self.state_since_s,
            "pid": self.pid,
            "incarnation": self.incarnation,
            "restarts": self.restarts,
            "stop_requested": self.stop_requested,
            "registered_at_s": self.registered_at_s,
        }

    @classmethod
    def restored(cls, d: Mapping[str, Any]) -> NodeRecord:
        return cls(
            role=Role(d["role"]),
            node_id=int(d["node_id"]),
            state=NodeState(d["state"]),
            state_since_s=float(d.get("state_since_s", 0.0)),
            pid=d.get("pid"),
            incarnation=int(d.get("incarnation", 0)),
            restarts=int(d.get("restarts", 0)),
            stop_requested=bool(d.get("stop_requested", False)),
            registered_at_s=d.get("registered_at_s"),
        )


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON so a reader (or a crash) sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class MasterState:
    """Everything the master knows, behind one lock; see the module docstring.

    ``clock`` returns wall-clock seconds (times are stored and compared across restarts)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        total_rows: int,
        shard_size: int,
        epochs: int = 1,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.time,
        config: Mapping[str, Any] | None = None,
        synchronous: str = "FULL",
        persist_every_s: float = 2.0,
        throughput_window_s: float = 30.0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.RLock()
        self.master_id = secrets.token_hex(8)
        self.persist_every_s = persist_every_s
        self.throughput_window_s = throughput_window_s
        self.state_path = self.run_dir / STATE_FILE
        self.shards = ShardQueue.open(
            self.run_dir / SHARDS_FILE,
            total_rows,
            shard_size,
            epochs,
            max_attempts,
            clock=clock,
            synchronous=synchronous,
        )
        now = clock()
        self.started_at_s = now
        self.nodes: dict[NodeKey, NodeRecord] = {}
        self.ps_addresses: list[str] = []
        self.ps_version = 0
        self.config: dict[str, Any] = dict(config or {})
        self.plans: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.global_step = 0
        self.job_state = "running"
        self.master_starts = 1
        self.restored = False
        self._done_log: collections.deque[tuple[float, int]] = collections.deque()
        self._losses: collections.deque[float] = collections.deque(maxlen=100)
        self.metrics_log: collections.deque[dict[str, Any]] = collections.deque(maxlen=_LOG_LEN)
        self._last_persist_s = -math.inf
        if self.state_path.exists():
            self._restore(now, config)
        self._persist(force=True)

    # --- persistence --------------------------------------------------------------------------

    def _restore(self, now: float, config: Mapping[str, Any] | None) -> None:
        try:
            d = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(
                f"cannot read the master state {self.state_path}: {e}; restore it from a backup "
                "or start the job in a new run directory"
            ) from e
        self.restored = True
        self.master_starts = int(d.get("master_starts", 1)) + 1
        for nd in d.get("nodes", []):
            rec = NodeRecord.restored(nd)
            if rec.state is NodeState.RUNNING:
                rec.last_heartbeat_s = now  # a fresh grace period to hear from it again
                rec.last_progress_s = now
            self.nodes[rec.key] = rec
        self.ps_addresses = list(d.get("ps_addresses", []))
        self.ps_version = int(d.get("ps_version", 0))
        if config is None:
            self.config = dict(d.get("config", {}))
        self.plans = list(d.get("plans", []))
        self.faults = list(d.get("faults", []))
        self.global_step = int(d.get("global_step", 0))
        self.job_state = str(d.get("job_state", "running"))

    def snapshot(self) -> dict[str, Any]:
        """The persisted state, as JSON-able data (a copy)."""
        with self._lock:
            return copy.deepcopy(
                {
                    "version": STATE_VERSION,
                    "master_starts": self.master_starts,
                    "job_state": self.job_state,
                    "nodes": [r.persisted() for _, r in sorted(self.nodes.items())],
                    "ps_addresses": self.ps_addresses,
                    "ps_version": self.ps_version,
                    "config": self.config,
                    "plans": self.plans,
                    "faults": self.faults,
                    "global_step": self.global_step,
                    "saved_at_s": self._clock(),
                }
            )

    def _persist(self, force: bool = True) -> None:
        now = self._clock()
        if not force and now - self._last_persist_s < self.persist_every_s:
            return
        atomic_write_json(self.state_path, self.snapshot())
        self._last_persist_s = now

    def close(self) -> None:
        with self._lock:
            self._persist(force=True)
            self.shards.close()

    # --- nodes --------------------------------------------------------------------------------

    def _node(self, role: Role, node_id: int, now: float) -> NodeRecord:
        rec = self.nodes.get((role, node_id))
        if rec is None:
            rec = self.nodes[(role, node_id)] = NodeRecord(role, node_id, state_since_s=now)
        return rec

    def _set_state(self, rec: NodeRecord, state: NodeState, now: float) -> list[int]:
        if rec.state is not state:
            rec.state = state
            rec.state_since_s = now
        if state is NodeState.PENDING:
            rec.stop_requested = False
        if rec.role is Role.WORKER and state in _FINISHED:
            return self.shards.release_worker(rec.node_id, f"{rec.name} {state.value}")
        return []

    def register(
        self, role: Role, node_id: int, pid: int | None = None, incarnation: int = 0
    ) -> dict[str, Any]:
        """A node process says hello. See ``Register`` in the module docstring."""
        with self._lock:
            now = self._clock()
            rec = self._node(role, node_id, now)
            if incarnation < rec.incarnation:
                raise RpcError(
                    f"{rec.name} incarnation {incarnation} is superseded by incarnation "
                    f"{rec.incarnation}: this process should exit",
                    grpc.StatusCode.FAILED_PRECONDITION,
                )
            new_process = rec.registered_at_s is not None and (
                incarnation != rec.incarnation or (pid is not None and pid != rec.pid)
            )
            if new_process and role is Role.WORKER:
                self.shards.release_worker(node_id, f"{rec.name} replaced by a new process")
            if incarnation > rec.incarnation:
                rec.restarts = max(rec.restarts, incarnation)
            rec.incarnation = incarnation
            rec.pid = pid
            rec.registered_at_s = now
            rec.last_heartbeat_s = now
            rec.last_progress_s = now
            self._set_state(rec, NodeState.RUNNING, now)
            self._persist()
            return {
                "ok": True,
                "ps_addresses": list(self.ps_addresses),
                "ps_version": self.ps_version,
                "config": copy.deepcopy(self.config),
            }

    def heartbeat(
        self, role: Role, node_id: int, stats: Mapping[str, float], incarnation: int | None = None
    ) -> dict[str, Any]:
        """Store a node's latest numbers; tell it what to do. See ``Heartbeat``."""
        with self._lock:
            now = self._clock()
            rec = self.nodes.get((role, node_id))
            reply = {"ps_version": self.ps_version, "ps_addresses": list(self.ps_addresses)}
            if rec is None or rec.registered_at_s is None:
                return {**reply, "action": ACTION_REGISTER}
            if incarnation is not None and incarnation < rec.incarnation:
                return {**reply, "action": ACTION_STOP}
            rec.last_heartbeat_s = now
            self._absorb(rec, stats, now)
            stop = rec.stop_requested or rec.state in _FINISHED
            return {**reply, "action": ACTION_STOP if stop else ACTION_NONE}

    def _absorb(self, rec: NodeRecord, stats: Mapping[str, float], now: float) -> None:
        step = stats.get("step")
        if step is not None and step > rec.stats.get("step", -1):
            rec.last_progress_s = now
        rec.stats.update(stats)
        if "cpu_percent" in stats:
            rec.cpu_percent_history.append(float(stats["cpu_percent"]))
        gs = stats.get("global_step")
        if gs is not None and gs > self.global_step:
            self.global_step = int(gs)
            self._persist(force=False)

    def report_metrics(self, role: Role, node_id: int, stats: Mapping[str, float]) -> int:
        """A runtime sample (step, samples/s over a window, ...). Returns the global step."""
        with self._lock:
            now = self._clock()
            rec = self._registered(role, node_id)
            self._absorb(rec, stats, now)
            entry = {"time_s": now, "role": role.value, "node_id": node_id, **stats}
            self.metrics_log.append(entry)
            return self.global_step

    def record_node_stats(self, role: Role, node_id: int, stats: Mapping[str, float]) -> None:
        """Stats the control loop measured itself (e.g. a PS's CPU, memory and rows, which PS
        processes do not heartbeat)."""
        with self._lock:
            now = self._clock()
            rec = self._node(Role(role), node_id, now)
            self._absorb(rec, stats, now)

    def _registered(self, role: Role, node_id: int) -> NodeRecord:
        rec = self.nodes.get((role, node_id))
        if rec is None or rec.registered_at_s is None:
            raise RpcError(
                f"{node_name(role, node_id)} is not registered with this master: call Register",
                grpc.StatusCode.NOT_FOUND,
            )
        return rec

    def mark_node(
        self,
        role: Role,
        node_id: int,
        state: NodeState,
        pid: int | None = None,
        restarts: int | None = None,
    ) -> list[int]:
        """The control loop's word on a node (launched: PENDING, exited: FAILED/SUCCEEDED,
        removed: DELETED). A worker marked finished gives back its doing shards; their ids
        are returned. PENDING clears a stop request (a relaunch)."""
        with self._lock:
            now = self._clock()
            rec = self._node(Role(role), node_id, now)
            if pid is not None:
                rec.pid = pid
            if restarts is not None:
                rec.restarts = restarts
            released = self._set_state(rec, NodeState(state), now)
            self._persist()
            return released

    def request_stop(self, worker_id: int) -> None:
        """Ask a worker to leave gracefully (its next heartbeat or GetShard says so)."""
        with self._lock:
            self._node(Role.WORKER, worker_id, self._clock()).stop_requested = True
            self._persist()

    def release_worker(self, worker_id: int, reason: str) -> list[int]:
        with self._lock:
            return self.shards.release_worker(worker_id, reason)

    def dead_nodes(self, now: float, heartbeat_policy: HeartbeatPolicy) -> list[NodeKey]:
        """Running nodes silent for ``heartbeat_policy.dead_after_s`` or longer."""
        with self._lock:
            return [
                k
                for k, r in sorted(self.nodes.items())
                if r.state is NodeState.RUNNING
                and heartbeat_policy.is_dead(r.last_heartbeat_s or r.state_since_s, now)
            ]

    def hung_nodes(
        self, now: float, hang_policy: HangPolicy, allocated: Mapping[NodeKey, NodeResources]
    ) -> list[NodeKey]:
        """Running nodes with no progress (no step, no shard) and idle CPU, per the policy."""
        with self._lock:
            out = []
            for k, r in sorted(self.nodes.items()):
                res = allocated.get(k)
                if r.state is not NodeState.RUNNING or res is None or res.cpu_millicores <= 0:
                    continue
                utils = [p * 10.0 / res.cpu_millicores for p in r.cpu_percent_history]
                since = r.last_progress_s if r.last_progress_s is not None else r.state_since_s
                if hang_policy.is_hung(utils, since, now):
                    out.append(k)
            return out

    # --- PS set, plans, faults, job state -------------------------------------------------------

    def set_ps_set(self, addresses: list[str], version: int) -> None:
        with self._lock:
            if version < self.ps_version:
                raise InputError(
                    f"PS set version {version} is older than the current {self.ps_version}: "
                    "versions only grow"
                )
            self.ps_addresses = list(addresses)
            self.ps_version = version
            self._persist()

    def ps_set(self) -> tuple[list[str], int]:
        with self._lock:
            return list(self.ps_addresses), self.ps_version

    def set_config(self, config: Mapping[str, Any]) -> None:
        with self._lock:
            self.config = dict(config)
            self._persist()

    def record_plan(
        self, plan: ResourcePlan | Mapping[str, Any], time_s: float | None = None
    ) -> None:
        with self._lock:
            d = plan.to_dict() if isinstance(plan, ResourcePlan) else dict(plan)
            self.plans.append({"time_s": self._clock() if time_s is None else time_s, **d})
            self._persist()

    def record_fault(self, fault: Mapping[str, Any]) -> None:
        """A fault and what was done about it (node, exit class, action), for the report."""
        with self._lock:
            self.faults.append({"time_s": self._clock(), **fault})
            self._persist()

    def set_job_state(self, state: str) -> None:
        with self._lock:
            self.job_state = state
            self._persist()

    # --- shards -------------------------------------------------------------------------------

    def get_shard(self, worker_id: int, held: list[int] | None = None) -> dict[str, Any]:
        with self._lock:
            rec = self._registered(Role.WORKER, worker_id)
            if rec.stop_requested or rec.state in _FINISHED:
                return {"stop": True}
            shard = self.shards.take(worker_id, held)
            if shard is not None:
                return shard.to_dict()
            c = self.shards.counts()
            if c["doing"]:
                return {"wait": True}
            return {"done": True, "failed": c["failed"]}

    def shard_done(
        self,
        worker_id: int,
        shard_id: int,
        samples: int | None = None,
        loss: float | None = None,
        attempt: int | None = None,
    ) -> bool:
        """Record a finished shard; True if it counted (False: done before, do not count)."""
        with self._lock:
            rec = self._registered(Role.WORKER, worker_id)
            counted = self.shards.complete(shard_id, worker_id, attempt)
            if counted:
                now = self._clock()
                rec.last_progress_s = now
                rows = self.shards.shard(shard_id)[0].rows
                self._done_log.append((now, rows if samples is None else int(samples)))
                if loss is not None and math.isfinite(loss):
                    self._losses.append(float(loss))
            return counted

    # --- views --------------------------------------------------------------------------------

    def worker_throughput_sps(self) -> dict[int, float]:
        """Latest samples/s of each running worker (from its heartbeats)."""
        with self._lock:
            return {
                r.node_id: float(r.stats.get("samples_per_s", 0.0))
                for r in self.nodes.values()
                if r.role is Role.WORKER and r.state is NodeState.RUNNING
            }

    def window_throughput_sps(self, now: float) -> float:
        """Samples of counted shards per second over the last ``throughput_window_s``."""
        with self._lock:
            start = now - self.throughput_window_s
            while self._done_log and self._done_log[0][0] < start:
                self._done_log.popleft()
            span = min(self.throughput_window_s, max(now - self.started_at_s, 1e-9))
            return sum(n for _, n in self._done_log) / span

    def distinct_ids(self) -> int | None:
        """Embedding rows the running PS report holding (``rows`` in their heartbeats)."""
        with self._lock:
            rows = [
                r.stats["rows"]
                for r in self.nodes.values()
                if r.role is Role.PS and r.state is NodeState.RUNNING and "rows" in r.stats
            ]
            return int(sum(rows)) if rows else None

    def observation(self, now: float, allocated: Mapping[NodeKey, NodeResources]) -> Observation:
        """One :class:`NodeObservation` per allocated node (never seen: PENDING) from the
        latest heartbeats; job throughput = sum of running workers' samples/s."""
        with self._lock:
            nodes = []
            for (role, node_id), res in sorted(allocated.items()):
                rec = self.nodes.get((Role(role), node_id))
                if rec is None:
                    nodes.append(NodeObservation(Role(role), node_id, NodeState.PENDING, res))
                    continue
                s = rec.stats
                nodes.append(
                    NodeObservation(
                        role=rec.role,
                        node_id=node_id,
                        state=rec.state,
                        allocated=res,
                        cpu_used_millicores=max(0, round(s.get("cpu_percent", 0.0) * 10)),
                        memory_used_mib=max(0, round(s.get("rss_mib", 0.0))),
                        state_since_s=rec.state_since_s,
                        throughput_sps=float(s.get("samples_per_s", 0.0))
                        if rec.role is Role.WORKER
                        else 0.0,
                    )
                )
            tput = sum(
                n.throughput_sps
                for n in nodes
                if n.role is Role.WORKER and n.state is NodeState.RUNNING
            )
            return Observation(
                time_s=now,
                nodes=tuple(nodes),
                throughput_sps=tput,
                samples_done=self.shards.samples_done,
                samples_total=self.shards.samples_total,
                distinct_ids=self.distinct_ids(),
            )

    def status(self) -> dict[str, Any]:
        """The live view, JSON-able: job state, nodes, shards, global step, throughput."""
        with self._lock:
            now = self._clock()
            done_by = self.shards.done_by_worker()
            doing_by = self.shards.doing_by_worker()
            nodes = []
            for (role, node_id), r in sorted(self.nodes.items()):
                hb = r.last_heartbeat_s
                nodes.append(
                    {
                        "role": role.value,
                        "id": node_id,
                        "name": r.name,
                        "pid": r.pid,
                        "state": r.state.value,
                        "restarts": r.restarts,
                        "incarnation": r.incarnation,
                        "last_heartbeat_s": hb,
                        "heartbeat_age_s": None if hb is None else max(0.0, now - hb),
                        "stop_requested": r.stop_requested,
                        "stats": dict(r.stats),
                        **(
                            {
                                "shards_done": done_by.get(node_id, 0),
                                "shards_doing": doing_by.get(node_id, []),
                            }
                            if role is Role.WORKER
                            else {}
                        ),
                    }
                )
            losses = list(self._losses)[-20:]
            return {
                "job_state": self.job_state,
                "time_s": now,
                "master_id": self.master_id,
                "master_starts": self.master_starts,
                "uptime_s": now - self.started_at_s,
                "nodes": nodes,
                "shards": self.shards.summary(),
                "failed_shards": self.shards.failed_shards(),
                "global_step": self.global_step,
                "throughput_sps": sum(self.worker_throughput_sps().values()),
                "window_throughput_sps": self.window_throughput_sps(now),
                "loss": sum(losses) / len(losses) if losses else None,
                "ps": {"addresses": list(self.ps_addresses), "version": self.ps_version},
                "plans": len(self.plans),
                "faults": len(self.faults),
            }


# --- the gRPC service -------------------------------------------------------------------------


def _role(msg: Message) -> Role:
    try:
        return Role(msg["role"])
    except (KeyError, ValueError) as e:
        raise RpcError(
            f"role={msg.get('role')!r}: send one of {[r.value for r in Role]}",
            grpc.StatusCode.INVALID_ARGUMENT,
        ) from e


def _int(msg: Message, name: str, default: int | None = None) -> int:
    v = msg.get(name, default)
    if v is None or isinstance(v, bool):
        raise RpcError(f"field {name!r} (an integer) is missing", grpc.StatusCode.INVALID_ARGUMENT)
    try:
        return int(v)
    except (TypeError, ValueError) as e:
        raise RpcError(
            f"field {name}={v!r} must be an integer", grpc.StatusCode.INVALID_ARGUMENT
        ) from e


def _numbers(msg: Message, skip: frozenset[str] = _IDENTITY_FIELDS) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in msg.fields.items()
        if k not in skip and isinstance(v, int | float) and not isinstance(v, bool)
    }


def master_handlers(state: MasterState) -> dict[str, Handler]:
    """The ``dlrover.Master`` methods over ``state``."""

    def reply(fields: dict[str, Any]) -> dict[str, Any]:
        return {**fields, "master_id": state.master_id}

    def guarded(fn: Callable[[Message], dict[str, Any]]) -> Handler:
        def call(msg: Message) -> dict[str, Any]:
            try:
                return reply(fn(msg))
            except DLRoverError as e:
                raise RpcError(str(e), grpc.StatusCode.INVALID_ARGUMENT) from e

        return call

    def register(msg: Message) -> dict[str, Any]:
        pid = msg.get("pid")
        return state.register(
            _role(msg),
            _int(msg, "node_id"),
            None if pid is None else int(pid),
            _int(msg, "incarnation", 0),
        )

    def heartbeat(msg: Message) -> dict[str, Any]:
        inc = msg.get("incarnation")
        stats = _numbers(msg, _IDENTITY_FIELDS | {"pid", "incarnation"})
        return state.heartbeat(
            _role(msg), _int(msg, "node_id"), stats, None if inc is None else int(inc)
        )

    def get_shard(msg: Message) -> dict[str, Any]:
        held = msg.get("held")
        return state.get_shard(
            _int(msg, "worker_id"), None if held is None else [int(h) for h in held]
        )

    def shard_done(msg: Message) -> dict[str, Any]:
        samples, loss, attempt = msg.get("samples"), msg.get("loss"), msg.get("attempt")
        counted = state.shard_done(
            _int(msg, "worker_id"),
            _int(msg, "shard_id"),
            None if samples is None else int(samples),
            None if loss is None else float(loss),
            None if attempt is None else int(attempt),
        )
        return {"ok": True, "counted": counted}

    def report_metrics(msg: Message) -> dict[str, Any]:
        gs = state.report_metrics(_role(msg), _int(msg, "node_id"), _numbers(msg))
        return {"ok": True, "global_step": gs}

    def get_ps_set(msg: Message) -> dict[str, Any]:
        addresses, version = state.ps_set()
        return {"ps_addresses": addresses, "ps_version": version}

    def status(msg: Message) -> dict[str, Any]:
        return state.status()

    fns: dict[str, Callable[[Message], dict[str, Any]]] = {
        "Register": register,
        "Heartbeat": heartbeat,
        "GetShard": get_shard,
        "ShardDone": shard_done,
        "ReportMetrics": report_metrics,
        "GetPSSet": get_ps_set,
        "Status": status,
    }
    return {name: guarded(fn) for name, fn in fns.items()}


def serve_master(
    state: MasterState,
    token: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_workers: int = 16,
) -> tuple[grpc.Server, int]:
    """Start the ``dlrover.Master`` service over ``state``; returns (server, port)."""
    return serve(MASTER_SERVICE, master_handlers(state), token, host, port, max_workers)
