"""A node stuck in PENDING (the cluster has no room for its request): shrink it and relaunch.

The rule (DLRover-RM post-scaling, see DOMAIN.md):

- pending for less than ``timeout_s`` (default 900 s) -> WAIT;
- then RELAUNCH with ``shrink_factor`` (1/2) of its CPU and memory, each floored at
  ``min_cpu_millicores`` / ``min_memory_mib`` (4 cores / 6 GiB) and never above the current
  request (a node already below a floor keeps that dimension as it is);
- a node that cannot shrink (both dimensions at or below their floors) keeps WAITing: capacity
  may free up, and a smaller request is not on offer. Once it has been pending for
  ``give_up_after_s`` (default 3600 s; None = never) the answer is GIVE_UP, and the caller
  applies the role rule of ``FaultPolicy``: a PS fails the job, a worker is dropped.

Each relaunch creates a new node, so ``pending_since_s`` restarts with it; shrinking halves
at every timeout until the floors (32 cores -> 16 -> 8 -> 4).

Times are seconds on the caller's clock. A ``now_s`` before ``pending_since_s`` (clock skew)
counts as zero time waited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from dlrover_core.errors import InputError
from dlrover_core.types import NodeResources


class PendingAction(StrEnum):
    WAIT = "wait"
    RELAUNCH = "relaunch"
    GIVE_UP = "give_up"


@dataclass(frozen=True)
class PendingPolicy:
    timeout_s: float = 900.0
    shrink_factor: float = 0.5
    min_cpu_millicores: int = 4000
    min_memory_mib: int = 6144
    give_up_after_s: float | None = 3600.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not math.isfinite(self.timeout_s) or self.timeout_s < 0:
            problems.append(f"timeout_s={self.timeout_s!r} must be a finite number >= 0")
        if not 0.0 < self.shrink_factor < 1.0:
            problems.append(f"shrink_factor={self.shrink_factor!r} must be in (0, 1)")
        if self.min_cpu_millicores < 0 or self.min_memory_mib < 0:
            problems.append("min_cpu_millicores and min_memory_mib must be >= 0")
        if self.give_up_after_s is not None and not self.give_up_after_s >= self.timeout_s:
            problems.append(
                f"give_up_after_s={self.give_up_after_s!r} must be >= timeout_s "
                f"({self.timeout_s}) or None"
            )
        if problems:
            raise InputError("invalid PendingPolicy; fix these fields:", problems=problems)

    def shrink(self, current: NodeResources) -> NodeResources:
        """``current`` scaled by ``shrink_factor``, floored, never above ``current``."""
        cpu = max(self.min_cpu_millicores, math.ceil(current.cpu_millicores * self.shrink_factor))
        mem = max(self.min_memory_mib, math.ceil(current.memory_mib * self.shrink_factor))
        return NodeResources(min(cpu, current.cpu_millicores), min(mem, current.memory_mib))


DEFAULT_PENDING_POLICY = PendingPolicy()


@dataclass(frozen=True)
class PendingDecision:
    action: PendingAction
    resources: NodeResources  # what to relaunch with (the current request unless RELAUNCH)
    waited_s: float
    reason: str


def pending_action(
    pending_since_s: float,
    now_s: float,
    current: NodeResources,
    policy: PendingPolicy = DEFAULT_PENDING_POLICY,
) -> PendingDecision:
    """Decide for one node pending since ``pending_since_s``. See the module docstring."""
    if not (math.isfinite(pending_since_s) and math.isfinite(now_s)):
        raise InputError(
            f"pending_since_s={pending_since_s!r}, now_s={now_s!r}: pass finite seconds"
        )
    waited = max(0.0, now_s - pending_since_s)
    if waited < policy.timeout_s:
        return PendingDecision(
            PendingAction.WAIT,
            current,
            waited,
            f"pending {waited:.0f} s < {policy.timeout_s:.0f} s timeout",
        )
    smaller = policy.shrink(current)
    if smaller != current:
        return PendingDecision(
            PendingAction.RELAUNCH,
            smaller,
            waited,
            f"pending {waited:.0f} s >= {policy.timeout_s:.0f} s: relaunch smaller, "
            f"{current} -> {smaller}",
        )
    if policy.give_up_after_s is not None and waited >= policy.give_up_after_s:
        return PendingDecision(
            PendingAction.GIVE_UP,
            current,
            waited,
            f"pending {waited:.0f} s at the floors ({current}); gave up after "
            f"{policy.give_up_after_s:.0f} s: the cluster has no room even for the minimum",
        )
    return PendingDecision(
        PendingAction.WAIT,
        current,
        waited,
        f"pending {waited:.0f} s but {current} is at the floors and cannot shrink; waiting "
        "for capacity",
    )
