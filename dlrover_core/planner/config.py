"""The planner's numbers, as data. Defaults are DLRover's production heuristics (DOMAIN.md)
where it has one; ours are marked."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlrover_core.spec import JobSpec

# measured pauses (report.plan_changes, stored with each run) replace the constants from this
# many measured changes of similar runs on; a measurement is clamped to this range (a change
# that cost nothing still costs the launch; a job that stalled for other reasons is not a pause)
MIN_MEASURED_PAUSES = 2
MIN_MEASURED_PAUSE_S = 1.0
MAX_MEASURED_PAUSE_S = 600.0


@dataclass(frozen=True)
class PlannerConfig:
    # --- stage 1: cold start (DLRover: 1 PS + 1 worker, min(limit/5, 16 CPU / 8 GiB)) ----
    cold_fraction: float = 0.2
    cold_max_cpu_millicores: int = 16_000
    cold_max_memory_mib: int = 8_192
    # ours: "prior" sizes the counts and CPUs of a PS job's first run (no similar run with
    # samples) by the bottleneck model at its prior centres, DLRover's memory per node kept;
    # "dlrover" keeps DLRover's 1 worker + min PS. Only with throughput_form "bottleneck".
    cold_start: str = "prior"
    # ... and the objective's θ for it (ours: 0.8, more frugal than min_elasticity while
    # only the priors speak; 0.7-0.9 measure alike on the tuning traces, 1.0+ is worse)
    prior_start_elasticity: float = 0.8
    # ... and its worker memory (ours: 6 GiB, not DLRover's 8 GiB cold-start size; never
    # above the cold start's, never below the spec's estimate). At 8 GiB the memory quota
    # binds first and the objective prices each worker at 2 more cores' worth, so the
    # first run gets few, fat workers: on traces 824-829, 6 GiB gives +0.7 to +1.9 points
    # of per-core throughput with shorter JCT, fewer moves and higher memory utilisation
    # (issue 10, session 18). A worker that needs more is relaunched with more (OOM rule).
    prior_start_worker_memory_mib: int = 6_144
    # --- stage 1: warm start ----------------------------------------------------------
    major_cluster_fraction: float = 0.5  # keep >= this share of values nearest the median
    # per-worker CPU = what a worker used in the final configuration × margin
    warm_worker_cpu_margin: float = 1.2
    warm_ps_cpu_factor: float = 1.5  # DLRover: PS CPU total × 1.5
    warm_memory_margin: float = 1.2  # DLRover: memory × 1.2
    warm_max_ps: int = 15
    # --- stage 2: model-based scaling ---------------------------------------------------
    # The objective: maximise log X − θ·log cost, i.e. keep adding resources while a 1 %
    # cost increase still buys ≥ θ % throughput (θ is DLRover's 0.2 marginal speed ratio
    # made continuous; ours: 0.35 trades a little speed for much less waste).
    min_elasticity: float = 0.35
    # the throughput model of PS jobs: "bottleneck" (PSBottleneckThroughputModel, a MAP fit
    # with priors: predicts from one configuration on) or "linear" (the paper's form and its
    # extensions, chosen by cross-validation; each input must have varied to be predicted)
    throughput_form: str = "bottleneck"
    memory_gib_per_core: float = 4.0  # 1 core costs as much as 4 GiB (cloud price ratio)
    min_gain: float = 0.03  # change only if the objective improves by ≥ 3 % (hysteresis)
    # ours: with no move worth it, memory per node measured (max used × margin; the PS's
    # end-of-training fit) under this share of what is allocated is shrunk, once the saving
    # weighs (θ·Δlog cost) more than twice the pause over the time left. 0: never
    memory_shrink_below: float = 0.7
    max_worker_step: int = 8  # DLRover: ≤ +8 workers per step
    # ... or this share of the current count when larger (ours: a job whose best size is
    # 100+ workers needs a dozen +8 steps, each a pause and a re-plan interval)
    max_worker_growth: float = 3.0
    ps_saturation_util: float = 0.95  # DLRover: stop adding workers if a PS is this busy
    min_marginal_speed_ratio: float = 0.2  # DLRover: (ΔX/Δw)/(X/w)
    deceleration: float = 0.2  # DLRover: speed down ≥ 20 % after a change -> revert
    worker_memory_margin: float = 1.5  # DLRover: worker memory = max used × 1.5
    worker_cpu_margin: float = 1.1  # CPU per worker <= peak used × margin when under-used,
    worker_underuse: float = 0.85  # i.e. when the busiest worker uses < 85 % of its CPU
    # when the best objective is a configuration about as fast as now (a cost cut that saves
    # no time), the best one predicted at least this much faster is weighed too (ours)
    faster_min_speedup: float = 0.15
    urgent_ps_gain: float = 0.25  # a PS change inside the PS pacing interval must beat
    # the best worker-only change by this much (ours: DLRover's fixed 1 h wait costs long jobs)
    ps_memory_margin: float = 1.2
    # a predicted PS OOM this far ahead (at the measured speed), with every PS under this
    # share of its memory, waits for the next move and rides along with it (ours, issue 10:
    # a raise on its own is one more PS restart); 0 raises at once
    ps_memory_defer_s: float = 1800.0
    ps_memory_defer_util: float = 0.8
    cpu_levels_millicores: tuple[int, ...] = (
        500,
        1000,
        1500,
        2000,
        3000,
        4000,
        6000,
        8000,
        12000,
        16000,
        24000,
        32000,
    )
    max_trust_rel_error: float = 0.25  # beyond this fitted error, keep sampling
    max_sampling_configs: int = 4  # ours: a partial fit serves inside its span (issue 10)
    # --- what a change costs (ours, issue 10): act only when the time it saves, judged on
    # the model's lower band and calibrated to the measured speed, clearly beats its pause
    worker_change_pause_s: float = 30.0  # a worker add/resize pauses the job this long
    ps_change_pause_s: float = 120.0  # a PS change / migration pauses the job this long
    min_saved_fraction: float = 0.08  # of the remaining time, after the pause
    # and at least this many pauses (ours, issue 10: 2 -> 6 in session 9; a move costs more
    # than its pause: a new speed window to measure, and a revert, a pause more, when it
    # measures slower. At 6, seeds 0-3 and 101-108 made 4-7 % fewer operations; the JCT
    # ratios to dlrover-oss moved by <= +0.04 at the median and mean, -0.06..+0.07 at p90)
    min_saved_pause_multiple: float = 6.0
    # too little left: sampling cannot pay back (ours, issue 10: 1200 -> 1800 in session 10;
    # seeds 0-3 and 101-105 made 3-7 % fewer operations, the JCT median ratio to
    # dlrover-oss moved by -0.003..+0.025, the mean by -0.002..+0.014, p90 not at all)
    min_remaining_to_sample_s: float = 1800.0
    shrink_min_cost_cut: float = 0.15  # a cheaper plan must cut cost this much ...
    shrink_max_slowdown: float = 0.03  # ... and lose at most this much speed
    # nothing worth a move: check again after this share of the longer of the time left and
    # the configuration's age (at least the re-plan interval, at most recheck_max_s), or when
    # a pacing guard lifts. Off (0) by default: at 0.5 the simulator's 1000-job trace grew
    # two multi-day jobs (mean JCT 64 -> 78 min), i.e. a slow configuration waits too long
    recheck_fraction: float = 0.0
    recheck_max_s: float = 1800.0  # ... but never later than this
    # neither side busy and the model sees no move: measure twice the PS (ours, issue 10)
    stall_util: float = 0.7  # busiest PS and mean worker CPU use both under this (0.6:
    # a 43-worker job on 2 PS at 58 % / 67 % and workers at 51 % never probed; session 8)
    # ... and the busiest PS over this: a PS using under a fifth of its CPU binds nothing (a
    # PS held by its parallelism cap still reads 25-35 %), e.g. one worker on 1-2 idle PS;
    # 0 (probe those too): 3-9 % more operations on seeds 0-3 and 101-105 (issue 10, s. 11)
    stall_min_ps_util: float = 0.2
    stall_min_left_s: float = 3600.0
    stall_probes: int = 4  # probes a run, each after one that measured this much faster:
    stall_min_gain: float = 0.08
    ps_hot_hysteresis: float = 0.15  # with a hot PS, also migrate PS within this of the mark
    worker_ps_target_util: float = 0.85  # DLRover: grow workers until the PS are this busy
    # --- stage 3: post-scaling ------------------------------------------------------------
    hot_ps_cpu_util: float = 0.9
    hot_ps_memory_util: float = 0.9
    hot_ps_cpu_factor: float = 1.5  # ours: 2× overshoots once the hot PS cools
    hot_ps_memory_step_mib: int = 8_192  # DLRover: +8 GiB
    idle_ps_cpu_util: float = 0.4
    # trim idle PS/workers only with 2 h left: 39 % of scaling operations were idle-PS trims;
    # at 7200 s (was 3600) ops/job 0.32/0.27/0.31 -> 0.23/0.13/0.16 on fresh seeds
    # 9001-9003, per-core -0.007 (benchmarks/oracle_gap.py --planner idle_min_remaining_s=7200)
    idle_min_remaining_s: float = 7200.0
    idle_worker_cpu_util: float = 0.6  # every worker under this for the window: trim CPU
    idle_target_util: float = 0.7
    idle_min_cut: float = 0.25  # idle PS next to busy ones: move them if that frees this share
    straggler_ratio: float = 0.5
    # --- pacing (from the spec) -----------------------------------------------------------
    replan_interval_s: float = 300.0
    worker_stable_s: float = 60.0
    min_speed_samples: int = 5
    ps_change_interval_s: float = 3600.0
    hot_window: int = 3
    pending_timeout_s: float = 900.0
    history_window_s: float = 7 * 86400.0

    def worker_step(self, workers: int) -> int:
        """The largest worker increase one move may make from ``workers``."""
        return max(self.max_worker_step, math.ceil(self.max_worker_growth * workers))

    def with_measured_pauses(
        self, spec: JobSpec, measured: dict[str, list[float]]
    ) -> tuple[PlannerConfig, list[str]]:
        """The pause of each kind of plan change (``ps``, ``worker``) as past runs measured it
        (their median, from ``MIN_MEASURED_PAUSES`` changes on), in place of the constant,
        unless the spec's ``planner`` section sets it. Returns the config and what it used."""
        from dataclasses import replace
        from statistics import median

        changes: dict[str, float] = {}
        notes = []
        for kind, field in (("worker", "worker_change_pause_s"), ("ps", "ps_change_pause_s")):
            got = [v for v in measured.get(kind, []) if v >= 0]
            if getattr(spec.planner, field) is not None or len(got) < MIN_MEASURED_PAUSES:
                continue
            value = min(MAX_MEASURED_PAUSE_S, max(MIN_MEASURED_PAUSE_S, median(got)))
            changes[field] = value
            notes.append(
                f"{kind} change pause {value:.1f} s, measured over {len(got)} change(s) of "
                f"past runs (default {getattr(self, field):.0f} s)"
            )
        return (replace(self, **changes) if changes else self), notes  # type: ignore[arg-type]

    @classmethod
    def from_spec(cls, spec: JobSpec, **overrides: object) -> PlannerConfig:
        """The spec's ``pacing`` and ``planner`` sections over the defaults; ``overrides``
        (keyword arguments, e.g. from a test) over those."""
        p = spec.pacing
        base = cls(
            replan_interval_s=p.replan_interval_s,
            worker_stable_s=p.worker_stable_s,
            min_speed_samples=p.min_speed_samples,
            ps_change_interval_s=p.ps_change_interval_s,
            hot_window=p.hot_window,
            pending_timeout_s=p.pending_timeout_s,
            history_window_s=p.history_window_s,
            **spec.planner.overrides(),  # type: ignore[arg-type]
        )
        if overrides:
            from dataclasses import replace

            base = replace(base, **overrides)  # type: ignore[arg-type]
        return base
