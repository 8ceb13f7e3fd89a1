"""Memory per node from the memory models: before the job (from the spec) and while it runs
(from observed distinct-ID growth, extrapolated to the end of training)."""

from __future__ import annotations

from collections.abc import Sequence

from dlrover_core.errors import DLRoverError
from dlrover_core.model.memory import IdGrowthModel, PSMemoryModel, WorkerMemoryModel
from dlrover_core.spec import JobSpec
from dlrover_core.types import Observation, Role

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


def id_growth_from(observations: Sequence[Observation]) -> IdGrowthModel | None:
    pts = [
        (o.samples_done, o.distinct_ids)
        for o in observations
        if o.distinct_ids is not None and o.samples_done > 0 and o.distinct_ids > 0
    ]
    if len({n for n, _ in pts}) < 2:
        return None
    try:
        return IdGrowthModel().fit([float(n) for n, _ in pts], [float(u) for _, u in pts])
    except DLRoverError:
        return None


def ps_memory_per_node_mib(
    spec: JobSpec,
    num_ps: int,
    observations: Sequence[Observation] = (),
    margin: float = 1.2,
) -> float:
    """Memory each PS needs at the end of training, with margin."""
    model = ps_memory_model(spec)
    growth = id_growth_from(observations)
    if growth is not None:
        ids_end = float(growth.predict(float(spec.samples_total)))
    else:
        ids_end = expected_distinct_ids(spec)
    need = model.per_ps_mib(ids_end, max(num_ps, 1), imbalance=_imbalance(observations))
    # Never below what the busiest PS already uses (covers what the formula misses).
    used = max((n.memory_used_mib for o in observations[-3:] for n in o.of(Role.PS)), default=0)
    return max(need, used) * margin


def _imbalance(observations: Sequence[Observation]) -> float:
    if not observations:
        return 1.0
    used = [n.memory_used_mib for n in observations[-1].of(Role.PS)]
    if len(used) < 2 or sum(used) <= 0:
        return 1.0
    return max(1.0, max(used) / (sum(used) / len(used)))


def worker_memory_mib(
    spec: JobSpec, observations: Sequence[Observation] = (), margin: float = 1.5
) -> int:
    used = [n.memory_used_mib for o in observations for n in o.of(Role.WORKER)]
    if used:
        return WorkerMemoryModel(margin=margin, floor_mib=512).fit(used).predict()
    batch_mib = spec.training.batch_size * (spec.model.dense_features + 4 * 26) * 4 / 2**20
    return int(WORKER_BASE_MIB + 64 * batch_mib)
