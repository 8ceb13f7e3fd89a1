"""The default throughput form (``throughput_form: bottleneck``) is cross-validated against
the linear forms from ``SELECT_MIN_CONFIGS`` configurations: the bottleneck form's priors
are drawn for CPU parameter-server jobs and can contradict what a job measures (GPU workers
behind a PS that never saturates); its own data keep it on jobs it describes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest

from dlrover_core.model import selection
from dlrover_core.model.selection import SELECT_MIN_CONFIGS, ModelChoice
from dlrover_core.model.throughput import PSBottleneckThroughputModel, PSThroughputModel
from dlrover_core.sim.trace import generate_trace
from dlrover_core.types import Sample

B = 64

Truth = Callable[[int, int, float, float], float]


def measured(configs: list[tuple[int, int, float, float]], truth: Truth, *, noise: float = 0.02,
             reps: int = 3, seed: int = 0, batch: int = B) -> list[Sample]:  # fmt: skip
    rng = np.random.default_rng(seed)
    return [
        Sample(w, p, lw, lp, truth(w, p, lw, lp) * math.exp(rng.normal(0, noise)), batch_size=batch)
        for w, p, lw, lp in configs
        for _ in range(reps)
    ]


def gpu_like(w: int, p: int, lw: float, lp: float) -> float:
    """One GPU per worker behind one PS that never saturates (tf_cnn_benchmarks' single
    server curves: 1 → 8 GPUs scale ~linearly); the CPUs are nominal."""
    return 50.0 * w**0.97


def _count_cross_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    runs: list[int] = []
    real = selection.linear_predicts_better
    monkeypatch.setattr(
        selection, "linear_predicts_better", lambda *a, **k: runs.append(1) or real(*a, **k)
    )
    return runs


def test_linear_forms_chosen_where_the_jobs_measurements_contradict_the_priors() -> None:
    train = measured([(1, 1, 1.0, 1.0), (2, 1, 1.0, 1.0), (4, 1, 1.0, 1.0)], gpu_like)
    chosen = ModelChoice()(train, "ps", B)
    bottleneck = PSBottleneckThroughputModel(batch_size=B).fit(train)
    truth = gpu_like(8, 1, 1.0, 1.0)
    assert isinstance(chosen, PSThroughputModel)
    assert not isinstance(chosen, PSBottleneckThroughputModel)
    # extrapolated to twice the largest measured count: what the choice is for
    assert abs(chosen.predict(8, 1, 1.0, 1.0).throughput_sps / truth - 1) < 0.10
    assert abs(bottleneck.predict(8, 1, 1.0, 1.0).throughput_sps / truth - 1) > 0.20


def test_bottleneck_form_kept_on_the_simulators_jobs() -> None:
    """The jobs it was designed for: the linear forms must not win their cross-validation
    on a handful of configurations (each of the trace's first 20 jobs, 4 configurations)."""
    cfgs = [(1, 1, 16.0, 16.0), (9, 4, 8.0, 8.0), (20, 6, 4.0, 6.0), (12, 5, 6.0, 8.0)]
    kept = 0
    jobs = generate_trace(30, seed=11)[:20]
    for job in jobs:
        train = measured(cfgs, job.truth.throughput, noise=0.05, seed=job.index, batch=512)
        kept += isinstance(ModelChoice()(train, "ps", 512), PSBottleneckThroughputModel)
    assert kept >= len(jobs) - 1


def test_no_cross_validation_below_the_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _count_cross_validations(monkeypatch)
    cfgs = [(1, 1, 1.0, 1.0), (2, 1, 1.0, 1.0), (4, 1, 1.0, 1.0)][: SELECT_MIN_CONFIGS - 1]
    choice = ModelChoice()
    assert isinstance(choice(measured(cfgs, gpu_like), "ps", B), PSBottleneckThroughputModel)
    assert not runs and choice.remembered() is None


def test_the_choice_is_remembered_and_adopted_by_the_next_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfgs = [(1, 1, 1.0, 1.0), (2, 1, 1.0, 1.0), (4, 1, 1.0, 1.0)]
    first = ModelChoice()
    first(measured(cfgs, gpu_like), "ps", B)
    left = json.loads(json.dumps(first.remembered()))
    assert left == {"form": "linear", "configs": [list(c) for c in sorted(cfgs)]}
    runs = _count_cross_validations(monkeypatch)
    nxt = ModelChoice()
    assert nxt.adopt(left)
    assert not nxt.adopt(left)  # a choice is already made: a later one is ignored
    # the same configurations, one more: the adopted choice holds, no cross-validation
    more = measured([*cfgs, (3, 1, 1.0, 1.0)], gpu_like, seed=3)
    model = nxt(more, "ps", B)
    assert not isinstance(model, PSBottleneckThroughputModel) and not runs
    # grown by CHOOSE_AGAIN_GROWTH: chosen again
    nxt(measured([*cfgs, (3, 1, 1.0, 1.0), (5, 1, 1.0, 1.0)], gpu_like), "ps", B)
    assert len(runs) == 1
    # each form adopts only the choices it makes
    assert not ModelChoice("linear").adopt(left)
    assert not ModelChoice().adopt({"form": "ps_overlap", "configs": left["configs"]})
    assert not ModelChoice().adopt({"form": "linear", "configs": left["configs"][:2]})
