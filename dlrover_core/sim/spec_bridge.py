"""A simulated job as the JobSpec a user would have written for it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from dlrover_core.sim.truth import ORACLE_MAX_PS
from dlrover_core.spec import JobSpec, parse_spec
from dlrover_core.units import format_cpu, format_memory

if TYPE_CHECKING:
    from dlrover_core.sim.policies import JobView


# The simulator emits one speed sample a minute; three of them stand for DLRover's five
# samples taken every few seconds.
SIM_PACING = {"min_speed_samples": 3}


def job_view_to_spec(view: JobView, **pacing: float) -> JobSpec:
    name = re.sub(r"[^a-z0-9_.-]+", "-", view.name.lower()).strip("-._") or "job"
    dim = view.embedding_dim
    data = {
        "name": name,
        "signature": {"pipeline": view.signature, "model": "sim", "dataset": "trace"},
        "model": {
            "embedding_dim": dim,
            "dense_features": view.dense_features,
            "dense_arch": [max(64, dim), dim],
            "embedding_tables": [
                {"name": f"c{i}", "num_embeddings": "dynamic"}
                for i in range(max(1, view.sparse_features))
            ],
        },
        "data": {"rows": view.rows},
        "training": {"batch_size": view.batch_size, "epochs": max(1, view.epochs)},
        # quantities with their unit: a bare memory number is bytes at the user boundary
        "quota": {
            "cpu": format_cpu(view.quota.cpu_millicores),
            "memory": format_memory(view.quota.memory_mib),
        },
        # up to the PS count the oracle may choose: at 15 (as before), a quarter of the jobs
        # had an oracle configuration of 16-32 PS that the planner could never reach
        "constraints": {"workers": {"min": 1, "max": 256}, "ps": {"min": 1, "max": ORACLE_MAX_PS}},
        "pacing": {**SIM_PACING, **pacing},
    }
    if view.strategy != "ps":
        data["strategy"] = view.strategy
    return parse_spec(data, source=f"simulated job {view.name!r}")
