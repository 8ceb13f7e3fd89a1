"""What a scaling operation costs the job in the local-process runtime (issue 10: "a scaling
operation pauses the job (30–120 s in the simulator; measure it in the runtime)").

    python benchmarks/scaling_pause.py [--rows 1500000] [--hold 25] [--json OUT]

One run of pipelines/specs/small.yaml (real processes, gRPC, real training) whose plans
follow a fixed script, one change every ``--hold`` seconds, so that the runtime alone is
measured (the planner decides nothing here):

    1 worker + 1 PS  ->  + 1 worker  ->  + 1 PS (a PS-set change: freeze, checkpoint,
    re-shard into a new generation)  ->  PS CPU x 2 (in place)  ->  - 1 worker

For each change, what the runtime itself measured (``report.json``'s ``plan_changes``, from
the master's timeline of samples done against time):
- ``lost_s``: the time the change cost, as the planner prices it (a pause, then the new
  speed): the time until the next change minus the time the samples done in it would have
  taken at the new configuration's settled speed (its last 40 %);
- ``stall_s``: the longest stretch after the change in which no sample was done;
- for the PS-set change, the master's own ``ps_switch_s`` (freeze to the new set active).

The planner's defaults (``worker_change_pause_s`` 30 s, ``ps_change_pause_s`` 120 s) price a
Kubernetes pod's scheduling, image pull and start, which this machine cannot measure; set
them from what your cluster measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.planner import Planner
from dlrover_core.planner.planner import PlanDecision
from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.spec import JobSpec, load_spec
from dlrover_core.types import (
    NodeResources,
    Observation,
    ResourcePlan,
    RolePlan,
    Sample,
    Stage,
)

SMALL = Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml"
Step = tuple[str, Callable[[ResourcePlan], ResourcePlan]]


def _workers(d: int) -> Callable[[ResourcePlan], ResourcePlan]:
    def f(p: ResourcePlan) -> ResourcePlan:
        return p.replace(workers=RolePlan(p.workers.count + d, p.workers.resources))

    return f


def _ps(count: int = 0, cpu_factor: int = 1) -> Callable[[ResourcePlan], ResourcePlan]:
    def f(p: ResourcePlan) -> ResourcePlan:
        r = p.ps.resources
        res = NodeResources(r.cpu_millicores * cpu_factor, r.memory_mib)
        return p.replace(ps=RolePlan(p.ps.count + count, res))

    return f


STEPS: list[Step] = [
    ("+1 worker", _workers(+1)),
    ("+1 PS (PS-set change)", _ps(count=1)),
    ("PS CPU x 2 (in place)", _ps(cpu_factor=2)),
    ("-1 worker", _workers(-1)),
]


class ScriptedPlanner(Planner):
    """The real planner's interface with a fixed script: the next step once ``hold_s`` passed
    since the last plan, nothing from stage 3 (the benchmark measures the runtime)."""

    def __init__(self, spec: JobSpec, steps: Sequence[Step], hold_s: float) -> None:
        super().__init__(spec)
        self.steps = list(steps)
        self.hold_s = hold_s
        self._since: float | None = None  # when the current plan was adopted

    def replan(
        self,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
        past_plans: Sequence[ResourcePlan] = (),
        prior_samples: Sequence[Sample] = (),
    ) -> PlanDecision:
        done = len(past_plans) - 1
        if self._since is None:
            self._since = now_s
        if done >= len(self.steps) or now_s - self._since < self.hold_s:
            return PlanDecision(None, ("scripted: hold",))
        self._since = now_s
        label, step = self.steps[done]
        new = step(current).replace(
            stage=Stage.SCALING, reasons=(f"benchmark step: {label}",), created_at_s=now_s
        )
        return PlanDecision(new)

    def monitor(
        self,
        current: ResourcePlan,
        observations: Sequence[Observation],
        now_s: float,
        past_plans: Sequence[ResourcePlan] = (),
    ) -> PlanDecision:
        return PlanDecision(None, ("scripted: no stage 3",))


def analyse(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's ``plan_changes`` (what the runtime measured for each change), labelled
    with the script's steps; the PS-set change also with the master's ``ps_switch_s``."""
    switches = list(report.get("ps_switch_s", []))
    out = []
    for plan, cost in zip(report["plans"][1:], report.get("plan_changes", []), strict=False):
        label = plan["reasons"][0].removeprefix("benchmark step: ")
        rec = {"change": label, **cost}
        if "PS-set" in label and switches:
            rec["ps_switch_s"] = switches.pop(0)
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_500_000)
    ap.add_argument("--hold", type=float, default=25.0, help="seconds between changes")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.rows < 1 or not a.hold > 0:
        ap.error(f"--rows must be at least 1 and --hold above 0; got {a.rows} and {a.hold:g}")
    over = [
        f"data.rows={a.rows}",
        "pacing.sample_window_s=1.0",
        "pacing.min_speed_samples=2",
        "pacing.replan_interval_s=1",
        "pacing.heartbeat_interval_s=0.5",
        "quota.cpu=6",
        "quota.memory=12Gi",
        "constraints.workers.max=3",
        "constraints.ps.max=3",
    ]
    spec = load_spec(str(SMALL), over)
    plan = ResourcePlan(
        RolePlan(1, NodeResources(1000, 2048)),
        RolePlan(1, NodeResources(1000, 2048)),
        Stage.COLD_START,
        ("benchmark: 1 worker + 1 PS",),
    )
    with tempfile.TemporaryDirectory(prefix="scaling-pause-") as tmp:
        run = Path(tmp) / "run"
        t0 = time.perf_counter()
        master = JobMaster(
            spec, run, LocalBackend(), plan=plan, planner=ScriptedPlanner(spec, STEPS, a.hold)
        )
        report = master.run()
        wall = time.perf_counter() - t0
    if report["state"] != "succeeded":
        print(f"error: the benchmark job {report['state']}: {report.get('reason')}")
        return 1
    changes = analyse(report)
    print(f"scaling pauses in the local runtime ({a.rows:,} rows, {wall:.0f} s wall)")
    print("| change | speed before / after (samples/s) | lost (s) | longest stall (s) |")
    print("|---|---|---|---|")
    for c in changes:
        lost = "n/a" if c["lost_s"] is None else f"{c['lost_s']:.1f}"
        before, after = (
            "n/a" if c[k] is None else f"{c[k]:,.0f}"
            for k in ("speed_before_sps", "speed_after_sps")
        )
        extra = f" (PS set active after {c['ps_switch_s']:.1f} s)" if "ps_switch_s" in c else ""
        stall = "n/a" if c["stall_s"] is None else f"{c['stall_s']:.1f}"
        print(f"| {c['change']} | {before} / {after} | {lost} | {stall}{extra} |")
    print(
        f"shards lost {report['shards_lost']}, completed twice "
        f"{report['shards_completed_twice']}, samples {report['samples_done']:,} of "
        f"{report['samples_total']:,}"
    )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(
            json.dumps(
                {"rows": a.rows, "hold_s": a.hold, "wall_s": wall, "changes": changes}, indent=2
            )
        )
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
