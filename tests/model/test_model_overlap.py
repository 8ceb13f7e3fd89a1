"""PSOverlapThroughputModel: recovery, reduction to the paper form, held-out accuracy on
other families and on the simulator's jobs, bounds, fallbacks, serialisation."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from dlrover_core.errors import InputError
from dlrover_core.model import (
    PSOverlapThroughputModel,
    PSThroughputModel,
    fit_throughput_model,
    model_from_dict,
)
from dlrover_core.sim.trace import generate_trace
from dlrover_core.types import Sample
from tests.model.test_model_throughput import (
    GRID,
    PS_COEF,
    B,
    Config,
    Truth,
    make_samples,
    mape,
    mva_truth,
    ps_truth,
    smooth_min_truth,
    split,
)

OV_COEF = {
    "a0": 0.02,
    "a1": 0.004,
    "a2": 0.002,  # o = a2/a1 = 0.5 cores lost per worker
    "b1": 0.0006,
    "b2": 0.00004,
    "b3": 0.01,
    "b5": 0.0001,
}


def overlap_truth(coef: dict[str, float], gamma: float) -> Truth:
    def x(w: int, p: int, lw: float, lp: float) -> float:
        s_w = coef["a0"] + coef["a1"] * B / lw + coef["a2"] * B / lw**2
        s_ps = coef["b1"] * (w / p) * B / lp + coef["b3"] * p + coef["b5"] * w * B / lp
        s_net = coef["b2"] * (w / p) * B
        return w * B / (s_w**gamma + s_ps**gamma + s_net**gamma) ** (1.0 / gamma)

    return x


def test_recovers_its_own_coefficients_and_overlap() -> None:
    train, test = split()
    truth = overlap_truth(OV_COEF, 3.0)
    model = PSOverlapThroughputModel(batch_size=B).fit(make_samples(train, truth))
    assert model.gamma_ == pytest.approx(3.0, rel=1e-3)
    for name, value in OV_COEF.items():
        assert model.coef_[name] == pytest.approx(value, rel=2e-3, abs=1e-9), name
    assert mape(model, test, truth) < 1e-4


def test_reduces_to_the_paper_form_on_paper_form_data() -> None:
    # the stages simply add up (γ = 1) and a2 = b5 = 0: the fit is the paper form's
    train, test = split()
    truth = ps_truth(PS_COEF)
    model = PSOverlapThroughputModel(batch_size=B).fit(make_samples(train, truth))
    assert model.gamma_ == pytest.approx(1.0, abs=1e-3)
    assert mape(model, test, truth) < 1e-3


def test_smooth_minimum_truth_is_in_form_with_gamma_2() -> None:
    # smooth_min_truth = (X_w^-2 + X_ps^-2)^-1/2: a worker stage and a PS stage with γ = 2;
    # the paper form misses it by ~10 % (test_model_throughput.py)
    train, test = split()
    samples = make_samples(train, smooth_min_truth)
    model = PSOverlapThroughputModel(batch_size=B).fit(samples)
    paper = PSThroughputModel(batch_size=B).fit(samples)
    assert model.gamma_ == pytest.approx(2.0, rel=1e-2)
    assert mape(model, test, smooth_min_truth) < 0.005
    assert mape(paper, test, smooth_min_truth) > 0.05


def test_queueing_truth_not_worse_than_the_paper_form() -> None:
    # exact MVA of a closed queueing network: another family; measured 17.4 % (paper form)
    # vs ~5 % here
    train, test = split()
    samples = make_samples(train, mva_truth)
    model = PSOverlapThroughputModel(batch_size=B).fit(samples)
    paper = PSThroughputModel(batch_size=B).fit(samples)
    assert mape(model, test, mva_truth) < 0.10
    assert mape(model, test, mva_truth) < mape(paper, test, mva_truth)


def test_heldout_mape_on_simulated_jobs_under_10pct() -> None:
    # the simulator's own truth family (saturating cores, skewed PS shares, bandwidth cap,
    # smooth minimum), 5 % noise, as benchmarks/model_accuracy.py: 24 configurations twice,
    # 100 held out. Seed 7 was not used to choose the form (tuned on seed 0); measured median
    # ~5 % here vs ~17 % for the paper form.
    jobs = generate_trace(12, 7)
    rng = np.random.default_rng(7)
    grid = [
        (w, p, lw, lp)
        for w in (2, 4, 8, 12, 16, 24, 32)
        for p in (1, 2, 3, 4, 6)
        for lw in (1.0, 2.0, 4.0, 8.0)
        for lp in (2.0, 4.0, 8.0, 16.0)
    ]
    ours, paper = [], []
    for j in jobs:
        idx = rng.permutation(len(grid))
        train = [grid[i] for i in idx[:24]]
        test = np.array([grid[i] for i in idx[24:124]], dtype=float)
        smp = [
            Sample(
                *c,
                j.truth.throughput(*c) * float(np.exp(rng.normal(0, 0.05))),
                batch_size=j.batch_size,
            )
            for c in train
            for _ in range(2)
        ]
        true = np.array([j.truth.throughput(int(w), int(p), lw, lp) for w, p, lw, lp in test])
        for out, strategy in ((ours, "ps_overlap"), (paper, "ps")):
            m = fit_throughput_model(smp, strategy, batch_size=j.batch_size)
            out.append(float(np.mean(np.abs(m.predict_many(test) / true - 1.0))))
    assert np.median(ours) < 0.10, ours
    assert np.median(ours) < 0.6 * np.median(paper)


def test_bounds_cover_the_truth_on_noisy_data() -> None:
    train, test = split()
    truth = overlap_truth(OV_COEF, 3.0)
    model = PSOverlapThroughputModel(batch_size=B).fit(make_samples(train, truth, noise=0.03))
    pred, lo, up = model.predict_bounds_many(np.array(test, dtype=float))
    true = np.array([truth(*c) for c in test])
    assert np.all(lo < pred) and np.all(pred < up)
    assert np.mean((lo <= true) & (true <= up)) >= 0.9
    assert 0.01 < model.rel_std_ < 0.06
    assert model.trustworthy()


def test_scalar_vector_and_grid_predictions_agree() -> None:
    train, test = split()
    model = PSOverlapThroughputModel(batch_size=B).fit(
        make_samples(train, overlap_truth(OV_COEF, 2.5), noise=0.03)
    )
    pred, lo, up = model.predict_bounds_many(np.array(test[:20], dtype=float))
    for i, c in enumerate(test[:20]):
        one = model.predict(*c)
        assert one.throughput_sps == pytest.approx(pred[i], rel=1e-12)
        assert one.lower_sps == pytest.approx(lo[i], rel=1e-9)
        assert one.upper_sps == pytest.approx(up[i], rel=1e-9)
    ws, ps_, lws, lps = [1, 4, 32], [1, 3], [1.0, 8.0], [2.0, 16.0, 4.0]
    grid = model.predict_grid(ws, ps_, lws, lps)
    rows = np.array([(w, p, a, b) for w in ws for p in ps_ for a in lws for b in lps], float)
    np.testing.assert_allclose(grid.ravel(), model.predict_many(rows), rtol=1e-12)


def test_few_configurations_fall_back_to_the_additive_fit() -> None:
    # 6 configurations < min_configs (8): NNLS at γ = 1, as the paper form is fitted
    train, _ = split()
    truth = overlap_truth(OV_COEF, 3.0)
    model = PSOverlapThroughputModel(batch_size=B).fit(make_samples(train[:6], truth))
    assert model.gamma_ == 1.0
    assert model.predict(4, 2, 4.0, 4.0).throughput_sps > 0


def test_samples_varying_only_counts_fit_inside_their_span() -> None:
    # an Optimus-style profile (workers x PS at fixed CPUs): the identifiable part and γ
    # are fitted; in the span the prediction is the truth's, outside it is refused
    configs: list[Config] = [(w, p, 4.0, 8.0) for w in (1, 2, 4, 8, 16) for p in (1, 2, 4)]
    truth = overlap_truth(OV_COEF, 3.0)
    model = PSOverlapThroughputModel(batch_size=B).fit(make_samples(configs, truth))
    assert not model.full_rank_ and set(model.identified_) < set(OV_COEF)
    assert model.fixed_inputs_ == {"worker_cpu": 4.0, "ps_cpu": 8.0}
    assert model.gamma_ == pytest.approx(3.0, rel=0.05)
    assert model.predict(6, 3, 4.0, 8.0).throughput_sps == pytest.approx(
        truth(6, 3, 4.0, 8.0), rel=0.01
    )
    with pytest.raises(InputError, match="worker_cpu never varied"):
        model.predict(6, 3, 2.0, 8.0)


def test_round_trip_keeps_gamma_and_predictions() -> None:
    train, test = split()
    model = fit_throughput_model(
        make_samples(train, overlap_truth(OV_COEF, 2.5), noise=0.03), "ps_overlap", batch_size=B
    )
    assert isinstance(model, PSOverlapThroughputModel) and model.gamma_ > 1.5
    doc = json.loads(json.dumps(model.to_dict()))
    loaded = model_from_dict(doc)
    assert type(loaded) is PSOverlapThroughputModel
    assert loaded.gamma_ == model.gamma_
    cfg = np.array(test[:50], dtype=float)
    for a, b in zip(model.predict_bounds_many(cfg), loaded.predict_bounds_many(cfg), strict=True):
        np.testing.assert_array_equal(a, b)
    doc["fitted"]["gamma"] = 0.5
    with pytest.raises(InputError, match="malformed"):
        model_from_dict(doc)
    unfitted = model_from_dict(PSOverlapThroughputModel(max_overlap=1.0).to_dict())
    assert isinstance(unfitted, PSOverlapThroughputModel) and unfitted.max_overlap == 1.0


def test_grid_of_realistic_sizes_is_in_range() -> None:
    # predictions stay positive and finite over the whole test grid (no stage underflow)
    train, _ = split()
    model = PSOverlapThroughputModel(batch_size=B).fit(
        make_samples(train, overlap_truth(OV_COEF, 6.0), noise=0.05)
    )
    x = model.predict_many(np.array(GRID, dtype=float))
    assert np.all(np.isfinite(x)) and np.all(x > 0)


# ---------------------------------------------------------------- warm start (plan latency)


def _counting_lm(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the residual evaluations of every overlap refinement (one entry per solve)."""
    from dlrover_core.model import throughput as th

    real = th._bounded_lm
    calls: list[int] = []

    def counted(fun: th.ResidualFn, *args: object, **kw: object) -> object:
        calls.append(0)

        def f(x: np.ndarray) -> object:
            calls[-1] += 1
            return fun(x)

        return real(f, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(th, "_bounded_lm", counted)
    return calls


def test_warm_start_reaches_the_cold_fit_in_fewer_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # the runtime's case: the previous fit, then one more noisy replicate of a configuration
    train, test = split()
    truth = overlap_truth(OV_COEF, 2.5)
    before = make_samples(train[:16], truth, noise=0.05)
    prev = PSOverlapThroughputModel(batch_size=B).fit(before)
    assert prev.gamma_ > 1.5  # refined: a start worth warming from
    after = before + make_samples(train[3:4], truth, noise=0.05, seed=7)
    calls = _counting_lm(monkeypatch)
    cold = PSOverlapThroughputModel(batch_size=B).fit(after)
    n_cold = sum(calls)
    calls.clear()
    warm = PSOverlapThroughputModel(batch_size=B).fit(after, start_from=prev)
    n_warm = sum(calls)
    assert len(calls) == 1  # one start instead of len(overlap_starts)
    assert n_warm < 0.5 * n_cold, (n_warm, n_cold)
    # the same minimum: predictions agree far inside the 5 % noise
    assert warm.gamma_ == pytest.approx(cold.gamma_, rel=1e-3)
    np.testing.assert_allclose(
        warm.predict_many(np.array(test, dtype=float)),
        cold.predict_many(np.array(test, dtype=float)),
        rtol=1e-4,
    )
    assert warm.rel_std_ == pytest.approx(cold.rel_std_, rel=1e-4)


def test_warm_start_from_an_unrefined_fit_is_the_cold_fit() -> None:
    # a start at γ = 1 (the refinement was not kept) carries no overlap to warm from
    train, _ = split()
    truth = overlap_truth(OV_COEF, 2.5)
    samples = make_samples(train[:12], truth, noise=0.05)
    flat = PSOverlapThroughputModel(batch_size=B, max_overlap=1.0).fit(samples)
    assert flat.gamma_ == 1.0
    cold = PSOverlapThroughputModel(batch_size=B).fit(samples)
    warm = PSOverlapThroughputModel(batch_size=B).fit(samples, start_from=flat)
    assert warm.to_dict() == cold.to_dict()


def test_students_t_quantile_is_scipys() -> None:
    from scipy.stats import t as student_t

    from dlrover_core.model.throughput import _t975

    for dof in (1, 2, 3, 7, 30, 117, 5000):
        assert _t975(dof) == pytest.approx(float(student_t.ppf(0.975, dof)), rel=1e-12)


def test_prediction_bands_stay_finite_far_outside_the_data() -> None:
    """A band however wide stays finite (exp overflows past
    ~709: a report must not carry inf)."""
    from dlrover_core.model.throughput import PSThroughputModel
    from tests.factories import GRID_CONFIGS, exact_samples

    coef = {"a0": 0.05, "a1": 0.001, "b1": 5e-05, "b2": 1e-07, "b3": 0.001}
    samples = exact_samples(coef, GRID_CONFIGS)
    noisy = [
        dataclasses.replace(s, throughput_sps=s.throughput_sps * (1.3 if i % 2 else 0.7))
        for i, s in enumerate(samples)
    ]
    m = PSThroughputModel().fit(noisy)
    m.rel_std_ = 1e3  # a band as wide as a fit far outside its data can give (e^2000)
    _x, lo, hi = m.predict_bounds_many([[16, 2, 2.0, 2.0]])
    assert np.all(np.isfinite(hi)) and np.all(np.isfinite(lo))
    p = m.predict(16, 2, 2.0, 2.0)
    assert math.isfinite(p.upper_sps) and math.isfinite(p.lower_sps)
