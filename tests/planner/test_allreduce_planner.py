"""Planner stages 2 and 3 for the all-reduce strategy: pure functions, numbers by hand."""

from __future__ import annotations

from typing import Any

import pytest

from dlrover_core.allreduce_config import RANK_RUNTIME_MIB
from dlrover_core.model.throughput import AllReduceThroughputModel
from dlrover_core.planner.allreduce import (
    NO_PS,
    ResizeCost,
    allreduce_plan,
    allreduce_post_scale,
    allreduce_scale,
    rank_memory_need_mib,
    resize_pays,
)
from dlrover_core.types import (
    NodeObservation,
    NodeResources,
    NodeState,
    Observation,
    Role,
    Sample,
    Stage,
)
from tests.factories import make_spec

B = 512


def ar_spec(**kw: Any) -> Any:
    return make_spec(strategy="allreduce", **kw)


def fitted(a0: float = 0.002, a1: float = 4e-5, c1: float = 0.004, c2: float = 0.0005) -> Any:
    """Samples from T = a0 + a1*B/λ + c1*(w-1)/w + c2*(w-1), exact."""
    rows = []
    for w in (1, 2, 3, 4, 6):
        for lam in (1.0, 2.0, 4.0):
            t = a0 + a1 * B / lam + c1 * (w - 1) / w + c2 * (w - 1)
            rows.append(Sample(w, 0, lam, 0.0, w * B / t, batch_size=B))
    return AllReduceThroughputModel(batch_size=B).fit(rows)


def test_resize_pays_only_when_the_remaining_time_saved_beats_its_cost() -> None:
    # 10k s left at 100/s -> 5k s at 200/s: saves 5000 s, a 10 s resize pays
    ok, why = resize_pays(
        remaining_samples=1e6,
        current_sps=100,
        new_sps=200,
        current_cores=2,
        new_cores=4,
        cost_s=10,
    )
    assert ok and "saves 5000 s" in why
    # 10 s left: the speed-up saves 5 s, less than the 10 s resize
    ok, why = resize_pays(
        remaining_samples=1000,
        current_sps=100,
        new_sps=200,
        current_cores=2,
        new_cores=4,
        cost_s=10,
    )
    assert not ok and why.startswith("keep")
    # slower but cheaper: 4 cores x 100 s vs 2 cores x 110 s saves 180 core-s > 40 idle
    ok, _ = resize_pays(
        remaining_samples=10_000,
        current_sps=100,
        new_sps=90.9,
        current_cores=4,
        new_cores=2,
        cost_s=10,
    )
    assert ok
    ok, _ = resize_pays(
        remaining_samples=500,
        current_sps=100,
        new_sps=90.9,
        current_cores=4,
        new_cores=2,
        cost_s=10,
    )
    assert not ok


def test_resize_cost_is_measured_once_known() -> None:
    c = ResizeCost()
    assert c.estimate_s == 10.0
    c = c.record(3.0)
    assert c.estimate_s == 3.0
    c = c.record(5.0).record(4.0).record(9.0)
    assert c.estimate_s == pytest.approx(6.0)  # upper quartile of 3, 4, 5, 9


def test_stage2_grows_a_long_job_and_keeps_a_nearly_finished_one() -> None:
    spec = ar_spec(quota__cpu=16, quota__memory="64Gi", constraints__workers__max=8)
    model = fitted()
    cur = allreduce_plan(1, NodeResources(1000, 2048), Stage.COLD_START)
    x1 = float(model.predict_many([[1, 0, 1.0, 1.0]])[0])
    d = allreduce_scale(
        model, spec, cur, current_sps=x1, remaining_samples=1e8, resize_cost=ResizeCost()
    )
    assert d.plan is not None and d.plan.ps == NO_PS and d.plan.stage is Stage.SCALING
    assert d.plan.workers.count * d.plan.workers.resources.cpu_millicores > 1000
    assert d.predicted_sps > x1
    d2 = allreduce_scale(
        model, spec, cur, current_sps=x1, remaining_samples=x1 * 5, resize_cost=ResizeCost()
    )
    assert d2.plan is None and "keep" in d2.reason  # 5 s left: no resize pays


