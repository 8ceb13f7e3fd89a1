"""A parameter server: one shard of the embedding tables and of the dense parameters.

:class:`PSShard` is the state (no IO): per table a growable float32 matrix with the
optimizer's slots (:mod:`.optim`: Adagrad, Adam or SGD, torch's update rules) and an id → row
index. Rows are created the first time an id is pulled (or
pushed), with a deterministic initial value drawn from a hash of (seed, table, id), so PS memory
grows the way it does in CTR training and a row re-created anywhere starts the same.

:class:`PSServer` serves a shard over the wire protocol as service ``dlrover.PS``:

=========== ====================================================== ==========================
method      request                                                reply
=========== ====================================================== ==========================
Step        one worker step: fields push_tables, push_dims,         array values (rows of ids,
            push_counts, tables, dims, counts, opt, lr, want_dense, in ``transfer`` precision);
            transfer, dense_read; arrays push_ids, push_grads,     ``d:<name>`` per dense
            ids, ``dg:<name>`` per dense gradient. Applies the     parameter and field
            pushes, then reads.                                    dense_version if
                                                                   want_dense; fields step
Pull        fields tables, dims, counts; array ids (concatenated)  array values (flat float32)
Push        fields tables, dims, counts, [lr]; arrays ids, grads   fields step
PullDense   fields [names]                                         one array per parameter,
                                                                   fields dense_version
PushDense   fields [lr, dense_read]; one gradient array per        fields step
            parameter
InitDense   one array per parameter (first writer wins)            fields created (names)
Checkpoint  fields [step, tag]                                     fields path, step, skipped
Freeze      fields frozen (bool)                                   fields frozen
Stats       —                                                      :meth:`PSShard.stats` + rss
Ping        —                                                      fields index, num_ps, pid
=========== ====================================================== ==========================

Stale dense gradients: a read of the dense parameters returns ``dense_version`` = (this
shard's random token, the number of dense updates applied so far); a worker sends it back as
``dense_read`` with the gradients it computed on those values. ``τ`` = the updates applied since
that read; a gradient with ``τ > 1`` is applied with ``lr / τ`` (staleness-aware asynchronous SGD,
Zhang et al., IJCAI 2016), one with ``τ ≤ 1`` or without ``dense_read`` exactly by torch's rule.
Without it, dense parameters that lag ≥ 2 updates (two workers with prefetching lag about 3)
sent Adagrad at lr 0.05 into a bad state in about half the runs (held-out AUC 0.67 instead of
0.78, the same in a one-process torch simulation of the delay: notes/issue-12.md). Sparse rows
are applied as they come: their staleness did not hurt.

Dense warm-up: a Step or PushDense may carry ``warmup`` = W (the worker sends
``training.dense_warmup``); dense update k of a parameter (its count, kept in checkpoints) then
uses ``lr · min(1, k / W)`` for Adagrad and Adam (:meth:`.optim.OptimizerConfig.dense_lr`):
their first updates are ±lr on every weight and switched all of DLRM's bottom-MLP outputs off
in a few runs in a hundred (notes/issue-12.md).

A *frozen* PS (a PS-set change is in progress) refuses every data call with UNAVAILABLE, so
workers hold their pushes and wait for the new set: no update is applied to a set whose final
checkpoint has been taken, and none is lost. Checkpoints carry a ``tag``: the master's shard
``done_seq`` they include (every shard done at or before it has its updates in the state).

Run one as a process (normally the controller does, as ``dlrover-rm node ps ...``)::

    python -m dlrover_core.runtime.strategies.ps.server --run-dir DIR --index I --num-ps N
        --master HOST:PORT --incarnation K --generation G [--restore-from DIR1,...]
        [--restore-seq S] [--ckpt-dir D] [--checkpoint-every-s S] [--lr 0.05]

It reads the job token from DIR, restores its state (its own latest checkpoint if one matches
(I, N); else a re-shard of the --restore-from checkpoints, tagged --restore-seq; else empty),
writes a checkpoint of a re-sharded or empty start at once (so a relaunch restores its own),
serves on ``$DLROVER_RM_BIND_HOST`` (default loopback), registers its address
(``$DLROVER_RM_ADVERTISE_HOST``:port) with the master, heartbeats, checkpoints every S seconds
when something changed, and stops (final checkpoint, exit 0) on SIGTERM, when the master says
stop or refuses it as superseded, or when the master has been unreachable for
``--dead-after-s``. Exit 1 means its checkpoints are unusable (a relaunch would not help).
Without ``--master`` (tests, tools) it writes ``--addr-file`` instead of registering.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import grpc
import numpy as np
import numpy.typing as npt

from dlrover_core.runtime import wire
from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps import optim
from dlrover_core.runtime.strategies.ps.partition import (
    as_uint64,
    dense_owners,
    splitmix64,
    table_salt,
)
from dlrover_core.training.carry import (
    CARRIED_ACCUMULATOR,
    ParentTable,
    ParentTables,
    parent_path,
)

log = logging.getLogger("dlrover_rm.ps")

SERVICE = "dlrover.PS"
DEFAULT_LR = 0.05
DEFAULT_EPS = optim.DEFAULT_EPS["adagrad"]
DEFAULT_INIT_STD = 0.01
_MIN_CAPACITY = 1024
_GROWTH = 1.5
_RESERVE_BYTES = 1 << 30  # address space an arena reserves per matrix (backed as rows appear)
_DELTA_MIN = 1 << 16

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


# --- helpers shared with the client ----------------------------------------------------------


def aggregate(ids: npt.ArrayLike, grads: npt.ArrayLike, dim: int) -> tuple[I64, F32]:
    """Sum the gradient rows of duplicate ids: returns (sorted unique ids, summed grads)."""
    i = np.asarray(ids, dtype=np.int64).reshape(-1)
    g = np.asarray(grads, dtype=np.float32).reshape(-1, dim)
    if g.shape[0] != i.shape[0]:
        raise ValueError(f"{i.shape[0]} ids but {g.shape[0]} gradient rows of dim {dim}")
    if i.size == 0:
        return i, g
    if i.size == 1 or bool(np.all(i[1:] > i[:-1])):
        return i, g
    order = np.argsort(i, kind="stable")
    s = i[order]
    first = np.empty(s.size, dtype=bool)
    first[0] = True
    np.not_equal(s[1:], s[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return s[starts], np.add.reduceat(g[order], starts, axis=0)


def _init_mixed(mix: npt.NDArray[np.uint64], ids: I64, dim: int, std: float) -> F32:
    base = splitmix64(as_uint64(ids) ^ mix)
    cols = np.arange(1, dim + 1, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    x = splitmix64(base[:, None] ^ cols[None, :])
    u1 = ((x >> np.uint64(32)).astype(np.float64) + 0.5) * (1.0 / 4294967296.0)
    u2 = (x & np.uint64(0xFFFFFFFF)).astype(np.float64) * (1.0 / 4294967296.0)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return (z * std).astype(np.float32)


def _mix(table: str, seed: int) -> np.uint64:
    return np.uint64(splitmix64(np.array([seed], dtype=np.uint64))[0] ^ table_salt(table))


def init_rows(table: str, ids: I64, dim: int, seed: int = 0, std: float = DEFAULT_INIT_STD) -> F32:
    """Deterministic normal(0, std) rows for ``ids``: a function of (seed, table, id) only."""
    return _init_mixed(np.full(len(ids), _mix(table, seed), np.uint64), ids, dim, std)


def _search(keys: I64, vals: I64, q: I64) -> I64:
    """Row of each query in the sorted ``keys`` (−1 where absent)."""
    if keys.size == 0:
        return np.full(q.shape, -1, dtype=np.int64)
    pos = np.searchsorted(keys, q)
    np.minimum(pos, keys.size - 1, out=pos)
    return np.where(keys[pos] == q, vals[pos], -1)


# --- the state -------------------------------------------------------------------------------


def _f32(a: npt.ArrayLike, shape: tuple[int, ...]) -> F32:
    """``a`` as float32 of ``shape`` (a view when it already is float32; read-only wire
    buffers are fine: updates only read gradients)."""
    return np.asarray(a, dtype=np.float32).reshape(shape)


class _Arena:
    """The rows of every table of one dim on this PS, with their optimizer slots.

    One float32 matrix for the weights and one per optimizer slot (Adagrad: 1, Adam: 2, SGD:
    0). Each matrix is a view of a *reserve*: an array of :data:`_RESERVE_BYTES` allocated
    once and never written beyond the rows in use, so the OS backs only the pages of rows that
    exist (resident memory grows with the rows, the reserve is address space). Adding rows
    widens the view: no copy of the table, whatever the growth. Only a table outgrowing its
    reserve (16M rows of dim 16) copies, into a reserve 4× as large. Sharing it across tables
    makes a step's lookups and its optimizer update a few vectorised numpy ops for all its
    tables together. ``lock`` guards it and the indexes of its tables: a step takes it once
    for its push and its pull."""

    def __init__(self, dim: int, opt: str) -> None:
        self.dim = dim
        self.lock = threading.Lock()
        self.n = 0
        self.opt = opt
        self.updated = False
        self.token = secrets.randbits(62)  # names this arena's row numbering
        self.reserve_rows = max(_MIN_CAPACITY, _RESERVE_BYTES // (4 * max(1, dim)))
        self.copies = 0  # times the rows were copied into a larger reserve
        self._bases: list[F32] = [self._reserve() for _ in range(1 + optim.SLOTS[opt])]
        self.weights: F32 = self._bases[0][:0]
        self.slots: list[F32] = [b[:0] for b in self._bases[1:]]

    def _reserve(self, need: int = 0) -> F32:
        # np.empty does not touch its pages: they are backed when a row is first written. Where
        # the OS refuses the address space (strict overcommit), reserve less.
        while True:
            try:
                return np.empty((self.reserve_rows, self.dim), np.float32)
            except MemoryError:
                floor = max(need, self.n, _MIN_CAPACITY)
                if self.reserve_rows <= floor:
                    raise
                self.reserve_rows = max(floor, self.reserve_rows // 8)

    def _view(self, cap: int) -> None:
        self.weights = self._bases[0][:cap]
        self.slots = [b[:cap] for b in self._bases[1:]]

    def alloc(self, k: int) -> I64:
        """``k`` new rows (slots zeroed; the caller writes their weights)."""
        n = self.n + k
        if n > self.reserve_rows:  # rare: move to a reserve 4x as large (one copy)
            old = self._bases
            self.reserve_rows = max(n, 4 * self.reserve_rows)
            self._bases = [self._reserve(n) for _ in old]
            for new, o in zip(self._bases, old, strict=True):
                new[: self.n] = o[: self.n]
            self.copies += 1
        if n > self.weights.shape[0]:
            self._view(n)
        for s in self.slots:
            s[self.n : n] = 0.0
        rows = np.arange(self.n, n, dtype=np.int64)
        self.n = n
        return rows

    def use_optimizer(self, cfg: optim.OptimizerConfig, what: str) -> None:
        """Make the slots fit ``cfg``: set on the first update; once updated with one
        optimizer, another is refused."""
        if cfg.name == self.opt:
            return
        if self.updated:
            raise ValueError(
                f"{what} is trained with {self.opt} on this PS; this push asks for {cfg.name} "
                "(a job keeps one training.optimizer.name)"
            )
        self._bases = [self._bases[0], *(self._reserve() for _ in range(cfg.slots))]
        self._view(self.weights.shape[0])
        for sl in self.slots:
            sl[:] = 0.0
        self.opt = cfg.name

    def update(
        self,
        rows: I64,
        grads: F32,
        cfg: optim.OptimizerConfig,
        steps: npt.NDArray[np.int64] | int,
    ) -> None:
        """Apply ``cfg`` to the unique ``rows`` with their summed ``grads``; ``steps`` is the
        update count of each row's table (per row, or one for all)."""
        self.use_optimizer(cfg, "this table")
        self.updated = True
        optim.sparse_update(cfg, self.weights, self.slots, rows, grads, steps)

    def allocated_bytes(self) -> int:
        """Bytes of the rows in use (the reserve beyond them is address space only)."""
        return int(self.weights.nbytes + sum(s.nbytes for s in self.slots))


