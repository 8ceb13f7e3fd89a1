"""The PS's optimizers against torch's own: the same parameters and gradients must give the
same updated rows and dense parameters (float32 rounding apart), over several steps, with
duplicate ids, through the PSShard API and through the Step RPC."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dlrover_core.runtime import wire
from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps.client import Exchange, PSClient, PSError
from dlrover_core.runtime.strategies.ps.service import PSServer
from dlrover_core.runtime.strategies.ps.shard import PSShard

LR = 0.05
DIM = 4
ROWS = 6
# float32 storage and a different order of float ops than torch's kernels: ~1e-7 relative
ATOL = 2e-6


def _torch_sparse(name: str, w0: np.ndarray) -> tuple[torch.nn.Embedding, torch.optim.Optimizer]:
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(w0))
    params = [emb.weight]
    opt: torch.optim.Optimizer
    if name == "adagrad":
        opt = torch.optim.Adagrad(params, lr=LR)
    elif name == "adam":
        opt = torch.optim.SparseAdam(params, lr=LR)
    else:
        opt = torch.optim.SGD(params, lr=LR)
    return emb, opt


def _steps(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(5):
        ids = rng.integers(0, ROWS, 5 + k)  # duplicates on purpose
        out.append((ids, rng.standard_normal((ids.size, DIM)).astype(np.float32)))
    return out


@pytest.mark.parametrize("name", ["adagrad", "adam", "sgd"])
def test_sparse_rows_match_torch(name: str) -> None:
    shard = PSShard()
    every = np.arange(ROWS)
    w0 = shard.pull("t", every, dim=DIM)
    emb, opt = _torch_sparse(name, w0)
    for ids, g in _steps():
        shard.push("t", ids, g, lr=LR, opt=name)
        opt.zero_grad()
        # loss whose gradient w.r.t. row ids[i] is g[i] (duplicates summed, as on the PS)
        (emb(torch.from_numpy(ids)) * torch.from_numpy(g)).sum().backward()
        opt.step()
    np.testing.assert_allclose(shard.pull("t", every), emb.weight.detach().numpy(), atol=ATOL)
    assert shard.stats()["tables"]["t"]["optimizer"] == name


@pytest.mark.parametrize("name", ["adagrad", "adam", "sgd"])
def test_dense_matches_torch(name: str) -> None:
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    shard = PSShard(optimizer=name)
    shard.init_dense({"w": w0})
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    cls = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
    opt = cls[name]([p], lr=LR)
    for _ in range(6):
        g = rng.standard_normal((3, 2)).astype(np.float32)
        shard.push_dense({"w": g}, lr=LR, opt=name)
        p.grad = torch.from_numpy(g)
        opt.step()
    np.testing.assert_allclose(shard.pull_dense()["w"], p.detach().numpy(), atol=ATOL)


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_step_rpc_applies_the_optimizer_it_names_and_checkpoints_it(
    name: str, tmp_path: object
) -> None:
    """Through gRPC: the worker's Exchange names the optimizer; the PS applies it, keeps its
    slots in the checkpoint and refuses another optimizer on the same table."""
    token = "tok"
    srv = PSServer(PSShard(), token)
    srv.start()
    try:
        with PSClient([srv.address], token, {"t": DIM}) as c:
            every = np.arange(ROWS)
            w0 = c.pull("t", every)
            emb, opt = _torch_sparse(name, w0)
            for ids, g in _steps(3):
                plan = c.plan(ids[:, None], ["t"])
                # the plan's unique rows: sum the gradients of duplicate ids per unique row
                gu = np.zeros((plan.size, DIM), np.float32)
                np.add.at(gu, plan.inverse[:, 0], g)
                c.exchange(Exchange(plan, gu), {"opt": name, "lr": LR})
                opt.zero_grad()
                (emb(torch.from_numpy(ids)) * torch.from_numpy(g)).sum().backward()
                opt.step()
            got = c.pull("t", every)
            np.testing.assert_allclose(got, emb.weight.detach().numpy(), atol=ATOL)
            other = "adagrad"
            plan = c.plan(np.array([[1]]), ["t"])
            with pytest.raises(Exception, match=f"trained with {name}"):
                c.exchange(Exchange(plan, np.ones((1, DIM), np.float32)), {"opt": other, "lr": LR})
        state = srv.shard.snapshot()
        t = state.tables["t"]
        assert t.optimizer == name and t.accum.shape == (ROWS, {"adam": 2, "sgd": 0}[name] * DIM)
        restored = PSShard.from_state(state)
        np.testing.assert_array_equal(restored.pull("t", every), got)
        assert restored.snapshot().tables["t"].steps == t.steps == 5
    finally:
        srv.stop(0)


def test_adam_state_survives_a_checkpoint_and_a_reshard(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    a = PSShard()
    ids = np.arange(40)
    g = np.full((40, DIM), 0.5, np.float32)
    for _ in range(3):
        a.push("t", ids, g, lr=LR, opt="adam")
    ckpt.save(a, d / "old")
    b = PSShard()
    b.restore(ckpt.load_latest(d / "old").state)  # type: ignore[union-attr]
    res = ckpt.load_for(0, 2, [d / "old"])
    assert res.state.tables["t"].optimizer == "adam" and res.state.tables["t"].steps == 3
    for s in (a, b):
        s.push("t", ids, g, lr=LR, opt="adam")
    np.testing.assert_array_equal(a.pull("t", ids), b.pull("t", ids))


@pytest.mark.parametrize("transfer", ["bf16", "fp16"])
def test_reduced_precision_transfer_round_trips_within_its_precision(transfer: str) -> None:
    x = np.random.default_rng(2).standard_normal((64, 16)).astype(np.float32) * 0.01
    back = wire.decode_float(wire.encode_float(x, transfer), transfer)
    rel = {"bf16": 2**-8, "fp16": 2**-11}[transfer]
    np.testing.assert_allclose(back, x, rtol=rel, atol=1e-7)
    if transfer == "bf16":  # the same rounding as torch's bfloat16
        ref = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
        np.testing.assert_array_equal(back, ref)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("training.staleness=-1", "training.staleness"),
        ("training.staleness=99", "training.staleness"),
        ("training.transfer=fp8", "training.transfer"),
        ("training.optimizer.name=rmsprop", "training.optimizer.name"),
        ("training.dense_warmup=-1", "training.dense_warmup"),
    ],
)
def test_bad_data_plane_settings_are_refused_naming_the_field(override: str, field: str) -> None:
    from dlrover_core.errors import SpecError
    from dlrover_core.spec import load_spec
    from tests.factories import make_spec_dict

    with pytest.raises(SpecError) as e:
        load_spec(make_spec_dict(), [override])
    assert field in str(e.value)


def test_a_push_reuses_the_rows_its_pull_found_only_on_the_same_arena() -> None:
    """The pull's reply names its arena rows; the push that sends them back skips the id
    lookups and lands on the same rows; a PS restored since (new arena) looks the ids up."""
    token = "tok"
    srv = PSServer(PSShard(), token)
    srv.start()
    try:
        with PSClient([srv.address], token, {"a": DIM, "b": DIM}) as c:
            ids = np.array([[5, 9], [7, 9], [5, 1]])
            plan = c.plan(ids, ["a", "b"])
            rows, _ = c.exchange(Exchange(pull_plan=plan), {"lr": LR})
            assert rows is not None and 0 in plan.rows_hint
            g = np.ones((plan.size, DIM), np.float32)
            c.exchange(Exchange(plan, g), {"opt": "sgd", "lr": LR})
            after = c.pull("a", [5, 7])
            np.testing.assert_allclose(after, rows[:2] - LR, atol=1e-7)
            # a bogus hint (another arena's token) is ignored: the ids decide
            plan.rows_hint[0] = (plan.rows_hint[0][0] + 1, plan.rows_hint[0][1][::-1].copy())
            c.exchange(Exchange(plan, g), {"opt": "sgd", "lr": LR})
            np.testing.assert_allclose(c.pull("a", [5, 7]), rows[:2] - 2 * LR, atol=1e-7)
            np.testing.assert_allclose(c.pull("b", [1, 9]), rows[2:] - 2 * LR, atol=1e-7)
    finally:
        srv.stop(0)


def test_one_step_round_trip_across_two_ps_routes_rows_gradients_and_dense() -> None:
    """Two PS: the plan's slices go to their owners; rows come back where the plan says, the
    gradients of the unique rows land on the right rows, dense parameters on their owners."""
    token = "tok"
    servers = [PSServer(PSShard(index=i, num_ps=2), token) for i in range(2)]
    for s in servers:
        s.start()
    try:
        tables = {"a": DIM, "b": DIM, "c": DIM}
        with PSClient([s.address for s in servers], token, tables) as c:
            dense = {"w1": np.ones((2, 3), np.float32), "w2": np.zeros(4, np.float32)}
            c.init_dense(dense)
            rng = np.random.default_rng(5)
            ids = rng.integers(0, 40, (64, 3))
            plan = c.plan(ids, list(tables))
            assert len(plan.starts) == 3 and 0 < plan.starts[1] < plan.size
            rows, got_dense = c.exchange(Exchange(pull_plan=plan, want_dense=True), {"lr": LR})
            assert rows is not None and set(got_dense) == set(dense)
            for f, name in enumerate(tables):  # the rows the plan says are each id's rows
                np.testing.assert_array_equal(rows[plan.inverse[:, f]], c.pull(name, ids[:, f]))
            g = rng.standard_normal((plan.size, DIM)).astype(np.float32)
            dg = {"w1": np.full((2, 3), 2.0, np.float32), "w2": np.ones(4, np.float32)}
            c.exchange(Exchange(plan, g, dg), {"opt": "sgd", "lr": LR})
            for f, name in enumerate(tables):
                want = (rows - LR * g)[plan.inverse[:, f]]
                np.testing.assert_allclose(c.pull(name, ids[:, f]), want, atol=1e-7)
            after = c.pull_dense()
            np.testing.assert_allclose(after["w1"], 1 - LR * 2.0, atol=1e-7)
            np.testing.assert_allclose(after["w2"], -LR, atol=1e-7)
            assert all(s.shard.step_calls == 2 for s in servers)
    finally:
        for s in servers:
            s.stop(0)


def test_a_step_planned_for_one_ps_is_rerouted_after_the_set_grew_to_two() -> None:
    """A push (and a prefetch) computed while the set had 1 PS, sent after it grew to 2: the
    rows and gradients go to the PS that own them now, and the caller's plan follows."""
    token = "tok"
    servers = [PSServer(PSShard(index=i, num_ps=2), token) for i in range(2)]
    for s in servers:
        s.start()
    try:
        tables = {"a": DIM, "b": DIM}
        with PSClient([s.address for s in servers], token, tables) as two:
            one = PSClient([servers[0].address], token, tables)  # the old, 1-PS view
            rng = np.random.default_rng(7)
            ids = rng.integers(0, 50, (32, 2))
            plan = one.plan(ids, list(tables))
            one.close()
            assert len(plan.starts) == 2
            rows, _ = two.exchange(Exchange(pull_plan=plan), {"lr": LR})
            assert rows is not None and len(plan.starts) == 3  # re-laid out in place
            for f, name in enumerate(tables):
                np.testing.assert_array_equal(rows[plan.inverse[:, f]], two.pull(name, ids[:, f]))
            old = PSClient([servers[0].address], token, tables)
            push = old.plan(ids, list(tables))
            old.close()
            g = rng.standard_normal((push.size, DIM)).astype(np.float32)
            before = {n: two.pull(n, ids[:, f]) for f, n in enumerate(tables)}
            grads_by_key = {f: g[push.inverse[:, f]].copy() for f in range(len(tables))}
            two.exchange(Exchange(push, g), {"opt": "sgd", "lr": LR})
            for f, name in enumerate(tables):
                want = before[name] - LR * grads_by_key[f]
                np.testing.assert_allclose(two.pull(name, ids[:, f]), want, atol=1e-6)
    finally:
        for s in servers:
            s.stop(0)


