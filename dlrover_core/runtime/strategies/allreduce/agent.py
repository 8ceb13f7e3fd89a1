"""One rank of an all-reduce group, as a process: its own thin elastic agent plus the trainer.

Run one process per rank (the controller does; the master writes ``DIR/spec.json`` and the
token first)::

    python -m dlrover_core.runtime.strategies.allreduce.agent --run-dir DIR --master HOST:PORT \\
        --node-id N --rank R --world-size W --generation G --rdzv HOST:PORT \\
        [--rdzv-prefix P] [--incarnation I] [--ckpt-dir DIR] [--after-generation G0] \\
        [--threads T] \\
        [--sharding table_wise,column_wise] [--table-sharding TABLE=type,...] \\
        [--backend auto|gloo|nccl] [--checkpoint-interval-s S] [--keep-checkpoints K]

**The controller owns the size.** A *generation* is one group of ``W`` processes with ranks
``0..W-1``; its membership never changes. A resize is: the old generation checkpoints and
leaves (it was asked to stop), a new generation of the new size starts from that checkpoint
with a new sharding plan and loads it resharded. To hide the new processes' start-up (importing
torch + torchrec takes ~6 s here), the controller may start the new generation *before*
stopping the old one with ``--after-generation G_old``: the new processes import, build
nothing yet, and wait until a complete checkpoint of ``G_old`` marked final exists (or one of a
later generation), then join. Without the flag a rank starts at once (first start, or after a
crash: the latest complete checkpoint, whatever wrote it).

What a rank does:

1. Reads the spec and token from ``DIR``; waits for the release of ``--after-generation``.
2. Registers with the master (role worker, its own node id, pid, incarnation) and heartbeats
   every ``pacing.heartbeat_interval_s`` (CPU, RSS, steps, samples/s, rank, world size,
   generation). A heartbeat reply ``stop`` (the controller's ``request_stop``), or SIGTERM,
   asks the *group* to checkpoint and leave.
3. Joins the process group (``init_method tcp://RDZV``: rank 0 hosts the store; gloo, or nccl
   with CUDA), with a collective timeout of ``pacing.dead_after_s``: a rank that vanishes or
   hangs makes every collective fail within that time, never hang.
4. Plans the sharding (torchrec planner, collective), builds DMP, loads the latest complete
   checkpoint (resharded), and rank 0 reports that checkpoint's shards done again (see
   :mod:`.checkpoint`: exactly once).
5. Loops over *rounds*. Each round: all ranks all-reduce their stop flags; rank 0 decides and
   broadcasts one command: ``TRAIN`` with up to W shard row ranges it took from the master's
   queue (the group trains them in lockstep, :func:`~.trainer.rank_slices`), ``CHECKPOINT``
   (every ``--checkpoint-interval-s``, or when the queue says to wait while the group holds
   trained shards), ``STOP`` (checkpoint marked final, then exit 0), ``DONE`` (no shard left:
   final checkpoint marked job done, exit 0), or ``WAIT`` (others' shards are still out).
   Rank 0 reports a shard done only after the checkpoint that holds its updates is complete.

Why rank 0 takes the shards for the group (and not each rank its own): every rank then knows
the round's rows from one broadcast of a few integers, so all run the same steps by
construction, the shard queue sees one holder per round, and a resize or crash never leaves
half-trained shards on several ranks; each rank still reads only its own rows (the data is
addressed by row index). The cost is one get_shard RPC per shard on rank 0 (~0.5 ms) per
``shard_batches`` steps.

Exit codes: 0 the job is done or the group stopped at a checkpoint (the master's shard queue
tells which: no todo/doing shard left means done); 1 a fatal input error (bad spec or options,
a plan torchrec cannot make), one line on stderr; 2 the master stayed unreachable for
``min(60 s, dead_after_s)``; 3 a peer was lost (a collective failed or timed out); 4 the
generation given by ``--after-generation`` never released within ``pacing.dead_after_s``.
The process starts no children; the backend should still kill its process group.

Progress lines on stdout (for harnesses and benchmarks): ``ALLREDUCE-EVENT {json}`` with the
wall time of each phase (gate passed, registered, group joined, model built, checkpoint loaded,
first step, stop seen, final checkpoint, exit).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from dlrover_core.allreduce_config import AllReduceOptions, validate_allreduce
from dlrover_core.errors import DLRoverError
from dlrover_core.runtime import wire
from dlrover_core.runtime.files import is_disk_full
from dlrover_core.runtime.master_client import (
    MasterClient,
    MasterRejectedError,
    MasterUnavailableError,
)
from dlrover_core.runtime.shards import Shard
from dlrover_core.runtime.strategies.allreduce.checkpoint import (
    CheckpointMeta,
    CheckpointStore,
    ShardRecord,
    load_into,
    save_collective,
)
from dlrover_core.spec import JobSpec, load_spec
from dlrover_core.types import Role
from dlrover_core.units import mib_from_bytes

log = logging.getLogger("dlrover_rm.rank")

SPEC_FILE = "spec.json"
CKPT_DIR = "allreduce-ckpt"
EVENT_PREFIX = "ALLREDUCE-EVENT "

DELAY_ENV = "DLROVER_RM_AR_ROUND_DELAY_S"
"""Seconds rank 0 waits before each training round: slows a job down for resize and fault
tests (a small job otherwise ends before a resize can happen)."""

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_UNAVAILABLE = 2
EXIT_PEER_LOST = 3
EXIT_NOT_RELEASED = 4

CMD_TRAIN = 1
CMD_CHECKPOINT = 2
CMD_STOP = 3
CMD_DONE = 4
CMD_WAIT = 5
_CMD_NAMES = {1: "train", 2: "checkpoint", 3: "stop", 4: "done", 5: "wait"}

__all__ = [
    "CKPT_DIR",
    "DELAY_ENV",
    "EVENT_PREFIX",
    "EXIT_FATAL",
    "EXIT_NOT_RELEASED",
    "EXIT_OK",
    "EXIT_PEER_LOST",
    "EXIT_UNAVAILABLE",
    "RankAgent",
    "RankArgs",
    "agent_argv",
    "main",
    "released",
]


def released(store: CheckpointStore, generation: int) -> bool:
    """True once ``generation`` has left at a final checkpoint (or a later generation
    checkpointed): a new generation started with ``--after-generation`` may join."""
    for c in reversed(store.complete()):
        if c.meta.generation > generation or (c.meta.generation == generation and c.meta.final):
            return True
    return False


@dataclass(frozen=True)
class RankArgs:
    run_dir: Path
    master: str
    node_id: int
    rank: int
    world_size: int
    generation: int
    rdzv: str
    incarnation: int = 0
    rdzv_prefix: str | None = None  # set: the store at rdzv is the master's, keys under it
    ckpt_dir: Path | None = None
    after_generation: int | None = None
    threads: int | None = None
    options: AllReduceOptions = field(default_factory=AllReduceOptions)

    @property
    def checkpoint_root(self) -> Path:
        return self.ckpt_dir if self.ckpt_dir is not None else self.run_dir / CKPT_DIR


def agent_argv(args: RankArgs, python: str = sys.executable) -> list[str]:
    """The command line that starts the rank described by ``args`` (for a backend)."""
    argv = [
        python,
        "-m",
        "dlrover_core.runtime.strategies.allreduce.agent",
        "--run-dir",
        str(args.run_dir),
        "--master",
        args.master,
        "--node-id",
        str(args.node_id),
        "--rank",
        str(args.rank),
        "--world-size",
        str(args.world_size),
        "--generation",
        str(args.generation),
        "--rdzv",
        args.rdzv,
        "--incarnation",
        str(args.incarnation),
    ]
    if args.rdzv_prefix:
        argv += ["--rdzv-prefix", args.rdzv_prefix]
    if args.ckpt_dir is not None:
        argv += ["--ckpt-dir", str(args.ckpt_dir)]
    if args.after_generation is not None:
        argv += ["--after-generation", str(args.after_generation)]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    return argv + args.options.to_argv()


class _PeerLost(Exception):
    pass


class RankAgent:
    """The rank's life: gate, register, join, build, load, rounds, leave. See the module
    docstring. ``run()`` returns the exit code."""

    def __init__(self, args: RankArgs) -> None:
        self.args = args
        self.store = CheckpointStore(args.checkpoint_root)
        self._stop = threading.Event()
        self._closing = threading.Event()
        self.exit_reason = ""
        self.events: dict[str, float] = {"started": time.time()}
        self.steps = 0
        self.samples = 0
        self.global_step = 0
        self._client: MasterClient | None = None
        self._spec: JobSpec | None = None
        self._rate: list[tuple[float, int]] = []
        self._hb: threading.Thread | None = None

    # --- plumbing ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def _event(self, name: str, **extra: Any) -> None:
        now = time.time()
        self.events[name] = now
        line = {
            "event": name,
            "t": now,
            "rank": self.args.rank,
            "node_id": self.args.node_id,
            "generation": self.args.generation,
            "world_size": self.args.world_size,
            **extra,
        }
        print(EVENT_PREFIX + json.dumps(line), flush=True)
        if name == "warm" and self._client is not None:  # the fact the master acts on
            a = self.args
            self._client.report_event(Role.WORKER, a.node_id, a.incarnation, "warm")

    def _fail(self, message: str, kind: str = "failed") -> None:
        """The one-line reason on stderr, and to the master as a fact (``failed``, or
        ``disk_full``), before this rank exits on it."""
        _one_line(message)
        if self._client is not None:
            a = self.args
            self._client.report_event(Role.WORKER, a.node_id, a.incarnation, kind, message)

    @property
    def spec(self) -> JobSpec:
        assert self._spec is not None
        return self._spec

    @property
    def client(self) -> MasterClient:
        assert self._client is not None
        return self._client

    # --- phases -----------------------------------------------------------------------------

    def _configure(self) -> None:
        a = self.args
        spec_path = a.run_dir / SPEC_FILE
        if not spec_path.is_file():
            raise DLRoverError(
                f"{spec_path} does not exist: start ranks through the job master (it writes "
                "the spec and token into the run directory)"
            )
        self._spec = load_spec(json.loads(spec_path.read_text()))
        import torch

        # import torchrec and fbgemm now: a pre-warmed rank has them loaded before its gate
        import dlrover_core.runtime.strategies.allreduce.trainer  # noqa: F401

        validate_allreduce(
            self.spec, a.world_size, a.options, cuda_available=torch.cuda.is_available()
        )
        if not 0 <= a.rank < a.world_size:
            raise DLRoverError(f"--rank {a.rank} must be in [0, --world-size {a.world_size})")
        if a.threads:
            torch.set_num_threads(max(1, a.threads))
        dead = self.spec.pacing.dead_after_s
        self._client = MasterClient(
            a.master, wire.read_token(a.run_dir), retry_for_s=min(60.0, dead)
        )

    def _wait_released(self) -> bool:
        g = self.args.after_generation
        if g is None:
            return True
        deadline = time.monotonic() + self.spec.pacing.dead_after_s
        while not released(self.store, g):
            if self._stop.is_set():
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"generation {g} did not leave a final checkpoint in {self.store.root} "
                    f"within pacing.dead_after_s ({self.spec.pacing.dead_after_s:g} s)"
                )
            time.sleep(0.02)
        return True

    def _start_heartbeat(self) -> None:
        self._hb = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._hb.start()

    def _samples_per_s(self, now: float) -> float:
        window = self.spec.pacing.sample_window_s
        self._rate.append((now, self.samples))
        while len(self._rate) > 2 and self._rate[1][0] < now - window:
            self._rate.pop(0)
        (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def _heartbeat_loop(self) -> None:
        import psutil

        proc = psutil.Process()
        proc.cpu_percent(None)
        interval = self.spec.pacing.heartbeat_interval_s
        while not self._closing.wait(interval):
            try:
                now = time.monotonic()
                reply = self.client.heartbeat(
                    cpu_percent=proc.cpu_percent(None),
                    rss_mib=mib_from_bytes(proc.memory_info().rss),
                    step=self.steps,
                    samples_per_s=self._samples_per_s(now),
                    global_step=self.global_step,
                    rank=self.args.rank,
                    world_size=self.args.world_size,
                    generation=self.args.generation,
                )
                if reply.stop and not self._stop.is_set():
                    self._stop.set()
            except MasterUnavailableError as e:
                _one_line(f"rank {self.args.rank}: {e}")
                os._exit(EXIT_UNAVAILABLE)  # a collective may hold the main thread
            except MasterRejectedError as e:
                if e.superseded:
                    self._stop.set()
                else:
                    log.warning("heartbeat refused: %s", e)

    def _join(self) -> Any:
        import torch
        import torch.distributed as dist

        a = self.args
        backend = a.options.resolved_backend(torch.cuda.is_available())
        if backend == "nccl":
            torch.cuda.set_device(a.rank % max(1, torch.cuda.device_count()))
        timeout = timedelta(seconds=self.spec.pacing.dead_after_s)
        if a.rdzv_prefix:
            # the job master hosts the store (every backend knows its address; no rank's
            # address is needed before the ranks start); each group has its own key prefix
            host, _, port = a.rdzv.rpartition(":")
            store = dist.TCPStore(
                host, int(port), is_master=False, timeout=timeout, wait_for_workers=False
            )
            dist.init_process_group(
                backend,
                store=dist.PrefixStore(a.rdzv_prefix, store),
                rank=a.rank,
                world_size=a.world_size,
                timeout=timeout,
            )
            return backend
        dist.init_process_group(
            backend,
            init_method=f"tcp://{a.rdzv}",
            rank=a.rank,
            world_size=a.world_size,
            timeout=timeout,
        )
        return backend

    # --- rounds (rank 0 decides) -------------------------------------------------------------

    def run(self) -> int:
        try:
            return self._run()
        except _PeerLost as e:
            self.exit_reason = f"peer lost: {e}"
            self._fail(f"rank {self.args.rank} (generation {self.args.generation}): {e}")
            self._event("exit", code=EXIT_PEER_LOST, reason="peer lost")
            os._exit(EXIT_PEER_LOST)  # the process group cannot be torn down cleanly now
        except MasterUnavailableError as e:
            _one_line(f"rank {self.args.rank}: {e}")
            os._exit(EXIT_UNAVAILABLE)
        except TimeoutError as e:
            self._fail(f"rank {self.args.rank}: {e}")
            return EXIT_NOT_RELEASED
        except DLRoverError as e:
            self._fail(f"rank {self.args.rank}: {e}")
            return EXIT_FATAL
        except OSError as e:
            if not is_disk_full(e):
                raise
            self._fail(f"rank {self.args.rank}: disk full: {e}", "disk_full")
            return EXIT_FATAL
        finally:
            self._closing.set()

    def _run(self) -> int:
        self._configure()
        self._event("warm")
        if not self._wait_released():
            return EXIT_OK
        self._event("released")
        a = self.args
        self.client.register(Role.WORKER, a.node_id, os.getpid(), a.incarnation)
        self._start_heartbeat()
        self._event("registered")
        try:
            backend = self._join()
        except RuntimeError as e:
            raise _PeerLost(f"could not join the group at {a.rdzv}: {_first_line(e)}") from e
        self._event("joined")
        try:
            return self._group(backend)
        except RuntimeError as e:  # gloo/nccl: a peer died, hung past the timeout, or left
            raise _PeerLost(_first_line(e)) from e

    def _group(self, backend: str) -> int:
        import torch
        import torch.distributed as dist
        from torchrec.distributed.planner.types import PlannerError

        from dlrover_core.runtime.strategies.allreduce.trainer import RankTrainer

        a = self.args
        try:
            trainer = RankTrainer(self.spec, a.options, backend=backend)
        except PlannerError as e:  # e.g. the tables do not fit the ranks' memory
            raise DLRoverError(
                f"torchrec's planner cannot shard this model over {a.world_size} rank(s): "
                f"{_first_line(e)}; allow more sharding types or plan more ranks"
            ) from e
        self._event("built", plan=trainer.plan_summary)
        latest = self.store.latest()
        head = torch.zeros(4, dtype=torch.int64)
        if a.rank == 0:
            self.store.root.mkdir(parents=True, exist_ok=True)
            self.store.clean_tmp(before_generation=a.generation)
            if latest is not None:
                m = latest.meta
                head[:] = torch.tensor([m.seq, m.global_step, m.samples, m.shards_total])
        dist.broadcast(head, src=0)
        seq, self.global_step, samples_total, shards_total = (int(x) for x in head.tolist())
        if seq and (latest is None or latest.meta.seq != seq):
            raise DLRoverError(
                f"rank {a.rank} does not see checkpoint {seq} under {self.store.root}: every "
                "rank must mount the same checkpoint directory"
            )
        if latest is None:
            # a fresh group meets a fresh optimizer, whose first dense update is lr·sign(g)
            # on every weight: ramp the dense lr up, as the PS does and for its reason
            # (training.dense_warmup; docs/decisions.md)
            trainer.warm_up_dense(self.spec.training.dense_warmup)
            self._start_from_parent(trainer)
        else:
            state = trainer.state_dict()
            load_into(state, latest.path)
            trainer.load_state(state)
            self._event("loaded", seq=seq, from_world_size=latest.meta.world_size)
            if a.rank == 0:
                for rec in latest.meta.shards:
                    self._report(rec)
        pending: list[ShardRecord] = []
        self._event("ready")
        last_ckpt = time.monotonic()
        first = True
        buf_len = 2 + 2 * a.world_size
        while True:
            flag = torch.tensor([1 if self._stop.is_set() else 0], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            buf = torch.zeros(buf_len, dtype=torch.int64)
            taken: list[Shard] = []
            if a.rank == 0:
                due = time.monotonic() - last_ckpt >= a.options.checkpoint_interval_s
                cmd, taken = self._decide(bool(flag.item()), bool(pending), due)
                buf[0], buf[1] = cmd, len(taken)
                for i, s in enumerate(taken):
                    buf[2 + 2 * i], buf[3 + 2 * i] = s.start, s.end
            dist.broadcast(buf, src=0)
            cmd, n = int(buf[0]), int(buf[1])
            if cmd == CMD_TRAIN:
                ranges = [(int(buf[2 + 2 * i]), int(buf[3 + 2 * i])) for i in range(n)]
                res = trainer.train_rows(ranges)
                self.steps += res.steps
                self.global_step += res.steps
                self.samples += res.samples
                pending += [ShardRecord(s.shard_id, a.node_id, s.attempt, s.rows) for s in taken]
                if first:
                    first = False
                    self._event("first_round", steps=res.steps)
                continue
            if cmd == CMD_WAIT:
                time.sleep(0.2)
                continue
            final = cmd in (CMD_STOP, CMD_DONE)
            if final:
                self._event("stop_seen" if cmd == CMD_STOP else "done_seen")
            samples_round = torch.tensor([self.samples], dtype=torch.int64)
            dist.all_reduce(samples_round)  # the group's samples since it started
            seq += 1
            meta = CheckpointMeta(
                seq=seq,
                generation=a.generation,
                world_size=a.world_size,
                global_step=self.global_step,
                samples=samples_total + int(samples_round.item()),
                shards=tuple(pending),
                shards_total=shards_total + len(pending),
                final=final,
                job_done=cmd == CMD_DONE,
                time_s=time.time(),
                plan=trainer.plan_summary,
            )
            tmp = self.store.tmp_path(seq, a.generation)
            t0 = time.monotonic()
            save_collective(trainer.state_dict(), tmp, None)
            if a.rank == 0:
                self.store.commit(tmp, meta)
                for rec in pending:
                    self._report(rec)
                self.store.prune(a.options.keep_checkpoints)
            shards_total += len(pending)
            pending = []
            last_ckpt = time.monotonic()
            self._event("checkpoint", seq=seq, save_s=round(last_ckpt - t0, 3), final=final)
            if final:
                dist.barrier()
                dist.destroy_process_group()
                self.exit_reason = "job done" if cmd == CMD_DONE else "stopped at a checkpoint"
                self._event("exit", code=EXIT_OK, reason=self.exit_reason)
                return EXIT_OK

    def _start_from_parent(self, trainer: Any) -> None:
        """A first group of a run with ``training.init_from``: rank 0 fills a fresh model
        from the parent (:mod:`dlrover_core.training.carry`) and writes it where every rank
        loads it (resharded to this group's plan); the optimizer starts afresh (its dense lr
        ramped up by the caller, as for any fresh group)."""
        from dlrover_core.training.carry import ParentTables, fill_local_state, parent_path

        src = parent_path(self.args.run_dir)
        if not self.spec.training.init_from or not src.exists():
            return
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        from dlrover_core.training.model import LocalDLRM

        init_dir = src.parent / "allreduce-start"
        if self.args.rank == 0:
            torch.manual_seed(self.spec.training.seed or 0)
            local = LocalDLRM(self.spec.model)
            sd = local.state_dict()
            with torch.no_grad():
                filled = fill_local_state(sd, ParentTables.load(src))
            if init_dir.exists():
                shutil.rmtree(init_dir, ignore_errors=True)
            dcp.save({"model": sd}, checkpoint_id=str(init_dir), no_dist=True)
            self._event("parent_written", tables=filled)
        dist.barrier()
        state = {"model": trainer.model.state_dict()}
        load_into(state, init_dir)
        trainer.model.load_state_dict(state["model"])
        self._event("started_from_parent")

    def _decide(self, stop: bool, pending: bool, due: bool) -> tuple[int, list[Shard]]:
        """Rank 0: the round's command (see the module docstring) and the shards it took."""
        if stop:
            return CMD_STOP, []
        if pending and due:
            return CMD_CHECKPOINT, []
        taken: list[Shard] = []
        reply = None
        for _ in range(self.args.world_size):
            reply = self.client.get_shard()
            if reply.shard is None:
                break
            taken.append(reply.shard)
        if taken:
            delay = float(os.environ.get(DELAY_ENV, "0") or 0)
            if delay > 0:
                time.sleep(delay)
            return CMD_TRAIN, taken
        assert reply is not None
        if reply.stop:
            return CMD_STOP, []
        if reply.done:
            return CMD_DONE, []
        return (CMD_CHECKPOINT if pending else CMD_WAIT), []

    def _report(self, rec: ShardRecord) -> None:
        """Report a checkpointed shard done as the take that trained it (node and attempt),
        so a repeated report of the same take counts once."""
        if rec.worker_id == self.args.node_id and rec.shard_id in self.client.held:
            self.client.shard_done(rec.shard_id, rec.rows)
            return
        # another node's take (an earlier generation): the RPC takes any worker id; the
        # client has no parameter for it, so call the method through its retrying path
        self.client._call(
            "ShardDone",
            {
                "worker_id": rec.worker_id,
                "shard_id": rec.shard_id,
                "samples": rec.rows,
                "attempt": rec.attempt,
            },
        )


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _one_line(message: str) -> None:
    print(" ".join(message.split()), file=sys.stderr, flush=True)


