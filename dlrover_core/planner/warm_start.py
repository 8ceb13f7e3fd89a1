"""Stage 1: allocate before the job starts — from similar past runs, or a small default."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from dlrover_core.planner.bounds import JobBounds, ceil_mib, round_up_level
from dlrover_core.planner.config import PlannerConfig
from dlrover_core.planner.memory_sizing import ps_memory_per_node_mib, worker_memory_mib
from dlrover_core.planner.scaling import plan_key, samples_at
from dlrover_core.planner.similar import (
    SimilarConfig,
    SimilarJobs,
    job_features,
    memory_ratio,
    record_features,
    similar_jobs,
)
from dlrover_core.spec import JobSpec
from dlrover_core.types import (
    HistoryRecord,
    NodeResources,
    ResourcePlan,
    RolePlan,
    Sample,
    Stage,
)


def major_cluster_mean(values: Sequence[float], fraction: float = 0.5) -> float:
    """DLRover's robust aggregate: average the ``fraction`` of values nearest the median.

    Not a scikit-learn clustering (issue 38): this is a 1-D trimmed mean over the few runs of
    one signature (1-10 values), and KMeans, DBSCAN or MeanShift would need a cluster count,
    a radius or a bandwidth chosen per quantity, and say nothing on two or three values.

    >>> major_cluster_mean([10, 11, 12, 100])
    11.5
    """
    if not values:
        raise ValueError("major_cluster_mean of no values")
    med = statistics.median(values)
    k = max(1, math.ceil(len(values) * fraction))
    nearest = sorted(values, key=lambda v: (abs(v - med), v))[:k]
    return sum(nearest) / len(nearest)


def similar_runs(
    spec: JobSpec, history: Sequence[HistoryRecord], now_s: float, window_s: float
) -> list[HistoryRecord]:
    """Successful runs of the spec's signature in the window, trained with its strategy: a PS
    run's sizes and speed samples do not describe an all-reduce run of the same model and data
    (no PS, ranks that each hold the model), nor the reverse."""
    return [r for r in _in_window(spec, history, now_s, window_s) if r.strategy == spec.strategy]


def untransferable_runs(
    spec: JobSpec, history: Sequence[HistoryRecord], now_s: float, window_s: float
) -> list[HistoryRecord]:
    """Runs of the signature in the window that another strategy trained (not used)."""
    return [r for r in _in_window(spec, history, now_s, window_s) if r.strategy != spec.strategy]


def _in_window(
    spec: JobSpec, history: Sequence[HistoryRecord], now_s: float, window_s: float
) -> list[HistoryRecord]:
    key = spec.signature_key
    return [
        r
        for r in history
        if r.signature == key and r.succeeded and now_s - window_s <= r.finished_at_s <= now_s
    ]


def strategy_note(
    spec: JobSpec, history: Sequence[HistoryRecord], now_s: float, window_s: float
) -> str | None:
    """Says that runs of this signature exist but another strategy trained them."""
    other = untransferable_runs(spec, history, now_s, window_s)
    if not other:
        return None
    names = sorted({r.strategy for r in other})
    return (
        f"{len(other)} run(s) of this signature trained with strategy {', '.join(names)} not "
        f"used: their sizes and speed samples do not describe a {spec.strategy} job"
    )


def cold_start(spec: JobSpec, cfg: PlannerConfig, now_s: float) -> ResourcePlan:
    bounds = JobBounds.from_spec(spec)
    q = spec.quota.resources
    cpu = min(int(q.cpu_millicores * cfg.cold_fraction), cfg.cold_max_cpu_millicores)
    mem = min(int(q.memory_mib * cfg.cold_fraction), cfg.cold_max_memory_mib)
    w_mem = max(mem, worker_memory_mib(spec))

    def need(p: int) -> int:
        return ceil_mib(ps_memory_per_node_mib(spec, p, margin=cfg.ps_memory_margin))

    # as many PS as it takes for the expected parameters to fit the largest PS node
    n_ps = spec.min_ps
    while 0 < n_ps < bounds.ps.max_count and need(n_ps) > bounds.ps.max_memory_mib:
        n_ps += 1
    p_mem = max(mem, need(n_ps)) if n_ps else 0
    workers = RolePlan(1, NodeResources(cpu, w_mem))
    ps = RolePlan(n_ps, NodeResources(cpu, p_mem))
    workers, ps, notes = bounds.fit(workers, ps)
    reasons = [
        f"cold start: no successful run of signature {spec.signature_key!r} in the history "
        f"window; DLRover's default of 1 worker + {spec.min_ps} PS at min(quota/5, 16 CPU / 8 GiB)",
        f"PS memory sized for ~{ps_memory_per_node_mib(spec, max(ps.count, 1)):,.0f} MiB per PS "
        "at the end of training (spec's embedding tables, × margin)",
        *notes,
    ]
    if n_ps > spec.min_ps:
        reasons.insert(
            1,
            f"{n_ps} PS so that the expected embedding rows fit the largest PS node "
            f"({bounds.ps.max_memory_mib} MiB)",
        )
    return ResourcePlan(workers, ps, Stage.COLD_START, tuple(reasons), created_at_s=now_s)


def warm_start(
    spec: JobSpec,
    runs: Sequence[HistoryRecord],
    cfg: PlannerConfig,
    now_s: float,
) -> ResourcePlan:
    """Start near the final configuration of similar runs, robustly aggregated."""
    bounds = JobBounds.from_spec(spec)
    f = cfg.major_cluster_fraction
    plans = [r.final_plan for r in runs]

    def agg(vals: Sequence[float]) -> float:
        return major_cluster_mean(vals, f)

    n_w = max(1, round(agg([p.workers.count for p in plans])))
    n_p = min(cfg.warm_max_ps, max(spec.min_ps, round(agg([p.ps.count for p in plans]))))
    n_p = bounds.ps.count(n_p)  # per-PS CPU and memory below are shares of the final PS count
    levels = cfg.cpu_levels_millicores

    w_used = [u for u in (_worker_cpu_used(r) for r in runs) if u]
    if w_used:
        w_cpu = round_up_level(agg(w_used) * cfg.warm_worker_cpu_margin, levels)
    else:
        w_cpu = int(agg([p.workers.resources.cpu_millicores for p in plans]))
    p_used = [
        r.ps_cpu_used_millicores * r.final_plan.ps.count for r in runs if r.ps_cpu_used_millicores
    ]
    if p_used and n_p > 0:
        p_cpu = round_up_level(agg(p_used) * cfg.warm_ps_cpu_factor / n_p, levels)
    else:
        p_cpu = int(agg([p.ps.resources.cpu_millicores for p in plans]))

    w_mem_used = [r.worker_memory_used_mib for r in runs if r.worker_memory_used_mib]
    w_mem = (
        ceil_mib(agg(w_mem_used) * cfg.warm_memory_margin)
        if w_mem_used
        else int(agg([p.workers.resources.memory_mib for p in plans]))
    )
    p_mem_total = [
        r.ps_memory_used_mib * r.final_plan.ps.count for r in runs if r.ps_memory_used_mib
    ]
    p_mem = (
        ceil_mib(agg(p_mem_total) * cfg.warm_memory_margin / max(n_p, 1))
        if p_mem_total
        else int(agg([p.ps.resources.memory_mib for p in plans]))
    )
    workers = RolePlan(n_w, NodeResources(w_cpu, w_mem))
    ps = RolePlan(n_p, NodeResources(p_cpu, p_mem))
    workers, ps, notes = bounds.fit(workers, ps)
    tput = [r.throughput_sps for r in runs if r.throughput_sps]
    reasons = [
        f"warm start from {len(runs)} similar run(s) of {spec.signature_key!r} "
        f"(major-cluster mean of their final configurations)",
        f"worker CPU = used in the final configuration × {cfg.warm_worker_cpu_margin}, PS "
        f"CPU = total used × {cfg.warm_ps_cpu_factor} / PS count, memory = peak used × "
        f"{cfg.warm_memory_margin}",
        *notes,
    ]
    return ResourcePlan(
        workers,
        ps,
        Stage.WARM_START,
        tuple(reasons),
        predicted_throughput_sps=agg(tput) if tput else None,
        created_at_s=now_s,
    )


def _worker_cpu_used(run: HistoryRecord) -> float | None:
    """Millicores a worker of ``run`` used in its final configuration: the median over its
    speed samples there (``extra["samples"]``) of the mean worker use; the run's peak per
    worker when it recorded none. The peak spans every configuration the run held: a 16-CPU
    cold start uses more than the 4-CPU workers the run ended with, and a warm start sized
    from it wastes the difference (issue 10, session 11: CPU utilisation +0.2 to +2.0
    points on seeds 0-3 and 101-105. The same for the PS made the p90 worse on 4 of 5)."""
    fp = run.final_plan
    samples = [s for s in run.extra.get("samples", ()) if isinstance(s, Sample)]
    utils = [
        s.worker_cpu_util
        for s in samples_at(samples, plan_key(fp))
        if s.worker_cpu_util is not None
    ]
    if utils and (used := statistics.median(utils)) > 0:
        return used * fp.workers.resources.cpu_millicores
    return run.worker_cpu_used_millicores


def similar_start(
    spec: JobSpec, found: SimilarJobs, cfg: PlannerConfig, now_s: float
) -> ResourcePlan:
    """A warm start from the runs of similar jobs (``similar.similar_jobs``): their final
    configurations aggregated as for an exact signature, PS memory scaled by what this job's
    spec expects over theirs, worker memory at least this spec's estimate."""
    assert found.features is not None and found.runs
    plan = warm_start(spec, found.runs, cfg, now_s)
    ratio = memory_ratio(found.features, found.runs)
    w, p = plan.workers, plan.ps
    w_mem = max(w.resources.memory_mib, worker_memory_mib(spec))
    p_mem = ceil_mib(p.resources.memory_mib * ratio) if p.count else 0
    bounds = JobBounds.from_spec(spec)
    workers, ps, notes = bounds.fit(
        RolePlan(w.count, NodeResources(w.resources.cpu_millicores, w_mem)),
        RolePlan(p.count, NodeResources(p.resources.cpu_millicores, p_mem)),
    )
    n_runs = len(found.runs)
    learnt = "; ".join(n.describe() for n in found.neighbours)
    reasons = [
        f"similar-job prior: no successful run of signature {spec.signature_key!r}; learnt "
        f"from {n_runs} run(s) of {len(found.neighbours)} similar job(s), nearest first: "
        f"{learnt} (distance: RMS log2 difference of the job features; near <= "
        f"{found.max_distance:g})",
        *plan.reasons[1:],
    ]
    if ratio != 1.0:
        reasons.append(
            f"PS memory × {ratio:.2f}: this spec expects that much more embedding memory "
            "than theirs did"
        )
    reasons.extend(n for n in notes if n not in reasons)
    return plan.replace(workers=workers, ps=ps, reasons=tuple(reasons))


