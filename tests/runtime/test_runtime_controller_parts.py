"""The controller's building blocks, in process: the PS freeze and tagged checkpoints, the run
lease, write-ahead generations surviving a restart, one clear error for a corrupt state file or
a malformed RPC body, the disk reserve, and what a PS restores (with its tag)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import numpy as np
import pytest

from dlrover_core.errors import InputError
from dlrover_core.runtime import wire
from dlrover_core.runtime.files import DiskReserve, FileLease, atomic_write_json
from dlrover_core.runtime.service import MASTER_SERVICE, serve_master
from dlrover_core.runtime.state import GEN_ACTIVE, GEN_STARTING, STATE_FILE, MasterState
from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps.client import PSClient, PSUnavailable
from dlrover_core.runtime.strategies.ps.control import checkpoint_set, freeze_set
from dlrover_core.runtime.strategies.ps.server import restore_tagged
from dlrover_core.runtime.strategies.ps.service import PSServer
from dlrover_core.runtime.strategies.ps.shard import PSShard
from dlrover_core.types import NodeResources, Role

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"t0": 4}


@pytest.fixture
def ps(tmp_path: Path):  # type: ignore[no-untyped-def]
    token = wire.create_token(tmp_path)
    server = PSServer(PSShard(), token, tmp_path / "ckpt")
    server.start()
    client = PSClient([server.address], token, TABLES)
    yield server, client, token
    client.close()
    server.stop(0)


def test_a_frozen_ps_refuses_data_calls_and_loses_no_push(ps) -> None:  # type: ignore[no-untyped-def]
    server, client, token = ps
    ids = np.array([1, 2, 3], dtype=np.int64)
    before = client.pull("t0", ids).copy()
    client.push("t0", ids, np.ones((3, 4), np.float32))
    freeze_set([server.address], token, True)
    with pytest.raises(PSUnavailable, match="frozen"):
        client.push("t0", ids, np.ones((3, 4), np.float32))
    with pytest.raises(PSUnavailable):
        client.pull("t0", ids)
    # the final checkpoint of the frozen set holds every applied push, tagged
    (tag,) = checkpoint_set([server.address], token, 17)
    assert tag == 17
    loaded = ckpt.load_latest(server.checkpoint_dir)  # type: ignore[arg-type]
    assert loaded is not None and loaded.info.tag == 17
    assert server.shard.step == loaded.state.step  # nothing applied after the freeze
    freeze_set([server.address], token, False)
    after = client.pull("t0", ids)
    assert not np.allclose(before, after)  # the one push before the freeze, and only it


def test_restore_tagged_own_reshard_and_empty(tmp_path: Path) -> None:
    own = tmp_path / "own"
    s = PSShard(index=0, num_ps=1)
    s.pull("t0", np.arange(10, dtype=np.int64), dim=4)
    ckpt.save(s, own, tag=9)
    shard, info, source, tag = restore_tagged(0, 1, own)
    assert source.startswith("own:") and tag == 9 and shard.num_rows == 10
    # a new set of 2 re-sharded from it: the sources' smallest tag
    shard, info, source, tag = restore_tagged(0, 2, tmp_path / "new0", [own])
    assert source.startswith("reshard:") and tag == 9 and info is None
    # nothing anywhere: empty, tag 0 (no shard's updates: every done shard is trained again)
    assert restore_tagged(0, 1, tmp_path / "none")[2:] == ("empty", 0)


def test_the_run_lease_refuses_a_second_master_and_names_the_first(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from dlrover_core.runtime.files import FileLease
                lease = FileLease({str(tmp_path)!r})
                assert lease.acquire() is None
                print("held", flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        mine = FileLease(tmp_path)
        who = mine.acquire()
        assert who is not None and f"pid {holder.pid}" in who
    finally:
        holder.kill()
        holder.wait()
    assert mine.acquire() is None  # the kernel dropped the dead holder's lock
    mine.release()


def test_generations_and_budgets_survive_a_restart(tmp_path: Path) -> None:
    s = MasterState(tmp_path, total_rows=100, shard_size=10)
    g1 = s.begin_generation(1, [], 0, GEN_ACTIVE)
    g2 = s.begin_generation(2, ["/a", "/b"], 5, GEN_STARTING)
    s.record_launch(Role.PS, 0, 3, NodeResources(500, 512), ref="99", generation=g2["id"],
                    relaunches={"killed": 2})  # fmt: skip
    s.register(Role.PS, 0, 99, 3, address="a:1", generation=g2["id"], restored_seq=4)
    s.nodes[(Role.PS, 0)].restore_handled = True  # the controller re-queued once
    s.persist()
    # killed: no close()
    s2 = MasterState(tmp_path, total_rows=100, shard_size=10)
    again = s2.node(Role.PS, 0)
    assert again is not None and again.restore_handled  # not re-queued by the next master
    assert [g["state"] for g in s2.generations] == [GEN_ACTIVE, GEN_STARTING]
    assert s2.generation(g2["id"])["restore_from"] == ["/a", "/b"]  # type: ignore[index]
    rec = s2.node(Role.PS, 0)
    assert rec is not None and (rec.incarnation, rec.ref, rec.generation) == (3, "99", 2)
    assert rec.restored_seq == 4
    assert rec.relaunches == {"killed": 2} and g1["id"] == 1


@pytest.mark.parametrize(
    "content", ["{not json", "[1, 2]", '{"nodes": [{"role": "nope"}]}', "\xff\xfe"]
)
def test_a_corrupt_master_state_is_one_clear_error(tmp_path: Path, content: str) -> None:
    (tmp_path / STATE_FILE).write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(InputError, match=r"master\.json") as e:
        MasterState(tmp_path, total_rows=100, shard_size=10)
    assert "new run directory" in str(e.value)
    assert (tmp_path / STATE_FILE).read_bytes() == content.encode("utf-8", "surrogateescape")


def test_a_malformed_rpc_body_is_refused_and_the_server_keeps_serving(tmp_path: Path) -> None:
    token = wire.create_token(tmp_path)
    state = MasterState(tmp_path, total_rows=100, shard_size=10)
    server, port = serve_master(state, token)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = channel.unary_unary(f"/{MASTER_SERVICE}/Register")
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x00\x01garbage", metadata=[("x-dlrover-token", token)], timeout=5)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed request body" in (e.value.details() or "")
        c = wire.Client(f"127.0.0.1:{port}", MASTER_SERVICE, token)
        with pytest.raises(grpc.RpcError) as e2:
            c.call("Register", {"role": "worker", "node_id": "x"})
        assert e2.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "node_id" in (e2.value.details() or "")
        assert c.call("Register", {"role": "worker", "node_id": 0})["ok"] is True
        c.close()
    finally:
        channel.close()
        server.stop(0)
        state.close()


def test_atomic_write_leaves_no_temp_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(ValueError):
        atomic_write_json(target, {"a": float("nan")})  # JSON has no NaN: refused, not written
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_disk_reserve_is_real_space_and_released(tmp_path: Path) -> None:
    r = DiskReserve(tmp_path, nbytes=1 << 20)
    r.create()
    assert r.path.stat().st_blocks * 512 >= 1 << 20  # not sparse
    r.release()
    assert not r.path.exists()


@pytest.mark.parametrize(
    ("state", "waited_s", "relaunched"),
    [("infeasible", 1.0, True), ("deferred", 1.0, False), ("deferred", 1e4, True),
     ("in_progress", 1.0, False), (None, 1.0, False)],
)  # fmt: skip
def test_an_infeasible_in_place_resize_becomes_a_relaunch(
    tmp_path: Path, state: str | None, waited_s: float, relaunched: bool
) -> None:
    """The backend accepted a resize the node cannot give: the worker is relaunched at the new
    size (a deferred one only after pending_timeout_s); a resize still in progress waits."""
    from dlrover_core.runtime.backends.base import NodeHandle
    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster
    from dlrover_core.runtime.nodes import Node
    from tests.factories import make_spec

    class Backend(LocalBackend):
        def resize_state(self, handle: NodeHandle) -> str | None:
            return state

    now = [100.0]
    m = JobMaster(make_spec(), tmp_path / "run", Backend(), monotonic=lambda: now[0])
    m.state = MasterState(tmp_path / "run", total_rows=1000, shard_size=100)
    n = Node(Role.WORKER, 0, NodeResources(4000, 2048))
    n.handle = NodeHandle(Role.WORKER, 0, 0, "123", 0.0)
    n.resized_mono = now[0]
    m.nodes[(Role.WORKER, 0)] = n
    started: list[tuple[int, NodeResources]] = []
    m.start_worker = lambda i, r: started.append((i, r))  # type: ignore[method-assign]
    now[0] += waited_s
    m._check_resizes()
    assert started == ([(0, NodeResources(4000, 2048))] if relaunched else [])
    if relaunched:
        assert m.state.faults[-1]["exit_class"] == "resize"
    m.state.close()


@pytest.mark.parametrize(
    ("unplaced", "waited_s", "fails"),
    [
        ({(Role.PS, 0)}, 3600.0, True),  # a PS at the floors, past give_up_after_s
        ({(Role.PS, 0)}, 3000.0, False),  # not yet: capacity may free up
        ({(Role.WORKER, 1)}, 3600.0, False),  # a worker others run without: the planner drops it
        ({(Role.WORKER, 0), (Role.WORKER, 1)}, 3600.0, True),  # no worker placed at all
    ],
)
def test_a_node_the_cluster_never_places_fails_the_job_only_when_needed(
    tmp_path: Path, unplaced: set[tuple[Role, int]], waited_s: float, fails: bool
) -> None:
    """Unplaced nodes (the backend's ``pending_since``) are not killed as "never
    registered"; once the pending policy gives up on one the job cannot do without (a PS,
    or every worker), the job fails with a line that says what to do."""
    from dlrover_core.runtime.backends.base import NodeHandle
    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster
    from dlrover_core.runtime.nodes import Node
    from tests.factories import make_spec

    class Backend(LocalBackend):
        def pending_since(self, handle: NodeHandle) -> float | None:
            return 0.0 if (handle.role, handle.node_id) in unplaced else None

        def kill(self, handle: NodeHandle) -> None:
            killed.append((handle.role, handle.node_id))

    killed: list[tuple[Role, int]] = []
    m = JobMaster(make_spec(), tmp_path / "run", Backend(), clock=lambda: waited_s,
                  monotonic=lambda: 1e6)  # fmt: skip
    mono = [0.0]
    m.state = MasterState(
        tmp_path / "run", total_rows=1000, shard_size=100, monotonic=lambda: mono[0]
    )
    for k, (role, i) in enumerate([(Role.PS, 0), (Role.WORKER, 0), (Role.WORKER, 1)]):
        n = Node(role, i, NodeResources(1000, 1536))
        n.handle = NodeHandle(role, i, 0, str(4_000_000 + k), 0.0)  # no such pid
        m.nodes[(role, i)] = n
        m.state.record_launch(role, i, 0, n.resources, ref=n.handle.ref)
    mono[0] = 1e6  # every node launched long ago, none registered
    m._check_liveness()
    assert killed == [k for k in sorted(m.nodes) if k not in unplaced]  # never registered
    assert (m.failure is not None) == fails, m.failure
    if fails:
        assert "could not be scheduled" in m.failure and "free capacity" in m.failure
    m.state.close()


@pytest.mark.parametrize(
    ("frozen", "state", "restored", "replayed"),
    [
        (True, GEN_STARTING, 3, []),  # a planned change's frozen checkpoints: nothing lost
        (False, GEN_STARTING, 3, [3]),  # a source was gone: its older tag loses shards
        (True, GEN_ACTIVE, 3, [3]),  # relaunched after the set served: its updates are gone
        (True, GEN_STARTING, 2, [2, 3]),  # another tag than the freeze's
    ],
)
def test_which_ps_restores_replay_shards(
    tmp_path: Path, frozen: bool, state: str, restored: int, replayed: list[int]
) -> None:
    """A PS of a new generation restoring the checkpoints a planned PS-set change froze at
    done_seq S replays nothing: every shard done after S had its last gradients applied
    before the freeze or held by its worker for the new set. Any other restore replays the
    shards done after its tag (so a shard done during the change is not trained twice)."""
    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster
    from dlrover_core.runtime.nodes import Node
    from dlrover_core.runtime.strategies.ps.strategy import PSStrategy
    from dlrover_core.spec import load_spec

    spec = load_spec(str(ROOT / "pipelines" / "specs" / "small.yaml"), [])
    master = JobMaster(spec, tmp_path / "run", LocalBackend())
    s = MasterState(tmp_path, total_rows=40, shard_size=10)
    for _ in range(4):
        shard = s.shards.take(0)
        assert shard is not None and s.shards.complete(shard.shard_id, 0)
    gen = s.begin_generation(2, ["/a"], 3, state, frozen=frozen)
    s.record_launch(Role.PS, 0, 1, NodeResources(500, 512), ref="99", generation=gen["id"])
    s.register(Role.PS, 0, 99, 1, address="a:1", generation=gen["id"], restored_seq=restored)
    master.state = s
    master.nodes[(Role.PS, 0)] = Node(
        Role.PS, 0, NodeResources(500, 512), incarnation=1, generation=gen["id"]
    )
    assert isinstance(master.strategy, PSStrategy)
    master.strategy.psset.check_restores()
    assert s.shards.counts()["todo"] == len(replayed)
    assert [f["exit_class"] for f in s.faults] == (["restore"] if replayed else [])
    rec = s.node(Role.PS, 0)
    assert rec is not None and rec.restore_handled
    s.close()


def test_one_registry_per_seam_covers_every_kind() -> None:
    """Strategies and backends are picked in one registry each, and every kind the spec
    accepts has an entry there (and a planning kind: ``spec.STRATEGY_KINDS``)."""
    from typing import get_args

    from dlrover_core.runtime.backends.targets import TARGETS
    from dlrover_core.runtime.strategies import STRATEGIES
    from dlrover_core.spec import STRATEGY_KINDS, BackendSpec, JobSpec

    kinds = set(get_args(JobSpec.model_fields["strategy"].annotation))
    assert kinds == set(STRATEGIES) == set(STRATEGY_KINDS)
    assert set(get_args(BackendSpec.model_fields["kind"].annotation)) == set(TARGETS)


def test_a_batch_of_launches_is_written_ahead_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write ahead per batch, not per node: launching 200 workers writes master.json twice
    (the batch, then its refs), and every node is recorded before any of them starts."""
    from dlrover_core.runtime import state as state_mod
    from dlrover_core.runtime.backends.base import NodeHandle, NodeSpec
    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster
    from tests.factories import make_spec

    writes: list[int] = []
    real = state_mod.atomic_write
    monkeypatch.setattr(
        state_mod, "atomic_write", lambda path, text: (writes.append(1), real(path, text))
    )
    m = JobMaster(make_spec(), tmp_path / "run", LocalBackend())
    m.state = MasterState(tmp_path / "run", total_rows=1000, shard_size=100)
    recorded_before_start: list[bool] = []

    def launch(spec: NodeSpec) -> NodeHandle:
        recorded_before_start.append(len(m.st.nodes) == 200)
        return NodeHandle(spec.role, spec.node_id, spec.incarnation, f"r{spec.node_id}", 0.0)

    m.backend.launch = launch  # type: ignore[method-assign]
    m.address = "127.0.0.1:1"
    writes.clear()
    m.launch_successors([(Role.WORKER, i, NodeResources(500, 512)) for i in range(200)])
    assert len(writes) == 2 and all(recorded_before_start)
    assert {r.ref for r in m.st.nodes.values()} == {f"r{i}" for i in range(200)}
    m.state.close()


