"""dlrover-rm vs dlrover-oss JCT by job size (quota in cores) on one generated trace.

    PYTHONPATH=$PWD python notes/issue-10-big-jobs.py JOBS SEED
Quota >= 512 cores is where the simulator's jobs may use 64+ workers and 16+ PS.
"""

from __future__ import annotations

import sys

import numpy as np

from dlrover_core.sim.engine import Engine, cluster_capacity
from dlrover_core.sim.policies import POLICIES
from dlrover_core.sim.registry import policy_factories
from dlrover_core.sim.trace import generate_trace


def main(argv: list[str]) -> None:
    n, seed = int(argv[1]), int(argv[2])
    jobs = generate_trace(n, seed)
    table = policy_factories(POLICIES)
    runs = {}
    for name in ("dlrover-rm", "dlrover-oss"):
        eng = Engine(jobs, table[name](), cluster_capacity(jobs), seed)
        eng.run()
        runs[name] = {r.job.name: r for r in eng.runs}
    for lo, hi in ((0.0, 128.0), (128.0, 512.0), (512.0, float("inf"))):
        a, b = [], []
        for j in jobs:
            if not lo <= j.quota.cpu_cores < hi:
                continue
            ra, rb = runs["dlrover-rm"][j.name], runs["dlrover-oss"][j.name]
            if ra.status == rb.status == "completed":
                a.append(ra.end_s - j.submit_s)
                b.append(rb.end_s - j.submit_s)
        x, y = np.array(a) / 60, np.array(b) / 60
        p_x, p_y = np.percentile(x, 90), np.percentile(y, 90)
        print(
            f"seed {seed} quota [{lo:g}, {hi:g}) cores: {len(x)} jobs, JCT mean rm "
            f"{x.mean():.0f} / oss {y.mean():.0f} min ({x.mean() / y.mean():.2f}x), "
            f"p90 {p_x:.0f} / {p_y:.0f} ({p_x / p_y:.2f}x)"
        )


if __name__ == "__main__":
    main(sys.argv)
