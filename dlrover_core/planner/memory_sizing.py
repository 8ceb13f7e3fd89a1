"""Memory per node from the memory models: before the job (from the spec) and while it runs
(from observed distinct-ID growth, extrapolated to the end of training)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dlrover_core.model.memory import IdGrowthModel, PSMemoryModel, WorkerMemoryModel
from dlrover_core.spec import JobSpec
from dlrover_core.types import NodeState, Observation, Role
from dlrover_core.units import mib_from_bytes

WORKER_BASE_MIB = 1024  # a worker process with torch loaded and a few batches in flight


def ps_memory_model(spec: JobSpec) -> PSMemoryModel:
    return PSMemoryModel(
        spec.model.embedding_dim,
        optimizer_slots=spec.training.optimizer.slots,
        dense_params=spec.model.dense_params,
    )


def expected_distinct_ids(spec: JobSpec) -> float:
    """Distinct embedding rows at the end of training, before any observation: static tables
    hold their rows; a dynamic table gets a fresh ID at ``new_id_rate`` per sample plus a
    head of frequent IDs."""
    total = 0.0
    n = spec.samples_total
    for t in spec.model.embedding_tables:
        if t.num_embeddings == "dynamic":
            total += 1000.0 + spec.data.ids.new_id_rate * n
        else:
            total += float(t.num_embeddings)
    return total


@dataclass(frozen=True)
class ObservedMemory:
    """What the memory fits read from one observation (computed once per observation: a
    planner re-fits on a sliding window, so each observation is summarised once, not once per
    call)."""

    samples_done: int
    samples_total: int
    distinct_ids: int | None
    ps_used_mib: tuple[int, ...]  # running PS, in node order
    worker_used_max_mib: int | None  # running workers' largest use (None: no worker running)
    worker_used_min_mib: int | None
    # every running PS had run ``settle_s`` (see ``of``): its memory is its rows', not a
    # checkpoint restore's half-way mark; only such observations fit the growth
    ps_settled: bool = True

    @classmethod
    def of(cls, o: Observation, settle_s: float = 0.0) -> ObservedMemory:
        """``settle_s``: a PS (re)started less than this before ``o`` is still starting (a
        resumed or relaunched PS restores its checkpoint: memory and IDs climb to where they
        were, which is not growth)."""
        ps: list[int] = []
        w: list[int] = []
        for n in o.nodes:
            if n.state is NodeState.RUNNING:
                if n.role is Role.PS:
                    ps.append(n.memory_used_mib)
                elif n.role is Role.WORKER:
                    w.append(n.memory_used_mib)
        return cls(
            o.samples_done,
            o.samples_total,
            o.distinct_ids,
            tuple(ps),
            max(w) if w else None,
            min(w) if w else None,
            o.settled(settle_s, Role.PS),
        )


def _summaries(
    observations: Sequence[Observation] | Sequence[ObservedMemory], settle_s: float = 0.0
) -> list[ObservedMemory]:
    return [
        o if isinstance(o, ObservedMemory) else ObservedMemory.of(o, settle_s) for o in observations
    ]


def id_growth_from(
    observations: Sequence[Observation] | Sequence[ObservedMemory],
) -> IdGrowthModel | None:
    ns: list[float] = []
    us: list[float] = []
    for o in _summaries(observations):
        if (
            o.distinct_ids is not None
            and o.samples_done > 0
            and o.distinct_ids > 0
            and o.ps_settled
        ):
            ns.append(float(o.samples_done))
            us.append(float(o.distinct_ids))
    if len(set(ns)) < IdGrowthModel.min_points:
        return None
    # whole counts > 0 at >= 2 distinct points: what IdGrowthModel.fit checks holds
    return IdGrowthModel()._fit_checked(
        np.asarray(ns, dtype=np.float64), np.asarray(us, dtype=np.float64)
    )


@dataclass(frozen=True)
class PSMemoryFit:
    """PS memory as ``fixed_per_ps + imbalance · mib_per_row · U / p`` (MiB, busiest PS), with
    U the distinct embedding rows. Fitted from observations when they show growth, else the
    spec's formula calibrated so that it matches what the PS use now."""

    fixed_per_ps_mib: float
    mib_per_row: float
    imbalance: float
    ids_now: float
    ids_end: float
    growth: IdGrowthModel | None
    source: str

    def per_ps_mib(self, num_ps: int, ids: float | None = None) -> float:
        u = self.ids_end if ids is None else ids
        return self.fixed_per_ps_mib + self.imbalance * self.mib_per_row * u / max(num_ps, 1)

    def oom_at_samples(self, num_ps: int, limit_mib: float) -> float | None:
        """Samples done at which the busiest PS reaches ``limit_mib`` (None: unknown/never)."""
        room = limit_mib - self.fixed_per_ps_mib
        if self.growth is None or self.mib_per_row <= 0 or room <= 0:
            return None
        ids = room * num_ps / (self.imbalance * self.mib_per_row)
        return float(self.growth.samples_for(ids))