# --- stale dense gradients -----------------------------------------------------------------


def test_dense_gradients_from_two_readers_both_land_and_a_stale_one_gets_lr_over_tau() -> None:
    """Two workers read the dense parameters at the same version and push in turn: every push
    lands (one update each, the version counts them), one computed on values 0 or 1 updates
    old is applied exactly as torch's Adagrad would, one τ = 2 or 3 updates old with lr/τ,
    and a read from another shard (a relaunched PS) or none at all is applied unscaled."""
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    shard = PSShard()
    shard.init_dense({"w": w0})
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.Adagrad([p], lr=LR)
    read = shard.dense_version  # both workers read here
    foreign = (read[0] ^ 1, read[1])
    # (what the push says it read, the lr torch must use for it)
    pushes = [(read, LR), (read, LR), (read, LR / 2), (read, LR / 3), (foreign, LR), (None, LR)]
    for seen, lr in pushes:
        g = rng.standard_normal((3, 2)).astype(np.float32)
        shard.push_dense({"w": g}, lr=LR, dense_read=seen)
        opt.param_groups[0]["lr"] = lr
        p.grad = torch.from_numpy(g)
        opt.step()
        np.testing.assert_allclose(shard.pull_dense()["w"], p.detach().numpy(), atol=ATOL)
    st = shard.stats()
    assert st["dense_version"] == len(pushes)  # nothing lost, nothing applied twice
    assert st["dense_read_pushes"] == 4 and st["dense_stale_pushes"] == 2
    assert st["dense_staleness_max"] == 3 and st["dense_staleness_mean"] == pytest.approx(1.5)


