"""What the job master knows about one node (:class:`NodeRecord`) and its persisted form in
``master.json`` (:meth:`NodeRecord.persisted`, :meth:`NodeRecord.restored`); the master's
:class:`~dlrover_core.runtime.state.MasterState` holds one per node."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlrover_core.types import NodeState, Role

_CPU_HISTORY = 12

NodeKey = tuple[Role, int]

EVENTS = frozenset({"warm", "failed", "disk_full"})
"""What a node reports of itself through the master service (``ReportEvent``), as facts the
master acts on: ``warm`` (its imports are done: a pre-warmed rank can take over), ``failed``
(it is about to exit on an error it names in one line), ``disk_full`` (a write failed for
want of space)."""


def node_name(role: Role | str, node_id: int) -> str:
    return f"{Role(role).value}-{node_id}"


@dataclass
class NodeRecord:
    """What the master knows about one node. ``stats`` holds the numbers of the latest
    heartbeat or metrics report (``cpu_percent``: 100 = one core busy; ``rss_mib``).
    ``ref`` is the backend's handle of the current incarnation ("" until launched); ``pid`` is
    what the node itself reported when it registered (shown by ``status``, never acted on)."""

    role: Role
    node_id: int
    state: NodeState = NodeState.PENDING
    state_since_s: float = 0.0
    pid: int | None = None
    incarnation: int = 0
    restarts: int = 0
    stop_requested: bool = False
    registered_at_s: float | None = None
    ref: str = ""
    address: str | None = None  # a PS's serving address, from its registration
    generation: int = 0  # a PS's set generation
    restored_seq: int | None = None  # a PS: the done_seq tag of the state it restored
    restore_handled: bool = False  # the shards its restore lost were re-queued (once)
    relaunches: dict[str, int] = field(default_factory=dict)  # per exit class
    resources: dict[str, int] | None = None  # as launched
    events: dict[str, float] = field(default_factory=dict)  # this incarnation's: kind -> time
    said: str | None = None  # the node's own one-line reason (with ``failed``/``disk_full``)
    # monotonic seconds, never persisted
    launched_mono: float | None = None
    last_heartbeat_s: float | None = None
    last_progress_s: float | None = None
    stats: dict[str, float] = field(default_factory=dict)
    cpu_percent_history: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=_CPU_HISTORY)
    )

    @property
    def key(self) -> NodeKey:
        return (self.role, self.node_id)

    @property
    def name(self) -> str:
        return node_name(self.role, self.node_id)

    @property
    def registered(self) -> bool:
        return self.registered_at_s is not None

    def persisted(self) -> dict[str, Any]:
        return {
            "role": self.role.value,
            "node_id": self.node_id,
            "state": self.state.value,
            "state_since_s": self.state_since_s,
            "pid": self.pid,
            "incarnation": self.incarnation,
            "restarts": self.restarts,
            "stop_requested": self.stop_requested,
            "registered_at_s": self.registered_at_s,
            "ref": self.ref,
            "address": self.address,
            "generation": self.generation,
            "restored_seq": self.restored_seq,
            "restore_handled": self.restore_handled,
            "relaunches": dict(self.relaunches),
            "resources": self.resources,
            "events": dict(self.events),
            "said": self.said,
        }

    @classmethod
    def restored(cls, d: Mapping[str, Any]) -> NodeRecord:
        return cls(
            role=Role(d["role"]),
            node_id=int(d["node_id"]),
            state=NodeState(d["state"]),
            state_since_s=float(d.get("state_since_s", 0.0)),
            pid=d.get("pid"),
            incarnation=int(d.get("incarnation", 0)),
            restarts=int(d.get("restarts", 0)),
            stop_requested=bool(d.get("stop_requested", False)),
            registered_at_s=d.get("registered_at_s"),
            ref=str(d.get("ref") or ""),
            address=d.get("address"),
            generation=int(d.get("generation", 0)),
            restored_seq=d.get("restored_seq"),
            restore_handled=bool(d.get("restore_handled", False)),
            relaunches={str(k): int(v) for k, v in dict(d.get("relaunches") or {}).items()},
            resources=d.get("resources"),
            events={str(k): float(v) for k, v in dict(d.get("events") or {}).items()},
            said=d.get("said"),
        )