class _Table:
    """One embedding table on this PS: its id → arena row index and its update count.

    The index is two sorted arrays (a large main level and a small delta level that new ids
    are merged into, folded into the main level when it grows past 1/32 of it), so lookups and
    inserts are vectorised binary searches and the index costs 16 bytes a row. The caller
    holds ``arena.lock``."""

    def __init__(
        self,
        name: str,
        dim: int,
        seed: int,
        init_std: float,
        arena: _Arena,
        parent: ParentTable | None = None,
    ) -> None:
        self.name = name
        self.parent = parent  # the carried-forward model's rows (training.init_from)
        self.dim = dim
        self.seed = seed
        self.init_std = init_std
        self.arena = arena
        self.mix = _mix(name, seed)
        self.n = 0
        self.steps = 0  # updates applied (Adam's bias correction)
        self.row_ids: I64 = np.empty(0, np.int64)  # id of each of this table's rows
        self.arena_rows: I64 = np.empty(0, np.int64)  # and where it lives in the arena
        self._keys: I64 = np.empty(0, np.int64)
        self._rows: I64 = np.empty(0, np.int64)
        self._dkeys: I64 = np.empty(0, np.int64)
        self._drows: I64 = np.empty(0, np.int64)

    @property
    def lock(self) -> threading.Lock:
        return self.arena.lock

    @property
    def opt(self) -> str:
        return self.arena.opt

    @property
    def weights(self) -> F32:
        """This table's rows, in row order (a copy)."""
        return self.arena.weights[self.arena_rows[: self.n]]

    @property
    def accum(self) -> F32:
        """This table's optimizer state, slots side by side: ``[n, slots·dim]`` (a copy)."""
        r = self.arena_rows[: self.n]
        if not self.arena.slots:
            return np.empty((self.n, 0), np.float32)
        return np.concatenate([s[r] for s in self.arena.slots], axis=1)

    def _append(self, new_ids: I64, new_rows: I64) -> None:
        n, k = self.n, new_ids.size
        if n + k > self.row_ids.size:
            cap = max(n + k, int(self.row_ids.size * _GROWTH), _MIN_CAPACITY)
            ids = np.empty(cap, np.int64)
            ids[:n] = self.row_ids[:n]
            rows = np.empty(cap, np.int64)
            rows[:n] = self.arena_rows[:n]
            self.row_ids, self.arena_rows = ids, rows
        self.row_ids[n : n + k] = new_ids
        self.arena_rows[n : n + k] = new_rows
        self.n = n + k

    def _index_insert(self, new_ids: I64, new_rows: I64) -> None:
        """Insert sorted, absent ``new_ids`` into the delta level."""
        pos = np.searchsorted(self._dkeys, new_ids)
        self._dkeys = np.insert(self._dkeys, pos, new_ids)
        self._drows = np.insert(self._drows, pos, new_rows)
        if self._dkeys.size > max(_DELTA_MIN, self._keys.size // 32):
            pos = np.searchsorted(self._keys, self._dkeys)
            self._keys = np.insert(self._keys, pos, self._dkeys)
            self._rows = np.insert(self._rows, pos, self._drows)
            self._dkeys = np.empty(0, np.int64)
            self._drows = np.empty(0, np.int64)

    def lookup(self, uniq: I64) -> tuple[I64, I64, I64]:
        """Arena rows of the sorted unique ``uniq`` ids, creating absent ones (their weights
        not written yet): ``(rows, new ids, their rows)``."""
        rows = _search(self._keys, self._rows, uniq)
        miss = rows < 0
        if self._dkeys.size and miss.any():
            rows[miss] = _search(self._dkeys, self._drows, uniq[miss])
            miss = rows < 0
        k = int(np.count_nonzero(miss))
        if not k:
            return rows, uniq[:0], rows[:0]
        new_ids = uniq[miss]
        new_rows = self.arena.alloc(k)
        rows[miss] = new_rows
        self._append(new_ids, new_rows)
        self._index_insert(new_ids, new_rows)
        return rows, new_ids, new_rows

    def rows_for(self, uniq: I64) -> tuple[I64, int]:
        """Arena rows of the sorted unique ``uniq`` ids, creating (and initialising) absent
        ones; returns (rows, created)."""
        rows, new_ids, new_rows = self.lookup(uniq)
        if new_ids.size:
            self.arena.weights[new_rows] = init_rows(
                self.name, new_ids, self.dim, self.seed, self.init_std
            )
            self.from_parent(new_ids, new_rows)
        return rows, int(new_ids.size)

    def from_parent(self, new_ids: I64, new_rows: I64) -> None:
        """New rows (just initialised) whose id the carried-forward model trained start from
        its row; a trained row meets a fresh Adagrad, so its accumulator starts warm and its
        first update is not ``lr·sign(g)`` (``carry.CARRIED_ACCUMULATOR``)."""
        if self.parent is None or not new_ids.size:
            return
        found, rows_p = self.parent.lookup(new_ids)
        if not rows_p.size:
            return
        carried = new_rows[found]
        self.arena.weights[carried] = rows_p
        if self.arena.opt == "adagrad":
            self.arena.slots[0][carried] = CARRIED_ACCUMULATOR

    def gather(self, ids: I64) -> tuple[F32, int]:
        """Rows of ``ids`` (any order, duplicates allowed), creating absent ones."""
        if ids.size == 0:
            return np.empty((0, self.dim), np.float32), 0
        if ids.size == 1 or bool(np.all(ids[1:] > ids[:-1])):
            rows, created = self.rows_for(ids)
            return self.arena.weights[rows], created
        uniq, inv = np.unique(ids, return_inverse=True)
        rows, created = self.rows_for(uniq)
        return self.arena.weights[rows[inv]], created

    def update(self, uniq: I64, grads: F32, cfg: optim.OptimizerConfig) -> None:
        """Apply ``cfg`` with the summed ``grads`` of the sorted unique ``uniq`` ids."""
        self.arena.use_optimizer(cfg, f"table {self.name!r}")
        rows, _ = self.rows_for(uniq)
        self.steps += 1
        self.arena.update(rows, grads, cfg, self.steps)

    def load(self, state: ckpt.TableState) -> None:
        """Fill this (new, empty) table from ``state`` (the arena takes its optimizer)."""
        n = state.rows
        self.arena.use_optimizer(optim.OptimizerConfig(state.optimizer), f"table {self.name!r}")
        slots = optim.SLOTS[self.arena.opt]
        if state.accum.shape != (n, slots * self.dim):
            raise ckpt.CheckpointError(
                f"table {self.name!r}: optimizer state of shape {state.accum.shape} does not fit "
                f"{state.optimizer} ({n} rows × {slots} slots × dim {self.dim})"
            )
        if state.steps > 0:
            self.arena.updated = True
        self.steps = state.steps
        rows = self.arena.alloc(n)
        self.arena.weights[rows] = state.weights
        for j, s in enumerate(self.arena.slots):
            s[rows] = state.accum[:, j * self.dim : (j + 1) * self.dim]
        self.n = 0
        self._append(np.ascontiguousarray(state.ids, dtype=np.int64), rows)
        order = np.argsort(state.ids, kind="stable")
        self._keys = np.ascontiguousarray(state.ids[order], dtype=np.int64)
        self._rows = rows[order]
        self._dkeys = np.empty(0, np.int64)
        self._drows = np.empty(0, np.int64)
        if n and bool(np.any(self._keys[1:] == self._keys[:-1])):
            raise ckpt.CheckpointError(f"table {self.name!r}: duplicate ids in the restored state")

    def snapshot(self) -> ckpt.TableState:
        return ckpt.TableState(
            self.dim,
            self.row_ids[: self.n].copy(),
            self.weights,
            self.accum,
            optimizer=self.opt,
            steps=self.steps,
        )

    def allocated_bytes(self) -> int:
        return int(
            self.row_ids.nbytes
            + self.arena_rows.nbytes
            + self._keys.nbytes
            + self._rows.nbytes
            + self._dkeys.nbytes
            + self._drows.nbytes
        )


@dataclass
class _Dense:
    weight: F32
    slots: list[F32]
    opt: str
    steps: int = 0

    def use_optimizer(self, name: str, cfg: optim.OptimizerConfig) -> None:
        if cfg.name == self.opt:
            return
        if self.steps > 0:
            raise ValueError(
                f"dense parameter {name!r} is trained with {self.opt} on this PS; this push asks "
                f"for {cfg.name} (a job keeps one training.optimizer.name)"
            )
        self.slots = [np.zeros_like(self.weight) for _ in range(cfg.slots)]
        self.opt = cfg.name

    @property
    def accum(self) -> F32:
        if len(self.slots) == 1:
            return self.slots[0]
        return np.stack(self.slots) if self.slots else np.empty((0,), np.float32)


def _config(
    opt: str | None, lr: float, eps: float | None, warmup: int = 0
) -> optim.OptimizerConfig:
    name = opt or "adagrad"
    return optim.OptimizerConfig(name, lr, eps if name == "adagrad" else None, warmup=warmup)


class PSShard:
    """The parameters and optimizer state one PS holds; thread-safe (a lock per table).

    Pushes apply the optimizer they name (Adagrad by default, Adam, SGD: :mod:`.optim`, torch's
    update rules), duplicate ids summed first. ``eps`` overrides Adagrad's epsilon (default
    torch's 1e-10)."""

    def __init__(
        self,
        index: int = 0,
        num_ps: int = 1,
        seed: int = 0,
        init_std: float = DEFAULT_INIT_STD,
        eps: float | None = None,
        optimizer: str = "adagrad",
        parent: ParentTables | None = None,
    ) -> None:
        self.index = index
        self.num_ps = num_ps
        self.parent = parent
        self.seed = seed
        self.init_std = init_std
        self.eps = eps
        self.optimizer = optim.OptimizerConfig(optimizer).name  # default for new tables
        self._tables: dict[str, _Table] = {}
        self._arenas: dict[int, _Arena] = {}
        self._tables_lock = threading.RLock()
        self._dense: dict[str, _Dense] = {}
        self._dense_lock = threading.Lock()
        self._dense_token = secrets.randbits(62)  # names this shard's dense version counter
        self._dense_version = 0  # dense updates applied (one per push carrying dense grads)
        self.dense_stale_pushes = 0  # dense pushes applied with lr / τ (τ > 1)
        self.dense_staleness_sum = 0  # Σ τ over dense pushes that said what they read
        self.dense_staleness_max = 0
        self.dense_read_pushes = 0  # dense pushes that said what they read
        self.dense_warmup_pushes = 0  # dense pushes applied with a warm-up lr (< the full lr)
        self._counter_lock = threading.Lock()
        self.step = 0  # push calls applied (sparse or dense; a Step call counts once)
        self.version = 0  # changes of any kind, for "anything to checkpoint?"
        self.pull_calls = 0
        self.push_calls = 0
        self.step_calls = 0
        self.pulled_ids = 0
        self.pushed_ids = 0

    def config(
        self, opt: str | None = None, lr: float = DEFAULT_LR, warmup: int = 0
    ) -> optim.OptimizerConfig:
        return _config(opt or self.optimizer, lr, self.eps, warmup)

    # --- tables ---

    def _arena(self, dim: int) -> _Arena:
        a = self._arenas.get(dim)
        if a is None:
            with self._tables_lock:
                a = self._arenas.setdefault(dim, _Arena(dim, self.optimizer))
        return a

    def table(self, name: str, dim: int) -> _Table:
        t = self._tables.get(name)
        if t is None:
            if dim < 1:
                raise ValueError(f"table {name!r}: dim must be positive, got {dim}")
            with self._tables_lock:
                t = self._tables.get(name)
                if t is None:
                    t = self._tables[name] = _Table(
                        name, dim, self.seed, self.init_std, self._arena(dim), self._parent(name)
                    )
        if t.dim != dim:
            raise ValueError(f"table {name!r} has dim {t.dim} on this PS, the caller says {dim}")
        return t

    def _table_for(self, name: str, dim: int | None, grads: Any = None) -> _Table:
        t = self._tables.get(name) if dim is None else self.table(name, dim)
        if t is None:
            if grads is None:
                raise ValueError(f"unknown table {name!r}: give its dim on first use")
            g = np.asarray(grads)
            t = self.table(name, int(g.shape[-1]) if g.ndim else 0)
        return t

    def _parent(self, name: str) -> ParentTable | None:
        return None if self.parent is None else self.parent.tables.get(name)

    def seed_dense_from_parent(self) -> list[str]:
        """A fresh shard of a carried-forward run: the dense parameters this PS owns start
        from the parent's (workers' ``init_dense`` then finds them: the first writer wins)."""
        if self.parent is None or not self.parent.dense:
            return []
        owners = dense_owners(self.parent.dense, self.num_ps)
        mine = {k: v for k, v in self.parent.dense.items() if owners[k] == self.index}
        return self.init_dense(mine) if mine else []

    @property
    def tables(self) -> dict[str, int]:
        return {n: t.dim for n, t in self._tables.items()}

    @property
    def num_rows(self) -> int:
        return sum(t.n for t in self._tables.values())

    def _count(
        self,
        pulls: int = 0,
        pushes: int = 0,
        pulled: int = 0,
        pushed: int = 0,
        changed: bool = False,
        steps: int = 0,
    ) -> None:
        with self._counter_lock:
            self.pull_calls += pulls
            self.push_calls += pushes
            self.step_calls += steps
            self.step += pushes
            self.pulled_ids += pulled
            self.pushed_ids += pushed
            if changed or pushes:
                self.version += 1

    def _pull_one(self, table: str, ids: npt.ArrayLike, dim: int | None) -> tuple[F32, int]:
        i = np.asarray(ids, dtype=np.int64).reshape(-1)
        t = self._table_for(table, dim)
        with t.lock:
            return t.gather(i)

    def pull(self, table: str, ids: npt.ArrayLike, dim: int | None = None) -> F32:
        """Rows of ``ids``, shape ``ids.shape + (dim,)``; absent ids get their deterministic
        initial rows. ``dim`` is needed the first time a table is seen on this PS."""
        out, created = self._pull_one(table, ids, dim)
        self._count(pulls=1, pulled=out.shape[0], changed=created > 0)
        return out.reshape(*np.shape(ids), out.shape[1])

    def pull_many(self, requests: Sequence[tuple[str, npt.ArrayLike, int | None]]) -> list[F32]:
        """Several tables in one call: ``[(table, ids, dim), ...]`` → one array each."""
        outs, created, n = [], 0, 0
        for table, ids, dim in requests:
            out, c = self._pull_one(table, ids, dim)
            outs.append(out)
            created += c
            n += out.shape[0]
        self._count(pulls=1, pulled=n, changed=created > 0)
        return outs

    def _push_one(
        self,
        table: str,
        ids: npt.ArrayLike,
        grads: npt.ArrayLike,
        cfg: optim.OptimizerConfig,
        dim: int | None,
    ) -> int:
        t = self._table_for(table, dim, grads)
        uniq, g = aggregate(ids, grads, t.dim)
        if uniq.size == 0:
            return 0
        gt = _f32(g, (uniq.size, t.dim))
        with t.lock:
            t.update(uniq, gt, cfg)
        return int(uniq.size)

    def push(
        self,
        table: str,
        ids: npt.ArrayLike,
        grads: npt.ArrayLike,
        lr: float = DEFAULT_LR,
        dim: int | None = None,
        opt: str | None = None,
    ) -> None:
        """Apply the optimizer with ``grads`` ([n, dim]) to the rows of ``ids``; duplicates are
        summed. ``opt`` None: this shard's default optimizer."""
        n = self._push_one(table, ids, grads, self.config(opt, lr), dim)
        self._count(pushes=1, pushed=n)

    def push_many(
        self,
        updates: Sequence[tuple[str, npt.ArrayLike, npt.ArrayLike, int | None]],
        lr: float = DEFAULT_LR,
        opt: str | None = None,
    ) -> None:
        """Several tables in one step: ``[(table, ids, grads, dim), ...]``."""
        cfg = self.config(opt, lr)
        n = sum(self._push_one(t, i, g, cfg, d) for t, i, g, d in updates)
        self._count(pushes=1, pushed=n)

    def _lookup_all(self, arena: _Arena, segs: Sequence[tuple[_Table, I64]]) -> tuple[I64, int]:
        """Arena rows of each segment's sorted unique ids, in order; new rows initialised in
        one vectorised call for all tables. The caller holds ``arena.lock``."""
        parts, mixes, new_ids, new_rows, new_in = [], [], [], [], []
        for t, ids in segs:
            r, ni, nr = t.lookup(ids)
            parts.append(r)
            if ni.size:
                mixes.append(np.full(ni.size, t.mix, np.uint64))
                new_ids.append(ni)
                new_rows.append(nr)
                new_in.append(t)
        if new_ids:
            arena.weights[np.concatenate(new_rows)] = _init_mixed(
                np.concatenate(mixes), np.concatenate(new_ids), arena.dim, self.init_std
            )
            for t, ni, nr in zip(new_in, new_ids, new_rows, strict=True):
                t.from_parent(ni, nr)
        created = sum(a.size for a in new_ids)
        if not parts:
            return np.empty(0, np.int64), created
        return (np.concatenate(parts) if len(parts) > 1 else parts[0]), created

    def step_many(
        self,
        pushes: Sequence[tuple[str, I64, int]],
        push_grads: F32 | None,
        pulls: Sequence[tuple[str, I64, int]],
        cfg: optim.OptimizerConfig,
        dense_grads: Mapping[str, npt.ArrayLike] | None = None,
        want_dense: bool = False,
        push_rows: tuple[int, I64] | None = None,
        dense_read: tuple[int, int] | None = None,
    ) -> tuple[F32 | None, dict[str, F32], tuple[int, I64] | None, tuple[int, int] | None]:
        """One worker step: apply ``pushes`` (per table: its *sorted unique* ids and dim; their
        summed gradients concatenated in ``push_grads`` ``[Σ ids, dim]``) and ``dense_grads``,
        then read ``pulls`` (per table: sorted unique ids, dim; rows returned concatenated in
        that order) and, if ``want_dense``, every dense parameter.

        All tables of one dim share an arena: the step takes its lock once, looks the ids up
        table by table, and does the optimizer update and the read as one vectorised op each.

        Returns (rows read, dense parameters, ``(arena token, arena rows of the pulled ids)``,
        the dense parameters' version if read). A push that sends the rows back as
        ``push_rows`` skips its id lookups when the token is still this arena's (same process,
        no restore since: rows never move in an arena). ``dense_read`` is the version the dense
        gradients were computed on (:meth:`apply_dense`)."""
        dims = {d for _, _, d in pushes} | {d for _, _, d in pulls}
        if len(dims) > 1:
            raise ValueError(f"one step's tables must share one dim; got {sorted(dims)}")
        values: F32 | None = None
        hint: tuple[int, I64] | None = None
        pushed = pulled = created = 0
        if dims:
            dim = dims.pop()
            push_t = [(self.table(n, d), ids) for n, ids, d in pushes]
            pull_t = [(self.table(n, d), ids) for n, ids, d in pulls]
            arena = self._arena(dim)
            with arena.lock:
                if push_t and push_grads is not None and push_grads.shape[0]:
                    arena.use_optimizer(cfg, f"table {push_t[0][0].name!r}")
                    total = sum(int(ids.size) for _, ids in push_t)
                    if (
                        push_rows is not None
                        and push_rows[0] == arena.token
                        and push_rows[1].size == total
                        and (total == 0 or int(push_rows[1].min()) >= 0)
                        and (total == 0 or int(push_rows[1].max()) < arena.n)
                    ):
                        rows = push_rows[1]
                    else:
                        rows, c = self._lookup_all(arena, push_t)
                        created += c
                    steps: npt.NDArray[np.int64] | int = 0
                    for t, ids in push_t:
                        if ids.size:
                            t.steps += 1
                    if cfg.name == "adam":
                        steps = np.repeat(
                            np.array([t.steps for t, _ in push_t], np.int64),
                            [ids.size for _, ids in push_t],
                        )
                    arena.update(rows, push_grads, cfg, steps)
                    pushed = int(rows.size)
                if pull_t:
                    rows, c = self._lookup_all(arena, pull_t)
                    created += c
                    values = arena.weights[rows]
                    pulled = int(rows.size)
                    hint = (arena.token, rows)
        dense: dict[str, F32] = {}
        version = None
        if dense_grads:
            self.apply_dense(dense_grads, cfg, dense_read)
        if want_dense:
            dense, version = self.pull_dense_versioned()
        self._count(
            pushes=int(pushed > 0 or bool(dense_grads)),
            pulled=pulled,
            pushed=pushed,
            changed=created > 0,
            steps=1,
            pulls=int(bool(pulls)),
        )
        return values, dense, hint, version

    # --- dense ---

    def init_dense(self, params: Mapping[str, npt.ArrayLike]) -> list[str]:
        """Set dense parameters not set yet (first writer wins); returns the names it set."""
        created = []
        with self._dense_lock:
            for name, value in params.items():
                if name in self._dense:
                    continue
                w = np.array(value, dtype=np.float32, copy=True)
                slots = [np.zeros_like(w) for _ in range(optim.SLOTS[self.optimizer])]
                self._dense[name] = _Dense(w, slots, self.optimizer)
                created.append(name)
        if created:
            self._count(changed=True)
        return created

    def pull_dense(self, names: Sequence[str] | None = None) -> dict[str, F32]:
        return self.pull_dense_versioned(names)[0]

    def pull_dense_versioned(
        self, names: Sequence[str] | None = None
    ) -> tuple[dict[str, F32], tuple[int, int]]:
        """The dense parameters and their version ``(token, updates applied)``: send it back
        with the gradients computed on these values (``dense_read``)."""
        with self._dense_lock:
            keys = list(self._dense) if names is None else [n for n in names if n in self._dense]
            values = {n: self._dense[n].weight.copy() for n in keys}
            return values, (self._dense_token, self._dense_version)

    @property
    def dense_version(self) -> tuple[int, int]:
        with self._dense_lock:
            return self._dense_token, self._dense_version

    def staleness_of(self, dense_read: tuple[int, int] | None) -> int | None:
        """Dense updates applied since the read ``dense_read`` (None: unknown: no read given,
        or one from another shard, process or restore). The caller holds the dense lock."""
        if dense_read is None or int(dense_read[0]) != self._dense_token:
            return None
        tau = self._dense_version - int(dense_read[1])
        return tau if tau >= 0 else None

    def apply_dense(
        self,
        grads: Mapping[str, npt.ArrayLike],
        cfg: optim.OptimizerConfig,
        dense_read: tuple[int, int] | None = None,
    ) -> None:
        """Apply ``cfg`` to the dense parameters with ``grads`` computed on the values of
        version ``dense_read``: ``τ`` updates later than that read, ``τ > 1`` applies them with
        ``lr / τ`` (see the module docstring); otherwise exactly torch's rule. The first
        ``cfg.warmup`` updates of a parameter ramp its lr up linearly
        (:meth:`~.optim.OptimizerConfig.dense_lr`)."""
        if not grads:
            return
        with self._dense_lock:
            for name in grads:
                if name not in self._dense:
                    raise ValueError(
                        f"dense parameter {name!r} is not on PS {self.index}; init_dense it first"
                    )
            tau = self.staleness_of(dense_read)
            scale = 1.0
            if tau is not None:
                self.dense_read_pushes += 1
                self.dense_staleness_sum += tau
                self.dense_staleness_max = max(self.dense_staleness_max, tau)
                if tau > 1:
                    self.dense_stale_pushes += 1
                    scale = 1.0 / tau
            warming = False
            for name, grad in grads.items():
                d = self._dense[name]
                d.use_optimizer(name, cfg)
                d.steps += 1
                lr = cfg.dense_lr(d.steps) * scale
                warming = warming or lr < cfg.lr * scale
                c = cfg if lr == cfg.lr else replace(cfg, lr=lr)
                optim.dense_update(c, d.weight, d.slots, _f32(grad, d.weight.shape), d.steps)
            self.dense_warmup_pushes += warming
            self._dense_version += 1

    def push_dense(
        self,
        grads: Mapping[str, npt.ArrayLike],
        lr: float = DEFAULT_LR,
        opt: str | None = None,
        dense_read: tuple[int, int] | None = None,
    ) -> None:
        self.apply_dense(grads, self.config(opt, lr), dense_read)
        self._count(pushes=1)

    # --- state ---

    def snapshot(self) -> ckpt.ShardState:
        """A copy of everything (each table copied under its lock)."""
        with self._counter_lock:
            step = self.step
        state = ckpt.ShardState(index=self.index, num_ps=self.num_ps, step=step)
        for name, t in list(self._tables.items()):
            with t.lock:
                state.tables[name] = t.snapshot()
        with self._dense_lock:
            for name, d in self._dense.items():
                state.dense[name] = ckpt.DenseState(
                    d.weight.copy(), d.accum.copy(), optimizer=d.opt, steps=d.steps
                )
        return state

    def restore(self, state: ckpt.ShardState) -> None:
        """Replace everything with ``state`` (index and num_ps stay this shard's)."""
        tables = {}
        arenas: dict[int, _Arena] = {}
        for name, ts in state.tables.items():
            arena = arenas.setdefault(ts.dim, _Arena(ts.dim, ts.optimizer))
            t = _Table(name, ts.dim, self.seed, self.init_std, arena, self._parent(name))
            t.load(ts)
            tables[name] = t
        dense = {}
        for n, d in state.dense.items():
            w = d.weight.astype(np.float32, copy=True)
            k = optim.SLOTS[d.optimizer]
            acc = d.accum.astype(np.float32, copy=True)
            if acc.size != k * w.size:
                raise ckpt.CheckpointError(
                    f"dense parameter {n!r}: optimizer state of {acc.size} values does not fit "
                    f"{d.optimizer} ({k} slots of {w.size})"
                )
            slots = [s.reshape(w.shape).copy() for s in acc.reshape(k, -1)] if k else []
            dense[n] = _Dense(w, slots, d.optimizer, d.steps)
        with self._tables_lock:
            self._tables = tables
            self._arenas = arenas
        with self._dense_lock:
            self._dense = dense
            self._dense_token = secrets.randbits(62)  # reads of the old state say nothing now
            self._dense_version = 0
        with self._counter_lock:
            self.step = state.step
            self.version += 1

    @classmethod
    def from_state(cls, state: ckpt.ShardState, **kwargs: Any) -> PSShard:
        shard = cls(index=state.index, num_ps=state.num_ps, **kwargs)
        shard.restore(state)
        return shard

    def stats(self) -> dict[str, Any]:
        tables = {}
        param = state_b = alloc = 0
        for name, t in list(self._tables.items()):
            with t.lock:
                n, alloc_t = t.n, t.allocated_bytes()
            tables[name] = {"rows": n, "dim": t.dim, "optimizer": t.opt}
            param += n * t.dim * 4
            state_b += n * t.dim * 4 * (1 + len(t.arena.slots))
            alloc += alloc_t
        for arena in list(self._arenas.values()):
            with arena.lock:
                alloc += arena.allocated_bytes()
        with self._dense_lock:
            dense_b = sum(d.weight.nbytes for d in self._dense.values())
            dense_state_b = sum(d.weight.nbytes * (1 + len(d.slots)) for d in self._dense.values())
            dense_n = len(self._dense)
            dense_counters = {
                "dense_version": self._dense_version,
                "dense_read_pushes": self.dense_read_pushes,
                "dense_stale_pushes": self.dense_stale_pushes,
                "dense_staleness_mean": (
                    self.dense_staleness_sum / self.dense_read_pushes
                    if self.dense_read_pushes
                    else 0.0
                ),
                "dense_staleness_max": self.dense_staleness_max,
                "dense_warmup_pushes": self.dense_warmup_pushes,
            }
        with self._counter_lock:
            counters = {
                "step": self.step,
                "pull_calls": self.pull_calls,
                "push_calls": self.push_calls,
                "step_calls": self.step_calls,
                "pulled_ids": self.pulled_ids,
                "pushed_ids": self.pushed_ids,
            }
        return {
            "index": self.index,
            "num_ps": self.num_ps,
            "tables": tables,
            "rows": sum(t["rows"] for t in tables.values()),
            "dense_params": dense_n,
            "param_bytes": param + dense_b,
            "state_bytes": state_b + dense_state_b,
            "allocated_bytes": alloc + dense_state_b,
            **counters,
            **dense_counters,
        }


# --- the service -----------------------------------------------------------------------------


def _bad(message: str) -> wire.RpcError:
    import grpc

    return wire.RpcError(message, grpc.StatusCode.INVALID_ARGUMENT)


def _split(msg: wire.Message, prefix: str, with_grads: bool) -> list[tuple[str, Any, Any, int]]:
    """Per table (name, ids, grads or None, dim) of the request's ``{prefix}tables`` etc."""
    tables = list(msg.get(prefix + "tables", []))
    dims = [int(d) for d in msg.get(prefix + "dims", [])]
    counts = [int(c) for c in msg.get(prefix + "counts", [])]
    if not (len(tables) == len(dims) == len(counts)):
        raise _bad(f"{prefix}tables, {prefix}dims and {prefix}counts must have the same length")
    if any(c < 0 for c in counts) or any(d < 1 for d in dims):
        raise _bad(f"{prefix}counts must be >= 0 and {prefix}dims >= 1")
    ids = msg.arrays.get(prefix + "ids", np.empty(0, np.int64))
    if ids.dtype != np.int64:
        raise _bad(f"{prefix}ids must be int64, got {ids.dtype}")
    if ids.size != sum(counts):
        raise _bad(f"{prefix}counts add up to {sum(counts)} but {ids.size} ids were sent")
    grads = None
    if with_grads:
        grads = wire.as_float32(msg, prefix + "grads")
        want = sum(c * d for c, d in zip(counts, dims, strict=True))
        if grads is None and want == 0:
            grads = np.empty(0, np.float32)
        if grads is None or grads.size != want:
            got = None if grads is None else grads.size
            raise _bad(f"expected {want} gradient values, got {got}")
        grads = grads.reshape(-1)
    out = []
    i = g = 0
    for name, dim, c in zip(tables, dims, counts, strict=True):
        part_g = grads[g : g + c * dim].reshape(c, dim) if grads is not None else None
        out.append((str(name), ids[i : i + c], part_g, dim))
        i += c
        g += c * dim
    return out


def _dense_read(msg: wire.Message) -> tuple[int, int] | None:
    """The request's ``dense_read`` (token, version), None when absent or malformed."""
    raw = msg.get("dense_read")
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        return None
    try:
        return int(raw[0]), int(raw[1])
    except (TypeError, ValueError):
        return None


def _segments_sorted_unique(parts: Sequence[I64]) -> bool:
    """Whether every part is strictly increasing (sorted, no duplicates)."""
    return all(p.size < 2 or bool(np.all(p[1:] > p[:-1])) for p in parts)


def _split_request(msg: wire.Message, with_grads: bool) -> list[tuple[str, Any, Any, int]]:
    return _split(msg, "", with_grads)


DENSE_GRAD = "dg:"
"""Prefix of a dense gradient's array name in a Step request (``dg:<parameter name>``)."""
DENSE_VALUE = "d:"
"""Prefix of a dense parameter's array name in a Step reply."""


class PSServer:
    """Serves a :class:`PSShard` as ``dlrover.PS``; checkpoints into ``checkpoint_dir``."""

    def __init__(
        self,
        shard: PSShard,
        token: str,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        lr: float = DEFAULT_LR,
        max_workers: int = 8,
    ) -> None:
        self.shard = shard
        self.token = token
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.host = host
        self.port = port
        self.lr = lr
        self.max_workers = max_workers
        self.server: Any = None
        self.last_checkpoint: ckpt.CheckpointInfo | None = None
        self._ckpt_version = -1
        self._ckpt_lock = threading.Lock()
        self.tag = -1  # the master's done_seq last heard (checkpoints are tagged with it)
        self.frozen = False
        self._calls = threading.Condition()
        self._in_flight = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def handlers(self) -> dict[str, wire.Handler]:
        data: dict[str, wire.Handler] = {
            "Step": self._step,
            "Pull": self._pull,
            "Push": self._push,
            "PullDense": self._pull_dense,
            "PushDense": self._push_dense,
            "InitDense": self._init_dense,
            "Ping": self._ping,
        }
        return {
            **{name: self._unless_frozen(name, fn) for name, fn in data.items()},
            "Checkpoint": self._checkpoint,
            "Freeze": self._freeze,
            "Stats": self._stats,
        }

    def _unless_frozen(self, name: str, fn: wire.Handler) -> wire.Handler:
        def call(msg: wire.Message) -> Any:
            with self._calls:
                if self.frozen:
                    raise wire.RpcError(
                        f"PS {self.shard.index} is frozen for a PS-set change: {name} refused; "
                        "wait for the new PS set",
                        grpc.StatusCode.UNAVAILABLE,
                    )
                self._in_flight += 1
            try:
                return fn(msg)
            finally:
                with self._calls:
                    self._in_flight -= 1
                    self._calls.notify_all()

        return call

    def _freeze(self, msg: wire.Message) -> dict[str, Any]:
        with self._calls:
            self.frozen = bool(msg.get("frozen", True))
            # a frozen PS answers only once the data calls already inside have finished: the
            # checkpoint that follows holds every push it ever applied
            self._calls.wait_for(lambda: self._in_flight == 0, timeout=30.0)
        log.info("PS %d %s", self.shard.index, "frozen" if self.frozen else "unfrozen")
        return {"frozen": self.frozen}

    def start(self) -> int:
        self.server, self.port = wire.serve(
            SERVICE, self.handlers(), self.token, self.host, self.port, self.max_workers
        )
        return self.port

    def stop(self, grace_s: float = 2.0) -> None:
        if self.server is not None:
            self.server.stop(grace_s).wait()
            self.server = None

    def mark_checkpointed(self, info: ckpt.CheckpointInfo | None) -> None:
        """Record that the current state is already on disk (e.g. just restored from it)."""
        self.last_checkpoint = info
        self._ckpt_version = self.shard.version

    def checkpoint(self, step: int | None = None, force: bool = False) -> ckpt.CheckpointInfo:
        """Write a checkpoint unless nothing changed since the last one (then return that)."""
        if self.checkpoint_dir is None:
            raise ValueError("this PS has no checkpoint directory")
        with self._ckpt_lock:
            version = self.shard.version
            tag = self.tag  # read before the snapshot: the state holds at least this much
            last = self.last_checkpoint
            if last is not None and version == self._ckpt_version and not force and last.tag >= tag:
                return last
            info = ckpt.save(self.shard, self.checkpoint_dir, step, tag=tag)
            self.last_checkpoint = info
            self._ckpt_version = version
            return info

    # handlers

    def _cfg(self, msg: wire.Message) -> optim.OptimizerConfig:
        lr = msg.get("lr")
        try:
            lr_f = float(lr if lr is not None else self.lr)
            return self.shard.config(msg.get("opt"), lr_f, msg.get("warmup") or 0)
        except (TypeError, ValueError) as e:
            raise _bad(str(e)) from e

    def _step(self, msg: wire.Message) -> tuple[dict[str, Any], dict[str, Any]]:
        """Push (sparse and dense), then pull (sparse and, if asked, dense): one round trip.

        The worker sends each table's ids sorted and unique (its :class:`StepPlan` does); a
        request that does not is still served right, through a slower path."""
        cfg = self._cfg(msg)
        push_parts = _split(msg, "push_", with_grads=True)
        pull_parts = _split(msg, "", with_grads=False)
        pushes: list[tuple[str, I64, int]] = []
        grads: F32 | None = None
        fast_push = False  # ids exactly as the worker's plan sent them
        if push_parts:
            dim = push_parts[0][3]
            if _segments_sorted_unique([p[1] for p in push_parts]) and all(
                p[3] == dim for p in push_parts
            ):
                pushes = [(n, i, d) for n, i, _, d in push_parts]
                fast_push = True
                flat = wire.as_float32(msg, "push_grads")
                assert flat is not None
                grads = _f32(flat, (-1, dim))
            else:
                gs = []
                for name, ids, g, d in push_parts:
                    try:
                        uniq, agg = aggregate(ids, g, d)
                    except ValueError as e:
                        raise _bad(str(e)) from e
                    pushes.append((name, uniq, d))
                    gs.append(agg)
                grads = _f32(np.concatenate(gs), (-1, dim)) if gs else None
        pulls = [(n, i, d) for n, i, _, d in pull_parts]
        expand: I64 | None = None
        if pulls and not _segments_sorted_unique([p[1] for p in pulls]):
            uniq_pulls, invs, off = [], [], 0
            for name, ids, d in pulls:
                u, inv = np.unique(ids, return_inverse=True)
                uniq_pulls.append((name, u, d))
                invs.append(inv + off)
                off += u.size
            pulls, expand = uniq_pulls, np.concatenate(invs)
        dense_grads = {
            k[len(DENSE_GRAD) :]: a for k, a in msg.arrays.items() if k.startswith(DENSE_GRAD)
        }
        dense_read = _dense_read(msg)
        hint_in = None
        token, hint_rows = msg.get("push_rows_token"), msg.arrays.get("push_rows")
        ok = fast_push and token is not None and hint_rows is not None
        if ok and hint_rows is not None and hint_rows.dtype == np.int64:
            hint_in = (int(token), hint_rows)
        try:
            values, dense, hint, version = self.shard.step_many(
                pushes,
                grads,
                pulls,
                cfg,
                dense_grads,
                bool(msg.get("want_dense")),
                hint_in,
                dense_read,
            )
        except ValueError as e:
            raise _bad(str(e)) from e
        arrays: dict[str, Any] = {DENSE_VALUE + k: v for k, v in dense.items()}
        fields: dict[str, Any] = {"step": self.shard.step}
        if version is not None:
            fields["dense_version"] = list(version)
        transfer = msg.get("transfer") or "fp32"
        if hint is not None and expand is None:
            fields["rows_token"] = hint[0]
            arrays["rows"] = hint[1]
        if values is not None:
            if expand is not None:
                values = values[expand]
            try:
                arrays["values"] = wire.encode_float(values, transfer)
            except ValueError as e:
                raise _bad(str(e)) from e
        return {**fields, "transfer": transfer}, arrays

    def _pull(self, msg: wire.Message) -> tuple[dict[str, Any], dict[str, Any]]:
        reqs = _split_request(msg, with_grads=False)
        try:
            outs = self.shard.pull_many([(name, ids, dim) for name, ids, _, dim in reqs])
        except ValueError as e:
            raise _bad(str(e)) from e
        flat = np.concatenate([o.reshape(-1) for o in outs]) if outs else np.empty(0, np.float32)
        return {}, {"values": flat}

    def _push(self, msg: wire.Message) -> dict[str, Any]:
        reqs = _split_request(msg, with_grads=True)
        cfg = self._cfg(msg)
        try:
            n = sum(self.shard._push_one(nm, i, g, cfg, d) for nm, i, g, d in reqs)
        except ValueError as e:
            raise _bad(str(e)) from e
        self.shard._count(pushes=1, pushed=n)
        return {"step": self.shard.step}

    def _pull_dense(self, msg: wire.Message) -> tuple[dict[str, Any], dict[str, Any]]:
        names = msg.get("names")
        values, version = self.shard.pull_dense_versioned(names)
        return {"dense_version": list(version)}, dict(values)

    def _push_dense(self, msg: wire.Message) -> dict[str, Any]:
        cfg = self._cfg(msg)
        try:
            self.shard.apply_dense(msg.arrays, cfg, _dense_read(msg))
        except ValueError as e:
            raise _bad(str(e)) from e
        self.shard._count(pushes=1)
        return {"step": self.shard.step}

    def _init_dense(self, msg: wire.Message) -> dict[str, Any]:
        return {"created": self.shard.init_dense(msg.arrays)}

    def _checkpoint(self, msg: wire.Message) -> dict[str, Any]:
        step, tag = msg.get("step"), msg.get("tag")
        if tag is not None:
            self.tag = max(self.tag, int(tag))
        try:
            before = self.last_checkpoint
            info = self.checkpoint(None if step is None else int(step))
        except (OSError, ValueError) as e:
            raise wire.RpcError(f"checkpoint failed on PS {self.shard.index}: {e}") from e
        return {
            "path": str(info.path),
            "step": info.step,
            "tag": info.tag,
            "skipped": info is before,
        }

    def _stats(self, msg: wire.Message) -> dict[str, Any]:
        out = self.shard.stats()
        try:
            import psutil
        except ImportError:  # psutil is optional here: stats without rss are still useful
            out["rss_bytes"] = None
        else:
            out["rss_bytes"] = int(psutil.Process().memory_info().rss)
        out["pid"] = os.getpid()
        return out

    def _ping(self, msg: wire.Message) -> dict[str, Any]:
        return {
            "index": self.shard.index,
            "num_ps": self.shard.num_ps,
            "pid": os.getpid(),
            "step": self.shard.step,
        }


# --- where a PS process lives in the run directory -------------------------------------------


def ps_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "ps"


def addr_path(run_dir: str | os.PathLike[str], index: int) -> Path:
    return ps_dir(run_dir) / f"ps-{index}.addr"


def checkpoint_dir(run_dir: str | os.PathLike[str], index: int) -> Path:
    return ps_dir(run_dir) / f"ps-{index}"


def read_addr(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON a PS wrote when it started serving, or None if there is none (yet)."""
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(data), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def restore_shard(
    index: int,
    num_ps: int,
    own_dir: str | os.PathLike[str],
    restore_from: Sequence[str | os.PathLike[str]] = (),
    **shard_kwargs: Any,
) -> tuple[PSShard, ckpt.CheckpointInfo | None, str]:
    """The shard a PS process starts with, and where it came from.

    Its own latest checkpoint wins when it was written by PS (index, num_ps); otherwise the
    state is re-sharded from ``restore_from`` (the old PS set's checkpoint directories);
    otherwise it starts empty. Returns (shard, checkpoint it equals or None, source)."""
    shard, info, source, _ = restore_tagged(index, num_ps, own_dir, restore_from, **shard_kwargs)
    return shard, info, source


def restore_tagged(
    index: int,
    num_ps: int,
    own_dir: str | os.PathLike[str],
    restore_from: Sequence[str | os.PathLike[str]] = (),
    restore_seq: int = 0,
    **shard_kwargs: Any,
) -> tuple[PSShard, ckpt.CheckpointInfo | None, str, int]:
    """:func:`restore_shard` plus the tag of what was restored: the shard ``done_seq`` the
    state includes (own checkpoint: its tag; a re-shard: the smallest tag of its sources, or
    ``restore_seq`` when they carry none; empty: 0, i.e. no shard's updates)."""
    shard = PSShard(index=index, num_ps=num_ps, **shard_kwargs)
    own = ckpt.load_latest(own_dir)
    if own is not None and (own.info.index, own.info.num_ps) == (index, num_ps):
        shard.restore(own.state)
        for mp in ckpt.quarantine(own.rejected_paths):
            log.warning("set %s aside as %s.corrupt (never read again)", mp.name, mp.name)
        return shard, own.info, f"own:{own.info.path}", max(0, own.info.tag)
    if own is not None:
        log.warning(
            "ignoring %s: written by PS %d of %d, this is PS %d of %d",
            own.info.path,
            own.info.index,
            own.info.num_ps,
            index,
            num_ps,
        )
    if restore_from:
        res = ckpt.load_for(index, num_ps, restore_from)
        shard.restore(res.state)
        tags = [s.tag for s in res.sources if s.tag >= 0]
        tag = min(tags) if len(tags) == len(res.sources) and tags else restore_seq
        return shard, None, "reshard:" + ",".join(str(d) for d in restore_from), max(0, tag)
    if shard.seed_dense_from_parent():
        return shard, None, "parent model", 0
    return shard, None, "empty", 0


def _lock_dir(directory: Path, wait_s: float = 10.0) -> TextIO:
    """Hold an exclusive lock on ``directory`` for the life of the process (two live PS must
    not write one checkpoint directory; the kernel drops the lock when the process dies)."""
    directory.mkdir(parents=True, exist_ok=True)
    f = open(directory / ".lock", "a+")  # noqa: SIM115 - held until the process exits
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise ckpt.CheckpointError(
                    f"another live PS holds {directory}; give this PS its own --ckpt-dir "
                    "(each PS set of a migration needs separate directories)"
                ) from None
            time.sleep(0.1)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="dlrover-rm node ps", description="A parameter server of a dlrover-rm job."
    )
    p.add_argument("--run-dir", required=True, help="the job's run directory (holds the token)")
    p.add_argument("--index", type=int, required=True, help="this PS's index, 0-based")
    p.add_argument("--num-ps", type=int, required=True, help="how many PS the set has")
    p.add_argument("--master", default=None, help="the job master's HOST:PORT (register there)")
    p.add_argument("--incarnation", type=int, default=0, help="launches of this node before")
    p.add_argument("--generation", type=int, default=1, help="the PS set's generation")
    p.add_argument("--host", default=None, help="bind address (default $DLROVER_RM_BIND_HOST)")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument(
        "--restore-from",
        default="",
        help="comma-separated checkpoint directories of the old PS set, to re-shard from",
    )
    p.add_argument("--restore-seq", type=int, default=0, help="done_seq tag of those sources")
    p.add_argument("--ckpt-dir", default=None, help="default RUN_DIR/ps/ps-INDEX")
    p.add_argument("--addr-file", default=None, help="without --master: where to write it")
    p.add_argument("--checkpoint-every-s", type=float, default=30.0, help="0 disables")
    p.add_argument("--heartbeat-s", type=float, default=5.0, help="heartbeat interval")
    p.add_argument(
        "--dead-after-s", type=float, default=600.0, help="exit when the master is unreachable"
    )
    p.add_argument("--lr", type=float, default=DEFAULT_LR)
    p.add_argument("--seed", type=int, default=0, help="seed of the initial rows")
    p.add_argument("--threads", type=int, default=8, help="gRPC worker threads")
    args = p.parse_args(argv)
    if not 0 <= args.index < args.num_ps:
        p.error(f"--index {args.index} must be in 0..{args.num_ps - 1}")
    return args


EXIT_OK = 0
EXIT_FATAL = 1


def main(argv: Sequence[str] | None = None) -> int:
    from dlrover_core import logs
    from dlrover_core.runtime.backends.base import ENV_ADVERTISE_HOST, ENV_BIND_HOST

    logs.setup_node("info")
    args = _parse(argv)
    run_dir = Path(args.run_dir)
    try:
        token = wire.read_token(run_dir)
    except OSError as e:
        print(f"ps {args.index}: cannot read the job token in {run_dir}: {e}", file=sys.stderr)
        return EXIT_FATAL
    own_dir = Path(args.ckpt_dir) if args.ckpt_dir else checkpoint_dir(run_dir, args.index)
    restore_from = [d for d in args.restore_from.split(",") if d]
    bind = args.host or os.environ.get(ENV_BIND_HOST, "127.0.0.1")
    advertise = os.environ.get(ENV_ADVERTISE_HOST, bind if bind != "0.0.0.0" else "127.0.0.1")

    stop = threading.Event()
    why = ["SIGTERM"]

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        # an older incarnation may still hold the directory until it learns it is superseded
        lock = _lock_dir(own_dir, wait_s=max(10.0, args.dead_after_s + 5.0))
        pfile = parent_path(run_dir)
        parent = ParentTables.load(pfile) if pfile.exists() else None
        shard, restored, source, tag = restore_tagged(
            args.index,
            args.num_ps,
            own_dir,
            restore_from,
            args.restore_seq,
            seed=args.seed,
            parent=parent,
        )
    except ckpt.CheckpointError as e:
        print(f"ps {args.index}: cannot restore: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_FATAL
    server = PSServer(shard, token, own_dir, bind, args.port, args.lr, max_workers=args.threads)
    server.tag = tag
    server.mark_checkpointed(restored)
    if restored is None or len(ckpt.list_checkpoints(own_dir)) < ckpt.KEEP:
        # a relaunch restores this, not the sources again; after a fall-back past a corrupt
        # checkpoint (set aside), this restores the redundancy of ``KEEP`` good copies
        server.checkpoint(force=True)
    port = server.start()
    address = f"{advertise}:{port}"
    dense_steps = [d.steps for d in shard._dense.values()]
    log.info(
        "PS %d/%d (incarnation %d, generation %d) serving on %s, %d rows and %d dense "
        "parameters (at update %d) restored (%s, tag %d)",
        args.index,
        args.num_ps,
        args.incarnation,
        args.generation,
        address,
        shard.num_rows,
        len(dense_steps),
        max(dense_steps, default=0),
        source,
        tag,
    )
    code = EXIT_OK
    saver: threading.Thread | None = None
    try:
        if args.master:
            beats = _MasterLink(args, token, address, tag)
            if not beats.register():
                stop.set()
                why[0] = "superseded"
        else:
            write_json_atomic(
                Path(args.addr_file) if args.addr_file else addr_path(run_dir, args.index),
                {
                    "address": address,
                    "pid": os.getpid(),
                    "index": args.index,
                    "num_ps": args.num_ps,
                    "restored_step": shard.step,
                    "restored_rows": shard.num_rows,
                    "restored_from": source,
                    "checkpoint_dir": str(own_dir),
                },
            )

        def periodic() -> None:
            while not stop.wait(args.checkpoint_every_s):
                try:
                    server.checkpoint()
                except OSError as e:  # keep serving; the next period tries again
                    log.error("periodic checkpoint failed: %s", e)

        if args.checkpoint_every_s > 0 and not stop.is_set():
            saver = threading.Thread(target=periodic, name="ps-checkpoint", daemon=True)
            saver.start()
        period = args.heartbeat_s if args.master else 1.0
        while not stop.wait(period):
            if args.master:
                reason = beats.beat(server)
                if reason:
                    why[0] = reason
                    stop.set()
    finally:
        log.info("PS %d stopping (%s): final checkpoint", args.index, why[0])
        server.stop(grace_s=1.0)
        stop.set()
        if saver is not None:
            saver.join()
        try:
            info = server.checkpoint()
            log.info("PS %d final checkpoint %s (tag %d)", args.index, info.path, info.tag)
        except OSError as e:
            log.error("PS %d: final checkpoint failed: %s", args.index, e)
            code = EXIT_FATAL
        if not args.master:
            addr_file = Path(args.addr_file) if args.addr_file else addr_path(run_dir, args.index)
            current = read_addr(addr_file)
            if current is not None and current.get("pid") == os.getpid():
                addr_file.unlink(missing_ok=True)
        lock.close()
    return code


class _MasterLink:
    """The PS's side of the master: register, heartbeat (rows, step), learn the done_seq
    that tags checkpoints; give up when the master stays unreachable for --dead-after-s."""

    def __init__(self, args: argparse.Namespace, token: str, address: str, tag: int) -> None:
        from dlrover_core.runtime.master_client import MasterClient

        self.args = args
        self.address = address
        self.tag = tag
        self.client = MasterClient(args.master, token, retry_for_s=args.dead_after_s)

    def register(self) -> bool:
        """False when the master refuses this PS as superseded (it must exit)."""
        from dlrover_core.runtime.master_client import MasterRejectedError, MasterUnavailableError

        try:
            reg = self.client.register(
                "ps",
                self.args.index,
                os.getpid(),
                self.args.incarnation,
                address=self.address,
                generation=self.args.generation,
                restored_seq=self.tag,
            )
        except MasterRejectedError as e:
            log.warning("PS %d: %s", self.args.index, e)
            return False
        except MasterUnavailableError as e:
            log.error("PS %d: %s", self.args.index, e)
            return False
        log.info(
            "PS %d registered (master %s, done_seq %s)",
            self.args.index,
            reg.master_id,
            reg.done_seq,
        )
        return True

    def beat(self, server: PSServer) -> str:
        """One heartbeat; a reason to stop, or ""."""
        from dlrover_core.runtime.master_client import MasterRejectedError, MasterUnavailableError

        try:
            reply = self.client.heartbeat(rows=float(server.shard.num_rows), step=server.shard.step)
        except MasterUnavailableError as e:
            log.error("PS %d: %s: exiting", self.args.index, e)
            return "master unreachable"
        except MasterRejectedError as e:
            log.error("PS %d: heartbeat refused: %s: exiting", self.args.index, e)
            return "refused"
        if reply.done_seq is not None:
            server.tag = max(server.tag, reply.done_seq)
        if reply.stop:
            return "the master said stop"
        return ""


if __name__ == "__main__":
    sys.exit(main())
