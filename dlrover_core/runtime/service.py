"""The job master's gRPC service ``dlrover.Master`` over :class:`~.state.MasterState`.

RPCs (fields in, fields out; every reply carries ``master_id``). A malformed body (a missing or
mistyped field) is answered INVALID_ARGUMENT with one line naming the call and the field, and
logged on the server; never a traceback.

``Register(role, node_id, pid, incarnation, [address, generation, restored_seq])`` ->
    ``{ok, ps_addresses, ps_version, config, done_seq}``. ``incarnation`` counts launches of
    this node (0 = first); an older one than the master's is refused (ABORTED:
    superseded). A PS sends the ``address`` it serves on, its set ``generation`` and the
    ``restored_seq`` tag of the state it restored (-1: empty).
``Heartbeat(role, node_id, incarnation, cpu_percent, rss_mib, step, samples_per_s, [rows,
    global_step, ...any numbers])`` -> ``{ps_version, ps_addresses, done_seq, action}``.
    ``action``: ``"stop"`` (leave gracefully: the master asked, or the node was superseded or
    marked finished), ``"register"`` (this master does not know the node), or ``""``.
``GetShard(worker_id, incarnation, [held])`` -> ``{shard_id, epoch, start, end, attempt}``, or
    ``{wait: true}``, ``{done: true, failed}``, ``{stop: true}``; a superseded incarnation is
    refused (ABORTED).
``ShardDone(worker_id, incarnation, shard_id, samples, loss, [attempt])`` -> ``{ok, counted}``;
    a superseded incarnation is refused.
``ReportMetrics(role, node_id, [global_step, step, samples, samples_per_s, window_s, ...])``
    -> ``{ok, global_step}``
``ReportEvent(role, node_id, incarnation, event, [said])`` -> ``{ok, recorded}``: a node's fact
    about itself (``warm``, ``failed`` with its one-line reason, ``disk_full``); one of a
    superseded incarnation is not recorded.
``GetPSSet()`` -> ``{ps_addresses, ps_version}``
``Status()`` -> the JSON of :meth:`MasterState.status`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from dlrover_core.errors import DLRoverError
from dlrover_core.runtime.state import MasterState
from dlrover_core.runtime.wire import Handler, Message, RpcError, serve
from dlrover_core.types import Role

log = logging.getLogger(__name__)

MASTER_SERVICE = "dlrover.Master"

_IDENTITY_FIELDS = frozenset({"role", "node_id", "worker_id"})


def _role(msg: Message) -> Role:
    try:
        return Role(msg["role"])
    except (KeyError, ValueError) as e:
        raise RpcError(
            f"role={msg.get('role')!r}: send one of {[r.value for r in Role]}",
            grpc.StatusCode.INVALID_ARGUMENT,
        ) from e


def _int(msg: Message, name: str, default: int | None = None) -> int:
    v = msg.get(name, default)
    if v is None or isinstance(v, bool):
        raise RpcError(f"field {name!r} (an integer) is missing", grpc.StatusCode.INVALID_ARGUMENT)
    try:
        return int(v)
    except (TypeError, ValueError) as e:
        raise RpcError(
            f"field {name}={v!r} must be an integer", grpc.StatusCode.INVALID_ARGUMENT
        ) from e


def _numbers(msg: Message, skip: frozenset[str] = _IDENTITY_FIELDS) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in msg.fields.items()
        if k not in skip and isinstance(v, int | float) and not isinstance(v, bool)
    }


def master_handlers(state: MasterState) -> dict[str, Handler]:
    """The ``dlrover.Master`` methods over ``state``."""

    def reply(fields: dict[str, Any]) -> dict[str, Any]:
        return {**fields, "master_id": state.master_id}

    def guarded(fn: Callable[[Message], dict[str, Any]]) -> Handler:
        def call(msg: Message) -> dict[str, Any]:
            try:
                return reply(fn(msg))
            except RpcError as e:
                if e.code is grpc.StatusCode.INVALID_ARGUMENT:
                    log.warning("%s: bad request: %s", name_of(fn), e)
                raise
            except DLRoverError as e:
                log.warning("%s: refused: %s", name_of(fn), e)
                raise RpcError(str(e), grpc.StatusCode.INVALID_ARGUMENT) from e
            except (TypeError, ValueError, KeyError) as e:
                log.warning("%s: malformed request: %s", name_of(fn), e)
                raise RpcError(
                    f"{name_of(fn)}: malformed request ({type(e).__name__}: {e})",
                    grpc.StatusCode.INVALID_ARGUMENT,
                ) from e

        return call

    def register(msg: Message) -> dict[str, Any]:
        pid, gen, seq = msg.get("pid"), msg.get("generation"), msg.get("restored_seq")
        address = msg.get("address")
        return state.register(
            _role(msg),
            _int(msg, "node_id"),
            None if pid is None else int(pid),
            _int(msg, "incarnation", 0),
            address=None if address is None else str(address),
            generation=None if gen is None else int(gen),
            restored_seq=None if seq is None else int(seq),
        )

    def heartbeat(msg: Message) -> dict[str, Any]:
        inc = msg.get("incarnation")
        stats = _numbers(msg, _IDENTITY_FIELDS | {"pid", "incarnation", "generation"})
        return state.heartbeat(
            _role(msg), _int(msg, "node_id"), stats, None if inc is None else int(inc)
        )

    def get_shard(msg: Message) -> dict[str, Any]:
        held, inc = msg.get("held"), msg.get("incarnation")
        return state.get_shard(
            _int(msg, "worker_id"),
            None if held is None else [int(h) for h in held],
            None if inc is None else int(inc),
        )

    def shard_done(msg: Message) -> dict[str, Any]:
        samples, loss, attempt = msg.get("samples"), msg.get("loss"), msg.get("attempt")
        inc = msg.get("incarnation")
        counted = state.shard_done(
            _int(msg, "worker_id"),
            _int(msg, "shard_id"),
            None if samples is None else int(samples),
            None if loss is None else float(loss),
            None if attempt is None else int(attempt),
            None if inc is None else int(inc),
        )
        return {"ok": True, "counted": counted}

    def report_metrics(msg: Message) -> dict[str, Any]:
        gs = state.report_metrics(_role(msg), _int(msg, "node_id"), _numbers(msg))
        return {"ok": True, "global_step": gs}

    def report_event(msg: Message) -> dict[str, Any]:
        said = msg.get("said")
        recorded = state.record_event(
            _role(msg),
            _int(msg, "node_id"),
            _int(msg, "incarnation", 0),
            str(msg.get("event")),
            None if said is None else str(said),
        )
        return {"ok": True, "recorded": recorded}

    def get_ps_set(msg: Message) -> dict[str, Any]:
        addresses, version = state.ps_set()
        return {"ps_addresses": addresses, "ps_version": version}

    def status(msg: Message) -> dict[str, Any]:
        return state.status()

    fns: dict[str, Callable[[Message], dict[str, Any]]] = {
        "Register": register,
        "Heartbeat": heartbeat,
        "GetShard": get_shard,
        "ShardDone": shard_done,
        "ReportMetrics": report_metrics,
        "ReportEvent": report_event,
        "GetPSSet": get_ps_set,
        "Status": status,
    }
    names = {fn: name for name, fn in fns.items()}

    def name_of(fn: Callable[[Message], dict[str, Any]]) -> str:
        return names.get(fn, "call")

    return {name: guarded(fn) for name, fn in fns.items()}


def serve_master(
    state: MasterState,
    token: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_workers: int = 16,
) -> tuple[grpc.Server, int]:
    """Start the ``dlrover.Master`` service over ``state``; returns (server, port)."""
    return serve(MASTER_SERVICE, master_handlers(state), token, host, port, max_workers)
