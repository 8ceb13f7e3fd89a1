"""An all-reduce job master in its own process that SIGKILLs itself at a scripted moment.

    python tests/runtime/allreduce/drive_allreduce_master.py RUN_DIR SPEC_JSON SCENARIO

Scenarios: ``steady`` (at 30 % of the samples), ``resize`` (at 30 % it starts a resize to 2
ranks and dies right after launching the new group), ``never`` (it runs to the end).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.runtime.strategies.allreduce.strategy import AllReduceStrategy
from dlrover_core.spec import load_spec
from dlrover_core.types import NodeResources, ResourcePlan, RolePlan, Stage
from tests.runtime.allreduce.test_allreduce_controller import OPTIONS, PLAN_1


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    run_dir, spec_json, scenario = sys.argv[1:4]
    spec = load_spec(json.loads(Path(spec_json).read_text()))
    fired = False

    def on_tick(m: JobMaster) -> None:
        nonlocal fired
        assert m.state is not None and m.plan is not None
        q = m.state.shards
        if fired or q.samples_done < 0.3 * q.samples_total:
            return
        fired = True
        if scenario == "steady":
            die()
        if scenario == "resize":
            ar = m.strategy
            assert isinstance(ar, AllReduceStrategy)
            real = ar._launch_group

            def launch_then_die(*a, **k):  # type: ignore[no-untyped-def]
                real(*a, **k)
                die()

            ar._launch_group = launch_then_die  # type: ignore[method-assign]
            m.apply(
                ResourcePlan(
                    RolePlan(2, NodeResources(1000, 1536)),
                    PLAN_1.ps,
                    Stage.SCALING,
                    ("test: 2 ranks",),
                )
            )

    m = JobMaster(
        spec,
        run_dir,
        LocalBackend(),
        plan=PLAN_1,
        strategy=AllReduceStrategy.for_run(run_dir, OPTIONS),
        on_tick=on_tick,
        replan=False,
        tick_s=0.1,
    )
    r = m.run()
    print(r.get("state"), r.get("failure"), flush=True)
    return 0 if r.get("state") == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