# --- process entry ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> RankArgs:
    p = argparse.ArgumentParser(
        prog="python -m dlrover_core.runtime.strategies.allreduce.agent",
        description="One rank of an all-reduce job (see the module docstring).",
    )
    p.add_argument("--run-dir", required=True, type=Path, help="the job's run dir")
    p.add_argument("--master", required=True, help="the job master's HOST:PORT")
    p.add_argument("--node-id", type=int, required=True, help="this process's node id")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--generation", type=int, required=True, help="the group's generation")
    p.add_argument("--rdzv", required=True, help="HOST:PORT of the group's store (rank 0 binds)")
    p.add_argument(
        "--rdzv-prefix", default=None, help="the store at --rdzv is the master's: key prefix"
    )
    p.add_argument("--incarnation", type=int, default=0)
    p.add_argument("--ckpt-dir", type=Path, default=None, help=f"default RUN_DIR/{CKPT_DIR}")
    p.add_argument("--after-generation", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads (the planned CPU)")
    p.add_argument("--sharding", default=None, help="comma-separated torchrec sharding types")
    p.add_argument("--table-sharding", action="append", default=[], help="TABLE=type[,type]")
    p.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    p.add_argument("--checkpoint-interval-s", type=float, default=10.0)
    p.add_argument("--keep-checkpoints", type=int, default=2)
    ns = p.parse_args(argv)
    options = AllReduceOptions.parse(
        ns.sharding,
        ns.table_sharding,
        ns.backend,
        ns.checkpoint_interval_s,
        ns.keep_checkpoints,
    )
    return RankArgs(
        run_dir=ns.run_dir,
        master=ns.master,
        node_id=ns.node_id,
        rank=ns.rank,
        world_size=ns.world_size,
        generation=ns.generation,
        rdzv=ns.rdzv,
        incarnation=ns.incarnation,
        rdzv_prefix=ns.rdzv_prefix,
        ckpt_dir=ns.ckpt_dir,
        after_generation=ns.after_generation,
        threads=ns.threads,
        options=options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from dlrover_core import logs

    logs.setup_node("warning")
    try:
        args = _parse(argv)
    except DLRoverError as e:
        _one_line(str(e))
        return EXIT_FATAL
    agent = RankAgent(args)

    def on_signal(signum: int, frame: Any) -> None:
        agent.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
