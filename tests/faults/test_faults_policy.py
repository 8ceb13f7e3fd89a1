"""Relaunch decisions per exit class and role; OOM bumps; PS OOM; VPA's OOM bump."""

from __future__ import annotations

import pytest

from dlrover_core.errors import InputError
from dlrover_core.faults import (
    ExitClass,
    FaultPolicy,
    OomBump,
    PsOomAction,
    RelaunchDecision,
    ps_oom_action,
)
from dlrover_core.types import NodeResources, Role, RolePlan

POLICY = FaultPolicy()


def res(mem_mib: int, cpu_millicores: int = 4000) -> NodeResources:
    return NodeResources(cpu_millicores, mem_mib)


def decide(
    exit_class: ExitClass,
    role: Role = Role.WORKER,
    current: NodeResources | None = None,
    planned: NodeResources | None = None,
    so_far: int = 0,
) -> RelaunchDecision:
    current = current or res(4096)
    return POLICY.decide(role, exit_class, current, planned or current, so_far)


def test_oom_bump_sequence_to_cap_then_give_up() -> None:
    # x2 while under the 8 GiB step, then +8 GiB, capped at 64 GiB; at the cap: give up
    expected = [8192, 16384, 24576, 32768, 40960, 49152, 57344, 65536]
    current = res(4096)
    seen = []
    for _ in expected:
        d = decide(ExitClass.OOM, current=current)
        assert d.relaunch and not d.fail_job and d.exit_class is ExitClass.OOM
        seen.append(d.resources.memory_mib)
        current = d.resources
    assert seen == expected
    worker = decide(ExitClass.OOM, current=current)
    assert (worker.relaunch, worker.fail_job) == (False, False)
    assert worker.resources == current
    ps = decide(ExitClass.OOM, Role.PS, current=current)
    assert (ps.relaunch, ps.fail_job) == (False, True)
    assert "cap" in ps.reason


@pytest.mark.parametrize(
    ("current_mib", "planned_mib", "expected_mib"),
    [
        (2048, 6000, 6000),  # plan > 2 x current, within the step: plan wins
        (2048, 3000, 4096),  # 2 x current > plan
        (4096, 20000, 12288),  # plan beyond current + 8 GiB: the step limits it
        (60000, 60000, 65536),  # +8 GiB would pass the cap: capped
        (70000, 70000, 70000),  # already above the cap: cannot grow
    ],
)
def test_oom_memory(current_mib: int, planned_mib: int, expected_mib: int) -> None:
    assert POLICY.oom_memory_mib(current_mib, planned_mib) == expected_mib


def test_oom_keeps_planned_cpu() -> None:
    d = decide(ExitClass.OOM, current=res(4096, 2000), planned=res(4096, 3000))
    assert d.resources == res(8192, 3000)


@pytest.mark.parametrize(
    ("exit_class", "budget", "avoid_host"),
    [(ExitClass.KILLED, 10, False), (ExitClass.UNKNOWN, 3, False), (ExitClass.HARDWARE, 3, True)],
)
@pytest.mark.parametrize("role", [Role.WORKER, Role.PS])
def test_budgets(exit_class: ExitClass, budget: int, avoid_host: bool, role: Role) -> None:
    planned = res(8192, 8000)
    last = decide(exit_class, role, planned=planned, so_far=budget - 1)
    assert last.relaunch and not last.fail_job
    assert last.resources == planned  # a relaunch follows the current plan
    assert last.avoid_host is avoid_host
    assert f"relaunch {budget} of {budget}" in last.reason
    spent = decide(exit_class, role, planned=planned, so_far=budget)
    assert not spent.relaunch
    assert spent.fail_job is (role is Role.PS)  # a PS is critical; a worker is dropped
    assert "budget" in spent.reason


@pytest.mark.parametrize(
    ("role", "policy", "fail_job"),
    [
        (Role.PS, FaultPolicy(), True),
        (Role.WORKER, FaultPolicy(), True),
        (Role.PS, FaultPolicy(fatal_worker_fails_job=False), True),
        (Role.WORKER, FaultPolicy(fatal_worker_fails_job=False), False),
    ],
)
def test_fatal_never_retried(role: Role, policy: FaultPolicy, fail_job: bool) -> None:
    d = policy.decide(role, ExitClass.FATAL, res(4096), res(4096), 0)
    assert (d.relaunch, d.fail_job) == (False, fail_job)


def test_succeeded_does_nothing() -> None:
    d = decide(ExitClass.SUCCEEDED, Role.PS)
    assert (d.relaunch, d.fail_job) == (False, False)


def test_budget_table() -> None:
    assert [POLICY.budget(c) for c in ExitClass] == [0, None, 10, 0, 3, 3]


def test_negative_relaunch_count_rejected() -> None:
    with pytest.raises(InputError, match="relaunches_so_far=-1"):
        decide(ExitClass.UNKNOWN, so_far=-1)


def test_invalid_policy_lists_every_problem() -> None:
    with pytest.raises(InputError) as err:
        FaultPolicy(oom_factor=0.5, max_relaunches=-1)
    assert len(err.value.problems) == 2


@pytest.mark.parametrize(
    ("used", "action", "imbalance"),
    [
        ([10, 10, 10, 10], PsOomAction.MORE_PS, 0.0),
        ([12, 10, 8, 10], PsOomAction.MORE_PS, 0.2),  # exactly 20%: not above
        ([13, 10, 7, 10], PsOomAction.MORE_MEMORY, 0.3),
        ([30, 10], PsOomAction.MORE_MEMORY, 0.5),
        ([0, 0], PsOomAction.MORE_PS, 0.0),
    ],
)
def test_ps_oom_action(used: list[int], action: PsOomAction, imbalance: float) -> None:
    d = ps_oom_action(used)
    assert d.action is action
    assert d.imbalance == pytest.approx(imbalance)


def test_ps_oom_apply() -> None:
    ps = RolePlan(2, res(8192))
    assert ps_oom_action([13, 10, 7, 10]).apply(ps) == RolePlan(2, res(16384))
    assert ps_oom_action([13, 10, 7, 10]).apply(ps, memory_cap_mib=12288) == RolePlan(2, res(12288))
    assert ps_oom_action([10, 10]).apply(ps) == RolePlan(4, res(8192))


def test_ps_oom_rejects_empty() -> None:
    with pytest.raises(InputError, match="empty"):
        ps_oom_action([])


@pytest.mark.parametrize(
    ("used", "expected"),
    [(0, 100), (100, 200), (500, 600), (1000, 1200), (4096, 4916)],  # 4096*1.2 = 4915.2 -> up
)
def test_vpa_oom_bump(used: int, expected: int) -> None:
    assert OomBump().bump(used) == expected


def test_vpa_oom_bump_validates() -> None:
    with pytest.raises(InputError):
        OomBump(ratio=0.9)
    with pytest.raises(InputError):
        OomBump().bump(-1)
