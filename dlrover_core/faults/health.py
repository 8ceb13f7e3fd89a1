"""Is a node alive, hung, or slow? Pure checks on numbers the master already collects.

All times are seconds on the caller's clock; thresholds are reached at equality (a node whose
last heartbeat is exactly ``dead_after_s`` old is dead). A time in the future (clock skew
between processes) counts as zero elapsed: skew alone must never kill a node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dlrover_core.errors import InputError


def _elapsed(since_s: float, now_s: float, what: str) -> float:
    if not (math.isfinite(since_s) and math.isfinite(now_s)):
        raise InputError(f"{what}={since_s!r}, now_s={now_s!r}: pass finite seconds")
    return max(0.0, now_s - since_s)


@dataclass(frozen=True)
class HeartbeatPolicy:
    """Nodes report every ``interval_s``; silent for ``dead_after_s`` means dead."""

    interval_s: float = 15.0
    dead_after_s: float = 600.0

    def __post_init__(self) -> None:
        if not (0 < self.interval_s <= self.dead_after_s and math.isfinite(self.dead_after_s)):
            raise InputError(
                f"HeartbeatPolicy(interval_s={self.interval_s}, dead_after_s="
                f"{self.dead_after_s}) is invalid: use 0 < interval_s <= dead_after_s"
            )

    def is_dead(self, last_heartbeat_s: float, now_s: float) -> bool:
        return _elapsed(last_heartbeat_s, now_s, "last_heartbeat_s") >= self.dead_after_s

    def missed(self, last_heartbeat_s: float, now_s: float) -> int:
        """Whole heartbeat intervals gone by without a heartbeat."""
        return int(_elapsed(last_heartbeat_s, now_s, "last_heartbeat_s") // self.interval_s)


@dataclass(frozen=True)
class HangPolicy:
    """A node is hung when it made no progress (no shard done, no step) for
    ``no_progress_for_s`` *and* every one of its recent CPU utilisation samples (at least
    ``min_cpu_samples`` of them, fractions of its allocation) is below ``cpu_util_below``.
    Both must hold: a busy node with no progress is slow, not hung; an idle node that keeps
    finishing shards is waiting on I/O, not hung. Without CPU samples there is no evidence."""

    cpu_util_below: float = 0.05
    no_progress_for_s: float = 1800.0
    min_cpu_samples: int = 3

    def __post_init__(self) -> None:
        if not (0.0 < self.cpu_util_below <= 1.0) or self.no_progress_for_s < 0:
            raise InputError(
                f"HangPolicy(cpu_util_below={self.cpu_util_below}, no_progress_for_s="
                f"{self.no_progress_for_s}) is invalid: use 0 < cpu_util_below <= 1 and "
                "no_progress_for_s >= 0"
            )
        if self.min_cpu_samples < 1:
            raise InputError(f"min_cpu_samples={self.min_cpu_samples} must be >= 1")

    def is_hung(
        self, cpu_util_history: Sequence[float], last_progress_s: float, now_s: float
    ) -> bool:
        """``cpu_util_history``: the node's CPU utilisation samples over the recent window."""
        stalled = _elapsed(last_progress_s, now_s, "last_progress_s") >= self.no_progress_for_s
        if not stalled or len(cpu_util_history) < self.min_cpu_samples:
            return False
        return all(u < self.cpu_util_below for u in cpu_util_history)


DEFAULT_HEARTBEAT_POLICY = HeartbeatPolicy()
DEFAULT_HANG_POLICY = HangPolicy()


def is_dead(
    last_heartbeat_s: float, now_s: float, policy: HeartbeatPolicy = DEFAULT_HEARTBEAT_POLICY
) -> bool:
    return policy.is_dead(last_heartbeat_s, now_s)


def is_hung(
    cpu_util_history: Sequence[float],
    last_progress_s: float,
    now_s: float,
    policy: HangPolicy = DEFAULT_HANG_POLICY,
) -> bool:
    return policy.is_hung(cpu_util_history, last_progress_s, now_s)


def find_stragglers(
    worker_speeds: Mapping[int, float], ratio: float = 0.5, min_workers: int = 3
) -> list[int]:
    """Workers slower than ``ratio`` x the median speed of the *other* workers, sorted by id.

    Comparing with the others (not with a median that includes the worker itself) keeps one
    slow worker from dragging its own yardstick down. Fewer than ``min_workers`` workers give
    no verdict (an empty list): with two workers, which one is the straggler?
    """
    if not 0.0 < ratio <= 1.0:
        raise InputError(f"ratio={ratio} must be in (0, 1]: a straggler is slower than the rest")
    bad = {k: v for k, v in worker_speeds.items() if not math.isfinite(v) or v < 0}
    if bad:
        raise InputError(f"worker speeds {bad} must be finite samples/s >= 0")
    if len(worker_speeds) < max(2, min_workers):
        return []
    ids = list(worker_speeds)
    s = sorted(worker_speeds.values())
    n = len(s)

    def median_without(k: int) -> float:
        """Median of ``s`` with the element at sorted position ``k`` left out (O(1))."""

        def at(j: int) -> float:  # element j of s with position k removed
            return s[j] if j < k else s[j + 1]

        m = n - 1
        return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2

    pos: dict[float, int] = {}
    for k, v in enumerate(s):
        pos.setdefault(v, k)  # equal speeds share one yardstick: any of them left out
    return sorted(
        wid for wid in ids if worker_speeds[wid] < ratio * median_without(pos[worker_speeds[wid]])
    )
