"""The job master's bookkeeping and its gRPC service, with real servers, restarts and kills."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import pytest

from dlrover_core.faults import HangPolicy, HeartbeatPolicy
from dlrover_core.runtime.master_client import (
    MasterClient,
    MasterRejectedError,
    MasterUnavailableError,
)
from dlrover_core.runtime.service import serve_master
from dlrover_core.runtime.state import STATE_FILE, MasterState
from dlrover_core.runtime.wire import RpcError, create_token
from dlrover_core.types import NodeResources, NodeState, Role

ROOT = Path(__file__).resolve().parents[2]
W, PS = Role.WORKER, Role.PS


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_state(run_dir: Path, clock: FakeClock | None = None, **kw: object) -> MasterState:
    args: dict[str, object] = {"total_rows": 100, "shard_size": 10, "synchronous": "NORMAL"}
    args.update(kw)
    return MasterState(
        run_dir,
        clock=clock or time.time,
        monotonic=clock or time.monotonic,
        **args,  # type: ignore[arg-type]
    )


# --- MasterState, in process ------------------------------------------------------------------


def test_register_heartbeat_and_dead_nodes(tmp_path: Path) -> None:
    clock = FakeClock()
    s = make_state(tmp_path, clock, config={"batch_size": 64})
    s.set_ps_set(["127.0.0.1:5000"], 1)
    reply = s.register(W, 0, pid=111)
    assert reply == {
        "ok": True,
        "ps_addresses": ["127.0.0.1:5000"],
        "ps_version": 1,
        "config": {"batch_size": 64},
        "done_seq": 0,
    }
    s.register(PS, 0, pid=222)
    policy = HeartbeatPolicy(interval_s=1.0, dead_after_s=10.0)
    clock.t += 9.0
    hb = s.heartbeat(W, 0, {"cpu_percent": 150.0, "rss_mib": 300.0, "step": 5})
    assert hb["action"] == "" and hb["ps_version"] == 1
    clock.t += 1.0  # the PS's last word is now 10 s old
    assert s.dead_nodes(policy) == [(PS, 0)]  # every role is watched, PS too
    clock.t -= 5.0  # a wall-clock step back does not revive it: liveness is monotonic here
    clock.t += 5.0
    assert s.heartbeat(W, 5, {})["action"] == "register"  # never registered here
    with pytest.raises(RpcError) as e:
        s.get_shard(5)
    assert e.value.code is grpc.StatusCode.NOT_FOUND


def test_marking_a_worker_failed_gives_its_shards_back(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    s.register(W, 0, pid=1)
    a, b = s.get_shard(0), s.get_shard(0)
    assert s.shard_done(0, a["shard_id"], samples=10, loss=0.5)
    assert s.mark_node(W, 0, NodeState.FAILED) == [b["shard_id"]]
    assert s.shards.counts()["todo"] == 9
    assert s.heartbeat(W, 0, {})["action"] == "stop"  # a zombie of a failed node
    assert s.get_shard(0) == {"stop": True}
    s.record_launch(W, 0, 1, NodeResources(1000, 1024), ref="2")
    s.register(W, 0, pid=2, incarnation=1)
    assert s.get_shard(0)["shard_id"] == b["shard_id"]


def test_a_new_process_takes_over_and_an_old_one_is_refused(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    s.register(W, 3, pid=10, incarnation=0)
    held = s.get_shard(3)
    s.register(W, 3, pid=10, incarnation=0)  # the same process again (master restart): keeps
    assert s.shards.doing_by_worker() == {3: [held["shard_id"]]}
    s.register(W, 3, pid=11, incarnation=1)  # relaunched: the old process's shard goes back
    assert s.shards.doing_by_worker() == {}
    assert s.status()["nodes"][0]["restarts"] == 1
    with pytest.raises(RpcError, match="superseded"):
        s.register(W, 3, pid=10, incarnation=0)
    assert s.heartbeat(W, 3, {}, incarnation=0)["action"] == "stop"
    # a superseded process still alive can neither take nor complete a shard
    with pytest.raises(RpcError, match="superseded"):
        s.get_shard(3, incarnation=0)
    mine = s.get_shard(3, incarnation=1)
    with pytest.raises(RpcError, match="superseded"):
        s.shard_done(3, mine["shard_id"], incarnation=0)
    assert s.shard_done(3, mine["shard_id"], incarnation=1)
    assert s.shards.completed_twice == 0


def test_get_shard_wait_done_and_stop(tmp_path: Path) -> None:
    s = make_state(tmp_path, total_rows=20)
    s.register(W, 0)
    s.register(W, 1)
    a, b = s.get_shard(0), s.get_shard(1)
    assert s.get_shard(0) == {"wait": True}
    s.shard_done(0, a["shard_id"])
    s.request_stop(1)
    assert s.heartbeat(W, 1, {})["action"] == "stop"
    assert s.get_shard(1) == {"stop": True}
    assert s.shard_done(1, b["shard_id"])  # finishing the current shard is still welcome
    assert s.get_shard(0) == {"done": True, "failed": 0}


def test_observation_from_heartbeats(tmp_path: Path) -> None:
    clock = FakeClock()
    s = make_state(tmp_path, clock)
    s.register(W, 0)
    s.register(W, 1)
    s.register(PS, 0)
    s.heartbeat(W, 0, {"cpu_percent": 150.0, "rss_mib": 512.4, "samples_per_s": 1000.0})
    s.heartbeat(W, 1, {"cpu_percent": 50.0, "rss_mib": 256.0, "samples_per_s": 500.0})
    s.heartbeat(PS, 0, {"cpu_percent": 80.0, "rss_mib": 2048.0, "rows": 12345})
    shard = s.get_shard(0)
    s.shard_done(0, shard["shard_id"])
    res = NodeResources(2000, 1024)
    alloc = {(W, 0): res, (W, 1): res, (PS, 0): res, (W, 2): res}
    obs = s.observation(clock.t, alloc)
    by = {(n.role, n.node_id): n for n in obs.nodes}
    assert by[(W, 0)].cpu_used_millicores == 1500 and by[(W, 0)].memory_used_mib == 512
    assert by[(W, 0)].cpu_util == 0.75 and by[(W, 0)].throughput_sps == 1000.0
    assert by[(PS, 0)].throughput_sps == 0.0 and by[(PS, 0)].cpu_used_millicores == 800
    assert by[(W, 2)].state is NodeState.PENDING  # allocated, never registered
    assert obs.throughput_sps == 1500.0
    assert (obs.samples_done, obs.samples_total, obs.distinct_ids) == (10, 100, 12345)


def test_hung_nodes(tmp_path: Path) -> None:
    clock = FakeClock()
    s = make_state(tmp_path, clock)
    s.register(W, 0)
    for _ in range(3):
        s.heartbeat(W, 0, {"cpu_percent": 1.0, "step": 7})
    policy = HangPolicy(cpu_util_below=0.05, no_progress_for_s=60.0, min_cpu_samples=3)
    alloc = {(W, 0): NodeResources(1000, 1024)}
    clock.t += 59.0
    assert s.hung_nodes(policy, alloc) == []
    clock.t += 1.0
    assert s.hung_nodes(policy, alloc) == [(W, 0)]


def test_state_is_restored_after_a_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    s = make_state(tmp_path, clock)
    s.register(W, 0, pid=5)
    s.register(PS, 0, pid=6)
    s.record_launch(W, 1, 2, NodeResources(1000, 1024), ref="7", relaunches={"killed": 2})
    s.mark_node(W, 1, NodeState.FAILED)
    s.set_ps_set(["a:1", "b:2"], 3)
    s.record_plan({"stage": "scaling", "reasons": ["more workers"]})
    s.record_fault({"node": "worker-1", "exit_class": "killed", "action": "relaunch"})
    clock.t += 3.0  # the global step alone is persisted at most every persist_every_s (2 s)
    s.report_metrics(PS, 0, {"global_step": 42})
    held = s.get_shard(0)
    first_id = s.master_id
    # no close(): the master was killed
    clock.t += 500.0
    s2 = make_state(tmp_path, clock)
    assert s2.restored and s2.master_starts == 2 and s2.master_id != first_id
    assert s2.ps_set() == (["a:1", "b:2"], 3)
    assert [p["stage"] for p in s2.plans] == ["scaling"] and len(s2.faults) == 1
    assert s2.global_step == 42
    st = {(n["role"], n["id"]): n for n in s2.status()["nodes"]}
    assert (st[("worker", 1)]["state"], st[("worker", 1)]["restarts"]) == ("failed", 2)
    assert st[("worker", 0)]["shards_doing"] == [held["shard_id"]]
    # a fresh grace period: nobody is dead the moment the master comes back
    assert s2.node(W, 1) is not None and s2.node(W, 1).relaunches == {"killed": 2}  # type: ignore[union-attr]
    clock.t += 9.0
    assert s2.dead_nodes(HeartbeatPolicy(interval_s=1.0, dead_after_s=10.0)) == []
    clock.t += 1.0
    dead = s2.dead_nodes(HeartbeatPolicy(interval_s=1.0, dead_after_s=10.0))
    assert dead == [(PS, 0), (W, 0)]
    assert s2.mark_node(W, 0, NodeState.FAILED) == [held["shard_id"]]
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert saved["master_starts"] == 2 and saved["ps_version"] == 3


def test_status_is_json(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    s.register(W, 0, pid=os.getpid())
    shard = s.get_shard(0)
    s.shard_done(0, shard["shard_id"], samples=10, loss=0.69)
    status = json.loads(json.dumps(s.status()))
    assert status["job_state"] == "running"
    assert status["shards"]["done"] == 1 and status["shards"]["todo"] == 9
    assert status["nodes"][0] | {"stats": {}, "heartbeat_age_s": 0} == {
        "role": "worker",
        "id": 0,
        "name": "worker-0",
        "ref": "",
        "pid": os.getpid(),
        "state": "running",
        "restarts": 0,
        "incarnation": 0,
        "heartbeat_age_s": 0,
        "stop_requested": False,
        "stats": {},
        "shards_done": 1,
        "shards_doing": [],
    }
    assert status["loss"] == pytest.approx(0.69)
    assert status["window_throughput_sps"] > 0


# --- the gRPC service -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def work(client: MasterClient, sleep_s: float = 0.0) -> int:
    """A worker's loop: take, 'train', report, until the master says done."""
    counted = 0
    while True:
        r = client.get_shard()
        if r.done or r.stop:
            return counted
        if r.wait or r.shard is None:
            time.sleep(0.01)
            continue
        time.sleep(sleep_s)
        counted += client.shard_done(r.shard.shard_id, r.shard.rows, loss=0.5)
        client.heartbeat(cpu_percent=100.0, rss_mib=100.0, step=counted, samples_per_s=10.0)


