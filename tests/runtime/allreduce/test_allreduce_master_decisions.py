"""The all-reduce strategy's decisions, without processes: what its ``replan`` and exit
handling ask the job master for (through the strategy protocol), given observations, samples
and exits (the IO around them is covered by test_allreduce_controller.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlrover_core.faults import classify_exit
from dlrover_core.runtime.backends.base import NodeExit
from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.runtime.nodes import Node
from dlrover_core.runtime.state import MasterState
from dlrover_core.runtime.strategies.allreduce.strategy import AllReduceStrategy, _Group
from dlrover_core.spec import load_spec
from dlrover_core.types import (
    NodeObservation,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
    RolePlan,
    Sample,
    Stage,
)
from tests.factories import make_spec_dict

NO_PS = RolePlan(0, NodeResources(0, 0))
RES = NodeResources(1000, 2048)


def spec(**extra: Any) -> Any:
    return load_spec(
        make_spec_dict(
            name="ar-decide",
            strategy="allreduce",
            data__rows=50_000_000,
            quota={"cpu": 8, "memory": "32Gi"},
            constraints={"workers": {"min": 1, "max": 4}},
            pacing__hot_window=2,
            **extra,
        )
    )


def strategy(m: JobMaster) -> AllReduceStrategy:
    assert isinstance(m.strategy, AllReduceStrategy)
    return m.strategy


def master(tmp_path: Path, ranks: int = 1) -> tuple[JobMaster, list[ResourcePlan]]:
    m = JobMaster(spec(), tmp_path / "run", LocalBackend())
    m.plan = ResourcePlan(RolePlan(ranks, RES), NO_PS, Stage.SCALING, ("now",))
    m.state = MasterState(tmp_path / "run", total_rows=1000, shard_size=100)
    applied: list[ResourcePlan] = []
    m.apply = applied.append  # type: ignore[method-assign]
    return m, applied


def obs(ranks: int, cpu_used: list[int], sps: float = 10_000.0) -> Observation:
    nodes = tuple(
        NodeObservation(Role.WORKER, i, NodeState.RUNNING, RES, cpu_used_millicores=c)
        for i, c in zip(range(ranks), cpu_used, strict=True)
    )
    return Observation(0.0, nodes, sps, samples_done=1_000_000, samples_total=50_000_000)


def test_stage2_grows_a_long_job_on_the_fitted_model(tmp_path: Path) -> None:
    """Samples of 1..4 ranks that scale well: a long job at 1 rank grows."""
    m, applied = master(tmp_path)
    m.samples = [
        Sample(w, 0, c, 0.0, 9000.0 * w * c**0.5 / (1 + 0.05 * w), batch_size=512)
        for w in (1, 2, 3, 4)
        for c in (1.0, 2.0)
    ]
    m.observations = [obs(1, [900])]
    m.replan()
    assert applied, "stage 2 kept 1 rank for a job of 50M rows that scales"
    assert applied[0].workers.count > 1 and applied[0].ps.count == 0


def test_no_model_no_resize(tmp_path: Path) -> None:
    """One configuration measured: nothing to fit, nothing to decide."""
    m, applied = master(tmp_path)
    m.samples = [Sample(1, 0, 1.0, 0.0, 9000.0, batch_size=512)] * 3
    m.observations = [obs(1, [900])]
    m.replan()
    assert applied == []


def test_a_straggler_is_replaced_by_a_group_of_the_same_size(tmp_path: Path) -> None:
    """Rank 1 busy while the others wait in the collectives: a relaunch of the same size."""
    m, applied = master(tmp_path, ranks=3)
    m.observations = [obs(3, [300, 980, 320]) for _ in range(3)]
    m.replan()
    assert len(applied) == 1
    p = applied[0]
    assert p.workers.count == 3
    assert any(o.action == "relaunch" for o in p.overrides), p


def test_replan_waits_for_its_interval_and_for_a_resize(tmp_path: Path) -> None:
    m, applied = master(tmp_path, ranks=3)
    m.observations = [obs(3, [300, 980, 320]) for _ in range(3)]
    m.replan()
    m.replan()  # within pacing.replan_interval_s: no second decision
    assert len(applied) == 1
    strategy(m)._next_replan_mono = 0.0
    strategy(m)._resize = object()  # type: ignore[assignment]  # a resize in progress
    m.replan()
    assert len(applied) == 1


@pytest.mark.parametrize(
    ("code", "sig", "reason", "relaunch"),
    [(-9, 9, None, True), (3, None, None, True), (137, None, "OOMKilled", True)],
)
def test_a_failed_rank_aborts_its_group_and_relaunches_one(
    tmp_path: Path, code: int, sig: int | None, reason: str | None, relaunch: bool
) -> None:
    m = JobMaster(spec(), tmp_path / "run", LocalBackend())
    ar = strategy(m)
    m.plan = ResourcePlan(RolePlan(2, RES), NO_PS, Stage.SCALING, ("now",))
    m.state = MasterState(tmp_path / "run", total_rows=1000, shard_size=100)
    launched: list[Any] = []
    ar._launch_group = lambda plan, after: (
        launched.append(plan)
        or _Group(  # type: ignore[method-assign]
            9, plan.workers.count, 10, plan.workers.resources, "", None, "starting"
        )
    )
    g = _Group(1, 2, 0, RES, "h:1", None, "active")
    ar._groups[1] = g
    for i in (0, 1):
        m.nodes[(Role.WORKER, i)] = Node(Role.WORKER, i, RES, generation=1)
    e = NodeExit(Role.WORKER, 1, 0, code, sig, reason, 0.0)
    ar.on_exit(m.nodes[(Role.WORKER, 1)], e, classify_exit(code, reason, sig))
    assert g.state == "aborted"
    assert (Role.WORKER, 0) not in m.nodes  # the rest of the group is stopped
    assert len(launched) == 1 and launched[0].workers.count == 2
    if reason == "OOMKilled":
        assert launched[0].workers.resources.memory_mib > RES.memory_mib
    m.state.close()