def test_stage2_judges_a_configuration_this_run_measured_by_its_measurement() -> None:
    """The model's best configuration, once measured slow, is not planned again (a model
    refitted on each new configuration otherwise sends the job back and forth); one
    measured fast is planned by its measured speed."""
    spec = ar_spec(quota__cpu=16, quota__memory="64Gi", constraints__workers__max=8)
    model = fitted()
    cur = allreduce_plan(1, NodeResources(1000, 2048), Stage.COLD_START)
    x1 = float(model.predict_many([[1, 0, 1.0, 1.0]])[0])
    kw: dict[str, Any] = {"remaining_samples": 1e8, "resize_cost": ResizeCost()}
    first = allreduce_scale(model, spec, cur, current_sps=x1, **kw)
    best = (first.best_world_size, first.best_cpu_millicores)
    assert first.plan is not None and "predicted" in first.plan.reasons[0]
    slow = allreduce_scale(model, spec, cur, current_sps=x1, measured={best: x1 * 0.9}, **kw)
    assert (slow.best_world_size, slow.best_cpu_millicores) != best
    # the model's bias cancels: twice the model's speed measured here, twice everywhere
    twice = allreduce_scale(model, spec, cur, current_sps=2 * x1, **kw)
    assert twice.predicted_sps == pytest.approx(2 * first.predicted_sps)
    fast = allreduce_scale(model, spec, cur, current_sps=x1, measured={best: x1 * 50}, **kw)
    assert fast.plan is not None and fast.predicted_sps == x1 * 50
    assert "measured" in fast.plan.reasons[0]
    # the current configuration by its mean, as the others are, not by its latest window
    same = allreduce_scale(model, spec, cur, current_sps=x1, measured={(1, 1000): 0.9 * x1}, **kw)
    assert same.current_predicted_sps == 0.9 * x1


def test_stage2_never_plans_ranks_that_cannot_hold_the_tables() -> None:
    tables = [{"name": f"t{i}", "num_embeddings": 2_000_000} for i in range(2)]
    spec = ar_spec(
        model__embedding_tables=tables,
        constraints__workers__memory="1Gi",
        constraints__workers__max=8,
        quota__cpu=32,
        quota__memory="64Gi",
    )
    # a table is 2M x 16 x 4 B x 2 = 244 MiB: two on one rank need 488 + runtime > 1 GiB
    assert rank_memory_need_mib(spec, 1) > 1024 >= rank_memory_need_mib(spec, 2)
    cur = allreduce_plan(2, NodeResources(1000, 1024), Stage.COLD_START)
    d = allreduce_scale(
        fitted(), spec, cur, current_sps=1000, remaining_samples=1e9, resize_cost=ResizeCost()
    )
    assert d.best_world_size >= 2


def rank(
    node_id: int,
    util: float,
    mem_util: float = 0.3,
    state: NodeState = NodeState.RUNNING,
    since: float = 0.0,
) -> NodeObservation:
    res = NodeResources(2000, 4096)
    return NodeObservation(
        Role.WORKER,
        node_id,
        state,
        res,
        cpu_used_millicores=int(2000 * util),
        memory_used_mib=int(4096 * mem_util),
        state_since_s=since,
        throughput_sps=100.0,
    )


def obs(t: float, *nodes: NodeObservation) -> Observation:
    return Observation(t, tuple(nodes), 300.0)


PLAN = allreduce_plan(3, NodeResources(2000, 4096), Stage.SCALING)


def test_stage3_replaces_the_rank_the_others_wait_for() -> None:
    spec = ar_spec(pacing__hot_window=3, constraints__workers__max=8)
    window = [obs(t, rank(0, 0.3), rank(1, 0.95), rank(2, 0.35)) for t in (1, 2, 3)]
    p = allreduce_post_scale(spec, PLAN, window, now_s=3)
    assert p is not None and p.workers.count == 3
    (o,) = p.overrides
    assert (o.node_id, o.action) == (1, "relaunch")
    # two of three windows only: not yet
    assert allreduce_post_scale(spec, PLAN, window[:2], now_s=3) is None
    # everyone busy (compute-bound, balanced): no straggler
    busy = [obs(t, rank(0, 0.9), rank(1, 0.95), rank(2, 0.92)) for t in (1, 2, 3)]
    assert allreduce_post_scale(spec, PLAN, busy, now_s=3) is None


def test_stage3_oom_adds_memory_then_ranks() -> None:
    spec = ar_spec(quota__cpu=16, quota__memory="64Gi", constraints__workers__max=8)
    p = allreduce_post_scale(spec, PLAN, [obs(1, rank(0, 0.5))], now_s=1, oom_node_ids=[0])
    assert p is not None and p.workers.resources.memory_mib == 8192 and p.workers.count == 3
    pinned = ar_spec(
        constraints__workers__memory="4Gi",
        constraints__workers__max=8,
        quota__cpu=16,
        quota__memory="64Gi",
    )
    p = allreduce_post_scale(pinned, PLAN, [obs(1, rank(0, 0.5))], now_s=1, oom_node_ids=[0])
    # memory is pinned; the tiny tables already fit, so one more rank is the spread
    assert p is not None and p.workers.count == 4 and p.stage is Stage.POST_SCALING


