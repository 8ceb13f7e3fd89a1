"""A node's side of the ``dlrover.Master`` service: typed calls that survive a master restart.

Every call is retried with exponential backoff while the master is unreachable (UNAVAILABLE,
DEADLINE_EXCEEDED), on a fresh channel each time, for up to ``retry_for_s`` (60 s by default:
a master restart takes a few seconds to ~30 s). Retrying is safe for every method: Register
and Heartbeat are idempotent, GetShard sends the shards this client holds (so the master
re-delivers a shard whose reply was lost instead of handing out a new one), and ShardDone
sends the take's ``attempt`` (so a retried report is not counted as a duplicate).

When a reply carries a ``master_id`` other than the one this client registered with (the
master restarted), or the master says it does not know this node, the client registers again
with the same identity, keeping its doing shards.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from dlrover_core.errors import DLRoverError, ErrorKind
from dlrover_core.runtime.service import MASTER_SERVICE
from dlrover_core.runtime.shards import Shard
from dlrover_core.runtime.state import ACTION_REGISTER
from dlrover_core.runtime.wire import Client, Message
from dlrover_core.types import Role

log = logging.getLogger(__name__)

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class MasterUnavailableError(DLRoverError):
    """The master did not answer within the retry window."""

    kind = ErrorKind.UNAVAILABLE


class MasterRejectedError(DLRoverError):
    """The master answered with an error (wrong token, superseded node, bad request)."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code

    @property
    def superseded(self) -> bool:
        """A newer incarnation of this node (or PS set) exists: this process should exit."""
        from dlrover_core.runtime.state import SUPERSEDED_CODE

        return self.code is SUPERSEDED_CODE


@dataclass(frozen=True)
class Registration:
    ps_addresses: tuple[str, ...]
    ps_version: int
    config: dict[str, Any] = field(default_factory=dict)
    master_id: str = ""
    done_seq: int | None = None


@dataclass(frozen=True)
class HeartbeatReply:
    action: str  # "", "stop" or "register" (the client re-registers by itself)
    ps_addresses: tuple[str, ...]
    ps_version: int
    done_seq: int | None = None

    @property
    def stop(self) -> bool:
        return self.action == "stop"


@dataclass(frozen=True)
class ShardReply:
    """Exactly one of: a ``shard`` to train, ``wait`` (others still hold shards: ask again
    soon), ``done`` (nothing left; ``failed`` shards gave up), ``stop`` (leave gracefully)."""

    shard: Shard | None = None
    wait: bool = False
    done: bool = False
    stop: bool = False
    failed: int = 0


