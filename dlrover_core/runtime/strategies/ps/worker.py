"""The worker process of the PS runtime: asynchronous SGD against the parameter servers.

Run one as a process (the local backend does; the master writes ``DIR/spec.json`` and the
token first)::

    python -m dlrover_core.runtime.strategies.ps.worker --run-dir DIR --node-id I --master HOST:PORT
        [--incarnation N] [--threads T]

What it does:

1. Reads the job spec from ``DIR/spec.json`` and the job token from ``DIR``; sets torch's
   intra-op threads to ``T`` (the planned CPU; the backend also sets ``OMP_NUM_THREADS`` and
   the CPU affinity).
2. Registers with the master (role worker, node id, pid, incarnation) and learns the PS set;
   builds a :class:`~dlrover_core.training.model.DenseTower`, offers its initial parameters to
   the PS (``init_dense``: the first writer wins) and pulls the winners, so every worker starts
   from the same dense parameters.
3. Loops, with no barrier between workers: take a shard from the master → read its rows →
   per mini-batch of ``training.batch_size``: one ``Step`` round trip per PS
   (:meth:`~dlrover_core.runtime.strategies.ps.client.PSClient.exchange`) carries the previous
   step's gradients (the unique rows' gradients, summed over duplicate ids by autograd, and the
   dense gradients) and the ids of the batch ``training.staleness`` steps ahead, deduplicated
   and routed once on the worker (:class:`~dlrover_core.runtime.strategies.ps.client.StepPlan`);
   the PS applies the push, then reads, and returns the rows (and the dense parameters). With
   staleness ≥ 1 the exchanges run in order on one background thread while the current batch
   computes (prefetch + background push): a step then sees the PS state without the updates of
   its last ``staleness`` steps (default 1; 0: no overlap, still one round trip a step). The PS
   applies ``training.optimizer`` (Adagrad, Adam, SGD: torch's rules) with its ``lr``; rows and
   gradients travel in ``training.transfer`` precision (fp32, bf16, fp16). Dense gradients go
   with the version of the dense values they were computed on (``dense_read``); the PS applies
   one computed τ > 1 updates ago with lr/τ (other workers' pushes count too: two workers at
   staleness 1 lag about 3 updates). Before a shard is
   reported done, :meth:`Worker._flush` drains every exchange in flight and pushes the last
   step's gradients (a push that failed is kept and retried, never dropped), so the shard's
   updates are on the PS when the master counts it.
   ``wait`` from the master: sleep briefly and ask again; ``done`` or ``stop``: exit 0.
4. A heartbeat thread reports, every ``pacing.heartbeat_interval_s``, the CPU of this process
   and its children (percent of one core, like ``top``), their RSS in MiB, the local step and
   samples/s over the last ``pacing.sample_window_s``. When a reply carries a newer PS set
   version the loop switches to the new addresses between two batches and re-syncs the dense
   parameters; when it says ``stop`` the loop finishes the current batch and exits 0 without
   reporting the unfinished shard (the master gives it back to the queue).

Faults:

- A PS that cannot be reached during a batch (:class:`~dlrover_core.runtime.strategies.ps.client.
  PSUnavailable`) makes the worker poll the master's PS set (the master relaunches a dead PS on
  the same index, perhaps at a new address, and bumps the version), reconnect, re-sync the
  dense parameters and redo the batch. A shard is reported done only after every one of its
  batches was pushed. (A batch redone after a failure that hit some PS but not others is
  applied twice on those: harmless noise for asynchronous SGD.) Past ``ps_wait_s`` (600 s by
  default) without a reachable PS set the worker gives up with exit code 2.
- A master that stays unreachable past the client's retry window (60 s) ends the worker with
  exit code 2 and a one-line message.

Exit codes: 0 finished or stopped (also: superseded by a newer incarnation of this node);
1 a fatal configuration error (bad spec, no token, a spec the PS worker cannot build), with a
one-line message on stderr; 2 the master or the PS set stayed unreachable; any other exception
propagates (Python exits 1 with a traceback).

Environment hook for fault tests: ``DLROVER_RM_WORKER_ALLOC_MIB=N`` makes the worker allocate
and touch N MiB at start and hold them for its life, to push it over its memory limit.

Where a step goes is in :class:`StepTimes` (``Worker.times``); ``benchmarks/ps_step.py``
prints it and ``benchmarks/runtime_throughput.py`` compares the runtime with a single-process
DLRM (figures in docs/decisions.md, "PS data plane").
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from dlrover_core.errors import DLRoverError
from dlrover_core.runtime import wire
from dlrover_core.runtime.master_client import (
    MasterClient,
    MasterRejectedError,
    MasterUnavailableError,
)
from dlrover_core.runtime.strategies.ps.client import (
    Exchange,
    PSClient,
    PSError,
    PSUnavailable,
    StepPlan,
)
from dlrover_core.runtime.strategies.ps.step import (
    DenseSync,
    StepGrads,
    StepTimes,
    evaluate_on_ps,
    forward_backward,
    load_dense,
    opt_fields,
    step_plan,
    table_rows,
)
from dlrover_core.runtime.strategies.ps.usage import Rate, Usage
from dlrover_core.spec import JobSpec, load_spec
from dlrover_core.training.data import Batch, from_spec
from dlrover_core.training.model import DenseTower, feature_keys
from dlrover_core.types import Role
from dlrover_core.units import bytes_from_mib

log = logging.getLogger("dlrover_rm.worker")

SPEC_FILE = "spec.json"
ALLOC_ENV = "DLROVER_RM_WORKER_ALLOC_MIB"
"""Extra MiB a worker allocates (and touches) at start; for memory-limit fault tests."""

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_UNAVAILABLE = 2

__all__ = [
    "ALLOC_ENV",
    "EXIT_FATAL",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "SPEC_FILE",
    "PSWaitTimeout",
    "Worker",
    "WorkerConfigError",
    "evaluate_on_ps",  # ps/strategy.py reads it from here (its home: .step)
    "main",
]


class WorkerConfigError(DLRoverError):
    """The worker cannot start with this run directory / spec (a relaunch would not help)."""


class PSWaitTimeout(DLRoverError):
    """The PS set stayed unreachable for longer than the worker waits."""


class _Stopped(Exception):
    """Internal: a stop was requested while waiting; leave the loop cleanly."""


@dataclass
class _InFlight:
    """One exchange sent in the background: what it pushes and which batch it reads."""

    future: Future[tuple[np.ndarray | None, dict[str, np.ndarray]]]
    push: StepGrads | None
    batch: Batch | None
    plan: StepPlan | None
    want_dense: bool
    exchange: Exchange | None = None  # its dense_versions, once the future is done


# --- the worker ---------------------------------------------------------------------------


class Worker:
    """One worker of the PS runtime; :meth:`run` trains until the job is done or stopped.

    Usable in-process (tests run it in a thread: ``threads=None`` leaves torch's thread count
    alone). ``spec`` and ``token`` default to the run directory's ``spec.json`` and token."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        node_id: int,
        master_address: str,
        *,
        incarnation: int = 0,
        threads: int | None = None,
        spec: JobSpec | None = None,
        token: str | None = None,
        master_retry_s: float | None = None,
        ps_wait_s: float = 600.0,
        ps_poll_s: float = 0.5,
        wait_poll_s: float = 0.2,
        dense_sync_every: int = 1,
        overlap_push: bool = True,
        metrics_interval_s: float | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.node_id = int(node_id)
        self.master_address = master_address
        self.incarnation = int(incarnation)
        self.threads = threads
        self.spec = spec
        self.token = token
        self.master_retry_s = master_retry_s
        self.ps_wait_s = ps_wait_s
        self.ps_poll_s = ps_poll_s
        self.wait_poll_s = wait_poll_s
        self.dense_sync_every = max(1, int(dense_sync_every))
        self.overlap_push = overlap_push
        self.metrics_interval_s = metrics_interval_s
        # progress, readable from other threads
        self.steps = 0
        self.samples = 0
        self.shards_done = 0
        self.ps_version = -1
        self.ps_switches = 0
        self.ps_failures = 0
        self.last_loss: float | None = None
        self.exit_reason = ""
        self._stop = threading.Event()
        self._master_lost: str | None = None
        self._pending_lock = threading.Lock()
        self._pending_ps: tuple[tuple[str, ...], int] | None = None
        self._ballast: np.ndarray | None = None
        self._master: MasterClient | None = None
        self._ps: PSClient | None = None
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        self._pusher: ThreadPoolExecutor | None = None
        self._inflight: collections.deque[_InFlight] = collections.deque()
        self._pending: StepGrads | None = None  # computed, not sent yet
        self._unpushed: list[StepGrads] = []  # sent and lost (a PS was down): retried
        self.times = StepTimes()
        self._dp_ready = False
        self.optimizer: str | None = None
        self.staleness = 0
        self.transfer = "fp32"
        self.warmup = 0
        self._bufs: list[np.ndarray] = []
        self._buf_next = 0
        # per PS, the version of the dense values in self.tower (sent with their gradients)
        self._dense_read: dict[int, tuple[int, int]] = {}

    # --- control from outside ----------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the current batch, then exit 0 (the unfinished shard goes back to the queue)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # --- set-up ----------------------------------------------------------------------------

    def _configure(self) -> None:
        if self.spec is None:
            path = self.run_dir / SPEC_FILE
            if not path.exists():
                raise WorkerConfigError(
                    f"no job spec at {path}: the master writes it before starting workers"
                )
            self.spec = load_spec(path)
        spec = self.spec
        if spec.strategy != "ps":
            raise WorkerConfigError(
                f"this worker runs the PS strategy; the spec asks for {spec.strategy!r}"
            )
        if spec.model.architecture.value != "dlrm":
            raise WorkerConfigError(
                f"the PS worker builds a DLRM; the spec asks for {spec.model.architecture.value!r}"
            )
        if self.token is None:
            try:
                self.token = wire.read_token(self.run_dir)
            except OSError as e:
                raise WorkerConfigError(
                    f"cannot read the job token in {self.run_dir}: {e}; pass the job's run dir"
                ) from None
        if self.threads is not None:
            if self.threads < 1:
                raise WorkerConfigError(f"--threads must be at least 1, got {self.threads}")
            torch.set_num_threads(self.threads)
        raw = os.environ.get(ALLOC_ENV)
        if raw:
            try:
                mib = int(float(raw))
            except ValueError:
                raise WorkerConfigError(f"{ALLOC_ENV}={raw!r} must be a number of MiB") from None
            if mib > 0:
                log.info("allocating %d MiB extra (%s)", mib, ALLOC_ENV)
                self._ballast = np.ones(bytes_from_mib(mib) // 8, dtype=np.float64)  # touches pages
        if spec.training.seed is not None:
            # every worker offers the same start (the PS keeps the first one it gets): a run
            # is reproducible up to the asynchrony of its workers
            torch.manual_seed(spec.training.seed)
        self.tower = DenseTower(spec.model)
        self.names = feature_keys(spec.model)
        self.rows = table_rows(spec)
        self.tables = {t.name: spec.model.table_dim(t) for t in spec.model.embedding_tables}
        self.lr = spec.training.optimizer.lr
        self.batch_size = spec.training.batch_size
        self.data = from_spec(spec)
        self.sync = DenseSync(self.dense_sync_every)
        self.rate = Rate(min(spec.pacing.sample_window_s, 30.0))
        self.heartbeat_interval_s = spec.pacing.heartbeat_interval_s
        if self.master_retry_s is None:  # a master gone this long is dead: leave with it
            self.master_retry_s = spec.pacing.dead_after_s
        if self.metrics_interval_s is None:
            self.metrics_interval_s = min(5.0, self.heartbeat_interval_s)

    # --- run ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Train until done or stopped; returns the exit code (see the module docstring)."""
        try:
            self._configure()
        except DLRoverError as e:
            _one_line(f"worker {self.node_id}: {e}")
            self.exit_reason = "config"
            return EXIT_FATAL
        try:
            code = self._run()
            if self._master_lost is not None:
                raise MasterUnavailableError(self._master_lost)
            return code
        except _Stopped:
            if self._master_lost is not None:
                _one_line(f"worker {self.node_id}: giving up: {self._master_lost}")
                self.exit_reason = "master unavailable"
                return EXIT_UNAVAILABLE
            self.exit_reason = self.exit_reason or "stopped"
            return EXIT_OK
        except MasterUnavailableError as e:
            _one_line(f"worker {self.node_id}: giving up: {e}")
            self.exit_reason = "master unavailable"
            return EXIT_UNAVAILABLE
        except PSWaitTimeout as e:
            _one_line(f"worker {self.node_id}: giving up: {e}")
            self.exit_reason = "ps unavailable"
            return EXIT_UNAVAILABLE
        except MasterRejectedError as e:
            if e.superseded:
                _one_line(f"worker {self.node_id}: {e}")
                self.exit_reason = "superseded"
                return EXIT_OK
            if e.code is grpc.StatusCode.UNAUTHENTICATED:
                _one_line(f"worker {self.node_id}: {e}")
                self.exit_reason = "config"
                return EXIT_FATAL
            raise
        finally:
            self._shutdown()

    def _run(self) -> int:
        assert self.spec is not None and self.token is not None
        self._master = master = MasterClient(
            self.master_address, self.token, retry_for_s=self.master_retry_s or 60.0
        )
        reg = master.register(Role.WORKER, self.node_id, os.getpid(), self.incarnation)
        addresses, version = reg.ps_addresses, reg.ps_version
        while not addresses:  # the master has not started the PS set yet
            self._sleep(self.ps_poll_s)
            addresses, version = master.get_ps_set()
        self._ps = PSClient(addresses, self.token, self.tables)
        self.ps_version = version
        self._start_heartbeat()  # alive while it waits for the PS set, too
        self._with_ps(self._init_dense)
        log.info(
            "worker %d (incarnation %d) up: %d PS (version %d), %d dense parameters",
            self.node_id,
            self.incarnation,
            len(addresses),
            version,
            sum(p.numel() for p in self.tower.parameters()),
        )
        last_metrics = time.monotonic()
        self.rate.add(last_metrics, 0)
        while True:
            if self._stop.is_set():
                return self._leave("stop requested")
            self._apply_pending_switch()
            reply = master.get_shard()
            if reply.stop:
                return self._leave("the master said stop")
            if reply.done:
                self._report_metrics()
                return self._leave(f"job done ({reply.failed} shard(s) failed)")
            if reply.wait or reply.shard is None:
                self._sleep(self.wait_poll_s)
                continue
            shard = reply.shard
            result = self._train_shard(shard.start, shard.end)
            if result is None:  # stop requested mid-shard: leave it to the master
                return self._leave(f"stop requested during shard {shard.shard_id}")
            samples, loss = result
            self._flush()  # every batch of the shard is on the PS before it is reported
            master.shard_done(shard.shard_id, samples, loss)
            self.shards_done += 1
            now = time.monotonic()
            if now - last_metrics >= (self.metrics_interval_s or 0.0):
                self._report_metrics()
                last_metrics = now

    def _leave(self, reason: str) -> int:
        self.exit_reason = reason
        log.info(
            "worker %d leaving: %s (%d steps, %d samples, %d shards)",
            self.node_id,
            reason,
            self.steps,
            self.samples,
            self.shards_done,
        )
        return EXIT_OK

    def _data_plane(self) -> None:
        """The step settings from the spec (read once, after _configure loaded it)."""
        if self._dp_ready:
            return
        assert self.spec is not None
        t = self.spec.training
        self.optimizer = t.optimizer.name
        self.staleness = t.staleness if self.overlap_push else 0
        self.transfer = t.transfer
        self.warmup = t.dense_warmup
        f = len(self.names)
        self._bufs = [
            np.empty((self.batch_size * f, self.spec.model.embedding_dim), np.float32)
            for _ in range(self.staleness + 2)
        ]
        self._dp_ready = True

    def _train_shard(self, start: int, end: int) -> tuple[int, float | None] | None:
        """Train rows [start, end); (samples, mean loss), or None when asked to stop first.

        Each step sends one exchange per PS carrying the previous step's gradients and the ids
        of the batch ``staleness`` steps ahead (prefetch), so the round trip runs while this
        step computes; the shard's last gradients are drained by :meth:`_flush`."""
        self._data_plane()
        records = self.data.rows(start, end)
        batches = list(records.split(self.batch_size))
        loss_sum, n = 0.0, 0
        for i, batch in enumerate(batches):
            if self._stop.is_set():
                return None
            loss = self._step(batch, batches[i + 1 : i + 1 + self.staleness])
            k = len(batch)
            loss_sum += loss * k
            n += k
            self.steps += 1
            self.samples += k
            self.last_loss = loss
            self.rate.add(time.monotonic(), self.samples)
        return len(records), (loss_sum / n if n else None)

    def _step(self, batch: Batch, ahead: Sequence[Batch] = ()) -> float:
        """One step: make sure ``batch`` and the ``ahead`` batches are requested (the oldest
        request carries the previous step's gradients), wait for ``batch``'s rows, compute.
        A PS failure waits for the PS set, re-pushes what was lost and redoes the step."""
        assert self._ps is not None
        self._data_plane()
        while True:
            self._apply_pending_switch()
            try:
                if self._find(batch) is None:
                    self._send(self._take_pending(), batch)
                for b in ahead:
                    if self._find(b) is None:
                        self._send(self._take_pending(), b)
                if self._pending is not None and self.staleness > 0:
                    self._send(self._take_pending(), None)  # nothing ahead: push alone
                entry, rows, dense = self._receive(batch)
                break
            except PSUnavailable as e:
                self._wait_for_ps(e)
                self._flush()
        t0 = time.perf_counter()
        if entry.want_dense:
            load_dense(self.tower, dense)
            self._dense_read = dict(entry.exchange.dense_versions) if entry.exchange else {}
        assert entry.plan is not None and rows is not None
        loss, grads, dense_grads = forward_backward(self.tower, batch, entry.plan, rows)
        self.sync.steps_since += 1
        self._pending = StepGrads(
            entry.plan,
            grads,
            dense_grads,
            self.lr,
            self.optimizer,
            self.transfer,
            self._dense_read,
            self.warmup,
        )
        self.times.compute += time.perf_counter() - t0
        self.times.steps += 1
        return loss

    def _take_pending(self) -> StepGrads | None:
        g, self._pending = self._pending, None
        return g

    def _find(self, batch: Batch) -> _InFlight | None:
        for e in self._inflight:
            if e.batch is batch:
                return e
        return None

    def _exchange(
        self, ex: Exchange, out: np.ndarray | None
    ) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        assert self._ps is not None
        t0 = time.perf_counter()
        try:
            fields = opt_fields(self.optimizer, self.lr, self.warmup)
            return self._ps.exchange(ex, fields, self.transfer, out)
        finally:
            self.times.exchange += time.perf_counter() - t0
            self.times.exchanges += 1

    def _send(self, push: StepGrads | None, batch: Batch | None) -> None:
        """Queue one exchange: ``push``'s gradients and/or ``batch``'s ids. Exchanges run in
        order on one background thread (inline when staleness is 0)."""
        assert self._ps is not None
        t0 = time.perf_counter()
        plan = step_plan(self._ps, batch, self.names, self.rows) if batch is not None else None
        want = batch is not None and self.sync.due()
        if want:
            self.sync.done()
        ex = (
            push.exchange(plan, want)
            if push is not None
            else Exchange(pull_plan=plan, want_dense=want)
        )
        out = None
        if plan is not None:
            self._buf_next = (self._buf_next + 1) % len(self._bufs)
            out = self._bufs[self._buf_next]
        self.times.plan += time.perf_counter() - t0
        fut: Future[tuple[np.ndarray | None, dict[str, np.ndarray]]]
        if self.staleness == 0:
            fut = Future()
            try:
                fut.set_result(self._exchange(ex, out))
            except PSError as e:
                fut.set_exception(e)
        else:
            if self._pusher is None:
                self._pusher = ThreadPoolExecutor(1, thread_name_prefix="worker-exchange")
            fut = self._pusher.submit(self._exchange, ex, out)
        self._inflight.append(_InFlight(fut, push, batch, plan, want, ex))

    def _receive(self, batch: Batch) -> tuple[_InFlight, np.ndarray | None, dict[str, np.ndarray]]:
        """Wait for the exchanges up to the one reading ``batch``; an exchange leaves the
        queue only once it succeeded (a failed one is kept for :meth:`_settle`)."""
        t0 = time.perf_counter()
        try:
            while self._inflight:
                e = self._inflight[0]
                rows, dense = e.future.result()
                self._inflight.popleft()
                if e.batch is batch:
                    return e, rows, dense
            raise AssertionError("the batch being trained was never requested")
        finally:
            self.times.wait += time.perf_counter() - t0

    def _settle(self) -> None:
        """Quiesce the pipeline: wait for every exchange in flight, keep the gradients of
        those that failed (PS unreachable) and of the step not yet sent for a retry, drop
        the prefetched rows (the PS set may be changing)."""
        while self._inflight:
            e = self._inflight.popleft()
            try:
                e.future.result()
            except PSUnavailable as err:
                if e.push is not None:
                    log.warning("worker %d: a push failed (%s); it is retried", self.node_id, err)
                    self._unpushed.append(e.push)
        if self._pending is not None:
            self._unpushed.append(self._pending)
            self._pending = None

    def _flush(self) -> None:
        """Make sure every computed step's gradients reached the PS set (waiting for it)."""
        assert self._ps is not None
        t0 = time.perf_counter()
        self._settle()
        while self._unpushed:
            try:
                self._exchange(self._unpushed[0].exchange(), None)
                self._unpushed.pop(0)
            except PSUnavailable as e:
                self._wait_for_ps(e)
        self.times.flush += time.perf_counter() - t0

    # --- the PS set --------------------------------------------------------------------------

    def _init_dense(self) -> None:
        assert self._ps is not None
        params = {n: p.detach().numpy().copy() for n, p in self.tower.named_parameters()}
        self._ps.init_dense(params)
        load_dense(self.tower, self._ps.pull_dense())
        self._dense_read = dict(self._ps.dense_versions)
        self.sync.done()

    def _with_ps(self, fn: Callable[[], None]) -> None:
        while True:
            try:
                fn()
                return
            except PSUnavailable as e:
                self._wait_for_ps(e)

    def _switch(self, addresses: Sequence[str], version: int) -> None:
        assert self._ps is not None
        self._settle()  # no push may use the channels being closed
        self._ps.switch(addresses)  # fresh channels, also for the same addresses
        if version != self.ps_version:
            log.info("worker %d: PS set version %d -> %d", self.node_id, self.ps_version, version)
            self.ps_switches += 1
        self.ps_version = version
        self.sync.invalidate()

    def _apply_pending_switch(self) -> None:
        with self._pending_lock:
            pending, self._pending_ps = self._pending_ps, None
        if pending is None or pending[1] <= self.ps_version or not pending[0]:
            return
        self._switch(*pending)
        # a fresh PS set may lack the dense parameters: offer ours (first writer wins), re-pull
        self._with_ps(self._init_dense)
        self._flush()  # a push that failed on the old set goes to the new one

    def _wait_for_ps(self, error: PSUnavailable) -> None:
        """Poll the master's PS set until every PS answers; then re-sync the dense parameters
        (the caller redoes its batch)."""
        assert self._ps is not None and self._master is not None
        self._settle()
        self.ps_failures += 1
        log.warning("worker %d: %s; waiting for the PS set", self.node_id, error)
        deadline = time.monotonic() + self.ps_wait_s
        while True:
            if self._stop.is_set():
                raise _Stopped()
            addresses, version = self._master.get_ps_set()
            if addresses:
                self._switch(addresses, version)
                try:
                    self._ps.ping()
                    self._init_dense()
                    log.info("worker %d: PS set reachable (version %d)", self.node_id, version)
                    return
                except PSUnavailable as e:
                    error = e
            if time.monotonic() > deadline:
                raise PSWaitTimeout(
                    f"the PS set stayed unreachable for {self.ps_wait_s:g} s (last: {error}); "
                    "check the master's PS relaunches"
                )
            self._sleep(self.ps_poll_s)

    # --- heartbeat and metrics ----------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._hb_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"worker-{self.node_id}-heartbeat", daemon=True
        )
        self._hb_thread.start()

    def _heartbeat_loop(self) -> None:
        try:
            usage: Usage | None = Usage()
        except ImportError:  # psutil is part of the runtime extra; without it report zeros
            usage = None
        while True:
            try:
                self._heartbeat_once(usage)
            except MasterUnavailableError as e:
                log.error("worker %d: heartbeat: %s; leaving", self.node_id, e)
                self._master_lost = str(e)
                self._stop.set()
                return
            except DLRoverError as e:
                log.error("worker %d: heartbeat refused: %s", self.node_id, e)
            if self._hb_stop.wait(self.heartbeat_interval_s):
                return

    def _heartbeat_once(self, usage: Usage | None) -> None:
        assert self._master is not None
        cpu, rss = usage.sample() if usage is not None else (0.0, 0.0)
        sps, _ = self.rate.rate(time.monotonic(), self.samples)
        reply = self._master.heartbeat(
            cpu_percent=cpu, rss_mib=rss, step=self.steps, samples_per_s=sps
        )
        if reply.stop:
            log.info("worker %d: the master asked to stop", self.node_id)
            self._stop.set()
        if reply.ps_version > self.ps_version and reply.ps_addresses:
            with self._pending_lock:
                if self._pending_ps is None or self._pending_ps[1] < reply.ps_version:
                    self._pending_ps = (reply.ps_addresses, reply.ps_version)

    def _report_metrics(self) -> None:
        assert self._master is not None
        sps, window = self.rate.rate(time.monotonic(), self.samples)
        fields: dict[str, float] = {
            "step": self.steps,
            "samples": self.samples,
            "samples_per_s": sps,
            "window_s": window,
            "shards_done": self.shards_done,
        }
        if self.last_loss is not None:
            fields["loss"] = self.last_loss
        self._master.report_metrics(**fields)

    # --- helpers ----------------------------------------------------------------------------

    def _sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise _Stopped()

    def _shutdown(self) -> None:
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=15)
        for e in self._inflight:
            e.future.exception()  # let it finish before its channels close
        self._inflight.clear()
        if self._pusher is not None:
            self._pusher.shutdown(wait=True)
        if self._ps is not None:
            self._ps.close()
        if self._master is not None:
            self._master.close()
        self._ballast = None