def test_a_node_that_reports_a_full_disk_fails_the_job_with_its_words(tmp_path: Path) -> None:
    """A PS that cannot write its checkpoint says so (a ``disk_full`` fact): the job fails
    then, naming it, rather than training on without a state it could resume from."""
    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster
    from tests.factories import make_spec

    m = JobMaster(make_spec(), tmp_path / "run", LocalBackend())
    m.state = MasterState(tmp_path / "run", total_rows=1000, shard_size=100)
    m.state.record_launch(Role.PS, 0, 0, NodeResources(500, 512))
    m._check_liveness()
    assert m.failure is None
    said = "PS 0 cannot write its checkpoint: [Errno 28] No space left on device"
    assert m.state.record_event(Role.PS, 0, 0, "disk_full", said)
    m._check_liveness()
    assert m.failure is not None and m.failure.startswith(f"disk full: {said}")
    m.state.close()


@pytest.mark.parametrize("yaml", ["small.yaml", "small-allreduce.yaml"])
@pytest.mark.parametrize(
    ("millicores", "override", "threads"),
    [(1500, None, 1), (2000, None, 2), (500, None, 1), (4000, 1, 1), (500, 3, 3)],
)
def test_a_node_gets_its_whole_cores_as_threads_or_the_specs_count(
    tmp_path: Path, yaml: str, millicores: int, override: int | None, threads: int
) -> None:
    """A worker or rank computes on its whole cores, rounded down (1.5 CPU: 1 thread, not two
    throttled ones), unless the spec's ``training.threads`` says; torch's count (--threads),
    OMP and MKL agree; OpenMP threads wait passively."""
    from dlrover_core.runtime.backends.kubernetes_pods import PodConfig, node_to_pod
    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster
    from dlrover_core.runtime.nodes import Node
    from dlrover_core.spec import load_spec

    over = [] if override is None else [f"training.threads={override}"]
    spec = load_spec(str(ROOT / "pipelines" / "specs" / yaml), over)
    master = JobMaster(spec, tmp_path / "run", LocalBackend())
    # the rank's own fields (group, rank) come from a rendezvous this test does not hold
    master.strategy.node_command = lambda n, cmd: cmd  # type: ignore[method-assign]
    node = Node(Role.WORKER, 0, NodeResources(millicores, 1024), incarnation=1)
    ns = master._node_spec(node)
    assert ns.argv[ns.argv.index("--threads") + 1] == str(threads)
    pod = node_to_pod(ns, PodConfig(namespace="jobs", image="dlrover-rm:test", job_name="j"))
    pod_env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert pod_env["OMP_NUM_THREADS"] == pod_env["MKL_NUM_THREADS"] == str(threads)
    assert pod_env["OMP_WAIT_POLICY"] == "PASSIVE"
