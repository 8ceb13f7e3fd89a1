"""Which parameter server owns what: a pure function of (table, id, number of PS).

Embedding rows are spread by a well-mixed hash (splitmix64 of the id xor a per-table salt)
modulo the number of PS, so hot ids of one table do not pile onto one PS and two tables with
the same ids are spread independently. Dense parameters go round-robin by their index in the
sorted list of dense parameter names.

Re-sharding to a different number of PS is just re-evaluating :func:`owner` with the new count:
there is no routing table to migrate.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import numpy.typing as npt

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


def splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The splitmix64 finaliser, vectorised; uint64 arithmetic wraps (as intended)."""
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def table_salt(table: int | str) -> np.uint64:
    """A stable 64-bit salt for a table, given by name (hashed) or by index."""
    if isinstance(table, str):
        digest = hashlib.blake2b(table.encode("utf-8"), digest_size=8).digest()
        return np.uint64(int.from_bytes(digest, "little"))
    return splitmix64(np.array([table], dtype=np.uint64))[0]


def as_uint64(ids: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """Ids as uint64 bit patterns (negative int64 ids keep their bits)."""
    arr = np.asarray(ids)
    if arr.dtype == np.uint64:
        return arr
    return arr.astype(np.int64, copy=False).view(np.uint64)


def hash_ids(table: int | str, ids: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    return splitmix64(as_uint64(ids) ^ table_salt(table))


def owner(table: int | str, ids: npt.ArrayLike, num_ps: int) -> npt.NDArray[np.int64]:
    """The index of the PS that owns each id of ``table`` among ``num_ps`` PS.

    ``table`` is the table's name (what the runtime uses) or an integer index; the two give
    different placements, so one job must use one kind throughout."""
    if num_ps < 1:
        raise ValueError(f"num_ps must be at least 1, got {num_ps}")
    if num_ps == 1:
        return np.zeros(np.shape(ids), dtype=np.int64)
    return (hash_ids(table, ids) % np.uint64(num_ps)).astype(np.int64)


def dense_owner(param_index: int, num_ps: int) -> int:
    """Round-robin placement of the dense parameter at ``param_index`` (in sorted-name order)."""
    if num_ps < 1:
        raise ValueError(f"num_ps must be at least 1, got {num_ps}")
    return param_index % num_ps


def dense_owners(names: Any, num_ps: int) -> dict[str, int]:
    """Owner of every dense parameter, by name: round-robin over the sorted names."""
    return {name: dense_owner(i, num_ps) for i, name in enumerate(sorted(names))}
