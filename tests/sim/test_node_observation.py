"""The engine builds running nodes' observations without the frozen dataclass's constructor
(speed): the result must be the same value as ``NodeObservation(...)``, field for field."""

from __future__ import annotations

import dataclasses

from dlrover_core.sim.engine import _node_observation
from dlrover_core.types import NodeObservation, NodeResources, NodeState, Role


def test_fast_node_observation_is_the_dataclass_value() -> None:
    args = (Role.WORKER, 7, NodeState.RUNNING, NodeResources(1500, 3072), 900, 2100, 12.5, 33.25)
    fast, slow = _node_observation(*args), NodeObservation(*args)
    assert type(fast) is NodeObservation
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    # every field is set (a field added to NodeObservation must be added here too)
    assert [getattr(fast, f.name) for f in dataclasses.fields(NodeObservation)] == list(args)
    assert fast.cpu_util == slow.cpu_util and fast.memory_util == slow.memory_util
    # still frozen
    try:
        fast.node_id = 8  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:  # pragma: no cover
        raise AssertionError("a fast-built NodeObservation must stay frozen")
