"""The three-stage planner: pure functions of (spec, history, samples, observations, clock).

stage 1  initial_plan():  warm start from runs of the signature, else from similar jobs'
                          runs (planner/similar.py), else cold start
stage 2  replan():        sampling configurations, then model-based scaling
stage 3  replan():        post-scaling on instability (runs first: it is urgent)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlrover_core.allreduce_config import AllReduceOptions
from dlrover_core.errors import DLRoverError
from dlrover_core.model.selection import ModelChoice, ModelFactory
from dlrover_core.model.throughput import (
    AllReduceThroughputModel,
    PSBottleneckThroughputModel,
    ThroughputModel,
)
from dlrover_core.planner import scaling
from dlrover_core.planner.allreduce import (
    ResizeCost,
    allreduce_post_scale,
    allreduce_scale,
    rank_ladder,
)
from dlrover_core.planner.bounds import JobBounds, ceil_mib, round_up_level
from dlrover_core.planner.config import PlannerConfig
from dlrover_core.planner.memory_sizing import (
    ObservedMemory,
    PSMemoryFit,
    fit_ps_memory,
    ps_memory_from_fit,
    worker_memory_mib,
)
from dlrover_core.planner.post_scaling import (
    StragglerMemo,
    capacity_cap,
    post_scale,
    ps_memory_along,
)
from dlrover_core.planner.similar import SimilarConfig
from dlrover_core.planner.warm_start import similar_runs, stage_one
from dlrover_core.spec import JobSpec
from dlrover_core.types import (
    HistoryRecord,
    NodeResources,
    Observation,
    ResourcePlan,
    Role,
    RolePlan,
    Sample,
    Stage,
)
from dlrover_core.units import cores

SAMPLE_ACTION = "sample:"
REVERT_ACTION = "revert"
BOTTLENECK_ACTION = "bottleneck"
BEST_MEASURED_ACTION = "best_measured"
STALL_ACTION = "stall_probe"
MEMORY_ACTION = "memory_shrink"


# before the job runs, more PS than the base (warm) plan get at least this share of its
# memory per PS: its memory is the last run's peak × margin, and how much of that is a fixed
# part that more PS do not spread is unknown (at 0.75, a warm 5 × 2048 MiB PS moved to
# 8 × 1536: five PS OOMs at the start; issue 10, session 8)
BASE_PS_MEMORY_FLOOR = 1.0


@dataclass(frozen=True)
class PlanDecision:
    """``plan`` is the new plan, or None to keep the current one; ``notes`` say why."""

    plan: ResourcePlan | None
    notes: tuple[str, ...] = ()
    model: ThroughputModel | None = None
    # no new plan can come before this time unless something new is observed (a sample of
    # a new configuration, an exit, a hot node): callers may pace their calls on it. None:
    # the next speed samples may already change the decision.
    next_check_s: float | None = None


class Planner:
    def __init__(
        self,
        spec: JobSpec,
        config: PlannerConfig | None = None,
        *,
        model_factory: ModelFactory | None = None,
        similar: SimilarConfig | None = SimilarConfig(),
    ) -> None:
        self.spec = spec
        self.config = config or PlannerConfig.from_spec(spec)
        # stage 1 for a new signature: the runs of similar jobs (None: never)
        self.similar = similar
        # what an all-reduce resize costs (stage 2 of all-reduce jobs): the run's measured
        # resizes (``record_resize``), on a prior that ``learn_pauses`` may set from history
        self.resize_cost = ResizeCost()
        self.spec_bounds = JobBounds.from_spec(spec)
        self.bounds = self.spec_bounds  # narrowed by what the cluster could not schedule
        self.model_factory: ModelFactory = model_factory or ModelChoice(self.config.throughput_form)
        # memory fits of the latest observations, reused within and across calls until a
        # new observation arrives (keyed on its time and the window's length)
        self._memo_key: tuple[int, float, float] | None = None
        self._memo: tuple[PSMemoryFit, int] | None = None
        # each observation summarised once (the window slides by one per call): keyed on
        # id() with the object kept, so a recycled id never matches
        self._summary: dict[int, tuple[Observation, ObservedMemory]] = {}
        self._last_summaries: list[ObservedMemory] = []
        # grid searches of the latest model (a model is kept until the evidence changes, and
        # the same grid with the same memory per node gives the same result)
        self._search_memo = scaling.SearchMemo()
        self._stragglers: StragglerMemo = {}

    def _summaries(self, observations: Sequence[Observation]) -> list[ObservedMemory]:
        old = self._summary
        new: dict[int, tuple[Observation, ObservedMemory]] = {}
        out: list[ObservedMemory] = []
        for o in observations:
            hit = old.get(id(o))
            if hit is None or hit[0] is not o:
                hit = (o, ObservedMemory.of(o, self.config.worker_stable_s))
            new[id(o)] = hit
            out.append(hit[1])
        self._summary = new
        return out

    def _straggler_memo(self, observations: Sequence[Observation]) -> StragglerMemo:
        """The stragglers of the observations still in the window (older ones dropped)."""
        live = {id(o) for o in observations}
        for k in [k for k in self._stragglers if k not in live]:
            del self._stragglers[k]
        return self._stragglers

    def _memory_fits(self, observations: Sequence[Observation]) -> tuple[PSMemoryFit, int]:
        key = (
            (len(observations), observations[0].time_s, observations[-1].time_s)
            if observations
            else (0, 0.0, 0.0)
        )
        if self._memo is None or key != self._memo_key:
            sums = self._summaries(observations)
            self._memo = (
                fit_ps_memory(self.spec, sums),
                worker_memory_mib(self.spec, sums, self.config.worker_memory_margin),
            )
            self._memo_key = key
            self._last_summaries = sums
        return self._memo

    # --- stage 1 ------------------------------------------------------------------------
    def initial_plan(
        self, history: Sequence[HistoryRecord] = (), now_s: float = 0.0
    ) -> ResourcePlan:
        """Stage 1; when similar runs left speed samples that identify the model, the warm
        start is refined by the model at once (no sampling needed for a recurring job). A
        new signature starts from the runs of similar jobs (``similar``), refined the same way
        from their samples when ``similar.refine``; their samples fit only this first plan
        (``history_samples`` keeps to the signature's own runs)."""
        base, runs = stage_one(self.spec, history, self.config, now_s, self.similar)
        own = bool(runs) and runs[0].signature == self.spec.signature_key
        refine = own or (self.similar is not None and self.similar.refine)
        prior = _samples_of(runs) if refine else []
        if not prior:
            return self._prior_start(base) if base.stage is Stage.COLD_START else base
        self._adopt_model_choice(runs)
        model, _ = self._fit(prior)
        if model is None or not model.trustworthy(self.config.max_trust_rel_error):
            return base
        res = self._search(model, base, (), scaling.SearchLimits(), memory_from=base)
        whose = "earlier runs" if own else "the similar jobs' runs"
        plan = self._scaled_plan(
            base, res, model, now_s, prefix=f"model from {len(prior)} samples of {whose}"
        )
        return plan.replace(stage=base.stage, reasons=(*base.reasons, *plan.reasons))

    def _prior_start(self, base: ResourcePlan) -> ResourcePlan:
        """A PS job's first run with the counts and CPUs that maximise the objective under
        the bottleneck model at its prior centres (``cold_start: prior``): PS memory as
        DLRover's cold start sizes it, worker memory at ``prior_start_worker_memory_mib``
        (what the job will use is not known yet). The rate is
        unknown before the first sample, and the objective's best configuration does not
        depend on it. The shape comes from the priors alone, so the objective is more
        frugal here (``prior_start_elasticity`` > ``min_elasticity``): past the knee the
        cost is certain and the gain is not; the first samples correct it as usual."""
        cfg = self.config
        if (
            cfg.cold_start != "prior"
            or cfg.throughput_form != "bottleneck"
            or not self.spec.strategy_kind.has_ps
            or base.ps.count == 0
        ):
            return base
        model = PSBottleneckThroughputModel.from_priors(
            scaling.plan_key(base), self.spec.training.batch_size
        )
        theta = cfg.prior_start_elasticity
        # worker memory: the prior start's size (under DLRover's 8 GiB the memory quota and
        # the memory's price favour few, fat workers), never above the cold start's; the
        # search sizing from this plan floors it at the spec's estimate. What a worker
        # measures later resizes it
        bw = base.workers
        w_mem = min(bw.resources.memory_mib, cfg.prior_start_worker_memory_mib)
        sized = base.replace(
            workers=RolePlan(bw.count, NodeResources(bw.resources.cpu_millicores, w_mem))
        )
        res = self._search(model, sized, (), scaling.SearchLimits(), sized, theta)
        w, p = res.workers, res.ps
        if (w, p) == (base.workers, base.ps):
            return base
        x0 = res.current_throughput_sps
        ratio = f", {res.throughput_sps / x0:.1f}× the default's speed by it" if x0 > 0 else ""
        return base.replace(
            workers=w,
            ps=p,
            reasons=(
                *base.reasons,
                f"prior-optimal start instead: {w.count} worker(s) × "
                f"{w.resources.cpu_cores:g} CPU × {w.resources.memory_mib} MiB, {p.count} PS × "
                f"{p.resources.cpu_cores:g} CPU maximise log(throughput) − {theta}·log(cost) over "
                f"{res.evaluated} configurations under the bottleneck model at its prior "
                f"centres (no sample yet; the best configuration does not depend on the "
                f"unknown rate){ratio}",
            ),
        )

    def _adopt_model_choice(self, runs: Sequence[HistoryRecord]) -> None:
        """The newest of the similar ``runs`` with a model-form choice (``extra
        ["model_choice"]``, from :meth:`model_choice`) seeds this run's, when the model
        factory remembers one."""
        adopt = getattr(self.model_factory, "adopt", None)
        with_choice = [r for r in runs if "model_choice" in r.extra]
        if adopt is not None and with_choice:
            adopt(max(with_choice, key=lambda r: r.finished_at_s).extra["model_choice"])

    def model_choice(self) -> dict[str, Any] | None:
        """The model form this run chose and from which configurations (JSON), for the
        history: the next run of the job starts from it. None when nothing was chosen."""
        remembered = getattr(self.model_factory, "remembered", None)
        return remembered() if remembered is not None else None

    def learn_pauses(self, history: Sequence[HistoryRecord], now_s: float = 0.0) -> list[str]:
        """Price plan changes at what they cost similar past runs (their ``extra["pauses"]``,
        by kind), not the constants; returns what it learnt, one line each (empty: the
        constants stay, or the spec sets the pauses)."""
        measured: dict[str, list[float]] = {}
        for r in similar_runs(self.spec, history, now_s, self.config.history_window_s):
            for kind, values in dict(r.extra.get("pauses") or {}).items():
                measured.setdefault(str(kind), []).extend(float(v) for v in values)
        self.config, notes = self.config.with_measured_pauses(self.spec, measured)
        if not self.spec.strategy_kind.has_ps and measured.get("worker"):
            # an all-reduce change is a resize of the group: its prior is what they cost
            self.resize_cost = dataclasses.replace(
                self.resize_cost, prior_s=self.config.worker_change_pause_s
            )
        return notes

    def record_resize(self, downtime_s: float) -> None:
        """An all-reduce resize of this run took ``downtime_s``: later ones are priced on it."""
        self.resize_cost = self.resize_cost.record(downtime_s)

    def trial_plans(self, base: ResourcePlan, n: int) -> list[ResourcePlan]:
        """``base`` and the sampling moves from it, distinct and inside the bounds and the
        quota, ``n`` in all at most: the trials of a profile step (one input at a time; an
        all-reduce job's rank ladder, :func:`~dlrover_core.planner.allreduce.rank_ladder`)."""
        plans = [base]
        seen = {scaling.plan_key(base)}
        moves = (
            scaling.sampling_candidates(base, self.bounds, self.config, ())
            if self.spec.strategy_kind.has_ps
            else rank_ladder(base, self.config.cpu_levels_millicores)
        )
        for w, p, what in moves:
            if self.bounds.over_quota(w, p):  # a trial squeezed into the quota: not this move
                continue
            w2, p2, _ = self.bounds.fit(w, p)
            cand = base.replace(workers=w2, ps=p2, stage=Stage.SAMPLING, reasons=(what,))
            if scaling.plan_key(cand) in seen:
                continue
            seen.add(scaling.plan_key(cand))
            plans.append(cand)
            if len(plans) >= n:
                break
        return plans

    def history_samples(self, history: Sequence[HistoryRecord], now_s: float = 0.0) -> list[Sample]:
        """Speed samples that similar past runs recorded (``extra["samples"]``)."""
        return _samples_of(similar_runs(self.spec, history, now_s, self.config.history_window_s))

    def offline_plan(
        self,
        samples: Sequence[Sample] = (),
        history: Sequence[HistoryRecord] = (),
        now_s: float = 0.0,
    ) -> ResourcePlan:
        """Stage 1, then stage 2 on profiled samples when they identify the model (the
        pipeline's plan step: no pacing, no step limits — the job has not started)."""
        base = self.initial_plan(history, now_s)
        if not samples:
            return base
        self.learn_pauses(history, now_s)
        prior = self.history_samples(history, now_s)  # every sample counts: past runs' too
        model, why = self._fit([*prior, *samples])
        if model is None:
            return base.replace(reasons=(*base.reasons, f"samples not used: {why}"))
        res = self._search(model, base, (), scaling.SearchLimits(), memory_from=base)
        used = f"from {len(samples)} profiled samples"
        if prior:
            used += f" and {len(prior)} of similar past runs"
        return self._scaled_plan(base, res, model, now_s, prefix=used)

    # --- stages 2 and 3 -------------------------------------------------------------------
    def replan(
        self,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
        past_plans: Sequence[ResourcePlan] = (),
        prior_samples: Sequence[Sample] = (),
    ) -> PlanDecision:
        """``samples`` are this run's; ``prior_samples`` (e.g. from similar past runs) only
        help fit the model. A change is proposed only when the time it is predicted to save
        (on the model's lower band, calibrated to the measured speed) beats its pause. A
        PS memory raise that could wait rides along with the change (``ps_memory_along``)."""
        if not self.spec.strategy_kind.has_ps:
            return self._replan_allreduce(current, observations, samples, now_s, prior_samples)
        self.bounds = capacity_cap(self.spec_bounds, [*past_plans, current])
        d = self._replan(current, observations, samples, now_s, past_plans, prior_samples)
        if d.plan is None:
            shrunk = self._memory_shrink(current, observations, samples, now_s)
            if shrunk is not None:
                d = PlanDecision(shrunk, d.notes, d.model)
        return self._memory_along(current, observations, d)

    def _replan_allreduce(
        self,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
        prior_samples: Sequence[Sample],
    ) -> PlanDecision:
        """Stages 3 and 2 of an all-reduce job (ranks, no PS: ``planner/allreduce.py``), with
        this planner's model choice (the all-reduce form, fitted on this run's and similar
        runs' samples), its objective (``min_elasticity``, ``memory_gib_per_core``) and its
        resize price (``resize_cost``: this run's measured resizes, else what similar runs'
        worker changes cost, else the prior)."""
        options = AllReduceOptions.from_spec(self.spec)
        urgent = allreduce_post_scale(
            self.spec, current, observations, now_s=now_s, options=options
        )
        if urgent is not None:
            return PlanDecision(urgent, ("stage 3",))
        if not samples or not observations:
            return PlanDecision(None, ("waiting for speed samples",))
        try:
            model, why = self._fit([*prior_samples, *samples])
        except (ValueError, np.linalg.LinAlgError) as e:  # too few distinct configurations
            model, why = None, f"all-reduce model not fitted yet: {e}"
        if not isinstance(model, AllReduceThroughputModel):
            return PlanDecision(None, (why or "all-reduce model not fitted yet",))
        obs = observations[-1]
        total = self.spec.data.rows * (self.spec.training.epochs or 1)
        cfg = self.config
        d = allreduce_scale(
            model,
            self.spec,
            current,
            current_sps=obs.throughput_sps,
            remaining_samples=max(0.0, float(total - obs.samples_done)),
            resize_cost=self.resize_cost,
            options=options,
            min_elasticity=cfg.min_elasticity,
            memory_gib_per_core=cfg.memory_gib_per_core,
            measured={(k[0], k[2]): v for k, v in _steady_speeds(samples).items()},
        )
        return PlanDecision(d.plan, (d.reason,), model)

    def _memory_shrink(
        self,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None:
        """No other move: memory per node the job measurably does not need, given back when
        the saving pays for the restart (``memory_shrink_below``). Workers: max used ×
        margin; PS: the memory fit's busiest PS at the end of training × margin. Only from
        a settled configuration of this run (its speed samples taken), never over per-node
        overrides (an OOM raise of one node stays), and the need is what a later raise
        would size too, so a shrink is not undone without new evidence."""
        cfg, bounds = self.config, self.bounds
        if (
            cfg.memory_shrink_below <= 0
            or not self.spec.strategy_kind.has_ps
            or not observations
            or current.stage is Stage.SAMPLING
            or current.overrides
            or now_s - current.created_at_s < cfg.replan_interval_s
        ):
            return None
        here = scaling.samples_at(samples, scaling.plan_key(current))
        left_s = _remaining_s(observations, here)
        if len(here) < cfg.min_speed_samples or not left_s:
            return None
        fit, w_need = self._memory_fits(observations)
        workers, ps = current.workers, current.ps
        notes: list[str] = []
        have = workers.resources.memory_mib
        if bounds.workers.pinned_memory_mib is None and w_need < cfg.memory_shrink_below * have:
            w_cpu = workers.resources.cpu_millicores
            workers = RolePlan(workers.count, NodeResources(w_cpu, w_need))
            notes.append(f"worker memory {have} → {w_need} MiB (max used × margin)")
        have = ps.resources.memory_mib
        if ps.count and bounds.ps.pinned_memory_mib is None:
            p_need = ceil_mib(self._fitted_ps_memory(fit, ps.count, self._last_summaries[-1:]))
            if p_need < cfg.memory_shrink_below * have:
                ps = RolePlan(ps.count, NodeResources(ps.resources.cpu_millicores, p_need))
                notes.append(
                    f"PS memory {have} → {p_need} MiB (busiest PS at the end of training × "
                    f"margin, memory model {fit.source})"
                )
        workers, ps, _ = bounds.fit(workers, ps)
        if (workers, ps) == (current.workers, current.ps):
            return None
        g = cfg.memory_gib_per_core
        saved = 1.0 - _plan_cost(workers, ps, g) / _plan_cost(current.workers, current.ps, g)
        gain = -cfg.min_elasticity * math.log1p(-saved)  # θ·Δlog cost
        pause = cfg.ps_change_pause_s if ps != current.ps else cfg.worker_change_pause_s
        if gain < 2 * pause / left_s:
            return None
        return current.replace(
            workers=workers,
            ps=ps,
            stage=Stage.SCALING,
            created_at_s=now_s,
            action=MEMORY_ACTION,
            reasons=(
                f"memory right-sizing: {'; '.join(notes)}; cost −{saved:.0%} for a "
                f"{pause:.0f} s pause with ~{left_s / 60:.0f} min left",
            ),
        )

    def _memory_along(
        self, current: ResourcePlan, observations: Sequence[Observation], d: PlanDecision
    ) -> PlanDecision:
        if d.plan is None:
            return d
        fit = self._memory_fits(observations)[0]
        plan = ps_memory_along(self.config, self.bounds, current, d.plan, observations, fit)
        return d if plan is d.plan else dataclasses.replace(d, plan=plan)

    def _replan(
        self,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
        past_plans: Sequence[ResourcePlan],
        prior_samples: Sequence[Sample],
    ) -> PlanDecision:
        cfg = self.config
        urgent = post_scale(
            self.spec,
            cfg,
            current,
            observations,
            now_s,
            past_plans=past_plans,
            ps_fit=self._memory_fits(observations)[0],
            bounds=self.bounds,
            straggler_memo=self._straggler_memo(observations),
        )
        if urgent is not None:
            return PlanDecision(urgent)
        here = scaling.samples_at(samples, scaling.plan_key(current))
        settle = now_s + cfg.replan_interval_s
        # a sampling configuration only needs its speed samples, not the re-plan interval
        if (
            current.stage is not Stage.SAMPLING
            and now_s - current.created_at_s < cfg.replan_interval_s
        ):
            return PlanDecision(
                None,
                ("paced: re-plan interval not over",),
                next_check_s=current.created_at_s + cfg.replan_interval_s,
            )
        if len(here) < cfg.min_speed_samples:
            return PlanDecision(
                None,
                (f"waiting for speed samples ({len(here)}/{cfg.min_speed_samples})",),
                next_check_s=_samples_due(samples, here, cfg.min_speed_samples, now_s),
            )
        reverted = self._deceleration_guard(current, samples, past_plans, now_s)
        if reverted is not None:
            return PlanDecision(reverted)
        model, why = self._fit([*prior_samples, *samples])
        left_s = _remaining_s(observations, here)
        may_sample = left_s is None or left_s >= cfg.min_remaining_to_sample_s
        trusted = model is not None and model.trustworthy(cfg.max_trust_rel_error)
        note = why or "model not trustworthy yet"
        if model is not None and trusted:
            plan, note, unblocked_s = self._model_move(model, current, observations, samples,
                                                       here, past_plans, now_s, left_s)  # fmt: skip
            if plan is not None:
                return PlanDecision(plan, (), model)
            probe = self._stall_probe(current, [*prior_samples, *samples], observations,
                                      past_plans, now_s, left_s, note)  # fmt: skip
            if probe is not None:
                return PlanDecision(probe, (note,), model)
            # full rank is not enough: the features see workers only through w/p, so a fit
            # on one worker count can identify every coefficient yet predict no other count
            if model.full_rank_ and not model.fixed_inputs_:
                due = self._recheck_s(now_s, now_s - current.created_at_s, left_s, unblocked_s)
                return PlanDecision(None, (note,), model, next_check_s=due)
        # no model, an untrusted one, or a partial one that finds nothing worth a change in
        # its span: sample an input it never saw vary (configurations past runs measured
        # count as sampled), while enough time is left for the sample to pay back
        nxt = None
        if may_sample:
            nxt = self._next_sample(
                current, [*prior_samples, *samples], observations, past_plans, now_s, note,
                model.fixed_inputs_ if model is not None else None,
            )  # fmt: skip
        if nxt is None and not trusted:
            # no model to trust and nothing left to sample: DLRover's closed-form rules
            # still see a bottleneck the job measures (every PS hot; PS idle with workers
            # waiting on nothing): act on it rather than keep a slow configuration
            nxt = self._bottleneck_move(current, [*prior_samples, *samples], observations,
                                        past_plans, now_s, left_s, note)  # fmt: skip
        if nxt is None and not trusted:
            # nothing to sample and no rule applies: never stay clearly slower than a
            # configuration this run measured (a sample can be a plain downgrade, e.g. PS at
            # half the CPU when the quota or the PS cap leaves their count unchanged)
            nxt = self._best_measured(current, samples, here, past_plans, now_s, left_s, note)
        return PlanDecision(nxt, (note,), model, next_check_s=None if nxt is not None else settle)

    def _bottleneck_move(
        self,
        current: ResourcePlan,
        samples: Sequence[Sample],
        observations: Sequence[Observation],
        past_plans: Sequence[ResourcePlan],
        now_s: float,
        left_s: float | None,
        why: str,
    ) -> ResourcePlan | None:
        """The first of DLRover's bottleneck moves (all PS hot: more PS CPU or PS; PS well
        under their target: more workers) that fits the quota, was not measured yet and
        leaves enough time to pay back its pause."""
        cfg = self.config
        if not observations or self.bounds.ps.max_count == 0:
            return None
        if left_s is not None and left_s < cfg.min_remaining_to_sample_s:
            return None
        ps_nodes = observations[-1].of(Role.PS)
        if not ps_nodes:
            return None
        seen = {scaling.sample_key(s) for s in samples}
        avoid = abandoned_keys([*past_plans, current])
        for w, p, what in scaling.bottleneck_candidates(current, self.bounds, cfg, observations):
            w2, p2, _ = self.bounds.fit(w, p)
            key = scaling.roles_key(w2, p2)
            if key in seen or key in avoid or key == scaling.plan_key(current):
                continue
            return current.replace(
                workers=w2,
                ps=p2,
                overrides=(),
                stage=Stage.SCALING,
                reasons=(f"bottleneck rule: {what} ({why})",),
                predicted_throughput_sps=None,
                created_at_s=now_s,
                action=BOTTLENECK_ACTION,
            )
        return None

    def _stall_probe(
        self,
        current: ResourcePlan,
        samples: Sequence[Sample],
        observations: Sequence[Observation],
        past_plans: Sequence[ResourcePlan],
        now_s: float,
        left_s: float | None,
        why: str,
    ) -> ResourcePlan | None:
        """The model finds nothing worth a move, yet neither side is busy: the busiest PS and
        the average worker use under ``stall_util`` of their CPU (and the busiest PS at least
        ``stall_min_ps_util``: a PS that idles is not what binds). What bounds the speed then
        is what CPU does not show (the network, a hot shard), which only more PS relieve, and
        a model that saw the PS count vary little reads that as "PS do not help". Measure
        twice the PS (again only while that pays, see :meth:`_stall_paid`), while enough
        time is left to pay the pause back many times over; a slower result is reverted as
        any move."""
        cfg = self.config
        # a probe that speeds the job up by a few percent must pay back its pause: enough time
        # left for ~30 PS pauses (an hour at the default 120 s)
        need_s = max(cfg.stall_min_left_s, 30 * cfg.ps_change_pause_s)
        if left_s is None or left_s < need_s or not observations:
            return None
        if not self._stall_paid(samples, past_plans):
            return None
        last = observations[-1]
        ps_nodes, w_nodes = last.of(Role.PS), last.of(Role.WORKER)
        if not ps_nodes or not w_nodes or current.ps.count == 0:
            return None
        w_util = sum(n.cpu_util for n in w_nodes) / len(w_nodes)
        busiest = max(n.cpu_util for n in ps_nodes)
        if busiest >= cfg.stall_util or w_util >= cfg.stall_util:
            return None
        if busiest < cfg.stall_min_ps_util:
            return None
        want = RolePlan(2 * current.ps.count, current.ps.resources)
        w2, p2, _ = self.bounds.fit(current.workers, want)
        if p2.count <= current.ps.count or w2 != current.workers:
            return None
        key = scaling.roles_key(w2, p2)
        seen = {scaling.sample_key(s) for s in samples}
        if key in seen or key in abandoned_keys([*past_plans, current]):
            return None
        return current.replace(
            ps=p2,
            overrides=(),
            stage=Stage.SCALING,
            reasons=(
                f"neither side busy (busiest PS {busiest:.0%}, "
                f"workers {w_util:.0%} of their CPU): measure {p2.count} PS ({why})",
            ),
            predicted_throughput_sps=None,
            created_at_s=now_s,
            action=STALL_ACTION,
        )

    def _stall_paid(self, samples: Sequence[Sample], past_plans: Sequence[ResourcePlan]) -> bool:
        """May the run probe again? Up to ``stall_probes`` times, each after one that measured
        at least ``stall_min_gain`` faster than the configuration it left (a hot shard needs
        as many PS as halve its share until it stops binding)."""
        plans = list(past_plans)
        probes = [i for i, p in enumerate(plans) if p.action == STALL_ACTION]
        if not probes:
            return True
        if len(probes) >= self.config.stall_probes or probes[-1] == 0:
            return False
        speeds = _mean_speeds(samples)
        after = speeds.get(scaling.plan_key(plans[probes[-1]]))
        before = speeds.get(scaling.plan_key(plans[probes[-1] - 1]))
        if after is None or before is None:
            return False
        return after / before - 1.0 >= self.config.stall_min_gain

    def _best_measured(
        self,
        current: ResourcePlan,
        samples: Sequence[Sample],
        here: Sequence[Sample],
        past_plans: Sequence[ResourcePlan],
        now_s: float,
        left_s: float | None,
        why: str,
    ) -> ResourcePlan | None:
        """Back to the fastest configuration this run measured, when it was at least
        ``faster_min_speedup`` faster than the current one's measured speed and the time it
        saves beats its pause (as :meth:`_worth_it`, on measured speeds)."""
        cfg = self.config
        x_now = _mean_tput(here)
        if x_now is None or x_now <= 0 or left_s is None:
            return None
        cur_key = scaling.plan_key(current)
        avoid = abandoned_keys([*past_plans, current])
        best = max(
            ((x, k) for k, x in _mean_speeds(samples).items() if k != cur_key and k not in avoid),
            default=None,
        )
        if best is None or best[0] < x_now * (1 + cfg.faster_min_speedup):
            return None
        x_best, key = best
        prev = next((p for p in reversed(past_plans) if scaling.plan_key(p) == key), None)
        if prev is None:
            return None
        w = RolePlan(prev.workers.count, dataclasses.replace(
            prev.workers.resources,
            memory_mib=max(prev.workers.resources.memory_mib, current.workers.resources.memory_mib),
        ))  # fmt: skip
        p = RolePlan(prev.ps.count, dataclasses.replace(
            prev.ps.resources,
            memory_mib=max(prev.ps.resources.memory_mib, current.ps.resources.memory_mib),
        ))  # fmt: skip
        w2, p2, _ = self.bounds.fit(w, p)
        if (w2, p2) != (w, p):
            return None
        pause = cfg.ps_change_pause_s if p != current.ps else cfg.worker_change_pause_s
        saved = left_s - (pause + left_s * x_now / x_best)
        need = max(cfg.min_saved_fraction * left_s, cfg.min_saved_pause_multiple * pause)
        if saved < need:
            return None
        return current.replace(
            workers=w,
            ps=p,
            overrides=(),
            stage=Stage.SCALING,
            reasons=(
                f"back to the fastest measured configuration: {x_best:,.0f} vs {x_now:,.0f} "
                f"samples/s now, saves ~{saved / 60:.0f} min ({why})",
            ),
            predicted_throughput_sps=x_best,
            created_at_s=now_s,
            action=BEST_MEASURED_ACTION,
        )

    def monitor(
        self,
        current: ResourcePlan,
        observations: Sequence[Observation],
        now_s: float,
        past_plans: Sequence[ResourcePlan] = (),
    ) -> PlanDecision:
        """Stage 3 alone (hot, idle, pending, memory-bound and straggling nodes): what a
        caller runs between the stage-2 checks that ``replan``'s ``next_check_s`` paces."""
        self.bounds = capacity_cap(self.spec_bounds, [*past_plans, current])
        urgent = post_scale(
            self.spec,
            self.config,
            current,
            observations,
            now_s,
            past_plans=past_plans,
            ps_fit=self._memory_fits(observations)[0],
            bounds=self.bounds,
            straggler_memo=self._straggler_memo(observations),
        )
        d = PlanDecision(urgent, () if urgent is not None else ("stage 3: nothing to fix",))
        return self._memory_along(current, observations, d)

    def _recheck_s(
        self, now_s: float, age_s: float, left_s: float | None, unblocked_s: float | None
    ) -> float:
        """When a model move found nothing worth its pause, the next stage-2 check.

        The same model and measured speed give a move less to save as the time left shrinks,
        so the answer changes only with new evidence (a refit, a shift in speed); the longer a
        configuration has held (``age_s``) the less each further window adds. So the check
        backs off: after ``recheck_fraction`` of the longer of the time left and the
        configuration's age (at least the re-plan interval, at most ``recheck_max_s``; the
        gaps grow geometrically), or when a pacing guard lifts. Off by default
        (``recheck_fraction`` 0: every re-plan interval, see PlannerConfig). Stage 3 is not
        paced by this (see :meth:`monitor`)."""
        cfg = self.config
        wait = cfg.recheck_fraction * max(age_s, 0.0)
        if left_s is not None:
            wait = max(wait, cfg.recheck_fraction * left_s)
        # never longer than ``recheck_max_s``: a very slow configuration has a long time
        # left, and that is where a missed move costs most (a 13-day job, measured)
        wait = max(cfg.replan_interval_s, min(wait, cfg.recheck_max_s))
        due = now_s + wait
        if unblocked_s is not None and now_s < unblocked_s < due:
            due = max(unblocked_s, now_s + cfg.replan_interval_s)
        return due

    def _model_move(
        self,
        model: ThroughputModel,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        here: Sequence[Sample],
        past_plans: Sequence[ResourcePlan],
        now_s: float,
        left_s: float | None,
    ) -> tuple[ResourcePlan | None, str, float | None]:
        """(plan or None, why, when a pacing guard that held a move back lifts)."""
        cfg = self.config
        limits = self._limits(current, samples, observations, past_plans, now_s)
        unblocked: float | None = None
        if not limits.change_ps:
            plans = [*past_plans, current]
            unblocked = self._last_change_s(plans, Role.PS) + cfg.ps_change_interval_s
        if not limits.change_workers:
            w_free = current.created_at_s + cfg.worker_stable_s
            unblocked = w_free if unblocked is None else min(unblocked, w_free)
        mem_from = None if observations else current
        urgent_note = ""
        res = self._search(model, current, observations, limits, memory_from=mem_from)
        if not limits.change_ps and self.bounds.ps.max_count > 0:
            # PS changes are paced, unless one is worth much more than what workers alone buy
            free = dataclasses.replace(limits, change_ps=True)
            alt = self._search(model, current, observations, free, memory_from=mem_from)
            if alt.objective - res.objective >= math.log1p(cfg.urgent_ps_gain):
                extra = math.expm1(alt.objective - res.objective)
                urgent_note = (
                    f"PS changed inside the {cfg.ps_change_interval_s:.0f} s PS pacing interval: "
                    f"worth {extra:+.0%} over the best worker-only change"
                )
                res = alt
        best = res
        if res.gain < cfg.min_gain or (res.workers, res.ps) == (current.workers, current.ps):
            worth, note = False, f"current plan is within {cfg.min_gain:.0%} of the best"
        else:
            worth, note = self._worth_it(model, current, res, here, left_s)
        if not worth and best.faster is not None:
            # the best objective saves no time: the best of the clearly faster ones may
            f_worth, f_note = self._worth_it(model, current, best.faster, here, left_s)
            if f_worth and (best.faster.workers, best.faster.ps) != (current.workers, current.ps):
                res, worth, note = best.faster, True, f_note
        if not worth and limits.change_workers:
            # far moves carry a wide band: a bounded step near the measured configuration,
            # where the band is narrow, may still save clearly more than its pause
            local = self._local_speedup(model, current, limits, here, left_s, res)
            if local is not None:
                res, worth, note = local
        if not worth:
            return None, note, unblocked
        plan = self._scaled_plan(current, res, model, now_s)
        plan = self._worker_cpu_to_use(plan, model, limits)
        return (
            plan.replace(reasons=(*plan.reasons, note, *([urgent_note] if urgent_note else ()))),
            note,
            None,
        )

    def _worker_cpu_to_use(
        self, plan: ResourcePlan, model: ThroughputModel, limits: scaling.SearchLimits
    ) -> ResourcePlan:
        """A model that never saw CPU per worker vary keeps it where it was; when the workers
        use well under it (``limits.max_worker_cpu_millicores``: DLRover's CPU = observed use
        + margin), the move gives them that instead: they cannot use more."""
        cap = limits.max_worker_cpu_millicores
        w = plan.workers.resources
        if cap is None or "worker_cpu" not in model.fixed_inputs_:
            return plan
        cpu = self.bounds.workers.cpu(cap)
        if cpu >= w.cpu_millicores:
            return plan
        return plan.replace(
            workers=RolePlan(plan.workers.count, NodeResources(cpu, w.memory_mib)),
            reasons=(
                *plan.reasons,
                f"CPU per worker {w.cpu_cores:g} -> {cores(cpu):g}: what the workers use, "
                "with margin (the model never saw it vary)",
            ),
        )

    def _local_speedup(
        self,
        model: ThroughputModel,
        current: ResourcePlan,
        limits: scaling.SearchLimits,
        here: Sequence[Sample],
        left_s: float | None,
        ref: scaling.SearchResult,
    ) -> tuple[scaling.SearchResult, bool, str] | None:
        """Bounded steps from the current configuration (workers + ½ and + 1 step, one or
        half again as many PS when PS may change; CPUs kept), each judged on the model's
        lower band by :meth:`_worth_it`: the one that saves most, or None."""
        cfg = self.config
        x_meas = _mean_tput(here)
        if x_meas is None or left_s is None or model.fixed_inputs_:
            return None
        cw, cp = current.workers, current.ps
        step = cfg.worker_step(current.workers.count)
        ws = {cw.count}
        if not limits.no_more_workers:
            ws |= {cw.count + max(1, step // 2), cw.count + step}
        ps = {cp.count}
        if limits.change_ps and self.bounds.ps.max_count > 0 and cp.count > 0:
            ps |= {cp.count + 1, math.ceil(cp.count * 1.5)}
        cands = []
        for nw, np_ in itertools.product(sorted(ws), sorted(ps)):
            if (nw, np_) == (cw.count, cp.count):
                continue
            w2, p2, _ = self.bounds.fit(RolePlan(nw, cw.resources), RolePlan(np_, cp.resources))
            key = scaling.roles_key(w2, p2)
            if (w2.count, p2.count) == (cw.count, cp.count) or key in limits.avoid:
                continue
            cands.append((w2, p2))
        if not cands:
            return None
        arr = np.array(
            [[w.count, p.count, w.resources.cpu_cores, p.resources.cpu_cores] for w, p in cands]
            + [[cw.count, cp.count, cw.resources.cpu_cores, cp.resources.cpu_cores]],
            dtype=np.float64,
        )
        if model.span_problems(arr):
            return None
        x, lo, _ = model.predict_bounds_many(arr)
        calib = x_meas / float(x[-1]) if x[-1] > 0 else 1.0
        # (time saved on the lower band, cheaper first): the step that saves most
        scored: list[tuple[float, int, int]] = []
        for i, (wp, pp) in enumerate(cands):
            lo_i = float(lo[i]) * calib
            if lo_i <= x_meas * (1 + cfg.faster_min_speedup):
                continue
            cores = (wp.total + pp.total).cpu_millicores
            scored.append((left_s - left_s * x_meas / lo_i, -cores, i))
        if not scored:
            return None
        i = max(scored)[2]
        wp, pp = cands[i]
        res = dataclasses.replace(
            ref, workers=wp, ps=pp, throughput_sps=float(x[i]), faster=None,
            current_throughput_sps=float(x[-1]),
        )  # fmt: skip
        worth, note = self._worth_it(model, current, res, here, left_s)
        if not worth:
            return None
        return res, True, f"bounded step: {note}"

    def _worth_it(
        self,
        model: ThroughputModel,
        current: ResourcePlan,
        res: scaling.SearchResult,
        here: Sequence[Sample],
        left_s: float | None,
    ) -> tuple[bool, str]:
        """Does the move pay for its pause? (with no live speed, e.g. offline: yes)"""
        cfg = self.config
        x_meas = _mean_tput(here)
        if x_meas is None or left_s is None or x_meas <= 0:
            return True, "no live speed to weigh the change against"
        new = [
            res.workers.count,
            res.ps.count,
            res.workers.resources.cpu_cores,
            res.ps.resources.cpu_cores,
        ]
        x, lo, _ = model.predict_bounds_many(np.array([new], dtype=np.float64))
        x_cur_model = res.current_throughput_sps
        calib = x_meas / x_cur_model if x_cur_model > 0 else 1.0
        x_new, x_new_lo = float(x[0]) * calib, float(lo[0]) * calib
        pause = (
            cfg.ps_change_pause_s
            if res.ps != current.ps or any(o.role is Role.PS for o in current.overrides)
            else cfg.worker_change_pause_s
        )
        samples_left = left_s * x_meas
        saved = left_s - (pause + samples_left / max(x_new_lo, 1e-9))
        need = max(cfg.min_saved_fraction * left_s, cfg.min_saved_pause_multiple * pause)
        if saved >= need:
            return True, (
                f"saves ≥ {saved / 60:.1f} min of ~{left_s / 60:.0f} min left on the model's "
                f"lower band, after a {pause:.0f} s pause"
            )
        c = self.config.memory_gib_per_core
        cost_cur = _plan_cost(current.workers, current.ps, c)
        cost_new = _plan_cost(res.workers, res.ps, c)
        if (
            cost_new <= (1 - cfg.shrink_min_cost_cut) * cost_cur
            and x_new_lo >= (1 - cfg.shrink_max_slowdown) * x_meas
            and left_s >= 10 * pause
        ):
            return True, (
                f"cuts cost {1 - cost_new / cost_cur:.0%} at {x_new / x_meas - 1:+.0%} speed "
                f"(≥ {x_new_lo / x_meas - 1:+.0%} on the lower band)"
            )
        return False, (
            f"not worth a {pause:.0f} s pause: saves {saved / 60:+.1f} min of ~{left_s / 60:.0f} "
            f"min left on the model's lower band (needs {need / 60:.1f})"
        )

    # --- helpers ----------------------------------------------------------------------------
    def _fit(self, samples: Sequence[Sample]) -> tuple[ThroughputModel | None, str]:
        try:
            return self.model_factory(
                samples, self.spec.strategy, self.spec.training.batch_size
            ), ""
        except DLRoverError as e:
            return None, e.message

    def _search(
        self,
        model: ThroughputModel,
        current: ResourcePlan,
        observations: Sequence[Observation],
        limits: scaling.SearchLimits,
        memory_from: ResourcePlan | None = None,
        elasticity: float | None = None,
    ) -> scaling.SearchResult:
        """``memory_from``: before the job runs, size memory from this (warm/cold) plan.
        ``elasticity``: the objective's θ, when not the configured one."""
        cfg = self.config
        if elasticity is not None:
            cfg = dataclasses.replace(cfg, min_elasticity=elasticity)
        fit, w_mem = self._memory_fits(observations)
        sums = self._last_summaries[-1:] if observations else []

        def ps_mem(p: int) -> int:
            need = self._fitted_ps_memory(fit, p, sums)
            if memory_from is not None and memory_from.ps.count > 0:
                # the base plan's total over p PS, but never below BASE_PS_MEMORY_FLOOR of
                # one of its nodes
                b = memory_from.ps
                need = max(need, b.resources.memory_mib * max(b.count / p, BASE_PS_MEMORY_FLOOR))
            return ceil_mib(need)

        if memory_from is not None and not observations:
            w_mem = max(w_mem, memory_from.workers.resources.memory_mib)
        if memory_from is not None:  # ps_mem then also reads the base plan: not memoised
            return scaling.search(model, current, self.bounds, cfg, w_mem, ps_mem, limits)
        return scaling.search(
            model, current, self.bounds, cfg, w_mem, ps_mem, limits, self._search_memo
        )

    def _scaled_plan(
        self,
        base: ResourcePlan,
        res: scaling.SearchResult,
        model: ThroughputModel,
        now_s: float,
        prefix: str = "model-based scaling",
    ) -> ResourcePlan:
        w, p = res.workers, res.ps
        reasons = [
            f"{prefix}: {w.count} worker(s) × {w.resources.cpu_cores:g} CPU, {p.count} PS × "
            f"{p.resources.cpu_cores:g} CPU maximises log(throughput) − "
            f"{self.config.min_elasticity}·log(cost) over {res.evaluated} configurations",
            (
                f"predicted {res.throughput_sps:,.0f} samples/s vs "
                f"{res.current_throughput_sps:,.0f} now (objective {res.gain:+.1%}; "
                f"model error {model.relative_error_:.1%})"
                if res.current_throughput_sps > 0 and math.isfinite(res.gain) and res.gain < 100
                else f"predicted {res.throughput_sps:,.0f} samples/s (the current "
                f"configuration is outside what the samples predict; model error "
                f"{model.relative_error_:.1%})"
            ),
        ]
        keep = tuple(
            o
            for o in base.overrides
            if o.action == "migrate" and o.node_id < p.count and o.role is Role.PS and p == base.ps
        )
        return base.replace(
            workers=w,
            ps=p,
            overrides=keep,
            stage=Stage.SCALING,
            reasons=tuple(reasons),
            predicted_throughput_sps=res.throughput_sps,
            created_at_s=now_s,
            action="scale",
        )

    def _last_change_s(self, past_plans: Sequence[ResourcePlan], role: Role) -> float:
        plans = list(past_plans)
        for prev, nxt in zip(reversed(plans[:-1]), reversed(plans[1:]), strict=True):
            if prev.role(role) != nxt.role(role):
                return nxt.created_at_s
        return plans[0].created_at_s if plans else float("-inf")

    def _limits(
        self,
        current: ResourcePlan,
        samples: Sequence[Sample],
        observations: Sequence[Observation],
        past_plans: Sequence[ResourcePlan],
        now_s: float,
    ) -> scaling.SearchLimits:
        cfg = self.config
        plans = (
            [*past_plans, current]
            if not past_plans or past_plans[-1] is not current
            else list(past_plans)
        )
        ps_ok = (
            now_s - self._last_change_s(plans, Role.PS) >= cfg.ps_change_interval_s
            or len(plans) <= 1
        )
        w_ok = now_s - current.created_at_s >= cfg.worker_stable_s
        no_more = False
        floor = None
        last = observations[-1] if observations else None
        if last is not None:
            busiest = max((n.cpu_util for n in last.of(Role.PS)), default=0.0)
            if busiest >= cfg.ps_saturation_util:
                p = current.ps
                floor = float(p.count * p.resources.cpu_millicores)
        cap = None
        if last is not None:
            ws = last.of(Role.WORKER)
            busiest_ps = max((n.cpu_util for n in last.of(Role.PS)), default=0.0)
            if ws and busiest_ps < cfg.hot_ps_cpu_util:
                # workers not held back by the PS yet use well under their CPU: they cannot
                # use more (DLRover: worker CPU = observed use + margin)
                peak = max(n.cpu_used_millicores for n in ws)
                if peak < cfg.worker_underuse * current.workers.resources.cpu_millicores:
                    cap = round_up_level(peak * cfg.worker_cpu_margin, cfg.cpu_levels_millicores)
        ratio = _marginal_speed_ratio(current, samples, plans)
        if ratio is not None and ratio < cfg.min_marginal_speed_ratio:
            no_more = True
        return scaling.SearchLimits(
            avoid=abandoned_keys(plans),
            change_workers=w_ok,
            change_ps=ps_ok,
            max_worker_step=cfg.worker_step(current.workers.count),
            no_more_workers=no_more,
            ps_capacity_floor=floor,
            max_worker_cpu_millicores=cap,
        )

    def _deceleration_guard(
        self,
        current: ResourcePlan,
        samples: Sequence[Sample],
        past_plans: Sequence[ResourcePlan],
        now_s: float,
    ) -> ResourcePlan | None:
        prev = _previous_distinct(current, past_plans)
        if prev is None or current.total.cpu_millicores <= prev.total.cpu_millicores:
            return None
        x_now = _mean_tput(scaling.samples_at(samples, scaling.plan_key(current)))
        x_before = _mean_tput(scaling.samples_at(samples, scaling.plan_key(prev)))
        if x_now is None or x_before is None or x_now >= (1 - self.config.deceleration) * x_before:
            return None
        return prev.replace(
            stage=Stage.SCALING,
            created_at_s=now_s,
            action=REVERT_ACTION,
            reasons=(
                f"deceleration: {x_now:,.0f} samples/s after scaling up vs {x_before:,.0f} "
                f"before (≥ {self.config.deceleration:.0%} slower): revert",
            ),
        )

    def _next_sample(
        self,
        current: ResourcePlan,
        samples: Sequence[Sample],
        observations: Sequence[Observation],
        past_plans: Sequence[ResourcePlan],
        now_s: float,
        why: str,
        fixed: dict[str, float] | None = None,
    ) -> ResourcePlan | None:
        seen = {scaling.sample_key(s) for s in samples}
        # the budget binds only once every input has varied: a model that never saw an input
        # vary cannot move it, so one sample along it stays worth its pause
        if len(seen) >= self.config.max_sampling_configs + (2 if fixed else 0):
            return None
        used = {
            pl.action.removeprefix(SAMPLE_ACTION)
            for pl in past_plans
            if pl.action.startswith(SAMPLE_ACTION)
        }
        cands = scaling.sampling_candidates(current, self.bounds, self.config, observations)
        if fixed:
            # optimal design, simply: first the moves along inputs the model never saw vary
            cands = sorted(cands, key=lambda c: not _varies(current, c[0], c[1], fixed))
        # when moves from here no longer fit the quota, move from the first plan instead
        base = past_plans[0] if past_plans else current
        fallback = sorted(  # kinds not tried yet first
            scaling.sampling_candidates(base, self.bounds, self.config, ()),
            key=lambda c: c[2] in used,
        )
        fit = self._memory_fits(observations)[0] if observations else None
        for i, (w, p, what) in enumerate([*cands, *fallback]):
            w, p = self._memory_kept(current, w, p, fit)
            shrunk = self.bounds.over_quota(w, p)
            w2, p2, _ = self.bounds.fit(w, p)
            key = scaling.roles_key(w2, p2)
            # a move along an input the model never saw vary is worth a few workers when the
            # quota is full (one more PS then takes their place): else a job at its quota on
            # one PS never learns what more PS do (a 1-PS job ran 288 min, session 11)
            new_input = _varies(current, w2, p2, fixed or {})
            if (i < len(cands) and what in used) or key in seen or (shrunk and not new_input):
                continue
            if len(seen) >= self.config.max_sampling_configs and not new_input:
                continue
            reasons = (
                f"sampling configuration {len(seen) + 1}: {what} "
                f"({why or 'the model is not yet trustworthy'})",
            )
            return current.replace(
                workers=w2,
                ps=p2,
                overrides=(),
                stage=Stage.SAMPLING,
                reasons=reasons,
                predicted_throughput_sps=None,
                created_at_s=now_s,
                action=SAMPLE_ACTION + what,
            )
        return None

    def _fitted_ps_memory(
        self, fit: PSMemoryFit, num_ps: int, sums: Sequence[ObservedMemory]
    ) -> float:
        """MiB each of ``num_ps`` PS needs by the memory fit (with margin); ``sums``: the
        latest observation's summary, or none before the job runs."""
        return ps_memory_from_fit(fit, num_ps, sums, self.config.ps_memory_margin)

    def _memory_kept(
        self,
        current: ResourcePlan,
        w: RolePlan,
        p: RolePlan,
        fit: PSMemoryFit | None,
    ) -> tuple[RolePlan, RolePlan]:
        """A sampling move's memory: never below what the job holds now (a move from the
        first plan carries that plan's memory; a PS OOM's bump would be lost: seed 206, one
        job OOMed twice more) nor below what the PS memory fit (of the observations, None
        before the job runs) sizes for its PS count."""
        wm = max(w.resources.memory_mib, current.workers.resources.memory_mib)
        pm = p.resources.memory_mib
        if p.count > 0:
            if p.count <= current.ps.count:
                pm = max(pm, current.ps.resources.memory_mib)
            if fit is not None:
                need = self._fitted_ps_memory(fit, p.count, self._last_summaries[-1:])
                pm = max(pm, ceil_mib(need))
        return (
            RolePlan(w.count, dataclasses.replace(w.resources, memory_mib=wm)),
            RolePlan(p.count, dataclasses.replace(p.resources, memory_mib=pm)),
        )


def _plan_cost(w: RolePlan, p: RolePlan, gib_per_core: float) -> float:
    return float(
        scaling.cost(
            w.count,
            p.count,
            w.resources.cpu_millicores,
            p.resources.cpu_millicores,
            w.resources.memory_mib,
            p.resources.memory_mib,
            gib_per_core,
        )
    )


def _varies(current: ResourcePlan, w: RolePlan, p: RolePlan, fixed: dict[str, float]) -> bool:
    now = {
        "workers": (current.workers.count, w.count),
        "ps": (current.ps.count, p.count),
        "worker_cpu": (current.workers.resources.cpu_millicores, w.resources.cpu_millicores),
        "ps_cpu": (current.ps.resources.cpu_millicores, p.resources.cpu_millicores),
    }
    return any(now[k][0] != now[k][1] for k in fixed if k in now)


def _samples_due(
    samples: Sequence[Sample], here: Sequence[Sample], need: int, now_s: float
) -> float | None:
    """When the missing speed samples are due, at the cadence samples have arrived so far
    (None: unknown yet)."""
    ts = sorted(s.timestamp_s for s in samples[-8:] if s.timestamp_s is not None)
    gaps = [b - a for a, b in itertools.pairwise(ts) if b > a]
    if not gaps:
        return None
    gap = sorted(gaps)[len(gaps) // 2]
    return now_s + (need - len(here)) * gap


def _remaining_s(observations: Sequence[Observation], here: Sequence[Sample]) -> float | None:
    """Seconds left at the measured speed of the current configuration (None: unknown)."""
    x = _mean_tput(here)
    if not observations or x is None or x <= 0:
        return None
    last = observations[-1]
    if last.samples_total <= 0:
        return None
    return max(0.0, last.samples_total - last.samples_done) / x


def abandoned_keys(past_plans: Sequence[ResourcePlan]) -> frozenset[scaling.ConfigKey]:
    """Configurations left by a deceleration revert: not re-entered in this run."""
    plans = list(past_plans)
    return frozenset(
        scaling.plan_key(prev)
        for prev, nxt in itertools.pairwise(plans)
        if nxt.action == REVERT_ACTION
    )


def _samples_of(runs: Sequence[HistoryRecord]) -> list[Sample]:
    """The speed samples the ``runs`` recorded (``extra["samples"]``), in their order."""
    out: list[Sample] = []
    for r in runs:
        out.extend(s for s in r.extra.get("samples", ()) if isinstance(s, Sample))
    return out


def _mean_speeds(samples: Sequence[Sample]) -> dict[scaling.ConfigKey, float]:
    """Mean measured throughput of each configuration in ``samples``."""
    speeds: dict[scaling.ConfigKey, list[float]] = {}
    for s in samples:
        speeds.setdefault(scaling.sample_key(s), []).append(s.throughput_sps)
    return {k: sum(v) / len(v) for k, v in speeds.items()}


def _steady_speeds(samples: Sequence[Sample]) -> dict[scaling.ConfigKey, float]:
    """Mean measured throughput of each configuration in ``samples`` (in their order) over its
    steady windows: the first window after each arrival at a configuration is left out (it
    holds the change's restart), so a configuration just reached is not judged by it."""
    steady: list[Sample] = []
    prev: scaling.ConfigKey | None = None
    for s in samples:
        key = scaling.sample_key(s)
        if key == prev:
            steady.append(s)
        prev = key
    return _mean_speeds(steady)


def _mean_tput(samples: Sequence[Sample]) -> float | None:
    return sum(s.throughput_sps for s in samples) / len(samples) if samples else None


def _previous_distinct(current: ResourcePlan, past: Sequence[ResourcePlan]) -> ResourcePlan | None:
    for p in reversed(past):
        if scaling.plan_key(p) != scaling.plan_key(current):
            return p
    return None


def _marginal_speed_ratio(
    current: ResourcePlan, samples: Sequence[Sample], past: Sequence[ResourcePlan]
) -> float | None:
    """DLRover's (ΔX/Δw)/(X/w) after the last change in the worker count alone."""
    prev = _previous_distinct(current, past)
    if prev is None or prev.workers.count >= current.workers.count:
        return None
    if scaling.plan_key(prev)[1:] != scaling.plan_key(current)[1:]:
        return None
    x1 = _mean_tput(scaling.samples_at(samples, scaling.plan_key(current)))
    x0 = _mean_tput(scaling.samples_at(samples, scaling.plan_key(prev)))
    if x1 is None or x0 is None or x0 <= 0:
        return None
    dw = current.workers.count - prev.workers.count
    return ((x1 - x0) / dw) / (x0 / prev.workers.count)
