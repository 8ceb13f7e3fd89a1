"""The PS runtime's worker against a real master service and real PS servers over gRPC:
training to completion (AUC), two workers sharing the shard queue, a switch to a new PS set,
a PS that dies and comes back elsewhere, a stop from the master, and the worker as a process."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dlrover_core.runtime import wire
from dlrover_core.runtime.service import serve_master
from dlrover_core.runtime.state import MasterState
from dlrover_core.runtime.strategies.ps.client import PSClient
from dlrover_core.runtime.strategies.ps.server import restore_shard
from dlrover_core.runtime.strategies.ps.service import PSServer
from dlrover_core.runtime.strategies.ps.shard import PSShard
from dlrover_core.runtime.strategies.ps.step import embedding_ids, evaluate_on_ps, table_rows
from dlrover_core.runtime.strategies.ps.store import init_rows
from dlrover_core.runtime.strategies.ps.worker import (
    ALLOC_ENV,
    EXIT_FATAL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    SPEC_FILE,
    Worker,
    main,
)
from dlrover_core.spec import JobSpec, load_spec, spec_to_dict
from dlrover_core.training.data import from_spec
from dlrover_core.training.model import DenseTower, feature_keys
from tests.factories import make_spec_dict

ROOT = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)  # the machine has 2 cores; PS, master and workers share them


def small_spec(rows: int = 20_000, shard_batches: int = 10, **overrides: Any) -> JobSpec:
    return load_spec(
        make_spec_dict(
            data__rows=rows,
            data__eval_rows=5000,
            data__shard_batches=shard_batches,
            training__batch_size=256,
            pacing__heartbeat_interval_s=0.2,
            pacing__sample_window_s=2,
            **overrides,
        )
    )


@dataclass
class Job:
    run_dir: Path
    spec: JobSpec
    token: str
    state: MasterState
    master_server: Any
    port: int
    ps: list[PSServer] = field(default_factory=list)

    @property
    def master(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def tables(self) -> dict[str, int]:
        return {t.name: self.spec.model.table_dim(t) for t in self.spec.model.embedding_tables}

    def start_ps(self, name: str, shard: PSShard | None = None) -> PSServer:
        srv = PSServer(
            shard or PSShard(), self.token, self.run_dir / name, lr=self.spec.training.optimizer.lr
        )
        srv.start()
        self.ps.append(srv)
        return srv

    def worker(self, node_id: int = 0, **kw: Any) -> Worker:
        return Worker(self.run_dir, node_id, self.master, **kw)

    def shards(self) -> dict[str, int]:
        return self.state.shards.summary()

    def auc(self, srv: PSServer) -> float:
        with PSClient([srv.address], self.token, self.tables) as c:
            return evaluate_on_ps(self.spec, c, n=5000)[0]


@pytest.fixture
def make_job(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    jobs: list[Job] = []

    def make(spec: JobSpec, start_ps: bool = True) -> Job:
        run_dir = tmp_path / f"run{len(jobs)}"
        token = wire.create_token(run_dir)
        (run_dir / SPEC_FILE).write_text(json.dumps(spec_to_dict(spec)))
        state = MasterState(
            run_dir, total_rows=spec.data.rows, shard_size=spec.shard_size, synchronous="NORMAL"
        )
        server, port = serve_master(state, token)
        job = Job(run_dir, spec, token, state, server, port)
        jobs.append(job)
        if start_ps:
            srv = job.start_ps("ps0")
            state.set_ps_set([srv.address], 1)
        return job

    yield make
    for job in jobs:
        job.master_server.stop(0)
        for srv in job.ps:
            srv.stop(0)
        job.state.close()


class Running:
    """A worker's run() in a thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.rc: int | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.rc = self.worker.run()
        except BaseException as e:  # surfaced by join()
            self.error = e

    def join(self, timeout: float = 60.0) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not finish in time"
        if self.error is not None:
            raise self.error
        assert self.rc is not None
        return self.rc


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def assert_all_done_once(job: Job) -> None:
    s = job.shards()
    assert s["done"] == s["total"] and s["todo"] == s["doing"] == s["failed"] == 0, s
    assert s["completed_twice"] == 0 and s["lost"] == 0, s
    assert s["samples_done"] == job.spec.data.rows, s


