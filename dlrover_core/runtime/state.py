"""The job master's durable state (:class:`MasterState`): nodes, PS-set generations, relaunch
budgets, plans, faults, the shard queue. Bookkeeping only: no process control, no sockets.
One node's record and its persisted form: :mod:`dlrover_core.runtime.node_record`.

The controller (:mod:`dlrover_core.runtime.controller`) persists every transition here *before*
acting on it (write ahead), so a master restarted at any instant finds what it was doing:

- a node about to be launched is recorded with its incarnation (state ``pending``, no ``ref``)
  before the backend starts it, and its backend ``ref`` right after;
- a PS-set generation (``generations``: id, size, restore sources, state ``freezing`` ->
  ``starting`` -> ``active`` -> ``retired``, or ``aborted``) is recorded before its first PS
  starts; a restarted master rolls an unfinished one back (the old set is unfrozen and keeps
  serving) or, once active, keeps it;
- relaunch budgets (``relaunches`` per exit class) are part of each node's record, so a master
  restart does not reset them.

Files in the run directory:

- ``shards.db``: the shard queue (:mod:`dlrover_core.runtime.shards`), one transaction a change;
- ``master.json``: the rest, written atomically on every change (the global step alone at most
  every ``persist_every_s``).

Two clocks: ``clock`` (wall seconds) for what is stored and shown, ``monotonic`` for liveness
(heartbeat ages, pending timeouts), so a wall-clock step neither kills nor spares a node. On
restore every running node gets a fresh grace period (its last heartbeat counts as "now").
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc

from dlrover_core.errors import InputError
from dlrover_core.faults.health import HangPolicy, HeartbeatPolicy
from dlrover_core.runtime.files import atomic_write
from dlrover_core.runtime.node_record import EVENTS, NodeKey, NodeRecord, node_name
from dlrover_core.runtime.shards import ShardQueue
from dlrover_core.runtime.wire import RpcError
from dlrover_core.types import (
    NodeObservation,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
)

STATE_FILE = "master.json"
SHARDS_FILE = "shards.db"
STATE_VERSION = 2

ACTION_NONE = ""
ACTION_STOP = "stop"
ACTION_REGISTER = "register"

SUPERSEDED = "superseded"
SUPERSEDED_CODE = grpc.StatusCode.ABORTED
"""The status a superseded node's call is refused with: a fact its client reads (never the
message's words)."""

_FINISHED = frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.DELETED})
_LOG_LEN = 10_000

GEN_FREEZING = "freezing"
GEN_STARTING = "starting"
GEN_ACTIVE = "active"
GEN_RETIRED = "retired"
GEN_ABORTED = "aborted"


