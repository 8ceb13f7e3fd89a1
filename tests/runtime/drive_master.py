"""A job master run in its own process with a scripted event, for the fault matrix.

    python tests/runtime/drive_master.py RUN_DIR SCENARIO [--set path=value ...]

Scenarios (the master is real; only the moment of the fault is scripted):

- ``migrate:<point>``: at 30 % of the samples, the plan asks for 2 PS (a PS-set change);
  the master SIGKILLs itself at ``point``: ``after_freeze`` (old set frozen and checkpointed,
  no new generation recorded), ``after_generation`` (generation recorded, no PS launched),
  ``after_launch`` (new PS launched, not yet active), ``never`` (it lives on), or a number of
  seconds after the change started.
- ``raise``: at 30 % an exception escapes the control loop.
- ``stop_new_worker``: worker 0's first incarnation is SIGSTOPped as soon as it is launched
  (it never registers).
- ``kill_ps_at_end``: every shard is done and the master evaluates: PS 0 is SIGKILLed just
  before (the evaluation finds it gone).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.spec import load_spec
from dlrover_core.types import NodeResources, ResourcePlan, Role, RolePlan, Stage

ROOT = Path(__file__).resolve().parents[2]


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    run_dir, scenario, *rest = sys.argv[1:]
    sets = [a for a in rest if a != "--set"]
    spec = load_spec(ROOT / "pipelines" / "specs" / "small.yaml", sets)
    plan = ResourcePlan(
        RolePlan(1, NodeResources(1000, 1536)),
        RolePlan(1, NodeResources(500, 1536)),
        Stage.COLD_START,
        ("fault matrix plan",),
    )
    backend = LocalBackend()
    fired = False
    point = scenario.split(":", 1)[1] if ":" in scenario else ""

    if scenario == "stop_new_worker":
        real_launch = backend.launch

        def launch(ns):  # type: ignore[no-untyped-def]
            h = real_launch(ns)
            if ns.role is Role.WORKER and ns.node_id == 0 and ns.incarnation == 0:
                os.killpg(int(h.ref), signal.SIGSTOP)
            return h

        backend.launch = launch  # type: ignore[method-assign]

    def on_tick(m: JobMaster) -> None:
        nonlocal fired
        assert m.state is not None and m.plan is not None
        q = m.state.shards
        if fired or q.samples_done < 0.3 * q.samples_total:
            return
        fired = True
        if scenario == "raise":
            raise RuntimeError("scripted failure inside the control loop")
        if scenario.startswith("migrate"):
            psset = m.strategy.psset  # type: ignore[attr-defined]
            if point == "after_freeze":
                psset.start_generation = lambda *a, **k: die()
            elif point == "after_generation":
                psset.launch_generation = lambda *a, **k: die()
            elif point == "after_launch":
                real = psset.launch_generation

                def launch_then_die(*a, **k):  # type: ignore[no-untyped-def]
                    real(*a, **k)
                    die()

                psset.launch_generation = launch_then_die
            elif point not in ("", "never"):
                threading.Timer(float(point), die).start()
            m.apply(m.plan.replace(ps=RolePlan(2, m.plan.ps.resources), reasons=("test: 2 PS",)))

    m = JobMaster(spec, run_dir, backend, plan=plan, on_tick=on_tick, replan=False, tick_s=0.1)
    if scenario == "kill_ps_at_end":
        real_evaluate = m.strategy.evaluate
        killed: list[int] = []

        def kill_then_evaluate(*a, **k):  # type: ignore[no-untyped-def]
            n = m.nodes.get((Role.PS, 0))
            if not killed and n is not None and n.handle is not None:
                killed.append(int(n.handle.ref))
                os.kill(int(n.handle.ref), signal.SIGKILL)
                time.sleep(0.3)  # gone before the evaluation reaches it
            return real_evaluate(*a, **k)

        m.strategy.evaluate = kill_then_evaluate  # type: ignore[method-assign]
    r = m.run()
    print(r.get("state"), r.get("failure"), flush=True)
    return 0 if r.get("state") == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
