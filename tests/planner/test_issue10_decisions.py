"""Issue 10, the tail: decisions that keep big or bottlenecked jobs from staying slow."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dlrover_core.model.throughput import PSExtendedThroughputModel, PSThroughputModel
from dlrover_core.planner import Planner, PlannerConfig
from dlrover_core.planner.bounds import JobBounds
from dlrover_core.planner.planner import (
    BEST_MEASURED_ACTION,
    BOTTLENECK_ACTION,
    STALL_ACTION,
    PlanDecision,
)
from dlrover_core.planner.scaling import bottleneck_candidates
from dlrover_core.types import Stage
from tests.factories import GRID_CONFIGS, exact_samples, make_linear_spec, make_obs, make_plan


@pytest.mark.parametrize(
    ("step", "growth", "workers", "expected"),
    [(8, 1.0, 4, 8), (8, 1.0, 20, 20), (8, 0.5, 20, 10), (8, 0.0, 50, 8), (2, 1.0, 1, 2)],
)
def test_worker_step_is_the_larger_of_the_fixed_step_and_the_growth(
    step: int, growth: float, workers: int, expected: int
) -> None:
    cfg = PlannerConfig(max_worker_step=step, max_worker_growth=growth)
    assert cfg.worker_step(workers) == expected


def test_every_ps_hot_raises_ps_cpu_first_then_ps_count() -> None:
    """3 PS at 0.5 CPU, all ≥ 90 % busy (a warm start measured on a PS-bound run): CPU per
    PS towards 70 % busy, ×4 at most → 2 CPU; then more PS."""
    spec = make_linear_spec(quota={"cpu": 64, "memory": "256Gi"})
    cur = make_plan((14, 1000, 4096), (3, 500, 8192))
    obs = [make_obs(600.0, ps_util=(0.99, 0.97, 0.95), ps_cpu=500, worker_speeds=[80.0] * 14)]
    cands = bottleneck_candidates(cur, JobBounds.from_spec(spec), PlannerConfig(), obs)
    assert [c[2] for c in cands] == [
        "every PS hot: CPU per PS towards 70% busy",
        "every PS hot: PS until 70% busy",
    ]
    assert cands[0][1].resources.cpu_millicores == 1000  # 0.5 × 0.99 / 0.7 → next level 1 CPU
    assert cands[1][1].count == 5  # ceil(3 × 0.99 / 0.7)


def test_idle_ps_grows_workers_until_the_ps_would_be_busy() -> None:
    spec = make_linear_spec(quota={"cpu": 640, "memory": "2560Gi"})
    cur = make_plan((10, 2000, 4096), (2, 8000, 8192))
    obs = [make_obs(600.0, ps_util=(0.2, 0.25), ps_cpu=8000, worker_speeds=[80.0] * 10)]
    cfg = PlannerConfig(max_worker_growth=1.0)
    cands = bottleneck_candidates(cur, JobBounds.from_spec(spec), cfg, obs)
    assert [c[2] for c in cands] == ["PS under their target: more workers"]
    assert cands[0][0].count == 20  # ceil(10 × 0.85 / 0.25) = 34, bounded by +10 (×2)


def test_untrusted_model_with_no_sampling_left_follows_the_bottleneck_rule() -> None:
    """Noisy samples (model error > max_trust_rel_error) of enough configurations that no
    sampling is left, and every PS hot (stage 3 leaves capacity to stage 2): the planner
    still acts on the bottleneck (it used to keep the slow configuration)."""
    spec = make_linear_spec(quota={"cpu": 64, "memory": "256Gi"})
    cfg = PlannerConfig.from_spec(
        spec, max_trust_rel_error=0.0, max_sampling_configs=1, idle_worker_cpu_util=0.0
    )
    planner = Planner(spec, cfg)
    cur = make_plan((4, 2000, 4096), (2, 1000, 8192), created_at_s=0.0, stage=Stage.SCALING)
    rng = np.random.default_rng(0)
    samples = []
    for i, (w, p, wc, pc) in enumerate([(4, 1, 2.0, 1.0), (2, 2, 2.0, 1.0), (4, 2, 2.0, 1.0)]):
        for r in range(6):
            x = 100.0 * w * float(rng.uniform(0.5, 1.5))
            s = exact_samples({"a0": 0.1, "a1": 0.001, "b1": 0.001, "b2": 0.0, "b3": 0.0},
                              [(w, p, wc, pc)])[0]  # fmt: skip
            samples.append(type(s)(**{**s.__dict__, "throughput_sps": x,
                                      "timestamp_s": 100.0 * i + r}))  # fmt: skip
    obs = [
        make_obs(
            t, ps_util=(0.97, 0.96), ps_cpu=1000, worker_speeds=[100.0] * 4, samples_total=10**9
        )
        for t in (900.0, 960.0, 1020.0)
    ]
    d = planner.replan(cur, obs, samples, 1200.0, [cur])
    assert d.plan is not None, d.notes
    assert d.plan.action == BOTTLENECK_ACTION
    assert d.plan.ps.resources.cpu_millicores > 1000 or d.plan.ps.count > 1


@pytest.mark.parametrize("cls", [PSThroughputModel, PSExtendedThroughputModel])
def test_predict_grid_equals_predict_many(cls: type[PSThroughputModel]) -> None:
    coef = {"a0": 0.05, "a1": 0.002, "b1": 0.0004, "b2": 1e-6, "b3": 0.003}
    cfgs = [(w, p, wc, pc) for w in (1, 3, 8) for p in (1, 2, 5) for wc in (1.0, 4.0)
            for pc in (0.5, 2.0)]  # fmt: skip
    m = cls().fit(exact_samples(coef, cfgs))
    ws, ps, wcs, pcs = [1, 2, 9, 40], [1, 3, 7], [0.5, 1.0, 6.0], [1.0, 2.0, 16.0]
    grid = m.predict_grid(ws, ps, wcs, pcs)
    rows = np.array([(w, p, a, b) for w in ws for p in ps for a in wcs for b in pcs])
    assert grid.shape == (4, 3, 3, 3)
    np.testing.assert_allclose(grid.ravel(), m.predict_many(rows), rtol=1e-12)


def test_untrusted_model_goes_back_to_a_clearly_faster_measured_configuration() -> None:
    """Seed 1's worst job: a sample left 15 PS at half their CPU (the PS cap kept the count)
    and ran at half the speed; no model could be trusted, nothing was left to sample and no
    bottleneck rule applied, so it stayed there for days. Now: back to the configuration this
    run measured at twice the speed."""
    spec = make_linear_spec(quota={"cpu": 64, "memory": "256Gi"})
    cfg = PlannerConfig.from_spec(spec, max_trust_rel_error=0.0, max_sampling_configs=0)
    planner = Planner(spec, cfg)
    fast = make_plan((4, 2000, 4096), (2, 1000, 8192), created_at_s=0.0, stage=Stage.SCALING)
    cur = make_plan((4, 2000, 4096), (2, 500, 8192), created_at_s=600.0, stage=Stage.SAMPLING)
    samples = []
    for i, (plan, x) in enumerate([(fast, 400.0), (cur, 200.0)]):
        for r in range(4):
            s = exact_samples({"a0": 0.1, "a1": 0.001, "b1": 0.001, "b2": 0.0, "b3": 0.0},
                              [(4, 2, 2.0, plan.ps.resources.cpu_cores)])[0]  # fmt: skip
            samples.append(type(s)(**{**s.__dict__, "throughput_sps": x * (1 + 0.05 * (r - 1.5)),
                                      "timestamp_s": 600.0 * i + 60.0 * r}))  # fmt: skip
    # PS busy but not all hot, and not idle: no bottleneck rule applies
    obs = [
        make_obs(t, ps_util=(0.88, 0.86), ps_cpu=500, worker_speeds=[50.0] * 4, samples_total=10**9)
        for t in (1200.0, 1260.0, 1320.0)
    ]
    d = planner.replan(cur, obs, samples, 1400.0, [fast, cur])
    assert d.plan is not None, d.notes
    assert d.plan.action == BEST_MEASURED_ACTION
    assert (d.plan.workers.count, d.plan.ps.count, d.plan.ps.resources.cpu_millicores) == (
        4,
        2,
        1000,
    )
    # and not from the faster configuration itself (no oscillation: it is the best measured)
    d2 = Planner(spec, cfg).replan(fast.replace(created_at_s=1400.0), obs, samples, 2000.0,
                                   [fast, cur, fast.replace(created_at_s=1400.0)])  # fmt: skip
    assert d2.plan is None or d2.plan.action != BEST_MEASURED_ACTION


# --- neither side busy: one probe with twice the PS ----------------------------------------

STALL_COEF = {"a0": 0.05, "a1": 0.001, "b1": 5e-05, "b2": 1e-07, "b3": 0.001}


def _stall_replan(
    monkeypatch: pytest.MonkeyPatch,
    ps_util: tuple[float, ...],
    samples_total: int,
    past: tuple[str, ...] = (),
    **overrides: float,
) -> PlanDecision:
    """A trusted model whose best move saves nothing (stubbed: the rule under test is what
    the planner does next), the current configuration measured five times."""
    spec = make_linear_spec(quota={"cpu": 256, "memory": "1024Gi"})
    planner = Planner(spec, PlannerConfig.from_spec(spec, idle_worker_cpu_util=0.0, **overrides))
    monkeypatch.setattr(planner, "_model_move", lambda *a, **k: (None, "nothing saves", None))
    cur = make_plan((6, 2000, 4096), (2, 4000, 8192), created_at_s=0.0, stage=Stage.SCALING)
    samples = exact_samples(STALL_COEF, GRID_CONFIGS)
    here = exact_samples(STALL_COEF, [(6, 2, 2.0, 4.0)], reps=5)
    samples += [dataclasses.replace(s, timestamp_s=600.0 + i) for i, s in enumerate(here)]
    obs = [
        make_obs(
            t, ps_util=ps_util, ps_cpu=4000, worker_speeds=[100.0] * 6, samples_total=samples_total
        )
        for t in (900.0, 960.0, 1020.0)
    ]
    plans = [cur.replace(action=a) for a in past] + [cur]
    return planner.replan(cur, obs, samples, 1200.0, plans)


@pytest.mark.parametrize("ps_util", [(0.5, 0.45), (0.58, 0.67)])
def test_neither_side_busy_measures_twice_the_ps_once(
    monkeypatch: pytest.MonkeyPatch, ps_util: tuple[float, ...]
) -> None:
    """Busiest PS at 50 % (or 67 %: under stall_util 0.7), workers at 50 % of their CPU and
    hours left: what bounds the speed is not CPU (network, a hot shard), so the planner
    measures 4 PS, CPU and workers kept."""
    d = _stall_replan(monkeypatch, ps_util, 10**9)
    assert d.plan is not None, d.notes
    assert d.plan.action == STALL_ACTION and d.plan.stage is Stage.SCALING
    assert (d.plan.ps.count, d.plan.ps.resources.cpu_millicores) == (4, 4000)
    assert d.plan.workers.count == 6
    assert "neither side busy" in d.plan.reasons[0]


@pytest.mark.parametrize(
    ("ps_util", "samples_total", "past"),
    [
        ((0.7, 0.5), 10**9, ()),  # a PS is busy (stall_util): CPU shows the bottleneck
        ((0.5, 0.45), 10**9, (STALL_ACTION,)),  # probed once already this run
        ((0.5, 0.45), 9384 * 1800, ()),  # ~30 min left: the pause would not pay back
    ],
)
def test_no_stall_probe_when_busy_probed_or_nearly_done(
    monkeypatch: pytest.MonkeyPatch,
    ps_util: tuple[float, ...],
    samples_total: int,
    past: tuple[str, ...],
) -> None:
    d = _stall_replan(monkeypatch, ps_util, samples_total, past)
    assert d.plan is None or d.plan.action != STALL_ACTION


@pytest.mark.parametrize(("min_ps_util", "probes"), [(0.2, False), (0.1, True)])
def test_no_stall_probe_when_the_ps_idle(
    monkeypatch: pytest.MonkeyPatch, min_ps_util: float, probes: bool
) -> None:
    """The busiest PS at 15 % of its CPU binds nothing (``stall_min_ps_util`` 0.2): no
    probe, though neither side is busy; under a lower mark (0.1) the same job probes. (The
    idle-PS rule is off here: it would shrink such PS first.)"""
    d = _stall_replan(monkeypatch, (0.15, 0.05), 10**9, (),
                      stall_min_ps_util=min_ps_util, idle_ps_cpu_util=0.0)  # fmt: skip
    assert (d.plan is not None and d.plan.action == STALL_ACTION) is probes, d.notes


@pytest.mark.parametrize(("after_sps", "again"), [(1.2, True), (1.02, False)])
def test_a_probe_that_paid_allows_the_next(
    monkeypatch: pytest.MonkeyPatch, after_sps: float, again: bool
) -> None:
    """The run went from 1 PS to 2 by a probe: 20 % faster measured allows 4 PS next; 2 %
    faster (under ``stall_min_gain``) ends the probing."""
    spec = make_linear_spec(quota={"cpu": 256, "memory": "1024Gi"})
    planner = Planner(spec, PlannerConfig.from_spec(spec, idle_worker_cpu_util=0.0))
    monkeypatch.setattr(planner, "_model_move", lambda *a, **k: (None, "nothing saves", None))
    before = make_plan((6, 2000, 4096), (1, 4000, 8192), created_at_s=0.0, stage=Stage.SCALING)
    cur = before.replace(ps=before.ps.__class__(2, before.ps.resources), action=STALL_ACTION)
    base = exact_samples(STALL_COEF, [(6, 1, 2.0, 4.0)], reps=5)
    samples = [dataclasses.replace(s, timestamp_s=100.0 + i) for i, s in enumerate(base)]
    x = base[0].throughput_sps * after_sps
    samples += [
        dataclasses.replace(s, throughput_sps=x, timestamp_s=700.0 + i)
        for i, s in enumerate(exact_samples(STALL_COEF, [(6, 2, 2.0, 4.0)], reps=5))
    ]
    samples += exact_samples(STALL_COEF, [(2, 1, 1.0, 1.0), (4, 1, 4.0, 2.0), (8, 2, 1.0, 4.0)])
    obs = [
        make_obs(
            t, ps_util=(0.5, 0.45), ps_cpu=4000, worker_speeds=[100.0] * 6, samples_total=10**9
        )
        for t in (900.0, 960.0, 1020.0)
    ]
    d = planner.replan(cur, obs, samples, 1200.0, [before, cur])
    if again:
        assert d.plan is not None and d.plan.action == STALL_ACTION, d.notes
        assert d.plan.ps.count == 4
    else:
        assert d.plan is None or d.plan.action != STALL_ACTION


# --- a model that never saw CPU per worker vary ------------------------------------------------

GROW_COEF = {"a0": 0.01, "a1": 0.002, "b1": 1e-05, "b2": 1e-08, "b3": 0.0001}


@pytest.mark.parametrize("varied_cpu", [False, True])
def test_a_move_gives_workers_the_cpu_they_use_when_the_model_never_saw_it_vary(
    varied_cpu: bool,
) -> None:
    """Samples at 16 CPU per worker only (2, 4 and 8 workers; 1 and 2 PS): the model predicts
    at 16 CPU alone, so its move keeps 16; the workers use half of it (the factories'
    workers) with the PS far from hot, so the move gives them 8 × 1.1 -> 12 CPU, what
    DLRover's "CPU = observed use + margin" allows. A model that saw the CPU vary sizes it."""
    spec = make_linear_spec(quota={"cpu": 1024, "memory": "4096Gi"})
    planner = Planner(spec, PlannerConfig.from_spec(spec, idle_worker_cpu_util=0.0))
    cur = make_plan((8, 16000, 4096), (2, 4000, 8192), created_at_s=0.0, stage=Stage.SCALING)
    cpus = (8.0, 16.0) if varied_cpu else (16.0,)
    configs = [(w, p, c, 4.0) for w in (2, 4, 8) for p in (1, 2) for c in cpus]
    samples = exact_samples(GROW_COEF, configs, reps=3)
    here = exact_samples(GROW_COEF, [(8, 2, 16.0, 4.0)], reps=5)
    samples += [dataclasses.replace(s, timestamp_s=600.0 + i) for i, s in enumerate(here)]
    obs = [
        make_obs(t, ps_util=(0.6, 0.6), ps_cpu=4000, worker_cpu=16000,
                 worker_speeds=[100.0] * 8, samples_total=10**10)
        for t in (900.0, 960.0, 1020.0)
    ]  # fmt: skip
    d = planner.replan(cur, obs, samples, 1200.0, [cur])
    assert d.plan is not None and d.plan.action == "scale", d.notes
    assert d.plan.workers.count > 8
    said = any("the model never saw it vary" in r for r in d.plan.reasons)
    if varied_cpu:
        assert d.model is not None and "worker_cpu" not in d.model.fixed_inputs_
        assert not said
    else:
        assert d.model is not None and d.model.fixed_inputs_.get("worker_cpu") == 16.0
        assert said, d.plan.reasons
        assert d.plan.workers.resources.cpu_millicores == 12000


