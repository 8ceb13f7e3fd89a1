"""The worker's side of the parameter servers: route, batch, call in parallel, reassemble.

Ids are de-duplicated on the client, split by :func:`.partition.owner`. A training step is one
call per PS (:meth:`PSClient.exchange`, the PS's ``Step``): the previous step's sparse and dense
gradients and the next batch's ids together; the reply carries the rows (and the dense
parameters). :meth:`PSClient.plan` computes a batch's routing once, vectorised over all its
tables, laid out so each PS's rows and gradients are one contiguous slice of the step's row
buffer. The older per-kind calls (:meth:`PSClient.pull_many`, :meth:`PSClient.push_many`,
:meth:`PSClient.pull_dense`, :meth:`PSClient.push_dense`) remain for evaluation and tools.
Dense parameters are routed round-robin over their sorted names
(:func:`.partition.dense_owners`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from dlrover_core.errors import DLRoverError, ErrorKind
from dlrover_core.runtime import wire
from dlrover_core.runtime.strategies.ps.partition import (
    as_uint64,
    dense_owners,
    owner,
    splitmix64,
    table_salt,
)
from dlrover_core.runtime.strategies.ps.service import DENSE_GRAD, DENSE_VALUE, SERVICE
from dlrover_core.runtime.strategies.ps.store import aggregate

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
T = TypeVar("T")

_UNREACHABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}


class PSError(DLRoverError):
    """A PS refused or failed a call (bad request, wrong token, unknown table ...)."""

    kind = ErrorKind.INVALID_INPUT

    def __init__(self, message: str, *, index: int = -1, address: str = "", code: Any = None):
        super().__init__(message)
        self.index = index
        self.address = address
        self.code = code


class PSUnavailable(PSError):
    """A PS could not be reached: ``index`` and ``address`` say which one. Re-read the PS
    addresses (a relaunched PS listens on a new port) and :meth:`PSClient.switch`."""

    kind = ErrorKind.UNAVAILABLE


def _convert(e: grpc.RpcError, index: int, address: str, method: str) -> PSError:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    if code in _UNREACHABLE:
        return PSUnavailable(
            f"PS {index} at {address} is unreachable ({method}: {code.name if code else '?'}: "
            f"{details}); wait for it to be relaunched, then switch to its new address",
            index=index,
            address=address,
            code=code,
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        msg = (
            f"PS {index} at {address} refused {method}: wrong job token (read it from the run dir)"
        )
    else:
        msg = f"PS {index} at {address} failed {method}: {code.name if code else '?'}: {details}"
    return PSError(msg, index=index, address=address, code=code)


class PSClient:
    """Talks to a set of PS. ``tables`` maps each embedding table's name to its dim."""

    def __init__(
        self,
        addresses: Sequence[str],
        token: str,
        tables: Mapping[str, int],
        timeout_s: float = 30.0,
    ) -> None:
        if not addresses:
            raise ValueError("PSClient needs at least one PS address")
        self.token = token
        self.tables = dict(tables)
        self.timeout_s = timeout_s
        self.addresses: list[str] = []
        self._clients: list[wire.Client] = []
        self._pool: ThreadPoolExecutor | None = None
        self._dense_names: list[str] | None = None
        # per PS: the version (token, updates) of the dense values the last pull_dense read
        self.dense_versions: dict[int, tuple[int, int]] = {}
        self._pusher: ThreadPoolExecutor | None = None
        self._salts: dict[tuple[str, ...], npt.NDArray[np.uint64]] = {}
        self.switch(addresses)

    @property
    def num_ps(self) -> int:
        return len(self._clients)

    # --- connections ---

    def switch(self, addresses: Sequence[str]) -> None:
        """Use a new PS set from now on (the old channels are closed)."""
        old, old_pool = self._clients, self._pool
        self.addresses = list(addresses)
        self._clients = [wire.Client(a, SERVICE, self.token, self.timeout_s) for a in addresses]
        n = len(addresses)
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="ps-client") if n > 1 else None
        for c in old:
            c.close()
        if old_pool is not None:
            old_pool.shutdown(wait=False)

    def close(self) -> None:
        if self._pusher is not None:
            self._pusher.shutdown(wait=True)
            self._pusher = None
        for c in self._clients:
            c.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._clients, self._pool = [], None

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        for i, c in enumerate(self._clients):
            try:
                c.wait_ready(timeout_s)
            except grpc.FutureTimeoutError:
                raise PSUnavailable(
                    f"PS {i} at {c.address} did not become ready within {timeout_s} s",
                    index=i,
                    address=c.address,
                ) from None

    def _call(
        self, index: int, method: str, fields: Mapping[str, Any], arrays: Mapping[str, Any]
    ) -> wire.Message:
        c = self._clients[index]
        try:
            return c.call(method, fields, arrays)
        except grpc.RpcError as e:
            raise _convert(e, index, c.address, method) from None

    def _fan_out(
        self, calls: Mapping[int, tuple[str, Mapping[str, Any], Mapping[str, Any]]]
    ) -> dict[int, wire.Message]:
        """One call per PS, in parallel; raises the first failure after all have finished."""
        if len(calls) == 1 or self._pool is None:
            return {i: self._call(i, *c) for i, c in calls.items()}
        futs = {i: self._pool.submit(self._call, i, *c) for i, c in calls.items()}
        out: dict[int, wire.Message] = {}
        errors: list[PSError] = []
        for i, f in futs.items():
            try:
                out[i] = f.result()
            except PSError as e:
                errors.append(e)
        if errors:
            raise errors[0]
        return out

    def _all(self, method: str, fields: Mapping[str, Any] | None = None) -> list[wire.Message]:
        res = self._fan_out({i: (method, fields or {}, {}) for i in range(self.num_ps)})
        return [res[i] for i in range(self.num_ps)]

    def _dim(self, table: str) -> int:
        try:
            return self.tables[table]
        except KeyError:
            raise PSError(
                f"unknown table {table!r}; this client knows {sorted(self.tables)}"
            ) from None

    # --- sparse ---

    def _route(self, table: str, uniq: I64) -> tuple[I64, list[int]]:
        """(order that groups ``uniq`` by owner, count per PS)."""
        n = self.num_ps
        if n == 1:
            return np.arange(uniq.size, dtype=np.int64), [int(uniq.size)]
        own = owner(table, uniq, n)
        order = np.argsort(own, kind="stable")
        return order, np.bincount(own, minlength=n).tolist()

    def pull_many(self, ids_by_table: Mapping[str, npt.ArrayLike]) -> dict[str, F32]:
        """Rows for each table's ids (any shape; the result adds a trailing dim axis).

        One call per PS for all tables together."""
        plans = []
        per_ps: list[dict[str, list[Any]]] = [
            {"tables": [], "dims": [], "counts": [], "ids": []} for _ in range(self.num_ps)
        ]
        for table, ids in ids_by_table.items():
            dim = self._dim(table)
            arr = np.asarray(ids, dtype=np.int64)
            uniq, inv = np.unique(arr.reshape(-1), return_inverse=True)
            order, counts = self._route(table, uniq)
            sorted_ids = uniq[order]
            start = 0
            for p, c in enumerate(counts):
                if c:
                    req = per_ps[p]
                    req["tables"].append(table)
                    req["dims"].append(dim)
                    req["counts"].append(c)
                    req["ids"].append(sorted_ids[start : start + c])
                start += c
            plans.append((table, dim, arr.shape, uniq.size, inv, order, counts))
        calls = {
            p: (
                "Pull",
                {"tables": r["tables"], "dims": r["dims"], "counts": r["counts"]},
                {"ids": np.concatenate(r["ids"])},
            )
            for p, r in enumerate(per_ps)
            if r["tables"]
        }
        replies = self._fan_out(calls) if calls else {}
        offsets = dict.fromkeys(replies, 0)
        out: dict[str, F32] = {}
        for table, dim, shape, n_uniq, inv, order, counts in plans:
            uniq_vals = np.empty((n_uniq, dim), np.float32)
            start = 0
            for p, c in enumerate(counts):
                if c:
                    flat = replies[p].arrays["values"]
                    o = offsets[p]
                    uniq_vals[order[start : start + c]] = flat[o : o + c * dim].reshape(c, dim)
                    offsets[p] = o + c * dim
                start += c
            out[table] = uniq_vals[inv].reshape(*shape, dim)
        return out

    def pull(self, table: str, ids: npt.ArrayLike) -> F32:
        return self.pull_many({table: ids})[table]

    def push_many(
        self,
        updates: Mapping[str, tuple[npt.ArrayLike, npt.ArrayLike]],
        lr: float | None = None,
    ) -> None:
        """Apply gradients: ``{table: (ids, grads[len(ids), dim])}``; duplicates are summed here.

        One call per PS for all tables together; ``lr`` None uses the PS's own."""
        per_ps: list[dict[str, list[Any]]] = [
            {"tables": [], "dims": [], "counts": [], "ids": [], "grads": []}
            for _ in range(self.num_ps)
        ]
        for table, (ids, grads) in updates.items():
            dim = self._dim(table)
            try:
                uniq, g = aggregate(ids, grads, dim)
            except ValueError as e:
                raise PSError(f"push to {table!r}: {e}") from None
            order, counts = self._route(table, uniq)
            if self.num_ps > 1:
                uniq, g = uniq[order], g[order]
            start = 0
            for p, c in enumerate(counts):
                if c:
                    req = per_ps[p]
                    req["tables"].append(table)
                    req["dims"].append(dim)
                    req["counts"].append(c)
                    req["ids"].append(uniq[start : start + c])
                    req["grads"].append(g[start : start + c].reshape(-1))
                start += c
        calls = {
            p: (
                "Push",
                {"tables": r["tables"], "dims": r["dims"], "counts": r["counts"], "lr": lr},
                {"ids": np.concatenate(r["ids"]), "grads": np.concatenate(r["grads"])},
            )
            for p, r in enumerate(per_ps)
            if r["tables"]
        }
        if calls:
            self._fan_out(calls)

    def push_many_async(
        self,
        updates: Mapping[str, tuple[npt.ArrayLike, npt.ArrayLike]],
        lr: float | None = None,
    ) -> Future[None]:
        """:meth:`push_many` in the background, in call order (one pusher thread), so a worker
        can overlap the push with its next step; the future raises what push_many would.

        The arrays must not be modified until the future is done."""
        if self._pusher is None:
            self._pusher = ThreadPoolExecutor(1, thread_name_prefix="ps-push")
        return self._pusher.submit(self.push_many, updates, lr)

    def push(
        self, table: str, ids: npt.ArrayLike, grads: npt.ArrayLike, lr: float | None = None
    ) -> None:
        self.push_many({table: (ids, grads)}, lr)

    # --- dense ---

    def _dense_route(self, names: Sequence[str]) -> dict[str, int]:
        if self._dense_names is None:
            raise PSError(
                "dense parameters are unknown to this client: call init_dense or pull_dense first"
            )
        owners = dense_owners(self._dense_names, self.num_ps)
        unknown = [n for n in names if n not in owners]
        if unknown:
            raise PSError(f"unknown dense parameters {unknown}; known: {self._dense_names}")
        return owners

    def _by_owner(self, values: Mapping[str, T]) -> dict[int, dict[str, T]]:
        owners = self._dense_route(list(values))
        grouped: dict[int, dict[str, T]] = {}
        for name, v in values.items():
            grouped.setdefault(owners[name], {})[name] = v
        return grouped

    def init_dense(self, params: Mapping[str, npt.ArrayLike]) -> list[str]:
        """Offer the initial dense parameters (all of them); the first writer on each PS wins.

        Returns the names this call set. Follow with :meth:`pull_dense` to get the winners."""
        self._dense_names = sorted(params)
        grouped = self._by_owner(params)
        res = self._fan_out({p: ("InitDense", {}, arrs) for p, arrs in grouped.items()})
        return sorted(n for m in res.values() for n in m["created"])

    def pull_dense(self) -> dict[str, F32]:
        """Every dense parameter, from every PS (also teaches this client their names);
        :attr:`dense_versions` says which version of each PS's values this read."""
        out: dict[str, F32] = {}
        versions: dict[int, tuple[int, int]] = {}
        for p, m in enumerate(self._all("PullDense")):
            out.update(m.arrays)
            v = _version(m.get("dense_version"))
            if v is not None:
                versions[p] = v
        self._dense_names = sorted(out)
        self.dense_versions = versions
        return out

    def push_dense(
        self,
        grads: Mapping[str, npt.ArrayLike],
        lr: float | None = None,
        dense_read: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        """Apply dense gradients; ``dense_read`` (per PS, as :attr:`dense_versions` gave it)
        says which values they were computed on, so a PS scales a stale one's lr."""
        grouped = self._by_owner(grads)
        calls: dict[int, tuple[str, Mapping[str, Any], Mapping[str, Any]]] = {}
        for p, g in grouped.items():
            fields: dict[str, Any] = {"lr": lr}
            if dense_read and p in dense_read:
                fields["dense_read"] = list(dense_read[p])
            calls[p] = ("PushDense", fields, g)
        self._fan_out(calls)

    # --- one round trip per PS per step ---

    def plan(self, ids: npt.ArrayLike, names: Sequence[str]) -> StepPlan:
        """The :class:`StepPlan` of a batch's PS ids ``int64 [n, F]`` (column f: table
        ``names[f]``; every table of one dim)."""
        arr = np.asarray(ids, dtype=np.int64)
        if arr.ndim != 2 or arr.shape[1] != len(names):
            raise PSError(f"step ids must be [n, {len(names)}] for tables {list(names)}")
        dims = {self._dim(t) for t in names}
        if len(dims) != 1:
            raise PSError(f"one step's tables must share one dim; got {sorted(dims)}")
        key = tuple(names)
        salts = self._salts.get(key)
        if salts is None:
            salts = self._salts[key] = np.array([table_salt(t) for t in names], np.uint64)
        return _plan(arr, names, dims.pop(), salts, self.num_ps)

    def _reroute(self, plan: StepPlan, grads: F32 | None) -> tuple[StepPlan, F32 | None]:
        """Lay ``plan`` (in place) and its gradients out for this client's PS count: the same
        (table, id) rows, routed to the PS that own them now."""
        f = len(plan.names)
        old_ps = len(plan.starts) - 1
        cols = np.concatenate(
            [np.full(int(plan.counts[q][t]), t, np.int64) for q in range(old_ps) for t in range(f)]
            or [np.empty(0, np.int64)]
        )
        key = tuple(plan.names)
        salts = self._salts.get(key)
        if salts is None:
            salts = self._salts[key] = np.array([table_salt(t) for t in plan.names], np.uint64)
        if self.num_ps == 1:
            own = np.zeros(plan.uniq.size, np.int64)
        else:
            own = (splitmix64(as_uint64(plan.uniq) ^ salts[cols]) % np.uint64(self.num_ps)).astype(
                np.int64
            )
        group = own * f + cols
        perm = np.argsort(group, kind="stable")
        counts = np.bincount(group, minlength=self.num_ps * f).reshape(self.num_ps, f)
        starts = [0, *np.cumsum(counts.sum(axis=1)).tolist()]
        pos = np.empty(plan.uniq.size, np.int64)
        pos[perm] = np.arange(plan.uniq.size)
        # in place: whoever holds this plan (the worker's step) sees the new layout
        plan.uniq, plan.counts, plan.starts = plan.uniq[perm], counts, starts
        plan.inverse, plan.rows_hint = pos[plan.inverse], {}
        if grads is not None:
            grads[:] = grads[perm]  # in place too: a retry of this push reads the same array
        return plan, grads

    def exchange(
        self,
        ex: Exchange,
        opt: Mapping[str, Any],
        transfer: str = "fp32",
        out: F32 | None = None,
    ) -> tuple[F32 | None, dict[str, F32]]:
        """Send one step (:class:`Exchange`) to every PS it concerns, in parallel, one call
        each: the PS applies the pushes, then reads. Returns the pulled rows
        ``[pull_plan.size, dim]`` (into ``out`` when given and large enough) and the dense
        parameters (when asked). ``opt`` is ``{"opt": name, "lr": lr}``; ``transfer`` the
        precision of rows and gradients on the wire (fp32, bf16, fp16).

        The dense gradients go with ``ex.dense_read`` (the version of the values they were
        computed on); when the dense parameters are read, ``ex.dense_versions`` gets theirs."""
        calls: dict[int, tuple[str, Mapping[str, Any], Mapping[str, Any]]] = {}
        dense_by_ps = self._by_owner(ex.dense_grads) if ex.dense_grads else {}
        dense_ps = range(self.num_ps) if ex.want_dense else ()
        if ex.want_dense and self._dense_names is None:
            raise PSError("dense parameters are unknown to this client: call pull_dense first")
        stale = self.num_ps + 1
        if ex.push_plan is not None and ex.grads is not None and len(ex.push_plan.starts) != stale:
            # computed before the PS set changed size: route its gradients anew
            ex.push_plan, ex.grads = self._reroute(ex.push_plan, ex.grads)
        if ex.pull_plan is not None and len(ex.pull_plan.starts) != stale:
            ex.pull_plan, _ = self._reroute(ex.pull_plan, None)
        for p in range(self.num_ps):
            fields: dict[str, Any] = {**opt, "transfer": transfer}
            arrays: dict[str, Any] = {}
            if ex.push_plan is not None and ex.grads is not None:
                plan = ex.push_plan
                lo, hi = plan.starts[p], plan.starts[p + 1]
                if hi > lo:
                    fields["push_tables"] = plan.names
                    fields["push_dims"] = [plan.dim] * len(plan.names)
                    fields["push_counts"] = plan.counts[p].tolist()
                    arrays["push_ids"] = plan.uniq[lo:hi]
                    arrays["push_grads"] = wire.encode_float(ex.grads[lo:hi], transfer)
                    hint = plan.rows_hint.get(p)
                    if hint is not None:
                        fields["push_rows_token"] = hint[0]
                        arrays["push_rows"] = hint[1]
            if ex.pull_plan is not None:
                plan = ex.pull_plan
                lo, hi = plan.starts[p], plan.starts[p + 1]
                if hi > lo:
                    fields["tables"] = plan.names
                    fields["dims"] = [plan.dim] * len(plan.names)
                    fields["counts"] = plan.counts[p].tolist()
                    arrays["ids"] = plan.uniq[lo:hi]
            for name, g in dense_by_ps.get(p, {}).items():
                arrays[DENSE_GRAD + name] = g
            if p in dense_by_ps and ex.dense_read and p in ex.dense_read:
                fields["dense_read"] = list(ex.dense_read[p])
            if p in dense_ps:
                fields["want_dense"] = True
            if len(arrays) or fields.get("want_dense"):
                calls[p] = ("Step", fields, arrays)
        replies = self._fan_out(calls) if calls else {}
        rows: F32 | None = None
        if ex.pull_plan is not None:
            plan = ex.pull_plan
            if out is not None and out.shape[0] >= plan.size and out.shape[1] == plan.dim:
                rows = out[: plan.size]
            else:
                rows = np.empty((plan.size, plan.dim), np.float32)
            for p, m in replies.items():
                lo, hi = plan.starts[p], plan.starts[p + 1]
                if hi > lo:
                    vals = wire.as_float32(m, "values")
                    if vals is None or vals.size != (hi - lo) * plan.dim:
                        raise PSError(f"PS {p} returned the wrong number of rows for a step")
                    rows[lo:hi] = vals.reshape(hi - lo, plan.dim)
                    token, ps_rows = m.get("rows_token"), m.arrays.get("rows")
                    if token is not None and ps_rows is not None and ps_rows.size == hi - lo:
                        plan.rows_hint[p] = (int(token), ps_rows)
        dense: dict[str, F32] = {}
        if ex.want_dense:
            versions: dict[int, tuple[int, int]] = {}
            for p, m in replies.items():
                for k, v in m.arrays.items():
                    if k.startswith(DENSE_VALUE):
                        dense[k[len(DENSE_VALUE) :]] = v
                ver = _version(m.get("dense_version"))
                if ver is not None:
                    versions[p] = ver
            ex.dense_versions = versions
        return rows, dense

    # --- control ---

    def stats(self) -> list[dict[str, Any]]:
        return [m.fields for m in self._all("Stats")]

    def ping(self) -> list[dict[str, Any]]:
        return [m.fields for m in self._all("Ping")]

    def checkpoint(self, step: int | None = None) -> list[dict[str, Any]]:
        """Ask every PS to checkpoint now; one ``{path, step, skipped}`` per PS."""
        return [m.fields for m in self._all("Checkpoint", {"step": step})]


# --- one round trip per PS per step -----------------------------------------------------------


@dataclass
class StepPlan:
    """Where one batch's ids go, computed once on the worker (vectorised over all tables).

    Every (table, id) of the batch appears once in ``uniq`` (duplicates removed here), laid out
    PS by PS and, within a PS, table by table, so the rows a PS returns fill one contiguous
    slice ``[starts[p], starts[p+1])`` of the step's ``[len(uniq), dim]`` row buffer and the
    gradients it gets back are a slice of that buffer's gradient. ``inverse[n, F]`` gives each
    sample's row in that buffer."""

    names: list[str]
    dim: int
    uniq: I64  # ids, PS-major then table-major, sorted within a (PS, table) group
    counts: npt.NDArray[np.int64]  # [num_ps, F]
    starts: list[int]  # per PS, num_ps + 1 offsets into uniq
    inverse: I64  # [n, F]
    # per PS: (arena token, arena rows of this PS's ids) as its reply to the pull said, so
    # the push of this batch's gradients can skip the PS's id lookups
    rows_hint: dict[int, tuple[int, I64]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.uniq.size)

    def part(self, p: int) -> tuple[I64, list[int]]:
        """PS ``p``'s ids and its count per table."""
        return self.uniq[self.starts[p] : self.starts[p + 1]], self.counts[p].tolist()


class Exchange:
    """What one step sends: the gradients of a computed step (``push_plan`` + ``grads``
    ``[push_plan.size, dim]`` + dense gradients by name, computed on the dense values of
    version ``dense_read``, per PS) and/or the ids of a coming batch to read (``pull_plan``),
    with the dense parameters if ``want_dense`` (their versions land in ``dense_versions``)."""

    __slots__ = (
        "dense_grads",
        "dense_read",
        "dense_versions",
        "grads",
        "pull_plan",
        "push_plan",
        "want_dense",
    )

    def __init__(
        self,
        push_plan: StepPlan | None = None,
        grads: F32 | None = None,
        dense_grads: Mapping[str, npt.NDArray[np.float32]] | None = None,
        pull_plan: StepPlan | None = None,
        want_dense: bool = False,
        dense_read: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        self.push_plan = push_plan
        self.grads = grads
        self.dense_grads = dense_grads or {}
        self.pull_plan = pull_plan
        self.want_dense = want_dense
        self.dense_read = dict(dense_read) if dense_read else {}
        self.dense_versions: dict[int, tuple[int, int]] = {}


def _version(raw: Any) -> tuple[int, int] | None:
    """A reply's ``dense_version`` as (token, updates); None if absent (an older PS)."""
    if isinstance(raw, list | tuple) and len(raw) == 2:
        return int(raw[0]), int(raw[1])
    return None


def _plan(
    ids: I64, names: Sequence[str], dim: int, salts: npt.NDArray[np.uint64], num_ps: int
) -> StepPlan:
    n, f = ids.shape
    order = np.argsort(ids, axis=0, kind="stable")
    s = np.take_along_axis(ids, order, axis=0)
    first = np.ones((n, f), dtype=bool)
    if n > 1:
        np.not_equal(s[1:], s[:-1], out=first[1:])
    rank = np.cumsum(first, axis=0) - 1  # rank of each sorted id among its column's uniques
    per_col = rank[-1] + 1 if n else np.zeros(f, np.int64)
    col_start = np.zeros(f, np.int64)
    np.cumsum(per_col[:-1], out=col_start[1:])
    inv = np.empty((n, f), np.int64)
    np.put_along_axis(inv, order, rank + col_start[None, :], axis=0)
    uniq = s.T[first.T]  # column-major: table by table, each sorted
    if num_ps == 1:
        return StepPlan(list(names), dim, uniq, per_col[None, :], [0, uniq.size], inv)
    col = np.repeat(np.arange(f), per_col)
    own = (splitmix64(as_uint64(uniq) ^ salts[col]) % np.uint64(num_ps)).astype(np.int64)
    group = own * f + col
    perm = np.argsort(group, kind="stable")
    pos = np.empty(uniq.size, np.int64)
    pos[perm] = np.arange(uniq.size)
    counts = np.bincount(group, minlength=num_ps * f).reshape(num_ps, f)
    starts = [0, *np.cumsum(counts.sum(axis=1)).tolist()]
    return StepPlan(list(names), dim, uniq[perm], counts, starts, pos[inv])
