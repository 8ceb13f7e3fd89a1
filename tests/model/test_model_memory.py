"""Memory models: ID growth, PS memory with OOM look-ahead, worker memory. Hand-checkable."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dlrover_core.errors import InputError, NotFittedError, TooFewSamplesError
from dlrover_core.model import IdGrowthModel, PSMemoryModel, WorkerMemoryModel

N = [1e4, 1e5, 1e6, 1e7]


@pytest.mark.parametrize(("k", "beta"), [(4096.0, 0.5), (30.0, 0.8), (2.0, 1.0)])
def test_id_growth_recovers_k_and_beta(k: float, beta: float) -> None:
    model = IdGrowthModel().fit(N, [k * n**beta for n in N])
    assert model.k_ == pytest.approx(k, rel=1e-9)
    assert model.beta_ == pytest.approx(beta, rel=1e-9)
    assert model.predict(1e8) == pytest.approx(k * 1e8**beta, rel=1e-9)
    np.testing.assert_allclose(model.predict(np.array(N)), [k * n**beta for n in N], rtol=1e-9)


def test_id_growth_with_noise_and_clipping() -> None:
    rng = np.random.default_rng(0)
    n = np.geomspace(1e3, 1e7, 20)
    u = 500.0 * n**0.6 * np.exp(0.02 * rng.standard_normal(n.size))
    model = IdGrowthModel().fit(n.tolist(), u.tolist())
    assert model.beta_ == pytest.approx(0.6, abs=0.01)
    assert 0.01 < model.log_residual_std_ < 0.03
    # faster than linear growth is impossible (each sample adds at most a few IDs): β -> 1
    assert IdGrowthModel().fit([1, 10, 100], [1, 100, 10000]).beta_ == 1.0
    # shrinking counts (a reset) clip to the barely-growing end of (0, 1]
    assert 0 < IdGrowthModel().fit([1, 10], [100, 50]).beta_ <= 1e-6


def test_id_growth_cap_and_inverse() -> None:
    model = IdGrowthModel(max_ids=1e6).fit([1e4, 1e6], [1e4, 1e5])  # U = 100·sqrt(n)
    assert model.predict(1e12) == 1e6
    assert model.samples_for(1e5) == pytest.approx(1e6)
    assert math.isinf(model.samples_for(2e6))


def test_id_growth_errors_and_round_trip() -> None:
    with pytest.raises(NotFittedError):
        IdGrowthModel().predict(10.0)
    with pytest.raises(TooFewSamplesError, match=">= 2 different"):
        IdGrowthModel().fit([100, 100], [10, 11])
    with pytest.raises(InputError, match="point 1"):
        IdGrowthModel().fit([1, 0], [1, 1])
    model = IdGrowthModel(max_ids=5e6).fit(N, [7 * n**0.7 for n in N])
    loaded = IdGrowthModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert loaded.predict(3e7) == model.predict(3e7)
    assert loaded.max_ids == 5e6


def make_ps_memory() -> PSMemoryModel:
    # per row: 8 values · 4 B · (1 + 1 slot) + 64 B hash map = 128 B = 2^-13 MiB
    return PSMemoryModel(
        8, bytes_per_value=4, optimizer_slots=1, row_overhead_bytes=64.0, runtime_overhead_mib=100.0
    )


def test_ps_memory_per_ps_hand_calculation() -> None:
    mem = make_ps_memory()
    assert mem.bytes_per_row == 128.0
    # 2^24 rows · 128 B = 2 GiB = 2048 MiB over 2 PS = 1024 MiB each, + 100 MiB runtime
    assert mem.per_ps_mib(2**24, 2) == pytest.approx(1124.0)
    assert mem.per_ps_mib(2**24, 2, imbalance=1.5) == pytest.approx(1636.0)
    assert mem.total_mib(2**24, 2) == pytest.approx(2248.0)
    dense = PSMemoryModel(8, dense_params=2**20, runtime_overhead_mib=0.0, row_overhead_bytes=0)
    assert dense.per_ps_mib(0, 1) == pytest.approx(8.0)  # 2^20 · 4 B · 2 = 8 MiB


def test_predict_oom_matches_hand_calculation() -> None:
    # U(n) = 4096·sqrt(n). Limit 1124 MiB on 2 PS -> the PS fill at U* = 2^24 rows (above),
    # i.e. sqrt(n*) = 2^24 / 2^12 -> n* = 2^24 = 16,777,216 samples.
    # End of training, 1e8 samples: U = 4096·1e4 = 40,960,000 rows = 5000 MiB of data ->
    # per PS 5000/2 + 100 = 2600 MiB; with margin 1.2 -> 3120 MiB per PS at 2 PS, or
    # (5000/p + 100)·1.2 <= 1124 -> p >= 5.98 -> 6 PS at the current limit.
    growth = IdGrowthModel().fit([1e4, 1e6], [4096 * 1e2, 4096 * 1e3])
    oom = make_ps_memory().predict_oom(
        growth, samples_seen=1e6, samples_total=1e8, num_ps=2, ps_memory_limit_mib=1124.0
    )
    assert oom.distinct_ids_at_end == pytest.approx(40_960_000)
    assert oom.peak_per_ps_mib == pytest.approx(2600.0)
    assert oom.will_oom
    assert oom.oom_at_samples == 16_777_216
    assert oom.needed_memory_per_ps_mib == 3120
    assert oom.needed_num_ps == 6
    assert json.loads(json.dumps(oom.to_dict()))["needed_num_ps"] == 6


def test_predict_oom_none_when_it_fits_and_errors() -> None:
    growth = IdGrowthModel().fit([1e4, 1e6], [4096 * 1e2, 4096 * 1e3])
    mem = make_ps_memory()
    ok = mem.predict_oom(
        growth, samples_seen=0, samples_total=1e6, num_ps=2, ps_memory_limit_mib=1124.0
    )
    assert ok.oom_at_samples is None and not ok.will_oom
    # runtime alone (100 MiB · 1.2) does not fit 110 MiB: no PS count helps
    tiny = mem.predict_oom(
        growth, samples_seen=0, samples_total=1e6, num_ps=1, ps_memory_limit_mib=110.0
    )
    # 10 MiB of data = 81,920 rows = 4096·sqrt(n) -> n = 400
    assert tiny.needed_num_ps is None and tiny.oom_at_samples == 400
    with pytest.raises(InputError) as err:
        mem.predict_oom(growth, samples_seen=5, samples_total=1, num_ps=0, ps_memory_limit_mib=-1)
    assert len(err.value.problems) == 3
    loaded = PSMemoryModel.from_dict(json.loads(json.dumps(mem.to_dict())))
    assert loaded.per_ps_mib(2**24, 2) == mem.per_ps_mib(2**24, 2)


@pytest.mark.parametrize(
    ("used", "kwargs", "expected"),
    [
        ([1000, 2000, 1500], {}, 3000),  # 2000 · 1.5
        ([100, 200], {}, 1024),  # floor
        ([1000, 2000], {"margin": 1.2}, 2400),
        ([10_000], {"ceiling_mib": 12_000}, 12_000),  # 15,000 clamped
        ([1000.2], {"margin": 1.0, "floor_mib": 0}, 1001),  # whole MiB, rounded up
    ],
)
def test_worker_memory(used: list[float], kwargs: dict[str, float], expected: int) -> None:
    model = WorkerMemoryModel(**kwargs).fit(used)
    assert model.predict() == expected
    assert (
        WorkerMemoryModel.from_dict(json.loads(json.dumps(model.to_dict()))).predict() == expected
    )


def test_worker_memory_errors() -> None:
    with pytest.raises(NotFittedError):
        WorkerMemoryModel().predict()
    with pytest.raises(TooFewSamplesError):
        WorkerMemoryModel().fit([])
    with pytest.raises(InputError):
        WorkerMemoryModel().fit([float("nan")])
