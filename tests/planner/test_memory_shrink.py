"""Memory right-sizing (``memory_shrink_below``): with no other move, memory a settled
configuration measurably does not need is given back when the saving pays for the pause."""

from __future__ import annotations

import dataclasses
from typing import Any

from dlrover_core.planner import Planner, PlannerConfig
from dlrover_core.planner.planner import MEMORY_ACTION
from dlrover_core.types import Observation, ResourcePlan, Role, Stage
from tests.factories import make_obs, make_plan, make_spec
from tests.planner.test_planner import truth_at

# counts and CPU pinned: memory is the only thing the planner may change
PINNED = {
    "quota": {"cpu": 64, "memory": "256Gi"},
    "constraints__workers": {"count": 2, "cpu": 1},
    "constraints__ps": {"count": 1, "cpu": 2},
}
CURRENT = make_plan((2, 1000, 8192), (1, 2000, 8192), created_at_s=0.0)


def _decide(
    plan: ResourcePlan = CURRENT,
    *,
    worker_used_mib: int = 800,
    ps_mem_util: float = 0.8,
    samples_total: int = 2_000_000_000,
    now_s: float = 600.0,
    **spec: Any,
) -> Any:
    s = make_spec(**{**PINNED, **spec})
    w_mem = plan.workers.resources.memory_mib

    def used(o: Observation) -> Observation:  # the workers use worker_used_mib each
        nodes = tuple(
            dataclasses.replace(n, memory_used_mib=worker_used_mib) if n.role is Role.WORKER else n
            for n in o.nodes
        )
        return dataclasses.replace(o, nodes=nodes)

    obs = [
        used(
            make_obs(
                t,
                ps_util=[0.5],
                ps_mem_util=[ps_mem_util],
                ps_cpu=2000,
                ps_mem=plan.ps.resources.memory_mib,
                worker_cpu=1000,
                worker_mem=w_mem,
                worker_speeds=[100, 100],
                samples_done=int(t * 200),
                samples_total=samples_total,
            )
        )
        for t in (now_s - 20, now_s - 10, now_s)
    ]
    return Planner(s, PlannerConfig.from_spec(s)).replan(plan, obs, truth_at(plan), now_s)


def test_unused_worker_memory_is_given_back_once() -> None:
    d = _decide()
    assert d.plan is not None and d.plan.action == MEMORY_ACTION, d.notes
    assert d.plan.stage is Stage.SCALING
    # max used × 1.5 (DLRover's margin); counts and CPU unchanged; the PS (80 % used) kept
    assert d.plan.workers.resources.memory_mib == 1200
    assert (d.plan.workers.count, d.plan.workers.resources.cpu_millicores) == (2, 1000)
    assert d.plan.ps == CURRENT.ps
    assert d.plan.reasons[0].startswith("memory right-sizing: worker memory 8192 → 1200 MiB")
    # the shrunk plan, measured the same, is not shrunk again (no oscillation)
    again = _decide(d.plan.replace(created_at_s=600.0), now_s=1200.0)
    assert again.plan is None or again.plan.workers == d.plan.workers, again.plan


def test_unused_ps_memory_is_given_back_never_below_what_the_ps_use() -> None:
    d = _decide(worker_used_mib=5000, ps_mem_util=0.2)  # PS use 1638 of 8192 MiB
    assert d.plan is not None and d.plan.action == MEMORY_ACTION, d.notes
    assert d.plan.workers == CURRENT.workers  # 5000 × 1.5 > 0.7 × 8192: kept
    assert 1638 < d.plan.ps.resources.memory_mib < 0.7 * 8192
    assert "PS memory 8192 → " in d.plan.reasons[0]


def test_not_when_the_time_left_does_not_pay_for_the_pause() -> None:
    # ~2 s left at 200 samples/s: a 30 s restart for a cheaper minute never pays
    d = _decide(samples_total=120_400)
    assert d.plan is None


def test_not_when_most_of_the_memory_is_used_or_the_rule_is_off() -> None:
    assert _decide(worker_used_mib=4500).plan is None  # × 1.5 = 6750: over 0.7 × 8192
    assert _decide(planner={"memory_shrink_below": 0}).plan is None


def test_not_over_a_pin_nor_before_the_configuration_settled() -> None:
    pinned = {**PINNED["constraints__workers"], "memory": "8Gi"}
    d = _decide(constraints__workers=pinned)
    assert d.plan is None or d.plan.workers.resources.memory_mib == 8192
    # a plan 5 s old has not had its re-plan interval: no decision on its memory yet
    assert _decide(CURRENT.replace(created_at_s=595.0)).plan is None
