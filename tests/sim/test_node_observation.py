"""The engine builds running nodes' observations without the frozen dataclass's constructor
(speed): the result must be the same value as ``NodeObservation(...)``, field for field."""

from __future__ import annotations

import dataclasses

import pytest

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
    with pytest.raises(dataclasses.FrozenInstanceError):  # still frozen
        fast.node_id = 8  # type: ignore[misc]


def test_fast_sample_is_the_dataclass_value() -> None:
    from dlrover_core.sim.engine import _sample
    from dlrover_core.types import Sample

    kw = {
        "workers": 4, "ps": 2, "worker_cpu_cores": 2.0, "ps_cpu_cores": 1.5,
        "throughput_sps": 812.25, "batch_size": 512, "worker_memory_mib": 3000.0,
        "ps_memory_mib": 6100.5, "ps_cpu_util": 0.75, "worker_cpu_util": 0.5,
        "timestamp_s": 660.0,
    }  # fmt: skip
    # every field of Sample is given (a field added to Sample must be added here too)
    assert list(kw) == [f.name for f in dataclasses.fields(Sample)]
    fast, slow = _sample(dict(kw)), Sample(**kw)  # type: ignore[arg-type]
    assert type(fast) is Sample
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert fast.config == slow.config
    with pytest.raises(dataclasses.FrozenInstanceError):  # still frozen
        fast.ps = 3  # type: ignore[misc]