def test_the_step_rpc_returns_the_dense_version_and_scales_a_stale_push() -> None:
    """Through gRPC: two clients read the dense parameters (PullDense and Step both say which
    version), then both push gradients computed on that read: the first is one update fresh
    (τ = 0), the second τ = 1, both applied with the full lr; a third client's push of a
    read two updates back is applied with lr/2."""
    token = "tok"
    srv = PSServer(PSShard(), token)
    srv.start()
    try:
        tables = {"a": DIM}
        w0 = np.ones(4, np.float32)
        with (
            PSClient([srv.address], token, tables) as c1,
            PSClient([srv.address], token, tables) as c2,
            PSClient([srv.address], token, tables) as c3,
        ):
            c1.init_dense({"w": w0})
            c1.pull_dense()
            c2.pull_dense()
            c3.pull_dense()
            assert c1.dense_versions == c2.dense_versions == {0: srv.shard.dense_version}
            ex = Exchange(want_dense=True)
            c2.exchange(ex, {"lr": LR})
            assert ex.dense_versions == c1.dense_versions
            p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
            opt = torch.optim.Adagrad([p], lr=LR)
            for client, g, lr in ((c1, 1.0, LR), (c2, -2.0, LR), (c3, 0.5, LR / 2)):
                grad = np.full(4, g, np.float32)
                client.exchange(
                    Exchange(dense_grads={"w": grad}, dense_read=client.dense_versions),
                    {"lr": LR},
                )
                opt.param_groups[0]["lr"] = lr
                p.grad = torch.from_numpy(grad)
                opt.step()
            np.testing.assert_allclose(c1.pull_dense()["w"], p.detach().numpy(), atol=ATOL)
            st = srv.shard.stats()
            assert st["dense_version"] == 3 and st["dense_stale_pushes"] == 1
    finally:
        srv.stop(0)


