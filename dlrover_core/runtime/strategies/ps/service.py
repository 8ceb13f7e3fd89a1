"""The service of a PS: :class:`PSServer` serves a :class:`~.shard.PSShard` over the wire
protocol as service ``dlrover.PS``:

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

A *frozen* PS (a PS-set change is in progress) refuses every data call with UNAVAILABLE, so
workers hold their pushes and wait for the new set: no update is applied to a set whose final
checkpoint has been taken, and none is lost. Checkpoints carry a ``tag``: the master's shard
``done_seq`` they include (every shard done at or before it has its updates in the state).

Stale dense gradients (``dense_read``) and the dense warm-up (``warmup``): :mod:`.shard`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from dlrover_core.runtime import wire
from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps import optim
from dlrover_core.runtime.strategies.ps.shard import DEFAULT_LR, PSShard
from dlrover_core.runtime.strategies.ps.store import F32, I64, aggregate, as_f32

log = logging.getLogger("dlrover_rm.ps")

SERVICE = "dlrover.PS"


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
                grads = as_f32(flat, (-1, dim))
            else:
                gs = []
                for name, ids, g, d in push_parts:
                    try:
                        uniq, agg = aggregate(ids, g, d)
                    except ValueError as e:
                        raise _bad(str(e)) from e
                    pushes.append((name, uniq, d))
                    gs.append(agg)
                grads = as_f32(np.concatenate(gs), (-1, dim)) if gs else None
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
