"""Where a policy's throughput per core goes on one simulated trace (a diagnostic; issue 10,
session 9).

    python benchmarks/sim_per_core.py [--seed 0] [--jobs 300] [--policy dlrover-rm] [--json OUT]

For every completed job, the configuration it held longest (by allocated core-seconds) is
compared with the oracle's, and its true throughput per core is recomputed with parts of it
swapped for the oracle's: "rm workers, oracle PS" keeps the job's workers and gives it the
oracle's PS count and CPU per PS. Percentiles (10/25/50/75/90) over the jobs. Also the share
of core-seconds spent paused (a scaling operation's pause) and in each planner stage.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.sim import engine as E
from dlrover_core.sim.runner import _oracle_of_job, run_policy
from dlrover_core.sim.trace import generate_trace


def main() -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--seed", type=int, default=0, help="trace seed")
    ap.add_argument("--jobs", type=int, default=300, help="jobs in the generated trace")
    ap.add_argument("--policy", default="dlrover-rm", help="a policy of `dlrover-rm simulate`")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the figures as JSON")
    a = ap.parse_args()
    by_cfg: dict[str, dict[tuple[int, int, float, float], float]] = collections.defaultdict(
        lambda: collections.defaultdict(float)
    )
    by_stage: dict[str, float] = collections.defaultdict(float)
    advance = E.Engine._advance

    def watched(self: E.Engine, run: E._Run, t: float) -> None:
        dt = t - run.t_last
        if dt > 0 and run.plan is not None:
            cs = run.alloc_cpu_m / 1000 * dt
            p = run.plan
            if run.x > 0:
                key = (
                    p.workers.count,
                    p.ps.count,
                    p.workers.resources.cpu_cores,
                    p.ps.resources.cpu_cores,
                )
                by_cfg[run.job.name][key] += cs
                by_stage[p.stage.value] += cs
            else:
                by_stage["paused or down"] += cs
        advance(self, run, t)

    E.Engine._advance = watched  # type: ignore[method-assign]
    jobs = generate_trace(a.jobs, a.seed)
    by_name = {j.name: j for j in jobs}
    m = run_policy(jobs, a.policy, a.seed)
    rows = []
    for jr in m["jobs"]:
        if jr["status"] != "completed" or not by_cfg[jr["name"]]:
            continue
        job = by_name[jr["name"]]
        o = _oracle_of_job(job)
        w, p, lw, lp = max(by_cfg[jr["name"]].items(), key=lambda kv: kv[1])[0]

        def per_core(w: int, p: int, lw: float, lp: float) -> float:
            x = job.truth.rates(np.full(w, lw), np.full(p, lp), [1.0] * w)[0]  # noqa: B023
            return float(x / (w * lw + p * lp)) / o.throughput_per_core  # noqa: B023

        rows.append(
            (
                per_core(w, p, lw, lp),
                per_core(w, o.ps, lw, o.ps_cpu_cores),
                per_core(o.workers, p, o.worker_cpu_cores, lp),
                p,
                o.ps,
                lp,
                o.ps_cpu_cores,
                w,
                o.workers,
                lw,
                o.worker_cpu_cores,
            )
        )
    arr = np.array(rows)
    names = [
        "per-core of the longest-held configuration / oracle's",
        "  ... with rm's workers and the oracle's PS",
        "  ... with the oracle's workers and rm's PS",
        "PS count, rm",
        "PS count, oracle",
        "CPU per PS, rm",
        "CPU per PS, oracle",
        "workers, rm",
        "workers, oracle",
        "CPU per worker, rm",
        "CPU per worker, oracle",
    ]
    print(f"{a.policy}, {a.jobs} jobs, seed {a.seed}: {len(rows)} completed jobs")
    print(f"median per-core / oracle (the table's figure): {m['oracle_throughput_ratio']:.3f}")
    doc: dict = {
        "policy": a.policy,
        "jobs": a.jobs,
        "seed": a.seed,
        "completed": len(rows),
        "per_core_vs_oracle": m["oracle_throughput_ratio"],
        "percentiles": [10, 25, 50, 75, 90],
        "rows": {},
    }
    for i, name in enumerate(names):
        q = np.percentile(arr[:, i], [10, 25, 50, 75, 90])
        print(f"  {name:<56} " + " ".join(f"{v:6.2f}" for v in q))
        doc["rows"][name.strip(" .")] = [float(v) for v in q]
    total = sum(by_stage.values())
    print("share of allocated core-seconds:")
    for k, v in sorted(by_stage.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<16} {v / total:.3f}")
    doc["core_seconds_share"] = {k: v / total for k, v in by_stage.items()}
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
