"""What to do when a node exits: relaunch it (with what) or give up (and fail the job?).

Policy as data: every number is a field of a frozen dataclass, so the job master and the
cluster simulator run the same rule and a test can change one number.

The rule, per exit class (``relaunches_so_far`` counts this node's earlier relaunches after
exits *of the same class*; each class has its own budget):

- SUCCEEDED: nothing to do.
- OOM: relaunch with memory ``min(max(planned, oom_factor x current), current + oom_max_step)``,
  capped at ``oom_cap_mib``. A node that OOMs at the cap (or whose bump would not grow) is
  given up. No count budget: the cap bounds the retries (4 GiB -> 64 GiB is 8 relaunches).
- KILLED (preempted, evicted, SIGKILL/SIGTERM): relaunch with the planned resources, within
  ``max_killed_relaunches`` (large: preemption is not the job's fault).
- HARDWARE: relaunch on another host (``avoid_host``) within ``max_relaunches``.
- UNKNOWN: relaunch within ``max_relaunches``.
- FATAL (a code error): never retried; the same code fails the same way.

Giving up on a node:
- a PS holds a shard of the model that nobody else has: giving up on a PS fails the job;
- a worker is replaceable: by default the job goes on with fewer workers (dynamic sharding
  hands its shards to the others; the master fails the job when no worker is left);
- except a FATAL worker: every worker runs the same code, so one code error predicts them all,
  and ``fatal_worker_fails_job`` (default True) fails the job at once instead of burning the
  cluster on copies of the same crash.

The PS-specific OOM rule (``ps_oom_action``) decides between more memory per PS and more PS,
from how evenly the PS are loaded. ``OomBump`` is the Kubernetes VPA's OOM rule, kept here for
the baseline policies the simulator compares against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from dlrover_core.errors import InputError
from dlrover_core.faults.classify import ExitClass
from dlrover_core.types import NodeResources, Role, RolePlan


@dataclass(frozen=True)
class RelaunchDecision:
    """The answer for one exited node. ``resources`` is what to relaunch with (the current
    resources when not relaunching); ``avoid_host`` asks for a different machine."""

    relaunch: bool
    resources: NodeResources
    reason: str
    fail_job: bool = False
    exit_class: ExitClass = ExitClass.UNKNOWN
    avoid_host: bool = False


def _check_positive(name: str, value: float, minimum: float = 0.0) -> str | None:
    if not math.isfinite(value) or value < minimum:
        return f"{name}={value!r} must be a finite number >= {minimum}"
    return None


@dataclass(frozen=True)
class FaultPolicy:
    """Relaunch budgets and the OOM bump. Defaults follow DLRover (see DOMAIN.md)."""

    max_relaunches: int = 3  # UNKNOWN and HARDWARE, each per node
    max_killed_relaunches: int = 10  # KILLED (preemption/eviction), per node
    oom_factor: float = 2.0
    oom_max_step_mib: int = 8192
    oom_cap_mib: int = 65536
    fatal_worker_fails_job: bool = True
    ps_unbalance_threshold: float = 0.2  # PS OOM: max/mean - 1 above this -> more memory
    ps_memory_factor: float = 2.0
    ps_count_factor: int = 2

    def __post_init__(self) -> None:
        problems = [
            p
            for p in (
                _check_positive("max_relaunches", self.max_relaunches),
                _check_positive("max_killed_relaunches", self.max_killed_relaunches),
                _check_positive("oom_factor", self.oom_factor, 1.0),
                _check_positive("oom_max_step_mib", self.oom_max_step_mib, 1),
                _check_positive("oom_cap_mib", self.oom_cap_mib, 1),
                _check_positive("ps_unbalance_threshold", self.ps_unbalance_threshold),
                _check_positive("ps_memory_factor", self.ps_memory_factor, 1.0),
                _check_positive("ps_count_factor", self.ps_count_factor, 1),
            )
            if p is not None
        ]
        if problems:
            raise InputError("invalid FaultPolicy; fix these fields:", problems=problems)

    def budget(self, exit_class: ExitClass) -> int | None:
        """Relaunches allowed per node for this class; None = bounded otherwise (OOM: the cap)."""
        if exit_class is ExitClass.KILLED:
            return self.max_killed_relaunches
        if exit_class in (ExitClass.UNKNOWN, ExitClass.HARDWARE):
            return self.max_relaunches
        if exit_class is ExitClass.OOM:
            return None
        return 0

    def oom_memory_mib(self, current_mib: int, planned_mib: int) -> int:
        """Memory for a node relaunched after an OOM (may equal ``current_mib``: cannot grow)."""
        grown = max(planned_mib, math.ceil(current_mib * self.oom_factor))
        stepped = min(grown, current_mib + self.oom_max_step_mib)
        return max(current_mib, min(stepped, self.oom_cap_mib))

    def decide(
        self,
        role: Role,
        exit_class: ExitClass,
        current: NodeResources,
        planned: NodeResources,
        relaunches_so_far: int,
    ) -> RelaunchDecision:
        """Decide for one exited node.

        ``current``: what the node ran with. ``planned``: what the plan asks for it now
        (``ResourcePlan.node_resources(role, node_id)``). ``relaunches_so_far``: this node's
        earlier relaunches after exits of the same class.
        """
        if relaunches_so_far < 0:
            raise InputError(
                f"relaunches_so_far={relaunches_so_far} is negative; pass how many times this "
                "node was already relaunched after this exit class (0 the first time)"
            )
        if exit_class is ExitClass.SUCCEEDED:
            return RelaunchDecision(False, current, "node succeeded", False, exit_class)
        if exit_class is ExitClass.FATAL:
            fail = role is Role.PS or self.fatal_worker_fails_job
            why = (
                "fatal code error on a PS: a PS cannot be lost"
                if role is Role.PS
                else "fatal code error on a worker: the same code would fail on every worker"
            )
            return self._give_up(role, current, why, exit_class, fail_job=fail)
        if exit_class is ExitClass.OOM:
            return self._decide_oom(role, current, planned)
        budget = self.budget(exit_class) or 0  # KILLED, HARDWARE, UNKNOWN: count budgets
        if relaunches_so_far >= budget:
            return self._give_up(
                role,
                current,
                f"{exit_class.value} exit: relaunch budget of {budget} spent",
                exit_class,
            )
        return RelaunchDecision(
            relaunch=True,
            resources=planned,
            reason=(
                f"{exit_class.value} exit: relaunch {relaunches_so_far + 1} of {budget}"
                + (" on another host" if exit_class is ExitClass.HARDWARE else "")
            ),
            exit_class=exit_class,
            avoid_host=exit_class is ExitClass.HARDWARE,
        )

    def _decide_oom(
        self, role: Role, current: NodeResources, planned: NodeResources
    ) -> RelaunchDecision:
        new_mib = self.oom_memory_mib(current.memory_mib, planned.memory_mib)
        if new_mib <= current.memory_mib:
            return self._give_up(
                role,
                current,
                f"OOM at {current.memory_mib} MiB, at the {self.oom_cap_mib} MiB cap",
                ExitClass.OOM,
            )
        return RelaunchDecision(
            relaunch=True,
            resources=NodeResources(planned.cpu_millicores, new_mib),
            reason=f"OOM: memory {current.memory_mib} -> {new_mib} MiB",
            exit_class=ExitClass.OOM,
        )

    @staticmethod
    def _give_up(
        role: Role,
        current: NodeResources,
        why: str,
        exit_class: ExitClass,
        fail_job: bool | None = None,
    ) -> RelaunchDecision:
        fail = role is Role.PS if fail_job is None else fail_job
        tail = "; failing the job" if fail else "; the job goes on without this node"
        return RelaunchDecision(False, current, why + tail, fail, exit_class)


DEFAULT_FAULT_POLICY = FaultPolicy()


class PsOomAction(StrEnum):
    MORE_MEMORY = "more_memory"  # load unbalanced: the hot PS needs room, more PS won't help
    MORE_PS = "more_ps"  # load balanced: the model outgrew the PS set, spread it wider


@dataclass(frozen=True)
class PsOomDecision:
    """What to do about the PS set after a PS ran out of memory."""

    action: PsOomAction
    imbalance: float  # max/mean - 1 of the PS memory used
    memory_factor: float  # per-PS memory multiplier (1.0 unless MORE_MEMORY)
    count_factor: int  # PS count multiplier (1 unless MORE_PS)
    reason: str

    def apply(self, ps: RolePlan, memory_cap_mib: int | None = None) -> RolePlan:
        """The PS group after this decision (memory capped at ``memory_cap_mib``, never shrunk)."""
        memory = math.ceil(ps.resources.memory_mib * self.memory_factor)
        if memory_cap_mib is not None:
            memory = max(ps.resources.memory_mib, min(memory, memory_cap_mib))
        return RolePlan(ps.count * self.count_factor, replace(ps.resources, memory_mib=memory))


def ps_oom_action(
    ps_memory_used: Sequence[int | float], policy: FaultPolicy = DEFAULT_FAULT_POLICY
) -> PsOomDecision:
    """A PS OOMed: x2 memory if the PS load is unbalanced (max/mean - 1 > threshold), else
    x2 PS. ``ps_memory_used``: memory used by each PS (MiB), the OOMed one included."""
    if not ps_memory_used:
        raise InputError("ps_memory_used is empty; pass the memory used by every PS (MiB)")
    if any(not math.isfinite(m) or m < 0 for m in ps_memory_used):
        raise InputError(
            f"ps_memory_used={list(ps_memory_used)} has a negative or non-finite value; "
            "pass MiB used per PS"
        )
    mean = sum(ps_memory_used) / len(ps_memory_used)
    imbalance = max(ps_memory_used) / mean - 1.0 if mean > 0 else 0.0
    if imbalance > policy.ps_unbalance_threshold:
        return PsOomDecision(
            PsOomAction.MORE_MEMORY,
            imbalance,
            policy.ps_memory_factor,
            1,
            f"PS memory unbalanced by {imbalance:.0%} (> {policy.ps_unbalance_threshold:.0%}): "
            f"x{policy.ps_memory_factor:g} memory per PS",
        )
    return PsOomDecision(
        PsOomAction.MORE_PS,
        imbalance,
        1.0,
        policy.ps_count_factor,
        f"PS memory balanced within {imbalance:.0%} "
        f"(<= {policy.ps_unbalance_threshold:.0%}): x{policy.ps_count_factor} PS",
    )


@dataclass(frozen=True)
class OomBump:
    """Kubernetes VPA's OOM rule (``RecordOOM``): next memory = max(used + min_bump,
    used x ratio). Used by the baseline policies, not by DLRover-RM's own rule."""

    min_bump_mib: int = 100
    ratio: float = 1.2

    def __post_init__(self) -> None:
        if self.min_bump_mib < 0 or not math.isfinite(self.ratio) or self.ratio < 1.0:
            raise InputError(
                f"OomBump(min_bump_mib={self.min_bump_mib}, ratio={self.ratio}) is invalid: "
                "use min_bump_mib >= 0 and ratio >= 1.0"
            )

    def bump(self, used_mib: int) -> int:
        """Memory (MiB) to request after an OOM at ``used_mib``."""
        if used_mib < 0:
            raise InputError(f"used_mib={used_mib} is negative; pass the memory used in MiB")
        return max(used_mib + self.min_bump_mib, math.ceil(used_mib * self.ratio))
