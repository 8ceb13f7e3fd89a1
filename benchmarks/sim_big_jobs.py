"""dlrover-rm against dlrover-oss by job size: JCT mean and p90 per quota band on one generated
trace (issue 10's tail: the largest jobs lost most to DLRover's heuristics).

    python benchmarks/sim_big_jobs.py [--jobs 300] [--seed 101] [--json OUT]

Bands are the job's quota in cores: [0, 128), [128, 512), [512, inf); a quota of 512 cores or
more is where the simulator's jobs may use 64+ workers and 16+ PS. Only jobs both policies
completed count. Needs the `oss` extra (the real `dlrover` package as the peer).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.sim.engine import Engine, cluster_capacity
from dlrover_core.sim.policies import POLICIES
from dlrover_core.sim.registry import policy_factories
from dlrover_core.sim.trace import generate_trace

BANDS = ((0.0, 128.0), (128.0, 512.0), (512.0, float("inf")))


def _finite(v: float) -> float | None:
    """JSON has no infinity: the open band's upper bound is null."""
    return v if np.isfinite(v) else None


def by_size(n: int, seed: int) -> list[dict[str, Any]]:
    jobs = generate_trace(n, seed)
    table = policy_factories(POLICIES)
    runs = {}
    for name in ("dlrover-rm", "dlrover-oss"):
        eng = Engine(jobs, table[name](), cluster_capacity(jobs), seed)
        eng.run()
        runs[name] = {r.job.name: r for r in eng.runs}
    out = []
    for lo, hi in BANDS:
        a, b = [], []
        for j in jobs:
            if not lo <= j.quota.cpu_cores < hi:
                continue
            ra, rb = runs["dlrover-rm"][j.name], runs["dlrover-oss"][j.name]
            if ra.status == rb.status == "completed":
                a.append(ra.end_s - j.submit_s)
                b.append(rb.end_s - j.submit_s)
        if not a:
            out.append({"quota_cores": [lo, _finite(hi)], "jobs": 0})
            continue
        x, y = np.array(a) / 60, np.array(b) / 60
        out.append(
            {
                "quota_cores": [lo, _finite(hi)],
                "jobs": len(x),
                "rm_jct_mean_min": float(x.mean()),
                "oss_jct_mean_min": float(y.mean()),
                "rm_jct_p90_min": float(np.percentile(x, 90)),
                "oss_jct_p90_min": float(np.percentile(y, 90)),
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--jobs", type=int, default=300, help="jobs in the generated trace")
    ap.add_argument("--seed", type=int, default=101, help="trace seed")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the figures as JSON")
    a = ap.parse_args()
    if a.jobs < 1:
        ap.error(f"--jobs must be >= 1 (got {a.jobs})")
    rows = by_size(a.jobs, a.seed)
    for r in rows:
        lo, hi = r["quota_cores"][0], r["quota_cores"][1] or float("inf")
        if not r["jobs"]:
            print(f"seed {a.seed} quota [{lo:g}, {hi:g}) cores: no job both completed")
            continue
        xm, ym, xp, yp = (
            r["rm_jct_mean_min"],
            r["oss_jct_mean_min"],
            r["rm_jct_p90_min"],
            r["oss_jct_p90_min"],
        )
        print(
            f"seed {a.seed} quota [{lo:g}, {hi:g}) cores: {r['jobs']} jobs, JCT mean rm "
            f"{xm:.0f} / oss {ym:.0f} min ({xm / ym:.2f}x), "
            f"p90 {xp:.0f} / {yp:.0f} ({xp / yp:.2f}x)"
        )
    if a.json:
        doc = {"jobs": a.jobs, "seed": a.seed, "bands": rows}
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
