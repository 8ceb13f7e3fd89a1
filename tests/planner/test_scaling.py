"""Stage 2, model-based scaling: the search picks the argmax of log X − θ·log cost over its
grid (checked against a brute force written here), and the sampling moves."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from dlrover_core.planner import Planner, PlannerConfig
from dlrover_core.planner.bounds import JobBounds, ceil_mib, round_up_level
from dlrover_core.planner.scaling import SearchLimits, cost, sampling_candidates, search
from dlrover_core.types import Observation, Role, Stage
from tests.factories import (
    exact_samples,
    fitted_model,
    key_of,
    make_linear_spec,
    make_plan,
    node,
    objective,
    ps_throughput,
)

THETA = PlannerConfig().min_elasticity  # 0.35
LEVELS = PlannerConfig().cpu_levels_millicores
W_MEM, P_MEM = 2048, 4096  # pinned below, so the cost of a configuration is known exactly

TRUTHS: dict[str, dict[str, float]] = {
    # s per step: a0 + a1·B/λw + b1·(w/p)·B/λp + b2·(w/p)·B + b3·p
    "worker-bound": {"a0": 0.005, "a1": 0.002, "b1": 0.0001, "b2": 1e-6, "b3": 0.002},
    "ps-bound": {"a0": 0.005, "a1": 0.0002, "b1": 0.002, "b2": 1e-5, "b3": 0.01},
    "fan-out": {"a0": 0.01, "a1": 0.001, "b1": 0.0005, "b2": 1e-6, "b3": 0.2},
    "network": {"a0": 0.01, "a1": 0.0005, "b1": 0.0001, "b2": 5e-4, "b3": 0.001},
}
QUOTAS = [
    {"cpu": 16, "memory": "64Gi"},
    {"cpu": 64, "memory": "64Gi"},
    {"cpu": 40, "memory": "12Gi"},  # memory binds: 2 GiB workers, 4 GiB PS
]
PROFILE = list(itertools.product([1, 2, 4], [1, 2], [1.0, 2.0, 4.0], [1.0, 2.0, 4.0]))


def brute_force(
    coef: dict[str, float], quota_cpu: int, quota_mem: int, current_cpu: int
) -> list[tuple]:
    """Every (w ≤ 8, p ≤ 4, λw, λp ∈ levels ∪ {the current CPU}) inside the quota, best
    objective first."""
    cpus = sorted({*LEVELS, current_cpu})
    scored = []
    for w, p, wc, pc in itertools.product(range(1, 9), range(1, 5), cpus, cpus):
        if w * wc + p * pc > quota_cpu or w * W_MEM + p * P_MEM > quota_mem:
            continue
        x = ps_throughput(coef, w, p, wc / 1000, pc / 1000)
        c = (w * wc + p * pc) / 1000 + (w * W_MEM + p * P_MEM) / 1024 / 4.0
        scored.append((objective(x, c, THETA), (w, p, wc, pc), x))
    return sorted(scored, reverse=True)


@pytest.mark.parametrize("quota", QUOTAS, ids=["16cpu", "64cpu", "12Gi"])
@pytest.mark.parametrize("truth", sorted(TRUTHS))
def test_search_picks_the_grid_argmax(truth: str, quota: dict[str, Any]) -> None:
    coef = TRUTHS[truth]
    spec = make_linear_spec(
        quota=quota,
        constraints={
            "workers": {"max": 8, "memory": f"{W_MEM}Mi"},
            "ps": {"max": 4, "memory": f"{P_MEM}Mi"},
        },
    )
    # the search starts from the cold start (1 + 1 nodes of quota/5 CPU) and keeps its CPU in
    # the grid: 16 CPU -> 3200m, 64 CPU -> 12800m, 40 CPU -> 8000m
    cold_cpu = min(spec.quota.cpu_millicores // 5, 16000)
    assert Planner(spec).initial_plan().workers.resources.cpu_millicores == cold_cpu
    ranked = brute_force(coef, spec.quota.cpu_millicores, spec.quota.memory_mib, cold_cpu)
    (j_best, best, x_best), (j_second, *_) = ranked[0], ranked[1]
    assert j_best - j_second > 1e-6, "the test needs a unique optimum"

    plan = Planner(spec).offline_plan(exact_samples(coef, PROFILE), now_s=5.0)
    assert plan.stage is Stage.SCALING
    assert key_of(plan) == best
    assert plan.workers.resources.memory_mib == W_MEM
    assert plan.ps.resources.memory_mib == P_MEM
    # exact samples: the fitted model predicts the truth (to float round-off)
    assert plan.predicted_throughput_sps == pytest.approx(x_best, rel=1e-6)
    assert plan.total.fits_in(spec.quota.resources)
    assert plan.created_at_s == 5.0
    assert "from 54 profiled samples" in plan.reasons[0]


def test_cost_in_core_equivalents() -> None:
    # 2 × 1 CPU + 1 × 2 CPU = 4 cores; 2 × 2 GiB + 4 GiB = 8 GiB = 2 core-equivalents
    assert cost(2, 1, 1000, 2000, 2048, 4096, 4.0) == pytest.approx(6.0)


def test_search_result_gain_is_the_objective_ratio() -> None:
    coef = TRUTHS["worker-bound"]
    spec = make_linear_spec(quota={"cpu": 16, "memory": "64Gi"})
    bounds = JobBounds.from_spec(spec)
    current = make_plan((1, 1000, 2048), (1, 1000, 2048))
    res = search(fitted_model(coef), current, bounds, PlannerConfig(), 2048, lambda p: 2048)
    x_cur = ps_throughput(coef, 1, 1, 1.0, 1.0)
    assert res.current_throughput_sps == pytest.approx(x_cur, rel=1e-9)
    # current cost: 2 cores + 4 GiB / 4 = 3 core-equivalents
    assert res.current_objective == pytest.approx(objective(x_cur, 3.0, THETA), rel=1e-9)
    assert res.gain == pytest.approx(math.exp(res.objective - res.current_objective) - 1)
    assert res.gain > 0 and res.throughput_sps > x_cur
    assert (res.workers.total + res.ps.total).fits_in(spec.quota.resources)


@pytest.mark.parametrize(
    ("limits", "check"),
    [
        # pacing: no worker change -> workers exactly as they are (count, CPU, memory)
        (SearchLimits(change_workers=False), "workers fixed"),
        (SearchLimits(change_ps=False), "ps fixed"),
        (SearchLimits(max_worker_step=3), "step 3"),
        (SearchLimits(no_more_workers=True), "no more workers"),
    ],
)
def test_search_limits(limits: SearchLimits, check: str) -> None:
    coef = TRUTHS["worker-bound"]
    spec = make_linear_spec(quota={"cpu": 64, "memory": "256Gi"})
    bounds = JobBounds.from_spec(spec)
    current = make_plan((2, 1000, 2048), (1, 2000, 4096))
    free = search(fitted_model(coef), current, bounds, PlannerConfig(), 2048, lambda p: 4096)
    assert free.workers.count > 5 and free.workers != current.workers  # wants more workers
    res = search(fitted_model(coef), current, bounds, PlannerConfig(), 2048, lambda p: 4096, limits)
    if check == "workers fixed":
        assert res.workers == current.workers
    elif check == "ps fixed":
        assert res.ps == current.ps
    elif check == "step 3":
        assert 2 < res.workers.count <= 5
    else:
        assert res.workers.count <= 2


def test_ps_capacity_floor_blocks_workers_unless_ps_grow() -> None:
    coef = TRUTHS["worker-bound"]
    spec = make_linear_spec(quota={"cpu": 64, "memory": "256Gi"})
    bounds = JobBounds.from_spec(spec)
    current = make_plan((2, 1000, 2048), (1, 2000, 4096))
    floor = SearchLimits(ps_capacity_floor=2000.0)
    res = search(fitted_model(coef), current, bounds, PlannerConfig(), 2048, lambda p: 4096, floor)
    assert res.workers.count > 2
    assert res.ps.count * res.ps.resources.cpu_millicores > 2000
    both = SearchLimits(change_ps=False, ps_capacity_floor=2000.0)
    res = search(fitted_model(coef), current, bounds, PlannerConfig(), 2048, lambda p: 4096, both)
    assert res.workers.count <= 2


def test_search_with_no_feasible_configuration_keeps_the_current_one() -> None:
    spec = make_linear_spec(quota={"cpu": 1, "memory": "1Gi"})
    current = make_plan((1, 500, 512), (1, 500, 512))
    res = search(
        fitted_model(TRUTHS["worker-bound"]),
        current,
        JobBounds.from_spec(spec),
        PlannerConfig(),
        4096,  # a worker needs more than the whole quota
        lambda p: 512,
    )
    assert (res.workers, res.ps, res.evaluated) == (current.workers, current.ps, 0)
    assert res.gain == 0.0


# --- sampling moves ------------------------------------------------------------------------


def test_sampling_candidates_vary_one_input_at_a_time() -> None:
    """Without observations the CPU moves double (nothing says the nodes use less)."""
    spec = make_linear_spec()
    current = make_plan((2, 2000, 4096), (1, 2000, 8192))
    got = [
        (w.count, w.resources.cpu_millicores, p.count, p.resources.cpu_millicores, what)
        for w, p, what in sampling_candidates(
            current, JobBounds.from_spec(spec), PlannerConfig(), []
        )
    ]
    assert got == [
        (2, 4000, 1, 2000, "CPU per worker towards its use"),
        (2, 2000, 2, 2000, "one more PS"),
        (4, 2000, 1, 2000, "double the workers"),
        (2, 2000, 1, 4000, "CPU per PS towards its use"),
        (3, 2000, 1, 2000, "workers × 1.5"),
        (1, 4000, 1, 2000, "half the workers, twice the CPU"),
        (2, 2000, 3, 1000, "two more PS at half CPU"),
        (4, 1000, 1, 2000, "two more workers at half CPU"),
    ]


def test_sampling_moves_cpu_towards_what_idle_nodes_use() -> None:
    spec = make_linear_spec()
    current = make_plan((2, 2000, 4096), (1, 4000, 8192))
    idle = Observation(
        10.0,
        (
            node(Role.PS, 0, cpu=4000, cpu_util=0.3),
            node(Role.WORKER, 0, cpu=2000, cpu_util=0.3),
            node(Role.WORKER, 1, cpu=2000, cpu_util=0.3),
        ),
        throughput_sps=20.0,
    )
    moves = {
        what: (w.resources.cpu_millicores, p.resources.cpu_millicores)
        for w, p, what in sampling_candidates(
            current, JobBounds.from_spec(spec), PlannerConfig(), [idle]
        )
    }
    # workers use 600 of 2000 (< 60 %): 600 × 1.3 = 780 -> nearest level 1000
    assert moves["CPU per worker towards its use"] == (1000, 4000)
    # the PS uses 1200 of 4000 (< 50 %): 1200 / 0.7 = 1714 -> nearest level 1500
    assert moves["CPU per PS towards its use"] == (2000, 1500)


@pytest.mark.parametrize(("worker_util", "cpu"), [(0.1875, 4000), (0.8, 16000)])
def test_workers_grown_for_the_ps_take_the_cpu_they_use(worker_util: float, cpu: int) -> None:
    """A cold start: 1 worker and 1 PS of 16 CPU, the PS at 10 %. More workers until the PS
    would be 85 % busy: ceil(1 × 0.85 / 0.1) = 9 (≤ 1 + 8). The worker uses 3 of its 16 CPU
    (< 60 %): the 9 get 3000 × 1.3 = 3900 -> nearest level 4000 each, not 16 idle ones; a
    worker using 80 % keeps its 16."""
    spec = make_linear_spec(quota={"cpu": 512, "memory": "2048Gi"})
    current = make_plan((1, 16000, 4096), (1, 16000, 8192))
    obs = Observation(
        10.0,
        (
            node(Role.PS, 0, cpu=16000, cpu_util=0.1),
            node(Role.WORKER, 0, cpu=16000, cpu_util=worker_util),
        ),
        100.0,
    )
    moves = {
        what: (w.count, w.resources.cpu_millicores, p.count, p.resources.cpu_millicores)
        for w, p, what in sampling_candidates(
            current, JobBounds.from_spec(spec), PlannerConfig(), [obs]
        )
    }
    assert moves["workers until the PS are busy"] == (9, cpu, 1, 16000)


def test_allreduce_sampling_has_no_ps_moves() -> None:
    spec = make_linear_spec(strategy="allreduce")
    current = make_plan((2, 2000, 4096), (0, 2000, 0))
    whats = [
        what
        for _, _, what in sampling_candidates(
            current, JobBounds.from_spec(spec), PlannerConfig(), []
        )
    ]
    assert len(whats) == 5
    assert not any("PS" in what for what in whats)


@pytest.mark.parametrize(
    ("millicores", "level"), [(1, 500), (500, 500), (501, 1000), (2500, 3000), (99_999, 32000)]
)
def test_round_up_level(millicores: float, level: int) -> None:
    assert round_up_level(millicores, LEVELS) == level


@pytest.mark.parametrize(("mib", "rounded"), [(0, 0), (1, 64), (64, 64), (65, 128), (-5, 0)])
def test_ceil_mib(mib: float, rounded: int) -> None:
    assert ceil_mib(mib) == rounded


def test_more_ps_than_the_warm_plan_keep_its_memory_per_ps_before_the_job_runs() -> None:
    """Before any observation the search sizes PS memory from the base (warm) plan: its
    3 × 6 GiB PS are the last run's peak × margin, and how much of that is a fixed part per
    PS is unknown, so more PS keep 6 GiB each (at 3/4 of it, a warm 5 × 2048 MiB PS set
    moved to 8 × 1536 MiB OOMed at the start); fewer PS share its total."""
    spec = make_linear_spec(quota={"cpu": 256, "memory": "512Gi"})
    planner = Planner(spec)
    model = fitted_model(TRUTHS["ps-bound"])
    for count, per_ps in ((3, 6144), (12, 1024)):
        base = make_plan((4, 4000, 2048), (count, 4000, per_ps))
        res = planner._search(model, base, (), SearchLimits(), memory_from=base)
        assert res.ps.count != count  # the ps-bound job wants other PS counts
        mem = res.ps.resources.memory_mib
        if res.ps.count > count:
            assert mem >= per_ps, res
        else:
            assert mem >= ceil_mib(per_ps * count / res.ps.count), res
