"""The exactly-once bookkeeping against a real master service, without torch processes: a
checkpoint's shards re-reported by the next generation's rank 0 (as the node and take that
trained them) count once, whether or not the crashed generation reported them first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover_core.runtime import wire
from dlrover_core.runtime.master_client import MasterClient
from dlrover_core.runtime.service import serve_master
from dlrover_core.runtime.state import MasterState
from dlrover_core.runtime.strategies.allreduce.agent import RankAgent, RankArgs
from dlrover_core.runtime.strategies.allreduce.checkpoint import ShardRecord
from dlrover_core.types import NodeState, Role


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[MasterState, str, str]]:
    token = wire.create_token(tmp_path)
    state = MasterState(tmp_path, total_rows=1000, shard_size=100, synchronous="NORMAL")
    server, port = serve_master(state, token)
    yield state, f"127.0.0.1:{port}", token
    server.stop(0)
    state.close()


def rank0(tmp_path: Path, address: str, token: str, node_id: int) -> RankAgent:
    agent = RankAgent(RankArgs(tmp_path, address, node_id, 0, 1, node_id, "127.0.0.1:1"))
    agent._client = MasterClient(address, token)
    agent.client.register(Role.WORKER, node_id, None, 0)
    return agent


def test_rereported_checkpoint_shards_count_once(
    tmp_path: Path, master: tuple[MasterState, str, str]
) -> None:
    state, address, token = master
    old = rank0(tmp_path, address, token, node_id=0)
    taken = [old.client.get_shard().shard for _ in range(3)]
    recs = [ShardRecord(s.shard_id, 0, s.attempt, s.rows) for s in taken if s is not None]
    assert len(recs) == 3
    # the old rank 0 committed a checkpoint with shards 0-2, reported shard 0, then crashed
    old._report(recs[0])
    state.mark_node(Role.WORKER, 0, NodeState.FAILED)  # gives 1 and 2 back to the queue
    assert state.shards.counts()["todo"] == 9
    new = rank0(tmp_path, address, token, node_id=1)
    for rec in recs:  # what the next generation does first, from the checkpoint's meta.json
        new._report(rec)
    s = state.shards.summary()
    assert s["done"] == 3 and s["completed_twice"] == 0 and s["todo"] == 7, s
    # and the next take is a shard the checkpoint does not hold
    nxt = new.client.get_shard().shard
    assert nxt is not None and nxt.shard_id == 3
