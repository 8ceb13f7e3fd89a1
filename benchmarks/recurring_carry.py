"""The model carried forward on a drifting stream (issue 35 item 1).

Each "day" is a Criteo-format TSV file from the synthetic generator: the same planted truth
(the effect of every head id, the dense weights), but new rows, so new ids (1 % of ids a row
are ids never seen before), and a click rate that shifts every day (the planted bias moves by
``--drift`` a day). The last ``--eval-rows`` lines of each file are that day's held-out set.

Day 0 trains a model from scratch. Then for days 1..D:
- **scratch**: a model trained from scratch on the day's ``--rows`` rows;
- **carried**: the day's run started from yesterday's carried model (``training.init_from``),
  on the same rows, and on fractions of them (``--fractions``), to find the fewest rows with
  which the carried model reaches the from-scratch AUC (within ``--tolerance``).

Real local jobs (master, PS, workers). Prints a table and writes JSON:

    .venv/bin/python benchmarks/recurring_carry.py --days 5 \
        --json benchmarks/results/recurring_carry.json

Target: the carried model reaches the from-scratch AUC with at most half the rows.
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

from dlrover_core import api  # noqa: E402
from dlrover_core.spec import load_spec, read_spec_file  # noqa: E402
from dlrover_core.training.data import drifting_day, file_spec, write_criteo_tsv  # noqa: E402

SPECS = {
    "ps": ROOT / "pipelines/specs/small.yaml",
    "allreduce": ROOT / "pipelines/specs/small-allreduce.yaml",
}


def write_day(
    path: Path, spec_path: Path, day: int, rows: int, eval_rows: int, drift: float, seed: int
) -> None:
    b = drifting_day(load_spec(spec_path), day, rows, eval_rows, drift=drift, seed=seed)
    write_criteo_tsv(path, b)


def train(
    spec: Path, run_dir: Path, data: Path, rows: int, eval_rows: int, parent: Path | None
) -> dict[str, Any]:
    d = file_spec(read_spec_file(spec), data, rows, eval_rows)
    over = ["pacing.replan_interval_s=600"]  # the comparison is of models, not of plans
    if parent is not None:
        over.append(f"training.init_from={parent}")
    t0 = time.monotonic()
    r = api.train(d, overrides=over, run_dir=run_dir, history="none", progress=False)
    if r.get("state") != "succeeded":
        raise SystemExit(f"{run_dir}: {r.get('state')}: {r.get('failure')}")
    return {
        "auc": r["auc"],
        "rows": rows,
        "wall_s": round(time.monotonic() - t0, 1),
        "model": r["model_dir"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=int, default=5, help="days after day 0 (default 5)")
    ap.add_argument("--rows", type=int, default=60_000, help="training rows a day (default 60000)")
    ap.add_argument(
        "--eval-rows", type=int, default=10_000, help="held-out rows a day (default 10000)"
    )
    ap.add_argument(
        "--drift", type=float, default=0.15, help="shift of the planted bias a day (default 0.15)"
    )
    ap.add_argument(
        "--fractions", default="0.125,0.25,0.5", help="row fractions the carried run also trains on"
    )
    ap.add_argument(
        "--tolerance",
        type=float,
        default=0.002,
        help="AUC within this counts as reached (default 0.002)",
    )
    ap.add_argument("--strategy", choices=sorted(SPECS), default="ps", help="(default ps)")
    ap.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    if a.days < 1 or a.rows < 2560 or a.eval_rows < 1000:
        ap.error("--days >= 1, --rows >= 2560 and --eval-rows >= 1000")
    fractions = sorted(float(f) for f in a.fractions.split(","))
    spec = SPECS[a.strategy]
    out: dict[str, Any] = {"args": vars(a), "days": []}
    with tempfile.TemporaryDirectory(prefix="dlrover-rm-carry-") as tmp:
        root = Path(tmp)
        files = []
        for d in range(a.days + 1):
            f = root / f"day{d}.tsv"
            write_day(f, spec, d, a.rows, a.eval_rows, a.drift, a.seed)
            files.append(f)
        base = train(spec, root / "d0", files[0], a.rows, a.eval_rows, None)
        parent = Path(base["model"])
        print(f"day 0: from scratch, AUC {base['auc']:.4f}")
        hdr = (
            f"{'day':>3} {'scratch AUC':>11} {'carried AUC':>11} "
            + " ".join(f"{f'{f:g}x rows':>10}" for f in fractions)
            + f" {'rows to reach':>13}"
        )
        print(hdr)
        for d in range(1, a.days + 1):
            scratch = train(spec, root / f"d{d}-scratch", files[d], a.rows, a.eval_rows, None)
            carried = train(spec, root / f"d{d}-carried", files[d], a.rows, a.eval_rows, parent)
            part = {}
            for f in fractions:
                n = max(2560, int(a.rows * f) // 2560 * 2560)
                part[f] = train(spec, root / f"d{d}-c{f:g}", files[d], n, a.eval_rows, parent)
            goal = scratch["auc"] - a.tolerance
            reach = next((part[f]["rows"] for f in fractions if part[f]["auc"] >= goal), None)
            if reach is None and carried["auc"] >= goal:
                reach = a.rows
            row = {
                "day": d,
                "scratch_auc": scratch["auc"],
                "carried_auc": carried["auc"],
                "fractions": {f"{f:g}": part[f]["auc"] for f in fractions},
                "rows_to_reach": reach,
                "rows_to_reach_fraction": None if reach is None else reach / a.rows,
            }
            out["days"].append(row)
            print(
                f"{d:>3} {scratch['auc']:>11.4f} {carried['auc']:>11.4f} "
                + " ".join(f"{part[f]['auc']:>10.4f}" for f in fractions)
                + f" {('-' if reach is None else f'{reach:,} ({reach / a.rows:.2g}x)'):>13}"
            )
            parent = Path(carried["model"])
    reached = [r["rows_to_reach_fraction"] for r in out["days"]]
    ok = all(x is not None and x <= 0.5 for x in reached)
    out["target"] = "the carried model reaches the from-scratch AUC with at most half the rows"
    out["met"] = ok
    print(f"target (<= 0.5x the rows on every day): {'met' if ok else 'MISSED'}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
