"""The all-reduce strategy's options and the checks the controller runs before any process
starts. Pure: no torch import, no IO (whether CUDA is there is an argument).

Sharding types, by torchrec's names. On CPU (gloo) four of torchrec's sharding types work
across processes (measured, ENVIRONMENT.md): ``table_wise``, ``column_wise``,
``table_column_wise``, ``data_parallel``; ``row_wise``, ``table_row_wise`` and ``grid_shard``
need CUDA (nccl).

:func:`validate_allreduce` returns nothing or raises one :class:`~dlrover_core.errors.InputError`
whose ``problems`` are one line each, naming the field and the fix:

- an unknown sharding type, or a CUDA-only one without CUDA;
- a sharding option for a table the model does not have;
- a table/sharding combination torchrec cannot run: the fused kernels (every type but
  ``data_parallel``) need ``embedding_dim`` to be a multiple of 4 (fbgemm's TBE);
- a world size outside ``constraints.workers`` [min, max], below 1, or one the tables cannot be
  spread over: the largest table shard, or the tables packed over the ranks, do not fit the
  memory of one rank (``rank_memory_mib``, when given);
- ``backend: nccl`` without CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from dlrover_core.errors import InputError
from dlrover_core.spec import JobSpec
from dlrover_core.units import mib_from_bytes

__all__ = [
    "ALL_SHARDING_TYPES",
    "CPU_SHARDING_TYPES",
    "CUDA_ONLY_SHARDING_TYPES",
    "RANK_RUNTIME_MIB",
    "AllReduceOptions",
    "embedding_mib_per_rank",
    "table_mib",
    "validate_allreduce",
]

CPU_SHARDING_TYPES: tuple[str, ...] = (
    "table_wise",
    "column_wise",
    "table_column_wise",
    "data_parallel",
)
CUDA_ONLY_SHARDING_TYPES: tuple[str, ...] = ("row_wise", "table_row_wise", "grid_shard")
ALL_SHARDING_TYPES = CPU_SHARDING_TYPES + CUDA_ONLY_SHARDING_TYPES
_FUSED = frozenset(ALL_SHARDING_TYPES) - {"data_parallel"}

RANK_RUNTIME_MIB = 600
"""Memory a rank needs besides its embedding shards: torch + torchrec + fbgemm loaded, the
dense tower, a batch and gloo buffers (a 2-rank run of small-allreduce measured 450-550 MiB RSS
per rank with 0.3 MiB of tables)."""

_ROW_BYTES_PER_ELEMENT = 4  # float32 weights
DYNAMIC_ROWS = 100_003
"""Rows a dynamic table gets in the trainer: :data:`dlrover_core.training.model.DYNAMIC_ROWS`,
repeated here so this module needs no torch (a test keeps the two equal)."""


@dataclass(frozen=True)
class AllReduceOptions:
    """How the ranks shard and talk. ``sharding``: the sharding types the torchrec planner
    may choose from, for every table (``sharding_by_table`` overrides per table).
    ``backend``: ``auto`` is nccl with CUDA, gloo without. ``checkpoint_interval_s``: seconds
    between DCP checkpoints (a shard is reported done only once a checkpoint holding its
    updates is complete, so this is also the granularity of done shards)."""

    sharding: tuple[str, ...] = CPU_SHARDING_TYPES
    sharding_by_table: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    checkpoint_interval_s: float = 10.0
    keep_checkpoints: int = 2

    @classmethod
    def from_spec(cls, spec: JobSpec) -> AllReduceOptions:
        """The spec's ``allreduce:`` section."""
        a = spec.allreduce
        return cls(
            sharding=tuple(a.sharding) if a.sharding else CPU_SHARDING_TYPES,
            sharding_by_table={t: tuple(v) for t, v in a.table_sharding.items()},
            backend=a.backend,
            checkpoint_interval_s=float(a.checkpoint_interval_s),
            keep_checkpoints=int(a.keep_checkpoints),
        )

    def types_for(self, table: str) -> tuple[str, ...]:
        return tuple(self.sharding_by_table.get(table, self.sharding))

    def resolved_backend(self, cuda_available: bool) -> str:
        if self.backend == "auto":
            return "nccl" if cuda_available else "gloo"
        return self.backend

    def to_argv(self) -> list[str]:
        """The agent's command-line flags for these options."""
        out = ["--sharding", ",".join(self.sharding), "--backend", self.backend]
        for t, types in sorted(self.sharding_by_table.items()):
            out += ["--table-sharding", f"{t}={','.join(types)}"]
        out += ["--checkpoint-interval-s", f"{self.checkpoint_interval_s:g}"]
        out += ["--keep-checkpoints", str(self.keep_checkpoints)]
        return out

    @classmethod
    def parse(
        cls,
        sharding: str | None = None,
        table_sharding: Sequence[str] = (),
        backend: str = "auto",
        checkpoint_interval_s: float = 10.0,
        keep_checkpoints: int = 2,
    ) -> AllReduceOptions:
        """From the agent's flags (``table_sharding``: ``TABLE=type[,type]`` items)."""
        problems: list[str] = []
        by_table: dict[str, tuple[str, ...]] = {}
        for item in table_sharding:
            name, sep, types = item.partition("=")
            if not sep or not name or not types:
                problems.append(
                    f"--table-sharding {item!r}: write it as TABLE=type[,type] "
                    "(e.g. t0=table_wise,column_wise)"
                )
                continue
            by_table[name] = _split(types)
        if backend not in ("auto", "gloo", "nccl"):
            problems.append(f"--backend {backend!r}: use auto, gloo or nccl")
        if checkpoint_interval_s <= 0:
            problems.append(f"--checkpoint-interval-s {checkpoint_interval_s:g} must be > 0")
        if keep_checkpoints < 1:
            problems.append(f"--keep-checkpoints {keep_checkpoints} must be >= 1")
        if problems:
            raise InputError("invalid all-reduce options:", problems=problems)
        opts = cls(backend=backend, checkpoint_interval_s=checkpoint_interval_s)  # type: ignore[arg-type]
        if sharding:
            opts = replace(opts, sharding=_split(sharding))
        return replace(opts, sharding_by_table=by_table, keep_checkpoints=keep_checkpoints)


