"""Throughput models: recovery, bounds, identifiability, serialisation, held-out accuracy.

Truths are written out in full so every expected number can be derived by hand.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from dlrover_core.errors import InputError, NotFittedError, TooFewSamplesError
from dlrover_core.model import (
    AllReduceThroughputModel,
    PSExtendedThroughputModel,
    PSThroughputModel,
    ThroughputPrediction,
    fit_throughput_model,
    model_from_dict,
)
from dlrover_core.types import Sample

B = 512
Config = tuple[int, int, float, float]
Truth = Callable[[int, int, float, float], float]

PS_COEF = {"a0": 0.02, "a1": 0.004, "b1": 0.0006, "b2": 0.00004, "b3": 0.01}
PS_COEF_2 = {"a0": 0.05, "a1": 0.001, "b1": 0.002, "b2": 0.0, "b3": 0.003}  # b2 at the bound 0
AR_COEF = {"a0": 0.01, "a1": 0.003, "c1": 0.2, "c2": 0.004}

# realistic grid: w in 1..32, p in 1..8, cores in 1..16
GRID: list[Config] = [
    (w, p, float(lw), float(lp))
    for w, p, lw, lp in itertools.product(
        [1, 2, 4, 8, 16, 32], [1, 2, 4, 8], [1, 2, 4, 8, 16], [1, 2, 4, 8, 16]
    )
]


def split(n_train: int = 40, seed: int = 0) -> tuple[list[Config], list[Config]]:
    """Disjoint train / held-out configurations drawn from GRID."""
    idx = np.random.default_rng(seed).permutation(len(GRID))
    return [GRID[i] for i in idx[:n_train]], [GRID[i] for i in idx[n_train:]]


def ps_truth(coef: dict[str, float], b: int = B) -> Truth:
    def x(w: int, p: int, lw: float, lp: float) -> float:
        t = (
            coef["a0"]
            + coef["a1"] * b / lw
            + coef["b1"] * (w / p) * b / lp
            + coef["b2"] * (w / p) * b
            + coef["b3"] * p
        )
        return w * b / t

    return x


def mva_truth(w: int, p: int, lw: float, lp: float) -> float:
    """A *different* family: a closed queueing network solved by exact MVA. w workers
    cycle through local compute (a delay, Z = 0.01 + 0.002·B/λw s) and p PS queues visited in
    turn, each with demand D = 0.0008·B/(p·λp) + 0.002 s. The PS saturates: X <= B/D."""
    z = 0.01 + 0.002 * B / lw
    d = 0.0008 * B / (p * lp) + 0.002
    q = 0.0
    x = 0.0
    for n in range(1, w + 1):
        r = d * (1.0 + q)
        x = n / (z + p * r)
        q = x * r
    return x * B


def smooth_min_truth(w: int, p: int, lw: float, lp: float) -> float:
    """Another family: worker-bound rate and PS capacity p·λp·400 combined by a smooth min
    (power mean, exponent -2). Exponent -1 would lie inside the PS form; -2 does not."""
    x_workers = w * B / (0.02 + 0.004 * B / lw)
    x_ps = p * lp * 400.0
    return float((x_workers**-2 + x_ps**-2) ** -0.5)


def make_samples(
    configs: Sequence[Config], truth: Truth, noise: float = 0.0, seed: int = 1
) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for w, p, lw, lp in configs:
        x = truth(w, p, lw, lp) * (1.0 + noise * rng.standard_normal())
        out.append(Sample(w, p, lw, lp, x))
    return out


def mape(
    model: PSThroughputModel | AllReduceThroughputModel, configs: list[Config], truth: Truth
) -> float:
    pred = model.predict_many(np.array(configs, dtype=float))
    true = np.array([truth(*c) for c in configs])
    return float(np.mean(np.abs(pred / true - 1.0)))


# ---------------------------------------------------------------- exact recovery


@pytest.mark.parametrize("coef", [PS_COEF, PS_COEF_2], ids=["all-positive", "b2-zero"])
def test_ps_recovers_known_coefficients_from_noise_free_data(coef: dict[str, float]) -> None:
    train, _ = split()
    model = PSThroughputModel(batch_size=B).fit(make_samples(train, ps_truth(coef)))
    for name, value in coef.items():
        assert model.coef_[name] == pytest.approx(value, rel=1e-6, abs=1e-12)
    assert model.relative_error_ == pytest.approx(0.0, abs=1e-9)
    assert model.n_configs_ == 40 and model.dof_ > 0


def test_ps_prediction_matches_hand_calculation() -> None:
    train, _ = split()
    model = PSThroughputModel(batch_size=B).fit(make_samples(train, ps_truth(PS_COEF)))
    # T = 0.02 + 0.004·512/4 + 0.0006·(8/2)·512/4 + 0.00004·(8/2)·512 + 0.01·2
    #   = 0.02 + 0.512 + 0.3072 + 0.08192 + 0.02 = 0.94112 s;  X = 8·512 / T
    pred = model.predict(8, 2, 4.0, 4.0)
    assert pred.throughput_sps == pytest.approx(8 * 512 / 0.94112, rel=1e-6)
    # an exact fit: the band collapses onto the prediction
    assert pred.lower_sps == pytest.approx(pred.throughput_sps, rel=1e-9)
    assert pred.upper_sps == pytest.approx(pred.throughput_sps, rel=1e-9)


def test_extended_ps_recovers_its_extra_term() -> None:
    coef = {**PS_COEF, "b4": 0.0005}
    base = ps_truth(PS_COEF)

    def truth(w: int, p: int, lw: float, lp: float) -> float:
        return w * B / (w * B / base(w, p, lw, lp) + coef["b4"] * B / lp)

    train, _ = split()
    model = PSExtendedThroughputModel(batch_size=B).fit(make_samples(train, truth))
    for name, value in coef.items():
        assert model.coef_[name] == pytest.approx(value, rel=1e-6)


def allreduce_truth(w: int, p: int, lw: float, lp: float) -> float:
    t = AR_COEF["a0"] + AR_COEF["a1"] * B / lw + AR_COEF["c1"] * (w - 1) / w
    return w * B / (t + AR_COEF["c2"] * (w - 1))


def test_allreduce_recovers_known_coefficients_and_ignores_ps() -> None:
    configs = [(w, 0, float(lw), 0.0) for w in (1, 2, 4, 8, 16) for lw in (2, 4, 8)]
    model = AllReduceThroughputModel(batch_size=B).fit(make_samples(configs, allreduce_truth))
    for name, value in AR_COEF.items():
        assert model.coef_[name] == pytest.approx(value, rel=1e-6)
    # ps / ps_cpu are ignored: any value (0 included) gives the same prediction
    a = model.predict(4, 0, 4.0, 0.0).throughput_sps
    b = model.predict(4, 7, 4.0, 3.0).throughput_sps
    assert a == b == pytest.approx(allreduce_truth(4, 0, 4.0, 0.0), rel=1e-6)


# ---------------------------------------------------------------- bounds


def test_bounds_contain_truth_on_noisy_data() -> None:
    train, test = split()
    truth = ps_truth(PS_COEF)
    model = PSThroughputModel(batch_size=B).fit(make_samples(train, truth, noise=0.03))
    pred, lo, up = model.predict_bounds_many(np.array(test, dtype=float))
    true = np.array([truth(*c) for c in test])
    assert np.all(lo < pred) and np.all(pred < up)
    # ~95 % bands around a 3 %-noise fit; the noise-free truth lies inside nearly always
    assert np.mean((lo <= true) & (true <= up)) >= 0.95
    assert 0.01 < model.rel_std_ < 0.06  # recovers the 3 % noise level, roughly


def test_bounds_widen_with_fewer_degrees_of_freedom() -> None:
    truth = ps_truth(PS_COEF)
    train, _ = split(n_train=60)
    wide = PSThroughputModel(batch_size=B).fit(make_samples(train[:7], truth, noise=0.03))
    narrow = PSThroughputModel(batch_size=B).fit(make_samples(train, truth, noise=0.03))
    assert wide.z_ > narrow.z_ > 1.9  # Student-t quantile: 4.30 at dof 2, ~2.0 at dof 55


def test_exactly_determined_fit_uses_the_prior_band() -> None:
    train, _ = split()
    model = PSThroughputModel(batch_size=B, prior_rel_std=0.25).fit(
        make_samples(train[:5], ps_truth(PS_COEF))
    )
    assert model.dof_ == 0 and model.rel_std_ == 0.25
    assert not model.trustworthy()
    pred = model.predict(4, 2, 4.0, 4.0)
    assert pred.lower_sps < pred.throughput_sps < pred.upper_sps


def test_scalar_and_vector_predictions_agree() -> None:
    train, test = split()
    model = PSThroughputModel(batch_size=B).fit(make_samples(train, ps_truth(PS_COEF), noise=0.03))
    pred, lo, up = model.predict_bounds_many(np.array(test[:50], dtype=float))
    for i, c in enumerate(test[:50]):
        one = model.predict(*c)
        assert isinstance(one, ThroughputPrediction)
        assert one.throughput_sps == pytest.approx(pred[i], rel=1e-12)
        assert one.lower_sps == pytest.approx(lo[i], rel=1e-9)
        assert one.upper_sps == pytest.approx(up[i], rel=1e-9)


# ---------------------------------------------------------------- held-out accuracy


def test_heldout_mape_in_form_with_3pct_noise_is_about_1pct() -> None:
    # measured: ~0.8 % MAPE on 560 held-out configs (40 training configs, 3 % noise)
    train, test = split()
    truth = ps_truth(PS_COEF)
    model = PSThroughputModel(batch_size=B).fit(make_samples(train, truth, noise=0.03))
    assert mape(model, test, truth) < 0.03
    assert model.trustworthy()


def test_heldout_mape_on_queueing_truth_extended_form_under_10pct() -> None:
    # measured on the MVA truth (560 held-out configs; PS utilisation 0.5 %..100 %):
    #   PSThroughputModel (paper form) 17.4 %, PSExtendedThroughputModel 9.5 %.
    # The paper form has no light-load PS term (B/λp), so it misfits unsaturated PS.
    train, test = split()
    samples = make_samples(train, mva_truth)
    ext = PSExtendedThroughputModel(batch_size=B).fit(samples)
    paper = PSThroughputModel(batch_size=B).fit(samples)
    assert mape(ext, test, mva_truth) < 0.10
    assert mape(paper, test, mva_truth) < 0.20


def test_heldout_mape_on_queueing_truth_in_operating_range() -> None:
    # In the range a planner runs (0.2 <= PS utilisation <= 0.9), measured MAPE on the held-out
    # configs: paper form 17.6 %, extended form 7.6 %. The paper form's miss is structural
    # (no light-load PS term), not a matter of range.
    def util(c: Config) -> float:
        _w, p, _lw, lp = c
        return mva_truth(*c) / B * (0.0008 * B / (p * lp) + 0.002)

    configs = [c for c in GRID if 0.2 <= util(c) <= 0.9]
    idx = np.random.default_rng(0).permutation(len(configs))
    train = [configs[i] for i in idx[:40]]
    test = [configs[i] for i in idx[40:]]
    samples = make_samples(train, mva_truth)
    paper = mape(PSThroughputModel(batch_size=B).fit(samples), test, mva_truth)
    ext = mape(PSExtendedThroughputModel(batch_size=B).fit(samples), test, mva_truth)
    assert paper < 0.20, f"paper form MAPE {paper:.3f}"
    assert ext < 0.10, f"extended form MAPE {ext:.3f}"


def test_heldout_mape_on_smooth_min_truth() -> None:
    # measured: paper form ~10.4 % on the full grid (a sharp min cannot be matched exactly
    # by a sum of terms); the band still covers the truth nearly everywhere.
    train, test = split()
    model = PSThroughputModel(batch_size=B).fit(make_samples(train, smooth_min_truth))
    assert mape(model, test, smooth_min_truth) < 0.12
    _, lo, up = model.predict_bounds_many(np.array(test, dtype=float))
    true = np.array([smooth_min_truth(*c) for c in test])
    assert np.mean((lo <= true) & (true <= up)) >= 0.9


# ---------------------------------------------------------------- identifiability & errors


def test_one_configuration_says_how_many_and_what_to_do() -> None:
    samples = make_samples([(2, 1, 4.0, 4.0)] * 3, ps_truth(PS_COEF), noise=0.01)
    with pytest.raises(TooFewSamplesError) as err:
        PSThroughputModel().fit(samples)
    msg = str(err.value)
    assert "at least 2" in msg and "got 1" in msg and "3 samples" in msg
    assert "dlrover-rm profile" in msg


def test_samples_varying_only_counts_fit_inside_their_span() -> None:
    """An Optimus-style profile (workers x PS at fixed CPUs) used to be refused (rank 3 < 5):
    the identifiable part is fitted, predictions at the profiled CPUs are served (exact on an
    exact truth), and a prediction that moves a CPU that never varied is refused."""
    configs = [(w, p, 4.0, 4.0) for w in (1, 2, 4, 8) for p in (1, 2, 4)]
    truth = ps_truth(PS_COEF)
    samples = make_samples(configs, truth)
    model = PSThroughputModel()
    assert not model.is_identifiable(samples)  # not every coefficient
    model.fit(samples)
    assert not model.full_rank_
    assert model.fixed_inputs_ == {"worker_cpu": 4.0, "ps_cpu": 4.0}
    assert set(model.identified_) < set(PSThroughputModel.feature_names)
    test = [(16, 4, 4.0, 4.0), (3, 3, 4.0, 4.0), (6, 2, 4.0, 4.0)]
    pred = model.predict_many(np.array(test, dtype=float))
    true = np.array([truth(*c) for c in test])
    np.testing.assert_allclose(pred, true, rtol=1e-6)
    with pytest.raises(InputError) as err:
        model.predict(2, 1, 8.0, 4.0)
    assert "worker_cpu never varied" in str(err.value.problems)
    back = PSThroughputModel.from_dict(model.to_dict())
    assert back.fixed_inputs_ == model.fixed_inputs_
    with pytest.raises(InputError):
        back.predict_many(np.array([[2, 1, 4.0, 8.0]]))


def test_allreduce_with_two_worker_counts_fits_what_they_identify() -> None:
    configs = [(w, 0, float(lw), 0.0) for w in (1, 2) for lw in (1, 2, 4)]
    samples = make_samples(configs, allreduce_truth)
    assert not AllReduceThroughputModel().is_identifiable(samples)
    model = AllReduceThroughputModel().fit(samples)
    assert not model.full_rank_ and model.fixed_inputs_ == {}
    pred = model.predict_many(np.array([[2, 0, 3.0, 0.0]]))
    assert pred[0] == pytest.approx(allreduce_truth(2, 0, 3.0, 0.0), rel=0.02)


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (Sample(0, 1, 4.0, 4.0, 100.0), "workers=0"),
        (Sample(2, 0, 4.0, 4.0, 100.0), "ps=0"),
        (Sample(2, 1, 0.0, 4.0, 100.0), "worker_cpu=0.0"),
        (Sample(2, 1, 4.0, 4.0, 0.0), "throughput=0.0"),
        (Sample(2, 1, 4.0, 4.0, float("nan")), "throughput=nan"),
        (Sample(2, 1, 4.0, 4.0, 100.0, batch_size=0), "batch_size=0"),
    ],
)
def test_bad_samples_are_named_by_row(bad: Sample, fragment: str) -> None:
    train, _ = split()
    samples = make_samples(train[:8], ps_truth(PS_COEF))
    samples.insert(3, bad)
    with pytest.raises(InputError) as err:
        PSThroughputModel().fit(samples)
    assert any(p.startswith("sample 3:") and fragment in p for p in err.value.problems)


def test_predict_before_fit_raises() -> None:
    model = PSThroughputModel()
    with pytest.raises(NotFittedError, match="call fit"):
        model.predict(1, 1, 1.0, 1.0)
    with pytest.raises(NotFittedError):
        model.predict_many(np.ones((2, 4)))
    with pytest.raises(NotFittedError):
        _ = model.coef_
    assert not model.trustworthy()


def test_predict_rejects_impossible_configs() -> None:
    train, _ = split()
    model = PSThroughputModel(batch_size=B).fit(make_samples(train, ps_truth(PS_COEF)))
    with pytest.raises(InputError):
        model.predict(0, 1, 1.0, 1.0)
    with pytest.raises(InputError, match="row 1"):
        model.predict_many(np.array([[1, 1, 1, 1], [1, 0, 1, 1]], dtype=float))
    with pytest.raises(InputError, match="shape"):
        model.predict_many(np.ones((2, 3)))


# ---------------------------------------------------------------- batch size, serialisation


def test_batch_size_from_samples_is_the_default_for_predict() -> None:
    train, _ = split()
    truth = ps_truth(PS_COEF, b=256)
    samples = [Sample(w, p, lw, lp, truth(w, p, lw, lp), batch_size=256) for w, p, lw, lp in train]
    model = PSThroughputModel(batch_size=B).fit(samples)
    assert model.default_batch_size_ == 256
    assert model.predict(4, 2, 2.0, 2.0).throughput_sps == pytest.approx(truth(4, 2, 2.0, 2.0))
    # a 5th column gives the batch size; NaN means the default
    cfg = np.array([[4, 2, 2, 2, 512], [4, 2, 2, 2, np.nan]], dtype=float)
    out = model.predict_many(cfg)
    assert out[0] == pytest.approx(ps_truth(PS_COEF, b=512)(4, 2, 2.0, 2.0))
    assert out[1] == pytest.approx(truth(4, 2, 2.0, 2.0))


@pytest.mark.parametrize("strategy", ["ps", "ps_extended", "allreduce"])
def test_to_dict_from_dict_round_trip_gives_identical_predictions(strategy: str) -> None:
    train, test = split()
    if strategy == "allreduce":
        samples = make_samples(
            [(w, 0, lw, 0.0) for w, _, lw, _ in train], allreduce_truth, noise=0.03
        )
    else:
        samples = make_samples(train, ps_truth(PS_COEF), noise=0.03)
    model = fit_throughput_model(samples, strategy, batch_size=B)
    doc = json.loads(json.dumps(model.to_dict()))
    assert doc["kind"] == model.kind
    loaded = model_from_dict(doc)
    assert type(loaded) is type(model)
    cfg = np.array(test[:100], dtype=float)
    for a, b in zip(model.predict_bounds_many(cfg), loaded.predict_bounds_many(cfg), strict=True):
        np.testing.assert_array_equal(a, b)
    assert loaded.predict(*test[0]) == model.predict(*test[0])
    assert loaded.coef_ == model.coef_ and loaded.relative_error_ == model.relative_error_


def test_unfitted_round_trip_and_bad_documents() -> None:
    loaded = model_from_dict(PSThroughputModel(batch_size=128).to_dict())
    assert loaded.batch_size == 128
    with pytest.raises(NotFittedError):
        loaded.predict(1, 1, 1.0, 1.0)
    with pytest.raises(InputError, match="unknown throughput model kind"):
        model_from_dict({"kind": "nope"})
    with pytest.raises(InputError, match="malformed"):
        model_from_dict({"kind": "ps_throughput", "fitted": {"coef": {}}})
    with pytest.raises(InputError, match="unknown strategy"):
        fit_throughput_model([], "ring")


# ---------------------------------------------------------------- speed


def test_predict_is_fast() -> None:
    train, _ = split()
    model = PSThroughputModel(batch_size=B).fit(make_samples(train, ps_truth(PS_COEF)))
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        model.predict(8, 2, 4.0, 4.0)
    per_call = (time.perf_counter() - start) / n
    assert per_call < 200e-6  # measured ~7 µs; generous for slow CI machines
    grid = np.array(GRID * 10, dtype=float)  # 6000 candidate configs
    start = time.perf_counter()
    model.predict_bounds_many(grid)
    assert time.perf_counter() - start < 0.1  # measured ~2 ms
