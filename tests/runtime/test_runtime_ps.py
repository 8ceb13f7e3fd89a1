"""Parameter server: partitioning, shard state, Adagrad, checkpoints, re-sharding, and the gRPC
service with its client (real servers in this process)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from dlrover_core.runtime import wire
from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps import store as ps_store
from dlrover_core.runtime.strategies.ps.client import PSClient, PSError, PSUnavailable
from dlrover_core.runtime.strategies.ps.partition import dense_owner, dense_owners, owner
from dlrover_core.runtime.strategies.ps.service import SERVICE, PSServer
from dlrover_core.runtime.strategies.ps.shard import PSShard
from dlrover_core.runtime.strategies.ps.store import init_rows

LR = 0.05
EPS = 1e-8
TABLES = {"t0": 4, "t1": 8}

# --- partition -------------------------------------------------------------------------------


@pytest.mark.parametrize("num_ps", [2, 3, 4, 7])
def test_owner_is_deterministic_in_range_and_balanced(num_ps: int) -> None:
    ids = np.arange(200_000, dtype=np.int64)  # sequential ids: the worst case for a bad hash
    own = owner("t0", ids, num_ps)
    assert np.array_equal(own, owner("t0", ids.copy(), num_ps))
    assert own.min() >= 0 and own.max() < num_ps
    share = np.bincount(own, minlength=num_ps) / ids.size
    # binomial sd at n=200k is ~0.1%; 1% absolute is a wide margin for a well-mixed hash
    assert np.all(np.abs(share - 1 / num_ps) < 0.01)


def test_owner_salts_tables_and_handles_edge_cases() -> None:
    ids = np.arange(10_000, dtype=np.int64)
    assert (owner("t0", ids, 4) != owner("t1", ids, 4)).mean() > 0.5
    assert (owner(0, ids, 4) != owner(1, ids, 4)).mean() > 0.5
    assert np.all(owner("t0", ids, 1) == 0)
    neg = owner("t0", np.array([-1, -(2**63)], dtype=np.int64), 3)
    assert neg.min() >= 0 and neg.max() < 3
    with pytest.raises(ValueError):
        owner("t0", ids, 0)


def test_dense_owner_is_round_robin_over_sorted_names() -> None:
    assert [dense_owner(i, 3) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert dense_owners(["c", "a", "b"], 2) == {"a": 0, "b": 1, "c": 0}


# --- shard state -----------------------------------------------------------------------------


def test_pull_creates_rows_deterministically() -> None:
    a, b = PSShard(), PSShard()
    ids = np.array([3, 10**12, -5, 3], dtype=np.int64)
    ra = a.pull("t0", ids, dim=4)
    assert ra.shape == (4, 4) and ra.dtype == np.float32
    assert a.num_rows == 3  # duplicates make one row
    assert np.array_equal(ra[0], ra[3])
    # the same (seed, table, id) gives the same row on any PS, in any order, at any time
    rb = b.pull("t0", ids[::-1], dim=4)[::-1]
    assert np.array_equal(ra, rb)
    assert np.array_equal(a.pull("t0", ids), ra)  # a second pull reads, does not re-create
    assert not np.array_equal(ra, PSShard().pull("t1", ids, dim=4))  # tables differ
    assert not np.array_equal(ra, PSShard(seed=1).pull("t0", ids, dim=4))  # seeds differ
    big = init_rows("t0", np.arange(20_000, dtype=np.int64), 16)
    assert abs(big.mean()) < 1e-4 and abs(big.std() - 0.01) < 2e-4  # normal(0, 0.01)


def test_push_matches_hand_computed_adagrad() -> None:
    s = PSShard(eps=EPS)
    ids = np.array([1, 2], dtype=np.int64)
    w0 = s.pull("t0", ids, dim=4).astype(np.float64)
    g1 = np.array([[1.0, -2.0, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4]])
    g2 = np.array([[1.0, 1.0, 1.0, 1.0], [-0.1, 0.0, 0.3, 2.0]])
    s.push("t0", ids, g1.astype(np.float32), lr=LR)
    s.push("t0", ids, g2.astype(np.float32), lr=LR)
    acc1 = g1**2
    w1 = w0 - LR * g1 / (np.sqrt(acc1) + EPS)
    acc2 = acc1 + g2**2
    w2 = w1 - LR * g2 / (np.sqrt(acc2) + EPS)
    # float32 storage: ~1e-7 relative on values of order 0.1
    np.testing.assert_allclose(s.pull("t0", ids), w2, rtol=0, atol=1e-6)
    snap = s.snapshot().tables["t0"]
    np.testing.assert_allclose(snap.accum, acc2, rtol=1e-6)
    assert s.step == 2


def test_duplicate_ids_are_aggregated_before_the_update() -> None:
    dup, agg = PSShard(), PSShard()
    g = np.array([[1.0, 0, 0, 0], [2.0, 1, 0, 0], [0, 0, 3.0, 0]], dtype=np.float32)
    dup.push("t0", np.array([5, 7, 5]), g, lr=LR, dim=4)
    agg.push("t0", np.array([5, 7]), np.array([g[0] + g[2], g[1]]), lr=LR, dim=4)
    ids = np.array([5, 7])
    assert np.array_equal(dup.pull("t0", ids), agg.pull("t0", ids))
    assert np.array_equal(dup.snapshot().tables["t0"].accum, agg.snapshot().tables["t0"].accum)


def test_dense_first_writer_wins_and_adagrad() -> None:
    s = PSShard(eps=EPS)
    assert s.init_dense({"w": np.ones(3), "b": np.zeros(1)}) == ["w", "b"]
    assert s.init_dense({"w": np.full(3, 7.0), "c": np.ones(2)}) == ["c"]
    g = np.array([0.5, -1.0, 2.0])
    s.push_dense({"w": g}, lr=LR)
    np.testing.assert_allclose(s.pull_dense()["w"], 1 - LR * g / (np.abs(g) + EPS), atol=1e-6)
    with pytest.raises(ValueError, match="init_dense"):
        s.push_dense({"nope": g})


def test_many_ids_per_call_is_fast_and_grows_memory() -> None:
    s = PSShard()
    rng = np.random.default_rng(0)
    before = s.stats()["allocated_bytes"]
    for _ in range(5):
        ids = rng.integers(0, 10**9, 10_000)
        s.pull("t0", ids, dim=16)
        s.push("t0", ids, np.ones((ids.size, 16), np.float32), lr=LR)
    st = s.stats()
    assert st["rows"] == s.num_rows > 45_000
    assert st["allocated_bytes"] > before + st["rows"] * 16 * 4 * 2
    assert st["pull_calls"] == 5 and st["push_calls"] == 5
    ids = rng.integers(0, 10**9, 10_000)
    t0 = time.perf_counter()
    s.pull("t0", ids)
    s.push("t0", ids, np.ones((ids.size, 16), np.float32), lr=LR)
    print(
        f"\nPSShard pull+push of 10k new ids on a {s.num_rows}-row table: "
        f"{(time.perf_counter() - t0) * 1e3:.1f} ms"
    )


@pytest.mark.parametrize("reserve_bytes", [1 << 30, 4096 * 16 * 4])
def test_the_row_store_grows_without_copying_the_table(
    monkeypatch: pytest.MonkeyPatch, reserve_bytes: int
) -> None:
    """New ids widen a view of the arena's reserve: the rows never move (same buffer address,
    no copy) while they fit it; past it (a tiny reserve here) they are copied once into a
    reserve 4x as large, weights and optimizer state intact. Either way the table reads and
    trains exactly as a shard that never grew (its rows created all at once)."""
    monkeypatch.setattr(ps_store, "_RESERVE_BYTES", reserve_bytes)
    grown, whole = PSShard(), PSShard()
    rng = np.random.default_rng(5)
    batches = [rng.integers(0, 10**9, 3000) for _ in range(6)]
    whole.pull("t0", np.concatenate(batches), dim=16)
    addresses = set()
    for ids in batches:
        g = rng.standard_normal((ids.size, 16)).astype(np.float32)
        for shard in (grown, whole):
            shard.pull("t0", ids, dim=16)
            shard.push("t0", ids, g, lr=LR)
        arena = grown._arenas[16]
        addresses.add(arena.weights.__array_interface__["data"][0])
    every = np.unique(np.concatenate(batches))
    np.testing.assert_array_equal(grown.pull("t0", every), whole.pull("t0", every))
    np.testing.assert_array_equal(
        grown.snapshot().tables["t0"].accum[np.argsort(grown.snapshot().tables["t0"].ids)],
        whole.snapshot().tables["t0"].accum[np.argsort(whole.snapshot().tables["t0"].ids)],
    )
    if reserve_bytes == 1 << 30:
        assert arena.copies == 0 and len(addresses) == 1  # 18k rows: never moved
    else:
        assert arena.copies == 2 and len(addresses) == 3  # 4096 -> 16384 -> 65536 rows
    assert arena.allocated_bytes() == every.size * 16 * 4 * 2  # weights + Adagrad, rows in use


def test_index_stays_consistent_across_delta_merges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ps_store, "_DELTA_MIN", 8)  # merge the delta level into main very often
    s = PSShard()
    rng = np.random.default_rng(4)
    seen: set[int] = set()
    for _ in range(40):
        ids = rng.integers(0, 3000, 97)
        s.pull("t0", ids, dim=4)
        seen.update(ids.tolist())
    every = np.array(sorted(seen), dtype=np.int64)
    assert s.num_rows == every.size
    assert np.array_equal(s.pull("t0", every), init_rows("t0", every, 4))
    snap = s.snapshot().tables["t0"]
    assert np.array_equal(np.sort(snap.ids), every)


def test_concurrent_pushes_lose_no_update() -> None:
    s = PSShard()
    ids = np.arange(2000, dtype=np.int64)
    g = np.full((ids.size, 4), 0.5, np.float32)

    def worker(k: int) -> None:
        rng = np.random.default_rng(k)
        for _ in range(25):
            sub = rng.permutation(ids)  # same ids, new rows appear while others push
            s.pull("t0", sub + 10_000 * k, dim=4)
            s.push("t0", sub, g, lr=LR, dim=4)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = s.snapshot().tables["t0"]
    acc = snap.accum[np.argsort(snap.ids)][: ids.size]
    np.testing.assert_allclose(acc, 4 * 25 * 0.25)  # every g² landed: 100 pushes of 0.5²
    assert s.step == 100 and s.num_rows == 2000 * 4


# --- checkpoints -----------------------------------------------------------------------------


def _trained_shard(seed: int = 0, index: int = 0, num_ps: int = 1) -> PSShard:
    s = PSShard(index=index, num_ps=num_ps)
    rng = np.random.default_rng(seed)
    for name, dim in TABLES.items():
        ids = rng.integers(0, 1000, 300)
        s.pull(name, ids, dim=dim)
        s.push(name, ids, rng.standard_normal((300, dim)).astype(np.float32), lr=LR)
    s.init_dense({"dense.w": rng.standard_normal((3, 2)), "dense.b": np.zeros(2)})
    s.push_dense({"dense.w": np.ones((3, 2))}, lr=LR)
    return s


def _assert_same_state(a: ckpt.ShardState, b: ckpt.ShardState) -> None:
    assert set(a.tables) == set(b.tables) and set(a.dense) == set(b.dense)
    for name in a.tables:
        ta, tb = a.tables[name], b.tables[name]
        oa, ob = np.argsort(ta.ids), np.argsort(tb.ids)
        assert np.array_equal(ta.ids[oa], tb.ids[ob])
        assert np.array_equal(ta.weights[oa], tb.weights[ob])
        assert np.array_equal(ta.accum[oa], tb.accum[ob])
    for name in a.dense:
        assert np.array_equal(a.dense[name].weight, b.dense[name].weight)
        assert np.array_equal(a.dense[name].accum, b.dense[name].accum)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    s = _trained_shard()
    info = ckpt.save(s, tmp_path)
    assert info.step == s.step and info.path.exists() and info.manifest_path.exists()
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.info == info and not loaded.rejected
    _assert_same_state(s.snapshot(), loaded.state)
    # the restored shard keeps training exactly like the original (accumulators included)
    r = PSShard.from_state(loaded.state)
    ids, g = np.array([1, 2, 999, 5000]), np.full((4, 4), 0.3, np.float32)
    for x in (s, r):
        x.push("t0", ids, g, lr=LR)
        x.pull("t1", np.array([12345]))
    _assert_same_state(s.snapshot(), r.snapshot())
    assert ckpt.load_latest(tmp_path / "none") is None


def test_checkpoint_keeps_the_last_two(tmp_path: Path) -> None:
    s = _trained_shard()
    infos = [ckpt.save(s, tmp_path, step=i) for i in range(4)]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [
        infos[3].manifest_path.name,
        infos[2].manifest_path.name,
    ]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        [
            infos[2].path.name,
            infos[2].manifest_path.name,
            infos[3].path.name,
            infos[3].manifest_path.name,
        ]
    )


def test_corrupt_checkpoint_is_rejected_and_the_previous_one_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = _trained_shard()
    good = ckpt.save(s, tmp_path)
    good_state = s.snapshot()
    s.push("t0", np.array([1]), np.ones((1, 4), np.float32), lr=LR)
    bad = ckpt.save(s, tmp_path)
    raw = bytearray(bad.path.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 8] = bytes(b ^ 0xFF for b in raw[len(raw) // 2 :][:8])
    bad.path.write_bytes(bytes(raw))

    with pytest.raises(ckpt.CheckpointError, match=r"corrupt: sha256 .* does not match"):
        ckpt.verify(bad.manifest_path)
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.info.seq == good.seq
    assert len(loaded.rejected) == 1 and bad.path.name in loaded.rejected[0]
    assert "corrupt" in caplog.text
    _assert_same_state(good_state, loaded.state)

    good.path.write_bytes(good.path.read_bytes()[:-10])  # truncated
    with pytest.raises(ckpt.CheckpointError, match="no usable checkpoint") as err:
        ckpt.load_latest(tmp_path)
    assert len(err.value.problems) == 2 and "truncated" in str(err.value)


def test_reshard_two_ps_to_three_keeps_every_row_exactly_once(tmp_path: Path) -> None:
    old = [PSShard(index=i, num_ps=2) for i in range(2)]
    rng = np.random.default_rng(1)
    all_ids = {}
    for name, dim in TABLES.items():
        ids = np.unique(rng.integers(-(10**12), 10**12, 2000))
        all_ids[name] = ids
        own = owner(name, ids, 2)
        for i, s in enumerate(old):
            mine = ids[own == i]
            s.pull(name, mine, dim=dim)
            s.push(name, mine, rng.standard_normal((mine.size, dim)).astype(np.float32), lr=LR)
    dense = {f"p{k}": np.full(k + 1, float(k)) for k in range(5)}
    for name, p in dense_owners(dense, 2).items():
        old[p].init_dense({name: dense[name]})
    dirs = [tmp_path / f"old-{i}" for i in range(2)]
    for s, d in zip(old, dirs, strict=True):
        ckpt.save(s, d)
    before = {n: np.concatenate([s.snapshot().tables[n].ids for s in old]) for n in TABLES}
    values = {
        n: dict(
            zip(
                before[n].tolist(),
                np.concatenate([s.snapshot().tables[n].weights for s in old]),
                strict=True,
            )
        )
        for n in TABLES
    }

    new = [ckpt.load_for(i, 3, dirs) for i in range(3)]
    for i, res in enumerate(new):
        assert res.state.index == i and res.state.num_ps == 3 and res.duplicates == 0
        for name in TABLES:
            t = res.state.tables[name]
            assert np.all(owner(name, t.ids, 3) == i)
            for rid, row in zip(t.ids.tolist(), t.weights, strict=True):
                assert np.array_equal(row, values[name][rid])
    for name in TABLES:
        got = np.concatenate([r.state.tables[name].ids for r in new])
        assert got.size == all_ids[name].size  # exactly once ...
        assert np.array_equal(np.sort(got), all_ids[name])  # ... and every one
    dense_got = [n for r in new for n in r.state.dense]
    assert sorted(dense_got) == sorted(dense)
    for r in new:
        for n, ds in r.state.dense.items():
            assert dense_owners(dense, 3)[n] == r.state.index
            assert np.array_equal(ds.weight, dense[n].astype(np.float32))

    with pytest.raises(ckpt.CheckpointError, match="no checkpoint in"):
        ckpt.load_for(0, 3, [*dirs, tmp_path / "missing"])


# --- the gRPC service and its client ---------------------------------------------------------


@pytest.fixture
def token(tmp_path: Path) -> str:
    return wire.create_token(tmp_path)


def _servers(n: int, token: str, root: Path) -> list[PSServer]:
    out = []
    for i in range(n):
        srv = PSServer(PSShard(index=i, num_ps=n), token, root / f"ps-{i}", lr=LR)
        srv.start()
        out.append(srv)
    return out


@pytest.fixture
def two_ps(token: str, tmp_path: Path) -> Iterator[list[PSServer]]:
    servers = _servers(2, token, tmp_path)
    yield servers
    for s in servers:
        s.stop(0)


def test_client_routes_pulls_and_pushes_like_one_shard(two_ps: list[PSServer], token: str) -> None:
    ref = PSShard()
    rng = np.random.default_rng(2)
    with PSClient([s.address for s in two_ps], token, TABLES) as c:
        for _ in range(3):
            ids = {"t0": rng.integers(0, 500, (16, 3)), "t1": rng.integers(0, 500, 40)}
            got = c.pull_many(ids)
            assert got["t0"].shape == (16, 3, 4) and got["t1"].shape == (40, 8)
            for name, x in ids.items():
                assert np.array_equal(got[name], ref.pull(name, x, dim=TABLES[name]))
            grads = {
                n: rng.standard_normal((x.size, TABLES[n])).astype(np.float32)
                for n, x in ids.items()
            }
            c.push_many({n: (ids[n], grads[n]) for n in ids})
            ref.push_many([(n, ids[n], grads[n], TABLES[n]) for n in ids], lr=LR)
        every = np.arange(500)
        for name in TABLES:
            # float32 sums of duplicate grads may differ in order between client and PS
            np.testing.assert_allclose(c.pull(name, every), ref.pull(name, every), atol=1e-6)
        # rows live only on their owner
        for i, s in enumerate(two_ps):
            for name, t in s.shard.snapshot().tables.items():
                assert np.all(owner(name, t.ids, 2) == i)
        assert sum(st["rows"] for st in c.stats()) == ref.num_rows
        assert [p["index"] for p in c.ping()] == [0, 1]
        assert c.pull("t0", np.empty(0, np.int64)).shape == (0, 4)


def test_client_dense_and_checkpoint(two_ps: list[PSServer], token: str) -> None:
    params = {f"layer{k}.w": np.full((2, k + 1), float(k)) for k in range(4)}
    with PSClient([s.address for s in two_ps], token, TABLES) as c:
        with pytest.raises(PSError, match="init_dense or pull_dense"):
            c.push_dense({"layer0.w": np.ones((2, 1))})
        assert c.init_dense(params) == sorted(params)
        other = PSClient([s.address for s in two_ps], token, TABLES)
        assert other.init_dense({n: v + 1 for n, v in params.items()}) == []  # first writer won
        got = other.pull_dense()
        other.close()
        assert {n: v.tolist() for n, v in got.items()} == {n: v.tolist() for n, v in params.items()}
        for i, s in enumerate(two_ps):
            assert set(s.shard.pull_dense()) == {
                n for n, p in dense_owners(params, 2).items() if p == i
            }
        c.push_dense({"layer1.w": np.ones((2, 2))})
        np.testing.assert_allclose(c.pull_dense()["layer1.w"], 1.0 - LR, atol=1e-6)

        c.push("t0", [1, 2, 3], np.ones((3, 4), np.float32))
        first = c.checkpoint()
        assert all(Path(r["path"]).exists() and not r["skipped"] for r in first)
        again = c.checkpoint()  # nothing changed: no new file
        assert [r["path"] for r in again] == [r["path"] for r in first]
        assert all(r["skipped"] for r in again)


def test_call_without_the_token_is_refused(two_ps: list[PSServer], token: str) -> None:
    bare = wire.Client(two_ps[0].address, SERVICE, token="wrong")
    with pytest.raises(grpc.RpcError) as err:
        bare.call("Ping")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    bare.close()
    with (
        PSClient([s.address for s in two_ps], "wrong", TABLES) as c,
        pytest.raises(PSError, match="wrong job token"),
    ):
        c.pull("t0", [1])


def test_unreachable_ps_raises_ps_unavailable_and_switch_recovers(
    two_ps: list[PSServer], token: str, tmp_path: Path
) -> None:
    c = PSClient([s.address for s in two_ps], token, TABLES, timeout_s=5)
    ids = np.arange(100)
    before = c.pull("t0", ids)
    two_ps[1].stop(0)
    with pytest.raises(PSUnavailable) as err:
        c.pull("t0", ids)
    assert err.value.index == 1 and err.value.address == two_ps[1].address
    assert "PS 1" in str(err.value)
    three = _servers(3, token, tmp_path / "new")
    try:
        c.switch([s.address for s in three])
        assert c.num_ps == 3
        assert np.array_equal(c.pull("t0", ids), before)  # same deterministic rows
    finally:
        c.close()
        for s in three:
            s.stop(0)


def test_bad_requests_get_clear_errors(two_ps: list[PSServer], token: str) -> None:
    with PSClient([s.address for s in two_ps], token, TABLES) as c:
        with pytest.raises(PSError, match="unknown table"):
            c.pull("nope", [1])
        with pytest.raises(PSError, match="gradient rows"):
            c.push("t0", [1, 2], np.ones((3, 4), np.float32))
    raw = wire.Client(two_ps[0].address, SERVICE, token)
    with pytest.raises(grpc.RpcError) as err:
        raw.call("Pull", {"tables": ["t0"], "dims": [4], "counts": [5]}, {"ids": np.arange(2)})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "counts add up to 5" in str(err.value.details())
    c2 = PSClient([two_ps[0].address], token, {"t0": 4})
    c2.pull("t0", [1])
    with pytest.raises(PSError, match="dim 4 on this PS"):
        PSClient([two_ps[0].address], token, {"t0": 5}).pull("t0", [1])
    c2.close()
    raw.close()


def test_client_latency_one_ps_8_tables(token: str, tmp_path: Path) -> None:
    """Measured, not asserted: pull+push for 8 tables × 512 ids × dim 16 through one PS."""
    (srv,) = _servers(1, token, tmp_path)
    tables = {f"t{k}": 16 for k in range(8)}
    rng = np.random.default_rng(3)
    try:
        with PSClient([srv.address], token, tables) as c:
            times = []
            for step in range(60):
                ids = {n: rng.zipf(1.2, 512) % 100_000 for n in tables}
                t0 = time.perf_counter()
                rows = c.pull_many(ids)
                c.push_many({n: (ids[n], np.ones_like(rows[n])) for n in tables})
                if step >= 10:  # warm-up: connections, first table growth
                    times.append(time.perf_counter() - t0)
            pushed = c.push_many_async({"t0": (np.array([1, 1]), np.ones((2, 16), np.float32))})
            assert pushed.result(timeout=10) is None
        ms = np.array(times) * 1e3
        print(
            f"\nPS client, 1 PS, 8 tables x 512 ids x dim 16: pull+push "
            f"median {np.median(ms):.2f} ms, p90 {np.percentile(ms, 90):.2f} ms"
        )
    finally:
        srv.stop(0)


def test_a_rejected_checkpoint_is_set_aside_so_pruning_keeps_the_good_one(tmp_path: Path) -> None:
    """After a fall-back the corrupt newest checkpoint is quarantined: the next saves prune
    around it (it no longer counts among the kept ones), so a second corruption still finds the
    good checkpoint the PS restored from; sequence numbers are never reused."""
    s = _trained_shard()
    good = ckpt.save(s, tmp_path)
    bad = ckpt.save(s, tmp_path)
    bad.path.write_bytes(b"garbage" * 100)
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.info.seq == good.seq
    assert ckpt.quarantine(loaded.rejected_paths) == [bad.manifest_path]
    assert (tmp_path / (bad.path.name + ".corrupt")).exists()
    newer = ckpt.save(s, tmp_path)  # keep=2: the good one and this one, not the corrupt one
    assert newer.seq == bad.seq + 1
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [
        newer.manifest_path.name,
        good.manifest_path.name,
    ]
    newer.path.write_bytes(b"garbage" * 100)  # a second corruption: the good one is still there
    again = ckpt.load_latest(tmp_path)
    assert again is not None and again.info.seq == good.seq
