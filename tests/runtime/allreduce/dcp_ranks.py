"""A helper process for the resharded-load test: one rank that builds the all-reduce trainer at
WORLD_SIZE ranks, trains a few steps and saves (``save``) or loads (``load``) a DCP checkpoint,
then dumps every tensor piece it holds (weights and optimizer state, with global offsets) to
``DUMP_DIR/rank{R}.npz``. Run by tests/runtime/allreduce/test_allreduce_dcp.py."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dlrover_core.allreduce_config import AllReduceOptions
from dlrover_core.runtime.strategies.allreduce.checkpoint import load_into, save_collective
from dlrover_core.runtime.strategies.allreduce.trainer import RankTrainer
from dlrover_core.spec import load_spec
from tests.factories import make_spec_dict

SPEC = make_spec_dict(
    strategy="allreduce",
    data__rows=4096,
    training__batch_size=128,
    model__embedding_tables=[{"name": f"t{i}", "num_embeddings": 300 + 50 * i} for i in range(3)],
)


def pieces(state: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """Every tensor as ``name@row,col`` -> local values (ShardedTensors: one per shard)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out: dict[str, np.ndarray] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(pieces(v, f"{prefix}{k}/"))
    elif isinstance(state, ShardedTensor):
        for sh in state.local_shards():
            off = ",".join(map(str, sh.metadata.shard_offsets))
            out[f"{prefix[:-1]}@{off}"] = sh.tensor.detach().numpy().copy()
    elif isinstance(state, torch.Tensor):
        out[f"{prefix[:-1]}@full"] = state.detach().numpy().copy()
    return out


def main() -> None:
    mode, ckpt, dump, sharding = sys.argv[1:5]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['RDZV']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    t = RankTrainer(load_spec(SPEC), AllReduceOptions(sharding=(sharding,)))
    t.train_rows([(0, 1024)])
    if mode == "save":
        save_collective(t.state_dict(), Path(ckpt), None)
    else:
        state = t.state_dict()
        load_into(state, Path(ckpt))
        t.load_state(state)
    np.savez(Path(dump) / f"rank{rank}.npz", **pieces(t.state_dict()))
    print("PLAN", t.plan_summary, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
