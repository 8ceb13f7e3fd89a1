"""The protocol every node backend implements, and the values it passes.

DESIGN.md: *the master never knows whether a node is a process or a pod.* The job master talks
to a ``Backend`` only through the values here: it describes a node with a ``NodeSpec``, gets a
``NodeHandle`` back, learns about ends through ``poll()`` as ``NodeExit`` values (which
``faults.classify_exit`` turns into an exit class) and reads ``NodeUsage`` for runtime samples.
A handle's ``ref`` is a pid for the local backend and a pod name for Kubernetes; the master
stores it (status, run directory) and hands it back to ``adopt`` after its own restart.

Reasons a backend may report (``NodeExit.reason``):

- ``"OOMKilled"`` (``OOM_REASON``): the node went over its memory limit and was killed;
  ``classify_exit`` reads it as OOM whatever the signal.
- ``"Lost"`` (``LOST_REASON``): the node ended but its exit status cannot be known (a process
  adopted from an earlier master is not our child, so nobody can tell us its exit code);
  ``classify_exit`` reads it as UNKNOWN, so the relaunch policy retries within its small budget.
  The master should trust what the node itself reported (e.g. "all my shards are done") over
  this reason.
- ``"Deleted"`` (``DELETED_REASON``): the node's pod vanished without a final status and
  the master had not asked for it (someone deleted it, or the cluster garbage-collected it);
  ``classify_exit`` reads it as KILLED (relaunch).
- ``"DisruptionTarget"`` (``DISRUPTED_REASON``): Kubernetes marked the pod for disruption
  (preemption, eviction, a node drain) before it ended; KILLED (relaunch).
- Kubernetes pod reasons as the API spells them: ``"Evicted"``, ``"Shutdown"``,
  ``"NodeShutdown"``, ``"Terminated"`` (KILLED), ``"NodeLost"`` (HARDWARE, relaunch
  elsewhere), and the waiting reasons in ``FATAL_WAITING_REASONS`` (``"ImagePullBackOff"``,
  ``"ErrImagePull"``, ``"InvalidImageName"``, ``"CreateContainerConfigError"``,
  ``"CreateContainerError"``): FATAL, a relaunch of the same pod cannot fix them.
- ``None``: the exit code / signal say everything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from dlrover_core.faults.classify import (
    DELETED_REASON,
    DISRUPTED_REASON,
    FATAL_WAITING_REASONS,
    OOM_REASON,
    ExitClass,
    classify_exit,
    explain_exit,
)
from dlrover_core.types import NodeResources, Role

__all__ = [
    "DELETED_REASON",
    "DISRUPTED_REASON",
    "ENV_ADVERTISE_HOST",
    "ENV_BIND_HOST",
    "ENV_CPU_MILLICORES",
    "ENV_INCARNATION",
    "ENV_MEMORY_MIB",
    "ENV_NODE_ID",
    "ENV_ROLE",
    "FATAL_WAITING_REASONS",
    "LOST_REASON",
    "OOM_REASON",
    "Backend",
    "NodeExit",
    "NodeHandle",
    "NodeSpec",
    "NodeUsage",
    "RunLease",
    "launch_each",
]

LOST_REASON = "Lost"
"""Reason for an exit whose status is unknown (an adopted process that ended)."""

# Every backend puts the node's identity and size into its environment. A node may read them
# (logs, its own name); the local backend reads them back from /proc to verify and size an
# adopted process.
ENV_ROLE = "DLROVER_RM_ROLE"
ENV_NODE_ID = "DLROVER_RM_NODE_ID"
ENV_INCARNATION = "DLROVER_RM_INCARNATION"
ENV_CPU_MILLICORES = "DLROVER_RM_CPU_MILLICORES"
ENV_MEMORY_MIB = "DLROVER_RM_MEMORY_MIB"
# Where a node's own server (a PS) binds, and the host it tells the master others reach it at.
# The local backend sets both to loopback; on Kubernetes the bind host is 0.0.0.0 and the
# advertised host the pod IP (downward API).
ENV_BIND_HOST = "DLROVER_RM_BIND_HOST"
ENV_ADVERTISE_HOST = "DLROVER_RM_ADVERTISE_HOST"
# a job master in a pod `dlrover-rm submit` created: its pod name (the downward API)
ENV_POD_NAME = "DLROVER_RM_POD_NAME"
# OpenMP threads that wait for work sleep instead of spinning: a node under a CPU quota, or
# sharing its host, burns its quota spinning and is throttled (measured on the local backend at
# a 2-CPU quota on a 2-core host, 2 threads: all-reduce rank 41k -> 49k samples/s, PS worker
# 51k -> 68k). A value the node's environment already has wins.
OMP_WAIT_POLICY = "PASSIVE"


@dataclass(frozen=True)
class NodeSpec:
    """What to start: node ``node_id`` of ``role``, its ``incarnation`` (0 for the first start,
    +1 per relaunch), its ``resources`` (CPU and an enforced memory limit; 0 = no limit), the
    command ``argv`` (``[sys.executable, "-m", "dlrover_core.runtime.strategies.ps.worker",
    ...]``), extra
    environment ``env`` (on top of the backend's own) and where its stdout/stderr go
    (appended; ``None`` = discarded)."""

    role: Role
    node_id: int
    incarnation: int
    resources: NodeResources
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log_path: str | None = None

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"{self.name}: empty argv; give the command to run")
        if self.node_id < 0 or self.incarnation < 0:
            raise ValueError(f"{self.name}: node_id and incarnation must be >= 0")

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.node_id}.{self.incarnation}"

    def identity_env(self) -> dict[str, str]:
        """The environment variables that name and size this node (see ``ENV_*``)."""
        return {
            ENV_ROLE: self.role.value,
            ENV_NODE_ID: str(self.node_id),
            ENV_INCARNATION: str(self.incarnation),
            ENV_CPU_MILLICORES: str(self.resources.cpu_millicores),
            ENV_MEMORY_MIB: str(self.resources.memory_mib),
        }


@dataclass(frozen=True)
class NodeHandle:
    """A started node: who it is and how the backend finds it again (``ref``: a pid as a
    string for local processes, a pod name for Kubernetes)."""

    role: Role
    node_id: int
    incarnation: int
    ref: str
    started_at_s: float

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.node_id}.{self.incarnation}"

    def to_dict(self) -> dict[str, object]:
        return {
            "role": self.role.value,
            "node_id": self.node_id,
            "incarnation": self.incarnation,
            "ref": self.ref,
            "started_at_s": self.started_at_s,
        }


@dataclass(frozen=True)
class NodeExit:
    """How a node ended. ``exit_code`` as Python reports it (``-N`` when signal N ended it;
    ``None`` when unknown), ``signal`` the ending signal when known, ``reason`` one of the
    module's reasons or ``None``, ``at_s`` when the backend saw the end, ``max_rss_mib`` the
    highest resident memory seen for the node (process and children). ``ref`` is the handle's
    ref; ``requested`` is true when the end followed ``stop``/``kill`` through this backend (the
    master asked for it)."""

    role: Role
    node_id: int
    incarnation: int
    exit_code: int | None
    signal: int | None
    reason: str | None
    at_s: float
    max_rss_mib: float | None = None
    ref: str = ""
    requested: bool = False

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.node_id}.{self.incarnation}"

    @property
    def exit_class(self) -> ExitClass:
        return classify_exit(self.exit_code, self.reason, self.signal)

    def explain(self) -> str:
        cls, why = explain_exit(self.exit_code, self.reason, self.signal)
        return f"{self.name}: {cls.value} ({why})"

    def to_dict(self) -> dict[str, object]:
        return {
            "role": self.role.value,
            "node_id": self.node_id,
            "incarnation": self.incarnation,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "at_s": self.at_s,
            "max_rss_mib": self.max_rss_mib,
            "ref": self.ref,
            "requested": self.requested,
            "exit_class": self.exit_class.value,
        }


@dataclass(frozen=True)
class NodeUsage:
    """What a node uses now: ``cpu_percent`` summed over its processes (100 = one full core,
    so 250 = 2.5 cores) over the backend's recent window, ``rss_mib`` resident memory of the
    process and its children."""

    cpu_percent: float
    rss_mib: float

    @property
    def cpu_millicores(self) -> int:
        return int(round(self.cpu_percent * 10.0))


@runtime_checkable
class Backend(Protocol):
    """Starts, watches and ends nodes. Implementations are thread-safe."""

    def launch(self, spec: NodeSpec) -> NodeHandle:
        """Start the node described by ``spec``; return at once (it may still be starting)."""
        ...

    def launch_many(self, specs: Sequence[NodeSpec]) -> list[NodeHandle | Exception]:
        """Start every node of ``specs`` (a batch: a backend may start them concurrently,
        bounded). One entry per spec, in order: its handle, or the exception its launch
        raised; one failure does not stop the others. ``launch_each`` is the plain loop."""
        ...

    def poll(self) -> list[NodeExit]:
        """Exits seen since the last call; each exit is reported exactly once."""
        ...

    def stop(self, handle: NodeHandle, grace_s: float = 5.0, *, wait: bool = True) -> None:
        """Ask the node to end (SIGTERM to its whole process group / pod deletion with a grace
        period); force it (SIGKILL) after ``grace_s``. The exit still comes through ``poll``.
        ``wait=False`` returns at once (the force still happens after the grace)."""
        ...

    def kill(self, handle: NodeHandle) -> None:
        """End the node at once (SIGKILL to its whole process group): tests and fault drills."""
        ...

    def usage(self, handle: NodeHandle) -> NodeUsage | None:
        """Current CPU and memory of a running node; ``None`` when not running or unknown."""
        ...

    def alive(self, handle: NodeHandle) -> bool:
        """Whether the node still runs."""
        ...

    def adopt(self, role: Role, node_id: int, incarnation: int, ref: str) -> NodeHandle | None:
        """Take over a node started by an earlier master (after a master restart). Returns
        ``None`` when ``ref`` no longer runs that node (ended, or the pid was reused)."""
        ...

    def shutdown(self) -> None:
        """Stop every node this backend launched or adopted, and release its resources."""
        ...

    def endpoint(self) -> tuple[str, str]:
        """``(bind_host, advertised_host)`` for the master's own server: where it listens and
        the host its nodes reach it at (loopback locally; 0.0.0.0 and the pod IP or Service
        name on Kubernetes)."""
        ...

    def resize(self, handle: NodeHandle, resources: NodeResources) -> bool:
        """Change a running node's CPU in place (memory unchanged). ``True`` when done (local:
        re-pinned; Kubernetes: ``pods/resize`` accepted), ``False`` when the backend cannot:
        the caller relaunches the node instead."""
        ...

    def resize_state(self, handle: NodeHandle) -> str | None:
        """How an accepted in-place resize stands: ``"infeasible"`` (the node can never give
        it: the caller relaunches the node at the new size), ``"deferred"`` (not now; maybe
        later), ``"in_progress"``, or ``None`` (done, or nothing to follow)."""
        ...

    def pending_since(self, handle: NodeHandle) -> float | None:
        """When (wall-clock seconds) the cluster was first seen unable to place the node
        (Kubernetes: ``PodScheduled=False``, reason ``Unschedulable``); ``None`` while it is
        placed, or where nothing can leave it unplaced (local processes). The planner's
        pending rule shrinks or drops such a node; the master does not kill it as one that
        "never registered"."""
        ...

    def event(
        self, handle: NodeHandle | None, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """Tell the cluster's users why the master acted on a node (``handle``) or what it
        decided for the job (``None``): Kubernetes Events; nothing where there is no such
        channel (the master's log and report.json always have it). Never blocks, never
        raises."""
        ...


@runtime_checkable
class RunLease(Protocol):
    """One master per run: a file lock locally, a ``coordination.k8s.io`` Lease on Kubernetes.
    ``acquire`` returns ``None`` when this master now holds the lease, else a one-line
    description of the holder ("pid 123 on host h since ..."); ``renew`` keeps it (``False``:
    lost it, the master must stop acting at once); ``release`` gives it up (idempotent)."""

    def acquire(self) -> str | None: ...

    def renew(self) -> bool: ...

    def release(self) -> None: ...


def launch_each(
    launch: Callable[[NodeSpec], NodeHandle], specs: Sequence[NodeSpec]
) -> list[NodeHandle | Exception]:
    """``Backend.launch_many`` as a loop of ``launch`` (a backend whose launches are cheap):
    one entry per spec, its handle or the exception its launch raised."""
    out: list[NodeHandle | Exception] = []
    for spec in specs:
        try:
            out.append(launch(spec))
        except Exception as exc:  # handed back, in order; the rest still launch
            out.append(exc)
    return out
