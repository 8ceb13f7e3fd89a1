"""``dlrover-oss``: the real open-source ``dlrover`` package's ``PSLocalOptimizer`` as a peer.

Optional: needs ``pip install dlrover==0.6.1``; when it cannot be imported the policy is not
registered (``DLROVER_OSS_UNAVAILABLE`` says why) and the runner skips it.

Driven the way DLRover's ``PSJobResourceOptimizer`` drives it, with the simulated clock instead
of ``time.time()``: ``CREATE`` at submission (1 PS + 1 worker), then at each replan the stage
machine ``WORKER_INITIAL -> PS_INITIAL -> PS_RUNNING`` (PS changes >= 3600 s apart; between
them the worker plan: sample phase once, after that ``WORKER_RUNNING``, which the local
optimizer answers with an empty plan). Runtime stats are fed as ``RuntimeMetric``s built from
our Observations. The job runs in DLRover's auto mode (the user set no counts), so its plans
are used as they come, after the package's own ``limit_resource_value`` clamps.

Notes on the package (0.6.1), handled here:
* ``LocalStatsReporter.singleton_instance`` is one process-wide instance whatever the uuid, so
  each job gets its own ``LocalStatsReporter`` assigned to the optimizer's ``_stats_collector``.
* the optimizer divides memory by 2^20 ("MB") on output, so memory is fed in bytes; the
  ``CREATE`` plan's memory comes back 0 (min(limit/5, 8192) bytes), which DLRover fills with
  its default node memory (8000 MB).
* OOM: ``generate_oom_recovery_plan`` (x2 memory), the increment capped at 8 GiB and the
  result at 64 GiB, as in ``PSJobResourceOptimizer._adjust_oom_*``.

All-reduce jobs (``JobView.strategy == "allreduce"``): DLRover's ``PSLocalOptimizer`` plans PS
jobs only; its all-reduce jobs (``dlrover-run``, torch elastic) run the node count and sizes the
user set, and are elastic on failure only: a failed node is relaunched (the group restarts),
an OOM one with the same memory rule as above. So the user's plan, never re-planned.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dlrover_core.sim.policies import (
    ExitClass,
    FixedInterval,
    JobView,
    RelaunchDecision,
)
from dlrover_core.types import (
    HistoryRecord,
    NodeOverride,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
    RolePlan,
    Sample,
    Stage,
)
from dlrover_core.units import bytes_from_mib, cores, millicores_from_cores

DLROVER_OSS_UNAVAILABLE: str | None = None
try:  # pragma: no cover - depends on the optional extra
    from dlrover.python.common.constants import JobOptStage, NodeType
    from dlrover.python.common.log import default_logger as _dlrover_logger
    from dlrover.python.common.node import Node, NodeResource
    from dlrover.python.master.resource.local_optimizer import PSLocalOptimizer
    from dlrover.python.master.stats.reporter import JobMeta, LocalStatsReporter
    from dlrover.python.master.stats.training_metrics import RuntimeMetric
    from dlrover.python.scheduler.job import ResourceLimits

    _dlrover_logger.setLevel(logging.ERROR)  # it logs every plan at INFO
except Exception as exc:
    DLROVER_OSS_UNAVAILABLE = f"dlrover not importable ({exc}); pip install dlrover==0.6.1"

_DEFAULT_MEMORY_MB = 8000
_SEC_TO_CHANGE_PS = 3600.0
_MAX_MEMORY_MB = 65536
_MAX_INCREMENT_MB = 8192


if DLROVER_OSS_UNAVAILABLE is None:

    class _OwnedMetric(RuntimeMetric):
        """A metric built here for one report and never mutated after: the package's
        ``LocalStatsReporter.report_runtime_stats`` deep-copies every metric it stores (its
        Node objects make that ~5 ms a report, most of this policy's simulated time), so the
        copy is the object itself. The reporter's own trimming logic runs unchanged."""

        def __deepcopy__(self, memo: dict[int, Any]) -> _OwnedMetric:
            return self


# our role -> (the package's node type, the node-name prefix), looked up once per node
_NODE_TYPE: dict[Role, tuple[Any, str]] = (
    {Role.PS: (NodeType.PS, Role.PS.value), Role.WORKER: (NodeType.WORKER, Role.WORKER.value)}
    if DLROVER_OSS_UNAVAILABLE is None
    else {}
)


class _JobState:
    def __init__(self, job: JobView) -> None:
        limits = ResourceLimits(job.quota.cpu_cores, bytes_from_mib(job.quota.memory_mib))
        self.opt = PSLocalOptimizer(job.name, limits)
        self.opt._stats_collector = LocalStatsReporter(JobMeta(job.name))
        self.stage = JobOptStage.WORKER_INITIAL
        self.last_ps_change = -math.inf
        self.worker_sampled = False
        self.reported_until = -1.0
        self.stats_since_change = 0
        self.errors = 0
        # the package's Node objects, one per observed (node, allocation, use): the optimizer
        # and the reporter only read them, and a node's use is constant between events, so
        # most reports repeat one (Node's constructor costs ~10 µs, reading the clock)
        self.nodes: dict[tuple[Role, int, int, int, int, int], Any] = {}


def _safe_plan(st: _JobState, stage: str) -> Any:
    """The package raises on some edge cases (e.g. ZeroDivisionError in
    ``_generate_ps_initial_resource`` when the latest stat has no PS); DLRover's master logs
    such errors and keeps the job running, so they count as an empty plan here."""
    try:
        return st.opt.generate_opt_plan(stage)
    except Exception:
        st.errors += 1
        return None


class DlroverOssPolicy(FixedInterval):
    name = "dlrover-oss"
    interval_s: float | None = 300.0
    uses_samples = False  # the package reads runtime stats (observations), not Samples
    min_stats = 3  # runtime metrics of the current node set before a plan is asked for

    def __init__(self) -> None:
        self._jobs: dict[str, _JobState] = {}

    def _state(self, job: JobView) -> _JobState:
        st = self._jobs.get(job.name)
        if st is None:
            st = self._jobs[job.name] = _JobState(job)
        return st

    def _translate(
        self, job: JobView, base: ResourcePlan, plan: Any, now_s: float, why: str
    ) -> ResourcePlan | None:
        if plan is None or plan.empty():
            return None
        plan.limit_resource_value()
        roles = {Role.WORKER: base.workers, Role.PS: base.ps}
        for ntype, role in ((NodeType.WORKER, Role.WORKER), (NodeType.PS, Role.PS)):
            g = plan.node_group_resources.get(ntype)
            if g is None or g.count <= 0:
                continue
            cur = roles[role].resources
            cpu = g.node_resource.cpu or cur.cpu_cores
            mem = g.node_resource.memory or _DEFAULT_MEMORY_MB
            roles[role] = RolePlan(
                int(g.count), NodeResources(millicores_from_cores(cpu), int(math.ceil(mem)))
            )
        overrides = list(base.overrides)
        for name, res in plan.node_resources.items():
            kind, _, idx = str(name).rpartition("-")
            role = Role.PS if kind == "ps" else Role.WORKER
            i = int(idx)
            if i >= roles[role].count:
                continue
            cur = roles[role].resources
            new = NodeResources(
                millicores_from_cores(res.cpu or cur.cpu_cores),
                int(math.ceil(res.memory)) if res.memory else cur.memory_mib,
            )
            overrides = [o for o in overrides if not (o.role is role and o.node_id == i)]
            overrides.append(NodeOverride(role, i, new, "dlrover-oss hot ps"))
        out = replace(
            base,
            workers=roles[Role.WORKER],
            ps=roles[Role.PS],
            overrides=tuple(o for o in overrides if o.node_id < roles[o.role].count),
            stage=Stage.SCALING,
            reasons=(why,),
            created_at_s=now_s,
        )
        # the quota is the job's ResourceLimits; drop workers if the plan overshoots it
        while not out.total.fits_in(job.quota) and out.workers.count > 1:
            out = replace(out, workers=RolePlan(out.workers.count - 1, out.workers.resources))
        if not out.total.fits_in(job.quota) or out.same_allocation(base):
            return None
        return out

    def initial_plan(
        self, job: JobView, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan:
        if job.strategy == "allreduce":
            return job.manual_plan  # DLRover's all-reduce: the user's nodes
        st = self._state(job)
        plan = st.opt.generate_opt_plan(JobOptStage.CREATE)
        base = ResourcePlan(
            workers=RolePlan(1, NodeResources(1000, _DEFAULT_MEMORY_MB)),
            ps=RolePlan(1, NodeResources(1000, _DEFAULT_MEMORY_MB)),
            stage=Stage.COLD_START,
        )
        out = self._translate(job, base, plan, now_s, "dlrover-oss: create")
        return out or base

    def _report(self, st: _JobState, observations: Sequence[Observation], batch: int) -> None:
        for obs in observations:
            if obs.time_s <= st.reported_until:
                continue
            nodes = []
            running = NodeState.RUNNING
            known = st.nodes
            for n in obs.nodes:
                if n.state is not running:
                    continue
                a = n.allocated
                key = (
                    n.role, n.node_id, a.cpu_millicores, a.memory_mib,
                    n.cpu_used_millicores, n.memory_used_mib,
                )  # fmt: skip
                node = known.get(key)
                if node is None:
                    ntype, prefix = _NODE_TYPE[n.role]
                    node = Node(
                        ntype,
                        n.node_id,
                        config_resource=NodeResource(a.cpu_cores, bytes_from_mib(a.memory_mib)),
                        name=f"{prefix}-{n.node_id}",
                    )
                    node.used_resource = NodeResource(
                        cores(n.cpu_used_millicores), bytes_from_mib(n.memory_used_mib)
                    )
                    if len(known) > 4096:
                        known.clear()
                    known[key] = node
                nodes.append(node)
            st.opt._stats_collector.report_runtime_stats(
                _OwnedMetric(
                    nodes, obs.samples_done // max(batch, 1), obs.throughput_sps, obs.time_s
                )
            )
            st.reported_until = obs.time_s
            st.stats_since_change += 1

    def replan(
        self,
        job: JobView,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None:
        if job.strategy == "allreduce":
            return None  # elastic on failure only
        st = self._state(job)
        self._report(st, observations, job.batch_size)
        if st.stats_since_change < self.min_stats:
            return None
        plan: Any = None
        why = ""
        if st.stage == JobOptStage.WORKER_INITIAL:
            plan = _safe_plan(st, JobOptStage.WORKER_INITIAL)
            st.stage, why = JobOptStage.PS_INITIAL, "dlrover-oss: worker initial"
        elif st.stage == JobOptStage.PS_INITIAL:
            plan = _safe_plan(st, JobOptStage.PS_INITIAL)
            st.stage, why = JobOptStage.PS_RUNNING, "dlrover-oss: ps initial"
            if plan is not None and not plan.empty():
                st.last_ps_change = now_s
        else:
            if now_s - st.last_ps_change > _SEC_TO_CHANGE_PS:
                plan = _safe_plan(st, JobOptStage.PS_RUNNING)
                why = "dlrover-oss: ps running"
                if plan is not None and not plan.empty():
                    st.last_ps_change = now_s
            if plan is None or plan.empty():
                stage = (
                    JobOptStage.WORKER_RUNNING if st.worker_sampled else JobOptStage.WORKER_INITIAL
                )
                st.worker_sampled = True
                plan = _safe_plan(st, stage)
                why = "dlrover-oss: worker running"
        out = self._translate(job, current, plan, now_s, why)
        if out is not None:
            st.stats_since_change = 0
        return out

    def on_node_exit(
        self,
        job: JobView,
        role: Role,
        node_id: int,
        exit_class: ExitClass,
        current: NodeResources,
        plan: ResourcePlan,
        relaunches: int,
    ) -> RelaunchDecision:
        if exit_class is not ExitClass.OOM:
            return RelaunchDecision(True, None, None, "relaunch")
        st = self._state(job)
        ntype = NodeType.PS if role is Role.PS else NodeType.WORKER
        node = Node(
            ntype,
            node_id,
            config_resource=NodeResource(current.cpu_cores, current.memory_mib),
            name=f"{role.value}-{node_id}",
        )
        rec = st.opt.generate_oom_recovery_plan([node], JobOptStage.PS_INITIAL)
        want = (
            rec.node_resources[node.name].memory if rec.node_resources else 2 * current.memory_mib
        )
        inc = min(want - current.memory_mib, _MAX_INCREMENT_MB)
        mem = int(min(current.memory_mib + inc, _MAX_MEMORY_MB))
        return RelaunchDecision(
            True, NodeResources(current.cpu_millicores, mem), None, "dlrover-oss oom x2 (<= +8Gi)"
        )
