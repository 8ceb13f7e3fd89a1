"""The `dlrover-rm` policy in the simulator: our planner and fault policies, seeing only what a
real master sees (samples, observations, exits, history).

All-reduce jobs go through the same ``Planner`` (its spec says ``strategy: allreduce``):
``Planner.replan`` runs the all-reduce stages 3 and 2 (``planner/allreduce.py``). Their model
needs two configurations or more, which production gets from the pipeline's profile step:
a first run (no speed samples in the history) asks the engine for the profile step's trials
(``profile_plans``: the first plan and the planner's sampling moves from it, as
``runtime/profiler.profile_configs`` picks them from DLRover's cold start)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dlrover_core.errors import DLRoverError
from dlrover_core.faults import (
    DEFAULT_FAULT_POLICY,
    ExitClass,
    FaultPolicy,
    PsOomAction,
    ps_oom_action,
)
from dlrover_core.model.selection import ModelChoice
from dlrover_core.model.throughput import ThroughputModel
from dlrover_core.planner import Planner, PlannerConfig
from dlrover_core.sim.policies import JobView, RelaunchDecision
from dlrover_core.sim.spec_bridge import job_view_to_spec
from dlrover_core.types import (
    HistoryRecord,
    NodeResources,
    Observation,
    ResourcePlan,
    Role,
    Sample,
    Stage,
)


@dataclass
class _Job:
    planner: Planner
    plans: list[ResourcePlan] = field(default_factory=list)
    ps_memory_seen: dict[int, int] = field(default_factory=dict)
    prior: list[Sample] = field(default_factory=list)  # from earlier runs (history)
    samples: list[Sample] = field(default_factory=list)  # this run's, all of them
    last_sample_s: float = float("-inf")
    next_check_s: float | None = None  # the planner's own pacing hint
    planner_errors: list[str] = field(default_factory=list)  # as the runtime records them


PER_CONFIG = 8  # speed samples kept per configuration (the most recent)
PROFILE_TRIALS = 4  # all-reduce first runs: trials of the profile step (the model's minimum)


def _bounded(samples: Sequence[Sample], per_config: int = PER_CONFIG) -> list[Sample]:
    """The most recent ``per_config`` samples of each configuration, in their order: more
    replicates of one configuration barely move the fit but cost every refit."""
    seen: dict[tuple[int, int, float, float], int] = {}
    keep: list[Sample] = []
    for s in reversed(samples):
        n = seen.get(s.config, 0)
        if n < per_config:
            seen[s.config] = n + 1
            keep.append(s)
    keep.reverse()
    return keep


class _CachedChoice:
    """The job's :class:`ModelChoice`, refitted only when the evidence changed: a new
    configuration, or one that has fewer than ``PER_CONFIG`` samples gained one (incremental:
    a full configuration's newest replicate does not trigger a refit)."""

    def __init__(self, form: str = "bottleneck") -> None:
        self.choice = ModelChoice(form)
        self._key: tuple[tuple[tuple[int, int, float, float], int], ...] | None = None
        self._hit: ThroughputModel | DLRoverError | None = None

    def __call__(
        self, samples: Sequence[Sample], strategy: str, batch_size: int
    ) -> ThroughputModel:
        counts: dict[tuple[int, int, float, float], int] = {}
        for s in samples:
            counts[s.config] = min(PER_CONFIG, counts.get(s.config, 0) + 1)
        key = tuple(sorted(counts.items()))
        if key != self._key or self._hit is None:
            try:
                self._hit = self.choice(samples, strategy, batch_size)
            except DLRoverError as e:
                self._hit = e
            self._key = key
        if isinstance(self._hit, DLRoverError):
            raise self._hit
        return self._hit

    def adopt(self, remembered: Any) -> bool:
        return self.choice.adopt(remembered)

    def remembered(self) -> dict[str, Any] | None:
        return self.choice.remembered()


class DLRoverRMPolicy:
    name = "dlrover-rm"
    interval_s: float | None = 60.0
    monitor_s: float = 300.0

    def __init__(
        self, config: PlannerConfig | None = None, faults: FaultPolicy = DEFAULT_FAULT_POLICY
    ) -> None:
        self.config = config
        self.faults = faults
        self._jobs: dict[str, _Job] = {}

    def _job(self, job: JobView) -> _Job:
        st = self._jobs.get(job.name)
        if st is None:
            spec = job_view_to_spec(job)
            cfg = self.config or PlannerConfig.from_spec(spec)
            st = self._jobs[job.name] = _Job(
                Planner(spec, cfg, model_factory=_CachedChoice(cfg.throughput_form))
            )
        return st

    def initial_plan(
        self, job: JobView, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan:
        st = self._job(job)
        key = st.planner.spec.signature_key
        recs = [
            dataclasses.replace(r, signature=key) for r in history if r.signature == job.signature
        ]
        plan = st.planner.initial_plan(recs, now_s)
        st.prior = _bounded(st.planner.history_samples(recs, now_s))
        st.plans.append(plan)
        return plan

    def profile_plans(self, job: JobView, plan: ResourcePlan) -> list[ResourcePlan]:
        """The profile step's trials for an all-reduce job without speed samples from earlier
        runs: its first plan, then the planner's sampling moves from it (one input at a time,
        distinct, inside the bounds and the quota), ``PROFILE_TRIALS`` in all. None for PS
        jobs (their planner samples live) or when history left samples."""
        st = self._job(job)
        if st.planner.spec.strategy_kind.has_ps or st.prior:
            return []
        return st.planner.trial_plans(plan, PROFILE_TRIALS)

    def replan(
        self,
        job: JobView,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None:
        st = self._job(job)
        if observations:
            for n in observations[-1].of(Role.PS):
                st.ps_memory_seen[n.node_id] = n.memory_used_mib
        fresh = False
        for s in samples:  # the engine keeps a bounded window; the master keeps them all
            ts = s.timestamp_s if s.timestamp_s is not None else now_s
            if ts > st.last_sample_s:
                st.samples.append(s)
                st.last_sample_s = ts
                fresh = True
        if fresh and len(st.samples) > 4 * PER_CONFIG:
            st.samples = _bounded(st.samples)
        if st.next_check_s is not None and now_s < st.next_check_s:
            # stage 2 said nothing can change before then without new evidence: only the
            # stage-3 watch (hot, pending, memory-bound nodes) runs in between
            d = st.planner.monitor(current, observations, now_s, st.plans)
        elif not st.planner.spec.strategy_kind.has_ps:
            # the runtime's ``JobMaster.call_planner``: a planner error never fails a job, the
            # plan is kept and the next interval tries again (recorded, as in report.json)
            try:
                d = st.planner.replan(current, observations, st.samples, now_s, st.plans, st.prior)
            except DLRoverError as e:
                st.planner_errors.append(f"{now_s:.0f}: {type(e).__name__}: {e.message}")
                return None
            st.next_check_s = d.next_check_s
        else:
            d = st.planner.replan(current, observations, st.samples, now_s, st.plans, st.prior)
            st.next_check_s = d.next_check_s
        if d.plan is not None:
            st.plans.append(d.plan)
            st.next_check_s = None  # a new configuration: stage 2 looks at it afresh
        return d.plan

    def history_extra(self, job: JobView) -> dict[str, Any]:
        """What the run leaves in the history besides what the engine records: the model
        form its planner chose (the runtime stores the same, ``report["model_choice"]``)."""
        st = self._jobs.get(job.name)
        choice = st.planner.model_choice() if st is not None else None
        out: dict[str, Any] = {"model_choice": choice} if choice is not None else {}
        if st is not None and st.planner_errors:
            out["planner_errors"] = len(st.planner_errors)
        if st is not None and not st.planner.spec.strategy_kind.has_ps:
            # the master's samples of the whole run (the runtime records them all; the
            # engine's are the last window only): an all-reduce run's profiled
            # configurations reach its next run's fit. PS runs keep the engine's (unchanged)
            out["samples"] = tuple(st.samples)
        return out

    def next_call_s(self, job: JobView, now_s: float) -> float | None:
        """Every sample window while the planner waits for speed samples; when it says
        nothing can change before a time, then (at most ``monitor_s`` later: stage 3 still
        watches for hot, pending and memory-bound nodes)."""
        step = self.interval_s or 60.0
        st = self._jobs.get(job.name)
        hint = st.next_check_s if st is not None else None
        if hint is None:
            return now_s + step
        return min(max(hint, now_s + step), now_s + self.monitor_s)

    def on_resize(self, job: JobView, downtime_s: float) -> None:
        """An all-reduce resize took ``downtime_s``: the planner prices the next on it, as
        the runtime's strategy tells it after each resize."""
        self._job(job).planner.record_resize(downtime_s)

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
        st = self._job(job)
        st.next_check_s = None  # an exit is new evidence: the next call re-plans in full
        rule = self.faults.decide(
            role, exit_class, current, plan.node_resources(role, node_id), relaunches
        )
        if role is Role.PS and exit_class is ExitClass.OOM and rule.relaunch:
            # the runtime's PS-OOM rule (controller._ps_oom): the PS memory seen, the OOMed
            # one at least at its limit; more PS at the PS cap become more memory per PS
            seen = dict(st.ps_memory_seen)
            seen[node_id] = max(seen.get(node_id, 0), current.memory_mib)
            act = ps_oom_action([float(v) for v in seen.values()], self.faults)
            new_ps = act.apply(plan.ps, memory_cap_mib=self.faults.oom_cap_mib)
            cap = st.planner.bounds.ps.max_count or new_ps.count
            if act.action is PsOomAction.MORE_PS and min(new_ps.count, cap) == plan.ps.count:
                mem = min(self.faults.oom_cap_mib, plan.ps.resources.memory_mib * 2)
                new_ps = dataclasses.replace(
                    plan.ps, resources=dataclasses.replace(new_ps.resources, memory_mib=mem)
                )
            elif act.action is PsOomAction.MORE_PS:
                new_ps = dataclasses.replace(new_ps, count=min(new_ps.count, cap))
            if not plan.replace(ps=new_ps).total.fits_in(st.planner.bounds.quota):
                new_ps = plan.ps  # no room in the quota: fall back to the node's memory bump
            if new_ps != plan.ps:
                new = plan.replace(
                    ps=new_ps,
                    stage=Stage.FAULT,
                    reasons=(f"ps-{node_id} OOM: {act.reason}",),
                    created_at_s=plan.created_at_s,
                )
                st.plans.append(new)
                return RelaunchDecision(True, None, new, act.reason)
        d = rule
        if not d.relaunch:
            return RelaunchDecision(False, None, None, d.reason)
        return RelaunchDecision(True, d.resources, None, d.reason)