def grown_ps_memory(
    spec: JobSpec, plan: ResourcePlan, runs: Sequence[HistoryRecord], cfg: PlannerConfig
) -> ResourcePlan:
    """A warm start sizes PS memory from what the runs it starts from used. A run that
    expects more embedding rows than they held (more data, a bigger table: a recurring
    retrain whose days grow) gets the difference on top: the spec's memory model at the end
    of training (``JobFeatures.ps_memory_mib``, one PS holding every row) for this spec,
    less the same for theirs (median over the runs that carry their spec), shared by the
    PS, × ``warm_memory_margin``. Stage 3 would raise it mid-run otherwise, a PS restart.
    Never less than the runs used; runs without a spec leave the plan as it is."""
    if not plan.ps.count:
        return plan
    target = job_features(spec).ps_memory_mib
    theirs = [f.ps_memory_mib for f in map(record_features, runs) if f is not None]
    if target <= 0 or not theirs:
        return plan
    grow = target - statistics.median(theirs)
    add = grow / plan.ps.count * cfg.warm_memory_margin
    if add < 1.0:
        return plan
    res = plan.ps.resources
    ps = RolePlan(plan.ps.count, NodeResources(res.cpu_millicores, ceil_mib(res.memory_mib + add)))
    workers, ps, notes = JobBounds.from_spec(spec).fit(plan.workers, ps)
    why = (
        f"PS memory +{add:,.0f} MiB each: this run's data and tables end with {grow:,.0f} MiB "
        "more embedding rows than the runs it starts from (the spec's memory model)"
    )
    reasons = [*plan.reasons, why, *(n for n in notes if n not in plan.reasons)]
    return plan.replace(workers=workers, ps=ps, reasons=tuple(reasons))


