"""PSBottleneckThroughputModel: the MAP fit with priors that the planner uses for PS jobs."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from dlrover_core.errors import InputError
from dlrover_core.model.throughput import (
    PSBottleneckThroughputModel,
    effective_cores,
    fit_throughput_model,
    model_from_dict,
)
from dlrover_core.sim.trace import generate_trace
from dlrover_core.types import Sample

B = 512
# rate, ps_ratio, network_ratio, worker_core_cap, ps_core_cap, ps_skew, overlap
TRUE = (800.0, 2.0, 400.0, 4.0, 8.0, 0.8, 4.5)


def own_form(w: float, p: float, lw: float, lp: float, th: tuple[float, ...] = TRUE) -> float:
    r, rp, rn, kw, kp, beta, g = th
    xw = w * float(effective_cores(lw, kw, 1.0)) * r
    xp = float(effective_cores(lp, kp, 0.75)) * rp * r * p**beta
    xn = rn * r * p**beta
    return float((xw**-g + xp**-g + xn**-g) ** (-1.0 / g))


def samples_of(configs, truth=own_form, noise=0.0, reps=3, seed=0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for w, p, lw, lp in configs:
        for _ in range(reps):
            x = truth(w, p, lw, lp) * math.exp(rng.normal(0.0, noise))
            out.append(Sample(w, p, lw, lp, x, batch_size=B))
    return out


GRID = list(itertools.product([1, 4, 16], [1, 2, 6], [2.0, 8.0], [2.0, 12.0]))


def test_many_configurations_recover_the_form_and_predict_unseen_ones() -> None:
    m = PSBottleneckThroughputModel(batch_size=B).fit(samples_of(GRID, noise=0.02))
    for cfg in [(8, 3, 4.0, 6.0), (32, 8, 3.0, 4.0), (2, 1, 16.0, 16.0)]:
        assert m.predict(*cfg).throughput_sps == pytest.approx(own_form(*cfg), rel=0.05)
    c = m.coef_
    assert c["worker_core_cap"] == pytest.approx(4.0, rel=0.25)
    assert c["ps_core_cap"] == pytest.approx(8.0, rel=0.35)
    assert m.trustworthy() and m.relative_error_ < 0.03
    assert m.fixed_inputs_ == {} and m.full_rank_


def test_one_configuration_predicts_everywhere_with_a_band_that_widens_away_from_it() -> None:
    m = PSBottleneckThroughputModel(batch_size=B).fit(samples_of([(1, 1, 16.0, 16.0)]))
    x, lo, hi = m.predict_bounds_many([[1, 1, 16.0, 16.0], [8, 4, 8.0, 8.0], [64, 16, 2, 4]])
    assert x[0] == pytest.approx(own_form(1, 1, 16.0, 16.0), rel=0.02)
    widths = np.log(hi / lo)
    assert widths[0] < widths[1] < widths[2]
    assert np.all(np.isfinite(widths)) and np.all(lo > 0)


def test_the_band_holds_the_truth_of_a_simulated_job_from_three_configurations() -> None:
    hits = total = 0
    errors = []
    for job in generate_trace(40, seed=5)[:25]:
        t = job.truth
        cfgs = [(1, 1, 16.0, 16.0), (9, 4, 8.0, 8.0), (20, 6, 4.0, 6.0)]
        fit = samples_of(cfgs, truth=t.throughput, noise=0.05, seed=job.index)
        m = PSBottleneckThroughputModel(batch_size=B).fit(fit)
        test = [(12, 5, 6.0, 8.0), (24, 8, 4.0, 4.0), (6, 2, 8.0, 12.0)]
        x, lo, hi = m.predict_bounds_many(np.array(test))
        true = np.array([t.throughput(*c) for c in test])
        hits += int(np.sum((lo <= true) & (true <= hi)))
        total += len(test)
        errors.extend(np.abs(x / true - 1).tolist())
    assert hits / total >= 0.8  # a ~95 % band; the form is not the simulator's exactly
    assert float(np.median(errors)) < 0.10


def test_predict_grid_equals_predict_many() -> None:
    m = PSBottleneckThroughputModel(batch_size=B).fit(samples_of(GRID[:5]))
    axes = ([1, 3, 9], [1, 4], [2.0, 5.0], [1.0, 8.0, 16.0])
    grid = m.predict_grid(*axes)
    rows = np.array(list(itertools.product(*axes)), dtype=float)
    assert np.allclose(grid.ravel(), m.predict_many(rows), rtol=1e-12)


def test_json_round_trip_predicts_the_same(tmp_path) -> None:
    m = fit_throughput_model(samples_of(GRID[:6]), "ps_bottleneck", batch_size=B)
    doc = json.loads(json.dumps(m.to_dict()))
    back = model_from_dict(doc)
    assert isinstance(back, PSBottleneckThroughputModel)
    cfgs = np.array([[4, 2, 4.0, 4.0], [40, 10, 2.0, 8.0]])
    assert np.allclose(back.predict_bounds_many(cfgs), m.predict_bounds_many(cfgs))
    doc["fitted"]["theta"] = [1.0, 2.0]
    with pytest.raises(InputError, match="malformed ps_bottleneck_throughput"):
        model_from_dict(doc)


def test_warm_started_refit_matches_a_cold_one() -> None:
    s = samples_of(GRID[:4], noise=0.03)
    cold = PSBottleneckThroughputModel(batch_size=B).fit(s)
    more = s + samples_of([(8, 2, 4.0, 8.0)], noise=0.03, seed=1)
    warm = PSBottleneckThroughputModel(batch_size=B).fit(more, start=cold)
    again = PSBottleneckThroughputModel(batch_size=B).fit(more)
    cfgs = np.array([[16, 4, 4.0, 8.0], [2, 1, 8.0, 8.0]])
    assert np.allclose(warm.predict_many(cfgs), again.predict_many(cfgs), rtol=0.02)


def test_bad_input_is_refused_with_the_field_named() -> None:
    with pytest.raises(InputError, match="no samples"):
        PSBottleneckThroughputModel().fit([])
    with pytest.raises(InputError, match="throughput"):
        PSBottleneckThroughputModel().fit([Sample(1, 1, 2.0, 2.0, -5.0)])
    with pytest.raises(InputError, match="ps_core_cap"):
        PSBottleneckThroughputModel(ps_core_cap=0.0)
    m = PSBottleneckThroughputModel(batch_size=B).fit(samples_of(GRID[:2]))
    with pytest.raises(InputError, match="cannot be predicted"):
        m.predict_many([[0, 1, 2.0, 2.0]])
    with pytest.raises(InputError, match="workers"):
        m.predict(0, 1, 2.0, 2.0)
    assert not math.isnan(m.predict(3, 2, 1.0, 1.0).lower_sps)


def fanout_form(w: float, p: float, lw: float, lp: float, phi: float = 0.4) -> float:
    """``own_form`` whose workers pay ``phi`` of a step for every PS past the first (one more
    lookup and push a step): the worker stage divided by 1 + phi·(p − 1)."""
    r, rp, rn, kw, kp, beta, g = TRUE
    xw = w * float(effective_cores(lw, kw, 1.0)) * r / (1.0 + phi * (p - 1.0))
    xp = float(effective_cores(lp, kp, 0.75)) * rp * r * p**beta
    xn = rn * r * p**beta
    return float((xw**-g + xp**-g + xn**-g) ** (-1.0 / g))


def test_the_per_ps_worker_cost_is_off_by_default_and_fitted_when_on(tmp_path) -> None:
    """Off (``ps_fanout`` 0) the form and its seven parameters are what they were; on, the
    fit recovers the cost from configurations that vary the PS count and predicts a PS count
    it never saw, where the form without it is far off. Round-trips through JSON."""
    train = [c for c in GRID if c[1] in (1, 2)]
    s = samples_of(train, truth=fanout_form, noise=0.02)
    off = PSBottleneckThroughputModel(batch_size=B).fit(s)
    assert "ps_fanout" not in off.coef_ and len(off.coef_array_) == 7
    on = PSBottleneckThroughputModel(batch_size=B, ps_fanout=0.1).fit(s)
    assert on.coef_["ps_fanout"] == pytest.approx(0.4, rel=0.25)
    unseen = (4, 6, 2.0, 12.0)  # six PS: a worker-bound configuration the train never had
    truth = fanout_form(*unseen)
    assert on.predict(*unseen).throughput_sps == pytest.approx(truth, rel=0.08)
    assert abs(off.predict(*unseen).throughput_sps / truth - 1.0) > 0.3
    back = model_from_dict(json.loads(json.dumps(on.to_dict())))
    assert back.predict(*unseen).throughput_sps == pytest.approx(on.predict(*unseen).throughput_sps)
    with pytest.raises(InputError, match="ps_fanout"):
        PSBottleneckThroughputModel(ps_fanout=-1.0)