def _one_line(message: str) -> None:
    print(" ".join(message.split()), file=sys.stderr, flush=True)


# --- process entry -------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dlrover_core.runtime.strategies.ps.worker",
        description="A worker of the PS runtime (see the module docstring).",
    )
    p.add_argument("--run-dir", required=True, help="the job's run dir (spec.json and token)")
    p.add_argument("--node-id", type=int, required=True, help="this worker's id")
    p.add_argument("--master", required=True, help="the job master's HOST:PORT")
    p.add_argument("--incarnation", type=int, default=0, help="launches of this node before")
    p.add_argument("--threads", type=int, default=None, help="torch threads (the planned CPU)")
    p.add_argument(
        "--dense-sync-every", type=int, default=1, help="pull dense parameters every k steps"
    )
    p.add_argument(
        "--no-overlap-push",
        action="store_true",
        help="push each step's gradients before the next step (default: overlap them)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from dlrover_core import logs

    logs.setup_node("info")
    args = _parse(argv)
    worker = Worker(
        args.run_dir,
        args.node_id,
        args.master,
        incarnation=args.incarnation,
        threads=args.threads,
        dense_sync_every=args.dense_sync_every,
        overlap_push=not args.no_overlap_push,
    )

    def on_signal(signum: int, frame: Any) -> None:
        worker.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