# --- training ------------------------------------------------------------------------------


def test_one_worker_trains_the_job_to_completion(make_job: Callable[..., Job]) -> None:
    job = make_job(small_spec(rows=20_000))
    w = job.worker()
    t0 = time.monotonic()
    assert w.run() == EXIT_OK
    wall = time.monotonic() - t0
    assert "job done" in w.exit_reason
    assert_all_done_once(job)
    assert w.steps == 79 and w.samples == 20_000 and w.shards_done == 8  # 20000 / 256 per shard
    node = job.state.status()["nodes"][0]
    assert node["name"] == "worker-0" and node["pid"] == os.getpid()
    assert {"cpu_percent", "rss_mib", "step", "samples_per_s"} <= set(node["stats"])
    assert node["stats"]["rss_mib"] > 50
    assert any(m.get("samples_per_s", 0) > 0 for m in job.state.metrics_log)
    auc = job.auc(job.ps[0])
    print(f"1 worker + 1 in-process PS: {w.samples / wall:.0f} samples/s, held-out AUC {auc:.3f}")
    assert auc > 0.6


def test_two_workers_split_the_shards(make_job: Callable[..., Job]) -> None:
    job = make_job(small_spec(rows=20_000, shard_batches=2))  # 40 shards of 512 rows
    runs = [Running(job.worker(i)) for i in range(2)]
    assert [r.join() for r in runs] == [EXIT_OK, EXIT_OK]
    assert_all_done_once(job)
    by_worker = job.state.shards.done_by_worker()
    assert set(by_worker) == {0, 1} and all(n > 0 for n in by_worker.values()), by_worker
    assert sum(r.worker.samples for r in runs) == 20_000
    # every step's dense gradients landed once (one dense update each), and each said which
    # dense values it was computed on
    st = job.ps[0].shard.stats()
    steps = sum(r.worker.steps for r in runs)
    assert st["dense_version"] == steps and st["dense_read_pushes"] == steps, st
    # two asynchronous workers on 20k rows learn less steadily than one (measured 0.59-0.75
    # under load): the check is that they learned at all
    assert job.auc(job.ps[0]) > 0.55