class MasterClient:
    """Typed calls to the job master at ``address`` with the job ``token``. Thread-safe:
    calls are serialised (a heartbeat thread and a training loop may share one client)."""

    def __init__(
        self,
        address: str,
        token: str,
        *,
        retry_for_s: float = 60.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
        call_timeout_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self._token = token
        self.retry_for_s = retry_for_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.call_timeout_s = call_timeout_s
        self._sleep = sleep
        self._monotonic = monotonic
        self._lock = threading.RLock()
        self._client = Client(address, MASTER_SERVICE, token, timeout_s=call_timeout_s)
        self._last_answer = monotonic()
        self._identity: tuple[Role, int, int | None, int] | None = None
        self._extra: dict[str, Any] = {}
        self.master_id: str | None = None
        self.registrations = 0  # how many times this client registered (restarts seen + 1)
        self.held: dict[int, int] = {}  # shard id -> attempt, shards taken and not yet reported

    # --- plumbing -----------------------------------------------------------------------------

    def _reconnect(self) -> None:
        self._client.close()
        self._client = Client(self.address, MASTER_SERVICE, self._token, self.call_timeout_s)

    def _call(self, method: str, fields: Mapping[str, Any]) -> Message:
        with self._lock:
            msg = self._call_retrying(method, fields)
            mid = msg.get("master_id")
            if (
                method != "Register"
                and self._identity is not None
                and mid is not None
                and mid != self.master_id
            ):
                self._register()  # the master restarted: say hello to the new one
            return msg

    def _call_retrying(self, method: str, fields: Mapping[str, Any]) -> Message:
        # unreachable for retry_for_s since the last answer, whichever call waits (a heartbeat
        # thread and a training loop share the window: a node leaves within it, not twice it)
        now = self._monotonic()
        deadline = max(self._last_answer + self.retry_for_s, now + min(1.0, self.retry_for_s))
        delay = self.backoff_initial_s
        reregistered = False
        while True:
            try:
                msg = self._client.call(method, fields)
                self._last_answer = self._monotonic()
                return msg
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
                details = e.details() if hasattr(e, "details") else str(e)
                if code in RETRYABLE:
                    if self._monotonic() + delay > deadline:
                        raise MasterUnavailableError(
                            f"the master at {self.address} did not answer {method} for "
                            f"{self.retry_for_s:g} s ({code.name}: {details}); check that the "
                            "master process runs, or raise retry_for_s"
                        ) from e
                    self._sleep(delay)
                    delay = min(delay * 2, self.backoff_max_s)
                    self._reconnect()
                    continue
                if (
                    code == grpc.StatusCode.NOT_FOUND
                    and method != "Register"
                    and self._identity is not None
                    and not reregistered
                ):
                    reregistered = True
                    self._register()
                    continue
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    raise MasterRejectedError(
                        f"the master at {self.address} refused the job token: pass the token "
                        "from this job's run directory",
                        code,
                    ) from e
                raise MasterRejectedError(
                    f"the master refused {method} ({code.name}): {details}", code
                ) from e

    def _register(self) -> Registration:
        role, node_id, pid, incarnation = self._need_identity()
        msg = self._call_retrying(
            "Register",
            {
                "role": role.value,
                "node_id": node_id,
                "pid": pid,
                "incarnation": incarnation,
                **self._extra,
            },
        )
        self.master_id = msg.get("master_id")
        self.registrations += 1
        return Registration(
            tuple(msg.get("ps_addresses", ())),
            int(msg.get("ps_version", 0)),
            dict(msg.get("config", {})),
            str(self.master_id or ""),
            None if msg.get("done_seq") is None else int(msg.get("done_seq")),
        )

    def _need_identity(self) -> tuple[Role, int, int | None, int]:
        if self._identity is None:
            raise DLRoverError("call register() before any other master call")
        return self._identity

    # --- the RPCs -----------------------------------------------------------------------------

    def register(
        self,
        role: Role | str,
        node_id: int,
        pid: int | None = None,
        incarnation: int = 0,
        **extra: Any,
    ) -> Registration:
        """Register this node; later calls use this identity (and re-register with it).
        ``extra``: e.g. a PS's ``address``, ``generation`` and ``restored_seq``."""
        with self._lock:
            self._identity = (Role(role), int(node_id), pid, int(incarnation))
            self._extra = {k: v for k, v in extra.items() if v is not None}
            return self._register()

    def heartbeat(
        self,
        cpu_percent: float = 0.0,
        rss_mib: float = 0.0,
        step: int = 0,
        samples_per_s: float = 0.0,
        **extra: float,
    ) -> HeartbeatReply:
        """Report liveness and the latest numbers (``extra``: e.g. ``rows`` for a PS,
        ``global_step``)."""
        with self._lock:
            role, node_id, pid, incarnation = self._need_identity()
            fields = {
                "role": role.value,
                "node_id": node_id,
                "pid": pid,
                "incarnation": incarnation,
                "cpu_percent": cpu_percent,
                "rss_mib": rss_mib,
                "step": step,
                "samples_per_s": samples_per_s,
                **extra,
            }
            msg = self._call("Heartbeat", fields)
            if msg.get("action") == ACTION_REGISTER:
                self._register()
                msg = self._call("Heartbeat", fields)
            return HeartbeatReply(
                str(msg.get("action", "")),
                tuple(msg.get("ps_addresses", ())),
                int(msg.get("ps_version", 0)),
                None if msg.get("done_seq") is None else int(msg.get("done_seq")),
            )

    def get_shard(self) -> ShardReply:
        """Take a shard (or learn to wait, that all is done, or to stop)."""
        with self._lock:
            _, node_id, _, incarnation = self._need_identity()
            msg = self._call(
                "GetShard",
                {"worker_id": node_id, "incarnation": incarnation, "held": sorted(self.held)},
            )
            if "shard_id" in msg.fields:
                shard = Shard.from_dict(msg.fields, node_id)
                self.held[shard.shard_id] = shard.attempt
                return ShardReply(shard=shard)
            return ShardReply(
                wait=bool(msg.get("wait", False)),
                done=bool(msg.get("done", False)),
                stop=bool(msg.get("stop", False)),
                failed=int(msg.get("failed", 0)),
            )

    def shard_done(self, shard_id: int, samples: int, loss: float | None = None) -> bool:
        """Report a finished shard; True if the master counted it (False: it was done before,
        the samples must not be counted again)."""
        with self._lock:
            _, node_id, _, incarnation = self._need_identity()
            fields: dict[str, Any] = {
                "worker_id": node_id,
                "incarnation": incarnation,
                "shard_id": shard_id,
                "samples": samples,
                "loss": loss,
            }
            if shard_id in self.held:
                fields["attempt"] = self.held[shard_id]
            msg = self._call("ShardDone", fields)
            self.held.pop(shard_id, None)
            return bool(msg.get("counted", False))

    def report_metrics(self, **fields: float) -> int:
        """A runtime sample (``step``, ``samples``, ``samples_per_s``, ``window_s``,
        ``global_step`` ...). Returns the master's global step."""
        with self._lock:
            role, node_id, _, _ = self._need_identity()
            msg = self._call("ReportMetrics", {"role": role.value, "node_id": node_id, **fields})
            return int(msg.get("global_step", 0))

    def report_event(
        self,
        role: Role | str,
        node_id: int,
        incarnation: int,
        event: str,
        said: str | None = None,
        *,
        timeout_s: float = 5.0,
    ) -> bool:
        """A fact about this node (``warm``, ``failed``, ``disk_full``; see
        ``node_record.EVENTS``), before or after it registered. Best effort: one try of at
        most ``timeout_s`` (a node about to exit does not wait out the retry window); False
        when it did not reach the master or was not recorded."""
        fields: dict[str, Any] = {"role": Role(role).value, "node_id": node_id,
                                  "incarnation": incarnation, "event": event}  # fmt: skip
        if said:
            fields["said"] = said
        client = Client(self.address, MASTER_SERVICE, self._token, timeout_s)
        try:
            return bool(client.call("ReportEvent", fields).get("recorded"))
        except Exception as e:  # best effort by contract: the exit code still tells
            log.debug("event %s not reported: %s", event, e)
            return False
        finally:
            client.close()

    def get_ps_set(self) -> tuple[tuple[str, ...], int]:
        msg = self._call("GetPSSet", {})
        return tuple(msg.get("ps_addresses", ())), int(msg.get("ps_version", 0))

    def status(self) -> dict[str, Any]:
        msg = self._call("Status", {})
        return dict(msg.fields)

    def close(self) -> None:
        with self._lock:
            self._client.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
