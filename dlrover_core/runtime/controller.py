"""The job master as a controller: one job, from its first plan to its report.

Like a Kubernetes controller, it compares the *desired* nodes (the current plan, the active
PS-set generation) with the *observed* ones (the backend's exits, the nodes' own registrations
and heartbeats) on every tick, and takes idempotent actions to converge. The loop never blocks:
"waiting for the new PS set" is a generation in state ``starting`` with a deadline; a failure
seen meanwhile is acted on at once.

Contracts (DESIGN.md, "The runtime is a controller"):

- **Identity**: a node is (role, id, incarnation) plus the backend's opaque ``ref``; this
  module never knows a pid. PS register the address they serve on with the master.
- **Write ahead**: a launch is recorded (incarnation, generation, budgets) before the backend
  starts the node; a PS-set generation (size, restore sources, their ``done_seq`` tag) before
  its first PS; so a master restarted at any instant resumes the step it was in. A freeze of
  the old PS set not yet followed by a new generation is undone on resume.
- **One master per run**: the lease (a file lock locally) is taken before anything is written.
- **Nothing outlives the job**: every exit path (success, failure, any exception, SIGTERM,
  SIGINT) stops the nodes, writes ``report.json`` with the state and the reason, and releases
  the lease. Nodes also leave on their own once the master has been unreachable for
  ``pacing.dead_after_s``.
- **Every role is watched** on the monotonic clock: silent nodes (PS too), nodes that never
  register, hung workers are killed and relaunched by the fault policy (``faults/``, the same
  rule book the simulator uses, the PS-OOM rule included).
- **Exactly once**: a shard is done once, by the current incarnation (a superseded one is
  refused); a PS that restored a checkpoint tagged ``done_seq = S`` gets every shard done after
  S trained again; a PS-set change freezes the old set (no push is applied after its final
  checkpoint, none is lost: workers hold them until the new set serves).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from dlrover_core.errors import DLRoverError, InputError
from dlrover_core.faults import (
    DEFAULT_FAULT_POLICY,
    DEFAULT_HANG_POLICY,
    ExitClass,
    FaultPolicy,
    HangPolicy,
    PendingAction,
    PendingPolicy,
    RelaunchDecision,
    classify_exit,
    pending_action,
)
from dlrover_core.faults.health import HeartbeatPolicy
from dlrover_core.planner import PlanDecision, Planner
from dlrover_core.runtime import wire
from dlrover_core.runtime.backends.base import Backend, NodeExit, NodeHandle, NodeSpec
from dlrover_core.runtime.files import (
    DiskReserve,
    FileLease,
    LeaseHeldError,
    atomic_write_json,
    is_disk_full,
)
from dlrover_core.runtime.nodes import Node, NodeKey
from dlrover_core.runtime.observe import append_timeline, measure_ps, speed_sample
from dlrover_core.runtime.run_dir import ADDR_FILE, SPEC_FILE, check_runnable, install_stop_signals
from dlrover_core.runtime.service import serve_master
from dlrover_core.runtime.state import MasterState, NodeRecord
from dlrover_core.runtime.strategies.base import NodeCommand, Strategy
from dlrover_core.spec import JobSpec, spec_to_dict
from dlrover_core.types import (
    HistoryRecord,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
    Sample,
)

_T = TypeVar("_T")
STOP_DRAIN_S = 10.0
"""A clean stop waits this long at most for the shards in flight (then checkpoints)."""
log = logging.getLogger("dlrover_rm.master")


def _python() -> list[str]:
    return [sys.executable, "-m", "dlrover_core.runtime.node"]


class JobMaster:
    """One job, from its first plan to its report. Start it with :meth:`run`."""

    def __init__(
        self,
        spec: JobSpec,
        run_dir: str | Path,
        backend: Backend,
        *,
        plan: ResourcePlan | None = None,
        history: Sequence[HistoryRecord] = (),
        planner: Planner | None = None,
        faults: FaultPolicy = DEFAULT_FAULT_POLICY,
        hang_policy: HangPolicy = DEFAULT_HANG_POLICY,
        strategy: Strategy | None = None,
        lease: Any = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        tick_s: float = 0.2,
        on_tick: Callable[[JobMaster], None] | None = None,
        replan: bool = True,
        node_command: Callable[[], list[str]] = _python,
    ) -> None:
        if strategy is None:
            from dlrover_core.runtime.strategies import strategy_for

            strategy = strategy_for(spec, run_dir)
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.planner = planner or Planner(spec)
        self.faults = faults
        self.hang_policy = hang_policy
        self.strategy = strategy
        self.lease = lease if lease is not None else FileLease(self.run_dir)
        self.clock = clock
        self.mono = monotonic
        self.tick_s = tick_s
        self.on_tick = on_tick
        self.replan_enabled = replan
        self.node_command = node_command
        self._initial_plan = plan
        self._history = list(history)
        self.prior: list[Sample] = []  # samples of earlier runs (history) for the model
        self.nodes: dict[NodeKey, Node] = {}
        self.plan: ResourcePlan | None = None
        self.past_plans: list[ResourcePlan] = []
        self.observations: list[Observation] = []
        self.samples: list[Sample] = []
        self.launches: list[dict[str, Any]] = []
        self.state: MasterState | None = None
        self.token = ""
        self.address = ""
        self._server: Any = None
        self._metrics: Any = None  # the /metrics endpoint (pacing.metrics_port)
        self._reserve = DiskReserve(self.run_dir)
        self._config_since = 0.0
        self._last_sample_s = 0.0
        self._next_obs_mono = 0.0
        self._lease_lost = False
        self.started_s = clock()
        self.failure: str | None = None
        self.stop_reason: str | None = None  # set (e.g. by on_tick or a signal) to end early
        self.stop_flush: dict[str, Any] | None = None  # what a clean stop kept for the resume
        self.heartbeat = HeartbeatPolicy(
            interval_s=spec.pacing.heartbeat_interval_s, dead_after_s=spec.pacing.dead_after_s
        )
        self._evaluated = False  # the held-out AUC is taken once every PS serves at the end
        self._auc: float | None = None
        self._eval_retry_mono: float | None = None
        self._eval_deadline_mono: float | None = None
        strategy.bind(self)

    @property
    def st(self) -> MasterState:
        """The job's durable state (set up by ``run``)."""
        assert self.state is not None, "the job master has not started"
        return self.state

    @property
    def current_plan(self) -> ResourcePlan:
        """The plan in force (the first one is adopted before any node starts)."""
        assert self.plan is not None, "the job master has no plan yet"
        return self.plan

    # --- set-up ----------------------------------------------------------------------------
    def _prepare(self) -> None:
        from dlrover_core.training.data import from_spec

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.token = wire.create_token(self.run_dir)
        spec_path = self.run_dir / SPEC_FILE
        if not spec_path.exists():
            atomic_write_json(spec_path, spec_to_dict(self.spec))
        self._reserve.create()
        source = from_spec(self.spec)
        self.state = MasterState(
            self.run_dir,
            total_rows=source.num_rows,
            shard_size=self.spec.shard_size,
            epochs=self.spec.training.epochs or 1,
            clock=self.clock,
            monotonic=self.mono,
            synchronous="NORMAL",
        )
        self.state.persist()  # this master's start is on record before it acts
        self.state.workers_may_leave = not self.strategy.hold_workers_at_the_end
        h, now, pl = self._history, self.clock(), self.planner
        self.prior = self.call_planner("history_samples", pl.history_samples, h, now) or []
        learnt = self.call_planner("learn_pauses", pl.learn_pauses, h, now)
        log.info("planner: %s", "; ".join(learnt or ["plan changes priced at the defaults"]))
        bind, advertise = self.backend.endpoint()
        port = 0
        addr = self.run_dir / ADDR_FILE
        if self.state.restored and addr.exists():
            # nodes have the old address in their command: listen there again
            with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
                port = int(json.loads(addr.read_text())["address"].rsplit(":", 1)[1])
        try:
            self._server, bound = serve_master(self.state, self.token, host=bind, port=port)
        except (OSError, RuntimeError):
            if port == 0:
                raise
            log.warning("port %d is taken: nodes of the earlier master will be relaunched", port)
            self._server, bound = serve_master(self.state, self.token, host=bind, port=0)
        self.address = f"{advertise}:{bound}"
        atomic_write_json(addr, {"address": self.address})
        log.info("master %s serving on %s", self.state.master_id, self.address)
        from dlrover_core.runtime.metrics import start_master_metrics

        port_m = self.spec.pacing.metrics_port
        self._metrics = start_master_metrics(self.state, port_m, bind, advertise, self.spec.name)
        self.strategy.prepare()

    # --- node commands -----------------------------------------------------------------------
    def _node_command(self, n: Node, cores: int) -> NodeCommand:
        """What the strategy needs to know to start ``n`` (its own fields added by it)."""
        cmd = NodeCommand(
            role=n.role,
            node_id=n.node_id,
            incarnation=n.incarnation,
            master=self.address,
            run_dir=str(self.run_dir),
            cores=cores,
        )
        return self.strategy.node_command(n, cmd)

    def _node_env(self, cores: int) -> dict[str, str]:
        from dlrover_core.training.pin import PIN_ENV, PIN_FILE

        env = {"PYTHONUNBUFFERED": "1"}
        if self.spec.training.threads:  # the spec's count, not the backend's whole cores
            env |= {"OMP_NUM_THREADS": str(cores), "MKL_NUM_THREADS": str(cores)}
        if (self.run_dir / PIN_FILE).exists():  # the inputs pinned at the start: every read checks
            env[PIN_ENV] = str(self.run_dir / PIN_FILE)
        return env | self.strategy.node_env(cores)

    def _node_spec(self, n: Node) -> NodeSpec:
        cores = self.spec.training.threads or n.resources.threads
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        cmd = self._node_command(n, cores)
        return NodeSpec(
            role=n.role,
            node_id=n.node_id,
            incarnation=n.incarnation,
            resources=n.resources,
            argv=[*self.node_command(), *self.strategy.argv(self.spec, cmd)],
            env=self._node_env(cores),
            log_path=str(logs / f"{n.role.value}-{n.node_id}.log"),
        )

    def launch(self, *nodes: Node) -> None:
        """Write ahead (one write for the batch), start each node, record their refs (one
        more write): a thousand relaunches cost two writes of master.json, not two thousand."""
        st = self.st
        with st.batch():
            for n in nodes:
                st.record_launch(n.role, n.node_id, n.incarnation, n.resources,
                                 generation=n.generation, relaunches=n.relaunches)  # fmt: skip
        # the backend starts the batch (bounded-concurrency on Kubernetes): a handle or the
        # exception of each; the refs of what started are recorded before any error is raised
        results = self.backend.launch_many([self._node_spec(n) for n in nodes])
        started: list[Node] = []
        for n, h in zip(nodes, results, strict=True):
            if not isinstance(h, Exception):
                n.handle, n.stopping_mono, n.kill_reason = h, None, None
                started.append(n)
        with st.batch():
            for n in started:
                st.record_launch(n.role, n.node_id, n.incarnation, n.resources,
                                 ref=n.handle.ref if n.handle else "", generation=n.generation,
                                 relaunches=n.relaunches)  # fmt: skip
        for n in started:
            self.launches.append({"time_s": self.clock(), "node": n.name, "generation":
                                  n.generation, "incarnation": n.incarnation,
                                  **n.resources.to_dict()})  # fmt: skip
            log.info("launched %s incarnation %d (%s)", n.name, n.incarnation, n.resources)
        for h in results:
            if isinstance(h, Exception):
                raise h

    def launch_successor(
        self,
        role: Role,
        node_id: int,
        resources: NodeResources,
        *,
        generation: int = 0,
        grace_s: float = 2.0,
    ) -> None:
        """Launch the next incarnation of a node (see :meth:`launch_successors`)."""
        self.launch_successors([(role, node_id, resources)], generation=generation, grace_s=grace_s)

    def launch_successors(
        self,
        which: Sequence[tuple[Role, int, NodeResources]],
        *,
        generation: int = 0,
        grace_s: float = 2.0,
    ) -> None:
        """Launch the next incarnation of each node, as one batch: each inherits the
        incarnation count and relaunch budgets of the node it replaces (the one in memory, else
        the persisted record), and the replaced one, if still running, is asked to stop."""
        nodes = []
        for role, node_id, resources in which:
            old = self.nodes.get((role, node_id))
            n = Node(role, node_id, resources, generation=generation)
            prev = old if old is not None else self.st.node(role, node_id)
            if prev is not None:
                n.incarnation = prev.incarnation + 1
                n.relaunches = dict(prev.relaunches)
            if old is not None and old.handle is not None:
                self.backend.stop(old.handle, grace_s=grace_s, wait=False)
            self.nodes[(role, node_id)] = n
            nodes.append(n)
        self.launch(*nodes)

    def start_worker(self, node_id: int, resources: NodeResources) -> None:
        self.launch_successor(Role.WORKER, node_id, resources)

    def relaunch(self, n: Node) -> None:
        """The next incarnation of ``n`` (at ``n.resources``)."""
        n.incarnation += 1
        self.nodes[(n.role, n.node_id)] = n
        self.launch(n)

    # --- plans -------------------------------------------------------------------------------
    def adopt_plan(self, plan: ResourcePlan) -> None:
        self.plan = plan
        self.past_plans.append(plan)
        self.st.record_plan(plan)
        self._config_since = self.clock()
        log.info("plan (%s): %s", plan.stage.value, "; ".join(plan.reasons))
        self.event(
            None,
            "Planned",
            f"{plan.stage.value}: {plan.workers.count} worker(s) x {plan.workers.resources}, "
            f"{plan.ps.count} PS x {plan.ps.resources}: {'; '.join(plan.reasons)}",
        )

    def event(
        self, handle: NodeHandle | None, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """A Kubernetes Event (the backend's channel) on a node's pod or the master's; a
        failure to record one never reaches the loop."""
        try:
            self.backend.event(handle, reason, message, warning=warning)
        except Exception as e:  # best effort, by contract
            log.debug("event %s not recorded: %s", reason, e)

    def apply(self, new: ResourcePlan) -> None:
        """Execute the difference between the current plan and ``new`` (the strategy's job)."""
        self.strategy.apply(new)

    def resized(self, n: Node, want: NodeResources) -> None:
        """The backend resized ``n`` in place: record it (same incarnation) and follow it."""
        log.info("resized %s in place: %s -> %s", n.name, n.resources, want)
        self.event(n.handle, "Resized", f"{n.name}: {n.resources} -> {want}")
        n.resources = want
        n.resized_mono = self.mono()
        self.st.record_resize(n.role, n.node_id, want)

    # --- faults ------------------------------------------------------------------------------
    def _on_exit(self, e: NodeExit) -> None:
        n = self.nodes.get((e.role, e.node_id))
        if n is None or n.incarnation != e.incarnation or (n.handle and n.handle.ref != e.ref):
            return  # an old incarnation, a retired PS, a rank of an aborted group: handled
        n.handle = None
        self.strategy.on_exit(n, e, classify_exit(e.exit_code, e.reason, e.signal))

    def decide_relaunch(self, n: Node, e: NodeExit, cls: ExitClass) -> RelaunchDecision | None:
        """``n`` failed: the fault policy's decision on it, recorded (report, log, event) and
        charged to its relaunch budget. Returns the decision when ``n`` is to be relaunched;
        None when it is dropped, or the job fails (``failure`` set)."""
        plan = self.current_plan
        self.st.mark_node(n.role, n.node_id, NodeState.FAILED)
        key = cls.value
        tries = n.relaunches.get(key, 0)
        planned = plan.node_resources(n.role, n.node_id)
        d = self.faults.decide(n.role, cls, n.resources, planned, tries)
        why = n.kill_reason or d.reason
        self.st.record_fault(
            {
                "node": n.name,
                "incarnation": n.incarnation,
                "exit_code": e.exit_code,
                "signal": e.signal,
                "reason": e.reason,
                "exit_class": cls.value,
                "action": "relaunch" if d.relaunch else ("fail job" if d.fail_job else "drop node"),
                "resources": d.resources.to_dict() if d.relaunch else None,
                "why": why if n.kill_reason is None else f"{n.kill_reason}; {d.reason}",
            }
        )
        log.warning("%s exited (%s): %s", n.name, cls.value, why)
        action = "relaunch" if d.relaunch else ("fail the job" if d.fail_job else "drop it")
        self.event(None, "NodeExited", f"{n.name} exited ({cls.value}): {action}: {why}",
                   warning=True)  # fmt: skip
        if d.fail_job:
            self.failure = f"{n.name}: {d.reason}"
            return None
        if not d.relaunch:
            return None
        n.relaunches[key] = tries + 1
        return d

    def _check_liveness(self) -> None:
        """Silent nodes (every role), nodes that never registered, hung workers: killed, so
        their exits go through the fault policy."""
        full = [r.said for r in self.st.nodes.values() if "disk_full" in r.events]
        if full:  # a node could not write its state (a checkpoint): the job cannot go on
            self.failure = self.failure or self._disk_full(full[0])
        for role, node_id in self.st.dead_nodes(self.heartbeat):
            self._kill(role, node_id, f"no heartbeat for {self.heartbeat.dead_after_s:g} s")
        unplaced = self._unplaced()
        self._give_up_unplaced(unplaced)
        for role, node_id in self.st.unregistered_nodes(self.spec.pacing.pending_timeout_s):
            if (role, node_id) in unplaced:
                continue  # the cluster has no room for it: the planner's pending rule acts
            n = self.nodes.get((role, node_id))
            u = self.backend.usage(n.handle) if n is not None and n.handle is not None else None
            if u is not None and u.cpu_percent > 5.0:
                continue  # still starting (busy importing on a loaded host), not stuck
            self._kill(
                role,
                node_id,
                f"never registered within pending_timeout_s={self.spec.pacing.pending_timeout_s:g}",
            )
        for role, node_id in self.st.hung_nodes(self.hang_policy, self._allocated()):
            self._kill(role, node_id, "hung: no progress and idle CPU")
        now = self.mono()
        for n in self.nodes.values():
            grace = max(60.0, 3 * self.spec.pacing.dead_after_s)
            if n.stopping_mono is not None and n.handle and now - n.stopping_mono > grace:
                self.backend.stop(n.handle, grace_s=5.0, wait=False)

    def _unplaced(self) -> dict[NodeKey, float]:
        """The nodes the cluster cannot place (``Backend.pending_since``), with since when."""
        out = {}
        for k, n in self.nodes.items():
            since = self.backend.pending_since(n.handle) if n.handle is not None else None
            if since is not None:
                out[k] = since
        return out

    def _give_up_unplaced(self, unplaced: dict[NodeKey, float]) -> None:
        """A node unplaced past the pending policy's ``give_up_after_s`` at a size that cannot
        shrink fails the job when the job cannot do without it (a PS; the last workers): the
        cluster has no room even for the minimum. A worker others can do without is dropped
        by the planner's pending rule long before."""
        policy = PendingPolicy(timeout_s=self.spec.pacing.pending_timeout_s)
        now = self.clock()
        placed_workers = sum(
            1
            for k, n in self.nodes.items()
            if k[0] is Role.WORKER and n.handle is not None and k not in unplaced
        )
        for (role, node_id), since in sorted(unplaced.items()):
            n = self.nodes[(role, node_id)]
            d = pending_action(since, now, n.resources, policy)
            if d.action is PendingAction.GIVE_UP and (role is Role.PS or not placed_workers):
                self.failure = self.failure or (
                    f"{n.name} could not be scheduled: {d.reason}; free capacity in the "
                    "cluster or lower the spec's constraints and quota, then resume the run"
                )
                return

    def _check_resizes(self) -> None:
        """An accepted in-place resize the node cannot give (infeasible, or still deferred
        after ``pending_timeout_s``) becomes a relaunch at the new size; one the backend calls
        done is no longer followed."""
        now = self.mono()
        for n in list(self.nodes.values()):
            if n.resized_mono is None or n.handle is None:
                continue
            st = self.backend.resize_state(n.handle)
            waited = now - n.resized_mono
            if st is None and waited > 30.0:
                n.resized_mono = None
            elif st == "infeasible" or (
                st == "deferred" and waited > self.spec.pacing.pending_timeout_s
            ):
                why = f"in-place resize to {n.resources} {st} after {waited:.0f} s"
                log.warning("%s: %s: relaunching it at that size", n.name, why)
                self.st.record_fault(
                    {"node": n.name, "incarnation": n.incarnation, "exit_class": "resize",
                     "action": "relaunch", "why": why}
                )  # fmt: skip
                if n.role is Role.WORKER:
                    self.start_worker(n.node_id, n.resources)
                else:  # its exit relaunches it at the planned (new) size, from its checkpoint
                    n.resized_mono = None
                    self._kill(n.role, n.node_id, why)

    def _kill(self, role: Role, node_id: int, why: str) -> None:
        n = self.nodes.get((role, node_id))
        if n is None or n.handle is None or n.kill_reason is not None:
            return
        n.kill_reason = why
        log.warning("%s: %s: killing it", n.name, why)
        self.event(n.handle, "Killing", f"{n.name}: {why}", warning=True)
        self.backend.kill(n.handle)

    # --- observing and re-planning -------------------------------------------------------------
    def _allocated(self) -> dict[NodeKey, NodeResources]:
        return {k: n.resources for k, n in self.nodes.items() if n.handle is not None}

    def _observe(self) -> Observation:
        assert self.state is not None and self.plan is not None
        now = self.clock()
        measure_ps(self.nodes, self.backend, self.st)
        obs = self.state.observation(now, self._allocated(), self._unplaced())
        self.observations.append(obs)
        del self.observations[:-200]
        running = obs.of(Role.WORKER)
        stable_s = self.spec.pacing.sample_window_s
        if len(running) < self.plan.workers.count or self.changing():
            self._config_since = now  # a speed sample starts when every node is up
        if (
            len(running) == self.plan.workers.count
            and now - self._config_since >= stable_s
            and now - self._last_sample_s >= stable_s
            and obs.throughput_sps > 0
        ):
            self.samples.append(speed_sample(self.spec, self.plan, obs, now))
            self._last_sample_s = now
        append_timeline(self.run_dir, obs)
        return obs

    def replan(self) -> None:
        """The strategy's decision (stage 2 and 3), applied when it differs and fits."""
        if self.changing():
            return  # one change at a time
        new = self.strategy.replan()
        if (
            new is not None
            and not new.same_allocation(self.current_plan)
            and new.total.fits_in(self.spec.quota.resources)
        ):
            self.apply(new)

    def call_planner(
        self, what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any
    ) -> _T | None:
        """A planner error never fails a job: the exception is recorded as a
        ``planner_error`` (report.json and the log: what failed, what the job did instead), the
        current plan is kept, and the next interval tries again. Returns None on an error."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            why = f"{type(e).__name__}: {' '.join(str(e).split())}"
            instead = "kept the current plan; the planner runs again at the next interval"
            log.warning("planner error in %s (%s); %s", what, why, instead)
            log.debug("%s", traceback.format_exc())
            if self.state is not None:
                with contextlib.suppress(Exception):
                    self.state.record_planner_error(
                        {"kind": "planner_error", "step": what, "error": why, "action": instead}
                    )
            self.event(None, "PlannerError", f"{what}: {why}; {instead}", warning=True)
            return None

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the job to its end; returns the report (also written to the run directory).
        Raises (before anything is written) when the run directory cannot be taken."""
        if self.spec.strategy != self.strategy.name:
            raise InputError(
                f"spec.strategy {self.spec.strategy!r} is not the strategy this job master "
                f"holds ({self.strategy.name!r}); let strategies.strategy_for pick it"
            )
        check_runnable(self.spec, self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        holder = self.lease.acquire()
        if holder is not None:
            raise LeaseHeldError(
                f"{self.run_dir} is being trained by another master ({holder}); wait for it "
                f"(`dlrover-rm status --run-dir {self.run_dir}`) or train in a new run directory"
            )
        restore = install_stop_signals(self._stop_asked)
        try:
            try:
                self._prepare()
                self._start_or_resume()
                assert self.state is not None
                self.state.set_job_state("running")
                while not self._tick():
                    time.sleep(self.tick_s)
            except KeyboardInterrupt:
                self.stop_reason = self.stop_reason or "interrupted (SIGINT)"
            except BaseException as e:
                self.failure = self.failure or self._describe(e)
                log.error("the control loop failed: %s", self.failure)
                log.debug("%s", traceback.format_exc())
            return self._finish()
        finally:
            restore()
            self.lease.release()

    def _disk_full(self, why: object) -> str:
        return f"disk full: {why}; free space under {self.run_dir} and resume the job"

    def _describe(self, e: BaseException) -> str:
        if is_disk_full(e):
            return self._disk_full(e)
        if isinstance(e, DLRoverError):
            return " ".join(str(e).split())
        return f"internal error: {type(e).__name__}: {e}"

    def _tick(self) -> bool:
        """One reconcile pass; True when the job is over (done, failed or stopped)."""
        assert self.state is not None and self.plan is not None
        if not self.lease.renew():
            self._lease_lost = True
            self.failure = "lost the run lease: another master took over this run"
            return True
        for e in self.backend.poll():
            self._on_exit(e)
            if self.failure is not None:
                return True
        self._check_liveness()
        self._check_resizes()
        self.strategy.tick()
        if self.failure is not None or self.stop_reason is not None:
            return True
        counts = self.state.shards.counts()
        if counts["todo"] == 0 and counts["doing"] == 0 and not self.changing():
            if counts["failed"]:
                self.failure = (
                    f"{counts['failed']} shard(s) failed on every attempt; see the worker logs "
                    f"in {self.run_dir / 'logs'}, fix the data or code, and resume the run dir"
                )
                return True
            if self.strategy.finished():
                return True
        live_workers = [
            n for n in self.nodes.values() if n.role is Role.WORKER and n.handle is not None
        ]
        if not live_workers:
            self.failure = "no worker left: every worker failed beyond its relaunch budget"
            return True
        now = self.mono()
        if now >= self._next_obs_mono:
            self._observe()
            if self.replan_enabled:
                self.replan()
            self._next_obs_mono = now + max(self.spec.pacing.heartbeat_interval_s, self.tick_s)
        if self.on_tick is not None:
            self.on_tick(self)
        return False

    # --- helpers the strategies share ------------------------------------------------------------
    def planner_replan(self) -> PlanDecision | None:
        """``Planner.replan`` (stages 3 and 2) on this job's plan, observations, samples and
        history, through :meth:`call_planner` (None: it failed, and that is recorded)."""
        return self.call_planner(
            "replan",
            self.planner.replan,
            self.current_plan,
            self.observations,
            self.samples,
            self.clock(),
            self.past_plans,
            self.prior,
        )

    def drain_shards(self) -> str:
        """Hand out no new shard and wait (up to ``STOP_DRAIN_S``) for those in flight."""
        self.st.dispatch_paused = True
        deadline = self.mono() + STOP_DRAIN_S
        while self.st.shards.counts()["doing"] and self.mono() < deadline:
            for e in self.backend.poll():  # a node that exits meanwhile does not finish
                log.info("%s-%d exited during the stop: %s", e.role.value, e.node_id, e.reason)
            time.sleep(0.1)
        left = self.st.shards.counts()["doing"]
        return "shards in flight finished" if not left else f"{left} shard(s) still in flight"

    def _stop_asked(self, why: str) -> None:
        self.stop_reason = self.stop_reason or why

    def changing(self) -> bool:
        """A change of the node set is in progress (the job cannot end meanwhile)."""
        return self.strategy.changing()

    def evaluate_before_the_end(self) -> bool:
        """The held-out AUC, taken once while the nodes still serve (the PS strategy's end):
        True once taken; a node it needs unreachable: False (retried; its exit or its missed
        heartbeats come first); past a deadline True without an AUC. Workers may leave then."""
        if self._evaluated:
            self.st.workers_may_leave = True
            return True
        now = self.mono()
        if self._eval_retry_mono is not None and now < self._eval_retry_mono:
            return False
        addresses, _ = self.st.ps_set()
        try:
            self.st.set_job_state("evaluating")
            self._auc = self.strategy.evaluate(self.spec, addresses, self.token)
        except Exception as e:
            if self._eval_deadline_mono is None:
                self._eval_deadline_mono = now + max(30.0, self.spec.pacing.dead_after_s + 30.0)
            if now < self._eval_deadline_mono:
                log.warning("evaluation postponed: %s", e)
                self.st.set_job_state("running")
                self._eval_retry_mono = now + 2.0
                return False
            log.warning("evaluation failed: %s", e)
        self._evaluated = True
        self.st.workers_may_leave = True
        return True

    def _start_or_resume(self) -> None:
        st = self.st
        if st.restored and st.plans:
            last = ResourcePlan.from_dict(st.plans[-1])
            self.plan = last
            self.past_plans = [ResourcePlan.from_dict(p) for p in st.plans]
            self._config_since = self.clock()
            self.strategy.resume(last)
            return
        self.strategy.start(self._first_plan())

    def _first_plan(self) -> ResourcePlan:
        """The plan given, or stage 1 from the history; a planner error there starts the job
        from stage 1 without the history (a cold start), recorded as a planner error."""
        if self._initial_plan is not None:
            return self._initial_plan
        plan = self.call_planner(
            "initial_plan", self.planner.initial_plan, self._history, self.clock()
        )
        if plan is None:
            self.prior = []
            plan = self.planner.initial_plan((), self.clock())
        return plan

    def adopt_record(self, rec: NodeRecord, res: NodeResources) -> Node:
        """The node of a durable record, at ``res``, adopted by its backend ref when it has
        one (its handle None: lost)."""
        n = Node(
            rec.role,
            rec.node_id,
            res,
            rec.incarnation,
            rec.generation,
            relaunches=dict(rec.relaunches),
        )
        if rec.ref:
            n.handle = self.backend.adopt(rec.role, rec.node_id, rec.incarnation, rec.ref)
        self.nodes[(rec.role, rec.node_id)] = n
        return n

    def _finish(self) -> dict[str, Any]:
        """Stop every node, write the report (whatever happened before), close."""
        from dlrover_core.runtime.report import write_report

        ok = self.failure is None and self.stop_reason is None
        auc = None
        st = self.state
        if self._lease_lost:
            log.error("%s: leaving the nodes to the master that holds the lease", self.failure)
            return {"state": "failed", "failure": self.failure}
        if ok and st is not None and self._evaluated:
            auc = self._auc
        elif ok and st is not None:
            with contextlib.suppress(Exception):
                st.set_job_state("evaluating")
            addresses, _ = st.ps_set()
            try:
                auc = self.strategy.evaluate(self.spec, addresses, self.token)
            except Exception as e:
                log.warning("evaluation failed: %s", e)
        state = "failed" if self.failure else ("stopped" if self.stop_reason else "succeeded")
        done = ""
        with contextlib.suppress(Exception):
            done = f"{st.shards.samples_done:,}/{st.shards.samples_total:,} samples" if st else ""
        self.event(
            None,
            f"Job{state.capitalize()}",
            f"{state}: {self.failure or self.stop_reason or done}"
            + ("" if auc is None else f", AUC {auc:.4f}"),
            warning=state != "succeeded",
        )
        if st is not None and self.plan is not None:
            # the last point (the final samples done): the job may have trained its end
            # between two observations, and evaluating takes seconds with none
            with contextlib.suppress(Exception):
                append_timeline(self.run_dir, st.observation(self.clock(), self._allocated()))
        if self.failure is None and self.stop_reason is not None and st is not None:
            t0 = self.mono()
            try:
                flushed = self.strategy.flush_for_stop()
            except Exception as e:  # a stop still stops: the resume replays what was lost
                flushed = f"not flushed ({type(e).__name__}: {e}); the resume replays"
            self.stop_flush = {"s": round(self.mono() - t0, 3), "result": flushed}
            log.info("clean stop: %s in %.1f s", flushed, self.stop_flush["s"])
        try:
            self.backend.shutdown()
        except Exception as e:
            log.error("stopping the nodes failed: %s", e)
        with contextlib.suppress(Exception):
            self.backend.poll()
        with contextlib.suppress(Exception):
            self.strategy.close()
        reason = self.failure or self.stop_reason
        report: dict[str, Any] = {"state": state, "failure": self.failure}
        if st is not None:
            for attempt in range(2):
                try:
                    for n in self.nodes.values():
                        st.mark_node(
                            n.role, n.node_id, NodeState.SUCCEEDED if ok else NodeState.DELETED
                        )
                    st.set_job_state(state, reason)
                    report = write_report(
                        self.run_dir,
                        st,
                        self.spec,
                        auc=auc,
                        failure=self.failure,
                        wall_s=self.clock() - self.started_s,
                        launches=self.launches,
                        stopped=self.stop_reason,
                        stop_flush=self.stop_flush,
                        model_choice=self.call_planner("model_choice", self.planner.model_choice),
                        strategy=self.strategy.report(),
                    )
                    break
                except OSError as e:
                    if attempt == 0 and is_disk_full(e):
                        self._reserve.release()  # room for the last words
                        continue
                    log.error("cannot write the report in %s: %s", self.run_dir, e)
                    break
            with contextlib.suppress(Exception):
                st.close()
        if self._server is not None:
            self._server.stop(grace=1.0)
        if self._metrics is not None:
            self._metrics.stop()
        self._reserve.release()
        return report