@pytest.mark.parametrize("quota_cpu", [36, 64])
def test_at_a_full_quota_the_ps_count_is_sampled_in_place_of_a_worker(quota_cpu: int) -> None:
    """Every sample on 1 PS (2, 4, 8 workers; 2 and 4 CPU): the model cannot say
    what more PS do, and finds no move in its span (stubbed). With the quota full (36 CPU:
    8 × 4 + 1 × 4), one more PS does not fit beside the 8 workers; the sample is worth one
    worker: 7 workers and 2 PS. (Skipped for not fitting, the job stayed on one PS for
    hours, session 11.) With room (64 CPU) the workers stay."""
    spec = make_linear_spec(quota={"cpu": quota_cpu, "memory": "1024Gi"})
    planner = Planner(spec, PlannerConfig.from_spec(spec, idle_worker_cpu_util=0.0))
    planner._model_move = lambda *a, **k: (None, "nothing saves", None)  # type: ignore[method-assign]
    cur = make_plan((8, 4000, 4096), (1, 4000, 8192), created_at_s=0.0, stage=Stage.SCALING)
    configs = [(2, 1, 4.0, 4.0), (4, 1, 4.0, 4.0), (8, 1, 2.0, 4.0)]
    samples = exact_samples(STALL_COEF, configs, reps=3)
    here = exact_samples(STALL_COEF, [(8, 1, 4.0, 4.0)], reps=5)
    samples += [dataclasses.replace(s, timestamp_s=600.0 + i) for i, s in enumerate(here)]
    obs = [
        make_obs(t, ps_util=(0.8,), ps_cpu=4000, worker_cpu=4000, worker_speeds=[100.0] * 8,
                 samples_total=10**10)
        for t in (900.0, 960.0, 1020.0)
    ]  # fmt: skip
    d = planner.replan(cur, obs, samples, 1200.0, [cur])
    assert d.model is not None and "ps" in d.model.fixed_inputs_
    assert d.plan is not None and d.plan.stage is Stage.SAMPLING, d.notes
    assert d.plan.ps.count == 2
    assert d.plan.workers.count == (7 if quota_cpu == 36 else 8)


