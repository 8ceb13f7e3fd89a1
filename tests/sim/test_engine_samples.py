"""A policy that reads no speed samples gets none built, and the same results."""

from __future__ import annotations

from typing import Any

import pytest

from dlrover_core.sim.engine import Engine, cluster_capacity
from dlrover_core.sim.policies import AutopilotPolicy, VpaPolicy
from dlrover_core.sim.trace import generate_trace


def _outcomes(policy: Any, n: int = 25, seed: int = 3) -> tuple[list[tuple[Any, ...]], Engine]:
    jobs = generate_trace(n, seed)
    eng = Engine(jobs, policy, cluster_capacity(jobs), seed)
    eng.run()
    rows = [
        (r.job.name, r.status, r.start_s, r.end_s, r.done, r.scaling_ops, r.cpu_used_cs)
        for r in eng.runs
    ]
    return rows, eng


@pytest.mark.parametrize("cls", [VpaPolicy, AutopilotPolicy])
def test_skipping_samples_changes_nothing_but_the_samples(cls: type[Any]) -> None:
    assert cls.uses_samples is False
    built = type("Built", (cls,), {"uses_samples": True})
    skipped_rows, skipped = _outcomes(cls())
    built_rows, full = _outcomes(built())
    assert skipped_rows == built_rows  # same random streams, same decisions
    assert any(r.samples for r in full.runs)
    assert not any(r.samples for r in skipped.runs)