class MasterState:
    """Everything the master knows, behind one lock; see the module docstring."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        total_rows: int,
        shard_size: int,
        epochs: int = 1,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        config: Mapping[str, Any] | None = None,
        synchronous: str = "FULL",
        persist_every_s: float = 2.0,
        throughput_window_s: float = 30.0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._mono = monotonic
        self._lock = threading.RLock()
        self.master_id = secrets.token_hex(8)
        self.persist_every_s = persist_every_s
        self.throughput_window_s = throughput_window_s
        self.state_path = self.run_dir / STATE_FILE
        now = clock()
        self.started_at_s = now
        self.started_mono = monotonic()
        self.nodes: dict[NodeKey, NodeRecord] = {}
        self.ps_addresses: list[str] = []
        self.ps_version = 0
        self.generations: list[dict[str, Any]] = []
        self.config: dict[str, Any] = dict(config or {})
        self.plans: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        # planner errors the loop survived (what failed, what the job did instead)
        self.planner_errors: list[dict[str, Any]] = []
        self.global_step = 0
        self.job_state = "running"
        self.reason: str | None = None
        self.master_starts = 1
        self.restored = False
        self._done_log: collections.deque[tuple[float, int]] = collections.deque()
        self._losses: collections.deque[float] = collections.deque(maxlen=100)
        self.metrics_log: collections.deque[dict[str, Any]] = collections.deque(maxlen=_LOG_LEN)
        self._last_persist_s = -math.inf
        self._node_text: dict[NodeKey, tuple[dict[str, Any], str]] = {}
        self._batch_depth = 0
        self._batch_dirty = False
        # with every shard done, workers are told "done" only once the master says the job
        # can end (a PS lost at the end may still give shards back); in memory, not persisted
        self.workers_may_leave = True
        self.dispatch_paused = False  # a clean stop drains: no new shard is handed out
        if self.state_path.exists():
            self._restore(config)
        self.shards = ShardQueue.open(
            self.run_dir / SHARDS_FILE,
            total_rows,
            shard_size,
            epochs,
            max_attempts,
            clock=clock,
            synchronous=synchronous,
        )
        self._persist(force=True)

    # --- persistence --------------------------------------------------------------------------

    @staticmethod
    def read(path: str | os.PathLike[str]) -> dict[str, Any]:
        """The persisted state at ``path`` (read only); one clear error if it is unusable."""
        p = Path(path)
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise InputError(
                f"the master state {p} is unreadable ({type(e).__name__}: {e}); restore it "
                "from a backup, or start the job in a new run directory"
            ) from None
        if not isinstance(d, dict) or not isinstance(d.get("nodes", []), list):
            raise InputError(
                f"the master state {p} is not a master state (no 'nodes' list); restore it "
                "from a backup, or start the job in a new run directory"
            )
        return d

    def _restore(self, config: Mapping[str, Any] | None) -> None:
        d = self.read(self.state_path)
        mono = self._mono()
        try:
            self.master_starts = int(d.get("master_starts", 1)) + 1
            for nd in d.get("nodes", []):
                rec = NodeRecord.restored(nd)
                rec.last_heartbeat_s = mono  # a fresh grace period to hear from it again
                rec.last_progress_s = mono
                rec.launched_mono = mono
                self.nodes[rec.key] = rec
            self.ps_addresses = [str(a) for a in d.get("ps_addresses", [])]
            self.ps_version = int(d.get("ps_version", 0))
            self.generations = [dict(g) for g in d.get("generations", [])]
            if config is None:
                self.config = dict(d.get("config", {}))
            self.plans = list(d.get("plans", []))
            self.faults = list(d.get("faults", []))
            self.planner_errors = list(d.get("planner_errors", []))
            self.global_step = int(d.get("global_step", 0))
            self.job_state = str(d.get("job_state", "running"))
            self.reason = d.get("reason")
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"the master state {self.state_path} has an invalid entry ({type(e).__name__}: "
                f"{e}); restore it from a backup, or start the job in a new run directory"
            ) from None
        self.restored = True

    def snapshot(self) -> dict[str, Any]:
        """The persisted state, as JSON-able data (a copy)."""
        with self._lock:
            return copy.deepcopy(
                {
                    "version": STATE_VERSION,
                    "master_starts": self.master_starts,
                    "job_state": self.job_state,
                    "reason": self.reason,
                    "nodes": [r.persisted() for _, r in sorted(self.nodes.items())],
                    "ps_addresses": self.ps_addresses,
                    "ps_version": self.ps_version,
                    "generations": self.generations,
                    "config": self.config,
                    "plans": self.plans,
                    "faults": self.faults,
                    "planner_errors": self.planner_errors,
                    "global_step": self.global_step,
                    "saved_at_s": self._clock(),
                }
            )

    def _persist(self, force: bool = True) -> None:
        now = self._clock()
        if not force and now - self._last_persist_s < self.persist_every_s:
            return
        if self._batch_depth:
            self._batch_dirty = True  # written once, at the end of the batch
            return
        atomic_write(self.state_path, self._state_text(now))
        self._last_persist_s = now

    def _state_text(self, now: float) -> str:
        """:meth:`snapshot`'s content as JSON, one node a line, made without a deep copy (it
        is written at once, under the lock) and with each node's text kept until the node
        changes: a write costs the changed nodes, not every node, at a thousand of them."""
        head = json.dumps(
            {
                "version": STATE_VERSION,
                "master_starts": self.master_starts,
                "job_state": self.job_state,
                "reason": self.reason,
                "ps_addresses": self.ps_addresses,
                "ps_version": self.ps_version,
                "generations": self.generations,
                "config": self.config,
                "plans": self.plans,
                "faults": self.faults,
                "planner_errors": self.planner_errors,
                "global_step": self.global_step,
                "saved_at_s": now,
            },
            sort_keys=True,
            allow_nan=False,
            separators=(",", ":"),
        )
        cache = self._node_text
        lines = []
        for key, rec in sorted(self.nodes.items()):
            d = rec.persisted()
            hit = cache.get(key)
            if hit is None or hit[0] != d:
                hit = cache[key] = (d, json.dumps(d, sort_keys=True, allow_nan=False))
            lines.append(hit[1])
        return '{"nodes":[\n' + ",\n".join(lines) + "\n],\n" + head[1:] + "\n"

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Changes made in the block are written once, at its end, before anything after it
        runs (write ahead still holds: e.g. a batch of launches is recorded before any of them
        is started). Holds the lock for the block: bookkeeping only inside it, no process
        control and no waiting."""
        with self._lock:
            self._batch_depth += 1
            try:
                yield
            finally:
                self._batch_depth -= 1
                if self._batch_depth == 0 and self._batch_dirty:
                    self._batch_dirty = False
                    self._persist(force=True)

    def persist(self) -> None:
        with self._lock:
            self._persist(force=True)

    def close(self) -> None:
        with self._lock:
            try:
                self._persist(force=True)
            finally:
                self.shards.close()

    # --- nodes --------------------------------------------------------------------------------

    def _node(self, role: Role, node_id: int, now: float) -> NodeRecord:
        rec = self.nodes.get((role, node_id))
        if rec is None:
            rec = self.nodes[(role, node_id)] = NodeRecord(role, node_id, state_since_s=now)
        return rec

    def node(self, role: Role, node_id: int) -> NodeRecord | None:
        with self._lock:
            return self.nodes.get((role, node_id))

    def _set_state(self, rec: NodeRecord, state: NodeState, now: float) -> list[int]:
        if rec.state is not state:
            rec.state = state
            rec.state_since_s = now
        if state is NodeState.PENDING:
            rec.stop_requested = False
        if rec.role is Role.WORKER and state in _FINISHED:
            return self.shards.release_worker(rec.node_id, f"{rec.name} {state.value}")
        return []

    def record_launch(
        self,
        role: Role,
        node_id: int,
        incarnation: int,
        resources: NodeResources,
        *,
        ref: str = "",
        generation: int = 0,
        relaunches: Mapping[str, int] | None = None,
    ) -> None:
        """Write ahead: incarnation ``incarnation`` of the node is being launched (``ref`` ""),
        or was (``ref`` the backend's handle). A worker's earlier incarnation gives its doing
        shards back."""
        with self._lock:
            now = self._clock()
            rec = self._node(Role(role), node_id, now)
            if incarnation != rec.incarnation and rec.role is Role.WORKER:
                self.shards.release_worker(node_id, f"{rec.name} relaunched")
            if incarnation != rec.incarnation or not ref:
                rec.events, rec.said = {}, None
                rec.registered_at_s = None
                rec.address = None
                rec.pid = None
                rec.restored_seq = None
                rec.restore_handled = False
            rec.incarnation = incarnation
            rec.restarts = max(rec.restarts, incarnation)
            rec.ref = ref
            rec.generation = generation
            rec.resources = resources.to_dict()
            if relaunches is not None:
                rec.relaunches = dict(relaunches)
            rec.launched_mono = self._mono()
            rec.stats = {}
            rec.cpu_percent_history.clear()
            self._set_state(rec, NodeState.PENDING, now)
            self._persist()

    def record_event(
        self, role: Role, node_id: int, incarnation: int, kind: str, said: str | None = None
    ) -> bool:
        """A node's report of itself (``node_record.EVENTS``); one of an older incarnation
        is ignored (False)."""
        if kind not in EVENTS:
            raise RpcError(
                f"event={kind!r}: send one of {sorted(EVENTS)}", grpc.StatusCode.INVALID_ARGUMENT
            )
        with self._lock:
            rec = self.nodes.get((Role(role), node_id))
            if rec is None or incarnation != rec.incarnation:
                return False
            rec.events[kind] = self._clock()
            if said:
                rec.said = " ".join(str(said).split())[:500]
            self._persist()
            return True

    def record_resize(self, role: Role, node_id: int, resources: NodeResources) -> None:
        """The node's resources changed in place (same process, same incarnation): its state,
        registration and liveness stay as they are."""
        with self._lock:
            rec = self._node(Role(role), node_id, self._clock())
            rec.resources = resources.to_dict()
            self._persist()

    def register(
        self,
        role: Role,
        node_id: int,
        pid: int | None = None,
        incarnation: int = 0,
        *,
        address: str | None = None,
        generation: int | None = None,
        restored_seq: int | None = None,
    ) -> dict[str, Any]:
        """A node process says hello (a PS with the ``address`` it serves on, its set
        ``generation`` and the ``restored_seq`` tag of the state it restored)."""
        with self._lock:
            now = self._clock()
            rec = self._node(role, node_id, now)
            if incarnation < rec.incarnation or rec.state is NodeState.DELETED:
                raise RpcError(
                    f"{rec.name} incarnation {incarnation} is {SUPERSEDED} by incarnation "
                    f"{rec.incarnation}: this process should exit",
                    SUPERSEDED_CODE,
                )
            if role is Role.PS and generation is not None and generation != rec.generation:
                raise RpcError(
                    f"{rec.name} of PS generation {generation} is {SUPERSEDED} by generation "
                    f"{rec.generation}: this process should exit",
                    SUPERSEDED_CODE,
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
            if address is not None:
                rec.address = address
            if restored_seq is not None:
                rec.restored_seq = restored_seq
            mono = self._mono()
            rec.registered_at_s = now
            rec.last_heartbeat_s = mono
            rec.last_progress_s = mono
            self._set_state(rec, NodeState.RUNNING, now)
            self._persist()
            return {
                "ok": True,
                "ps_addresses": list(self.ps_addresses),
                "ps_version": self.ps_version,
                "config": copy.deepcopy(self.config),
                "done_seq": self.shards.done_seq,
            }

    def _superseded(self, rec: NodeRecord, incarnation: int | None) -> bool:
        return incarnation is not None and incarnation != rec.incarnation

    def heartbeat(
        self, role: Role, node_id: int, stats: Mapping[str, float], incarnation: int | None = None
    ) -> dict[str, Any]:
        """Store a node's latest numbers; tell it what to do. See ``Heartbeat``."""
        with self._lock:
            rec = self.nodes.get((role, node_id))
            reply = {
                "ps_version": self.ps_version,
                "ps_addresses": list(self.ps_addresses),
                "done_seq": self.shards.done_seq,
            }
            if rec is None or rec.registered_at_s is None:
                if rec is not None and incarnation is not None and incarnation < rec.incarnation:
                    return {**reply, "action": ACTION_STOP}
                return {**reply, "action": ACTION_REGISTER}
            if self._superseded(rec, incarnation):
                return {**reply, "action": ACTION_STOP}
            rec.last_heartbeat_s = self._mono()
            self._absorb(rec, stats, rec.last_heartbeat_s)
            stop = rec.stop_requested or rec.state in _FINISHED
            return {**reply, "action": ACTION_STOP if stop else ACTION_NONE}

    def _absorb(self, rec: NodeRecord, stats: Mapping[str, float], mono: float) -> None:
        step = stats.get("step")
        if step is not None and step > rec.stats.get("step", -1):
            rec.last_progress_s = mono
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
            self._absorb(rec, stats, self._mono())
            entry = {"time_s": now, "role": role.value, "node_id": node_id, **stats}
            self.metrics_log.append(entry)
            return self.global_step

    def record_node_stats(self, role: Role, node_id: int, stats: Mapping[str, float]) -> None:
        """Stats the control loop measured itself (e.g. a PS's CPU and memory, from the
        backend). Not a sign of life: liveness comes from the node's own heartbeats."""
        with self._lock:
            rec = self._node(Role(role), node_id, self._clock())
            hb, progress = rec.last_heartbeat_s, rec.last_progress_s
            self._absorb(rec, stats, self._mono())
            rec.last_heartbeat_s, rec.last_progress_s = hb, progress

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
        *,
        relaunches: Mapping[str, int] | None = None,
    ) -> list[int]:
        """The control loop's word on a node (exited: FAILED/SUCCEEDED, removed: DELETED).
        A worker marked finished gives back its doing shards; their ids are returned."""
        with self._lock:
            now = self._clock()
            rec = self._node(Role(role), node_id, now)
            if relaunches is not None:
                rec.relaunches = dict(relaunches)
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

    def dead_nodes(self, heartbeat_policy: HeartbeatPolicy) -> list[NodeKey]:
        """Running nodes (every role) silent for ``heartbeat_policy.dead_after_s`` or longer,
        on the monotonic clock."""
        with self._lock:
            now = self._mono()
            return [
                k
                for k, r in sorted(self.nodes.items())
                if r.state is NodeState.RUNNING
                and heartbeat_policy.is_dead(
                    r.last_heartbeat_s if r.last_heartbeat_s is not None else now, now
                )
            ]

    def unregistered_nodes(self, timeout_s: float) -> list[NodeKey]:
        """Nodes launched ``timeout_s`` or more ago (monotonic) that never registered."""
        with self._lock:
            now = self._mono()
            return [
                k
                for k, r in sorted(self.nodes.items())
                if r.state is NodeState.PENDING
                and r.ref
                and r.launched_mono is not None
                and now - r.launched_mono >= timeout_s
            ]

    def hung_nodes(
        self, hang_policy: HangPolicy, allocated: Mapping[NodeKey, NodeResources]
    ) -> list[NodeKey]:
        """Running workers with no progress (no step, no shard) and idle CPU, per the policy
        (monotonic clock)."""
        with self._lock:
            now = self._mono()
            out = []
            for k, r in sorted(self.nodes.items()):
                res = allocated.get(k)
                if r.state is not NodeState.RUNNING or res is None or res.cpu_millicores <= 0:
                    continue
                if r.role is not Role.WORKER:
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

    def record_planner_error(self, error: Mapping[str, Any]) -> None:
        """A planner exception the control loop survived, and what the job did instead."""
        with self._lock:
            self.planner_errors.append({"time_s": self._clock(), **error})
            self._persist()

    def set_job_state(self, state: str, reason: str | None = None) -> None:
        with self._lock:
            self.job_state = state
            if reason is not None:
                self.reason = reason
            self._persist()

    # --- PS-set generations (write ahead; see the module docstring) ------------------------------

    def begin_generation(
        self, count: int, restore_from: list[str], restore_seq: int, state: str,
        *, frozen: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """``frozen``: every source was frozen and checkpointed at ``restore_seq`` (a planned
        change with the whole set serving), so a shard done after it is not lost."""
        with self._lock:
            gid = max((int(g["id"]) for g in self.generations), default=0) + 1
            gen = {
                "id": gid,
                "count": int(count),
                "restore_from": list(restore_from),
                "restore_seq": int(restore_seq),
                "frozen": bool(frozen),
                "state": state,
                "since_s": self._clock(),
            }
            self.generations.append(gen)
            self._persist()
            return dict(gen)

    def update_generation(self, gid: int, **fields: Any) -> None:
        with self._lock:
            for g in self.generations:
                if int(g["id"]) == gid:
                    g.update(fields, since_s=self._clock())
            self._persist()

    def generation(self, gid: int) -> dict[str, Any] | None:
        with self._lock:
            for g in self.generations:
                if int(g["id"]) == gid:
                    return dict(g)
            return None

    def generations_in(self, *states: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(g) for g in self.generations if g["state"] in states]

    # --- shards -------------------------------------------------------------------------------

    def _check_current(self, rec: NodeRecord, incarnation: int | None) -> None:
        if self._superseded(rec, incarnation):
            raise RpcError(
                f"{rec.name} incarnation {incarnation} is {SUPERSEDED} by incarnation "
                f"{rec.incarnation}: this process should exit",
                SUPERSEDED_CODE,
            )

    def get_shard(
        self, worker_id: int, held: list[int] | None = None, incarnation: int | None = None
    ) -> dict[str, Any]:
        with self._lock:
            rec = self._registered(Role.WORKER, worker_id)
            self._check_current(rec, incarnation)
            if rec.stop_requested or rec.state in _FINISHED:
                return {"stop": True}
            if self.dispatch_paused:
                return {"wait": True}
            shard = self.shards.take(worker_id, held)
            if shard is not None:
                return shard.to_dict()
            c = self.shards.counts()
            if c["doing"] or not self.workers_may_leave:
                return {"wait": True}
            return {"done": True, "failed": c["failed"]}

    def shard_done(
        self,
        worker_id: int,
        shard_id: int,
        samples: int | None = None,
        loss: float | None = None,
        attempt: int | None = None,
        incarnation: int | None = None,
    ) -> bool:
        """Record a finished shard; True if it counted (False: done before, do not count).
        A superseded incarnation is refused (its successor owns the node's shards)."""
        with self._lock:
            rec = self._registered(Role.WORKER, worker_id)
            self._check_current(rec, incarnation)
            counted = self.shards.complete(shard_id, worker_id, attempt)
            if counted:
                now = self._clock()
                rec.last_progress_s = self._mono()
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
            span = min(self.throughput_window_s, max(now - self.started_at_s, 1.0))
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

    def observation(
        self,
        now: float,
        allocated: Mapping[NodeKey, NodeResources],
        unplaced: Mapping[NodeKey, float] | None = None,
    ) -> Observation:
        """One :class:`NodeObservation` per allocated node (never seen: PENDING) from the
        latest heartbeats; job throughput = sum of running workers' samples/s.

        ``unplaced``: the nodes the cluster cannot place, with since when (the backend's
        ``pending_since``). A node not yet registered is PENDING; its ``state_since_s`` is
        that time when it is unplaced, else ``now``: a node that was placed and is still
        starting is not "pending" to the planner's pending rule (the master's
        never-registered check handles it)."""
        unplaced = unplaced or {}
        with self._lock:
            nodes = []
            for (role, node_id), res in sorted(allocated.items()):
                key = (Role(role), node_id)
                rec = self.nodes.get(key)
                if rec is None or rec.state is NodeState.PENDING:
                    since = unplaced.get(key, now)
                    nodes.append(
                        NodeObservation(
                            key[0], node_id, NodeState.PENDING, res, state_since_s=since
                        )
                    )
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
            mono = self._mono()
            done_by = self.shards.done_by_worker()
            doing_by = self.shards.doing_by_worker()
            nodes = []
            for (role, node_id), r in sorted(self.nodes.items()):
                age = None if r.last_heartbeat_s is None else max(0.0, mono - r.last_heartbeat_s)
                nodes.append(
                    {
                        "role": role.value,
                        "id": node_id,
                        "name": r.name,
                        "ref": r.ref,
                        "pid": r.pid,
                        "state": r.state.value,
                        "restarts": r.restarts,
                        "incarnation": r.incarnation,
                        "heartbeat_age_s": age,
                        **(
                            {"address": r.address, "generation": r.generation}
                            if role is Role.PS
                            else {}
                        ),
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
                "reason": self.reason,
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
                "ps": {
                    "addresses": list(self.ps_addresses),
                    "version": self.ps_version,
                    "generations": copy.deepcopy(self.generations),
                },
                "plans": len(self.plans),
                "faults": len(self.faults),
            }
