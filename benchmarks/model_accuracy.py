"""Held-out accuracy of the resource-performance model on simulated jobs.

    python benchmarks/model_accuracy.py [--jobs 50] [--seeds 0] [--split random|extrapolate]
                                        [--ablation] [--diagnose] [--json OUT]

For each simulated job, measure its hidden true throughput (with the simulator's noise) at a
training set of configurations around a realistic operating range, fit the model, and compute
the mean absolute percentage error on held-out configurations.

* ``--split random`` (default, interpolation): 24 training and 100 held-out configurations
  drawn from one grid (w 2..32, p 1..6, λw 1..8, λp 2..16).
* ``--split extrapolate``: train on w <= 12 only, hold out w in {16, 24, 32} (every held-out
  configuration has more workers than any training one).
* ``--ablation``: the overlap model with one ingredient removed (γ fixed at 1; no lost-cores
  term a2; no light-load PS term b4; no hot-shard term b5), to show what each contributes.
* ``--diagnose``: the paper form against truths with one ingredient of the simulator's
  family made model-like (sum instead of smooth minimum, linear CPU, even PS shares), to show
  where its error comes from.

The truth is the simulator's family (saturating cores, per-PS load skew, bandwidth caps,
smooth minimum). The linear forms (``ps``, ``ps_overlap``) come from a different family, so
for them this measures the model, not a closed loop. ``ps_bottleneck`` is built from the
same ingredients (parallelism caps, hot-shard spread, smooth-minimum overlap), so its figure
here is close to an in-family fit and flatters it: its out-of-family check is
benchmarks/real_curves.py (published measurements), where it interpolates within 10 % but
extrapolates worse than the linear forms on two of the three curves.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.model.throughput import (
    PSOverlapThroughputModel,
    ThroughputModel,
    fit_throughput_model,
)
from dlrover_core.sim.trace import generate_trace
from dlrover_core.sim.truth import JobTruth
from dlrover_core.types import Sample

W = (2, 4, 8, 12, 16, 24, 32)
P = (1, 2, 3, 4, 6)
LW = (1.0, 2.0, 4.0, 8.0)
LP = (2.0, 4.0, 8.0, 16.0)
STRATEGIES = ("ps", "ps_extended", "ps_overlap", "ps_bottleneck")

Config = tuple[int, int, float, float]
Fitter = Callable[[list[Sample], int], ThroughputModel]


def _without(*drop: str) -> type[PSOverlapThroughputModel]:
    """The overlap model with the named terms removed (for the ablation)."""
    keep = [i for i, n in enumerate(PSOverlapThroughputModel.feature_names) if n not in drop]

    class Ablated(PSOverlapThroughputModel):
        kind: ClassVar[str] = "ablated"
        feature_names: ClassVar[tuple[str, ...]] = tuple(
            PSOverlapThroughputModel.feature_names[i] for i in keep
        )
        stage_of: ClassVar[tuple[int, ...]] = tuple(
            PSOverlapThroughputModel.stage_of[i] for i in keep
        )
        min_configs: ClassVar[int] = len(keep) + 1

        def _features(self, *a: Any) -> Any:
            return super()._features(*a)[:, keep]

        def _features_scalar(self, *a: Any) -> tuple[float, ...]:
            f = super()._features_scalar(*a)
            return tuple(f[i] for i in keep)

        def _feature_terms(self, *a: Any) -> Any:
            f = super()._feature_terms(*a)
            return tuple(f[i] for i in keep)

    return Ablated


def fitters(ablation: bool) -> dict[str, Fitter]:
    out: dict[str, Fitter] = {
        s: (lambda smp, b, s=s: fit_throughput_model(smp, s, batch_size=b)) for s in STRATEGIES
    }
    if ablation:
        out["overlap, γ = 1"] = lambda smp, b: PSOverlapThroughputModel(
            batch_size=b, max_overlap=1.0
        ).fit(smp)
        out["overlap, no a2"] = lambda smp, b: _without("a2")(batch_size=b).fit(smp)
        out["overlap, no b4"] = lambda smp, b: _without("b4")(batch_size=b).fit(smp)
        out["overlap, no b5"] = lambda smp, b: _without("b5")(batch_size=b).fit(smp)
        out["overlap, no a2, b5"] = lambda smp, b: _without("a2", "b5")(batch_size=b).fit(smp)
    return out


def split_configs(rng: np.random.Generator, how: str) -> tuple[list[Config], list[Config]]:
    grid = list(itertools.product(W, P, LW, LP))
    if how == "extrapolate":
        inside = [c for c in grid if c[0] <= 12]
        outside = [c for c in grid if c[0] >= 16]
        i, o = rng.permutation(len(inside)), rng.permutation(len(outside))
        return [inside[k] for k in i[:24]], [outside[k] for k in o[:100]]
    idx = rng.permutation(len(grid))
    return [grid[i] for i in idx[:24]], [grid[i] for i in idx[24:124]]


def job_mapes(
    truth: JobTruth, batch: int, rng: np.random.Generator, fits: dict[str, Fitter], how: str
) -> dict[str, float]:
    """MAPE of every fitter on one job (the same training measurements for all)."""
    train, test = split_configs(rng, how)
    noise = truth.noise_sigma
    samples = [
        Sample(*c, float(truth.throughput(*c) * np.exp(rng.normal(0.0, noise))), batch_size=batch)
        for c in train
        for _ in range(2)
    ]
    true = np.array([truth.throughput(*c) for c in test])
    out = {}
    for name, fit in fits.items():
        pred = fit(samples, batch).predict_many(np.array(test, dtype=float))
        out[name] = float(np.mean(np.abs(pred / true - 1.0)))
    return out


# ---------------------------------------------------------------- diagnosis (truth variants)
class _LinearCpuTruth(JobTruth):
    """The job's truth with CPU cores that scale linearly (no overhead, no saturation)."""

    def eff_worker(self, cpu: Any) -> Any:
        return np.maximum(np.asarray(cpu, dtype=np.float64), 0.0)

    def eff_ps(self, cpu: Any) -> Any:
        return np.maximum(np.asarray(cpu, dtype=np.float64), 0.0)


