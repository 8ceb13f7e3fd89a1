"""Pending nodes: wait, shrink by half to the floors, then wait or give up."""

from __future__ import annotations

import pytest

from dlrover_core.errors import InputError
from dlrover_core.faults import PendingAction, PendingPolicy, pending_action
from dlrover_core.types import NodeResources

GIB = 1024
W, R, G = PendingAction.WAIT, PendingAction.RELAUNCH, PendingAction.GIVE_UP


@pytest.mark.parametrize(
    ("cores", "mem_gib", "waited_s", "action", "new_cores", "new_mem_gib"),
    [
        (16, 32, 899.0, W, 16, 32),  # before the timeout
        (16, 32, 900.0, R, 8, 16),  # halved
        (32, 64, 1000.0, R, 16, 32),
        (6, 8, 900.0, R, 4, 6),  # halves clamp to the floors: 3 -> 4 cores, 4 -> 6 GiB
        (4, 16, 900.0, R, 4, 8),  # CPU at its floor, memory still halves
        (3, 4, 900.0, W, 3, 4),  # below both floors: never raised, cannot shrink
        (4, 6, 3599.0, W, 4, 6),  # at the floors: wait ...
        (4, 6, 3600.0, G, 4, 6),  # ... until give_up_after_s
    ],
)
def test_pending_rule(
    cores: int,
    mem_gib: int,
    waited_s: float,
    action: PendingAction,
    new_cores: int,
    new_mem_gib: int,
) -> None:
    d = pending_action(100.0, 100.0 + waited_s, NodeResources(cores * 1000, mem_gib * GIB))
    assert d.action is action
    assert d.resources == NodeResources(new_cores * 1000, new_mem_gib * GIB)
    assert d.waited_s == waited_s


def test_never_give_up_when_disabled() -> None:
    policy = PendingPolicy(give_up_after_s=None)
    d = pending_action(0.0, 1e9, NodeResources(4000, 6 * GIB), policy)
    assert d.action is W
    assert "cannot shrink" in d.reason


def test_clock_skew_counts_as_no_wait() -> None:
    d = pending_action(1000.0, 0.0, NodeResources(16000, 32 * GIB))
    assert (d.action, d.waited_s) == (W, 0.0)


def test_policy_validation() -> None:
    with pytest.raises(InputError) as err:
        PendingPolicy(shrink_factor=1.5, timeout_s=900.0, give_up_after_s=10.0)
    assert len(err.value.problems) == 2
    with pytest.raises(InputError, match="finite"):
        pending_action(float("nan"), 0.0, NodeResources(1, 1))