def test_service_runs_a_job_to_completion(tmp_path: Path) -> None:
    token = create_token(tmp_path)
    state = make_state(tmp_path, total_rows=1000)
    state.set_ps_set(["127.0.0.1:1"], 1)
    server, port = serve_master(state, token)
    clients = [MasterClient(f"127.0.0.1:{port}", token) for _ in range(3)]
    try:
        for i, c in enumerate(clients):
            reg = c.register("worker", i, pid=os.getpid())
            assert reg.ps_addresses == ("127.0.0.1:1",) and reg.ps_version == 1
        results: list[int] = []
        threads = [threading.Thread(target=lambda c=c: results.append(work(c))) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert sum(results) == 100
        status = clients[0].status()
        assert status["shards"]["done"] == 100 and status["shards"]["completed_twice"] == 0
        assert status["shards"]["samples_done"] == 1000
        assert {n["name"] for n in status["nodes"]} == {"worker-0", "worker-1", "worker-2"}
        assert clients[0].get_ps_set() == (("127.0.0.1:1",), 1)
        assert clients[1].report_metrics(global_step=77, samples_per_s=5.0) == 77
    finally:
        for c in clients:
            c.close()
        server.stop(0)
        state.close()


def test_a_wrong_token_is_refused(tmp_path: Path) -> None:
    token = create_token(tmp_path)
    state = make_state(tmp_path)
    server, port = serve_master(state, token)
    try:
        with MasterClient(f"127.0.0.1:{port}", "not-the-token", retry_for_s=1.0) as c:
            with pytest.raises(MasterRejectedError, match="token") as e:
                c.register("worker", 0)
            assert e.value.code is grpc.StatusCode.UNAUTHENTICATED
        with MasterClient(f"127.0.0.1:{port}", token) as c:
            c.register("worker", 0)
            with pytest.raises(MasterRejectedError, match="shard 999 does not exist") as e:
                c.shard_done(999, 10)
            assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(0)
        state.close()


def test_client_gives_up_when_no_master_answers() -> None:
    c = MasterClient(f"127.0.0.1:{free_port()}", "t", retry_for_s=0.3)
    with c, pytest.raises(MasterUnavailableError, match="did not answer Register"):
        c.register("worker", 0)


def test_client_survives_a_master_restart_on_the_same_port(tmp_path: Path) -> None:
    token = create_token(tmp_path)
    port = free_port()
    state = make_state(tmp_path)
    server, _ = serve_master(state, token, port=port)
    client = MasterClient(f"127.0.0.1:{port}", token)
    client.register("worker", 0, pid=os.getpid())
    first = client.get_shard().shard
    assert first is not None
    server.stop(0)  # the master goes away, state file and shard db stay (no close: a crash)

    restarted: list[MasterState] = []
    servers: list[grpc.Server] = []

    def restart() -> None:
        time.sleep(1.0)
        s2 = make_state(tmp_path)
        restarted.append(s2)
        servers.append(serve_master(s2, token, port=port)[0])

    t = threading.Thread(target=restart)
    t.start()
    try:
        hb = client.heartbeat(cpu_percent=10.0)  # retries until the new master answers
        t.join()
        assert hb.action == ""
        assert client.registrations == 2  # it noticed the new master and registered again
        assert client.master_id == restarted[0].master_id
        assert client.shard_done(first.shard_id, first.rows)  # its shard stayed with it
        assert work(client) == 9
        s = restarted[0].shards
        assert s.counts()["done"] == 10 and s.completed_twice == 0 and s.lost == 0
    finally:
        t.join()
        client.close()
        for srv in servers:
            srv.stop(0)
        for st in restarted:
            st.close()
        state.close()


MASTER = textwrap.dedent(
    """
    import sys, time
    from dlrover_core.runtime.service import serve_master
    from dlrover_core.runtime.state import MasterState
    from dlrover_core.runtime.wire import read_token
    run_dir, port = sys.argv[1], int(sys.argv[2])
    state = MasterState(run_dir, total_rows=2000, shard_size=10)
    server, _ = serve_master(state, read_token(run_dir), port=port)
    print("ready", state.master_starts, flush=True)
    time.sleep(120)
    """
)


def start_master(run_dir: Path, port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", MASTER, str(run_dir), str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("ready")
    return proc


@pytest.mark.slow  # over 3 s here: the full tier (make test-all)
def test_sigkill_the_master_process_mid_job(tmp_path: Path) -> None:
    """Two workers keep training while the master process is SIGKILLed and started again on
    the same run dir: every shard is done exactly once."""
    token = create_token(tmp_path)
    port = free_port()
    master = start_master(tmp_path, port)
    clients = [MasterClient(f"127.0.0.1:{port}", token) for _ in range(2)]
    for i, c in enumerate(clients):
        c.register("worker", i, pid=os.getpid())
    counted = [0, 0]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            counted[i] = work(clients[i], sleep_s=0.01)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for restart in range(2):
            time.sleep(0.3)
            assert all(t.is_alive() for t in threads)  # killed mid-job, not after it
            master.send_signal(signal.SIGKILL)
            master.wait(timeout=10)
            master = start_master(tmp_path, port)
            deadline = time.monotonic() + 10
            while any(c.registrations < restart + 2 for c in clients):
                assert time.monotonic() < deadline, "workers did not come back"
                time.sleep(0.01)
        for t in threads:
            t.join(timeout=30)
        assert not errors, errors
        assert sum(counted) == 200
        status = clients[0].status()
        assert status["master_starts"] == 3
        assert status["shards"] | {"samples_total": 0, "done_seq": 0} == {
            "todo": 0,
            "doing": 0,
            "done": 200,
            "failed": 0,
            "total": 200,
            "completed_twice": 0,
            "lost": 0,
            "samples_done": 2000,
            "samples_total": 0,
            "samples_retrained": 0,
            "replayed": 0,
            "done_seq": 0,
        }
        assert [c.registrations for c in clients] == [3, 3]
    finally:
        for c in clients:
            c.close()
        master.kill()
        master.wait(timeout=10)


def test_nodes_report_facts_not_log_lines(tmp_path: Path) -> None:
    """Typed facts through the master service: a superseded node is told by a status code
    (not words), and a node's warm-up, failure reason and full disk are recorded for its
    current incarnation only, kept across a master restart, cleared by its next launch."""
    token = create_token(tmp_path)
    state = make_state(tmp_path)
    state.record_launch(W, 4, 1, NodeResources(1000, 1024))
    server, port = serve_master(state, token)
    try:
        with MasterClient(f"127.0.0.1:{port}", token) as c:
            assert c.report_event(W, 4, 1, "warm")
            assert not c.report_event(W, 4, 0, "failed", "an older incarnation")
            assert c.report_event(W, 4, 1, "failed", "rank 0: table t0 has  no\nrows")
            assert not c.report_event(W, 4, 1, "exploded")  # not a known fact: refused
            c.register("worker", 4, incarnation=1)
        with MasterClient(f"127.0.0.1:{port}", token) as old:
            with pytest.raises(MasterRejectedError) as e:
                old.register("worker", 4, incarnation=0)
            assert e.value.superseded and e.value.code is not grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(0)
    rec = state.node(W, 4)
    assert rec is not None and set(rec.events) == {"warm", "failed"}
    assert rec.said == "rank 0: table t0 has no rows"
    state.close()
    again = make_state(tmp_path)  # a restarted master reads them back
    rec = again.node(W, 4)
    assert rec is not None and "warm" in rec.events and rec.said
    again.record_launch(W, 4, 2, NodeResources(1000, 1024))
    rec = again.node(W, 4)
    assert rec is not None and rec.events == {} and rec.said is None
    again.close()


def test_disk_full_is_a_fact_of_the_error_not_of_its_words() -> None:
    import errno
    import sqlite3

    from dlrover_core.runtime.files import is_disk_full

    assert is_disk_full(OSError(errno.ENOSPC, "x"))
    full = sqlite3.connect(":memory:")
    full.execute("PRAGMA max_page_count=1")
    with pytest.raises(sqlite3.Error) as e:
        full.execute("CREATE TABLE t (x)")
        full.executemany("INSERT INTO t VALUES (?)", [("x" * 4000,)] * 10)
    assert is_disk_full(e.value)
    try:
        raise RuntimeError("wrapped") from e.value
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert not is_disk_full(RuntimeError("No space left on device"))  # words alone: no