def _fresh(t: JobTruth, cls: type[JobTruth] = JobTruth, **changes: Any) -> JobTruth:
    vals = {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.init}
    vals.update(changes, _shares={}, _mshares={}, _oracle={})
    return cls(**vals)


TRUTH_VARIANTS: dict[str, Callable[[JobTruth], JobTruth]] = {
    "simulator's truth": lambda t: t,
    "no noise": lambda t: _fresh(t, noise_sigma=0.0),
    "stages add up (smooth_k = 1)": lambda t: _fresh(t, smooth_k=1.0),
    "even PS shares": lambda t: _fresh(t, skew_alpha=1e9),
    "linear CPU": lambda t: _fresh(t, _LinearCpuTruth),
    "add up + even shares, no noise": lambda t: _fresh(
        t, smooth_k=1.0, skew_alpha=1e9, noise_sigma=0.0
    ),
    "add up + linear CPU, no noise": lambda t: _fresh(
        t, _LinearCpuTruth, smooth_k=1.0, noise_sigma=0.0
    ),
    "add up + linear CPU + even shares, no noise": lambda t: _fresh(
        t, _LinearCpuTruth, smooth_k=1.0, skew_alpha=1e9, noise_sigma=0.0
    ),
}


def summary(m: np.ndarray) -> dict[str, float]:
    return {
        "mape_median": float(np.median(m)),
        "mape_mean": float(np.mean(m)),
        "mape_p90": float(np.percentile(m, 90)),
        "jobs_within_10pct": float(np.mean(m <= 0.10)),
    }


def _line(name: str, s: dict[str, float]) -> str:
    return (
        f"{name:<44} held-out MAPE median {s['mape_median']:.1%}  mean {s['mape_mean']:.1%}  "
        f"p90 {s['mape_p90']:.1%}  jobs within 10%: {s['jobs_within_10pct']:.0%}"
    )


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=None, help="one trace seed (same as --seeds N)")
    ap.add_argument("--seeds", default="0", help="trace seeds, e.g. 0 or 1-5 or 1,3")
    ap.add_argument("--split", choices=["random", "extrapolate"], default="random")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--diagnose", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    seeds = [a.seed] if a.seed is not None else parse_seeds(a.seeds)
    doc: dict[str, Any] = {"jobs": a.jobs, "split": a.split, "tuned_on": [0], "seeds": {}}
    for seed in seeds:
        rng = np.random.default_rng(seed)
        jobs = generate_trace(a.jobs, seed)
        print(f"--- seed {seed}, {a.jobs} jobs, split {a.split}")
        if a.diagnose:
            fits = {"ps": fitters(False)["ps"]}
            res: dict[str, dict[str, float]] = {}
            for vname, variant in TRUTH_VARIANTS.items():
                m = np.array(
                    [
                        job_mapes(variant(j.truth), j.batch_size, rng, fits, a.split)["ps"]
                        for j in jobs
                    ]
                )
                res[vname] = summary(m)
                print(_line(f"paper form vs {vname}", res[vname]))
            doc["seeds"][str(seed)] = {"diagnose": res}
            continue
        fits = fitters(a.ablation)
        per_job = [job_mapes(j.truth, j.batch_size, rng, fits, a.split) for j in jobs]
        out = {n: summary(np.array([pj[n] for pj in per_job])) for n in fits}
        for n, s in out.items():
            print(_line(n, s))
        doc["seeds"][str(seed)] = {"models": out}
        if len(seeds) == 1:
            doc["models"] = out  # the one-seed layout of earlier runs
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
