"""The PS set as the job master drives it: generations, changes, restores.

A PS-set *generation* is a set of PS of one size, recorded (write ahead) before its first PS
starts; it becomes *active* once every PS of it registered, and the workers then get its
addresses as a new version. A change of the set (scale, migrate, the PS-OOM rule) freezes the
active set (no push is applied after its final checkpoint; workers hold theirs), checkpoints
it tagged with the shard queue's ``done_seq``, and starts the next generation re-sharded from
those checkpoints. A PS that restored a state tagged ``S`` gets every shard done after ``S``
trained again (unless it restored the frozen checkpoints of a planned change: nothing is lost
then, and replaying would train twice).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlrover_core.errors import DLRoverError
from dlrover_core.faults import PsOomAction, ps_oom_action
from dlrover_core.runtime.nodes import Node
from dlrover_core.runtime.state import GEN_ACTIVE, GEN_RETIRED, GEN_STARTING
from dlrover_core.runtime.strategies.ps.layout import ps_dir
from dlrover_core.types import NodeResources, NodeState, ResourcePlan, Role, Stage

if TYPE_CHECKING:
    from dlrover_core.runtime.controller import JobMaster

log = logging.getLogger("dlrover_rm.master")


@dataclass
class Switch:
    """A PS-set change in progress (generation ``gen`` starting)."""

    gen: int
    deadline_mono: float
    started_mono: float


class PSSet:
    """The PS sets of one job (see the module)."""

    def __init__(self, job: JobMaster) -> None:
        self.job = job
        self.switch: Switch | None = None
        self.switch_downtimes_s: list[float] = []

    def dir(self, gen: int, index: int) -> Path:
        return ps_dir(self.job.run_dir, gen, index)

    # --- generations -------------------------------------------------------------------------
    def start_generation(
        self, plan: ResourcePlan, restore_from: list[str], seq: int, *, frozen: bool = False
    ) -> None:
        """Record a new generation (write ahead), stop the PS it replaces (already frozen and
        checkpointed), launch its PS. It becomes active once all of them registered.
        ``frozen``: every source was frozen and checkpointed at ``seq``."""
        st = self.job.st
        gen = st.begin_generation(plan.ps.count, restore_from, seq, GEN_STARTING, frozen=frozen)
        if restore_from:
            self.job.event(
                None,
                "PSSetChange",
                f"PS generation {gen['id']}: {plan.ps.count} PS x {plan.ps.resources}, "
                f"re-sharded from {len(restore_from)} checkpoint(s) tagged done_seq {seq}",
            )
        self.launch_generation(gen["id"], plan)

    def launch_generation(self, gid: int, plan: ResourcePlan) -> None:
        job, st = self.job, self.job.st
        gen = st.generation(gid)
        assert gen is not None
        count = int(gen["count"])
        todo = []
        for i in range(count):
            old = job.nodes.get((Role.PS, i))
            if old is not None and old.generation == gid and old.handle is not None:
                continue  # launched before a master restart and adopted
            todo.append((Role.PS, i, plan.node_resources(Role.PS, i)))
        job.launch_successors(todo, generation=gid, grace_s=5.0)
        # a smaller set: the PS beyond its size leave
        for (role, i), old in list(job.nodes.items()):
            if role is Role.PS and i >= count:
                if old.handle is not None:
                    job.backend.stop(old.handle, grace_s=5.0, wait=False)
                job.nodes.pop((role, i))
                st.mark_node(Role.PS, i, NodeState.DELETED)
        now = job.mono()
        timeout = max(30.0, job.spec.pacing.pending_timeout_s)
        self.switch = Switch(gid, now + timeout, now)

    def progress_switch(self) -> None:
        """Activate the starting generation once every PS of it registered; past the deadline,
        the PS that did not are killed (the fault policy relaunches them)."""
        job, st, sw = self.job, self.job.st, self.switch
        if sw is None:
            return
        gen = st.generation(sw.gen)
        if gen is None or gen["state"] != GEN_STARTING:
            self.switch = None
            return
        addresses, missing = self.serving(sw.gen, int(gen["count"]))
        if not missing:
            _, version = st.ps_set()
            for g in st.generations_in(GEN_ACTIVE):
                st.update_generation(int(g["id"]), state=GEN_RETIRED)
            st.update_generation(sw.gen, state=GEN_ACTIVE)
            st.set_ps_set(addresses, version + 1)
            took = job.mono() - sw.started_mono
            self.switch_downtimes_s.append(took)
            log.info("PS generation %d active after %.1f s: %s", sw.gen, took, addresses)
            job.event(None, "PSSetActive", f"PS generation {sw.gen} active after {took:.1f} s")
            self.switch = None
            return
        if job.mono() > sw.deadline_mono:
            for n in missing:
                if n.handle is not None and n.kill_reason is None and n in job.nodes.values():
                    n.kill_reason = f"did not register within the PS start deadline (gen {sw.gen})"
                    log.warning("%s %s: killing it", n.name, n.kill_reason)
                    job.backend.kill(n.handle)
            sw.deadline_mono = job.mono() + max(30.0, job.spec.pacing.pending_timeout_s)

    def serving(self, gid: int, count: int) -> tuple[list[str], list[Node]]:
        """The addresses of generation ``gid``'s PS that registered (current incarnation),
        and the PS that did not yet (or are missing)."""
        job, st = self.job, self.job.st
        addresses: list[str] = []
        missing: list[Node] = []
        for i in range(count):
            n = job.nodes.get((Role.PS, i))
            rec = st.node(Role.PS, i)
            if (
                n is None
                or rec is None
                or rec.state is not NodeState.RUNNING
                or rec.incarnation != n.incarnation
                or rec.generation != gid
                or not rec.address
            ):
                missing.append(n or Node(Role.PS, i, NodeResources(0, 0)))
                continue
            addresses.append(rec.address)
        return addresses, missing

    def active_serving(self) -> tuple[list[str], list[Node]] | None:
        """``serving`` of the active generation; None when there is none."""
        active = self.job.st.generations_in(GEN_ACTIVE)
        if not active:
            return None
        return self.serving(int(active[-1]["id"]), int(active[-1]["count"]))

    def publish(self) -> None:
        """Outside a set change: once every PS of the active generation is registered (a
        relaunched one at its new address), workers get the addresses as a new version."""
        if self.switch is not None:
            return
        got = self.active_serving()
        if got is None or got[1]:
            return
        st = self.job.st
        published, version = st.ps_set()
        if got[0] != published:
            st.set_ps_set(got[0], version + 1)
            log.info("PS set version %d: %s", version + 1, got[0])

    def count_changed(self, plan: ResourcePlan) -> bool:
        gens = self.job.st.generations_in(GEN_ACTIVE, GEN_STARTING)
        return bool(gens) and int(gens[-1]["count"]) != plan.ps.count

    # --- changes -----------------------------------------------------------------------------
    def replace(self, new: ResourcePlan) -> bool:
        """Scale or migrate the PS set: freeze the active set's serving PS (no push is applied
        from now on; workers hold theirs), checkpoint them tagged with the shard done_seq,
        then start the new generation re-sharded from the checkpoints. A PS of the set that
        is gone (exited, not yet relaunched) is not asked: its latest checkpoint is the
        source, and the new PS, restoring its older tag, get the shards done after it again.
        False when nothing was started (no active set, or a serving PS did not answer)."""
        from dlrover_core.runtime.strategies.ps.control import checkpoint_set, freeze_set

        job, st = self.job, self.job.st
        active = st.generations_in(GEN_ACTIVE)
        if not active:
            return False
        old = active[-1]
        gid, count = int(old["id"]), int(old["count"])
        serving, gone = self.serving(gid, count)
        if not serving and not gone:
            return False
        sources = [str(self.dir(gid, i)) for i in range(count)]
        try:
            if serving:
                freeze_set(serving, job.token, True)
            seq = st.shards.done_seq  # after the freeze: nothing more reaches the PS
            tags = checkpoint_set(serving, job.token, seq) if serving else []
        except DLRoverError as e:
            log.warning("PS-set change postponed: %s", e)
            with contextlib.suppress(DLRoverError):
                freeze_set(serving, job.token, False)
            return False
        if gone:
            log.info(
                "PS-set change: %s not serving; re-sharded from the latest checkpoint",
                ", ".join(m.name for m in gone),
            )
        tag = min(tags, default=seq)
        self.start_generation(new, sources, tag, frozen=not gone and tag == seq)
        return True

    def unfreeze_active(self) -> None:
        """After a restart: a freeze not followed by a new generation is undone (idempotent)."""
        from dlrover_core.runtime.strategies.ps.control import freeze_set

        addresses, _ = self.job.st.ps_set()
        if addresses and self.switch is None:
            try:
                freeze_set(addresses, self.job.token, False)
            except DLRoverError as e:
                log.info("unfreeze after restart: %s (the PS will be relaunched)", e)

    def resize_in_place(self, old: ResourcePlan, new: ResourcePlan) -> bool:
        """A PS change of CPU only (same count, same memory per PS, no relaunch asked for) is
        applied to the running PS in place when the backend can (``pods/resize``, a local
        re-pin): no freeze, no re-shard, no replay. ``False`` leaves it to a PS-set change."""
        job = self.job
        if self.switch is not None or old.ps.count != new.ps.count:
            return False
        changes = []
        for i in range(new.ps.count):
            want = new.node_resources(Role.PS, i)
            n = job.nodes.get((Role.PS, i))
            if n is None or n.handle is None or n.stopping_mono is not None:
                return False
            if any(o.role is Role.PS and o.node_id == i and o.action == "relaunch"
                   for o in new.overrides):  # fmt: skip
                return False
            if want == n.resources:
                continue
            if want.memory_mib != n.resources.memory_mib:
                return False
            changes.append((n, want))
        if not changes:
            return False  # nothing to resize: the change is elsewhere (e.g. an override moved)
        for n, want in changes:
            assert n.handle is not None
            if not job.backend.resize(n.handle, want):
                log.info("%s cannot be resized in place: a PS-set change instead", n.name)
                return False  # the set change replaces every PS, resized ones included
        for n, want in changes:
            job.resized(n, want)
        return True

    def oom_plan(self, n: Node) -> ResourcePlan | None:
        """The PS-OOM rule (faults/): more memory per PS when the load is unbalanced, else
        more PS, within the spec's constraints and quota."""
        job, st = self.job, self.job.st
        plan = job.current_plan
        used = []
        for (role, _i), m in job.nodes.items():
            if role is Role.PS:
                rec = st.node(Role.PS, m.node_id)
                used.append(float(rec.stats.get("rss_mib", 0.0)) if rec else 0.0)
        mine = st.node(Role.PS, n.node_id)
        if mine is not None:
            used[n.node_id if n.node_id < len(used) else -1] = max(
                float(mine.stats.get("rss_mib", 0.0)), float(n.resources.memory_mib)
            )
        decision = ps_oom_action(used or [float(n.resources.memory_mib)], job.faults)
        ps = decision.apply(plan.ps, memory_cap_mib=job.faults.oom_cap_mib)
        cap = job.spec.constraints.ps.max or ps.count
        if decision.action is PsOomAction.MORE_PS and min(ps.count, cap) == plan.ps.count:
            # at the PS cap: more memory per PS instead
            mem = min(job.faults.oom_cap_mib, plan.ps.resources.memory_mib * 2)
            ps = dataclasses.replace(
                plan.ps, resources=dataclasses.replace(ps.resources, memory_mib=mem)
            )
        elif decision.action is PsOomAction.MORE_PS:
            ps = dataclasses.replace(ps, count=min(ps.count, cap))
        candidate = plan.replace(
            ps=ps,
            stage=Stage.FAULT,
            reasons=(f"{n.name} OOM: {decision.reason}",),
            created_at_s=job.clock(),
        )
        if not candidate.total.fits_in(job.spec.quota.resources):
            return None
        return candidate

    # --- restores and the end ----------------------------------------------------------------
    def check_restores(self) -> None:
        """A PS that restored a state tagged S lost the updates of shards done after S: they
        are trained again (once per PS incarnation, persisted)."""
        job, st = self.job, self.job.st
        for (role, node_id), n in job.nodes.items():
            if role is not Role.PS:
                continue
            rec = st.node(Role.PS, node_id)
            if (
                rec is None
                or rec.incarnation != n.incarnation
                or rec.restored_seq is None
                or rec.restore_handled
            ):
                continue
            seq = int(rec.restored_seq)
            gen = st.generation(n.generation)
            # the frozen checkpoints of a planned change, restored before the new set serves:
            # a shard done after the tag had its last gradients applied before the freeze (in
            # the checkpoint) or held by its worker for the new set, so nothing is lost and
            # nothing is replayed (replaying would train it twice)
            frozen = (
                gen is not None
                and bool(gen.get("frozen"))
                and gen["state"] == GEN_STARTING
                and seq == int(gen["restore_seq"])
            )
            ids = (
                []
                if frozen
                else st.shards.requeue_done_after(
                    seq, f"{n.name} incarnation {n.incarnation} restored a state tagged {seq}"
                )
            )
            rec.restore_handled = True
            st.persist()
            if frozen:
                log.info(
                    "%s restored the frozen checkpoints tagged done_seq %d of a planned PS-set "
                    "change: nothing to replay",
                    n.name,
                    seq,
                )
            elif ids:
                log.warning(
                    "%s restored state tagged done_seq %d: %d shard(s) done after it are "
                    "trained again",
                    n.name,
                    seq,
                    len(ids),
                )
                st.record_fault(
                    {
                        "node": n.name,
                        "incarnation": n.incarnation,
                        "exit_class": "restore",
                        "action": "replay shards",
                        "why": f"restored a checkpoint tagged {seq}: {len(ids)} shard(s) again",
                    }
                )

    def checkpoint_for_stop(self) -> str:
        """Freeze and checkpoint the settled active set, tagged with the shard done_seq."""
        from dlrover_core.runtime.strategies.ps.control import checkpoint_set, freeze_set

        got = self.active_serving()
        if got is None or self.switch is not None:
            return "no settled PS set to checkpoint"
        serving, gone = got
        if not serving:
            return "no PS serving"
        freeze_set(serving, self.job.token, True)
        seq = self.job.st.shards.done_seq
        checkpoint_set(serving, self.job.token, seq)
        lost = f" ({', '.join(m.name for m in gone)} not serving)" if gone else ""
        return f"{len(serving)} PS checkpointed at done_seq {seq}{lost}"
