"""The wire protocol of the runtime: gRPC without code generation.

A message is a JSON header plus named numpy arrays, packed as::

    [4-byte little-endian header length][header JSON (utf-8)][array bytes ...]

The header holds the message fields and, under ``"__arrays__"``, each array's name, dtype,
shape and byte range. Services are registered with ``grpc.method_handlers_generic_handler``;
every call carries the job's token in the ``x-dlrover-token`` metadata and a server refuses a
call without it (:class:`TokenInterceptor`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import struct
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from dlrover_core.units import bytes_from_mib

TOKEN_METADATA = "x-dlrover-token"
TOKEN_FILE = "token"
MAX_MESSAGE_BYTES = bytes_from_mib(512)
_LEN = struct.Struct("<I")

Arrays = dict[str, npt.NDArray[Any]]


log = logging.getLogger(__name__)


@dataclass
class Message:
    fields: dict[str, Any]
    arrays: Arrays

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def encode(
    fields: Mapping[str, Any] | None = None, arrays: Mapping[str, npt.ArrayLike] | None = None
) -> bytes:
    """One message: the header, then each array's bytes, copied once (straight from the
    array's buffer into the message; no per-array ``tobytes``)."""
    metas = []
    views: list[Any] = []
    offset = 0
    for name, a in (arrays or {}).items():
        arr = np.ascontiguousarray(a)
        nbytes = arr.nbytes
        metas.append(
            {
                "name": name,
                "dtype": arr.dtype.str,
                "shape": list(arr.shape),
                "offset": offset,
                "nbytes": nbytes,
            }
        )
        if nbytes:
            views.append(memoryview(arr.reshape(-1)).cast("B"))  # type: ignore[arg-type]
        offset += nbytes
    header = json.dumps({**(fields or {}), "__arrays__": metas}, separators=(",", ":")).encode()
    return b"".join([_LEN.pack(len(header)), header, *views])


# --- reduced-precision transfer -----------------------------------------------------------

TRANSFERS = ("fp32", "bf16", "fp16")


def encode_float(a: npt.NDArray[np.float32], transfer: str) -> npt.NDArray[Any]:
    """``a`` as sent in ``transfer`` precision: float32 as is, float16, or bfloat16 bit
    patterns (uint16: the top half of the float32, rounded to nearest even, as torch rounds)."""
    if transfer == "fp32":
        return a
    if transfer == "fp16":
        return np.asarray(a, dtype=np.float16)
    if transfer == "bf16":
        u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))  # to even
        return (rounded >> np.uint32(16)).astype(np.uint16)
    raise ValueError(f"unknown transfer precision {transfer!r}; use one of {list(TRANSFERS)}")


def decode_float(a: npt.NDArray[Any], transfer: str) -> npt.NDArray[np.float32]:
    """The float32 values of an array sent by :func:`encode_float` (a copy unless fp32)."""
    if a.dtype == np.float32:
        return a
    if a.dtype.kind == "f":
        return a.astype(np.float32)
    if a.dtype == np.uint16 and transfer == "bf16":
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    raise ValueError(f"cannot read a {a.dtype} array as float (transfer {transfer!r})")


def as_float32(msg: Message, name: str) -> npt.NDArray[np.float32] | None:
    """Array ``name`` of ``msg`` as float32, whatever precision the sender chose (the
    message's ``transfer`` field); None if absent."""
    a = msg.arrays.get(name)
    if a is None:
        return None
    return decode_float(a, str(msg.get("transfer") or "fp32"))


def decode(data: bytes) -> Message:
    if len(data) < _LEN.size:
        raise ValueError("truncated message")
    (n,) = _LEN.unpack_from(data, 0)
    header = json.loads(data[_LEN.size : _LEN.size + n])
    base = _LEN.size + n
    arrays: Arrays = {}
    view = memoryview(data)
    for m in header.pop("__arrays__", []):
        start = base + m["offset"]
        buf = view[start : start + m["nbytes"]]
        arrays[m["name"]] = np.frombuffer(buf, dtype=np.dtype(m["dtype"])).reshape(m["shape"])
    return Message(header, arrays)


# --- tokens ---------------------------------------------------------------------------------


def create_token(run_dir: str | os.PathLike[str]) -> str:
    """A random per-job token, stored in the run directory readable only by its owner."""
    p = Path(run_dir) / TOKEN_FILE
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        return p.read_text().strip()
    token = secrets.token_hex(32)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return token


def read_token(run_dir: str | os.PathLike[str]) -> str:
    return (Path(run_dir) / TOKEN_FILE).read_text().strip()


class TokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

        def deny(request: bytes, context: grpc.ServicerContext) -> bytes:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")
            return b""  # unreachable

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        md = dict(handler_call_details.invocation_metadata or ())
        if not secrets.compare_digest(str(md.get(TOKEN_METADATA, "")), self._token):
            return self._deny
        return continuation(handler_call_details)


# --- servers and clients --------------------------------------------------------------------

Handler = Callable[[Message], tuple[dict[str, Any], Mapping[str, npt.ArrayLike]] | dict[str, Any]]

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),  # two servers on one port would split one job's calls
]


def _wrap(fn: Handler) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            msg = decode(request)
        except Exception as e:
            log.warning("malformed request body (%d bytes): %s", len(request), e)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request body: {e}")
        try:
            out = fn(msg)
        except RpcError as e:
            context.abort(e.code, e.message)
        if isinstance(out, tuple):
            return encode(out[0], out[1])
        return encode(out)

    return call


class RpcError(Exception):
    """Raised by a handler to fail the call with a gRPC status and a clear message."""

    def __init__(
        self, message: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def serve(
    service: str,
    handlers: Mapping[str, Handler],
    token: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_workers: int = 8,
) -> tuple[grpc.Server, int]:
    """Start a gRPC server for ``service`` with ``handlers``; returns (server, bound port).

    Binds to loopback unless told otherwise."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        interceptors=[TokenInterceptor(token)],
        options=_OPTIONS,
    )
    methods = {
        name: grpc.unary_unary_rpc_method_handler(_wrap(fn)) for name, fn in handlers.items()
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, methods)])
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port} for {service}")
    server.start()
    return server, bound


class Client:
    """Calls ``service`` methods at ``address`` with the job token."""

    def __init__(self, address: str, service: str, token: str, timeout_s: float = 30.0) -> None:
        self.address = address
        self.service = service
        self._md = ((TOKEN_METADATA, token),)
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address, options=_OPTIONS)
        self._stubs: dict[str, Any] = {}

    def call(
        self,
        method: str,
        fields: Mapping[str, Any] | None = None,
        arrays: Mapping[str, npt.ArrayLike] | None = None,
        timeout_s: float | None = None,
    ) -> Message:
        stub = self._stubs.get(method)
        if stub is None:
            stub = self._stubs[method] = self._channel.unary_unary(
                f"/{self.service}/{method}",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
        data = stub(encode(fields, arrays), metadata=self._md, timeout=timeout_s or self.timeout_s)
        return decode(data)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        grpc.channel_ready_future(self._channel).result(timeout=timeout_s)

    def close(self) -> None:
        self._channel.close()
