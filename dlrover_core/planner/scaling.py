"""Stage 2: size the job from the fitted resource-performance model.

The objective is J = log X − θ·log C: throughput X (samples/s) against cost C (cores plus
memory in core-equivalents). Its optimum is where one more percent of cost buys exactly θ
percent of throughput — "maximise throughput gain per unit of added resource cost", with θ the
continuous form of DLRover's marginal-speed-ratio guard. The search is a vectorised grid over
(workers, PS, CPU per worker, CPU per PS) inside the quota and the user's pins.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from dlrover_core.model.throughput import ThroughputModel
from dlrover_core.planner.bounds import JobBounds, RoleBounds
from dlrover_core.planner.config import PlannerConfig
from dlrover_core.types import NodeResources, Observation, ResourcePlan, Role, RolePlan, Sample
from dlrover_core.units import MIB_PER_GIB, MILLICORES_PER_CORE, millicores_from_cores

FloatArray = npt.NDArray[np.float64]
ConfigKey = tuple[int, int, int, int]


def config_key(workers: int, ps: int, worker_cpu_cores: float, ps_cpu_cores: float) -> ConfigKey:
    return (
        workers,
        ps,
        millicores_from_cores(worker_cpu_cores),
        millicores_from_cores(ps_cpu_cores),
    )


def roles_key(workers: RolePlan, ps: RolePlan) -> ConfigKey:
    return (workers.count, ps.count, workers.resources.cpu_millicores, ps.resources.cpu_millicores)


def plan_key(plan: ResourcePlan) -> ConfigKey:
    return roles_key(plan.workers, plan.ps)


def sample_key(s: Sample) -> ConfigKey:
    return config_key(s.workers, s.ps, s.worker_cpu_cores, s.ps_cpu_cores)


def samples_at(samples: Sequence[Sample], key: ConfigKey) -> list[Sample]:
    return [s for s in samples if sample_key(s) == key]


def cost(
    w: FloatArray | float,
    p: FloatArray | float,
    w_cpu_m: FloatArray | float,
    p_cpu_m: FloatArray | float,
    w_mem: FloatArray | float,
    p_mem: FloatArray | float,
    gib_per_core: float,
) -> FloatArray | float:
    """Resource cost in core-equivalents."""
    cpu_cores = (w * w_cpu_m + p * p_cpu_m) / MILLICORES_PER_CORE
    mem_gib = (w * w_mem + p * p_mem) / MIB_PER_GIB
    return cpu_cores + mem_gib / gib_per_core


def _count_values(rb: RoleBounds, current: int, allow: bool, max_up: int | None) -> list[int]:
    if rb.pinned_count is not None or not allow:
        return [current]
    hi = rb.max_count if max_up is None else min(rb.max_count, current + max_up)
    lo = rb.min_count
    vals = set(range(lo, min(hi, 8) + 1))
    v = 8.0
    while v < hi:
        v *= 1.15
        vals.add(min(hi, int(round(v))))
    vals.update(n for n in (current - 1, current, current + 1) if lo <= n <= hi)
    return sorted(n for n in vals if lo <= n <= hi)


def _cpu_values(rb: RoleBounds, current: int, allow: bool, levels: Sequence[int]) -> list[int]:
    if rb.pinned_cpu_millicores is not None or not allow:
        return [current]
    vals = {lv for lv in levels if lv <= rb.max_cpu_millicores}
    vals.add(current)
    return sorted(vals)


# how far past the measured span a partial fit may extrapolate (× and ÷). 2.5, not 2: jobs
# grew in ~×2 steps (8 -> 16 -> 28 -> 49 workers), each one more pause and re-plan interval;
# the model's lower band still judges each move (benchmarks/README.md, "PS memory rides along")
SPAN_STRETCH = 2.5


def _within(
    vals: list[int], span: tuple[float, float] | None, unit: float, current: int
) -> list[int]:
    if span is None:
        return vals
    lo, hi = span[0] * unit / SPAN_STRETCH, span[1] * unit * SPAN_STRETCH
    return [v for v in vals if lo - 1e-9 <= v <= hi + 1e-9] or [current]


@dataclass(frozen=True)
class SearchResult:
    workers: RolePlan
    ps: RolePlan
    throughput_sps: float
    objective: float
    current_throughput_sps: float
    current_objective: float
    evaluated: int
    # the best objective among configurations predicted at least ``faster_min_speedup``
    # faster than the current one (None: none is): the move to weigh when the overall best
    # saves no time (a cheaper configuration at about the same speed)
    faster: SearchResult | None = None

    @property
    def gain(self) -> float:
        return math.exp(self.objective - self.current_objective) - 1.0


@dataclass
class SearchMemo:
    """What searches with one model can share: whole results (the same grid, memory per node
    and guards give the same result) and the predicted grids (the model's predictions depend
    on the axes alone, not on memory or guards). :meth:`for_model` forgets them when the
    model changes."""

    model: ThroughputModel | None = None
    results: dict[tuple[object, ...], SearchResult] = dataclasses.field(default_factory=dict)
    grids: dict[tuple[tuple[int, ...], ...], FloatArray] = dataclasses.field(default_factory=dict)

    max_grids: ClassVar[int] = 2  # the worker-only and the free search of one check
    max_results: ClassVar[int] = 64

    def keep_grid(self, key: tuple[tuple[int, ...], ...], x: FloatArray) -> None:
        while len(self.grids) >= self.max_grids:
            del self.grids[next(iter(self.grids))]
        x.flags.writeable = False
        self.grids[key] = x

    def keep_result(self, key: tuple[object, ...], res: SearchResult) -> None:
        while len(self.results) >= self.max_results:
            del self.results[next(iter(self.results))]
        self.results[key] = res

    def for_model(self, model: ThroughputModel) -> SearchMemo:
        if model is not self.model:
            self.results.clear()
            self.grids.clear()
            self.model = model
        return self


@dataclass(frozen=True)
class SearchLimits:
    """Which moves pacing and the guards allow this time."""

    change_workers: bool = True
    change_ps: bool = True
    max_worker_step: int | None = None
    no_more_workers: bool = False  # marginal-speed or PS-saturation guard fired
    ps_capacity_floor: float | None = None  # p·λp must exceed this to add workers
    max_worker_cpu_millicores: int | None = None  # workers cannot use more than this
    avoid: frozenset[ConfigKey] = frozenset()  # configurations abandoned for being slower


def search(
    model: ThroughputModel,
    current: ResourcePlan,
    bounds: JobBounds,
    cfg: PlannerConfig,
    worker_memory_mib: int,
    ps_memory_mib: Callable[[int], int],
    limits: SearchLimits = SearchLimits(),
    memo: SearchMemo | None = None,
) -> SearchResult:
    """``memo``: results of earlier searches with this model, reused when the grid, the
    memory per node and the guards are the same (a search is a pure function of them)."""
    cw, cp = current.workers, current.ps
    uses_ps = bounds.ps.max_count > 0
    wv = _count_values(bounds.workers, cw.count, limits.change_workers, limits.max_worker_step)
    if limits.no_more_workers:
        wv = [n for n in wv if n <= cw.count] or [cw.count]
    pv = _count_values(bounds.ps, cp.count, limits.change_ps and uses_ps, None) if uses_ps else [0]
    levels = cfg.cpu_levels_millicores
    wcv = _cpu_values(bounds.workers, cw.resources.cpu_millicores, limits.change_workers, levels)
    if (
        limits.max_worker_cpu_millicores is not None
        and bounds.workers.pinned_cpu_millicores is None
    ):
        wcv = [c for c in wcv if c <= limits.max_worker_cpu_millicores] or [min(wcv)]
    pcv = (
        _cpu_values(bounds.ps, cp.resources.cpu_millicores, limits.change_ps, levels)
        if uses_ps
        else [cp.resources.cpu_millicores or 1000]
    )
    # a model fitted on samples that never varied an input predicts only at its one value
    fixed = model.fixed_inputs_
    if "workers" in fixed:
        wv = [int(fixed["workers"])]
    if "worker_cpu" in fixed:
        wcv = [millicores_from_cores(fixed["worker_cpu"])]
    if uses_ps and "ps" in fixed:
        pv = [int(fixed["ps"])]
    if uses_ps and "ps_cpu" in fixed:
        pcv = [millicores_from_cores(fixed["ps_cpu"])]
    # and where the fit leaves doubt it extrapolates at most ``SPAN_STRETCH`` beyond what it
    # saw: counts when the fit is partial; a CPU whose every coefficient NNLS left at 0
    # (it would look free: e.g. 0.5 CPU per worker)
    rng = model.ranges_
    if not model.full_rank_:
        wv = _within(wv, rng.get("workers"), 1.0, cw.count)
        if uses_ps:
            pv = _within(pv, rng.get("ps"), 1.0, cp.count)
    if not model.cpu_has_effect("worker_cpu"):
        wcv = _within(wcv, rng.get("worker_cpu"), MILLICORES_PER_CORE, cw.resources.cpu_millicores)
    if uses_ps and not model.cpu_has_effect("ps_cpu"):
        pcv = _within(pcv, rng.get("ps_cpu"), MILLICORES_PER_CORE, cp.resources.cpu_millicores)
    w_mem = (
        bounds.workers.memory(worker_memory_mib)
        if limits.change_workers
        else cw.resources.memory_mib
    )
    p_mem_of = {p: (bounds.ps.memory(ps_memory_mib(p)) if p > 0 else 0) for p in pv}
    if not limits.change_ps:
        p_mem_of = {p: cp.resources.memory_mib for p in pv}
    key: tuple[object, ...] = ()
    if memo is not None:
        memo = memo.for_model(model)
        key = (
            tuple(wv), tuple(pv), tuple(wcv), tuple(pcv), w_mem,
            tuple(p_mem_of[p] for p in pv), limits.ps_capacity_floor, limits.avoid, cw, cp,
            bounds.quota, cfg.min_elasticity, cfg.memory_gib_per_core, cfg.faster_min_speedup,
        )  # fmt: skip
        hit = memo.results.get(key)
        if hit is not None:
            return hit
    res = _evaluate(model, current, bounds, cfg, limits, wv, pv, wcv, pcv, w_mem, p_mem_of, memo)
    if memo is not None:
        memo.keep_result(key, res)
    return res


def _evaluate(
    model: ThroughputModel,
    current: ResourcePlan,
    bounds: JobBounds,
    cfg: PlannerConfig,
    limits: SearchLimits,
    wv: list[int],
    pv: list[int],
    wcv: list[int],
    pcv: list[int],
    w_mem: int,
    p_mem_of: dict[int, int],
    memo: SearchMemo | None = None,
) -> SearchResult:
    """The objective on the grid of the four axes; the best point (and the best clearly
    faster one when the best is not)."""
    cw, cp = current.workers, current.ps
    uses_ps = bounds.ps.max_count > 0
    # the grid as four broadcast axes (workers, PS, CPU per worker, CPU per PS): every
    # quantity below is a sum of per-axis terms, so no 4 × n design matrix is built
    W = np.asarray(wv, dtype=np.float64).reshape(-1, 1, 1, 1)
    P = np.asarray(pv, dtype=np.float64).reshape(1, -1, 1, 1)
    WC = np.asarray(wcv, dtype=np.float64).reshape(1, 1, -1, 1)
    PC = np.asarray(pcv, dtype=np.float64).reshape(1, 1, 1, -1)
    PM = np.array([p_mem_of[p] for p in pv], dtype=np.float64).reshape(1, -1, 1, 1)
    q = bounds.quota
    tot_cpu, tot_mem = W * WC + P * PC, W * float(w_mem) + P * PM
    ok = (tot_cpu <= q.cpu_millicores) & (tot_mem <= q.memory_mib)
    if limits.ps_capacity_floor is not None:
        ok = ok & ((cw.count >= W) | (limits.ps_capacity_floor < P * PC))
    for aw, ap, awc, apc in limits.avoid:
        ok = ok & ~(np.equal(W, aw) & np.equal(P, ap) & np.equal(WC, awc) & np.equal(PC, apc))
    ok = np.broadcast_to(ok, (len(wv), len(pv), len(wcv), len(pcv)))
    # always evaluate the current configuration too
    cur = np.array(
        [
            [
                cw.count,
                cp.count,
                cw.resources.cpu_cores,
                cp.resources.cpu_cores,
            ]
        ]
    )
    in_span = not model.span_problems(cur)
    n_ok = int(np.count_nonzero(ok))
    # no PS (all-reduce): a placeholder PS CPU the model ignores
    p_cpu = np.asarray(pcv, dtype=np.float64) / MILLICORES_PER_CORE if uses_ps else np.ones(1)
    x = None
    if n_ok:
        gkey = (tuple(wv), tuple(pv), tuple(wcv), tuple(pcv))
        x = memo.grids.get(gkey) if memo is not None else None
        if x is None:
            x = model.predict_grid(W.ravel(), P.ravel(), WC.ravel() / MILLICORES_PER_CORE, p_cpu)
            if memo is not None:
                memo.keep_grid(gkey, x)
    # the current configuration: its grid point when the axes hold it (element-wise, the
    # grid's arithmetic is that of a one-point grid), else on its own one-point grid
    at_cur = _grid_index(
        (wv, pv, wcv, pcv),
        (cw.count, cp.count, cw.resources.cpu_millicores, cp.resources.cpu_millicores),
        uses_ps,
    )
    if not in_span:
        x_cur = 0.0
    elif x is not None and at_cur is not None:
        x_cur = float(x[at_cur])
    else:
        x_cur = float(
            model.predict_grid(
                [cw.count],
                [cp.count],
                [cw.resources.cpu_cores],
                [cp.resources.cpu_cores if uses_ps else 1.0],
            )[0, 0, 0, 0]
        )
    c_cur = float(
        cost(
            cw.count,
            cp.count,
            cw.resources.cpu_millicores,
            cp.resources.cpu_millicores,
            cw.resources.memory_mib,
            cp.resources.memory_mib,
            cfg.memory_gib_per_core,
        )
    )

    def objective_now(x_now: float) -> float:
        if not in_span:
            return -50.0  # the current configuration is outside what the model knows
        return math.log(max(x_now, 1e-12)) - cfg.min_elasticity * math.log(max(c_cur, 1e-12))

    j_cur = objective_now(x_cur)
    if x is None:
        return SearchResult(cw, cp, x_cur, j_cur, x_cur, j_cur, 0)
    # cost() on the grid, reusing its CPU total (the same expression, element by element)
    c = tot_cpu / MILLICORES_PER_CORE + tot_mem / MIB_PER_GIB / cfg.memory_gib_per_core
    log_c = np.log(np.maximum(c, 1e-12, out=c), out=c)
    log_c *= cfg.min_elasticity
    j = np.log(np.maximum(x, 1e-12))
    j -= log_c
    j[~ok] = -np.inf

    def at(flat: int, n: int) -> SearchResult:
        iw, ip, iwc, ipc = np.unravel_index(flat, j.shape)
        workers = RolePlan(int(wv[iw]), NodeResources(int(wcv[iwc]), int(w_mem)))
        ps = RolePlan(int(pv[ip]), NodeResources(int(pcv[ipc]), int(p_mem_of[pv[ip]])))
        return SearchResult(
            workers, ps, float(x[iw, ip, iwc, ipc]), float(j[iw, ip, iwc, ipc]), x_cur, j_cur, n
        )

    best = at(int(np.argmax(j)), n_ok)
    faster = None
    if in_span and x_cur > 0 and best.throughput_sps < x_cur * (1 + cfg.faster_min_speedup):
        jf = np.where(x >= x_cur * (1 + cfg.faster_min_speedup), j, -np.inf)
        k = int(np.argmax(jf))
        if np.isfinite(jf.flat[k]):
            faster = at(k, n_ok)
    return dataclasses.replace(best, faster=faster) if faster is not None else best


def _grid_index(
    axes: tuple[list[int], list[int], list[int], list[int]],
    point: tuple[int, int, int, int],
    uses_ps: bool,
) -> tuple[int, int, int, int] | None:
    """Where ``point`` (workers, PS, CPU per worker and per PS in millicores) lies on the
    grid's axes, or None. Without PS the PS CPU axis is a placeholder of one value."""
    out = []
    for k, (vals, v) in enumerate(zip(axes, point, strict=True)):
        if not uses_ps and k == 3:
            out.append(0)
            continue
        try:
            out.append(vals.index(v))
        except ValueError:
            return None
    return (out[0], out[1], out[2], out[3])


