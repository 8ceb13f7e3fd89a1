"""Every policy on traces with all-reduce jobs (issue 33 item 3), reported per job kind.

    PYTHONPATH=$PWD python benchmarks/sim_allreduce.py [--jobs 300] [--seeds 9101,9102,9103]
        [--share 0.3] [--processes 2] [--json benchmarks/results/sim_allreduce.json]

Per policy and job kind (``ps``, ``allreduce``), over the seeds' traces pooled: jobs,
completion rate, JCT median and mean of the completed jobs (minutes, submit to end), per-core
throughput against the oracle (median over completed jobs of samples per allocated
core-second ÷ the oracle configuration's true throughput per core: the runner's
``oracle_throughput_ratio``), scaling operations per job, OOMs per job, and for all-reduce the
profiling time per job (dlrover-rm's first runs). Same traces, arrivals and random streams
for every policy. The seeds were not used to tune anything.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.sim.engine import Engine, cluster_capacity
from dlrover_core.sim.policies import POLICIES
from dlrover_core.sim.registry import policy_factories
from dlrover_core.sim.runner import _oracle_of_job
from dlrover_core.sim.trace import generate_trace

KINDS = ("ps", "allreduce")
ORDER = ("manual", "dlrover-oss", "vpa", "autopilot", "optimus", "oracle", "dlrover-rm")


def run_one(args: tuple[str, int, int, float]) -> dict[str, Any]:
    """One policy on one trace: per job, what the report pools."""
    name, n, seed, share = args
    jobs = generate_trace(n, seed, share)
    policy = policy_factories(POLICIES)[name]()
    bind = getattr(policy, "bind_truths", None)
    if bind is not None:
        bind({j.name: j.truth for j in jobs})
    t0 = time.process_time()
    eng = Engine(jobs, policy, cluster_capacity(jobs), seed)
    eng.run()
    rows = []
    for r in eng.runs:
        j = r.job
        per_core = None
        if r.status == "completed" and r.cpu_alloc_cs > 0:
            per_core = (r.done / r.cpu_alloc_cs) / _oracle_of_job(j).throughput_per_core
        rows.append(
            {
                "kind": j.strategy,
                "status": r.status,
                "jct_s": r.end_s - j.submit_s,
                "per_core_vs_oracle": per_core,
                "scaling_ops": r.scaling_ops,
                "oom": r.oom_count,
                "profiled_s": r.profiled_s,
            }
        )
    cpu_s = time.process_time() - t0
    print(f"  {name}@{seed}: {cpu_s:.0f} CPU s", file=sys.stderr, flush=True)
    return {"policy": name, "seed": seed, "cpu_s": cpu_s, "jobs": rows}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if r["status"] == "completed"]
    jct = np.array([r["jct_s"] for r in done]) / 60 if done else np.array([np.nan])
    pc = [r["per_core_vs_oracle"] for r in done if r["per_core_vs_oracle"] is not None]
    n = len(rows)
    return {
        "jobs": n,
        "completion_rate": len(done) / n if n else 0.0,
        "jct_median_min": float(np.median(jct)),
        "jct_mean_min": float(np.mean(jct)),
        "per_core_vs_oracle_median": float(np.median(pc)) if pc else None,
        "scaling_ops_per_job": sum(r["scaling_ops"] for r in rows) / n if n else 0.0,
        "oom_per_job": sum(r["oom"] for r in rows) / n if n else 0.0,
        "profiled_min_per_job": sum(r["profiled_s"] for r in rows) / n / 60 if n else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--seeds", default="9101,9102,9103")
    ap.add_argument("--share", type=float, default=0.3)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--policies", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    known = list(policy_factories(POLICIES))
    names = a.policies.split(",") if a.policies else [p for p in ORDER if p in known]
    # the costliest first (dlrover-rm), so that two processes balance
    tasks = [(p, a.jobs, s, a.share) for p in reversed(names) for s in seeds]
    t0 = time.time()
    if a.processes > 1:
        with mp.get_context("fork").Pool(a.processes) as pool:
            results = pool.map(run_one, tasks, chunksize=1)
    else:
        results = [run_one(t) for t in tasks]
    wall = time.time() - t0
    pooled: dict[str, dict[str, list[dict[str, Any]]]] = {}
    cpu: dict[str, float] = {}
    for res in results:
        by = pooled.setdefault(res["policy"], {k: [] for k in KINDS})
        for row in res["jobs"]:
            by[row["kind"]].append(row)
        cpu[res["policy"]] = cpu.get(res["policy"], 0.0) + res["cpu_s"]
    table = {p: {k: summarise(pooled[p][k]) for k in KINDS} for p in names}
    head = (
        f"{'policy':<12} {'kind':<9} {'jobs':>5} {'compl':>6} {'JCT med':>8} {'JCT mean':>9} "
        f"{'/orc':>5} {'scal/job':>8} {'oom/job':>7} {'prof':>5}"
    )
    print(f"{a.jobs} jobs x seeds {a.seeds}, all-reduce share {a.share}")
    print(head)
    print("-" * len(head))
    for p in names:
        for k in KINDS:
            m = table[p][k]
            orc = m["per_core_vs_oracle_median"]
            print(
                f"{p:<12} {k:<9} {m['jobs']:5d} {m['completion_rate']:6.1%} "
                f"{m['jct_median_min']:7.0f}m {m['jct_mean_min']:8.0f}m "
                f"{(orc if orc is not None else float('nan')):5.2f} "
                f"{m['scaling_ops_per_job']:8.2f} {m['oom_per_job']:7.2f} "
                f"{m['profiled_min_per_job']:4.1f}m"
            )
    print(f"wall {wall:.0f} s; CPU s per policy: " + ", ".join(f"{p} {cpu[p]:.0f}" for p in names))
    if a.json:
        out = {
            "jobs": a.jobs,
            "seeds": seeds,
            "allreduce_share": a.share,
            "policies": table,
            "cpu_s": {p: round(cpu[p], 1) for p in names},
            "wall_s": round(wall, 1),
        }
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
