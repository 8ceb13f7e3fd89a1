"""Decision-identity and CPU checks for simulator speed work (issue 10).

    PYTHONPATH=$PWD python notes/issue-10-check.py POLICY JOBS SEED OUT.json
        one policy through ``run_policy``: prints its CPU s, writes metrics + per-job outcomes
    PYTHONPATH=$PWD python notes/issue-10-check.py all JOBS SEED OUT.json [P1,P2,...]
        ``simulate`` (two processes) with per-job outcomes: prints each policy's CPU s

Compare two trees' OUT files with ``cmp``: byte-equal means the same decisions and outcomes.
Run the old tree (e.g. ``git archive <commit> dlrover_core | tar -x -C /tmp/base``, then
``PYTHONPATH=/tmp/base``) at the same time as the new one, so both see the same load.
"""

from __future__ import annotations

import json
import sys

from dlrover_core.sim.runner import run_policy, simulate
from dlrover_core.sim.trace import generate_trace


def main(argv: list[str]) -> None:
    pol, n, seed, out = argv[1], int(argv[2]), int(argv[3]), argv[4]
    if pol == "all":
        names = argv[5].split(",") if len(argv) > 5 else None
        r = simulate(n, seed, names, keep_jobs=True, keep_timing=True)
        cpu = {k: round(v.pop("cpu_s"), 2) for k, v in r["policies"].items()}
        print(cpu, "sum", round(sum(cpu.values()), 1))
    else:
        jobs = generate_trace(n, seed)
        for j in jobs:
            j.truth.oracle_config(j.quota.cpu_cores, j.quota.memory_mib)
        r = run_policy(jobs, pol, seed)
        print(pol, n, seed, f"cpu_s {r.pop('cpu_s'):.2f}")
    with open(out, "w") as f:
        json.dump(r, f, indent=0, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv)
