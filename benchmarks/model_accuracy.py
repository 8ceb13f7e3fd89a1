"""Held-out accuracy of the resource-performance model on simulated jobs.

    python benchmarks/model_accuracy.py [--jobs 50] [--seed 0] [--json OUT]

For each simulated job, measure its hidden true throughput (with the simulator's noise) at a
training set of configurations around a realistic operating range, fit the planner's model,
and compute the mean absolute percentage error on held-out configurations of the same range.
The truth comes from a different functional family (saturating cores, per-PS load skew,
bandwidth caps, smooth minimum) than the model, so this measures the model, not a closed loop.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.model.throughput import fit_throughput_model
from dlrover_core.sim.trace import generate_trace
from dlrover_core.types import Sample

W = (2, 4, 8, 12, 16, 24, 32)
P = (1, 2, 3, 4, 6)
LW = (1.0, 2.0, 4.0, 8.0)
LP = (2.0, 4.0, 8.0, 16.0)


def job_mape(truth, batch: int, rng: np.random.Generator, strategy: str) -> float:
    grid = list(itertools.product(W, P, LW, LP))
    idx = rng.permutation(len(grid))
    train = [grid[i] for i in idx[:24]]
    test = [grid[i] for i in idx[24:124]]
    noise = truth.noise_sigma

    def measure(c: tuple[int, int, float, float]) -> float:
        return float(truth.throughput(*c) * np.exp(rng.normal(0.0, noise)))

    samples = [Sample(*c, measure(c), batch_size=batch) for c in train for _ in range(2)]
    model = fit_throughput_model(samples, strategy, batch_size=batch)
    pred = model.predict_many(np.array(test, dtype=float))
    true = np.array([truth.throughput(*c) for c in test])
    return float(np.mean(np.abs(pred / true - 1.0)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    jobs = generate_trace(a.jobs, a.seed)
    out: dict[str, dict[str, float]] = {}
    for strategy in ("ps", "ps_extended", "ps_overlap"):
        m = np.array([job_mape(j.truth, j.batch_size, rng, strategy) for j in jobs])
        out[strategy] = {
            "mape_median": float(np.median(m)),
            "mape_mean": float(np.mean(m)),
            "mape_p90": float(np.percentile(m, 90)),
            "jobs_within_10pct": float(np.mean(m <= 0.10)),
        }
        print(
            f"{strategy:<12} held-out MAPE median {out[strategy]['mape_median']:.1%}  "
            f"mean {out[strategy]['mape_mean']:.1%}  p90 {out[strategy]['mape_p90']:.1%}  "
            f"jobs within 10%: {out[strategy]['jobs_within_10pct']:.0%}"
        )
    if a.json:
        a.json.write_text(json.dumps({"jobs": a.jobs, "seed": a.seed, "models": out}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
