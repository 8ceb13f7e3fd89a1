"""Similar-job priors on real local runs: a job whose signature is new starts from the runs of
its nearest similar jobs (planner/similar.py) or, without them, from the cold start. Four
variants of pipelines/specs/small.yaml (base, twice the rows, twice the batch, a wider dense
tower), each a signature of its own, run once into a history; then each variant in turn is
hidden (its runs removed from a copy of the history) and run under a new name twice: with
that history (the similar-job prior) and with none (the cold start). Real processes, this
machine's cores.

    .venv/bin/python benchmarks/similar_priors_real.py [--rows 300000] [--json OUT]

Per hidden variant: the first plan of each run, its completion time, and the speed per
allocated core of the first plan's configuration (its first speed sample) against the best
speed per core measured for that job in either run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core import api
from dlrover_core.logs import quiet_third_party

SPEC = Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml"
PACING = [  # the demo's: the planner acts within a short job
    "pacing.sample_window_s=1.0",
    "pacing.min_speed_samples=2",
    "pacing.replan_interval_s=3",
    "pacing.heartbeat_interval_s=0.5",
]
VARIANTS: dict[str, list[str]] = {
    "base": [],
    "rows2x": ["ROWS2"],
    "batch2x": ["training.batch_size=512"],
    "wide": ["model.dense_arch=[128, 16]"],
}


def overrides(name: str, rows: int, signature: str) -> list[str]:
    out = [f"data.rows={rows}", f"signature.model={signature}", f"name={signature}", *PACING]
    for o in VARIANTS[name]:
        out.append(f"data.rows={2 * rows}" if o == "ROWS2" else o)
    return out


def per_core(report: dict[str, Any]) -> list[float]:
    """Speed per allocated core of each speed sample, in order."""
    out = []
    for s in report.get("samples") or []:
        cores = s["workers"] * s["worker_cpu_cores"] + s["ps"] * s["ps_cpu_cores"]
        if cores > 0 and s["throughput_sps"] > 0:
            out.append(s["throughput_sps"] / cores)
    return out


def first_plan(report: dict[str, Any]) -> dict[str, Any]:
    p = report["plans"][0]
    return {"stage": p["stage"], "workers": p["workers"], "ps": p["ps"]}


def run(spec_over: list[str], run_dir: Path, history: str) -> dict[str, Any]:
    t0 = time.monotonic()
    r = api.train(str(SPEC), overrides=spec_over, run_dir=run_dir, history=history,
                  progress=False)  # fmt: skip
    return {
        "state": r["state"],
        "wall_s": time.monotonic() - t0,
        "first_plan": first_plan(r),
        "plans": len(r["plans"]),
        "per_core": per_core(r),
        "throughput_sps": r["throughput_sps"],
        "reasons": r["plans"][0]["reasons"][:1],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    quiet_third_party()
    out: dict[str, Any] = {"rows": a.rows, "load_before": list(os.getloadavg()), "hidden": {}}
    with tempfile.TemporaryDirectory(prefix="similar-real-") as tmp:
        root = Path(tmp)
        full = root / "all.db"
        for name in VARIANTS:  # the history: one run of each variant, its own signature
            r = run(overrides(name, a.rows, f"dlrm-{name}"), root / f"hist-{name}",
                    f"sqlite:///{full}")  # fmt: skip
            print(f"history run {name}: {r['state']} in {r['wall_s']:.1f} s", flush=True)
        for name in VARIANTS:
            db = root / f"without-{name}.db"
            shutil.copy(full, db)
            with sqlite3.connect(db) as c:
                c.execute("DELETE FROM dlrover_runs WHERE signature LIKE ?", (f"%/dlrm-{name}/%",))
            new = f"dlrm-{name}-new"
            res = {
                "similar": run(overrides(name, a.rows, new), root / f"sim-{name}",
                               f"sqlite:///{db}"),
                "cold": run(overrides(name, a.rows, new), root / f"cold-{name}", "none"),
            }  # fmt: skip
            best = max([*res["similar"]["per_core"], *res["cold"]["per_core"]], default=0.0)
            for k in ("similar", "cold"):
                pc = res[k]["per_core"]
                res[k]["first_per_core_vs_best"] = pc[0] / best if pc and best else None
            res["jct_similar_over_cold"] = res["similar"]["wall_s"] / res["cold"]["wall_s"]
            out["hidden"][name] = res
            s, c = res["similar"], res["cold"]
            print(
                f"{name:8s} similar: {s['first_plan']['stage']:16s} "
                f"{s['wall_s']:5.1f} s, first/best per core "
                f"{s['first_per_core_vs_best'] or float('nan'):.2f} | cold: "
                f"{c['first_plan']['stage']:10s} {c['wall_s']:5.1f} s, "
                f"{c['first_per_core_vs_best'] or float('nan'):.2f} | JCT ratio "
                f"{res['jct_similar_over_cold']:.2f}",
                flush=True,
            )
    out["load_after"] = list(os.getloadavg())
    ratios = [h["jct_similar_over_cold"] for h in out["hidden"].values()]
    out["jct_ratio_mean"] = sum(ratios) / len(ratios)
    print(f"JCT similar / cold, mean over the hidden variants: {out['jct_ratio_mean']:.2f}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
