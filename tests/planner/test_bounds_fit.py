"""``JobBounds.fit`` shrinks a too-large plan into the quota: the closed-form count equals
removing one node at a time until the plan fits (what it did before, and still the contract)."""

from __future__ import annotations

import random

import pytest

from dlrover_core.planner.bounds import JobBounds, RoleBounds, _most_that_fit
from dlrover_core.types import NodeResources, RolePlan


def _one_at_a_time(rp: RolePlan, other: NodeResources, quota: NodeResources, lo: int) -> int:
    n = rp.count
    while not (RolePlan(n, rp.resources).total + other).fits_in(quota) and n > lo:
        n -= 1
    return n


def test_closed_form_count_equals_removing_one_at_a_time() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        per = NodeResources(rng.choice([0, 250, 500, 1000, 3000]), rng.choice([0, 512, 4096]))
        rp = RolePlan(rng.randint(0, 200), per)
        other = NodeResources(rng.randint(0, 50_000), rng.randint(0, 200_000))
        quota = NodeResources(rng.randint(0, 100_000), rng.randint(0, 400_000))
        lo = rng.randint(0, 10)
        assert _most_that_fit(rp, other, quota, lo) == _one_at_a_time(rp, other, quota, lo), (
            rp,
            other,
            quota,
            lo,
        )


@pytest.mark.parametrize(
    ("workers", "ps", "want_workers", "want_ps"),
    [
        (100, 4, 36, 4),  # 36 × 2 + 4 × 2 = 80 cores ≤ 80
        (10, 4, 10, 4),  # fits as asked
    ],
)
def test_fit_shrinks_workers_then_ps(
    workers: int, ps: int, want_workers: int, want_ps: int
) -> None:
    role = RoleBounds(1, 500, None, None, None, 64_000, 256_000)
    bounds = JobBounds(role, role, NodeResources(80_000, 10_000_000))
    node = NodeResources(2000, 4096)
    w, p, _ = bounds.fit(RolePlan(workers, node), RolePlan(ps, node))
    assert (w.count, p.count) == (want_workers, want_ps)
    assert (w.total + p.total).fits_in(bounds.quota)


def test_only_the_dimension_over_the_quota_shrinks() -> None:
    """The PS alone need more CPU than the quota (a recurring job's warm start: 8 PS × 16
    CPU in 112 CPU): CPU shrinks, memory per node stays what the nodes were measured to use
    (shrinking it too would OOM every worker at start); memory over the quota shrinks too."""
    role = RoleBounds(1, 500, None, None, None, 64_000, 256_000)
    bounds = JobBounds(role, role, NodeResources(112_000, 160 * 1024))
    w, p, notes = bounds.fit(
        RolePlan(16, NodeResources(12_000, 6592)), RolePlan(8, NodeResources(16_000, 2519))
    )
    assert (w.total + p.total).fits_in(bounds.quota) and any("shrunk" in n for n in notes)
    assert w.resources.memory_mib == 6592 and p.resources.memory_mib == 2519
    assert p.resources.cpu_millicores < 16_000
    tight = JobBounds(role, role, NodeResources(112_000, 16 * 1024))
    w, p, _ = tight.fit(
        RolePlan(16, NodeResources(12_000, 6592)), RolePlan(8, NodeResources(16_000, 2519))
    )
    assert (w.total + p.total).fits_in(tight.quota)
    assert p.resources.memory_mib < 2519  # memory over the quota: memory shrinks as well
