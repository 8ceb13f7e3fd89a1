"""Starting, resizing and reading an all-reduce group: the pure part the controller needs
(:func:`generation_ranks`, :func:`read_exit`) and :class:`LocalGroupHarness`, a stand-in for
the controller on local processes (tests and benchmarks use it until the controller drives the
strategy).

A generation's ranks get fresh node ids (``first_node_id .. first_node_id + W - 1``), rank
``i`` the ``i``-th; ids are never reused, so no stop request, superseded incarnation or doing
shard of an earlier process can leak into a new one (DLRover's pod scaler does the same: the
node id grows per relaunch, the rank is kept).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from dlrover_core.allreduce_config import AllReduceOptions
from dlrover_core.runtime.strategies.allreduce.agent import (
    EVENT_PREFIX,
    EXIT_FATAL,
    EXIT_NOT_RELEASED,
    EXIT_OK,
    EXIT_PEER_LOST,
    EXIT_UNAVAILABLE,
    SPEC_FILE,
    RankArgs,
    agent_argv,
)

__all__ = [
    "RANK_ENV",
    "ExitRead",
    "LocalGroupHarness",
    "RankProcess",
    "free_port",
    "generation_ranks",
    "read_exit",
]

RANK_ENV: dict[str, str] = {
    # ENVIRONMENT.md: kill/restart/scale of gloo groups only work with this set
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    "PYTHONWARNINGS": "ignore",
    # OpenMP threads sleep instead of spinning when they wait: on a shared machine a spinning
    # 2-thread rank ran 6-20x slower (836-2953 vs 16.6k samples/s; docs/decisions.md,
    # "All-reduce strategy")
    "OMP_WAIT_POLICY": "PASSIVE",
}


def generation_ranks(
    *,
    run_dir: Path,
    master: str,
    generation: int,
    world_size: int,
    first_node_id: int,
    rdzv: str,
    options: AllReduceOptions,
    after_generation: int | None = None,
    threads: int | None = None,
    ckpt_dir: Path | None = None,
) -> list[RankArgs]:
    """The ranks of one generation (pure)."""
    return [
        RankArgs(
            run_dir=run_dir,
            master=master,
            node_id=first_node_id + r,
            rank=r,
            world_size=world_size,
            generation=generation,
            rdzv=rdzv,
            ckpt_dir=ckpt_dir,
            after_generation=after_generation,
            threads=threads,
            options=options,
        )
        for r in range(world_size)
    ]


@dataclass(frozen=True)
class ExitRead:
    """What a rank's exit means for the controller. ``kind``: ok (done or stopped at a
    checkpoint: check the shard queue), fatal (no relaunch), unavailable, peer_lost (relaunch
    the group), not_released, killed (signal: OOM or preemption; relaunch), failed (other)."""

    kind: str
    relaunch: bool


def read_exit(code: int) -> ExitRead:
    if code == EXIT_OK:
        return ExitRead("ok", False)
    if code == EXIT_FATAL:
        return ExitRead("fatal", False)
    if code == EXIT_UNAVAILABLE:
        return ExitRead("unavailable", True)
    if code == EXIT_PEER_LOST:
        return ExitRead("peer_lost", True)
    if code == EXIT_NOT_RELEASED:
        return ExitRead("not_released", True)
    if code < 0 or code >= 128:
        return ExitRead("killed", True)
    return ExitRead("failed", True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the local stand-in for the controller ---------------------------------------------------


@dataclass
class RankProcess:
    args: RankArgs
    proc: subprocess.Popen[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    @property
    def node_id(self) -> int:
        return self.args.node_id

    def event(self, name: str) -> dict[str, Any] | None:
        for e in self.events:
            if e["event"] == name:
                return e
        return None


def _pump(stream: IO[str], sink: Callable[[str], None]) -> None:
    for line in stream:
        sink(line.rstrip("\n"))


class LocalGroupHarness:
    """Runs generations of rank processes against a real master (``MasterState`` +
    ``serve_master`` in this process), the way the controller will: launch, request stop,
    read exits, mark nodes, relaunch at another size. Every rank is its own session; every
    exit path kills the sessions (no orphans)."""

    def __init__(
        self,
        run_dir: Path,
        spec_dict: Mapping[str, Any],
        *,
        options: AllReduceOptions | None = None,
        threads: int = 1,
        env: Mapping[str, str] | None = None,
        synchronous: str = "NORMAL",
    ) -> None:
        from dlrover_core.runtime import wire
        from dlrover_core.runtime.service import serve_master
        from dlrover_core.runtime.state import MasterState
        from dlrover_core.spec import load_spec

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.spec = load_spec(spec_dict)
        self.options = options or AllReduceOptions()
        self.threads = threads
        self.env = {**os.environ, **RANK_ENV, **(env or {})}
        self.token = wire.create_token(self.run_dir)
        (self.run_dir / SPEC_FILE).write_text(json.dumps(dict(spec_dict)))
        self.state = MasterState(
            self.run_dir,
            total_rows=self.spec.data.rows,
            shard_size=self.spec.shard_size,
            epochs=self.spec.training.epochs or 1,
            synchronous=synchronous,
        )
        self.server, port = serve_master(self.state, self.token)
        self.master = f"127.0.0.1:{port}"
        self.generation = -1
        self.next_node_id = 0
        self.ranks: list[RankProcess] = []  # the current generation
        self.history: list[list[RankProcess]] = []

    # --- generations --------------------------------------------------------------------------

    def launch(self, world_size: int, *, after_previous: bool = False) -> list[RankProcess]:
        """Start generation ``g+1`` of ``world_size`` ranks (``after_previous``: pre-warmed,
        they join once generation ``g`` left at a final checkpoint)."""
        self.generation += 1
        ranks = generation_ranks(
            run_dir=self.run_dir,
            master=self.master,
            generation=self.generation,
            world_size=world_size,
            first_node_id=self.next_node_id,
            rdzv=f"127.0.0.1:{free_port()}",
            options=self.options,
            after_generation=self.generation - 1 if after_previous else None,
            threads=self.threads,
        )
        self.next_node_id += world_size
        procs = []
        for a in ranks:
            env = {**self.env, "OMP_NUM_THREADS": str(self.threads)}
            p = subprocess.Popen(
                agent_argv(a, sys.executable),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,
            )
            rp = RankProcess(a, p)

            def on_out(line: str, rp: RankProcess = rp) -> None:
                if line.startswith(EVENT_PREFIX):
                    rp.events.append(json.loads(line[len(EVENT_PREFIX) :]))

            assert p.stdout is not None and p.stderr is not None
            threading.Thread(target=_pump, args=(p.stdout, on_out), daemon=True).start()
            threading.Thread(target=_pump, args=(p.stderr, rp.stderr.append), daemon=True).start()
            procs.append(rp)
        if self.ranks:
            self.history.append(self.ranks)
        self.ranks = procs
        return procs

    def request_stop(self, ranks: Sequence[RankProcess] | None = None) -> None:
        """The controller's resize request: ask the group's nodes to leave at a checkpoint."""
        for rp in ranks if ranks is not None else self.ranks:
            self.state.request_stop(rp.node_id)

    def wait(self, ranks: Sequence[RankProcess] | None = None, timeout: float = 120.0) -> list[int]:
        """Wait for the ranks to exit, mark each node finished in the master (which gives its
        doing shards back), return the exit codes. Kills them all on timeout."""
        from dlrover_core.types import NodeState, Role

        group = list(ranks if ranks is not None else self.ranks)
        deadline = time.monotonic() + timeout
        codes: list[int] = []
        for rp in group:
            try:
                codes.append(rp.proc.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill(group)
                raise TimeoutError(
                    f"generation {rp.args.generation} did not exit within {timeout:g} s; "
                    f"killed it. stderr of rank {rp.args.rank}: {rp.stderr[-5:]}"
                ) from None
        for rp, code in zip(group, codes, strict=True):
            ok = code == EXIT_OK
            self.state.mark_node(
                Role.WORKER, rp.node_id, NodeState.SUCCEEDED if ok else NodeState.FAILED
            )
        return codes

    def wait_any_exit(self, timeout: float) -> RankProcess | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rp in self.ranks:
                if rp.proc.poll() is not None:
                    return rp
            time.sleep(0.05)
        return None

    def kill(self, ranks: Sequence[RankProcess] | None = None, sig: int = signal.SIGKILL) -> None:
        for rp in ranks if ranks is not None else self.ranks:
            if rp.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rp.proc.pid, sig)

    def wait_for(
        self, cond: Callable[[], bool], timeout: float, what: str, poll_s: float = 0.05
    ) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
            if any(rp.proc.poll() not in (None, 0) for rp in self.ranks):
                bad = [(rp.args.rank, rp.proc.returncode, rp.stderr[-3:]) for rp in self.ranks]
                raise RuntimeError(f"a rank exited while waiting for {what}: {bad}")
            time.sleep(poll_s)

    def shards(self) -> dict[str, int]:
        return dict(self.state.shards.summary())

    def all_processes(self) -> list[RankProcess]:
        return [rp for g in self.history for rp in g] + self.ranks

    def close(self) -> None:
        for rp in self.all_processes():
            if rp.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rp.proc.pid, signal.SIGKILL)
                rp.proc.wait(10)
        self.server.stop(0)
        self.state.close()

    def __enter__(self) -> LocalGroupHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def with_options(self, **changes: Any) -> None:
        self.options = replace(self.options, **changes)
