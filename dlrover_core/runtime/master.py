"""The job master: runs one training job to the end through a backend.

It serves the ``dlrover.Master`` gRPC service (shards, heartbeats, metrics: see
:mod:`dlrover_core.runtime.service`), launches the PS set and the workers of the current
plan, and runs a control loop that

1. collects exits and dead heartbeats and applies the fault policies (relaunch, bump memory,
   or fail the job);
2. builds observations and speed samples and asks the planner (stages 2 and 3) for a new plan
   at the spec's pace;
3. executes plan changes: adds or removes workers (a removed worker is asked to stop and its
   unfinished shards go back to the queue), and replaces the PS set (scale or migrate) by
   checkpointing the old set, starting the new one restored from those checkpoints
   (re-sharded), switching the workers over and only then stopping the old set.

The master keeps everything it needs in the run directory, so a master killed with SIGKILL and
started again on the same run directory adopts the running nodes and carries on without losing
or repeating a shard.

The master never knows whether a node is a process or a pod: all node control goes through
:class:`dlrover_core.runtime.backends.base.Backend`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrover_core.errors import DLRoverError
from dlrover_core.faults import DEFAULT_FAULT_POLICY, ExitClass, FaultPolicy, classify_exit
from dlrover_core.faults.health import HeartbeatPolicy
from dlrover_core.planner import Planner
from dlrover_core.runtime import wire
from dlrover_core.runtime.backends.base import LOST_REASON, Backend, NodeExit, NodeHandle, NodeSpec
from dlrover_core.runtime.report import TIMELINE_FILE
from dlrover_core.runtime.service import MasterState, atomic_write_json, serve_master
from dlrover_core.spec import JobSpec, spec_to_dict
from dlrover_core.types import (
    HistoryRecord,
    NodeOverride,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
    Sample,
    Stage,
)

log = logging.getLogger("dlrover_rm.master")

SPEC_FILE = "spec.json"
ADDR_FILE = "master.addr"

NodeKey = tuple[Role, int]


@dataclass
class _Node:
    role: Role
    node_id: int
    resources: NodeResources
    incarnation: int = 0
    handle: NodeHandle | None = None
    relaunches: dict[str, int] = field(default_factory=dict)
    ps_version: int = 0  # PS: the set it belongs to
    stopping_since: float | None = None


def _python() -> str:
    return sys.executable


class JobMaster:
    """One job, from its first plan to its report."""

    def __init__(
        self,
        spec: JobSpec,
        run_dir: str | os.PathLike[str],
        backend: Backend,
        *,
        plan: ResourcePlan | None = None,
        history: Sequence[HistoryRecord] = (),
        planner: Planner | None = None,
        faults: FaultPolicy = DEFAULT_FAULT_POLICY,
        clock: Callable[[], float] = time.time,
        tick_s: float = 0.5,
        on_tick: Callable[[JobMaster], None] | None = None,
        host: str = "127.0.0.1",
        replan: bool = True,
    ) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.planner = planner or Planner(spec)
        self.faults = faults
        self.clock = clock
        self.tick_s = tick_s
        self.on_tick = on_tick
        self.host = host
        self._initial_plan = plan
        self._history = list(history)
        # speed samples of similar past runs: they help fit the model from the start
        self._prior = self.planner.history_samples(self._history, clock())
        self.nodes: dict[NodeKey, _Node] = {}
        self.plan: ResourcePlan | None = None
        self.past_plans: list[ResourcePlan] = []
        self.observations: list[Observation] = []
        self.samples: list[Sample] = []
        self._config_since = 0.0
        self._last_sample_s = 0.0
        self._last_replan_s = 0.0
        self._ps_switch: dict[str, Any] | None = None
        self._ps_set_id = 1
        self._ps_client: Any = None
        self._ps_client_version = -1
        self.state: MasterState | None = None
        self.token = ""
        self.address = ""
        self._server: Any = None
        self.started_s = clock()
        self.failure: str | None = None
        self.launches: list[dict[str, Any]] = []
        self.stop_reason: str | None = None  # set (e.g. by on_tick) to end the job early
        self.replan_enabled = replan
        self.heartbeat = HeartbeatPolicy(
            interval_s=spec.pacing.heartbeat_interval_s, dead_after_s=spec.pacing.dead_after_s
        )

    # --- set-up ----------------------------------------------------------------------------
    def _prepare(self) -> None:
        from dlrover_core.training.data import from_spec

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.token = wire.create_token(self.run_dir)
        spec_path = self.run_dir / SPEC_FILE
        atomic_write_json(spec_path, spec_to_dict(self.spec))
        source = from_spec(self.spec)
        self.state = MasterState(
            self.run_dir,
            total_rows=source.num_rows,
            shard_size=self.spec.shard_size,
            epochs=self.spec.training.epochs or 1,
            clock=self.clock,
            synchronous="NORMAL",
        )
        port = 0
        addr = self.run_dir / ADDR_FILE
        if self.state.restored and addr.exists():
            port = int(json.loads(addr.read_text())["address"].rsplit(":", 1)[1])
        self._server, bound = serve_master(self.state, self.token, host=self.host, port=port)
        self.address = f"{self.host}:{bound}"
        atomic_write_json(addr, {"address": self.address, "pid": os.getpid()})

    # --- node commands -----------------------------------------------------------------------
    def _ps_dir(self, version: int) -> Path:
        return self.run_dir / "ps" / f"set-{version}"

    def _node_spec(self, n: _Node, num_ps: int = 0, restore_from: Sequence[str] = ()) -> NodeSpec:
        cores = max(1, round(n.resources.cpu_millicores / 1000))
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if n.role is Role.PS:
            d = self._ps_dir(n.ps_version)
            argv = [
                _python(),
                "-m",
                "dlrover_core.runtime.strategies.ps.server",
                "--run-dir",
                str(self.run_dir),
                "--index",
                str(n.node_id),
                "--num-ps",
                str(num_ps),
                "--ckpt-dir",
                str(d / f"ps-{n.node_id}"),
                "--addr-file",
                str(d / f"ps-{n.node_id}.addr"),
                "--lr",
                str(self.spec.training.optimizer.lr),
                "--checkpoint-every-s",
                str(max(2.0, 4 * self.spec.pacing.heartbeat_interval_s)),
            ]
            if restore_from:
                argv += ["--restore-from", ",".join(restore_from)]
        else:
            argv = [
                _python(),
                "-m",
                "dlrover_core.runtime.strategies.ps.worker",
                "--run-dir",
                str(self.run_dir),
                "--node-id",
                str(n.node_id),
                "--master",
                self.address,
                "--incarnation",
                str(n.incarnation),
                "--threads",
                str(cores),
            ]
        return NodeSpec(
            role=n.role,
            node_id=n.node_id,
            incarnation=n.incarnation,
            resources=n.resources,
            argv=argv,
            env={"PYTHONUNBUFFERED": "1"},
            log_path=str(logs / f"{n.role.value}-{n.node_id}.log"),
        )

    def _launch(self, n: _Node, num_ps: int = 0, restore_from: Sequence[str] = ()) -> None:
        assert self.state is not None
        n.handle = self.backend.launch(self._node_spec(n, num_ps, restore_from))
        n.stopping_since = None
        self.launches.append(
            {
                "time_s": self.clock(),
                "node": f"{n.role.value}-{n.node_id}",
                "incarnation": n.incarnation,
                **n.resources.to_dict(),
            }
        )
        self.state.mark_node(
            n.role,
            n.node_id,
            NodeState.PENDING,
            pid=_pid(n.handle),
            restarts=sum(n.relaunches.values()),
        )
        log.info("launched %s-%d (%s) pid %s", n.role.value, n.node_id, n.resources, n.handle.ref)

    def _wait_ps(self, version: int, count: int, timeout_s: float = 120.0) -> list[str]:
        """Wait until every PS of set ``version`` wrote its address file (from its own pid)."""
        from dlrover_core.runtime.strategies.ps.server import read_addr

        deadline = time.monotonic() + timeout_s
        d = self._ps_dir(version)
        while True:
            addrs = []
            for i in range(count):
                n = self.nodes.get((Role.PS, i))
                info = read_addr(d / f"ps-{i}.addr")
                if (
                    info is None
                    or n is None
                    or n.handle is None
                    or str(info["pid"]) != n.handle.ref
                ):
                    break
                addrs.append(str(info["address"]))
            if len(addrs) == count:
                return addrs
            for e in self.backend.poll():
                self._on_exit(e)
            if time.monotonic() > deadline:
                raise DLRoverError(
                    f"the PS set {version} did not come up within {timeout_s:.0f} s; see "
                    f"{self.run_dir / 'logs'} for the PS logs"
                )
            time.sleep(0.1)

    def _start_ps_set(
        self,
        plan: ResourcePlan,
        set_id: int,
        restore_from: Sequence[str],
        previous: Sequence[_Node] = (),
    ) -> None:
        """Start PS set ``set_id`` (its own checkpoint directories) and point workers at it.
        ``previous``: the set it replaces (its nodes' incarnations continue)."""
        assert self.state is not None
        self._ps_set_id = set_id
        self.state.set_config({**self.state.config, "ps_set_id": set_id})
        before = {n.node_id: n for n in previous}
        for i in range(plan.ps.count):
            old = self.nodes.get((Role.PS, i)) or before.get(i)
            n = _Node(Role.PS, i, plan.node_resources(Role.PS, i), ps_version=set_id)
            if old is not None:
                n.incarnation = old.incarnation + 1
                n.relaunches = dict(old.relaunches)
            self.nodes[(Role.PS, i)] = n
            self._launch(n, plan.ps.count, restore_from)
        addrs = self._wait_ps(set_id, plan.ps.count)
        for i in range(plan.ps.count):
            self.state.mark_node(Role.PS, i, NodeState.RUNNING)
        self.state.set_ps_set(addrs, self.state.ps_set()[1] + 1)

    def _start_worker(self, node_id: int, resources: NodeResources) -> None:
        old = self.nodes.get((Role.WORKER, node_id))
        n = _Node(Role.WORKER, node_id, resources)
        if old is not None:
            n.incarnation = old.incarnation + 1
            n.relaunches = dict(old.relaunches)
        self.nodes[(Role.WORKER, node_id)] = n
        self._launch(n)

    # --- plans -------------------------------------------------------------------------------
    def _adopt_plan(self, plan: ResourcePlan) -> None:
        assert self.state is not None
        self.plan = plan
        self.past_plans.append(plan)
        self.state.record_plan(plan)
        self._config_since = self.clock()
        log.info("plan (%s): %s", plan.stage.value, "; ".join(plan.reasons))

    def _apply(self, new: ResourcePlan) -> None:
        """Execute the difference between the current plan and ``new``."""
        assert self.plan is not None and self.state is not None
        old = self.plan
        ps_changed = old.ps != new.ps or {o for o in old.overrides if o.role is Role.PS} != {
            o for o in new.overrides if o.role is Role.PS
        }
        self._adopt_plan(new)
        if ps_changed:
            self._replace_ps_set(old, new)
        # workers: resize = relaunch one by one; count: add or ask the extra ones to stop
        for i in range(new.workers.count):
            want = new.node_resources(Role.WORKER, i)
            n = self.nodes.get((Role.WORKER, i))
            relaunch = any(
                o.role is Role.WORKER
                and o.node_id == i
                and o.action == "relaunch"
                and o not in old.overrides
                for o in new.overrides
            )
            if n is None or n.handle is None:
                self._start_worker(i, want)
            elif n.resources != want or relaunch:
                self.backend.stop(n.handle, grace_s=2.0, wait=False)
                self.state.mark_node(Role.WORKER, i, NodeState.DELETED)
                self._start_worker(i, want)
        for i in range(new.workers.count, old.workers.count):
            n = self.nodes.get((Role.WORKER, i))
            if n is not None and n.handle is not None and n.stopping_since is None:
                self.state.request_stop(i)
                n.stopping_since = self.clock()

    def _replace_ps_set(self, old: ResourcePlan, new: ResourcePlan) -> None:
        """Scale or migrate the PS set: checkpoint the old set, start the new one re-sharded
        from those checkpoints, switch workers over, then stop the old set."""
        assert self.state is not None
        from dlrover_core.runtime.strategies.ps.client import PSClient

        addrs, _ = self.state.ps_set()
        old_nodes = [
            self.nodes[(Role.PS, i)] for i in range(old.ps.count) if (Role.PS, i) in self.nodes
        ]
        try:
            with PSClient(addrs, self.token, self._tables()) as c:
                c.checkpoint()
        except DLRoverError as e:
            log.warning("checkpoint before the PS change failed (%s); using the periodic ones", e)
        restore = [str(self._ps_dir(n.ps_version) / f"ps-{n.node_id}") for n in old_nodes]
        # the old processes keep serving until the new set is up
        for n in old_nodes:
            self.nodes.pop((Role.PS, n.node_id), None)
        self._start_ps_set(new, self._ps_set_id + 1, restore, old_nodes)
        self._ps_switch = {"old": old_nodes, "since": self.clock()}

    def _finish_ps_switch(self) -> None:
        """Stop the old PS set once every running worker heartbeated on the new one (or after
        a grace of a few heartbeats)."""
        if self._ps_switch is None:
            return
        grace = 4 * self.spec.pacing.heartbeat_interval_s + 2.0
        if self.clock() - self._ps_switch["since"] < grace:
            return
        for n in self._ps_switch["old"]:
            if n.handle is not None:
                self.backend.stop(n.handle, grace_s=5.0, wait=False)
        self._ps_switch = None

    def _tables(self) -> dict[str, int]:
        m = self.spec.model
        return {t.name: m.table_dim(t) for t in m.embedding_tables}

    # --- faults ------------------------------------------------------------------------------
    def _key_of(self, role: Role, node_id: int, incarnation: int) -> _Node | None:
        n = self.nodes.get((role, node_id))
        if n is None or n.incarnation != incarnation:
            return None
        return n

    def _on_exit(self, e: NodeExit) -> None:
        assert self.state is not None and self.plan is not None
        n = self._key_of(e.role, e.node_id, e.incarnation)
        if n is None:
            return  # an old incarnation or an old PS set: already replaced
        cls = classify_exit(e.exit_code, e.reason, e.signal)
        n.handle = None
        if n.role is Role.WORKER and (cls is ExitClass.SUCCEEDED or n.stopping_since is not None):
            self.state.mark_node(n.role, n.node_id, NodeState.SUCCEEDED)
            if n.node_id >= self.plan.workers.count:
                self.nodes.pop((n.role, n.node_id), None)
            return
        if cls is ExitClass.SUCCEEDED:
            return
        self.state.mark_node(n.role, n.node_id, NodeState.FAILED)
        key = cls.value
        tries = n.relaunches.get(key, 0)
        planned = self.plan.node_resources(n.role, n.node_id)
        d = self.faults.decide(n.role, cls, n.resources, planned, tries)
        self.state.record_fault(
            {
                "node": f"{n.role.value}-{n.node_id}",
                "exit_code": e.exit_code,
                "signal": e.signal,
                "reason": e.reason,
                "exit_class": cls.value,
                "action": "relaunch" if d.relaunch else ("fail job" if d.fail_job else "drop node"),
                "resources": d.resources.to_dict() if d.relaunch else None,
                "why": d.reason,
            }
        )
        log.warning("%s-%d exited (%s): %s", n.role.value, n.node_id, cls.value, d.reason)
        if d.fail_job:
            self.failure = f"{n.role.value}-{n.node_id}: {d.reason}"
            return
        if not d.relaunch:
            return
        n.relaunches[key] = tries + 1
        if d.resources != planned:
            # the relaunch size becomes part of the plan (e.g. the OOM memory bump)
            ov = NodeOverride(n.role, n.node_id, d.resources, f"{cls.value}: {d.reason}")
            keep = tuple(
                o for o in self.plan.overrides if (o.role, o.node_id) != (n.role, n.node_id)
            )
            self._adopt_plan(
                self.plan.replace(
                    overrides=(*keep, ov),
                    stage=Stage.FAULT,
                    reasons=(ov.reason,),
                    created_at_s=self.clock(),
                )
            )
        n.resources = d.resources
        n.incarnation += 1
        if n.role is Role.PS:
            # same set, same checkpoint directory: it restores its own latest checkpoint; its
            # new address reaches the workers with a new PS-set version
            self._launch(n, self.plan.ps.count)
            addrs = self._wait_ps(n.ps_version, self.plan.ps.count)
            self.state.mark_node(Role.PS, n.node_id, NodeState.RUNNING)
            self.state.set_ps_set(addrs, self.state.ps_set()[1] + 1)
        else:
            self._launch(n)

    def _check_heartbeats(self) -> None:
        assert self.state is not None
        now = self.clock()
        for role, node_id in self.state.dead_nodes(now, self.heartbeat):
            n = self.nodes.get((role, node_id))
            # PS do not heartbeat: the backend sees their exits and workers report them
            # unreachable; heartbeats judge workers only
            if role is not Role.WORKER or n is None or n.handle is None:
                continue
            log.warning("%s-%d missed its heartbeats: killing it", role.value, node_id)
            self.backend.kill(n.handle)

    # --- observing and re-planning -------------------------------------------------------------
    def _allocated(self) -> dict[NodeKey, NodeResources]:
        return {k: n.resources for k, n in self.nodes.items() if n.handle is not None}

    def _measure_ps(self) -> None:
        """PS processes do not heartbeat: measure their CPU and memory through the backend and
        their embedding rows (distinct IDs) through their Stats RPC."""
        assert self.state is not None
        rows: dict[int, float] = {}
        addrs, version = self.state.ps_set()
        try:
            if self._ps_client is None or self._ps_client_version != version:
                from dlrover_core.runtime.strategies.ps.client import PSClient

                if self._ps_client is not None:
                    self._ps_client.close()
                self._ps_client = PSClient(addrs, self.token, self._tables(), timeout_s=5.0)
                self._ps_client_version = version
            for st in self._ps_client.stats():
                rows[int(st["index"])] = float(st["rows"])
        except DLRoverError as e:
            log.debug("PS stats unavailable: %s", e)
        for (role, node_id), n in self.nodes.items():
            if role is not Role.PS or n.handle is None:
                continue
            u = self.backend.usage(n.handle)
            stats: dict[str, float] = {}
            if u is not None:
                stats.update(cpu_percent=u.cpu_percent, rss_mib=u.rss_mib)
            if node_id in rows:
                stats["rows"] = rows[node_id]
            if stats:
                self.state.record_node_stats(Role.PS, node_id, stats)

    def _observe(self) -> Observation:
        assert self.state is not None and self.plan is not None
        now = self.clock()
        self._measure_ps()
        obs = self.state.observation(now, self._allocated())
        self.observations.append(obs)
        del self.observations[:-200]
        running = obs.of(Role.WORKER)
        stable_s = self.spec.pacing.sample_window_s
        if len(running) < self.plan.workers.count:
            self._config_since = now  # a speed sample starts when every worker is up
        if (
            len(running) == self.plan.workers.count
            and now - self._config_since >= stable_s
            and now - self._last_sample_s >= stable_s
            and obs.throughput_sps > 0
        ):
            w, p = self.plan.workers, self.plan.ps
            self.samples.append(
                Sample(
                    workers=w.count,
                    ps=p.count,
                    worker_cpu_cores=w.resources.cpu_cores,
                    ps_cpu_cores=p.resources.cpu_cores,
                    throughput_sps=obs.throughput_sps,
                    batch_size=self.spec.training.batch_size,
                    worker_memory_mib=max((n.memory_used_mib for n in running), default=None),
                    ps_memory_mib=max((n.memory_used_mib for n in obs.of(Role.PS)), default=None),
                    ps_cpu_util=max((n.cpu_util for n in obs.of(Role.PS)), default=None),
                    worker_cpu_util=sum(n.cpu_util for n in running) / len(running),
                    timestamp_s=now,
                )
            )
            self._last_sample_s = now
        self._timeline(obs)
        return obs

    def _timeline(self, obs: Observation) -> None:
        rec = {
            "t": obs.time_s,
            "throughput_sps": obs.throughput_sps,
            "samples_done": obs.samples_done,
            "alloc_cpu_m": sum(n.allocated.cpu_millicores for n in obs.nodes),
            "alloc_mem_mib": sum(n.allocated.memory_mib for n in obs.nodes),
            "used_cpu_m": sum(n.cpu_used_millicores for n in obs.nodes),
            "used_mem_mib": sum(n.memory_used_mib for n in obs.nodes),
            "workers": len(obs.of(Role.WORKER)),
            "ps": len(obs.of(Role.PS)),
        }
        with open(self.run_dir / TIMELINE_FILE, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _replan(self) -> None:
        assert self.plan is not None
        now = self.clock()
        if self._ps_switch is not None:
            return  # one change at a time
        d = self.planner.replan(
            self.plan, self.observations, self.samples, now, self.past_plans, self._prior
        )
        if d.plan is not None and not d.plan.same_allocation(self.plan):
            bounded = d.plan
            if bounded.total.fits_in(self.spec.quota.resources):
                self._apply(bounded)

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the job to its end; returns the report (also written to the run directory)."""
        self._prepare()
        assert self.state is not None
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (e.g. an orchestrator cancelling the step) ends the job cleanly: nodes
            # stopped, state "stopped", a report written; the run dir can be resumed later
            signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            if self.state.restored and self.state.plans:
                self._resume()
            else:
                plan = self._initial_plan or self.planner.initial_plan(self._history, self.clock())
                self._adopt_plan(plan)
                self._start_ps_set(plan, 1, ())
                for i in range(plan.workers.count):
                    self._start_worker(i, plan.node_resources(Role.WORKER, i))
            self.state.set_job_state("running")
            next_obs = 0.0
            while self.failure is None:
                for e in self.backend.poll():
                    self._on_exit(e)
                self._check_heartbeats()
                self._finish_ps_switch()
                counts = self.state.shards.counts()
                if counts["todo"] == 0 and counts["doing"] == 0:
                    if counts["failed"]:
                        self.failure = (
                            f"{counts['failed']} shard(s) failed on every attempt; see the "
                            "worker logs, fix the data or code, and resume with the same run dir"
                        )
                    break
                if self.stop_reason is not None:
                    break
                if not any(
                    n.handle is not None for n in self.nodes.values() if n.role is Role.WORKER
                ):
                    self.failure = "no worker left"
                    break
                now = self.clock()
                if now >= next_obs:
                    self._observe()
                    if self.replan_enabled:
                        self._replan()
                    next_obs = now + max(self.spec.pacing.heartbeat_interval_s, self.tick_s)
                if self.on_tick is not None:
                    self.on_tick(self)
                time.sleep(self.tick_s)
            return self._finish()
        finally:
            if self._server is not None:
                self._server.stop(grace=1.0)
            self.state.close()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop_reason = "terminated (SIGTERM)"

    def _resume(self) -> None:
        """A new master on the run dir of a previous one: adopt its nodes, relaunch the lost."""
        assert self.state is not None
        snap = self.state.snapshot()
        last = ResourcePlan.from_dict(self.state.plans[-1])
        self.plan = last
        self.past_plans = [ResourcePlan.from_dict(p) for p in self.state.plans]
        self._config_since = self.clock()
        self._ps_set_id = int(self.state.config.get("ps_set_id", 1))
        version = self._ps_set_id
        for nd in snap["nodes"]:
            role, node_id = Role(nd["role"]), int(nd["node_id"])
            if nd["state"] not in ("running", "pending"):
                continue
            n = _Node(
                role, node_id, last.node_resources(role, node_id), int(nd.get("incarnation", 0))
            )
            n.ps_version = version
            ref = str(nd.get("pid")) if nd.get("pid") is not None else ""
            n.handle = self.backend.adopt(role, node_id, n.incarnation, ref) if ref else None
            self.nodes[(role, node_id)] = n
            log.info("resume: %s-%d %s", role.value, node_id, "adopted" if n.handle else "lost")
        for role, count in ((Role.PS, last.ps.count), (Role.WORKER, last.workers.count)):
            for i in range(count):
                m = self.nodes.get((role, i))
                if m is None:
                    m = _Node(role, i, last.node_resources(role, i))
                    m.ps_version = version
                    self.nodes[(role, i)] = m
                if m.handle is None:  # gone while no master watched it: relaunch per policy
                    self._on_exit(
                        NodeExit(role, i, m.incarnation, None, None, LOST_REASON, self.clock(), 0.0)
                    )

    def _finish(self) -> dict[str, Any]:
        assert self.state is not None
        from dlrover_core.runtime.report import write_report

        ok = self.failure is None
        self.state.set_job_state("evaluating" if ok else "failed")
        auc = None
        if ok and self.stop_reason is None:
            try:
                from dlrover_core.runtime.strategies.ps.client import PSClient
                from dlrover_core.runtime.strategies.ps.worker import evaluate_on_ps

                addrs, _ = self.state.ps_set()
                with PSClient(addrs, self.token, self._tables()) as client:
                    auc, _ = evaluate_on_ps(self.spec, client)
            except DLRoverError as e:
                log.warning("evaluation failed: %s", e)
        if self._ps_client is not None:
            self._ps_client.close()
        for n in list(self.nodes.values()):
            if n.handle is not None:
                self.backend.stop(n.handle, grace_s=5.0)
            self.state.mark_node(
                n.role, n.node_id, NodeState.SUCCEEDED if ok else NodeState.DELETED
            )
        self.backend.shutdown()
        self.state.set_job_state(
            "failed" if not ok else ("stopped" if self.stop_reason else "succeeded")
        )
        return write_report(
            self.run_dir,
            self.state,
            self.spec,
            auc=auc,
            failure=self.failure,
            wall_s=self.clock() - self.started_s,
            launches=self.launches,
            stopped=self.stop_reason,
        )


def _pid(h: NodeHandle) -> int | None:
    try:
        return int(h.ref)
    except ValueError:
        return None
