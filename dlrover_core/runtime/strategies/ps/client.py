"""The worker's side of the parameter servers: route, batch, call in parallel, reassemble.

Ids are de-duplicated on the client, split by :func:`.partition.owner`,
and every PS gets at most one call per step (:meth:`PSClient.pull_many` /
:meth:`PSClient.push_many` put all tables' ids into one message). Dense parameters are routed
round-robin over their sorted names (:func:`.partition.dense_owners`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from dlrover_core.errors import DLRoverError, ErrorKind
from dlrover_core.runtime import wire
from dlrover_core.runtime.strategies.ps.partition import dense_owners, owner
from dlrover_core.runtime.strategies.ps.server import SERVICE, aggregate

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
        self._pusher: ThreadPoolExecutor | None = None
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
        """Every dense parameter, from every PS (also teaches this client their names)."""
        out: dict[str, F32] = {}
        for m in self._all("PullDense"):
            out.update(m.arrays)
        self._dense_names = sorted(out)
        return out

    def push_dense(self, grads: Mapping[str, npt.ArrayLike], lr: float | None = None) -> None:
        grouped = self._by_owner(grads)
        self._fan_out({p: ("PushDense", {"lr": lr}, g) for p, g in grouped.items()})

    # --- control ---

    def stats(self) -> list[dict[str, Any]]:
        return [m.fields for m in self._all("Stats")]

    def ping(self) -> list[dict[str, Any]]:
        return [m.fields for m in self._all("Ping")]

    def checkpoint(self, step: int | None = None) -> list[dict[str, Any]]:
        """Ask every PS to checkpoint now; one ``{path, step, skipped}`` per PS."""
        return [m.fields for m in self._all("Checkpoint", {"step": step})]