def test_a_full_rank_model_that_never_saw_the_worker_count_vary_still_samples_it() -> None:
    """One worker throughout, PS count and CPUs varied: the five coefficients are all
    identified (the features see w only through w/p), yet the model cannot predict other
    worker counts. Finding nothing in its span (stubbed), the planner samples more workers
    rather than wait for a recheck (a job sat 20 h on one worker that way, session 11)."""
    spec = make_linear_spec(quota={"cpu": 256, "memory": "1024Gi"})
    planner = Planner(spec, PlannerConfig.from_spec(spec, idle_worker_cpu_util=0.0))
    planner._model_move = lambda *a, **k: (None, "nothing saves", None)  # type: ignore[method-assign]
    cur = make_plan((1, 4000, 4096), (2, 4000, 8192), created_at_s=0.0, stage=Stage.SCALING)
    configs = [(1, 1, 4.0, 4.0), (1, 2, 8.0, 4.0), (1, 4, 4.0, 2.0), (1, 3, 2.0, 4.0)]
    samples = exact_samples(STALL_COEF, configs, reps=3)
    here = exact_samples(STALL_COEF, [(1, 2, 4.0, 4.0)], reps=5)
    samples += [dataclasses.replace(s, timestamp_s=600.0 + i) for i, s in enumerate(here)]
    obs = [
        make_obs(t, ps_util=(0.8, 0.8), ps_cpu=4000, worker_cpu=4000, worker_speeds=[100.0],
                 samples_total=10**10)
        for t in (900.0, 960.0, 1020.0)
    ]  # fmt: skip
    d = planner.replan(cur, obs, samples, 1200.0, [cur])
    assert d.model is not None and d.model.full_rank_
    assert set(d.model.fixed_inputs_) == {"workers"}
    assert d.plan is not None and d.plan.stage is Stage.SAMPLING, d.notes
    assert d.plan.workers.count > 1


