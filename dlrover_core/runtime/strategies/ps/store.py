"""The row store of a PS: embedding rows, their optimizer slots and their id → row index.

Per dim, an :class:`Arena` holds the rows of every table of that dim on this PS with the
optimizer's slots (:mod:`.optim`: Adagrad, Adam or SGD, torch's update rules); a :class:`Table`
is one table's id → arena row index and its update count. Rows are created the first time an id
is pulled (or pushed), with a deterministic initial value drawn from a hash of (seed, table, id)
(:func:`init_rows`), so PS memory grows the way it does in CTR training and a row re-created
anywhere starts the same; a row whose id the carried-forward model trained starts from the
parent's row instead (:meth:`Table.from_parent`). No IO; the caller holds the arena's lock.
"""

from __future__ import annotations

import secrets
import threading

import numpy as np
import numpy.typing as npt

from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps import optim
from dlrover_core.runtime.strategies.ps.partition import as_uint64, splitmix64, table_salt
from dlrover_core.training.carry import CARRIED_ACCUMULATOR, ParentTable

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


def init_mixed(mix: npt.NDArray[np.uint64], ids: I64, dim: int, std: float) -> F32:
    base = splitmix64(as_uint64(ids) ^ mix)
    cols = np.arange(1, dim + 1, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    x = splitmix64(base[:, None] ^ cols[None, :])
    u1 = ((x >> np.uint64(32)).astype(np.float64) + 0.5) * (1.0 / 4294967296.0)
    u2 = (x & np.uint64(0xFFFFFFFF)).astype(np.float64) * (1.0 / 4294967296.0)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return (z * std).astype(np.float32)


def table_mix(table: str, seed: int) -> np.uint64:
    return np.uint64(splitmix64(np.array([seed], dtype=np.uint64))[0] ^ table_salt(table))


def init_rows(table: str, ids: I64, dim: int, seed: int = 0, std: float = DEFAULT_INIT_STD) -> F32:
    """Deterministic normal(0, std) rows for ``ids``: a function of (seed, table, id) only."""
    return init_mixed(np.full(len(ids), table_mix(table, seed), np.uint64), ids, dim, std)


def _search(keys: I64, vals: I64, q: I64) -> I64:
    """Row of each query in the sorted ``keys`` (−1 where absent)."""
    if keys.size == 0:
        return np.full(q.shape, -1, dtype=np.int64)
    pos = np.searchsorted(keys, q)
    np.minimum(pos, keys.size - 1, out=pos)
    return np.where(keys[pos] == q, vals[pos], -1)


# --- the state -------------------------------------------------------------------------------


def as_f32(a: npt.ArrayLike, shape: tuple[int, ...]) -> F32:
    """``a`` as float32 of ``shape`` (a view when it already is float32; read-only wire
    buffers are fine: updates only read gradients)."""
    return np.asarray(a, dtype=np.float32).reshape(shape)


class Arena:
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


class Table:
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
        arena: Arena,
        parent: ParentTable | None = None,
    ) -> None:
        self.name = name
        self.parent = parent  # the carried-forward model's rows (training.init_from)
        self.dim = dim
        self.seed = seed
        self.init_std = init_std
        self.arena = arena
        self.mix = table_mix(name, seed)
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
