"""Mixed faults at random instants: one real `dlrover-rm train` per seed, during which nodes are
SIGKILLed, SIGSTOPped (and left stopped), a PS's newest checkpoint is corrupted before it is
killed, and the master is SIGKILLed and restarted, drawn at random (seeded). Every run must
finish exactly once with no process left; the table gives each seed's faults and its AUC.

    python benchmarks/fault_chaos.py --seeds 1-10 --faults 6 \
        --json benchmarks/results/fault_chaos.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.runtime import faultkit as fk  # noqa: E402
from tests.runtime.test_fault_matrix import mixed_faults  # noqa: E402


def _seeds(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", default="1-10", help="a seed or a range A-B")
    ap.add_argument("--faults", type=int, default=6)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    print("| seed | outcome | faults | master starts | AUC | wall |")
    print("|---|---|---|---|---|---|")
    for seed in _seeds(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            t0 = time.monotonic()
            try:
                got: dict[str, Any] = mixed_faults(Path(tmp), run, args.faults, seed, args.rows)
                got["outcome"] = "exactly once, nothing left"
            except AssertionError as e:  # reported, not hidden: the table shows the failure
                got = {"faults": [], "auc": None, "master_starts": None}
                got["outcome"] = f"FAILED: {str(e).splitlines()[0][:200]}"
            finally:
                fk.kill_all(run)
            got["seed"], got["wall_s"] = seed, time.monotonic() - t0
        rows.append(got)
        auc = f"{got['auc']:.4f}" if got["auc"] is not None else "-"
        kinds = ", ".join(f.split(" ")[0] for f in got["faults"])
        print(
            f"| {seed} | {got['outcome']} | {kinds} | {got['master_starts']} | {auc} | "
            f"{got['wall_s']:.0f} s |",
            flush=True,
        )
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["outcome"].startswith("exactly") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