def test_a_sampling_move_never_gives_back_memory_the_job_needed() -> None:
    """A move from the first plan (when moves from here no longer fit) carries that plan's
    memory: a PS whose OOM bumped it from 8 to 16 GiB went back to 8 GiB and OOMed again
    (seed 206). The move keeps what the job holds now, and PS are sized by the memory fit."""
    spec = make_linear_spec(quota={"cpu": 64, "memory": "256Gi"})
    planner = Planner(spec)
    cur = make_plan((2, 4000, 6144), (1, 4000, 16384))
    base = make_plan((1, 4000, 4096), (1, 4000, 8192))
    obs = [
        make_obs(
            600.0, ps_util=[0.5], ps_cpu=4000, ps_mem=16384, ps_mem_util=[0.9],
            samples_done=10**6, distinct_ids=10**6,
        )
    ]  # fmt: skip
    fit = planner._memory_fits(obs)[0]
    w, p = planner._memory_kept(cur, base.workers, base.ps, fit)
    assert w.resources.memory_mib == 6144
    # the PS uses 90 % of 16 GiB: what it uses × the 1.2 margin
    assert p.resources.memory_mib >= 0.9 * 16384 * 1.2
    assert (w.count, p.count, w.resources.cpu_millicores) == (1, 1, 4000)
    # two PS: sized by the fit (its fixed part per PS), never the first plan's 8 GiB
    two = make_plan((1, 4000, 4096), (2, 4000, 8192)).ps
    _, p2 = planner._memory_kept(cur, base.workers, two, fit)
    assert 14_000 < p2.resources.memory_mib <= p.resources.memory_mib