def test_without_overlapped_pushes_and_with_sparse_dense_pulls(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(small_spec(rows=10_000))
    w = job.worker(overlap_push=False, dense_sync_every=4)
    assert w.run() == EXIT_OK
    assert_all_done_once(job)
    # one round trip per step (its pull carries the previous step's push, sparse and dense
    # together) plus one drain per shard; every step pushed exactly once
    shard = job.ps[0].shard
    assert shard.push_calls == w.steps
    assert shard.step_calls == w.steps + w.shards_done
    assert w.times.exchanges == shard.step_calls


@pytest.mark.parametrize(
    ("staleness", "transfer", "optimizer"),
    [(0, "fp32", "adagrad"), (2, "bf16", "adagrad"), (1, "fp16", "adam"), (1, "fp32", "sgd")],
)
def test_pipelined_steps_train_exactly_once_with_one_round_trip_a_step(
    make_job: Callable[..., Job], staleness: int, transfer: str, optimizer: str
) -> None:
    """Prefetch depth, transfer precision and optimizer from the spec: every shard done once,
    every step pushed once (nothing left in flight), one round trip per step plus one drain
    per shard, and the PS ran the optimizer the spec names."""
    lr = {"adagrad": 0.05, "adam": 0.005, "sgd": 0.5}[optimizer]
    job = make_job(
        small_spec(
            rows=10_000,
            training__staleness=staleness,
            training__transfer=transfer,
            training__optimizer={"name": optimizer, "lr": lr},
        )
    )
    # a fixed tower init: one worker's run is deterministic, so the AUC bound below cannot
    # flake on an unlucky init (an unseeded run gave 0.62-0.68 for staleness 2, once < 0.57)
    torch.manual_seed(0)
    w = job.worker()
    assert w.run() == EXIT_OK
    assert_all_done_once(job)
    shard = job.ps[0].shard
    assert shard.push_calls == w.steps  # each step's gradients applied once
    assert w.times.exchanges == shard.step_calls
    # staleness s: the shard's first s+1 batches are requested before any push can ride along
    per_shard = 1 + staleness
    assert shard.step_calls <= w.steps + per_shard * w.shards_done
    assert not w._inflight and w._pending is None and not w._unpushed
    assert {t["optimizer"] for t in shard.stats()["tables"].values()} == {optimizer}
    assert w.times.steps == w.steps and w.times.compute > 0
    auc = job.auc(job.ps[0])
    print(f"staleness {staleness}, {transfer}, {optimizer}: held-out AUC {auc:.3f}")
    # 10k rows learn unevenly under CI load (one run in ~6 fell below 0.6 here): it learned
    assert auc > 0.57


def delayed_adagrad(
    spec: JobSpec, staleness: int, seed: int
) -> tuple[DenseTower, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """What the worker pipeline must compute, written independently in one process with
    torch's Adagrad: step k of a shard computes on parameters that lack this shard's last
    ``min(k, staleness)`` updates (the shard's first batches were prefetched before any of its
    pushes; a shard ends with every push applied), and a dense gradient computed τ > 1
    updates before it is applied gets lr/τ, and dense update k (1 = the first) gets
    lr·min(1, k / training.dense_warmup). Returns the dense tower and, per table, (ids, rows) of
    every id trained."""
    torch.manual_seed(seed)
    tower = DenseTower(spec.model)  # the worker builds its tower from the same seed
    reader = DenseTower(spec.model)
    reader.load_state_dict(tower.state_dict())
    names, rows, dim = feature_keys(spec.model), table_rows(spec), spec.model.embedding_dim
    data = from_spec(spec)
    ids_all = embedding_ids(data.rows(0, spec.data.rows).sparse, rows)
    keys = [np.unique(c) for c in ids_all]
    tables = [
        torch.nn.Parameter(torch.from_numpy(init_rows(n, k, dim)))
        for n, k in zip(names, keys, strict=True)
    ]
    seen = [t.detach().clone() for t in tables]
    lr = spec.training.optimizer.lr
    opt = torch.optim.Adagrad([{"params": tables}, {"params": list(tower.parameters())}], lr=lr)
    warmup, k = spec.training.dense_warmup, 0
    for start in range(0, spec.data.rows, spec.shard_size):
        delayed: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], list[torch.Tensor]]] = []
        part = data.rows(start, min(spec.data.rows, start + spec.shard_size))
        for batch in part.split(spec.training.batch_size):
            idx = [
                torch.from_numpy(np.searchsorted(keys[f], c))
                for f, c in enumerate(embedding_ids(batch.sparse, rows))
            ]
            leaves = [seen[f][i].clone().requires_grad_(True) for f, i in enumerate(idx)]
            reader.zero_grad(set_to_none=True)
            logits = reader(torch.from_numpy(batch.dense), torch.stack(leaves, 1))
            F.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.labels)).backward()
            for f, t in enumerate(tables):
                t.grad = torch.sparse_coo_tensor(idx[f][None], leaves[f].grad, t.shape)
            for p, q in zip(tower.parameters(), reader.parameters(), strict=True):
                p.grad = q.grad
            tau = len(delayed)  # updates applied since this step's values were read
            k += 1
            ramp = min(1.0, k / warmup) if warmup else 1.0
            opt.param_groups[1]["lr"] = ramp * (lr / tau if tau > 1 else lr)
            with torch.no_grad():
                touched = [torch.unique(i) for i in idx]
                before = [t[i].clone() for t, i in zip(tables, touched, strict=True)]
                dense_before = [p.detach().clone() for p in tower.parameters()]
                opt.step()
                delayed.append(
                    (
                        [(i, t[i] - b) for t, i, b in zip(tables, touched, before, strict=True)],
                        [
                            p.detach() - b
                            for p, b in zip(tower.parameters(), dense_before, strict=True)
                        ],
                    )
                )
            while len(delayed) > staleness:
                sparse, dense = delayed.pop(0)
                with torch.no_grad():
                    for f, (i, d) in enumerate(sparse):
                        seen[f][i] += d
                    for p, d in zip(reader.parameters(), dense, strict=True):
                        p += d
        # the shard's flush: every update is in before the next shard's first read
        for sparse, dense in delayed:
            with torch.no_grad():
                for f, (i, d) in enumerate(sparse):
                    seen[f][i] += d
                for p, d in zip(reader.parameters(), dense, strict=True):
                    p += d
    return tower, {n: (k, t.detach().numpy()) for n, k, t in zip(names, keys, tables, strict=True)}


