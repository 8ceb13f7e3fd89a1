"""Scratch (not a benchmark): which rule should the planner use to pick the overlap model?
Runs dlrover-rm alone in the simulator with the factory's selection rule swapped.

    PYTHONPATH=$PWD python notes/issue-10-model-select.py RULE JOBS SEED[,SEED...]
    RULE: base  (never the overlap model: the planner before this change)
        | train (overlap from 5 configurations when its training error is the lower)
        | loo   (lower leave-one-configuration-out error)
        | cv5   (lower 5-fold cross-validated error over configurations; = loo up to 5)
        | cv3   (the same with 3 folds)
        | aicc  (lower AICc on the per-configuration mean log errors)
"""

import json
import math
import sys
import time
from collections.abc import Sequence

import numpy as np

import dlrover_core.sim.rm_policy as rp
from dlrover_core.errors import DLRoverError
from dlrover_core.planner import planner as pl
from dlrover_core.sim.runner import run_policy
from dlrover_core.sim.trace import generate_trace
from dlrover_core.types import Sample

rule, n, seeds = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
counts = {"base": 0, "overlap": 0}


def _n_params(m) -> int:
    return int(np.count_nonzero(m.coef_array_ > 0)) + (1 if getattr(m, "gamma_", 1.0) > 1.0 else 0)


def _aicc_cfg(m, samples: Sequence[Sample]) -> float:
    by: dict = {}
    for s in samples:
        by.setdefault(s.config, []).append(s.throughput_sps)
    rows = [[*c, math.nan] for c in by]
    x_hat = m.predict_many(rows)
    r = np.log(x_hat) - np.log([np.mean(v) for v in by.values()])
    k, nn = _n_params(m), len(r)
    if nn - k - 1 <= 0:
        return math.inf
    return nn * math.log(max(float(r @ r), 1e-300) / nn) + 2 * k + 2 * k * (k + 1) / (nn - k - 1)


def factory(samples, strategy, batch_size):
    if rule in ("loo", "cv5", "cv3"):
        pl.OVERLAP_FOLDS = {"loo": None, "cv5": 5, "cv3": 3}[rule]
        m = pl.default_model_factory(samples, strategy, batch_size)
    else:
        m = (
            pl._baseline_ps_model(samples, batch_size)
            if strategy == "ps"
            else (pl.fit_throughput_model(samples, strategy, batch_size=batch_size))
        )
        if rule != "base" and strategy == "ps" and len({s.config for s in samples}) >= 5:
            try:
                ov = pl._overlap_ps_model(samples, batch_size)
                if rule == "train" and ov.relative_error_ < m.relative_error_:
                    m = ov
                if rule == "aicc" and _aicc_cfg(ov, samples) < _aicc_cfg(m, samples):
                    m = ov
            except DLRoverError:
                pass
    counts["overlap" if type(m).__name__ == "PSOverlapThroughputModel" else "base"] += 1
    return m


rp.default_model_factory = factory
for seed in seeds:
    jobs = generate_trace(n, seed)
    counts.update(base=0, overlap=0)
    t = time.process_time()
    r = run_policy(jobs, "dlrover-rm", seed)
    cpu = time.process_time() - t
    keep = (
        "jct_median_s",
        "jct_mean_s",
        "jct_p90_s",
        "completion_rate",
        "scaling_ops",
        "oracle_throughput_ratio",
        "cpu_util",
        "mem_util",
    )
    out = {
        k: (round(v / 60, 1) if k.startswith("jct") else round(v, 3))
        for k, v in r.items()
        if k in keep
    }
    print(
        rule, n, seed, json.dumps({**out, "fits": dict(counts), "cpu_s": round(cpu, 1)}), flush=True
    )
