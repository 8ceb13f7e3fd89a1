"""The model an all-reduce run trained, read for export: its latest complete DCP checkpoint,
every table in full, addressed ``raw_id % rows`` as the ranks trained it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dlrover_core.runtime.strategies.allreduce.agent import CKPT_DIR
from dlrover_core.runtime.strategies.allreduce.checkpoint import CheckpointStore, load_local_model
from dlrover_core.spec import JobSpec
from dlrover_core.training.export import ExportError


def read_model(
    spec: JobSpec, rd: Path
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]], list[dict[str, Any]]]:
    """The latest complete DCP checkpoint of an all-reduce run, in the export layout: every
    table written in full, addressed ``raw_id % rows`` as the ranks trained it."""
    root = rd / CKPT_DIR
    latest = CheckpointStore(root).latest()
    if latest is None:
        raise ExportError(
            f"no complete all-reduce checkpoint under {root}; resume the run to finish it"
        )
    try:
        model = load_local_model(spec, latest.path)
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        raise ExportError(f"the checkpoint {latest.path} cannot be loaded ({e})") from None
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    layout = []
    for t, rows in zip(spec.model.embedding_tables, model.rows, strict=True):
        layout.append(
            {
                "name": t.name,
                "dim": spec.model.table_dim(t),
                "num_embeddings": t.num_embeddings,
                "modulo": int(rows),
                "layout": "full",
                "rows": int(rows),
            }
        )
    m = latest.meta
    sources = [
        {"path": str(latest.path), "step": m.global_step, "seq": m.seq, "world_size": m.world_size}
    ]
    return tensors, layout, sources