def stage_one(
    spec: JobSpec,
    history: Sequence[HistoryRecord],
    cfg: PlannerConfig,
    now_s: float,
    similar: SimilarConfig | None = SimilarConfig(),
) -> tuple[ResourcePlan, list[HistoryRecord]]:
    """Stage 1 and the runs it learnt from: the runs of the signature (and strategy) first;
    else the runs of the nearest similar jobs (``similar``: None never looks); else DLRover's
    cold start, saying why no similar job served."""
    runs = similar_runs(spec, history, now_s, cfg.history_window_s)
    if runs:
        return grown_ps_memory(spec, warm_start(spec, runs, cfg, now_s), runs, cfg), runs
    found = (
        similar_jobs(spec, history, now_s, cfg.history_window_s, similar)
        if similar is not None
        else SimilarJobs()
    )
    if found.found:
        return similar_start(spec, found, cfg, now_s), list(found.runs)
    plan = cold_start(spec, cfg, now_s)
    notes = [
        n for n in (strategy_note(spec, history, now_s, cfg.history_window_s), found.note) if n
    ]
    if notes:
        plan = plan.replace(reasons=(plan.reasons[0], *notes, *plan.reasons[1:]))
    return plan, []


def initial_plan(
    spec: JobSpec,
    history: Sequence[HistoryRecord],
    cfg: PlannerConfig,
    now_s: float,
    similar: SimilarConfig | None = SimilarConfig(),
) -> ResourcePlan:
    return stage_one(spec, history, cfg, now_s, similar)[0]