def _split(types: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in types.split(",") if t.strip())


def table_mib(spec: JobSpec) -> dict[str, float]:
    """Weights plus optimizer state of each table, MiB (a dynamic table counts with the rows
    the trainer gives it, :data:`~dlrover_core.training.model.DYNAMIC_ROWS`)."""
    slots = spec.training.optimizer.slots
    out = {}
    for t in spec.model.embedding_tables:
        rows = t.num_embeddings if isinstance(t.num_embeddings, int) else DYNAMIC_ROWS
        out[t.name] = mib_from_bytes(
            rows * spec.model.table_dim(t) * _ROW_BYTES_PER_ELEMENT * (1 + slots)
        )
    return out


def embedding_mib_per_rank(
    spec: JobSpec, world_size: int, options: AllReduceOptions | None = None
) -> float:
    """The most embedding MiB one rank holds at ``world_size`` when the tables are spread as
    well as the allowed sharding types permit: data-parallel-only tables on every rank, the
    others packed largest first onto the least loaded rank (column-wise tables split into
    ``world_size`` column blocks when the dimension allows, as the planner can)."""
    if world_size < 1:
        raise InputError(f"world size must be >= 1, got {world_size}")
    opts = options or AllReduceOptions()
    loads = [0.0] * world_size
    replicated = 0.0
    sizes = table_mib(spec)
    pieces: list[float] = []
    for t in spec.model.embedding_tables:
        mib = sizes[t.name]
        types = set(opts.types_for(t.name))
        if types <= {"data_parallel"}:
            replicated += mib
        elif types & {"column_wise", "table_column_wise", "row_wise", "table_row_wise"}:
            blocks = max(1, min(world_size, spec.model.table_dim(t) // 4))
            pieces += [mib / blocks] * blocks
        else:
            pieces.append(mib)
    for p in sorted(pieces, reverse=True):
        i = loads.index(min(loads))
        loads[i] += p
    return max(loads) + replicated


def table_sharding_types(
    spec: JobSpec, table: str, options: AllReduceOptions | None = None
) -> tuple[str, ...]:
    """The sharding types torchrec may use for ``table``: the options', less the fused ones
    when its dimension is not a multiple of 4 (fbgemm's kernels would assert)."""
    opts = options or AllReduceOptions()
    types = opts.types_for(table)
    t = next((x for x in spec.model.embedding_tables if x.name == table), None)
    if t is not None and spec.model.table_dim(t) % 4:
        types = tuple(st for st in types if st not in _FUSED)
    return types


def validate_allreduce(
    spec: JobSpec,
    world_size: int,
    options: AllReduceOptions | None = None,
    *,
    cuda_available: bool = False,
    rank_memory_mib: int | None = None,
) -> None:
    """Raise one :class:`InputError` listing every reason ``spec`` cannot run as an all-reduce
    job of ``world_size`` ranks (see the module docstring); return None when it can."""
    opts = options or AllReduceOptions()
    problems: list[str] = []
    if spec.strategy != "allreduce":
        problems.append(
            f"strategy is {spec.strategy!r}: set strategy: allreduce to run this job with ranks"
        )
    backend = opts.resolved_backend(cuda_available)
    if opts.backend not in ("auto", "gloo", "nccl"):
        problems.append(f"backend {opts.backend!r} is unknown: use auto, gloo or nccl")
    elif backend == "nccl" and not cuda_available:
        problems.append(
            "backend nccl needs CUDA, and no CUDA device is available: use backend gloo (or "
            "auto), or run the ranks on GPU nodes"
        )
    names = {t.name for t in spec.model.embedding_tables}
    for t in sorted(set(opts.sharding_by_table) - names):
        problems.append(
            f"sharding for table {t!r}: the model has no such table "
            f"(tables: {', '.join(sorted(names))}); fix the name or drop the entry"
        )
    gpu = backend == "nccl" and cuda_available
    allowed = ALL_SHARDING_TYPES if gpu else CPU_SHARDING_TYPES
    seen_bad: set[str] = set()
    labelled: list[tuple[str, tuple[str, ...]]] = [("sharding", opts.sharding)] + [
        (f"sharding for table {name!r}", v) for name, v in sorted(opts.sharding_by_table.items())
    ]
    for label, types in labelled:
        if not types:
            problems.append(f"{label}: is empty; give at least one of {', '.join(allowed)}")
        for st in types:
            if st in seen_bad:
                continue
            if st not in ALL_SHARDING_TYPES:
                seen_bad.add(st)
                problems.append(
                    f"{label}: {st!r} is not a torchrec sharding type; use {', '.join(allowed)}"
                )
            elif st not in allowed:
                seen_bad.add(st)
                problems.append(
                    f"{label}: {st} needs CUDA (nccl) and this job runs on CPU (gloo); use "
                    f"{', '.join(CPU_SHARDING_TYPES)}"
                )
    for table in spec.model.embedding_tables:
        usable = [st for st in opts.types_for(table.name) if st in allowed]
        if not usable:
            continue
        dim = spec.model.table_dim(table)
        if dim % 4 and not set(usable) - _FUSED:
            problems.append(
                f"table {table.name!r}: embedding_dim {dim} is not a multiple of 4, which "
                f"{', '.join(usable)} need (fbgemm's fused kernel); use a dimension divisible by 4 "
                "or allow data_parallel for it"
            )
    w = spec.constraints.workers
    if world_size < 1:
        problems.append(f"world size {world_size}: an all-reduce job needs at least 1 rank")
    elif not w.min <= world_size <= w.max:
        problems.append(
            f"world size {world_size} is outside constraints.workers [min, max] = "
            f"[{w.min}, {w.max}]; plan a size inside it or widen the bounds"
        )
    if not problems and rank_memory_mib is not None:
        need = embedding_mib_per_rank(spec, world_size, opts) + RANK_RUNTIME_MIB
        if need > rank_memory_mib:
            fits = _ranks_that_fit(spec, opts, rank_memory_mib, limit=max(world_size, w.max))
            more = (
                f"raise the world size to {fits}"
                if fits is not None
                else "the tables cannot be spread further"
            )
            problems.append(
                f"world size {world_size}: the embedding tables need {need:.0f} MiB on one rank "
                f"(shards + {RANK_RUNTIME_MIB} MiB runtime) but a rank has {rank_memory_mib} "
                f"MiB; raise constraints.workers.memory, {more}, or allow column_wise sharding"
            )
    if problems:
        raise InputError(
            f"job {spec.name!r} cannot run as an all-reduce job of {world_size} rank(s):",
            problems=problems,
        )


def _ranks_that_fit(
    spec: JobSpec, opts: AllReduceOptions, rank_memory_mib: int, limit: int
) -> int | None:
    for n in range(1, max(limit, 1) + 1):
        if embedding_mib_per_rank(spec, n, opts) + RANK_RUNTIME_MIB <= rank_memory_mib:
            return n
    return None
