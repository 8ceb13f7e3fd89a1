"""Resizes driven by the job master itself: small-allreduce through the job master holding
the all-reduce strategy,
with a resize 1 -> 2 -> 1 ranks, against the same job at 1 rank without resizes, same run.

    python benchmarks/allreduce_controller.py [--rows 600000] [--json OUT]

The resizes are the master's own (``JobMaster.apply``: a pre-warmed group of the new size, the old
group asked to stop once the new ranks are warm, the new one loads the final checkpoint
resharded); downtime = the old group asked to stop -> the new group's first step, as the
master measures it (``report.json: resize_downtimes_s``; the planner's resize cost).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.logs import quiet_third_party
from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.spec import load_spec
from dlrover_core.types import NodeResources, ResourcePlan, RolePlan, Stage

SPEC = Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small-allreduce.yaml"


def plan(ranks: int) -> ResourcePlan:
    return ResourcePlan(
        RolePlan(ranks, NodeResources(1000, 1536)),
        RolePlan(0, NodeResources(0, 0)),
        Stage.SCALING,
        (f"benchmark: {ranks} rank(s)",),
    )


def run(rows: int, resize: bool) -> dict[str, Any]:
    spec = load_spec(
        SPEC,
        [
            f"data.rows={rows}",
            "allreduce.checkpoint_interval_s=2",
            "pacing.heartbeat_interval_s=0.2",
        ],
    )
    steps = [(0.1, 2), (0.4, 1)] if resize else []

    def on_tick(m: JobMaster) -> None:
        assert m.state is not None
        if not steps or m.changing():
            return
        at, size = steps[0]
        if m.state.shards.samples_done >= at * rows:
            steps.pop(0)
            m.apply(plan(size))

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        m = JobMaster(  # the spec says allreduce: it holds that strategy
            spec, Path(tmp) / "run", LocalBackend(), plan=plan(1), on_tick=on_tick, replan=False
        )
        r = m.run()
        wall = time.monotonic() - t0
    return {
        "state": r["state"],
        "wall_s": wall,
        "auc": r.get("auc"),
        "resize_downtimes_s": r.get("resize_downtimes_s", []),
        "shards_done": r["shards_done"],
        "shards_total": r["shards_total"],
        "completed_twice": r["shards_completed_twice"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=600_000)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    quiet_third_party()
    out: dict[str, Any] = {"rows": a.rows, "load_before": list(os.getloadavg())}
    out["no_resize"] = run(a.rows, False)
    out["resize_1_2_1"] = run(a.rows, True)
    out["load_after"] = list(os.getloadavg())
    for k in ("no_resize", "resize_1_2_1"):
        r = out[k]
        downs = ", ".join(f"{d:.1f}" for d in r["resize_downtimes_s"]) or "-"
        print(
            f"{k:13s}: {r['state']}, {r['wall_s']:.1f} s, AUC {r['auc']:.4f}, shards "
            f"{r['shards_done']}/{r['shards_total']} (twice {r['completed_twice']}), "
            f"resize downtime s: {downs}"
        )
    print(f"load average before/after: {out['load_before']} / {out['load_after']}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
