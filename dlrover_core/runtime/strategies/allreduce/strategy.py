"""The all-reduce strategy as the job master holds it: the controller drives *groups* of ranks.

A group (a generation in ``master.json``) is ``W`` rank processes with ranks ``0..W-1`` and
fresh node ids; its membership never changes (see :mod:`.agent`). Everything else is the
controller's (:class:`~dlrover_core.runtime.controller.JobMaster`, which holds this strategy):
the lease, write-ahead state, liveness, the shard queue, the report. What this strategy adds:

- **Launch**: a group is recorded (size, first node id, store address, resources, relaunch
  budgets) before its first rank starts; each rank is ``dlrover-rm node rank ...``.
- **Resize** (a planner decision, a straggler replaced): the next group is started
  *pre-warmed* (``--after-generation``: it imports torch and torchrec while the old group
  still trains); once its ranks are warm (or after ``warm_wait_s``) the old group is asked to
  stop; it writes a final checkpoint and exits 0; the new group loads it resharded for its
  own world size. The downtime (stop requested → the new group's first step) is measured and
  fed to the planner (``Planner.record_resize``), which prices the next resize on it.
- **Faults**: a group cannot lose a rank. The first failed rank of a group aborts it (its
  other ranks are killed, its shards go back to the queue) and a new group starts from the
  latest complete checkpoint, at the size and memory the fault policy (``faults/``, the same
  rule book as PS jobs) decides; a fatal exit (bad input) fails the job with the rank's own
  one-line reason. A pre-warmed group that fails while the old one still trains only cancels
  the resize.
- **Done** once every shard is done *and* the group left at its final checkpoint; the
  held-out AUC comes from that checkpoint.
- **Resume**: a restarted master adopts a complete group; anything else (a rank lost, a resize
  half done) is stopped and a new group starts from the latest checkpoint, without charging a
  relaunch budget (nothing failed but the master).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrover_core.allreduce_config import AllReduceOptions, validate_allreduce
from dlrover_core.errors import DLRoverError, InputError
from dlrover_core.faults import ExitClass
from dlrover_core.planner.allreduce import (
    NO_PS,
    rank_memory_need_mib,
)
from dlrover_core.runtime.backends.base import LOST_REASON, NodeExit
from dlrover_core.runtime.nodes import Node
from dlrover_core.runtime.state import GEN_ABORTED, GEN_ACTIVE, GEN_RETIRED, GEN_STARTING
from dlrover_core.runtime.strategies.allreduce.agent import CKPT_DIR
from dlrover_core.runtime.strategies.allreduce.launch import RANK_ENV, read_exit
from dlrover_core.runtime.strategies.base import NodeCommand, TrainedModel
from dlrover_core.spec import JobSpec
from dlrover_core.types import NodeResources, NodeState, ResourcePlan, Role, RolePlan, Stage

if TYPE_CHECKING:
    from dlrover_core.runtime.controller import JobMaster

log = logging.getLogger("dlrover_rm.master")

GROUP_KIND = "ranks"
_LIVE = (GEN_STARTING, GEN_ACTIVE)


@dataclass
class _Group:
    gid: int
    world_size: int
    first_node_id: int
    resources: NodeResources
    rdzv: str
    after: int | None
    state: str
    stop_mono: float | None = None  # the controller asked it to leave

    @property
    def node_ids(self) -> range:
        return range(self.first_node_id, self.first_node_id + self.world_size)

    @classmethod
    def from_record(cls, g: dict[str, Any]) -> _Group:
        return cls(
            gid=int(g["id"]),
            world_size=int(g["count"]),
            first_node_id=int(g["first_node_id"]),
            resources=NodeResources(**g["resources"]),
            rdzv=str(g["rdzv"]),
            after=None if g.get("after") is None else int(g["after"]),
            state=str(g["state"]),
        )


@dataclass
class _Resize:
    old: int
    new: int
    warm_deadline_mono: float
    stop_mono: float | None = None
    started_mono: float = 0.0


def _cuda_available() -> bool:
    return shutil.which("nvidia-smi") is not None


class AllReduceStrategy:
    """Ranks only (role worker), in groups (see the module); the model lives in the group's
    DCP checkpoints under ``ckpt_root`` (default ``RUN_DIR/allreduce-ckpt``)."""

    name = "allreduce"
    hold_workers_at_the_end = False  # ranks leave at their final checkpoint by themselves

    def __init__(
        self,
        ckpt_root: str | Path,
        options: AllReduceOptions | None = None,
        *,
        warm_wait_s: float | None = None,
    ) -> None:
        self.ckpt_root = Path(ckpt_root)
        self.options = options or AllReduceOptions()
        self._warm_wait_s = warm_wait_s
        self.warm_wait_s = 0.0
        self._job: JobMaster | None = None
        self._groups: dict[int, _Group] = {}
        self._group_relaunches: dict[str, int] = {}
        self._resize: _Resize | None = None
        self.resize_downtimes_s: list[float] = []
        self.resize_prewarm_s: list[float] = []
        self._next_replan_mono = 0.0
        self._done_mono: float | None = None
        self._store: Any = None
        self._rdzv = ""

    @classmethod
    def for_run(
        cls,
        run_dir: str | Path,
        options: AllReduceOptions | None = None,
        *,
        spec: JobSpec | None = None,
        warm_wait_s: float | None = None,
    ) -> AllReduceStrategy:
        """The strategy of the job in ``run_dir`` (options from ``spec`` when not given)."""
        if options is None and spec is not None:
            options = AllReduceOptions.from_spec(spec)
        return cls(Path(run_dir) / CKPT_DIR, options, warm_wait_s=warm_wait_s)

    @property
    def job(self) -> JobMaster:
        assert self._job is not None, "the strategy is not bound to a job master"
        return self._job

    def bind(self, job: JobMaster) -> None:
        self._job = job
        self.warm_wait_s = (
            self._warm_wait_s
            if self._warm_wait_s is not None
            else min(60.0, max(5.0, job.spec.pacing.pending_timeout_s / 2))
        )

    # --- the nodes -----------------------------------------------------------------------------
    def roles(self) -> tuple[Role, ...]:
        return (Role.WORKER,)

    def argv(self, spec: JobSpec, cmd: NodeCommand) -> list[str]:
        argv = [
            "rank",
            "--run-dir", cmd.run_dir,
            "--master", cmd.master,
            "--node-id", str(cmd.node_id),
            "--rank", str(cmd.rank),
            "--world-size", str(cmd.world_size),
            "--generation", str(cmd.generation),
            "--rdzv", cmd.rdzv,
            "--rdzv-prefix", cmd.rdzv_prefix,
            "--incarnation", str(cmd.incarnation),
            "--ckpt-dir", str(self.ckpt_root),
            "--threads", str(cmd.cores),
        ]  # fmt: skip
        if cmd.after_generation is not None:
            argv += ["--after-generation", str(cmd.after_generation)]
        return argv + self.options.to_argv()

    def read_model(self, spec: JobSpec, run_dir: Path) -> TrainedModel:
        from dlrover_core.runtime.strategies.allreduce.model_out import read_model

        return read_model(spec, run_dir)

    def evaluate(self, spec: JobSpec, ps_addresses: Sequence[str], token: str) -> float | None:
        from dlrover_core.runtime.strategies.allreduce.checkpoint import evaluate_checkpoint

        if spec.data.eval_rows <= 0:
            return None
        try:
            auc, _ = evaluate_checkpoint(spec, self.ckpt_root)
            return float(auc)
        except DLRoverError as e:
            log.warning("evaluation failed: %s", e)
            return None

    # --- groups --------------------------------------------------------------------------------
    def _live_groups(self) -> list[_Group]:
        return sorted((g for g in self._groups.values() if g.state in _LIVE), key=lambda g: g.gid)

    def _current(self) -> _Group | None:
        live = self._live_groups()
        return live[-1] if live else None

    def _next_node_id(self) -> int:
        ids = [k[1] for k in self.job.nodes] + [r.node_id for r in self.job.st.nodes.values()]
        return max(ids, default=-1) + 1

    def prepare(self) -> None:
        """The rendezvous store every group joins through (the master's address is known to
        every backend; each group uses its own key prefix, and a group needs the store only to
        form, so a master restart does not disturb one)."""
        import torch.distributed as dist

        bind, advertise = self.job.backend.endpoint()
        # on any free port, so the address to give is this pod's own (the master's Service
        # only names the gRPC port); a restarted master gives its new one to new groups
        host = os.environ.get("POD_IP") or advertise  # the downward API's status.podIP
        self._store = dist.TCPStore(bind, 0, is_master=True, wait_for_workers=False)
        self._rdzv = f"{host}:{self._store.port}"
        log.info("rendezvous store on %s", self._rdzv)

    def _as_allreduce(self, plan: ResourcePlan) -> ResourcePlan:
        """Ranks only: the PS part of a plan (e.g. from history or a generic planner) goes, and
        each rank gets at least the memory its embedding shards and the runtime need."""
        w = plan.workers
        need = math.ceil(rank_memory_need_mib(self.job.spec, w.count, self.options))
        if w.resources.memory_mib < need:
            w = RolePlan(w.count, NodeResources(w.resources.cpu_millicores, need))
            plan = plan.replace(
                workers=w,
                reasons=(*plan.reasons, f"rank memory raised to {need} MiB (tables + runtime)"),
            )
        if plan.ps == NO_PS and not any(o.role is Role.PS for o in plan.overrides):
            return plan
        return plan.replace(
            ps=NO_PS, overrides=tuple(o for o in plan.overrides if o.role is not Role.PS)
        )

    def _validate(self, plan: ResourcePlan) -> None:
        validate_allreduce(
            self.job.spec,
            plan.workers.count,
            self.options,
            cuda_available=_cuda_available(),
            rank_memory_mib=plan.workers.resources.memory_mib,
        )

    def _launch_group(self, plan: ResourcePlan, after: int | None) -> _Group:
        """Write ahead (the group, then each rank), then start its ranks."""
        w = plan.workers
        rec = self.job.st.begin_generation(w.count, [], 0, GEN_STARTING)
        g = _Group(
            gid=int(rec["id"]),
            world_size=w.count,
            first_node_id=self._next_node_id(),
            resources=w.resources,
            rdzv=self._rdzv,
            after=after,
            state=GEN_STARTING,
        )
        self.job.st.update_generation(
            g.gid,
            kind=GROUP_KIND,
            first_node_id=g.first_node_id,
            rdzv=g.rdzv,
            after=after,
            resources=g.resources.to_dict(),
            relaunches=dict(self._group_relaunches),
        )
        self._groups[g.gid] = g
        log.info(
            "group %d: %d rank(s) of %s%s",
            g.gid,
            g.world_size,
            g.resources,
            f", pre-warmed to follow group {after}" if after is not None else "",
        )
        ranks = [
            Node(Role.WORKER, node_id, g.resources, generation=g.gid) for node_id in g.node_ids
        ]
        for n in ranks:
            self.job.nodes[(Role.WORKER, n.node_id)] = n
        self.job.launch(*ranks)  # written ahead as one batch
        return g

    def _set_group_state(self, g: _Group, state: str) -> None:
        g.state = state
        self.job.st.update_generation(g.gid, state=state)

    def _abort_group(self, g: _Group, why: str) -> None:
        """Stop every rank of ``g`` (no wait) and give its shards back."""
        self._set_group_state(g, GEN_ABORTED)
        for node_id in g.node_ids:
            n = self.job.nodes.pop((Role.WORKER, node_id), None)
            if n is not None and n.handle is not None:
                log.info("group %d aborted (%s): stopping %s", g.gid, why, n.name)
                self.job.backend.stop(n.handle, grace_s=1.0, wait=False)
            self.job.st.mark_node(Role.WORKER, node_id, NodeState.FAILED)

    def node_command(self, n: Node, cmd: NodeCommand) -> NodeCommand:
        g = self._groups[n.generation]
        return dataclasses.replace(
            cmd,
            generation=g.gid,
            rank=n.node_id - g.first_node_id,
            world_size=g.world_size,
            rdzv=g.rdzv,
            rdzv_prefix=f"group-{g.gid}/",
            after_generation=g.after,
        )

    def node_env(self, cores: int) -> dict[str, str]:
        return {**RANK_ENV, "OMP_NUM_THREADS": str(cores)}

    # --- start, resume ---------------------------------------------------------------------------
    def start(self, plan: ResourcePlan) -> None:
        plan = self._as_allreduce(plan)
        self._validate(plan)
        self.job.adopt_plan(plan)
        self._set_group_state(self._launch_group(plan, None), GEN_ACTIVE)

    def resume(self, last: ResourcePlan) -> None:
        """Adopt a complete group; otherwise stop what is left and start a new group from the
        latest checkpoint (not charged to any relaunch budget: only the master failed)."""
        for grec in self.job.st.generations:
            if grec.get("kind") == GROUP_KIND:
                g = _Group.from_record(grec)
                self._groups[g.gid] = g
                self._group_relaunches = dict(grec.get("relaunches") or {})
        for rec in list(self.job.st.nodes.values()):
            if rec.role is not Role.WORKER or rec.state not in (
                NodeState.RUNNING,
                NodeState.PENDING,
            ):
                continue
            res = NodeResources(**rec.resources) if rec.resources else last.workers.resources
            self.job.adopt_record(rec, res)
        live = self._live_groups()
        cur = live[-1] if live else None
        complete = (
            cur is not None
            and len(live) == 1
            and all(
                (m := self.job.nodes.get((Role.WORKER, i))) is not None and m.handle is not None
                for i in cur.node_ids
            )
        )
        if complete and cur is not None:
            log.info("resume: group %d adopted (%d rank(s))", cur.gid, cur.world_size)
            self._set_group_state(cur, GEN_ACTIVE)
            return
        # the earlier master stopped cleanly (SIGTERM, cancel): its group stopped at a final
        # checkpoint when asked, which is no fault
        clean = self.job.st.job_state == "stopped"
        for g in live:
            if clean:
                log.info("resume: group %d stopped at its checkpoint with the last master", g.gid)
            else:
                self.job.st.record_fault(
                    {
                        "node": f"group-{g.gid}",
                        "reason": LOST_REASON,
                        "exit_class": "lost",
                        "action": "relaunch",
                        "why": "ranks ended, or a resize was under way, while no master watched",
                    }
                )
            self._abort_group(g, "incomplete after a master restart")
        for key, n in list(self.job.nodes.items()):  # ranks of no live group
            if n.handle is not None:
                self.job.backend.stop(n.handle, grace_s=1.0, wait=False)
            self.job.nodes.pop(key)
        log.info("resume: starting a new group from the latest checkpoint")
        self._set_group_state(self._launch_group(last, None), GEN_ACTIVE)

    # --- the tick ------------------------------------------------------------------------------
    def tick(self) -> None:
        self._progress_resize()

    def changing(self) -> bool:
        return self._resize is not None

    def finished(self) -> bool:
        """Every shard is done: end once the group left at its final checkpoint (it does so by
        itself within a round), or stop it after a grace."""
        g = self._current()
        if g is None or all(
            (n := self.job.nodes.get((Role.WORKER, i))) is None or n.handle is None
            for i in g.node_ids
        ):
            return True
        now = self.job.mono()
        if self._done_mono is None:
            self._done_mono = now
        grace = max(30.0, 3 * self.job.spec.pacing.dead_after_s)
        if now - self._done_mono > grace:
            log.warning("group %d did not leave within %.0f s of the last shard", g.gid, grace)
            return True
        return False

    # --- resizes -------------------------------------------------------------------------------
    def apply(self, new: ResourcePlan) -> None:
        """Resize to ``new``: a pre-warmed group of the new size follows the current one."""
        new = self._as_allreduce(new)
        old_plan = self.job.current_plan
        cur = self._current()
        relaunch = any(
            o.role is Role.WORKER and o.action == "relaunch" and o not in old_plan.overrides
            for o in new.overrides
        )
        if (
            cur is not None
            and not relaunch
            and (new.workers.count, new.workers.resources) == (cur.world_size, cur.resources)
        ):
            self.job.adopt_plan(new)
            return
        try:
            self._validate(new)
        except InputError as e:
            log.warning("resize to %d rank(s) refused: %s", new.workers.count, e)
            return
        self.job.adopt_plan(new)
        ng = self._launch_group(new, cur.gid if cur is not None else None)
        if cur is None:
            self._set_group_state(ng, GEN_ACTIVE)
            return
        now = self.job.mono()
        self._resize = _Resize(cur.gid, ng.gid, now + self.warm_wait_s, started_mono=now)

    def _warm(self, g: _Group) -> bool:
        """Every rank of ``g`` reported ``warm`` (its imports are done) to the master."""
        st = self.job.st
        return all(
            (rec := st.node(Role.WORKER, node_id)) is not None and "warm" in rec.events
            for node_id in g.node_ids
        )

    def _progress_resize(self) -> None:
        r = self._resize
        if r is None:
            return
        old, new = self._groups[r.old], self._groups[r.new]
        now = self.job.mono()
        if new.state not in _LIVE:
            self._resize = None
            return
        if r.stop_mono is None:
            if old.state in _LIVE and not (now >= r.warm_deadline_mono or self._warm(new)):
                return
            r.stop_mono = now
            old.stop_mono = now
            # the new group's ranks reported warm (or the wait ran out): how long that took
            self.resize_prewarm_s.append(now - r.started_mono)
            for node_id in old.node_ids:
                n = self.job.nodes.get((Role.WORKER, node_id))
                if n is not None and n.handle is not None:
                    self.job.st.request_stop(node_id)
                    n.stopping_mono = now
            log.info("resize: group %d asked to stop; group %d follows", old.gid, new.gid)
            return
        rec = self.job.st.node(Role.WORKER, new.first_node_id)
        if rec is not None and rec.state is NodeState.RUNNING and rec.stats.get("step", 0) > 0:
            took = now - r.stop_mono
            self.resize_downtimes_s.append(took)
            self.job.planner.record_resize(took)
            self._set_group_state(new, GEN_ACTIVE)
            self._resize = None
            log.info(
                "resize: group %d (%d rank(s)) training, %.1f s after group %d was asked to stop",
                new.gid,
                new.world_size,
                took,
                old.gid,
            )

    def replan(self) -> ResourcePlan | None:
        """The planner's stages 3 and 2 for all-reduce (``Planner.replan``: stragglers,
        memory, pending ranks; then the all-reduce model), every ``pacing.replan_interval_s``;
        a resize only when it pays for its downtime."""
        if self.changing() or not self.job.observations:
            return None
        now = self.job.mono()
        if now < self._next_replan_mono:
            return None
        self._next_replan_mono = now + self.job.spec.pacing.replan_interval_s
        d = self.job.planner_replan()
        if d is not None and d.notes:
            log.debug("all-reduce re-plan: %s", "; ".join(d.notes))
        return None if d is None else d.plan

    # --- exits ---------------------------------------------------------------------------------
    def on_exit(self, n: Node, e: NodeExit, cls: ExitClass) -> None:
        g = self._groups.get(n.generation)
        if e.exit_code is None and e.signal is None:
            # no status (a rank adopted after a master restart is not our child): it left at
            # the end of the job if the queue is done, else it was lost
            counts = self.job.st.shards.counts()
            if counts["todo"] == 0 and counts["doing"] == 0:
                cls = ExitClass.SUCCEEDED
        if cls is ExitClass.SUCCEEDED:
            self.job.st.mark_node(Role.WORKER, n.node_id, NodeState.SUCCEEDED)
            if g is not None and all(
                (m := self.job.nodes.get((Role.WORKER, i))) is None or m.handle is None
                for i in g.node_ids
            ):
                self._group_left(g)
            return
        self.job.st.mark_node(Role.WORKER, n.node_id, NodeState.FAILED)
        if g is None or g.state not in _LIVE:
            return  # its group was already handled
        self._group_failed(g, n, e, cls)

    def _group_left(self, g: _Group) -> None:
        """Every rank of ``g`` exited 0: it stopped at a final checkpoint (asked to, or the job
        is done), or something outside asked it to (SIGTERM): then a new group goes on."""
        self._set_group_state(g, GEN_RETIRED)
        for node_id in g.node_ids:
            self.job.nodes.pop((Role.WORKER, node_id), None)
        if g.stop_mono is not None:
            return
        counts = self.job.st.shards.counts()
        if counts["todo"] == 0 and counts["doing"] == 0:
            return
        if any(x.after == g.gid for x in self._live_groups()):
            return  # a pre-warmed group takes over from its final checkpoint
        log.warning("group %d left before the job was done: a new group goes on", g.gid)
        self._set_group_state(self._launch_group(self.job.current_plan, None), GEN_ACTIVE)

    def _rank_says(self, n: Node) -> str:
        """The rank's own one-line reason, as it reported it (``ReportEvent``)."""
        rec = self.job.st.node(Role.WORKER, n.node_id)
        if rec is not None and rec.said:
            return rec.said
        return f"it said nothing; see its log ({n.name})"

    def _group_failed(self, g: _Group, n: Node, e: NodeExit, cls: ExitClass) -> None:
        code: int | None = e.exit_code if e.exit_code is not None else None
        if code is None and e.signal:
            code = -e.signal
        kind = read_exit(code).kind if code is not None else "lost"
        why = n.kill_reason or (f"exit {code} ({kind})" if code is not None else str(e.reason))
        if kind == "fatal" and n.kill_reason is None:
            self.job.st.record_fault(
                {"node": n.name, "exit_code": code, "exit_class": "fatal", "action": "fail job"}
            )
            self.job.failure = (
                f"{n.name} (rank {n.node_id - g.first_node_id}): {self._rank_says(n)}"
            )
            return
        others = [x for x in self._live_groups() if x is not g]
        if g.state == GEN_STARTING and others and all(x.stop_mono is None for x in others):
            # the pre-warmed group of a resize failed while the old one still trains
            self._abort_group(g, why)
            self._resize = None
            cur = others[-1]
            self.job.adopt_plan(
                self.job.current_plan.replace(
                    workers=RolePlan(cur.world_size, cur.resources),
                    stage=Stage.FAULT,
                    reasons=(f"resize to {g.world_size} rank(s) cancelled: {n.name} {why}",),
                    created_at_s=self.job.clock(),
                )
            )
            self.job.st.record_fault(
                {"node": n.name, "exit_code": code, "exit_class": cls.value, "action": "cancel"}
            )
            return
        key = cls.value
        tries = self._group_relaunches.get(key, 0)
        planned = self.job.current_plan.workers.resources
        d = self.job.faults.decide(Role.WORKER, cls, n.resources, planned, tries)
        relaunch = d.relaunch and not d.fail_job
        self.job.st.record_fault(
            {
                "node": n.name,
                "group": g.gid,
                "incarnation": n.incarnation,
                "exit_code": e.exit_code,
                "signal": e.signal,
                "reason": e.reason,
                "exit_class": cls.value,
                "action": "relaunch the group" if relaunch else "fail job",
                "resources": d.resources.to_dict() if relaunch else None,
                "why": f"{why}; {d.reason}",
            }
        )
        log.warning("%s of group %d exited (%s): %s; %s", n.name, g.gid, cls.value, why, d.reason)
        for x in self._live_groups():
            self._abort_group(x, f"{n.name} {why}")
        self._resize = None
        if not relaunch:
            self.job.failure = f"{n.name}: {d.reason} (a group cannot go on without a rank)"
            return
        self._group_relaunches[key] = tries + 1
        if d.resources != planned:
            self.job.adopt_plan(
                self.job.current_plan.replace(
                    workers=RolePlan(self.job.current_plan.workers.count, d.resources),
                    stage=Stage.FAULT,
                    reasons=(f"{cls.value}: {d.reason}",),
                    created_at_s=self.job.clock(),
                )
            )
        self._set_group_state(self._launch_group(self.job.current_plan, None), GEN_ACTIVE)

    # --- the end -------------------------------------------------------------------------------
    def flush_for_stop(self) -> str:
        """No new shard; the group checkpoints the shards it holds (rank 0 is told to wait
        with trained shards pending), which reports them done; its stop then writes a final
        checkpoint: the resume loads it and replays nothing."""
        return f"{self.job.drain_shards()}; the group checkpoints as it stops"

    def report(self) -> dict[str, Any]:
        d = self.resize_downtimes_s
        out = {"resize_downtimes_s": list(d)} if d else {}
        if self.resize_prewarm_s:
            out["resize_prewarm_s"] = list(self.resize_prewarm_s)
        return out

    def close(self) -> None:
        self._store = None  # the rendezvous store stops with the job
