"""Per-job JCT of dlrover-rm vs dlrover-oss on generated traces; the plans of the worst jobs.

Issue 10's tail analysis:
    PYTHONPATH=$PWD python notes/issue-10-tail.py JOBS SEEDS [SHOW [v]]
e.g. ``python notes/issue-10-tail.py 200 0,1 4 v`` (v: print every plan of the worst jobs).
"""

from __future__ import annotations

import sys

import numpy as np

from dlrover_core.sim.engine import Engine, cluster_capacity
from dlrover_core.sim.policies import POLICIES
from dlrover_core.sim.registry import policy_factories
from dlrover_core.sim.trace import generate_trace


def _plan_line(pl, start_s: float) -> str:  # type: ignore[no-untyped-def]
    w, p = pl.workers, pl.ps
    why = "; ".join(pl.reasons)[:230]
    return (
        f"     t={pl.created_at_s - start_s:7.0f} {pl.stage.value:12s} "
        f"w{w.count}x{w.resources.cpu_cores:g} p{p.count}x{p.resources.cpu_cores:g} "
        f"{pl.action:12s} {why}"
    )


def main(argv: list[str]) -> None:
    n, seeds = int(argv[1]), [int(x) for x in argv[2].split(",")]
    show = int(argv[3]) if len(argv) > 3 else 5
    verbose = len(argv) > 4
    table = policy_factories(POLICIES)
    for seed in seeds:
        jobs = generate_trace(n, seed)
        runs, pols = {}, {}
        for name in ("dlrover-rm", "dlrover-oss"):
            pol = table[name]()
            eng = Engine(jobs, pol, cluster_capacity(jobs), seed)
            eng.run()
            runs[name] = {r.job.name: r for r in eng.runs}
            pols[name] = pol
        rows = []
        for j in jobs:
            a, b = runs["dlrover-rm"][j.name], runs["dlrover-oss"][j.name]
            if a.status == "completed" and b.status == "completed":
                ja, jb = a.end_s - j.submit_s, b.end_s - j.submit_s
                rows.append((ja - jb, ja, jb, j, a, b))
        ja = np.array([r[1] for r in rows]) / 60
        jb = np.array([r[2] for r in rows]) / 60
        print(
            f"seed {seed}: mean rm {ja.mean():.0f} oss {jb.mean():.0f}  p90 "
            f"{np.percentile(ja, 90):.0f} / {np.percentile(jb, 90):.0f}  med "
            f"{np.median(ja):.0f}/{np.median(jb):.0f}"
        )
        loss = sum(max(0.0, r[0]) for r in rows) / 3600
        gain = sum(-min(0.0, r[0]) for r in rows) / 3600
        print(f"  total loss {loss:.1f} h, gain {gain:.1f} h over {len(rows)} jobs")
        rows.sort(key=lambda r: -r[0])
        for _, ja_, jb_, j, a, b in rows[:show]:
            q = j.quota
            oc = j.truth.oracle_config(q.cpu_cores, q.memory_mib)
            print(
                f"  {j.name}: rm {ja_ / 60:.0f}m oss {jb_ / 60:.0f}m  quota {q.cpu_cores:.0f} "
                f"cores  ops rm {a.scaling_ops} oss {b.scaling_ops}  oracle w{oc.workers} "
                f"p{oc.ps} wc{oc.worker_cpu_cores} pc{oc.ps_cpu_cores}"
            )
            if verbose:
                for pl in pols["dlrover-rm"]._jobs[j.name].plans:
                    print(_plan_line(pl, a.start_s))


if __name__ == "__main__":
    main(sys.argv)
