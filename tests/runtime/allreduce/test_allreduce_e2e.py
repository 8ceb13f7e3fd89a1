"""The all-reduce strategy end to end: real master service (MasterState + serve_master), real
rank processes (gloo DMP), driven the way the controller will drive them
(:class:`~dlrover_core.runtime.strategies.allreduce.launch.LocalGroupHarness`).

Exactly once is checked twice: the master's shard queue (every shard done once, no duplicate
report) and the final checkpoint (the model holds the updates of exactly ``data.rows`` rows:
rows trained after the last checkpoint of a crashed group are not counted, they are trained
again)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlrover_core.allreduce_config import AllReduceOptions
from dlrover_core.runtime.strategies.allreduce.agent import CKPT_DIR, DELAY_ENV, EXIT_PEER_LOST
from dlrover_core.runtime.strategies.allreduce.checkpoint import CheckpointStore
from dlrover_core.runtime.strategies.allreduce.launch import LocalGroupHarness, RankProcess
from tests.factories import make_spec_dict

pytestmark = pytest.mark.slow

DEAD_AFTER_S = 10.0


def spec_dict(rows: int = 30_720) -> dict[str, Any]:
    return make_spec_dict(
        strategy="allreduce",
        data__rows=rows,  # 24 shards of 1280 rows
        data__eval_rows=2000,
        data__shard_batches=5,
        training__batch_size=256,
        pacing__heartbeat_interval_s=0.2,
        pacing__dead_after_s=DEAD_AFTER_S,
        model__embedding_tables=[{"name": f"t{i}", "num_embeddings": 2000} for i in range(3)],
    )


def harness(tmp_path: Path, delay_s: float) -> LocalGroupHarness:
    return LocalGroupHarness(
        tmp_path / "run",
        spec_dict(),
        options=AllReduceOptions(checkpoint_interval_s=1.0),
        env={DELAY_ENV: str(delay_s)},
    )


def warm(h: LocalGroupHarness, ranks: list[RankProcess]) -> None:
    h.wait_for(lambda: all(rp.event("warm") for rp in ranks), 120, "the new ranks to import")


def assert_exactly_once(h: LocalGroupHarness) -> None:
    s = h.shards()
    assert s["done"] == s["total"] == 24 and s["todo"] == s["doing"] == s["failed"] == 0, s
    assert s["completed_twice"] == 0 and s["samples_done"] == h.spec.data.rows, s
    final = CheckpointStore(h.run_dir / CKPT_DIR).latest()
    assert final is not None and final.meta.job_done
    assert final.meta.samples == h.spec.data.rows and final.meta.shards_total == 24


def assert_no_process_left(h: LocalGroupHarness) -> None:
    for rp in h.all_processes():
        assert rp.proc.poll() is not None
        assert not psutil.pid_exists(rp.proc.pid) or psutil.Process(rp.proc.pid).status() == (
            psutil.STATUS_ZOMBIE
        )


def test_resize_one_two_one_trains_every_shard_exactly_once(tmp_path: Path) -> None:
    with harness(tmp_path, delay_s=0.25) as h:
        g0 = h.launch(1)
        h.wait_for(lambda: h.shards()["done"] >= 2, 120, "a first checkpoint")
        g1 = h.launch(2, after_previous=True)  # pre-warmed: joins once g0 left
        warm(h, g1)
        h.request_stop(g0)
        assert h.wait(g0) == [0]
        h.wait_for(lambda: h.shards()["done"] >= 10, 120, "the 2-rank group's progress")
        h.request_stop(g1)
        assert h.wait(g1) == [0, 0]
        g2 = h.launch(1)  # not pre-warmed: the plain relaunch path
        assert h.wait(g2, timeout=180) == [0]
        assert_exactly_once(h)
        for g, size_before in ((g1, 1), (g2, 2)):
            loaded = g[0].event("loaded")
            assert loaded is not None and loaded["from_world_size"] == size_before
        assert g1[0].event("built")["plan"] != g0[0].event("built")["plan"]  # type: ignore[index]
        assert_no_process_left(h)


def test_a_sigkilled_rank_is_detected_and_the_group_recovers_exactly_once(
    tmp_path: Path,
) -> None:
    with harness(tmp_path, delay_s=0.15) as h:
        g0 = h.launch(2)
        h.wait_for(lambda: h.shards()["done"] >= 4, 120, "a checkpoint with shards")
        h.wait_for(lambda: h.shards()["doing"] > 0, 60, "shards in flight")
        t_kill = time.monotonic()
        h.kill([g0[1]])
        codes = h.wait(g0, timeout=DEAD_AFTER_S + 20)
        detected_s = time.monotonic() - t_kill
        assert codes[0] == EXIT_PEER_LOST and codes[1] == -9, codes
        assert detected_s < DEAD_AFTER_S + 5, detected_s
        assert h.shards()["doing"] == 0  # marking the nodes failed gave their shards back
        g1 = h.launch(2)
        assert h.wait(g1, timeout=180) == [0, 0]
        assert_exactly_once(h)
        assert_no_process_left(h)
