"""The all-reduce strategy's options: moved to :mod:`dlrover_core.allreduce_config` (pure
configuration belongs below the runtime; the planner reads it). This name stays only for
``allreduce/strategy.py`` and ``allreduce/agent.py`` (another change in progress); import from
:mod:`dlrover_core.allreduce_config`, then delete this module."""

from dlrover_core.allreduce_config import (
    ALL_SHARDING_TYPES,
    CPU_SHARDING_TYPES,
    CUDA_ONLY_SHARDING_TYPES,
    DYNAMIC_ROWS,
    RANK_RUNTIME_MIB,
    AllReduceOptions,
    embedding_mib_per_rank,
    table_mib,
    table_sharding_types,
    validate_allreduce,
)

__all__ = [
    "ALL_SHARDING_TYPES",
    "CPU_SHARDING_TYPES",
    "CUDA_ONLY_SHARDING_TYPES",
    "DYNAMIC_ROWS",
    "RANK_RUNTIME_MIB",
    "AllReduceOptions",
    "embedding_mib_per_rank",
    "table_mib",
    "table_sharding_types",
    "validate_allreduce",
]