def _ps_nodes_over_time(
    observations: Sequence[ObservedMemory],
) -> list[tuple[float, tuple[int, ...]]]:
    """(distinct IDs, per-PS memory used) of the settled observations with the latest
    settled PS count."""
    settled = [o for o in observations if o.ps_settled]
    if not settled:
        return []
    p_now = len(settled[-1].ps_used_mib)
    return [
        (float(o.distinct_ids), o.ps_used_mib)
        for o in settled
        if o.distinct_ids is not None and len(o.ps_used_mib) == p_now and p_now > 0
    ]


def fit_ps_memory(
    spec: JobSpec,
    observations: Sequence[Observation] | Sequence[ObservedMemory] = (),
    settle_s: float = 0.0,
) -> PSMemoryFit:
    """``observations`` may be given as their :class:`ObservedMemory` summaries (then
    ``settle_s`` is theirs, see :meth:`ObservedMemory.of`)."""
    observations = _summaries(observations, settle_s)
    model = ps_memory_model(spec)
    growth = id_growth_from(observations)
    total = observations[-1].samples_total if observations else 0
    total = total or spec.samples_total
    ids_end = (
        float(growth.predict(float(total))) if growth is not None else expected_distinct_ids(spec)
    )
    mib_per_row = mib_from_bytes(model.bytes_per_row)
    pts = _ps_nodes_over_time(observations)
    if not pts:
        data_per_ps = mib_from_bytes(model.dense_bytes)
        return PSMemoryFit(
            model.runtime_overhead_mib + data_per_ps, mib_per_row, 1.0, 0.0, ids_end, growth,
            "spec formula",
        )  # fmt: skip
    p_now = len(pts[-1][1])
    totals = [float(sum(u)) for _, u in pts]
    ids = [i for i, _ in pts]
    source = "spec formula, calibrated to current use"
    if len(set(ids)) >= 3:
        # least-squares line through (ids, totals): its slope, in closed form
        im, tm = sum(ids) / len(ids), sum(totals) / len(totals)
        sxx = sum((i - im) ** 2 for i in ids)
        slope = sum((i - im) * (t - tm) for i, t in zip(ids, totals, strict=True)) / sxx
        if slope > 0:
            mib_per_row = float(slope)
            source = f"fitted on {len(pts)} observations"
    ids_now, used_now = pts[-1]
    mean_used = sum(used_now) / p_now
    variable_mean = mib_per_row * ids_now / p_now
    fixed = max(0.0, mean_used - variable_mean)
    imbalance = 1.0
    if variable_mean > 0:
        imbalance = max(1.0, (max(used_now) - fixed) / variable_mean)
    return PSMemoryFit(fixed, mib_per_row, imbalance, ids_now, ids_end, growth, source)


def ps_memory_per_node_mib(
    spec: JobSpec,
    num_ps: int,
    observations: Sequence[Observation] = (),
    margin: float = 1.2,
) -> float:
    """Memory each PS needs at the end of training, with margin."""
    return ps_memory_from_fit(fit_ps_memory(spec, observations), num_ps, observations, margin)


def ps_memory_from_fit(
    fit: PSMemoryFit,
    num_ps: int,
    observations: Sequence[Observation] | Sequence[ObservedMemory] = (),
    margin: float = 1.2,
) -> float:
    """As :func:`ps_memory_per_node_mib`, for a fit already made (fit once, size many)."""
    need = fit.per_ps_mib(num_ps)
    if observations:
        last = observations[-1]
        used = (
            last.ps_used_mib
            if isinstance(last, ObservedMemory)
            else tuple(n.memory_used_mib for n in last.of(Role.PS))
        )
        if len(used) == num_ps and used:
            # never below what the busiest PS already uses
            need = max(need, max(used))
        elif 0 < num_ps < len(used):
            # fewer PS: the fit counts the dense parameters in its per-PS fixed part, but they
            # are sharded too. What every PS holds now, spread over fewer, plus the growth
            # still to come bounds it (issue 10: 2 PS -> 1 sized 4672 MiB, and it OOMed)
            grow = fit.imbalance * fit.mib_per_row * max(0.0, fit.ids_end - fit.ids_now)
            need = max(need, (sum(used) + grow) / num_ps)
    return need * margin


def worker_memory_mib(
    spec: JobSpec,
    observations: Sequence[Observation] | Sequence[ObservedMemory] = (),
    margin: float = 1.5,
) -> int:
    sums = [o for o in _summaries(observations) if o.worker_used_max_mib is not None]
    if sums:
        # the model keeps the largest use: fit it on that one value once all are valid
        # (the list of bad values only to name them)
        lo = min(o.worker_used_min_mib for o in sums if o.worker_used_min_mib is not None)
        hi = max(o.worker_used_max_mib for o in sums if o.worker_used_max_mib is not None)
        return (
            WorkerMemoryModel(margin=margin, floor_mib=512).fit([hi] if lo >= 0 else [lo]).predict()
        )
    batch_mib = mib_from_bytes(spec.training.batch_size * (spec.model.dense_features + 4 * 26) * 4)
    return int(WORKER_BASE_MIB + 64 * batch_mib)
