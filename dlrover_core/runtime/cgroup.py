"""Sizing honesty on one pod: when the whole job runs inside one container (the local backend
in a KFP task, an Airflow pod, a `docker run --cpus`), its nodes share that container's cgroup.
A quota above the cgroup's ``cpu.max`` / ``memory.max`` would be planned but never given: CPU
throttling would corrupt the planner's speed samples, or the kernel would OOM-kill the master
with its nodes. :func:`read_limits` reads the limits (cgroup v2, else v1);
:func:`clamp_quota` lowers the quota to them, less the master's own share."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from dlrover_core.errors import InputError
from dlrover_core.types import NodeResources
from dlrover_core.units import BYTES_PER_MIB, MILLICORES_PER_CORE, format_cpu, format_memory

log = logging.getLogger("dlrover_rm.master")

CGROUP_ROOT = Path("/sys/fs/cgroup")
# what the master itself (gRPC server, shard queue, planner) needs beside the nodes
MASTER_SHARE = NodeResources(500, 1024)
_UNLIMITED_BYTES = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2^63 - 1


@dataclass(frozen=True)
class CgroupLimits:
    """The container's limits: ``None`` where there is none (``max``, or no cgroup file)."""

    cpu_millicores: int | None
    memory_mib: int | None
    source: str  # the files they were read from, for the message

    @property
    def any(self) -> bool:
        return self.cpu_millicores is not None or self.memory_mib is not None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_limits(root: Path = CGROUP_ROOT) -> CgroupLimits:
    """The CPU and memory limits of this process's container. cgroup v2 (``cpu.max``:
    ``"quota period"`` or ``"max period"``; ``memory.max``: bytes or ``max``) at ``root``;
    else cgroup v1 (``cpu/cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, -1 for none;
    ``memory/memory.limit_in_bytes``, a huge number for none). Unreadable or malformed files
    count as no limit."""
    cpu: int | None = None
    mem: int | None = None
    v2_cpu, v2_mem = _read(root / "cpu.max"), _read(root / "memory.max")
    if v2_cpu is not None or v2_mem is not None:
        if v2_cpu:
            quota, _, period = v2_cpu.partition(" ")
            if quota != "max" and quota.isdigit() and period.isdigit() and int(period) > 0:
                cpu = int(quota) * MILLICORES_PER_CORE // int(period)
        if v2_mem and v2_mem.isdigit():
            mem = int(v2_mem) // BYTES_PER_MIB
        return CgroupLimits(cpu, mem, f"{root / 'cpu.max'}, {root / 'memory.max'}")
    q, p = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if q and p and q.lstrip("-").isdigit() and p.isdigit() and int(q) > 0 and int(p) > 0:
        cpu = int(q) * MILLICORES_PER_CORE // int(p)
    m = _read(root / "memory" / "memory.limit_in_bytes")
    if m and m.isdigit() and int(m) < _UNLIMITED_BYTES:
        mem = int(m) // BYTES_PER_MIB
    return CgroupLimits(cpu, mem, f"{root / 'cpu'}, {root / 'memory'} (cgroup v1)")


def clamp_quota(
    quota: NodeResources,
    limits: CgroupLimits,
    minimum_job: NodeResources,
    master: NodeResources = MASTER_SHARE,
) -> tuple[NodeResources, str | None]:
    """The quota the nodes can really have in this container: each dimension at most the
    cgroup's limit less the master's share. Returns the quota and a one-line note when it was
    lowered (None when it fits). Raises :class:`InputError` naming the limit when not even the
    job's minimum fits."""
    cpu, mem = quota.cpu_millicores, quota.memory_mib
    if limits.cpu_millicores is not None:
        cpu = min(cpu, limits.cpu_millicores - master.cpu_millicores)
    if limits.memory_mib is not None:
        mem = min(mem, limits.memory_mib - master.memory_mib)
    clamped = NodeResources(cpu, mem)
    if clamped == quota:
        return quota, None
    if not minimum_job.fits_in(clamped):
        raise InputError(
            f"this container's cgroup limits ({describe(limits)}, from {limits.source}) leave "
            f"{clamped} for the nodes after the master's {master}, less than the job's minimum "
            f"{minimum_job}: give the pod at least the quota plus {master}, or lower quota / "
            "constraints.*.min"
        )
    note = (
        f"quota {quota} clamped to {clamped}: the container allows {describe(limits)} and the "
        f"master keeps {master}"
    )
    return clamped, note


