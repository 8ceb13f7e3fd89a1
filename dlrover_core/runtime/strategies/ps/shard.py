"""One PS's shard: its embedding tables (:mod:`.store`) and dense parameters, and the
optimizer steps applied to them.

:class:`PSShard` is the state (no IO): pushes apply the optimizer they name (:mod:`.optim`:
Adagrad, Adam or SGD, torch's update rules), duplicate ids summed first; pulls create absent
rows (:mod:`.store`). :mod:`.service` serves it over the wire; :mod:`.server` is the process.

Stale dense gradients: a read of the dense parameters returns ``dense_version`` = (this
shard's random token, the number of dense updates applied so far); a worker sends it back as
``dense_read`` with the gradients it computed on those values. ``τ`` = the updates applied since
that read; a gradient with ``τ > 1`` is applied with ``lr / τ`` (staleness-aware asynchronous SGD,
Zhang et al., IJCAI 2016), one with ``τ ≤ 1`` or without ``dense_read`` exactly by torch's rule.
Without it, dense parameters that lag ≥ 2 updates (two workers with prefetching lag about 3)
sent Adagrad at lr 0.05 into a bad state in about half the runs (held-out AUC 0.67 instead of
0.78, the same in a one-process torch simulation of the delay: docs/decisions.md, "PS data
plane"). Sparse rows are applied as they come: their staleness did not hurt.

Dense warm-up: a Step or PushDense may carry ``warmup`` = W (the worker sends
``training.dense_warmup``); dense update k of a parameter (its count, kept in checkpoints) then
uses ``lr · min(1, k / W)`` for Adagrad and Adam (:meth:`.optim.OptimizerConfig.dense_lr`):
their first updates are ±lr on every weight and switched all of DLRM's bottom-MLP outputs off
in a few runs in a hundred (docs/decisions.md, "PS data plane").
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps import optim
from dlrover_core.runtime.strategies.ps.partition import dense_owners
from dlrover_core.runtime.strategies.ps.store import (
    DEFAULT_INIT_STD,
    F32,
    I64,
    Arena,
    Table,
    aggregate,
    as_f32,
    init_mixed,
)
from dlrover_core.training.carry import ParentTable, ParentTables

DEFAULT_LR = 0.05
DEFAULT_EPS = optim.DEFAULT_EPS["adagrad"]


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
        self._tables: dict[str, Table] = {}
        self._arenas: dict[int, Arena] = {}
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

    def _arena(self, dim: int) -> Arena:
        a = self._arenas.get(dim)
        if a is None:
            with self._tables_lock:
                a = self._arenas.setdefault(dim, Arena(dim, self.optimizer))
        return a

    def table(self, name: str, dim: int) -> Table:
        t = self._tables.get(name)
        if t is None:
            if dim < 1:
                raise ValueError(f"table {name!r}: dim must be positive, got {dim}")
            with self._tables_lock:
                t = self._tables.get(name)
                if t is None:
                    t = self._tables[name] = Table(
                        name, dim, self.seed, self.init_std, self._arena(dim), self._parent(name)
                    )
        if t.dim != dim:
            raise ValueError(f"table {name!r} has dim {t.dim} on this PS, the caller says {dim}")
        return t

    def _table_for(self, name: str, dim: int | None, grads: Any = None) -> Table:
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
        gt = as_f32(g, (uniq.size, t.dim))
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

    def _lookup_all(self, arena: Arena, segs: Sequence[tuple[Table, I64]]) -> tuple[I64, int]:
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
            arena.weights[np.concatenate(new_rows)] = init_mixed(
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
                optim.dense_update(c, d.weight, d.slots, as_f32(grad, d.weight.shape), d.steps)
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
        arenas: dict[int, Arena] = {}
        for name, ts in state.tables.items():
            arena = arenas.setdefault(ts.dim, Arena(ts.dim, ts.optimizer))
            t = Table(name, ts.dim, self.seed, self.init_std, arena, self._parent(name))
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
