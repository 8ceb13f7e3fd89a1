"""What a plan may be: the user's pins and min/max, the quota, the smallest node."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlrover_core.spec import MIN_NODE, JobSpec, RoleConstraints
from dlrover_core.types import ZERO, NodeResources, Role, RolePlan


@dataclass(frozen=True)
class RoleBounds:
    min_count: int
    max_count: int
    pinned_count: int | None
    pinned_cpu_millicores: int | None
    pinned_memory_mib: int | None
    max_cpu_millicores: int
    max_memory_mib: int

    @classmethod
    def from_constraints(cls, c: RoleConstraints, min_count: int, max_count: int) -> RoleBounds:
        return cls(
            min_count=min_count,
            max_count=max_count,
            pinned_count=c.count,
            pinned_cpu_millicores=c.cpu_millicores,
            pinned_memory_mib=c.memory_mib,
            max_cpu_millicores=c.max_cpu_millicores,
            max_memory_mib=c.max_memory_mib,
        )

    def count(self, n: int) -> int:
        if self.pinned_count is not None:
            return self.pinned_count
        return max(self.min_count, min(self.max_count, n))

    def cpu(self, millicores: int) -> int:
        if self.pinned_cpu_millicores is not None:
            return self.pinned_cpu_millicores
        return max(MIN_NODE.cpu_millicores, min(self.max_cpu_millicores, millicores))

    def memory(self, mib: int) -> int:
        if self.pinned_memory_mib is not None:
            return self.pinned_memory_mib
        return max(MIN_NODE.memory_mib, min(self.max_memory_mib, mib))

    def clamp(self, rp: RolePlan) -> RolePlan:
        r = rp.resources
        return RolePlan(
            self.count(rp.count),
            NodeResources(self.cpu(r.cpu_millicores), self.memory(r.memory_mib)),
        )

    @property
    def count_fixed(self) -> bool:
        return self.pinned_count is not None or self.min_count == self.max_count


@dataclass(frozen=True)
class JobBounds:
    workers: RoleBounds
    ps: RoleBounds
    quota: NodeResources

    @classmethod
    def from_spec(cls, spec: JobSpec) -> JobBounds:
        c = spec.constraints
        ps_max = max(c.ps.max, spec.min_ps) if spec.strategy_kind.has_ps else 0
        return cls(
            workers=RoleBounds.from_constraints(c.workers, max(c.workers.min, 1), c.workers.max),
            ps=RoleBounds.from_constraints(c.ps, spec.min_ps, ps_max),
            quota=spec.quota.resources,
        )

    def role(self, role: Role) -> RoleBounds:
        return self.workers if role is Role.WORKER else self.ps

    def over_quota(self, workers: RolePlan, ps: RolePlan) -> bool:
        """Whether ``workers`` + ``ps``, clamped to pins and bounds, exceed the quota: what
        :meth:`fit` must then shrink (its nodes made fewer or smaller)."""
        total = self.workers.clamp(workers).total + self.ps.clamp(ps).total
        return not total.fits_in(self.quota)

    def fit(self, workers: RolePlan, ps: RolePlan) -> tuple[RolePlan, RolePlan, list[str]]:
        """Clamp to pins and bounds, then shrink into the quota. Returns notes on what changed."""
        notes: list[str] = []
        w, p = self.workers.clamp(workers), self.ps.clamp(ps)
        if (w, p) != (workers, ps):
            notes.append("clamped to the spec's constraints (pins, min/max, max node size)")
        if (w.total + p.total).fits_in(self.quota):
            return w, p, notes
        # Too big: first fewer workers, then smaller nodes, keeping pinned values. Only the
        # dimension over the quota shrinks: memory under what the nodes use is an OOM, CPU
        # under it only slower, so a plan whose CPU alone is too much keeps its memory
        w = RolePlan(_most_that_fit(w, p.total, self.quota, self.workers.count(0)), w.resources)
        k_cpu = k_mem = 1.0
        for _ in range(40):
            total = w.total + p.total
            if total.fits_in(self.quota):
                break
            if total.cpu_millicores > self.quota.cpu_millicores:
                k_cpu *= 0.9
            if total.memory_mib > self.quota.memory_mib:
                k_mem *= 0.9
            w = self.workers.clamp(RolePlan(w.count, _scaled(workers.resources, k_cpu, k_mem)))
            p = self.ps.clamp(RolePlan(p.count, _scaled(ps.resources, k_cpu, k_mem)))
        if not (w.total + p.total).fits_in(self.quota):
            # 40 shrink steps were not enough (a request far above the quota): the smallest
            # nodes, pins kept; the spec's check guarantees the minimum job fits
            w = self.workers.clamp(RolePlan(w.count, ZERO))
            p = self.ps.clamp(RolePlan(p.count, ZERO))
        p = RolePlan(_most_that_fit(p, w.total, self.quota, self.ps.count(0)), p.resources)
        notes.append(f"shrunk to fit the quota ({self.quota})")
        return w, p, notes


def _most_that_fit(rp: RolePlan, other: NodeResources, quota: NodeResources, lo: int) -> int:
    """The largest count in [lo, rp.count] at which ``rp`` beside ``other`` fits in the quota
    (``lo`` when none does; ``rp.count`` when it is at or below ``lo``): what removing one
    node at a time until it fits gives, in closed form (totals are exact integer products)."""
    if rp.count <= lo:
        return rp.count
    n = rp.count
    for per, used, cap in (
        (rp.resources.cpu_millicores, other.cpu_millicores, quota.cpu_millicores),
        (rp.resources.memory_mib, other.memory_mib, quota.memory_mib),
    ):
        if per > 0:
            n = min(n, (cap - used) // per)
        elif used > cap:
            n = lo
    return max(lo, n)


def _scaled(r: NodeResources, k_cpu: float, k_mem: float) -> NodeResources:
    return NodeResources(int(r.cpu_millicores * k_cpu), int(r.memory_mib * k_mem))


def round_up_level(millicores: float, levels: tuple[int, ...]) -> int:
    """The smallest CPU level >= ``millicores`` (the largest level if none is)."""
    for lv in levels:
        if lv >= millicores - 1e-9:
            return lv
    return levels[-1]


def ceil_mib(x: float, step: int = 64) -> int:
    """Round memory up to a multiple of ``step`` MiB (allocators like round numbers)."""
    return int(math.ceil(max(x, 0.0) / step) * step)