def describe(limits: CgroupLimits) -> str:
    cpu = (
        "no CPU limit"
        if limits.cpu_millicores is None
        else f"{format_cpu(limits.cpu_millicores)} CPU"
    )
    mem = "no memory limit" if limits.memory_mib is None else format_memory(limits.memory_mib)
    return f"{cpu}, {mem}"


# --- CPU quotas for local nodes (what Kubernetes gives a pod's CPU limit) -------------------

CFS_PERIOD_US = 100_000


class CpuQuotas:
    """A CFS quota per local node: a cgroup ``<root>/<prefix>/<node>`` whose
    ``cpu.cfs_quota_us`` (v1) or ``cpu.max`` (v2) is the node's cores × the period, as a
    pod's CPU limit is on Kubernetes, so 0.5 CPU is half a core of time, not a whole pinned
    CPU. Needs a writable cgroup ``cpu`` controller (root, or a delegated subtree):
    :meth:`open` returns None where there is none. A node's process is moved in right after
    it starts (before it starts any child of its own); its cgroup is removed once it ended."""

    def __init__(self, base: Path, v2: bool) -> None:
        self.base = base
        self.v2 = v2
        self._made: set[Path] = set()

    @classmethod
    def open(cls, prefix: str, root: Path = CGROUP_ROOT) -> CpuQuotas | None:
        candidates = [(root / "cpu", False), (root, True), (root / "unified", True)]
        for path, v2 in candidates:
            probe = path / ("cpu.max" if v2 else "cpu.cfs_quota_us")
            if v2 and "cpu" not in (_read(path / "cgroup.subtree_control") or "").split():
                continue
            if not probe.exists():
                continue
            base = path / prefix
            try:
                base.mkdir(parents=True, exist_ok=True)
                if v2:  # children of base may use the cpu controller
                    (base / "cgroup.subtree_control").write_text("+cpu")
            except OSError as e:
                log.debug("no CPU quotas under %s: %s", path, e)
                continue
            return cls(base, v2)
        return None

    def place(self, name: str, pid: int, cores: float) -> bool:
        """Move ``pid`` into the cgroup of ``name`` limited to ``cores`` (0: no limit)."""
        group = self.base / name
        try:
            group.mkdir(exist_ok=True)
            self._made.add(group)
            self.set(name, cores)
            (group / "cgroup.procs").write_text(str(pid))
        except OSError as e:
            log.warning("could not limit %s to %.2f CPU: %s", name, cores, e)
            return False
        return True

    def set(self, name: str, cores: float) -> None:
        """The quota of ``name``'s cgroup: ``cores`` of CPU time per period (0: none)."""
        group = self.base / name
        quota = round(cores * CFS_PERIOD_US) if cores > 0 else -1
        if self.v2:
            (group / "cpu.max").write_text(f"{quota if quota > 0 else 'max'} {CFS_PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))

    def remove(self, name: str) -> None:
        """Remove ``name``'s cgroup (its processes have ended; a live one keeps it)."""
        group = self.base / name
        with contextlib.suppress(OSError):
            group.rmdir()
            self._made.discard(group)

    def close(self) -> None:
        """Remove every cgroup made (those whose processes ended) and the base if empty."""
        for group in list(self._made):
            self.remove(group.name)
        with contextlib.suppress(OSError):
            self.base.rmdir()
