"""Master restarts at random instants: the job master of a real `dlrover-rm train` (planner
acting every few seconds, so PS migrations and worker resizes are in flight) is SIGKILLed at a
random instant and restarted on the same run directory, N times; then it finishes. Checks
exactly once and no orphan process; reports the worst and mean recovery time (restart to the
first shard done after it).

    python benchmarks/master_restarts.py --restarts 20 --seed 7 \
        --json benchmarks/results/master_restarts.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.runtime import faultkit as fk  # noqa: E402
from tests.runtime.test_fault_matrix import master_restarts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--restarts", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rows", type=int, default=1_500_000, help="long enough for every restart")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        run = Path(tmp) / "run"
        try:
            got = master_restarts(Path(tmp), run, args.restarts, args.seed, args.rows)
            report = fk.report(run)
        finally:
            fk.kill_all(run)
        got["wall_s"] = time.monotonic() - t0
        got["ps_generations"] = float(len(fk.state(run).get("generations", [])))
        got["plans"] = float(len(report["plans"]))
        got["master_starts"] = float(report["master_starts"])
        got["shards_replayed"] = float(report["shards_replayed"])
    print("| restarts | master starts | PS generations | plans | worst recovery | mean recovery |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {got['restarts']:.0f} | {got['master_starts']:.0f} | {got['ps_generations']:.0f} | "
        f"{got['plans']:.0f} | {got['worst_recovery_s']:.1f} s | {got['mean_recovery_s']:.1f} s |"
    )
    print("exactly once: yes (0 twice, 0 lost); no process left")
    if args.json:
        Path(args.json).write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