def test_stage3_pending_ranks_shrink_the_group_to_those_that_started() -> None:
    spec = ar_spec(pacing__pending_timeout_s=100, constraints__workers__max=8)
    o = obs(500, rank(0, 0.5), rank(1, 0.5), rank(2, 0.0, state=NodeState.PENDING, since=0))
    p = allreduce_post_scale(spec, PLAN, [o], now_s=500)
    assert p is not None and p.workers.count == 2
    young = obs(50, rank(0, 0.5), rank(2, 0.0, state=NodeState.PENDING, since=0))
    assert allreduce_post_scale(spec, PLAN, [young], now_s=50) is None


def test_runtime_reserve_is_part_of_the_need() -> None:
    assert rank_memory_need_mib(ar_spec(), 1) > RANK_RUNTIME_MIB


def test_the_planner_plans_all_reduce_jobs_with_its_own_model_objective_and_resize_price() -> None:
    """``Planner.replan`` of an all-reduce job: stage 3 first (a straggling rank), then stage
    2 on the planner's fitted all-reduce model with its objective; the resize is priced on the
    run's measured resizes (``record_resize``), so a costly resize stops paying."""
    from dlrover_core.planner import Planner
    from dlrover_core.types import NodeObservation, NodeState, Observation, Role

    spec = ar_spec(
        quota__cpu=16, quota__memory="64Gi", constraints__workers__max=8, data__rows=2_000_000
    )
    planner = Planner(spec)
    cur = allreduce_plan(1, NodeResources(1000, 2048), Stage.COLD_START)
    samples = []
    for w in (1, 2, 3, 4, 6):
        for lam in (1.0, 2.0, 4.0):
            t = 0.002 + 4e-5 * B / lam + 0.004 * (w - 1) / w + 0.0005 * (w - 1)
            samples.append(Sample(w, 0, lam, 0.0, w * B / t, batch_size=B))
    x1 = samples[0].throughput_sps
    node = NodeObservation(Role.WORKER, 0, NodeState.RUNNING, cur.workers.resources, 900)
    obs = [Observation(100.0, (node,), x1, samples_done=10_000, samples_total=2_000_000)]
    d = planner.replan(cur, obs, samples, 100.0)
    assert d.plan is not None and d.plan.ps == NO_PS and d.plan.workers.count > 1, d.notes
    assert d.model is not None and d.model.kind == "allreduce_throughput"
    assert "all-reduce" in d.plan.reasons[0]
    # the same decision with this run's resizes measured at an hour each: it no longer pays
    planner.record_resize(3600.0)
    kept = planner.replan(cur, obs, samples, 100.0)
    assert kept.plan is None and "keep" in kept.notes[0], kept.notes
    # stage 3 comes first: rank 1 busy while the others wait for it
    three = allreduce_plan(3, NodeResources(1000, 2048), Stage.SCALING)
    ranks = [
        NodeObservation(Role.WORKER, i, NodeState.RUNNING, three.workers.resources, c)
        for i, c in enumerate((300, 980, 320))
    ]
    window = [Observation(t, tuple(ranks), x1) for t in (1.0, 2.0, 3.0)]
    d3 = planner.replan(three, window, samples, 4.0)
    assert d3.plan is not None and any(o.action == "relaunch" for o in d3.plan.overrides)


def test_an_all_reduce_profile_is_a_rank_ladder_inside_the_quota() -> None:
    """The profile trials of an all-reduce job vary the ranks over several counts at one CPU
    (the exchange grows with the ranks) and the CPU at one count (the compute term), each
    inside the quota; a PS job's moves (1-3 ranks at 16-32 CPU) measured nothing of the
    exchange the planner then extrapolated far beyond."""
    from dlrover_core.planner import Planner

    spec = ar_spec(quota__cpu=64, quota__memory="256Gi", constraints__workers__max=32)
    planner = Planner(spec)
    base = allreduce_plan(1, NodeResources(16000, 8192), Stage.COLD_START)
    trials = planner.trial_plans(base, 4)
    got = [(t.workers.count, t.workers.resources.cpu_millicores) for t in trials]
    assert got == [(1, 16000), (1, 4000), (4, 4000), (8, 4000)]
    assert all(t.ps.count == 0 for t in trials)
    # a small quota: the trials that do not fit are left out, the others stay
    small = Planner(ar_spec(quota__cpu=16, quota__memory="256Gi", constraints__workers__max=32))
    got = [
        (t.workers.count, t.workers.resources.cpu_millicores)
        for t in small.trial_plans(
            allreduce_plan(1, NodeResources(8000, 8192), Stage.COLD_START), 6
        )
    ]
    assert (1, 2000) in got and (4, 2000) in got and (8, 2000) in got
    assert all(w * c <= 16000 for w, c in got)