@pytest.mark.parametrize(("staleness", "warmup"), [(0, 100), (2, 8), (2, 0)])
def test_the_pipelined_worker_computes_exactly_delayed_adagrad(
    make_job: Callable[..., Job], staleness: int, warmup: int
) -> None:
    """The whole data plane (plan, dedup, Step RPC, prefetch ring, row hints, background
    pushes, dense versions, dense warm-up, shard flush) against an independent one-process
    torch version of delayed-update Adagrad: the same dense parameters and rows after 2 shards
    (20 steps), float32 rounding apart. A lost, doubled or misrouted update, a row buffer
    overwritten while in use, a dense lr not scaled for staleness or not warmed up as
    training.dense_warmup says moves them by up to ~lr = 0.05."""
    spec = small_spec(
        rows=5120,
        shard_batches=10,
        training__staleness=staleness,
        training__seed=3,  # the worker seeds its DenseTower init with training.seed
        training__dense_warmup=warmup,
    )
    job = make_job(spec)
    torch.manual_seed(3)  # the worker's DenseTower init
    w = job.worker()
    assert w.run() == EXIT_OK
    assert_all_done_once(job)
    tower, tables = delayed_adagrad(spec, staleness, seed=3)
    shard = job.ps[0].shard
    got = shard.pull_dense()
    for name, p in tower.named_parameters():
        np.testing.assert_allclose(got[name], p.detach().numpy(), atol=2e-5, err_msg=name)
    for name, (ids, want) in tables.items():
        np.testing.assert_allclose(
            shard.pull(name, ids, want.shape[1]), want, atol=2e-5, err_msg=name
        )
    st = shard.stats()
    assert st["dense_staleness_max"] == staleness and st["dense_version"] == w.steps == 20
    assert st["dense_warmup_pushes"] == min(20, max(0, warmup - 1))


# --- PS set changes and failures -----------------------------------------------------------


def test_worker_switches_to_a_new_ps_set(make_job: Callable[..., Job]) -> None:
    job = make_job(small_spec(rows=60_000, shard_batches=2))
    old = job.ps[0]
    run = Running(job.worker())
    wait_for(lambda: job.shards()["done"] >= 3, what="3 shards done")
    # migrate: a new PS restored from the old one's checkpoint, announced with a new version
    old.checkpoint(force=True)
    shard, _, source = restore_shard(0, 1, job.run_dir / "ps-new", [old.checkpoint_dir or ""])
    assert source.startswith("reshard:")
    restored_step = shard.step
    new = job.start_ps("ps-new", shard)
    job.state.set_ps_set([new.address], 2)
    wait_for(lambda: run.worker.ps_version == 2, timeout=10, what="the switch")
    old.stop(0)  # the old set is gone: the worker must not need it any more
    assert run.join() == EXIT_OK
    assert run.worker.ps_switches == 1 and run.worker.ps_failures == 0
    assert new.shard.step > restored_step
    assert_all_done_once(job)
    assert job.auc(new) > 0.6


