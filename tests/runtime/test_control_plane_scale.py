"""The control plane at scale (issue 34): master.json written cheaply and in batches, storms of
failures at the state and shard-queue level, and (slow tier) the load benchmark at 100 nodes
against the issue's targets scaled down."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from dlrover_core.runtime import state as state_mod
from dlrover_core.runtime.master_client import MasterClient, MasterRejectedError
from dlrover_core.runtime.service import serve_master
from dlrover_core.runtime.state import STATE_FILE, SUPERSEDED_CODE, MasterState
from dlrover_core.runtime.wire import RpcError
from dlrover_core.types import NodeResources, NodeState, Role

ROOT = Path(__file__).resolve().parents[2]
W, PS = Role.WORKER, Role.PS
RES = NodeResources(1000, 1024)


def make_state(run_dir: Path, rows: int = 100_000, size: int = 100) -> MasterState:
    return MasterState(run_dir, total_rows=rows, shard_size=size, synchronous="NORMAL")


def on_disk(run_dir: Path) -> dict[str, object]:
    d = json.loads((run_dir / STATE_FILE).read_text())
    d.pop("saved_at_s")
    return dict(d)


def snap(s: MasterState) -> dict[str, object]:
    d = s.snapshot()
    d.pop("saved_at_s")
    return d


def test_state_file_is_the_snapshot_and_follows_every_change(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    for i in range(5):
        s.record_launch(W, i, 0, RES, ref=f"w{i}", relaunches={"oom": 1})
        s.register(W, i, pid=100 + i)
    s.record_launch(PS, 0, 0, RES, ref="p0")
    s.register(PS, 0, pid=7, address="h:1", generation=0, restored_seq=-1)
    s.record_plan({"workers": 5, "ps": 1})
    s.record_fault({"node": "worker-1", "action": "relaunch"})
    assert on_disk(tmp_path) == snap(s)
    # each kind of change reaches the file: state, incarnation, events, nested dicts
    s.mark_node(W, 1, NodeState.FAILED, relaunches={"oom": 2})
    s.record_launch(W, 1, 1, RES, ref="w1b", relaunches={"oom": 2})
    s.record_event(W, 2, 0, "warm")
    s.request_stop(3)
    s.set_ps_set(["h:1"], 2)
    assert on_disk(tmp_path) == snap(s)
    d = on_disk(tmp_path)
    nodes = {(n["role"], n["node_id"]): n for n in d["nodes"]}  # type: ignore[attr-defined]
    assert nodes[("worker", 1)]["incarnation"] == 1 and nodes[("worker", 1)]["ref"] == "w1b"
    assert nodes[("worker", 1)]["relaunches"] == {"oom": 2}
    assert "warm" in nodes[("worker", 2)]["events"] and nodes[("worker", 3)]["stop_requested"]
    s.close()
    # and a restarted master reads it back
    r = make_state(tmp_path)
    assert r.restored and r.node(W, 1).incarnation == 1  # type: ignore[union-attr]
    r.close()


def test_a_batch_is_written_once_and_before_the_block_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_state(tmp_path)
    writes: list[str] = []
    real = state_mod.atomic_write

    def counting(path: object, data: str) -> None:
        writes.append(data)
        real(path, data)  # type: ignore[arg-type]

    monkeypatch.setattr(state_mod, "atomic_write", counting)
    with s.batch():
        for i in range(50):
            s.record_launch(W, i, 0, RES)
        assert writes == []
    assert len(writes) == 1
    assert len(on_disk(tmp_path)["nodes"]) == 50  # type: ignore[arg-type]
    # nested batches write once, at the outer end; a failing block still writes what it did
    with pytest.raises(RuntimeError), s.batch():
        with s.batch():
            s.record_launch(W, 50, 0, RES)
        assert len(writes) == 1
        raise RuntimeError("boom")
    assert len(writes) == 2 and len(on_disk(tmp_path)["nodes"]) == 51  # type: ignore[arg-type]
    s.register(W, 0)  # outside a batch: one write a change, as before
    assert len(writes) == 3
    s.close()


def _attach(s: MasterState, workers: int) -> dict[int, int]:
    """Launch and register ``workers`` workers, each taking one shard; returns worker -> shard."""
    with s.batch():
        for i in range(workers):
            s.record_launch(W, i, 0, RES, ref=f"w{i}")
    held = {}
    for i in range(workers):
        s.register(W, i, pid=i, incarnation=0)
        held[i] = int(s.get_shard(i, [], 0)["shard_id"])
    return held


@pytest.mark.parametrize("workers,killed,seed", [(150, 30, 0), (250, 50, 5)])
def test_a_storm_of_worker_relaunches_requeues_each_shard_exactly_once(
    tmp_path: Path, workers: int, killed: int, seed: int
) -> None:
    import random

    s = make_state(tmp_path)
    held = _attach(s, workers)
    victims = sorted(random.Random(seed).sample(range(workers), killed))
    t0 = time.perf_counter()
    with s.batch():  # the replacements written ahead together
        for i in victims:
            s.record_launch(W, i, 1, RES)
    storm_s = time.perf_counter() - t0
    lost = sorted(held[i] for i in victims)
    failures = dict(s.shards._query("SELECT id, failures FROM shards WHERE failures>0"))
    assert sorted(failures) == lost and set(failures.values()) == {1}
    assert all(s.shards.shard(sid)[1].value == "todo" for sid in lost)
    assert not set(s.shards.doing_by_worker()) & set(victims)
    # the old incarnations are refused (not registered: its client re-registers and is told
    # it is superseded); the replacements take the shards again, once each
    with pytest.raises(RpcError):
        s.shard_done(victims[0], held[victims[0]], incarnation=0)
    with pytest.raises(RpcError) as e:
        s.register(W, victims[0], incarnation=0)
    assert e.value.code is SUPERSEDED_CODE
    for i in victims:
        s.register(W, i, pid=10_000 + i, incarnation=1)
    retaken = [int(s.get_shard(i, [], 1)["shard_id"]) for i in victims]
    assert sorted(retaken) == lost
    for i, sid in zip(victims, retaken, strict=True):
        assert s.shard_done(i, sid, incarnation=1)
    for i in set(range(workers)) - set(victims):
        assert s.shard_done(i, held[i], incarnation=0)
    summ = s.shards.summary()
    assert summ["completed_twice"] == 0 and summ["lost"] == 0 and summ["doing"] == 0
    assert summ["done"] == workers
    assert storm_s < 5.0, f"{killed} relaunches written ahead in {storm_s:.2f} s"
    s.close()


def test_a_ps_storm_requeues_every_lost_completion_once(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    held = _attach(s, 200)
    for i, sid in held.items():
        s.shard_done(i, sid, incarnation=0)
    seq = s.shards.done_seq
    with s.batch():
        for p in range(8):
            s.record_launch(PS, p, 1, RES)
    again = s.shards.requeue_done_after(seq - 50, "8 PS restored an older checkpoint")
    assert len(again) == len(set(again)) == 50
    reps = dict(s.shards._query("SELECT shard_id, COUNT(*) FROM replays GROUP BY shard_id"))
    assert set(reps) == set(again) and set(reps.values()) == {1}
    assert s.shards.requeue_done_after(seq - 50, "again") == []  # nothing twice
    s.close()


def test_a_master_restart_with_many_nodes_keeps_their_shards(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    held = _attach(s, 200)
    s.close()  # the master dies with every node attached (its state was written ahead)
    t0 = time.perf_counter()
    r = make_state(tmp_path)
    restore_s = time.perf_counter() - t0
    assert r.restored and len(r.nodes) == 200
    for i in range(200):  # every node says hello to the new master, holding its shard
        r.register(W, i, pid=i, incarnation=0)
    assert r.shards.doing_by_worker() == {i: [held[i]] for i in range(200)}
    for i in range(200):
        assert r.shard_done(i, held[i], incarnation=0)
    summ = r.shards.summary()
    assert summ["lost"] == summ["completed_twice"] == summ["doing"] == 0
    assert summ["done"] == 200
    assert not r.shards._query("SELECT id FROM shards WHERE failures>0")
    assert restore_s < 5.0
    r.close()


def test_load_nodes_speak_the_real_protocol(tmp_path: Path) -> None:
    """A few load nodes against an in-process master: they register, heartbeat, take and
    report shards; a killed one keeps its shard at the master; a superseded one leaves."""
    from dlrover_core.runtime.loadgen import LoadFleet

    s = make_state(tmp_path)
    server, port = serve_master(s, "tok")
    try:
        fleet = LoadFleet(f"127.0.0.1:{port}", "tok", heartbeat_s=0.2, shard_s=0.05)
        nodes = fleet.start(PS, [0]) + fleet.start(W, range(4))
        assert fleet.wait_registered(nodes, 10.0) is not None
        deadline = time.monotonic() + 10
        while s.shards.counts()["done"] < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.shards.counts()["done"] >= 20
        lat = fleet.lat.window(0.0)
        assert {"Register", "Heartbeat", "GetShard", "ShardDone"} <= set(lat)
        assert s.node(PS, 0).stats.get("rows") == 0.0  # type: ignore[union-attr]
        fleet.kill(W, [1])
        time.sleep(0.2)
        kept = s.shards.doing_by_worker().get(1, [])
        assert len(kept) <= 1  # what it held (or was just given), kept until a verdict
        time.sleep(0.3)
        assert s.shards.doing_by_worker().get(1, []) == kept
        assert not s.shards._query("SELECT id FROM shards WHERE failures>0")
        s.record_launch(W, 2, 1, RES)  # worker 2 superseded under its feet
        n2 = fleet.nodes[(W, 2)]
        n2.join(5.0)
        assert not n2.is_alive() and n2.exit_reason in ("superseded", "stop")
        fleet.stop_all()
        c = MasterClient(f"127.0.0.1:{port}", "tok", retry_for_s=1.0)
        with pytest.raises(MasterRejectedError) as e:
            c.register(W, 2, incarnation=0)
        assert e.value.superseded
        c.close()
    finally:
        server.stop(None)
        s.close()


@pytest.mark.slow
def test_control_plane_at_100_nodes_meets_the_scaled_targets(tmp_path: Path) -> None:
    """Issue 34 at a tenth of its size: 100 workers and 8 PS against a master in its own
    process; the targets scaled to it (a tenth of a core, 256 MiB); the storms exactly once
    and back within 60 s."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from control_plane_scale import run_scale, targets  # type: ignore[import-not-found]

    r = run_scale(
        tmp_path / "run",
        workers=100,
        ps=8,
        seconds=10.0,
        heartbeat_s=3.0,
        shard_s=1.0,  # 100 takes/s
        kill_workers=20,
        kill_ps=4,
        lost_completions=30,
        log=lambda s: None,
    )
    t = targets(r)
    st = r["steady"]
    why = json.dumps({"targets": t, "steady": st, "loadavg": os.getloadavg()}, default=str)
    # the round trip at the node includes this process's own scheduling on a shared box: the
    # 50 ms target is asserted on the master's own time, the round trip gets a looser bound
    rtt_p99 = st["rtt"]["GetShard"]["p99_ms"]
    assert t.pop("get_shard_p99_under_50ms") or rtt_p99 < 200, why
    assert st["handler"]["GetShard"]["p99_ms"] < 50, why
    assert all(t.values()), why
    assert st["master"]["cpu_cores"] < 0.5, why  # ~230 calls/s; scaled: under half a core
    assert st["master"]["rss_mib_max"] < 256, why
    assert st["dead_verdicts_strict"] == 0, why
    assert r["worker_storm"]["requeued"] == r["worker_storm"]["doing_at_master"] > 0, why
    assert r["master_kill"]["nodes_alive_after"] == r["master_kill"]["nodes_attached"], why
    assert r["master_kill"]["shards_kept"], why