@pytest.mark.parametrize("name", ["adagrad", "adam"])
def test_dense_warmup_ramps_the_lr_and_resumes_from_a_checkpoint(name: str, tmp_path: Path) -> None:
    """Dense update k of a parameter gets lr·k/W for k < W, then the full lr (torch's rule
    with that lr, Adagrad and Adam); the update count travels in checkpoints, so a PS
    restored after update 3 goes on at 4/W instead of starting the ramp again; a stale push
    gets both factors (lr·k/W/τ). Sparse rows are never warmed up."""
    from dlrover_core.runtime.strategies.ps import optim

    warmup = 6
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    shard = PSShard()
    shard.init_dense({"w": w0})
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt: torch.optim.Optimizer = (
        torch.optim.Adagrad([p], lr=LR) if name == "adagrad" else torch.optim.Adam([p], lr=LR)
    )
    cfg = optim.OptimizerConfig(name, LR, warmup=warmup)
    k = 0  # dense updates applied

    def update(read: tuple[int, int] | None = None, tau: int = 1) -> None:
        nonlocal k
        k += 1
        g = rng.standard_normal((3, 2)).astype(np.float32)
        shard.apply_dense({"w": g}, cfg, read)
        opt.param_groups[0]["lr"] = LR * min(1.0, k / warmup) / tau
        p.grad = torch.from_numpy(g)
        opt.step()
        np.testing.assert_allclose(shard.pull_dense()["w"], p.detach().numpy(), atol=ATOL)

    for _ in range(3):
        update()
    ckpt.save(shard, tmp_path, 3)  # a relaunch from the checkpoint written after update 3
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None
    shard = PSShard.from_state(loaded.state)
    update()  # 4/W, not 1/W again
    read = shard.dense_version
    update()
    update()
    update(read, tau=2)  # update 7 computed on the values before update 5: τ = 2
    update()
    assert shard.stats()["dense_warmup_pushes"] == 2  # updates 4 and 5 since the restore
    assert cfg.dense_lr(1) == pytest.approx(LR / warmup) and cfg.dense_lr(warmup) == LR
    assert optim.OptimizerConfig("sgd", LR, warmup=warmup).dense_lr(1) == LR  # not scale-free
    # rows: the same push with and without a warm-up gives the same rows
    a, b = PSShard(), PSShard()
    ids = np.array([1, 2, 5], np.int64)
    grads = rng.standard_normal((3, DIM)).astype(np.float32)
    a.step_many([("t", ids, DIM)], grads, [], optim.OptimizerConfig(name, LR))
    b.step_many([("t", ids, DIM)], grads, [], cfg)
    np.testing.assert_array_equal(a.pull("t", ids, DIM), b.pull("t", ids, DIM))


