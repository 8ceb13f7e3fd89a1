"""Frozen values passed between stages. Plans are values: build new ones with
``dataclasses.replace``; never mutate."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dlrover_core.units import cores, format_cpu, format_memory


class Role(StrEnum):
    WORKER = "worker"
    PS = "ps"


class Stage(StrEnum):
    COLD_START = "cold_start"  # stage 1 without history
    WARM_START = "warm_start"  # stage 1 from similar past runs
    SAMPLING = "sampling"  # stage 2, exploring configurations before the model is trusted
    SCALING = "scaling"  # stage 2, model-based
    POST_SCALING = "post_scaling"  # stage 3, instability handling
    FAULT = "fault"  # a relaunch decided by the fault policies


class NodeState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DELETED = "deleted"


@dataclass(frozen=True, order=True)
class NodeResources:
    """CPU and memory of one node (or a sum of nodes). Arithmetic reads as algebra."""

    cpu_millicores: int
    memory_mib: int

    def __post_init__(self) -> None:
        if self.cpu_millicores < 0 or self.memory_mib < 0:
            raise ValueError(f"negative resources: {self}")

    @property
    def cpu_cores(self) -> float:
        return cores(self.cpu_millicores)

    @property
    def threads(self) -> int:
        """Compute threads (torch intra-op, OMP, MKL) for a node of these resources: its whole
        cores, at least 1. Rounded down, not to nearest: under a CFS quota of 1.5 cores two busy
        threads use up the quota early in each 100 ms period and are throttled for the rest of
        it (a 1.5-CPU worker measured slower than a 1-CPU one); the part of a core left over
        goes to the input pipeline, gRPC and the framework (uber-go/automaxprocs rounds a
        fractional limit down for the same reason)."""
        return max(1, int(self.cpu_cores + 1e-9))

    def __add__(self, other: NodeResources) -> NodeResources:
        return NodeResources(
            self.cpu_millicores + other.cpu_millicores, self.memory_mib + other.memory_mib
        )

    def __sub__(self, other: NodeResources) -> NodeResources:
        return NodeResources(
            max(0, self.cpu_millicores - other.cpu_millicores),
            max(0, self.memory_mib - other.memory_mib),
        )

    def __mul__(self, k: int | float) -> NodeResources:
        return NodeResources(
            int(math.ceil(self.cpu_millicores * k)), int(math.ceil(self.memory_mib * k))
        )

    __rmul__ = __mul__

    def fits_in(self, other: NodeResources) -> bool:
        return self.cpu_millicores <= other.cpu_millicores and self.memory_mib <= other.memory_mib

    def to_dict(self) -> dict[str, int]:
        return {"cpu_millicores": self.cpu_millicores, "memory_mib": self.memory_mib}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeResources:
        return cls(int(d["cpu_millicores"]), int(d["memory_mib"]))

    def __str__(self) -> str:
        return f"{format_cpu(self.cpu_millicores)} CPU / {format_memory(self.memory_mib)}"


ZERO = NodeResources(0, 0)


@dataclass(frozen=True)
class RolePlan:
    """``count`` nodes of one role, each with ``resources``."""

    count: int
    resources: NodeResources

    @property
    def total(self) -> NodeResources:
        return self.resources * self.count

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, **self.resources.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RolePlan:
        return cls(int(d["count"]), NodeResources.from_dict(d))


@dataclass(frozen=True)
class NodeOverride:
    """A per-node change to node ``node_id`` of ``role``: ``migrate`` it to a node of
    ``resources`` (start the new one first, then switch), or ``relaunch`` it (straggler,
    long-pending node) with ``resources``."""

    role: Role
    node_id: int
    resources: NodeResources
    reason: str
    action: str = "migrate"  # "migrate" | "relaunch"

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role.value,
            "node_id": self.node_id,
            **self.resources.to_dict(),
            "reason": self.reason,
            "action": self.action,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeOverride:
        return cls(
            Role(d["role"]),
            int(d["node_id"]),
            NodeResources.from_dict(d),
            d["reason"],
            d.get("action", "migrate"),
        )


@dataclass(frozen=True)
class ResourcePlan:
    """What a job should run with, and why."""

    workers: RolePlan
    ps: RolePlan
    stage: Stage
    reasons: tuple[str, ...] = ()
    predicted_throughput_sps: float | None = None
    overrides: tuple[NodeOverride, ...] = ()
    created_at_s: float = 0.0
    # what move made this plan, as a value the planner reads back (never its reasons): e.g.
    # "sample:more_ps", "scale", "revert", "idle_ps", "hot_ps"; "" for stage 1 and faults
    action: str = ""

    def role(self, role: Role) -> RolePlan:
        return self.workers if role is Role.WORKER else self.ps

    def node_resources(self, role: Role, node_id: int) -> NodeResources:
        for o in self.overrides:
            if o.role is role and o.node_id == node_id:
                return o.resources
        return self.role(role).resources

    @property
    def total(self) -> NodeResources:
        """All resources the plan allocates (per-node overrides replace their group's size)."""
        tot = self.workers.total + self.ps.total
        for o in self.overrides:
            base = self.role(o.role).resources
            if o.node_id < self.role(o.role).count:
                tot = NodeResources(
                    tot.cpu_millicores - base.cpu_millicores + o.resources.cpu_millicores,
                    tot.memory_mib - base.memory_mib + o.resources.memory_mib,
                )
        return tot

    def same_allocation(self, other: ResourcePlan) -> bool:
        return (
            self.workers == other.workers
            and self.ps == other.ps
            and {(o.role, o.node_id, o.resources) for o in self.overrides}
            == {(o.role, o.node_id, o.resources) for o in other.overrides}
        )

    def replace(self, **changes: Any) -> ResourcePlan:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage.value,
            "workers": self.workers.to_dict(),
            "ps": self.ps.to_dict(),
            "overrides": [o.to_dict() for o in self.overrides],
            "reasons": list(self.reasons),
            "predicted_throughput_sps": self.predicted_throughput_sps,
            "created_at_s": self.created_at_s,
            "action": self.action,
            "total": self.total.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResourcePlan:
        return cls(
            workers=RolePlan.from_dict(d["workers"]),
            ps=RolePlan.from_dict(d["ps"]),
            stage=Stage(d["stage"]),
            reasons=tuple(d.get("reasons", ())),
            predicted_throughput_sps=d.get("predicted_throughput_sps"),
            overrides=tuple(NodeOverride.from_dict(o) for o in d.get("overrides", ())),
            created_at_s=float(d.get("created_at_s", 0.0)),
            action=str(d.get("action", "")),
        )

    def describe(self) -> str:
        lines = [
            f"stage:    {self.stage.value}",
            f"workers:  {self.workers.count} x {self.workers.resources}",
            f"ps:       {self.ps.count} x {self.ps.resources}",
        ]
        for o in self.overrides:
            lines.append(f"  {o.role.value}-{o.node_id} -> {o.resources} ({o.reason})")
        lines.append(f"total:    {self.total}")
        if self.predicted_throughput_sps is not None:
            lines.append(f"predicted throughput: {self.predicted_throughput_sps:,.0f} samples/s")
        if self.reasons:
            lines.append("why:")
            lines.extend(f"  - {r}" for r in self.reasons)
        return "\n".join(lines)


@dataclass(frozen=True)
class Sample:
    """One steady window of a running configuration (a row of the samples CSV)."""

    workers: int
    ps: int
    worker_cpu_cores: float
    ps_cpu_cores: float
    throughput_sps: float
    batch_size: int | None = None
    worker_memory_mib: float | None = None
    ps_memory_mib: float | None = None
    ps_cpu_util: float | None = None
    worker_cpu_util: float | None = None
    timestamp_s: float | None = None

    @property
    def config(self) -> tuple[int, int, float, float]:
        return (self.workers, self.ps, self.worker_cpu_cores, self.ps_cpu_cores)


@dataclass(frozen=True)
class NodeObservation:
    """What the master knows about one node at one instant."""

    role: Role
    node_id: int
    state: NodeState
    allocated: NodeResources
    cpu_used_millicores: int = 0
    memory_used_mib: int = 0
    state_since_s: float = 0.0
    throughput_sps: float = 0.0  # workers: samples/s of this worker

    @property
    def cpu_util(self) -> float:
        if self.allocated.cpu_millicores <= 0:
            return 0.0
        return self.cpu_used_millicores / self.allocated.cpu_millicores

    @property
    def memory_util(self) -> float:
        if self.allocated.memory_mib <= 0:
            return 0.0
        return self.memory_used_mib / self.allocated.memory_mib


@dataclass(frozen=True)
class Observation:
    """A snapshot of a running job: the input of stages 2 and 3."""

    time_s: float
    nodes: tuple[NodeObservation, ...]
    throughput_sps: float
    samples_done: int = 0
    samples_total: int = 0
    distinct_ids: int | None = None  # embedding rows created so far (PS memory growth)

    def of(self, role: Role, state: NodeState | None = NodeState.RUNNING) -> list[NodeObservation]:
        return [n for n in self.nodes if n.role is role and (state is None or n.state is state)]

    def settled(self, settle_s: float, role: Role | None = None) -> bool:
        """Every running node (of ``role``; None: of every role) had run ``settle_s`` at this
        instant: past its start-up (imports, a checkpoint restore), so its use is its load."""
        return all(
            self.time_s - n.state_since_s >= settle_s
            for n in self.nodes
            if n.state is NodeState.RUNNING and (role is None or n.role is role)
        )

    @property
    def progress(self) -> float:
        return self.samples_done / self.samples_total if self.samples_total else 0.0


@dataclass(frozen=True)
class HistoryRecord:
    """A finished run, as warm start needs it."""

    signature: str
    finished_at_s: float
    final_plan: ResourcePlan
    succeeded: bool = True
    worker_cpu_used_millicores: int | None = None  # peak per worker
    worker_memory_used_mib: int | None = None  # peak per worker
    ps_cpu_used_millicores: int | None = None  # peak per PS
    ps_memory_used_mib: int | None = None  # peak per PS
    throughput_sps: float | None = None
    wall_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # what else changes the throughput law besides the signature: a PS run's sizes and speed
    # samples do not describe an all-reduce run of the same model and data (and the reverse)
    strategy: str = "ps"
