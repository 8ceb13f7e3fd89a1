"""Scratch experiment (not a benchmark): dlrover-rm in the simulator with the planner's model
factory swapped for one that uses PSOverlapThroughputModel, to see what the model is worth in
the closed loop. The planner itself is not changed.

    PYTHONPATH=$PWD python notes/issue-10-model-in-planner.py MODE JOBS SEED
    MODE: default | overlap (when >= 9 configurations and every column identified)
          | overlap_any (from 5 configurations, when its training error is the lower)
"""

import json
import sys
import time

import dlrover_core.sim.rm_policy as rp
from dlrover_core.errors import DLRoverError
from dlrover_core.model.throughput import PSOverlapThroughputModel
from dlrover_core.planner.planner import default_model_factory
from dlrover_core.sim.runner import run_policy
from dlrover_core.sim.trace import generate_trace

mode, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def overlap_factory(samples, strategy, batch_size):
    if (
        strategy == "ps"
        and PSOverlapThroughputModel.count_configs(samples) >= PSOverlapThroughputModel.min_configs
    ):
        try:
            m = PSOverlapThroughputModel(batch_size=batch_size).fit(samples)
            if m.full_rank_:
                return m
        except DLRoverError:
            pass
    return default_model_factory(samples, strategy, batch_size)


def overlap_any(samples, strategy, batch_size):
    d = default_model_factory(samples, strategy, batch_size)
    if strategy == "ps" and PSOverlapThroughputModel.count_configs(samples) >= 5:
        try:
            m = PSOverlapThroughputModel(batch_size=batch_size).fit(samples)
            if m.relative_error_ < d.relative_error_:
                return m
        except DLRoverError:
            pass
    return d


if mode == "overlap":
    rp.default_model_factory = overlap_factory
if mode == "overlap_any":
    rp.default_model_factory = overlap_any
jobs = generate_trace(n, seed)
t = time.process_time()
r = run_policy(jobs, "dlrover-rm", seed)
r.pop("jobs")
print(
    mode,
    n,
    seed,
    json.dumps(
        {
            k: (round(v / 60, 1) if k.startswith("jct") else v)
            for k, v in r.items()
            if k
            in (
                "jct_median_s",
                "jct_mean_s",
                "jct_p90_s",
                "completion_rate",
                "scaling_ops",
                "oracle_throughput_ratio",
                "cpu_util",
                "cpu_s",
            )
        }
    ),
)