def test_worker_waits_for_a_dead_ps_and_resumes_on_its_relaunch(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(small_spec(rows=40_000, shard_batches=2))
    old = job.ps[0]
    run = Running(job.worker())
    wait_for(lambda: job.shards()["done"] >= 3, what="3 shards done")
    old.checkpoint(force=True)
    old.stop(0)  # the PS dies (in-flight calls are cancelled)
    wait_for(lambda: run.worker.ps_failures >= 1, timeout=10, what="the worker to notice")
    done_while_down = job.shards()["done"]
    time.sleep(0.5)
    assert job.shards()["done"] <= done_while_down + 1  # at most the shard already pushed
    # the master relaunches PS 0 from its checkpoint, at a new address
    shard, info, _ = restore_shard(0, 1, job.run_dir / "ps0")
    assert info is not None
    new = job.start_ps("ps0-relaunched", shard)
    job.state.set_ps_set([new.address], 2)
    assert run.join() == EXIT_OK
    assert run.worker.ps_version == 2
    assert_all_done_once(job)
    assert job.auc(new) > 0.6


def test_stop_from_the_master_ends_the_worker_cleanly(make_job: Callable[..., Job]) -> None:
    job = make_job(small_spec(rows=200_000, shard_batches=2))
    run = Running(job.worker())
    wait_for(lambda: job.shards()["done"] >= 2, what="2 shards done")
    job.state.request_stop(0)
    assert run.join(timeout=20) == EXIT_OK
    assert "stop" in run.worker.exit_reason
    s = job.shards()
    assert 0 < s["done"] < s["total"] and s["doing"] <= 1 and s["completed_twice"] == 0


# --- errors and the process -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_master_ends_the_worker_with_exit_2(
    make_job: Callable[..., Job], capsys: pytest.CaptureFixture[str]
) -> None:
    job = make_job(small_spec(), start_ps=False)
    w = Worker(job.run_dir, 0, f"127.0.0.1:{free_port()}", master_retry_s=0.3)
    assert w.run() == EXIT_UNAVAILABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not answer Register" in err[0], err


def test_a_bad_spec_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wire.create_token(tmp_path)
    (tmp_path / SPEC_FILE).write_text(json.dumps({"name": "x", "model": {}}))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    sigs = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:  # main() sets up logging (to the captured stderr) and signals: put them back after
        assert main(["--run-dir", str(tmp_path), "--node-id", "0", "--master", "127.0.0.1:1"]) == 1
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for s, h in sigs.items():
            signal.signal(s, h)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spec" in err[0] and "invalid" in err[0], err
    (tmp_path / SPEC_FILE).unlink()
    assert Worker(tmp_path, 0, "127.0.0.1:1").run() == EXIT_FATAL
    assert "no job spec" in capsys.readouterr().err


def test_the_alloc_hook_holds_extra_memory(
    make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(small_spec(), start_ps=False)
    monkeypatch.setenv(ALLOC_ENV, "16")
    w = job.worker()
    w._configure()
    assert w._ballast is not None and w._ballast.nbytes == 16 * 2**20
    monkeypatch.setenv(ALLOC_ENV, "lots")
    assert job.worker().run() == EXIT_FATAL


@pytest.mark.slow  # over 3 s here: the full tier (make test-all)
def test_the_worker_process_trains_and_exits_0(make_job: Callable[..., Job]) -> None:
    job = make_job(small_spec(rows=5_000))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "dlrover_core.runtime.strategies.ps.worker",
        "--run-dir",
        str(job.run_dir),
        "--node-id",
        "3",
        "--master",
        job.master,
        "--incarnation",
        "1",
        "--threads",
        "1",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "leaving: job done" in proc.stderr
    assert_all_done_once(job)
    node = job.state.status()["nodes"][0]
    assert node["name"] == "worker-3" and node["incarnation"] == 1 and node["restarts"] == 1
