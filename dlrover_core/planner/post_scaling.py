"""Stage 3: react to instability seen in live observations — pending nodes, PS memory
running out (observed or predicted), hot PS, stragglers, idle PS.

Evidence must come from the current configuration: only observations made after the current
plan took effect count, and a condition must hold in ``hot_window`` consecutive ones.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from dlrover_core.faults import PendingAction, PendingPolicy, find_stragglers, pending_action
from dlrover_core.planner.bounds import JobBounds, RoleBounds, ceil_mib, round_up_level
from dlrover_core.planner.config import PlannerConfig
from dlrover_core.planner.memory_sizing import PSMemoryFit, fit_ps_memory
from dlrover_core.spec import JobSpec
from dlrover_core.types import (
    NodeOverride,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
    RolePlan,
    Stage,
)
from dlrover_core.units import cores

# id(observation) -> (the observation, the straggler ratio, the stragglers it shows)
StragglerMemo = dict[int, tuple[Observation, float, frozenset[int]]]


def _recent(observations: Sequence[Observation], since_s: float, k: int) -> list[Observation]:
    fresh = [o for o in observations if o.time_s > since_s]
    return fresh[-k:] if len(fresh) >= k else []


def _steady(
    cfg: PlannerConfig, observations: Sequence[Observation], since_s: float
) -> list[Observation]:
    """The last ``hot_window`` observations after ``since_s`` when every running node in
    them had run ``worker_stable_s`` (else none): a node's first seconds are its start-up's
    (imports, a checkpoint restore, an empty input pipeline), not its load, and its peers'
    load waits on it. Without this a PS relaunched by a memory raise read as hot while it
    restored its checkpoint, so one resumed run made three plans."""
    window = _recent(observations, since_s, cfg.hot_window)
    return window if all(o.settled(cfg.worker_stable_s) for o in window) else []


def _persistent(window: Sequence[Observation], role: Role, pred: object) -> list[int]:
    """Node ids of ``role`` for which ``pred(node)`` holds in every observation of the window."""
    ids: set[int] | None = None
    for o in window:
        hit = {n.node_id for n in o.of(role) if pred(n)}  # type: ignore[operator]
        ids = hit if ids is None else ids & hit
    return sorted(ids or ())


def _with(
    current: ResourcePlan,
    now_s: float,
    reasons: list[str],
    *,
    workers: RolePlan | None = None,
    ps: RolePlan | None = None,
    overrides: tuple[NodeOverride, ...] | None = None,
    action: str = "",
) -> ResourcePlan:
    return current.replace(
        workers=workers or current.workers,
        ps=ps or current.ps,
        overrides=current.overrides if overrides is None else overrides,
        stage=Stage.POST_SCALING,
        reasons=tuple(reasons),
        created_at_s=now_s,
        action=action,
    )


def _merge(old: tuple[NodeOverride, ...], new: Sequence[NodeOverride]) -> tuple[NodeOverride, ...]:
    keys = {(o.role, o.node_id) for o in new}
    return tuple(o for o in old if (o.role, o.node_id) not in keys) + tuple(new)


def post_scale(
    spec: JobSpec,
    cfg: PlannerConfig,
    current: ResourcePlan,
    observations: Sequence[Observation],
    now_s: float,
    *,
    past_plans: Sequence[ResourcePlan] = (),
    ps_fit: PSMemoryFit | None = None,
    bounds: JobBounds | None = None,
    straggler_memo: StragglerMemo | None = None,
) -> ResourcePlan | None:
    """``ps_fit``: the PS memory fit of these observations when the caller has made it.
    ``straggler_memo``: each observation's stragglers, kept by a caller that re-checks a
    sliding window (an observation's verdict never changes)."""
    bounds = bounds or JobBounds.from_spec(spec)
    plan = _pending(spec, cfg, bounds, current, observations, now_s)
    if plan is None:
        plan = _ps_memory(spec, cfg, bounds, current, observations, now_s, ps_fit)
    if plan is None:
        plan = _hot_ps(spec, cfg, bounds, current, observations, now_s)
    if plan is None:
        plan = _stragglers(spec, cfg, bounds, current, observations, now_s, straggler_memo)
    if plan is not None:
        return plan
    # shrinking idle PS only saves cost: never while configurations are being sampled (the
    # next sample or the model re-sizes the PS anyway) and at most once per run
    if current.stage is Stage.SAMPLING:
        return None
    if not any(p.action == IDLE_PS for p in past_plans):
        plan = _idle_ps(spec, cfg, bounds, current, observations, now_s)
    if plan is None and not any(p.action == IDLE_WORKERS for p in past_plans):
        plan = _idle_workers(cfg, bounds, current, observations, now_s)
    return plan


IDLE_PS = "idle_ps"
IDLE_WORKERS = "idle_workers"


def _headroom(bounds: JobBounds, plan: ResourcePlan) -> NodeResources:
    return bounds.quota - plan.total


def _grows(fit: PSMemoryFit, last: Observation) -> bool:
    return (
        fit.growth is not None and last.samples_total > 0 and last.samples_done < last.samples_total
    )


def _ps_limit(plan: ResourcePlan) -> int:
    """The smallest PS memory of ``plan`` (MiB): where the busiest PS runs out first."""
    return min(plan.node_resources(Role.PS, i).memory_mib for i in range(plan.ps.count))


def _can_wait(cfg: PlannerConfig, last: Observation, limit: int, oom_at: float | None) -> bool:
    """A predicted PS OOM may wait for the next move when, at the measured speed, it is more
    than ``ps_memory_defer_s`` away and no PS uses ``ps_memory_defer_util`` of its memory yet
    (a raise on its own is one more PS restart; riding along with a move it costs none)."""
    if cfg.ps_memory_defer_s <= 0 or oom_at is None or last.throughput_sps <= 0:
        return False
    busiest = max((n.memory_used_mib for n in last.of(Role.PS)), default=limit)
    if busiest >= cfg.ps_memory_defer_util * limit:
        return False
    return (oom_at - last.samples_done) / last.throughput_sps > cfg.ps_memory_defer_s


def ps_memory_along(
    cfg: PlannerConfig,
    bounds: JobBounds,
    current: ResourcePlan,
    plan: ResourcePlan,
    observations: Sequence[Observation],
    fit: PSMemoryFit,
) -> ResourcePlan:
    """``plan`` (a move away from ``current``) with the PS memory the end of training needs,
    when it keeps the PS as they are and the memory fit predicts that the busiest PS
    outgrows them: a raise that could wait (see :func:`_can_wait`) rides along."""
    ps = plan.ps
    # a plan that changes the PS (stage 3's own memory moves included) sizes them itself
    if (
        not observations
        or ps.count == 0
        or ps != current.ps
        or any(o.role is Role.PS for o in plan.overrides)
        or not _grows(fit, observations[-1])
    ):
        return plan
    peak = fit.per_ps_mib(ps.count)
    if peak <= _ps_limit(plan):
        return plan
    raised = _raised_ps(cfg, bounds, plan, peak)
    if raised is None:
        return plan
    return plan.replace(
        ps=raised,
        reasons=(
            *plan.reasons,
            f"PS memory raised to {raised.resources.memory_mib} MiB with this move: the "
            f"busiest PS reaches {peak:,.0f} MiB by the end of training (memory model "
            f"{fit.source})",
        ),
    )


def _raised_ps(
    cfg: PlannerConfig, bounds: JobBounds, plan: ResourcePlan, peak: float
) -> RolePlan | None:
    """``plan``'s PS with the memory a busiest PS of ``peak`` MiB needs (with margin), or
    None when that is over the PS cap, the quota's headroom, or the memory is pinned."""
    ps = plan.ps
    need = ceil_mib(peak * cfg.ps_memory_margin)
    extra = (need - ps.resources.memory_mib) * ps.count
    if (
        bounds.ps.pinned_memory_mib is not None
        or need > bounds.ps.max_memory_mib
        or extra > _headroom(bounds, plan).memory_mib
    ):
        return None
    return RolePlan(ps.count, NodeResources(ps.resources.cpu_millicores, need))


PENDING_DROP = "pending_drop"  # workers the cluster cannot schedule, dropped from the plan


def _pending(
    spec: JobSpec,
    cfg: PlannerConfig,
    bounds: JobBounds,
    current: ResourcePlan,
    observations: Sequence[Observation],
    now_s: float,
) -> ResourcePlan | None:
    """Nodes pending past ``pending_timeout_s``: relaunched at a smaller size (the paper's
    rule, ``faults.pending_action``). A worker already at the smallest size on offer is
    dropped instead, while other workers run and the count may shrink: the plan shrinks to
    what the cluster can run rather than stall (``PENDING_DROP``; :func:`capacity_cap`
    then keeps later plans from asking for those workers again). A PS at the floors waits
    (the controller fails the job once ``pending_action`` gives up on it)."""
    if not observations:
        return None
    policy = PendingPolicy(timeout_s=cfg.pending_timeout_s)
    last = observations[-1]
    moves = []
    stuck: list[tuple[int, str]] = []  # workers with nothing smaller on offer
    for n in last.nodes:
        if n.state is not NodeState.PENDING:
            continue
        d = pending_action(n.state_since_s, now_s, n.allocated, policy)
        if d.action is not PendingAction.RELAUNCH:
            # a drop needs the wait under the current plan: after one, a worker that stays
            # pending (a lower id, placed once a dropped one leaves) gets a full timeout
            since = max(n.state_since_s, current.created_at_s)
            if n.role is Role.WORKER and now_s - since >= policy.timeout_s:
                stuck.append((n.node_id, d.reason))
            continue
        # a smaller request, but not less memory for a node that came near its limit (a PS
        # relaunched after an OOM with more memory, shrunk back, OOMs again: seed 206)
        full = any(
            m.memory_util >= cfg.hot_ps_memory_util
            for o in observations
            for m in o.nodes
            if m.role is n.role and m.node_id == n.node_id
        )
        res = d.resources
        if full:
            res = NodeResources(res.cpu_millicores, n.allocated.memory_mib)
        if res != n.allocated:
            moves.append(NodeOverride(n.role, n.node_id, res, f"pending: {d.reason}", "relaunch"))
    workers = current.workers
    drop_reason = ""
    running = sum(1 for n in last.of(Role.WORKER) if n.state is NodeState.RUNNING)
    if stuck and running and not bounds.workers.count_fixed:
        keep = max(bounds.workers.min_count, workers.count - len(stuck), 1)
        if keep < workers.count:
            ids = ", ".join(f"worker-{i}" for i, _ in sorted(stuck))
            drop_reason = (
                f"{ids} {stuck[0][1]}; the plan shrinks to {keep} worker(s), what the "
                f"cluster can run ({running} running)"
            )
            workers = RolePlan(keep, workers.resources)
    if not moves and not drop_reason:
        return None
    overrides = _merge(current.overrides, moves)
    if drop_reason:
        overrides = tuple(
            o for o in overrides if o.role is not Role.WORKER or o.node_id < workers.count
        )
    reasons = [f"{m.role.value}-{m.node_id} {m.reason}" for m in moves]
    reasons += [drop_reason] if drop_reason else []
    action = PENDING_DROP if drop_reason else "pending"
    return _with(current, now_s, reasons, workers=workers, overrides=overrides, action=action)


def capacity_cap(bounds: JobBounds, plans: Sequence[ResourcePlan]) -> JobBounds:
    """``bounds`` with the worker count capped at the smallest count a ``PENDING_DROP`` plan
    of this run shrank to: the cluster could not schedule more, so no later plan (a model
    move, a sample) asks for them again in this run. A new run starts uncapped."""
    caps = [p.workers.count for p in plans if p.action == PENDING_DROP]
    if not caps:
        return bounds
    w = bounds.workers
    cap = max(min(caps), w.min_count)
    if cap >= w.max_count:
        return bounds
    return dataclasses.replace(bounds, workers=dataclasses.replace(w, max_count=cap))


def _ps_memory(
    spec: JobSpec,
    cfg: PlannerConfig,
    bounds: JobBounds,
    current: ResourcePlan,
    observations: Sequence[Observation],
    now_s: float,
    fit: PSMemoryFit | None = None,
) -> ResourcePlan | None:
    """Predicted OOM first (pre-tuning: act before it happens), then memory-hot PS."""
    ps = current.ps
    if ps.count == 0 or not observations:
        return None
    last = observations[-1]
    fit = fit or fit_ps_memory(spec, observations, cfg.worker_stable_s)
    if _grows(fit, last):
        limit = _ps_limit(current)
        peak = fit.per_ps_mib(ps.count)
        oom_at = fit.oom_at_samples(ps.count, limit) if peak > limit else None
        # far ahead, the raise rides along with the next move (ps_memory_along), or comes on
        # its own once the OOM is ps_memory_defer_s away
        if peak > limit and not _can_wait(cfg, last, limit, oom_at):
            why = (
                f"predicted PS OOM: the busiest PS reaches {peak:,.0f} MiB by the end of "
                f"training (limit {limit} MiB"
                + (f", at ~{oom_at:,.0f} samples" if oom_at else "")
                + f"; memory model {fit.source})"
            )
            new_ps = _raised_ps(cfg, bounds, current, peak)
            if new_ps is not None:
                keep = tuple(o for o in current.overrides if o.role is not Role.PS)
                return _with(
                    current,
                    now_s,
                    [why, f"raise PS memory to {new_ps.resources.memory_mib} MiB now"],
                    ps=new_ps,
                    overrides=keep,
                    action="ps_memory",
                )
            if not bounds.ps.count_fixed:
                mem = ps.resources.memory_mib
                for n in range(ps.count + 1, bounds.ps.max_count + 1):
                    if fit.per_ps_mib(n) * cfg.ps_memory_margin <= mem:
                        if (ps.resources * (n - ps.count)).fits_in(_headroom(bounds, current)):
                            return _with(
                                current,
                                now_s,
                                [why, f"grow PS from {ps.count} to {n} to spread the rows"],
                                ps=RolePlan(n, ps.resources),
                                action="ps_memory",
                            )
                        break
    window = _recent(observations, current.created_at_s, cfg.hot_window)
    if not window:
        return None
    hot = _persistent(window, Role.PS, lambda n: n.memory_util > cfg.hot_ps_memory_util)
    if not hot or bounds.ps.pinned_memory_mib is not None:
        return None
    moves = []
    head = _headroom(bounds, current).memory_mib
    for node_id in hot:
        cur = current.node_resources(Role.PS, node_id)
        new_mem = min(
            cur.memory_mib + cfg.hot_ps_memory_step_mib,
            bounds.ps.max_memory_mib,
            cur.memory_mib + head,
        )
        if new_mem <= cur.memory_mib:
            continue
        head -= new_mem - cur.memory_mib
        moves.append(
            NodeOverride(
                Role.PS,
                node_id,
                NodeResources(cur.cpu_millicores, new_mem),
                f"memory-hot (> {cfg.hot_ps_memory_util:.0%} for {cfg.hot_window} samples)",
            )
        )
    if not moves:
        return None
    reasons = [f"ps-{m.node_id} {m.reason}: memory -> {m.resources.memory_mib} MiB" for m in moves]
    return _with(
        current, now_s, reasons, overrides=_merge(current.overrides, moves), action="ps_memory"
    )


def _hot_ps(
    spec: JobSpec,
    cfg: PlannerConfig,
    bounds: JobBounds,
    current: ResourcePlan,
    observations: Sequence[Observation],
    now_s: float,
) -> ResourcePlan | None:
    if current.ps.count == 0 or bounds.ps.pinned_cpu_millicores is not None:
        return None
    window = _steady(cfg, observations, current.created_at_s)
    if not window:
        return None
    hot = _persistent(window, Role.PS, lambda n: n.cpu_util >= cfg.hot_ps_cpu_util)
    running = {n.node_id for n in window[-1].of(Role.PS)}
    if not hot:
        return None
    head = _headroom(bounds, current).cpu_millicores
    levels = cfg.cpu_levels_millicores
    if set(hot) >= running and len(running) > 1:
        return None  # every PS is busy: capacity, not imbalance — stage 2 adds PS or CPU
    # one migration for every PS near the mark too (hysteresis): a PS just under it would
    # turn hot once its neighbour is relieved and cost a second pause
    near = cfg.hot_ps_cpu_util - cfg.ps_hot_hysteresis
    also = {n.node_id for n in window[-1].of(Role.PS) if n.cpu_util >= near}
    moves = []
    for node_id in sorted(set(hot) | also):
        cur = current.node_resources(Role.PS, node_id)
        want = round_up_level(cur.cpu_millicores * cfg.hot_ps_cpu_factor, levels)
        new_cpu = min(want, bounds.ps.max_cpu_millicores, cur.cpu_millicores + head)
        if new_cpu <= cur.cpu_millicores:
            continue
        head -= new_cpu - cur.cpu_millicores
        moves.append(
            NodeOverride(
                Role.PS,
                node_id,
                NodeResources(new_cpu, cur.memory_mib),
                f"hot PS (CPU ≥ {cfg.hot_ps_cpu_util:.0%} for {cfg.hot_window} samples)",
            )
        )
    if not moves:
        return None
    reasons = [
        f"ps-{m.node_id} {m.reason}: migrate to {m.resources.cpu_cores:g} CPU" for m in moves
    ]
    return _with(
        current, now_s, reasons, overrides=_merge(current.overrides, moves), action="hot_ps"
    )


def _stragglers(
    spec: JobSpec,
    cfg: PlannerConfig,
    bounds: JobBounds,
    current: ResourcePlan,
    observations: Sequence[Observation],
    now_s: float,
    memo: StragglerMemo | None = None,
) -> ResourcePlan | None:
    window = _steady(cfg, observations, current.created_at_s)
    if not window:
        return None
    slow: set[int] | None = None
    for o in window:
        hit = memo.get(id(o)) if memo is not None else None
        if hit is not None and hit[0] is o and hit[1] == cfg.straggler_ratio:
            found = hit[2]
        else:
            speeds = {n.node_id: n.throughput_sps for n in o.of(Role.WORKER)}
            found = frozenset(find_stragglers(speeds, ratio=cfg.straggler_ratio))
            if memo is not None:
                memo[id(o)] = (o, cfg.straggler_ratio, found)
        slow = set(found) if slow is None else slow & found
    # a node replaced once already is not replaced again (it was not the node's fault)
    slow = {
        i
        for i in slow or ()
        if not any(
            o.role is Role.WORKER and o.node_id == i and o.action == "relaunch"
            for o in current.overrides
        )
    }
    if not slow:
        return None
    pays, why = _replacement_pays(cfg, window[-1], slow)
    if not pays:
        return None
    moves = [
        NodeOverride(
            Role.WORKER,
            i,
            current.node_resources(Role.WORKER, i),
            f"straggler (< {cfg.straggler_ratio:.0%} of the median worker speed)",
            "relaunch",
        )
        for i in sorted(slow)
    ]
    reasons = [f"worker-{m.node_id} {m.reason}: replace it" for m in moves] + [why]
    return _with(
        current, now_s, reasons, overrides=_merge(current.overrides, moves), action="straggler"
    )


def _replacement_pays(cfg: PlannerConfig, last: Observation, slow: set[int]) -> tuple[bool, str]:
    """Does replacing the ``slow`` workers save more time than the pause it costs? In PS
    training each worker adds its own speed, so a straggler at speed s, replaced by one at
    the median m, adds m − s: the time saved is what is left × the share that adds, against
    ``min_saved_pause_multiple`` worker pauses (no speed or no total known: replace)."""
    speeds = {n.node_id: n.throughput_sps for n in last.of(Role.WORKER)}
    total = sum(speeds.values())
    if total <= 0 or last.samples_total <= 0 or last.throughput_sps <= 0:
        return True, "no speed to weigh the replacement against"
    med = float(statistics.median(speeds.values()))
    gain = sum(max(0.0, med - speeds.get(i, med)) for i in slow)
    left_s = max(0.0, last.samples_total - last.samples_done) / last.throughput_sps
    saved = left_s - (cfg.worker_change_pause_s + left_s * total / (total + gain))
    need = cfg.min_saved_pause_multiple * cfg.worker_change_pause_s
    note = (
        f"the replacement saves ~{saved / 60:.1f} min of ~{left_s / 60:.0f} min left "
        f"(needs {need / 60:.1f}) after a {cfg.worker_change_pause_s:.0f} s pause"
    )
    return saved >= need, note


def _idle_left_s(cfg: PlannerConfig, last: Observation) -> float | None:
    """Seconds left at the last observed speed, when at least ``idle_min_remaining_s``
    (None: less, or unknown: no progress, or a speed so small the time overflows)."""
    if last.throughput_sps <= 0:
        return None
    left_s = (last.samples_total - last.samples_done) / last.throughput_sps
    if not math.isfinite(left_s) or left_s < cfg.idle_min_remaining_s:
        return None
    return left_s


def _cpu_for_use(cfg: PlannerConfig, rb: RoleBounds, used_millicores: float) -> int:
    """The CPU level at which ``used_millicores`` is ``idle_target_util`` busy (in bounds)."""
    return rb.cpu(round_up_level(used_millicores / cfg.idle_target_util, cfg.cpu_levels_millicores))


def _idle_ps(
    spec: JobSpec,
    cfg: PlannerConfig,
    bounds: JobBounds,
    current: ResourcePlan,
    observations: Sequence[Observation],
    now_s: float,
) -> ResourcePlan | None:
    ps = current.ps
    if ps.count == 0 or bounds.ps.pinned_cpu_millicores is not None:
        return None
    window = _steady(cfg, observations, current.created_at_s)
    if not window:
        return None
    last = window[-1]
    remaining_s = _idle_left_s(cfg, last)
    if not last.of(Role.PS) or remaining_s is None:
        return None
    if any(n.cpu_util >= cfg.idle_ps_cpu_util for o in window for n in o.of(Role.PS)):
        return _idle_ps_nodes(cfg, bounds, current, window, now_s, remaining_s)
    peak = max(n.cpu_used_millicores for o in window for n in o.of(Role.PS))
    new_cpu = _cpu_for_use(cfg, bounds.ps, peak)
    if new_cpu >= ps.resources.cpu_millicores:
        return None
    reasons = [
        f"idle PS (CPU < {cfg.idle_ps_cpu_util:.0%} for {cfg.hot_window} samples, "
        f"~{math.ceil(remaining_s / 60)} min left): shrink to {cores(new_cpu):g} CPU each"
    ]
    new_ps = RolePlan(ps.count, NodeResources(new_cpu, ps.resources.memory_mib))
    keep = tuple(o for o in current.overrides if o.role is not Role.PS)
    return _with(current, now_s, reasons, ps=new_ps, overrides=keep, action=IDLE_PS)


def _idle_ps_nodes(
    cfg: PlannerConfig,
    bounds: JobBounds,
    current: ResourcePlan,
    window: Sequence[Observation],
    now_s: float,
    remaining_s: float,
) -> ResourcePlan | None:
    """Some PS busy, the others idle (a skewed load: the busy ones hold the hot shards):
    each idle PS moves to a node sized for what it uses at ``idle_target_util``, the busy
    ones keep theirs. Only when that frees at least ``idle_min_cut`` of the PS cores."""
    peak: dict[int, int] = {}
    for o in window:
        for n in o.of(Role.PS):
            peak[n.node_id] = max(peak.get(n.node_id, 0), n.cpu_used_millicores)
    moves: list[NodeOverride] = []
    had = freed = 0
    for i in range(current.ps.count):
        res = current.node_resources(Role.PS, i)
        had += res.cpu_millicores
        used = peak.get(i)
        if used is None or used >= cfg.idle_ps_cpu_util * res.cpu_millicores:
            continue
        cpu = _cpu_for_use(cfg, bounds.ps, used)
        if cpu < res.cpu_millicores:
            freed += res.cpu_millicores - cpu
            moves.append(NodeOverride(
                Role.PS, i, NodeResources(cpu, res.memory_mib),
                f"idle PS (CPU < {cfg.idle_ps_cpu_util:.0%}): {cores(cpu):g} CPU", "migrate",
            ))  # fmt: skip
    if not moves or freed < cfg.idle_min_cut * had:
        return None
    reasons = [
        f"ps-{m.node_id} idle while others are busy (a skewed load, ~{math.ceil(remaining_s / 60)}"
        f" min left): move it to {m.resources.cpu_cores:g} CPU"
        for m in moves
    ]
    return _with(
        current, now_s, reasons, overrides=_merge(current.overrides, moves), action=IDLE_PS
    )


def _idle_workers(
    cfg: PlannerConfig,
    bounds: JobBounds,
    current: ResourcePlan,
    observations: Sequence[Observation],
    now_s: float,
) -> ResourcePlan | None:
    """Workers that wait on the PS or the network use a fraction of their CPU for as long as
    the configuration holds: when the busiest uses under ``idle_worker_cpu_util`` of it over
    the window and an hour is left, CPU per worker drops to what they use at
    ``idle_target_util`` (once a run, DLRover's "CPU = observed use" made a rule)."""
    w = current.workers
    if w.count == 0 or bounds.workers.pinned_cpu_millicores is not None:
        return None
    window = _steady(cfg, observations, current.created_at_s)
    remaining_s = _idle_left_s(cfg, window[-1]) if window else None
    if remaining_s is None:
        return None
    nodes = [n for o in window for n in o.of(Role.WORKER)]
    if not nodes or any(n.cpu_util >= cfg.idle_worker_cpu_util for n in nodes):
        return None
    new_cpu = _cpu_for_use(cfg, bounds.workers, max(n.cpu_used_millicores for n in nodes))
    if new_cpu >= w.resources.cpu_millicores:
        return None
    reasons = [
        f"idle workers (CPU < {cfg.idle_worker_cpu_util:.0%} for {cfg.hot_window} samples, "
        f"~{math.ceil(remaining_s / 60)} min left): {cores(new_cpu):g} CPU each"
    ]
    new_w = RolePlan(w.count, NodeResources(new_cpu, w.resources.memory_mib))
    keep = tuple(o for o in current.overrides if o.role is not Role.WORKER)
    return _with(current, now_s, reasons, workers=new_w, overrides=keep, action=IDLE_WORKERS)