def test_the_step_rpc_takes_the_warmup_from_the_worker_and_refuses_a_bad_one() -> None:
    """The worker sends training.dense_warmup with every Step (``warmup``): the PS warms the
    dense lr up by it; a negative or fractional one is refused with INVALID_ARGUMENT naming
    it."""
    token = "tok"
    srv = PSServer(PSShard(), token)
    srv.start()
    try:
        w0 = np.ones(4, np.float32)
        with PSClient([srv.address], token, {"a": DIM}) as c:
            c.init_dense({"w": w0})
            c.pull_dense()
            grad = np.full(4, 2.0, np.float32)
            c.exchange(Exchange(dense_grads={"w": grad}), {"lr": LR, "warmup": 10})
            # Adagrad's first step is lr·sign(g): here lr/10
            np.testing.assert_allclose(c.pull_dense()["w"], w0 - LR / 10, atol=ATOL)
            assert srv.shard.stats()["dense_warmup_pushes"] == 1
            for bad in (-1, 2.5):
                with pytest.raises(PSError) as e:
                    c.exchange(Exchange(dense_grads={"w": grad}), {"lr": LR, "warmup": bad})
                assert "INVALID_ARGUMENT" in str(e.value) and "warmup" in str(e.value)
    finally:
        srv.stop(0)
