"""The master's control calls to a PS set: freeze/unfreeze and tagged checkpoints.

Bounded calls (a few seconds): the controller uses them when it changes the PS set, never for
data. Any PS that does not answer raises :class:`~dlrover_core.errors.DLRoverError` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from dlrover_core.errors import DLRoverError, ErrorKind
from dlrover_core.runtime import wire
from dlrover_core.runtime.strategies.ps.service import SERVICE


class PSControlError(DLRoverError):
    kind = ErrorKind.UNAVAILABLE


def _call_all(
    addresses: Sequence[str], token: str, method: str, fields: dict[str, object], timeout_s: float
) -> list[wire.Message]:
    out = []
    for i, addr in enumerate(addresses):
        c = wire.Client(addr, SERVICE, token, timeout_s=timeout_s)
        try:
            out.append(c.call(method, fields))
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            raise PSControlError(
                f"PS {i} at {addr} did not answer {method} ({code.name if code else e})"
            ) from None
        finally:
            c.close()
    return out


def freeze_set(addresses: Sequence[str], token: str, frozen: bool, timeout_s: float = 5.0) -> None:
    """Freeze (refuse data calls) or unfreeze every PS of the set."""
    _call_all(addresses, token, "Freeze", {"frozen": frozen}, timeout_s)


def checkpoint_set(
    addresses: Sequence[str], token: str, tag: int, timeout_s: float = 30.0
) -> list[int]:
    """Checkpoint every PS tagged ``tag`` (the shard done_seq it includes); their tags."""
    replies = _call_all(addresses, token, "Checkpoint", {"tag": int(tag)}, timeout_s)
    return [int(r.get("tag", tag)) for r in replies]
