"""The planner as a whole: the sampling stage, pacing, DLRover's guards around model-based
scaling, stage 3 before stage 2, the offline plan, and the time one plan takes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dlrover_core.errors import SpecError
from dlrover_core.model.throughput import ThroughputModel
from dlrover_core.planner import PlanDecision, Planner, PlannerConfig
from dlrover_core.types import (
    NodeOverride,
    NodeResources,
    Observation,
    ResourcePlan,
    Role,
    Sample,
    Stage,
)
from tests.factories import (
    GRID_CONFIGS,
    exact_samples,
    fitted_model,
    key_of,
    make_linear_spec,
    make_obs,
    make_plan,
    ps_throughput,
    samples_at,
)

# Worker-bound truth: unpaced, the best plan for 64 CPU has ~49 workers.
WB = {"a0": 0.05, "a1": 0.001, "b1": 0.00005, "b2": 1e-7, "b3": 0.001}
QUOTA = {"cpu": 64, "memory": "256Gi"}


def planner_with(
    coef: dict[str, float], config: dict[str, Any] | None = None, **spec: Any
) -> Planner:
    """A planner whose model is ``coef`` fitted on exact samples, whatever samples it gets
    (so a test can feed the guards throughputs the model never sees)."""
    model = fitted_model(coef)

    def factory(samples: Sequence[Sample], strategy: str, batch_size: int) -> ThroughputModel:
        return model

    js = make_linear_spec(**{"quota": QUOTA, **spec})
    cfg = PlannerConfig.from_spec(js, **(config or {}))
    return Planner(js, cfg, model_factory=factory)


NO_URGENT_PS = {"urgent_ps_gain": float("inf")}  # PS pacing without the urgent exception


def truth_at(plan: ResourcePlan, coef: dict[str, float] = WB, reps: int = 2) -> list[Sample]:
    w, p, wc, pc = key_of(plan)
    return samples_at(plan, ps_throughput(coef, w, p, wc / 1000, pc / 1000), reps)


CURRENT = make_plan((2, 1000, 2048), (1, 2000, 4096), created_at_s=0.0)


# --- stage 2: sampling first, then the model ---------------------------------------------------


def test_sampling_proposes_a_new_config_until_the_partial_model_serves() -> None:
    """Profiling nothing: each re-plan adds min_speed_samples (2) samples of the running
    configuration. One configuration identifies nothing, so the planner samples a second;
    from two on, the identifiable part of the model is fitted and serves inside its span
    (issue 10: sampling pays for itself), so sampling stops well before five configs."""
    spec = make_linear_spec()
    planner = Planner(spec)
    plan = planner.initial_plan(now_s=0.0)
    history = [plan]
    samples: list[Sample] = []
    decisions: list[PlanDecision] = []
    for step in range(1, 8):
        samples += exact_samples(
            WB, [(k[0], k[1], k[2] / 1000, k[3] / 1000) for k in [key_of(plan)]], reps=2
        )
        d = planner.replan(plan, [], samples, now_s=10.0 * step, past_plans=history)
        decisions.append(d)
        if d.plan is None or d.plan.stage is not Stage.SAMPLING:
            break
        plan = d.plan
        history.append(plan)
    sampled = [d.plan for d in decisions[:-1]]
    assert all(p is not None and p.stage is Stage.SAMPLING for p in sampled)
    assert 1 <= len(sampled) <= planner.config.max_sampling_configs
    assert all(p is not None and p.action.startswith("sample:") for p in sampled)
    keys = [key_of(history[0])] + [key_of(p) for p in sampled if p is not None]
    assert len(set(keys)) == len(keys), keys  # every proposal is new
    assert all(
        p is not None and p.reasons[0].startswith(f"sampling configuration {i + 2}")
        for i, p in enumerate(sampled)
    )
    assert all(p is not None and p.total.fits_in(spec.quota.resources) for p in sampled)
    last = decisions[-1]
    assert last.model is not None  # fitted from the sampled configurations
    assert last.model.n_configs_ == len(sampled) + 1
    assert last.plan is None or last.plan.stage is Stage.SCALING


def test_sampling_never_leaves_the_quota() -> None:
    # doubling 3 workers of 3 CPU would need 21 CPU; the quota is 12: that move is skipped
    spec = make_linear_spec(quota={"cpu": 12, "memory": "40Gi"})
    planner = Planner(spec)
    current = make_plan((3, 3000, 4096), (1, 2000, 4096), created_at_s=0.0)
    d = planner.replan(current, [], truth_at(current), now_s=20.0, past_plans=[current])
    assert d.plan is not None and d.plan.stage is Stage.SAMPLING
    assert d.plan.total.fits_in(spec.quota.resources)
    assert "double the workers" not in d.plan.reasons[0]


# --- pacing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now_s", "n_samples", "note"),
    [
        (5.0, 2, "paced: re-plan interval not over"),  # 5 s < replan_interval_s = 10
        (20.0, 1, "waiting for speed samples (1/2)"),  # min_speed_samples = 2
        (20.0, 0, "waiting for speed samples (0/2)"),
    ],
)
def test_pacing_holds_the_plan(now_s: float, n_samples: int, note: str) -> None:
    d = planner_with(WB).replan(CURRENT, [], truth_at(CURRENT, reps=n_samples), now_s)
    assert d.plan is None
    assert d.notes == (note,)


def test_samples_of_other_configurations_do_not_count_for_pacing() -> None:
    other = make_plan((3, 1000, 2048), (1, 2000, 4096))
    d = planner_with(WB).replan(CURRENT, [], truth_at(other, reps=5), 20.0)
    assert d.notes == ("waiting for speed samples (0/2)",)


def test_worker_step_is_at_most_8() -> None:
    planner = planner_with(WB)
    unpaced = planner.offline_plan(truth_at(CURRENT))
    assert unpaced.workers.count > 10  # the model wants many more workers ...
    d = planner.replan(CURRENT, [], truth_at(CURRENT), 20.0)
    assert d.plan is not None and d.plan.stage is Stage.SCALING
    assert 2 < d.plan.workers.count <= 2 + 8  # ... but gets at most 8 more per step
    assert d.plan.created_at_s == 20.0
    assert d.plan.predicted_throughput_sps is not None


@pytest.mark.parametrize(
    ("worker_stable_s", "now_s", "workers_may_change"),
    [(5, 20.0, True), (100, 20.0, False), (100, 100.0, True)],
)
def test_workers_change_only_when_stable(
    worker_stable_s: float, now_s: float, workers_may_change: bool
) -> None:
    planner = planner_with(WB, pacing__worker_stable_s=worker_stable_s)
    d = planner.replan(CURRENT, [], truth_at(CURRENT), now_s)
    if workers_may_change:
        assert d.plan is not None and d.plan.workers != CURRENT.workers
    else:  # only the PS may change, if that alone is worth it
        assert d.plan is None or d.plan.workers == CURRENT.workers


@pytest.mark.parametrize(
    ("now_s", "ps_may_change"),
    [(70.0, False), (149.0, False), (150.0, True), (300.0, True)],
)
def test_ps_changes_at_least_ps_change_interval_apart(now_s: float, ps_may_change: bool) -> None:
    """The PS set last changed at t = 50 (1 -> 2 PS); ps_change_interval_s = 100."""
    before = make_plan((2, 1000, 2048), (1, 2000, 4096), created_at_s=0.0)
    current = make_plan((2, 1000, 2048), (2, 1000, 4096), created_at_s=50.0)
    planner = planner_with(WB, NO_URGENT_PS)
    d = planner.replan(current, [], truth_at(current), now_s, past_plans=[before, current])
    assert d.plan is not None
    assert (d.plan.ps != current.ps) is ps_may_change
    assert d.plan.workers != current.workers  # workers are not held by the PS interval


def test_a_much_better_ps_change_may_come_inside_the_interval() -> None:
    """With the default urgent_ps_gain (25 %), a PS change worth far more than any
    worker-only change is made at t = 70 although the PS set changed at t = 50."""
    before = make_plan((2, 1000, 2048), (1, 2000, 4096), created_at_s=0.0)
    current = make_plan((2, 1000, 2048), (2, 1000, 4096), created_at_s=50.0)
    held = planner_with(WB, NO_URGENT_PS).replan(
        current, [], truth_at(current), 70.0, past_plans=[before, current]
    )
    d = planner_with(WB).replan(current, [], truth_at(current), 70.0, past_plans=[before, current])
    assert held.plan is not None and d.plan is not None
    assert d.plan.ps != current.ps
    assert d.plan.predicted_throughput_sps > 1.25 * held.plan.predicted_throughput_sps
    assert "inside the 100 s PS pacing interval" in d.plan.reasons[-1]


def test_no_history_means_the_ps_may_change() -> None:
    d = planner_with(WB).replan(CURRENT, [], truth_at(CURRENT), 20.0)
    assert d.plan is not None and d.plan.ps != CURRENT.ps


def test_small_gain_keeps_the_plan() -> None:
    planner = planner_with(WB)
    best = planner.offline_plan(truth_at(CURRENT)).replace(created_at_s=0.0)
    d = planner.replan(best, [], truth_at(best), 20.0)
    assert d.plan is None
    assert d.notes == ("current plan is within 3% of the best",)


# --- DLRover's guards -------------------------------------------------------------------------

BEFORE = make_plan((2, 1000, 2048), (1, 2000, 4096), created_at_s=0.0)
AFTER = make_plan((4, 1000, 2048), (1, 2000, 4096), created_at_s=50.0)  # 2 more workers


@pytest.mark.parametrize(
    ("x_after", "reverted"),
    [
        (700.0, True),  # 30 % slower than 1000 after adding resources
        (799.0, True),
        (800.0, False),  # exactly 20 % slower: not "≥ 20 %" by the strict comparison
        (1500.0, False),
    ],
)
def test_deceleration_guard_reverts(x_after: float, reverted: bool) -> None:
    samples = samples_at(BEFORE, 1000.0) + samples_at(AFTER, x_after)
    d = planner_with(WB).replan(AFTER, [], samples, 100.0, past_plans=[BEFORE, AFTER])
    if reverted:
        assert d.plan is not None
        assert key_of(d.plan) == key_of(BEFORE)
        assert d.plan.stage is Stage.SCALING
        assert d.plan.created_at_s == 100.0
        assert d.plan.reasons[0].startswith("deceleration:")
    else:
        assert d.plan is None or not d.plan.reasons[0].startswith("deceleration:")


def test_deceleration_guard_ignores_scaling_down() -> None:
    # AFTER -> BEFORE took CPU away: slower is expected, not a reason to revert
    samples = samples_at(AFTER, 1000.0) + samples_at(BEFORE, 500.0)
    later = BEFORE.replace(created_at_s=50.0)
    d = planner_with(WB).replan(later, [], samples, 100.0, past_plans=[AFTER, later])
    assert d.plan is None or not d.plan.reasons[0].startswith("deceleration:")


@pytest.mark.parametrize(
    ("x_after", "more_workers"),
    [
        # (ΔX/Δw)/(X/w) = ((1100 − 1000)/2) / (1000/2) = 0.1 < 0.2: stop adding workers
        (1100.0, False),
        # ((1190 − 1000)/2) / 500 = 0.19
        (1190.0, False),
        # ((1900 − 1000)/2) / 500 = 0.9
        (1900.0, True),
    ],
)
def test_marginal_speed_guard_blocks_more_workers(x_after: float, more_workers: bool) -> None:
    samples = samples_at(BEFORE, 1000.0) + samples_at(AFTER, x_after)
    d = planner_with(WB).replan(AFTER, [], samples, 100.0, past_plans=[BEFORE, AFTER])
    assert d.plan is not None and d.plan.stage is Stage.SCALING
    assert (d.plan.workers.count > AFTER.workers.count) is more_workers


@pytest.mark.parametrize(("busiest", "more_workers"), [(0.96, False), (0.95, False), (0.5, True)])
def test_saturated_ps_blocks_more_workers(busiest: float, more_workers: bool) -> None:
    # PS count and CPU pinned: PS capacity cannot grow, so a saturated PS stops the workers.
    # One observation only: too short for stage 3's hot-PS window of 3.
    planner = planner_with(WB, constraints__ps={"count": 1, "cpu": 2})
    obs = [make_obs(10.0, ps_util=[busiest], ps_cpu=2000, worker_speeds=[100, 100])]
    d = planner.replan(CURRENT, obs, truth_at(CURRENT), 20.0)
    if more_workers:
        assert d.plan is not None and d.plan.workers.count > 2
    else:
        assert d.plan is None or d.plan.workers.count <= 2
    if d.plan is not None:
        assert (d.plan.ps.count, d.plan.ps.resources.cpu_millicores) == (1, 2000)  # pins


# --- stage 3 first ----------------------------------------------------------------------------


def test_stage_3_acts_before_pacing_allows_stage_2() -> None:
    current = make_plan((2, 1000, 2048), (2, 2000, 4096), created_at_s=0.0)
    obs: list[Observation] = [
        make_obs(t, ps_util=[0.95, 0.4], ps_cpu=2000, ps_mem=4096) for t in (1.0, 2.0, 3.0)
    ]
    d = planner_with(WB).replan(current, obs, [], now_s=4.0)  # 4 s < replan interval
    assert d.plan is not None and d.plan.stage is Stage.POST_SCALING
    # the default hot-PS factor 1.5: 2000 × 1.5 = 3000 (a CPU level)
    assert d.plan.node_resources(Role.PS, 0).cpu_millicores == 3000


def test_scaling_keeps_migrations_only_for_an_unchanged_ps_set() -> None:
    planner = planner_with(WB, NO_URGENT_PS, pacing__ps_change_interval_s=1000)
    before = CURRENT
    mig = NodeOverride(Role.PS, 0, NodeResources(4000, 4096), "hot PS")
    relaunch = NodeOverride(Role.WORKER, 0, NodeResources(1000, 2048), "straggler", "relaunch")
    current = before.replace(overrides=(mig, relaunch), created_at_s=50.0)
    d = planner.replan(current, [], truth_at(current), 100.0, past_plans=[before, current])
    assert d.plan is not None and d.plan.ps == current.ps  # PS held by the interval
    assert d.plan.overrides == (mig,)


# --- offline plan -----------------------------------------------------------------------------


def test_offline_plan_without_identifying_samples_keeps_stage_1() -> None:
    spec = make_linear_spec()
    planner = Planner(spec)
    base = planner.initial_plan()
    plan = planner.offline_plan(truth_at(base, reps=3))  # one configuration only
    assert plan.stage is Stage.COLD_START
    assert (plan.workers, plan.ps) == (base.workers, base.ps)
    assert plan.reasons[-1].startswith("samples not used:")
    assert "distinct" in plan.reasons[-1]


def test_offline_plan_uses_profiled_samples() -> None:
    spec = make_linear_spec(quota=QUOTA)
    plan = Planner(spec).offline_plan(exact_samples(WB, GRID_CONFIGS))
    assert plan.stage is Stage.SCALING
    assert plan.total.fits_in(spec.quota.resources)
    w, p, wc, pc = key_of(plan)
    assert plan.predicted_throughput_sps == pytest.approx(
        ps_throughput(WB, w, p, wc / 1000, pc / 1000), rel=1e-6
    )


def test_plans_round_trip_through_json() -> None:
    spec = make_linear_spec(quota=QUOTA)
    plan = Planner(spec).offline_plan(exact_samples(WB, GRID_CONFIGS), now_s=3.0)
    assert ResourcePlan.from_dict(plan.to_dict()) == plan


# --- speed: a plan in under 10 ms ---------------------------------------------------------------


def _median_ms(fn: Any, n: int = 50) -> float:
    """Median CPU time of one call (this thread's): on a machine shared with other
    processes, wall time measures the neighbours (65 ms wall vs 9 ms CPU measured at a load
    of 16 on 2 cores); on an idle machine the two agree."""
    fn()  # warm-up (imports, caches)
    times = []
    for _ in range(n):
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
    return statistics.median(times) * 1000


def test_offline_plan_takes_under_10_ms() -> None:
    # the default spec (64 workers, 15 PS, 12 CPU levels) and a real NNLS fit every call
    planner = Planner(make_linear_spec(quota=QUOTA))
    samples = exact_samples(WB, GRID_CONFIGS)
    assert _median_ms(lambda: planner.offline_plan(samples)) < 10.0


def test_replan_takes_under_10_ms() -> None:
    planner = Planner(make_linear_spec(quota=QUOTA))
    samples = exact_samples(WB, GRID_CONFIGS) + truth_at(CURRENT)
    obs = [make_obs(10.0, ps_util=[0.5], worker_speeds=[100, 100])]

    def replan() -> None:
        d = planner.replan(CURRENT, obs, samples, 20.0)
        assert d.plan is not None and d.plan.stage is Stage.SCALING

    assert _median_ms(replan) < 10.0


# --- property: every plan respects the quota and the pins -------------------------------------

coefs = st.fixed_dictionaries(
    {
        "a0": st.floats(1e-4, 0.5),
        "a1": st.floats(1e-5, 1e-2),
        "b1": st.floats(1e-6, 1e-2),
        "b2": st.floats(0.0, 1e-4),
        "b3": st.floats(0.0, 0.1),
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    coef=coefs,
    cpu=st.integers(1, 128),
    mem_gib=st.integers(1, 256),
    w_pin=st.one_of(st.none(), st.integers(1, 4)),
    p_cpu_pin=st.one_of(st.none(), st.sampled_from(["500m", "2", "6"])),
)
def test_offline_and_replanned_plans_respect_quota_and_pins(
    coef: dict[str, float],
    cpu: int,
    mem_gib: int,
    w_pin: int | None,
    p_cpu_pin: str | None,
) -> None:
    constraints: dict[str, Any] = {"workers": {}, "ps": {}}
    if w_pin is not None:
        constraints["workers"]["count"] = w_pin
    if p_cpu_pin is not None:
        constraints["ps"]["cpu"] = p_cpu_pin
    try:
        spec = make_linear_spec(
            quota={"cpu": cpu, "memory": f"{mem_gib}Gi"}, constraints=constraints
        )
    except SpecError:
        assume(False)
        return
    planner = Planner(spec)
    samples = exact_samples(coef, GRID_CONFIGS)
    plan = planner.offline_plan(samples)
    d = planner.replan(plan, [], samples + truth_at(plan, coef), plan.created_at_s + 20)
    for p in (plan, d.plan):
        if p is None:
            continue
        assert p.total.fits_in(spec.quota.resources), p.describe()
        if w_pin is not None:
            assert p.workers.count == w_pin
        if p_cpu_pin is not None:
            assert p.ps.resources.cpu_millicores == spec.constraints.ps.cpu_millicores


def test_configurations_measured_by_past_runs_are_not_sampled_again() -> None:
    """Prior samples (a past run of the job) count as sampled: the next sampling move skips
    them."""
    spec = make_linear_spec()
    planner = Planner(spec)
    plan = planner.initial_plan(now_s=0.0)
    here = exact_samples(WB, [(k[0], k[1], k[2] / 1000, k[3] / 1000) for k in [key_of(plan)]], 2)
    d1 = planner.replan(plan, [], here, now_s=10.0, past_plans=[plan])
    assert d1.plan is not None and d1.plan.stage is Stage.SAMPLING
    prior = exact_samples(
        WB, [tuple(k / 1000 if i > 1 else k for i, k in enumerate(key_of(d1.plan)))], 2
    )
    d2 = planner.replan(plan, [], here, now_s=10.0, past_plans=[plan], prior_samples=prior)
    # the past run measured d1's configuration: it is reused (the model fits both), never
    # sampled again
    assert d2.model is not None and d2.model.n_configs_ == 2
    assert (
        d2.plan is None
        or d2.plan.stage is not Stage.SAMPLING
        or (key_of(d2.plan) != key_of(d1.plan))
    )
