"""The PS strategy as the job master holds it: parameter servers in generations (see
:mod:`.psset`), workers relaunched one by one by the fault policy, the model evaluated on the
PS before the workers are let go."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrover_core.faults import ExitClass
from dlrover_core.runtime.backends.base import LOST_REASON, NodeExit
from dlrover_core.runtime.nodes import Node
from dlrover_core.runtime.state import GEN_ABORTED, GEN_ACTIVE, GEN_STARTING
from dlrover_core.runtime.strategies.base import NodeCommand, TrainedModel
from dlrover_core.runtime.strategies.ps.psset import PSSet
from dlrover_core.spec import JobSpec
from dlrover_core.types import NodeOverride, NodeResources, NodeState, ResourcePlan, Role, Stage

if TYPE_CHECKING:
    from dlrover_core.runtime.controller import JobMaster

log = logging.getLogger("dlrover_rm.master")


class PSStrategy:
    name = "ps"
    hold_workers_at_the_end = True  # the model is evaluated on the PS first

    def __init__(self) -> None:
        self._job: JobMaster | None = None
        self._psset: PSSet | None = None

    @property
    def job(self) -> JobMaster:
        assert self._job is not None, "the strategy is not bound to a job master"
        return self._job

    @property
    def psset(self) -> PSSet:
        assert self._psset is not None, "the strategy is not bound to a job master"
        return self._psset

    # --- the nodes ---------------------------------------------------------------------------
    def roles(self) -> tuple[Role, ...]:
        return (Role.PS, Role.WORKER)

    def argv(self, spec: JobSpec, cmd: NodeCommand) -> list[str]:
        p = spec.pacing
        common = ["--run-dir", cmd.run_dir, "--master", cmd.master,
                  "--incarnation", str(cmd.incarnation)]  # fmt: skip
        if cmd.role is Role.PS:
            argv = [
                "ps", *common,
                "--index", str(cmd.node_id),
                "--num-ps", str(cmd.num_ps),
                "--generation", str(cmd.generation),
                "--ckpt-dir", cmd.ckpt_dir,
                "--lr", repr(spec.training.optimizer.lr),
                "--checkpoint-every-s", repr(max(2.0, 4 * p.heartbeat_interval_s)),
                "--heartbeat-s", repr(p.heartbeat_interval_s),
                "--dead-after-s", repr(p.dead_after_s),
            ]  # fmt: skip
            if cmd.restore_from:
                argv += ["--restore-from", ",".join(cmd.restore_from),
                         "--restore-seq", str(cmd.restore_seq)]  # fmt: skip
            return argv
        return ["worker", *common, "--node-id", str(cmd.node_id), "--threads", str(cmd.cores)]

    def node_command(self, n: Node, cmd: NodeCommand) -> NodeCommand:
        if n.role is not Role.PS:
            return cmd
        import dataclasses

        gen = self.job.st.generation(n.generation) or {}
        return dataclasses.replace(
            cmd,
            generation=n.generation,
            num_ps=int(gen.get("count", 1)),
            ckpt_dir=str(self.psset.dir(n.generation, n.node_id)),
            restore_from=tuple(gen.get("restore_from", ())),
            restore_seq=int(gen.get("restore_seq", 0)),
        )

    def node_env(self, cores: int) -> dict[str, str]:
        return {}

    def read_model(self, spec: JobSpec, run_dir: Path) -> TrainedModel:
        from dlrover_core.runtime.strategies.ps.model_out import read_model

        return read_model(spec, run_dir)

    def evaluate(self, spec: JobSpec, ps_addresses: Sequence[str], token: str) -> float | None:
        from dlrover_core.runtime.strategies.ps.client import PSClient
        from dlrover_core.runtime.strategies.ps.worker import evaluate_on_ps

        tables = {t.name: spec.model.table_dim(t) for t in spec.model.embedding_tables}
        # a PS that cannot be reached raises (DLRoverError): the controller waits for its
        # relaunch rather than end the job on a model that lost updates
        with PSClient(list(ps_addresses), token, tables) as client:
            auc, _ = evaluate_on_ps(spec, client)
        return float(auc)

    # --- the master side ---------------------------------------------------------------------
    def bind(self, job: JobMaster) -> None:
        self._job = job
        self._psset = PSSet(job)

    def prepare(self) -> None:
        """Nothing to set up in the master: the PS are nodes, started with the first plan."""

    def start(self, plan: ResourcePlan) -> None:
        self.job.adopt_plan(plan)
        self.psset.start_generation(plan, [], 0)
        workers = plan.workers.count
        self.job.launch_successors(
            [(Role.WORKER, i, plan.node_resources(Role.WORKER, i)) for i in range(workers)]
        )

    def resume(self, last: ResourcePlan) -> None:
        """Adopt the earlier master's nodes (by ref), relaunch the lost ones (their budgets
        kept), finish a PS generation that was starting, and undo a freeze that was not
        followed by a new generation."""
        job, st = self.job, self.job.st
        lost: list[Node] = []
        for rec in list(st.nodes.values()):
            if rec.state not in (NodeState.RUNNING, NodeState.PENDING):
                continue
            res = (
                NodeResources(**rec.resources)
                if rec.resources
                else last.node_resources(rec.role, rec.node_id)
            )
            n = job.adopt_record(rec, res)
            log.info("resume: %s %s", n.name, "adopted" if n.handle else "lost")
            if n.handle is None:
                lost.append(n)
        starting = st.generations_in(GEN_STARTING)
        for g in starting[:-1]:
            st.update_generation(int(g["id"]), state=GEN_ABORTED)
        if starting:
            self.psset.launch_generation(int(starting[-1]["id"]), last)
        else:
            self.psset.unfreeze_active()
        again = []
        for n in lost:
            if job.nodes.get((n.role, n.node_id)) is not n:
                continue  # replaced by the generation just launched
            # gone while no master watched it (nodes leave a master unreachable for
            # dead_after_s): not the node's fault, so no relaunch budget is charged
            st.record_fault(
                {
                    "node": n.name,
                    "incarnation": n.incarnation,
                    "reason": LOST_REASON,
                    "exit_class": "lost",
                    "action": "relaunch",
                    "why": "ended while no master watched it",
                }
            )
            n.incarnation += 1
            again.append(n)
        job.launch(*again)
        active = st.generations_in(GEN_ACTIVE)
        if active and not starting:  # e.g. after a clean stop: the PS set is relaunched
            gid, count = int(active[-1]["id"]), int(active[-1]["count"])
            for i in range(count):
                if (Role.PS, i) not in job.nodes:
                    job.launch_successor(
                        Role.PS, i, last.node_resources(Role.PS, i), generation=gid
                    )
        job.launch_successors(
            [(Role.WORKER, i, last.node_resources(Role.WORKER, i))
             for i in range(last.workers.count) if (Role.WORKER, i) not in job.nodes]
        )  # fmt: skip

    def apply(self, new: ResourcePlan) -> None:
        job = self.job
        old = job.current_plan
        ps_changed = old.ps != new.ps or {o for o in old.overrides if o.role is Role.PS} != {
            o for o in new.overrides if o.role is Role.PS
        }
        job.adopt_plan(new)
        if ps_changed and not self.psset.resize_in_place(old, new):
            self.psset.replace(new)
        self._apply_workers(old, new)

    def _apply_workers(self, old: ResourcePlan, new: ResourcePlan) -> None:
        """The workers' part of a plan change, one node per worker: start the missing, resize
        in place (CPU only) or relaunch the changed, ask the surplus to finish their shard."""
        job = self.job
        for i in range(new.workers.count):
            want = new.node_resources(Role.WORKER, i)
            n = job.nodes.get((Role.WORKER, i))
            relaunch = any(
                o.role is Role.WORKER
                and o.node_id == i
                and o.action == "relaunch"
                and o not in old.overrides
                for o in new.overrides
            )
            if n is None or n.handle is None:
                job.start_worker(i, want)
            elif n.resources != want or relaunch:
                if (
                    not relaunch
                    and want.memory_mib == n.resources.memory_mib
                    and job.backend.resize(n.handle, want)
                ):
                    job.resized(n, want)
                    continue
                job.start_worker(i, want)
        for i in range(new.workers.count, old.workers.count):
            n = job.nodes.get((Role.WORKER, i))
            if n is None or n.handle is None or n.stopping_mono is not None:
                continue
            n.stopping_mono = job.mono()
            rec = job.st.nodes.get((Role.WORKER, i))
            if rec is None or rec.state is NodeState.PENDING:
                # never registered (e.g. unschedulable): it holds no shard, so it is stopped
                # at once rather than asked to finish one
                job.event(n.handle, "ScalingDown", f"{n.name}: never started; stopped")
                job.backend.stop(n.handle, grace_s=5.0, wait=False)
                continue
            job.st.request_stop(i)
            job.event(n.handle, "ScalingDown", f"{n.name}: asked to finish its shard")

    def on_exit(self, n: Node, e: NodeExit, cls: ExitClass) -> None:
        job, st = self.job, self.job.st
        plan = job.current_plan
        if (
            n.role is Role.WORKER
            and cls is ExitClass.SUCCEEDED
            and n.stopping_mono is None
            and job.stop_reason is None
            and st.shards.counts()["todo"] > 0
        ):
            # a worker exits 0 when told there is nothing left or asked to leave; neither
            # happened and shards wait: it was stopped from outside (its pod deleted or
            # evicted, a SIGTERM it handled in its grace period), so it is relaunched as a
            # killed node, not counted finished (the job lost that worker for good)
            cls = ExitClass.KILLED
        if n.role is Role.WORKER and (cls is ExitClass.SUCCEEDED or n.stopping_mono is not None):
            st.mark_node(n.role, n.node_id, NodeState.SUCCEEDED)
            if n.node_id >= plan.workers.count:
                job.nodes.pop((n.role, n.node_id), None)
            return
        if cls is ExitClass.SUCCEEDED and n.role is Role.PS and self.psset.switch is None:
            cls = ExitClass.UNKNOWN  # a PS leaves only when told to: this one left early
        elif cls is ExitClass.SUCCEEDED:
            return
        d = job.decide_relaunch(n, e, cls)
        if d is None:
            return
        planned = plan.node_resources(n.role, n.node_id)
        if n.role is Role.PS and cls is ExitClass.OOM:
            new_ps_plan = self.psset.oom_plan(n)
            if new_ps_plan is not None and self.psset.count_changed(new_ps_plan):
                # the PS-OOM rule chose more PS: a new generation re-sharded from the
                # checkpoints (the survivors frozen and checkpointed, the dead PS's latest)
                job.adopt_plan(new_ps_plan)
                if self.psset.replace(new_ps_plan):
                    return
                # the set cannot change now (a serving PS did not answer): this PS alone is
                # relaunched (with its memory bump), never left down
                log.warning("%s: the PS set could not grow now; relaunching it alone", n.name)
                job.adopt_plan(plan)
            elif new_ps_plan is not None:
                n.resources = new_ps_plan.node_resources(Role.PS, n.node_id)
                job.relaunch(n)
                return
        if d.resources != planned:
            # the relaunch size becomes part of the plan (e.g. the OOM memory bump)
            ov = NodeOverride(n.role, n.node_id, d.resources, f"{cls.value}: {d.reason}")
            cur = job.current_plan
            keep = tuple(o for o in cur.overrides if (o.role, o.node_id) != (n.role, n.node_id))
            job.adopt_plan(
                cur.replace(
                    overrides=(*keep, ov),
                    stage=Stage.FAULT,
                    reasons=(ov.reason,),
                    created_at_s=job.clock(),
                )
            )
        n.resources = d.resources
        job.relaunch(n)

    def tick(self) -> None:
        """PS restores, a PS-set change's progress, the published set."""
        self.psset.check_restores()
        self.psset.progress_switch()
        self.psset.publish()

    def changing(self) -> bool:
        return self.psset.switch is not None

    def finished(self) -> bool:
        """Once every PS of the active set serves (a PS lost at the end restores its
        checkpoint and gives the shards done after it back first) and the model was evaluated
        on that set; only then are the workers told "done"."""
        got = self.psset.active_serving()
        if got is not None and got[1]:
            return False
        return self.job.evaluate_before_the_end()

    def replan(self) -> ResourcePlan | None:
        d = self.job.planner_replan()
        return None if d is None else d.plan

    def flush_for_stop(self) -> str:
        """No new shard is handed out, the shards in flight finish (up to ``STOP_DRAIN_S``),
        then the active PS set is frozen and checkpointed tagged with the shard queue's
        done_seq. A PS not serving is not asked: the resume replays what its latest
        checkpoint lacks, as after any PS loss."""
        return f"{self.job.drain_shards()}; {self.psset.checkpoint_for_stop()}"

    def report(self) -> dict[str, Any]:
        sw = self.psset.switch_downtimes_s
        return {"ps_switch_s": list(sw)} if sw else {}

    def close(self) -> None:
        """Nothing held in the master to release (the PS stopped with the other nodes)."""