# --- sampling: configurations to try before the model can be trusted --------------------


def sampling_candidates(
    current: ResourcePlan,
    bounds: JobBounds,
    cfg: PlannerConfig,
    observations: Sequence[Observation],
) -> list[tuple[RolePlan, RolePlan, str]]:
    """Moves from the current configuration that vary one input at a time (so each
    coefficient gets its own evidence), in an order that also heads towards a better
    configuration: CPU per worker towards what workers use, one more PS, more workers, CPU per
    PS towards what the PS use, then wider moves. Each kind is proposed once per job. One
    exception: workers grown until the PS are busy also drop to the CPU they use when they
    use well under theirs (speed before identifiability: that move is the first of most
    cold starts, and the rest of a short job runs on it)."""
    w, p = current.workers, current.ps
    last = observations[-1] if observations else None
    levels = cfg.cpu_levels_millicores
    w_used = max((n.cpu_used_millicores for n in last.of(Role.WORKER)), default=0) if last else 0
    p_used = max((n.cpu_used_millicores for n in last.of(Role.PS)), default=0) if last else 0
    uses_ps = bounds.ps.max_count > 0
    out: list[tuple[RolePlan, RolePlan, str]] = []

    def wcpu(m: float) -> NodeResources:
        return NodeResources(_nearest_level(m, levels), w.resources.memory_mib)

    def pcpu(m: float) -> NodeResources:
        return NodeResources(_nearest_level(m, levels), p.resources.memory_mib)

    wc, pc = w.resources.cpu_millicores, p.resources.cpu_millicores
    # a worker using well under its CPU is limited elsewhere: try it at what it uses
    underused = 0 < w_used < 0.6 * wc
    w_target = w_used * 1.3 if underused else wc * 2.0
    if uses_ps and pc > 0 and p_used >= cfg.hot_ps_cpu_util * pc:
        # the PS are the bottleneck: DLRover's PS rule, enough PS for ~70 % busy (≤ ×4)
        more = min(4 * p.count, math.ceil(p.count * p_used / (cfg.idle_target_util * pc)))
        if more > p.count:
            out.append((w, RolePlan(more, p.resources), "PS until they are 70% busy"))
    if uses_ps and pc > 0 and 0 < p_used < cfg.worker_ps_target_util * pc:
        # DLRover's worker rule: grow workers until the busiest PS is ~85 % busy (≤ +8)
        grow = math.ceil(w.count * cfg.worker_ps_target_util * pc / p_used)
        grow = min(grow, w.count + cfg.worker_step(w.count))
        if grow > w.count:
            # ... each at the CPU it uses when it uses well under what it has: the first
            # move of a cold start (1 worker of 16 CPU) would otherwise multiply the idle
            # cores by up to 9 for the rest of a short job (issue 10, session 11: per-core
            # +0.02..+0.05 of the oracle's on seeds 0-3 and 101-105)
            res = wcpu(w_target) if underused else w.resources
            out.append((RolePlan(grow, res), p, "workers until the PS are busy"))
    out.append((RolePlan(w.count, wcpu(w_target)), p, "CPU per worker towards its use"))
    if uses_ps:
        out.append((w, RolePlan(p.count + 1, p.resources), "one more PS"))
    out.append((RolePlan(max(w.count * 2, w.count + 1), w.resources), p, "double the workers"))
    if uses_ps:
        p_target = p_used / 0.7 if 0 < p_used < 0.5 * pc else pc * 2.0
        out.append((w, RolePlan(p.count, pcpu(p_target)), "CPU per PS towards its use"))
    out.append((RolePlan(max(w.count + 1, int(w.count * 1.5)), w.resources), p, "workers × 1.5"))
    out.append(
        (RolePlan(max(1, w.count // 2), wcpu(wc * 2.0)), p, "half the workers, twice the CPU")
    )
    if uses_ps:
        out.append((w, RolePlan(p.count + 2, pcpu(pc * 0.5)), "two more PS at half CPU"))
    out.append((RolePlan(w.count + 2, wcpu(wc * 0.5)), p, "two more workers at half CPU"))
    return out


def bottleneck_candidates(
    current: ResourcePlan,
    bounds: JobBounds,
    cfg: PlannerConfig,
    observations: Sequence[Observation],
) -> list[tuple[RolePlan, RolePlan, str]]:
    """DLRover's closed-form moves for a bottleneck the last observation shows, for when no
    model can be trusted: every PS hot -> CPU per PS towards ~70 % busy (at most ×4, up to
    the largest level), or more PS once the CPU is at its cap; the busiest PS well under
    ``worker_ps_target_util`` -> more workers until it would be (≤ ``max_worker_step``)."""
    w, p = current.workers, current.ps
    last = observations[-1] if observations else None
    if last is None or p.count == 0:
        return []
    ps_nodes = last.of(Role.PS)
    if not ps_nodes:
        return []
    levels = cfg.cpu_levels_millicores
    pc = p.resources.cpu_millicores
    utils = [n.cpu_util for n in ps_nodes]
    out: list[tuple[RolePlan, RolePlan, str]] = []
    if min(utils) >= cfg.hot_ps_cpu_util:
        top = min(bounds.ps.max_cpu_millicores, max(levels))
        if pc < top:
            want = min(4 * pc, pc * max(utils) / cfg.idle_target_util)
            up = min((lv for lv in levels if lv >= want), default=top)
            new_pc = min(max(up, _next_level(pc, levels)), top)
            out.append((w, RolePlan(p.count, NodeResources(new_pc, p.resources.memory_mib)),
                        "every PS hot: CPU per PS towards 70% busy"))  # fmt: skip
        more = min(4 * p.count, math.ceil(p.count * max(utils) / cfg.idle_target_util))
        if more > p.count:
            out.append((w, RolePlan(more, p.resources), "every PS hot: PS until 70% busy"))
    elif 0 < max(utils) < cfg.worker_ps_target_util:
        grow = math.ceil(w.count * cfg.worker_ps_target_util / max(utils))
        grow = min(grow, w.count + cfg.worker_step(w.count))
        if grow > w.count:
            out.append((RolePlan(grow, w.resources), p, "PS under their target: more workers"))
    return out


def _next_level(m: int, levels: Sequence[int]) -> int:
    return min((lv for lv in levels if lv > m), default=m)


def _nearest_level(m: float, levels: Sequence[int]) -> int:
    return min(levels, key=lambda lv: (abs(lv - m), lv))


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
