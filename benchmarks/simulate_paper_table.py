"""Reproduce the paper's comparison on the simulated cluster.

    python benchmarks/simulate_paper_table.py [--jobs N] [--seed S] [--policies a,b] [--json OUT]

Prints the paper-style table (one row per policy, changes vs manual) and, for each policy, the
paper's claims vs manual (JCT -31%, completion +6 points, CPU util +15 points, memory util
+20 points) next to the measured figures; writes the result JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, too

from dlrover_core.sim.runner import (
    PAPER_CLAIMS,
    available_policies,
    format_table,
    simulate,
    unavailable_policies,
    vs_manual,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default="", help="comma-separated; default: all registered")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    args = ap.parse_args(argv)
    names = [p for p in args.policies.split(",") if p] or available_policies()
    for name, why in unavailable_policies().items():
        print(f"note: policy {name} skipped: {why}", file=sys.stderr)
    t0 = time.perf_counter()
    result = simulate(args.jobs, args.seed, names, processes=args.processes)
    elapsed = time.perf_counter() - t0
    print(format_table(result))
    print(f"\n(simulated in {elapsed:.1f} s)\n")
    print(f"{'vs manual':<12} {'JCT':>14} {'completion':>16} {'CPU util':>16} {'mem util':>16}")
    print(
        f"{'paper':<12} {PAPER_CLAIMS['jct_change'] * 100:13.0f}% "
        f"{PAPER_CLAIMS['completion_points'] * 100:+14.1f}p "
        f"{PAPER_CLAIMS['cpu_points'] * 100:+14.1f}p {PAPER_CLAIMS['mem_points'] * 100:+14.1f}p"
    )
    for name in result["policies"]:
        d = vs_manual(result, name)
        if d is None or name == "manual":
            continue
        print(
            f"{name:<12} {d['jct_change'] * 100:+13.0f}% {d['completion_points'] * 100:+14.1f}p "
            f"{d['cpu_points'] * 100:+14.1f}p {d['mem_points'] * 100:+14.1f}p"
        )
    result["elapsed_s"] = elapsed
    result["unavailable"] = unavailable_policies()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
