"""Unit conversion at one boundary: "4Gi" / "500m" / 2.5 <-> memory_mib / cpu_millicores.

Inside the project CPU is an ``int`` of millicores and memory an ``int`` of MiB; everything
a user types (YAML, CLI, CSV) passes through here once.
"""

from __future__ import annotations

import math
import re
from typing import TypeVar

from dlrover_core.errors import InputError

MILLICORES_PER_CORE = 1000
"""Millicores in one core (``int``; ``arr / MILLICORES_PER_CORE`` for numpy arrays)."""
MIB_PER_GIB = 1024
"""MiB in one GiB (``int``; ``arr / MIB_PER_GIB`` for numpy arrays)."""
BYTES_PER_MIB = 1024 * 1024
"""Bytes in one MiB (``int``)."""
MILLISECONDS_PER_SECOND = 1000
"""Milliseconds in one second (``int``)."""

# int in, int out; float in, float out (the arithmetic is the caller's old one, unchanged)
_Number = TypeVar("_Number", int, float)

_MEM_FACTORS_MIB: dict[str, float] = {
    "": 1.0 / (1024 * 1024),  # plain number = bytes (Kubernetes convention)
    "Ki": 1.0 / 1024,
    "Mi": 1.0,
    "Gi": 1024.0,
    "Ti": 1024.0 * 1024,
    "K": 1000.0 / (1024 * 1024),
    "k": 1000.0 / (1024 * 1024),
    "M": 1000.0**2 / (1024 * 1024),
    "G": 1000.0**3 / (1024 * 1024),
    "T": 1000.0**4 / (1024 * 1024),
}
_MEM_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(Ki|Mi|Gi|Ti|K|k|M|G|T)?\s*$")
_CPU_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(m)?\s*$")


def memory_mib(value: str | int | float) -> int:
    """Parse a Kubernetes memory quantity ("4Gi", "512Mi", "1G") to whole MiB (rounded up).

    A bare int/float is taken as MiB already (the project's internal unit)."""
    if isinstance(value, bool):
        raise InputError(f"memory {value!r} is not a quantity; write e.g. '4Gi' or '512Mi'")
    if isinstance(value, (int, float)):
        if value < 0 or not math.isfinite(value):
            raise InputError(f"memory {value!r} must be a finite number >= 0 (MiB)")
        return int(math.ceil(value))
    m = _MEM_RE.match(str(value))
    if not m:
        raise InputError(f"memory {value!r} is not a quantity; write e.g. '4Gi' or '512Mi'")
    number, suffix = float(m.group(1)), m.group(2) or ""
    if suffix == "":
        # a bare number inside a string: MiB, like a bare int (bytes would surprise users)
        return int(math.ceil(number))
    return int(math.ceil(number * _MEM_FACTORS_MIB[suffix] - 1e-9))


def memory_quantity_mib(value: str | int | float) -> int:
    """A memory quantity typed by a user (spec, CLI) to whole MiB, rounded up, with Kubernetes
    semantics: a bare number, typed or in a string, is **bytes** (``2147483648`` and
    ``"2147483648"`` are 2 GiB); ``"4Gi"``, ``"512Mi"``, ``"1G"`` carry their unit.

    Unlike :func:`memory_mib` (whose bare numbers are MiB, the project's internal unit), this is
    the parser for the user boundary."""
    if isinstance(value, bool):
        raise InputError(f"memory {value!r} is not a quantity; write e.g. '4Gi' or '512Mi'")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        m = _MEM_RE.match(str(value))
        if not m:
            raise InputError(f"memory {value!r} is not a quantity; write e.g. '4Gi' or '512Mi'")
        if m.group(2):
            return memory_mib(str(value))
        number = float(m.group(1))
    if number < 0 or not math.isfinite(number):
        raise InputError(f"memory {value!r} must be a finite quantity >= 0, e.g. '4Gi'")
    return int(math.ceil(number / BYTES_PER_MIB - 1e-9))


def cpu_millicores(value: str | int | float) -> int:
    """Parse a CPU quantity ("500m", "2", 2.5) to millicores."""
    if isinstance(value, bool):
        raise InputError(f"cpu {value!r} is not a quantity; write e.g. '500m' or 2")
    if isinstance(value, (int, float)):
        if value < 0 or not math.isfinite(value):
            raise InputError(f"cpu {value!r} must be a finite number of cores >= 0")
        return millicores_from_cores(value)
    m = _CPU_RE.match(str(value))
    if not m:
        raise InputError(f"cpu {value!r} is not a quantity; write e.g. '500m' or '2'")
    number = float(m.group(1))
    return int(round(number)) if m.group(2) else millicores_from_cores(number)


def cores(millicores: int | float) -> float:
    """Millicores to cores: ``millicores / 1000.0``."""
    return millicores / 1000.0


def millicores_from_cores(value: float) -> int:
    """Cores to whole millicores, rounded to nearest: ``int(round(value * 1000))``."""
    return int(round(value * MILLICORES_PER_CORE))


def millicores_from_cores_truncated(value: float) -> int:
    """Cores to whole millicores, truncated toward zero: ``int(value * 1000)``."""
    return int(value * MILLICORES_PER_CORE)


def format_cpu(millicores: int) -> str:
    """Kubernetes form: whole cores as "2", fractions as "1500m"."""
    if millicores % MILLICORES_PER_CORE == 0:
        return str(millicores // MILLICORES_PER_CORE)
    return f"{millicores}m"


def format_memory(mib: int) -> str:
    """Kubernetes form: "4Gi" when whole GiB, else "1536Mi"."""
    if mib % MIB_PER_GIB == 0 and mib > 0:
        return f"{mib // MIB_PER_GIB}Gi"
    return f"{mib}Mi"


def gib(mib: int | float) -> float:
    """MiB to GiB: ``mib / 1024.0``."""
    return mib / 1024.0


def mib_from_gib(value: _Number) -> _Number:
    """GiB to MiB: ``value * 1024`` (an ``int`` stays an ``int``)."""
    return value * MIB_PER_GIB


def bytes_from_mib(mib: _Number) -> _Number:
    """MiB to bytes: ``mib * 2**20`` (an ``int`` stays an ``int``)."""
    return mib * BYTES_PER_MIB


def mib_from_bytes(n_bytes: float) -> float:
    """Bytes to MiB: ``n_bytes / 2**20`` (a true division: always a float)."""
    return n_bytes / BYTES_PER_MIB


def milliseconds(seconds: float) -> float:
    """Seconds to milliseconds: ``seconds * 1000``."""
    return seconds * MILLISECONDS_PER_SECOND
