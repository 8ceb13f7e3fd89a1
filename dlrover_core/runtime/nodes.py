"""The controller's view of a node, shared by the controller and the strategies."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrover_core.runtime.backends.base import NodeHandle
from dlrover_core.types import NodeResources, Role

NodeKey = tuple[Role, int]


@dataclass
class Node:
    """One node: its desired size and its current incarnation."""

    role: Role
    node_id: int
    resources: NodeResources
    incarnation: int = 0
    generation: int = 0  # a PS: its set's generation; an all-reduce rank: its group
    handle: NodeHandle | None = None
    relaunches: dict[str, int] = field(default_factory=dict)
    stopping_mono: float | None = None  # a worker asked to leave (scale-down)
    kill_reason: str | None = None  # why the controller killed it (liveness)
    resized_mono: float | None = None  # resized in place: follow the backend's word on it

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.node_id}"
