"""Dump every policy's ``run_policy`` metrics and per-job outcomes, for decision-identity
checks of simulator speed work (issue 10), and print each policy's CPU seconds.

    PYTHONPATH=$PWD python benchmarks/sim_identity.py OUT.json [--jobs 300] [--seeds 0,101]
        [--policies manual,vpa,...]

Two trees' OUT files byte-equal (``cmp``) means the same decisions and outcomes.
"""

from __future__ import annotations

import argparse
import json
import time

from dlrover_core.sim.runner import available_policies, run_policy
from dlrover_core.sim.trace import generate_trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--seeds", default="0,101")
    ap.add_argument("--policies", default="")
    a = ap.parse_args()
    names = a.policies.split(",") if a.policies else available_policies()
    out: dict[str, dict[str, object]] = {}
    cpu: dict[str, float] = {}
    for seed in (int(s) for s in a.seeds.split(",")):
        for name in names:
            jobs = generate_trace(a.jobs, seed)
            for j in jobs:  # the oracle search (deterministic, cached) is not timed
                j.truth.oracle_config(j.quota.cpu_cores, j.quota.memory_mib)
            t0 = time.process_time()
            r = run_policy(jobs, name, seed)
            r.pop("cpu_s")
            cpu[f"{name}@{seed}"] = round(time.process_time() - t0, 2)
            out[f"{name}@{seed}"] = r
            print(f"{name}@{seed} cpu_s {cpu[f'{name}@{seed}']}", flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=0, sort_keys=True)
    print("total cpu_s", round(sum(cpu.values()), 1))


if __name__ == "__main__":
    main()
