"""Units at one boundary: Kubernetes quantities <-> memory_mib / cpu_millicores."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_core.errors import InputError
from dlrover_core.units import (
    BYTES_PER_MIB,
    MIB_PER_GIB,
    MILLICORES_PER_CORE,
    MILLISECONDS_PER_SECOND,
    bytes_from_mib,
    cores,
    cpu_millicores,
    format_cpu,
    format_memory,
    gib,
    memory_mib,
    mib_from_bytes,
    mib_from_gib,
    millicores_from_cores,
    millicores_from_cores_truncated,
    milliseconds,
)


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        ("4Gi", 4096),
        ("512Mi", 512),
        ("1.5Gi", 1536),
        ("2048Ki", 2),
        ("1Ki", 1),  # 1/1024 MiB rounds up to a whole MiB
        ("1Ti", 1024 * 1024),
        ("1G", 954),  # 10^9 B = 953.67 MiB, rounded up
        ("1M", 1),  # 10^6 B = 0.954 MiB
        ("1k", 1),
        ("1T", 953_675),  # 10^12 / 2^20 = 953674.3
        (" 8Gi ", 8192),  # surrounding space is tolerated
        ("100", 100),  # a bare number in a string is MiB, like a bare int
        (100, 100),
        (2.5, 3),  # MiB already; rounded up
        (0, 0),
    ],
)
def test_memory_mib(value: str | int | float, mib: int) -> None:
    assert memory_mib(value) == mib


@pytest.mark.parametrize(
    ("value", "millicores"),
    [
        ("500m", 500),
        ("2", 2000),
        ("1.5", 1500),
        (".25", 250),
        ("250m", 250),
        (2, 2000),
        (2.5, 2500),
        (0, 0),
        (0.0005, 0),  # below a millicore rounds to zero (round half to even)
    ],
)
def test_cpu_millicores(value: str | int | float, millicores: int) -> None:
    assert cpu_millicores(value) == millicores


@pytest.mark.parametrize(
    "value", ["4Gx", "4 GiB", "", "Gi", "-1Gi", "four", -1, -0.5, math.inf, math.nan, True]
)
def test_bad_memory_is_rejected_with_an_example(value: object) -> None:
    with pytest.raises(InputError) as ei:
        memory_mib(value)  # type: ignore[arg-type]
    assert repr(value) in ei.value.message or "finite" in ei.value.message
    assert "memory" in ei.value.message


@pytest.mark.parametrize("value", ["2 cores", "500mi", "m", "-1", -1, math.inf, math.nan, False])
def test_bad_cpu_is_rejected(value: object) -> None:
    with pytest.raises(InputError) as ei:
        cpu_millicores(value)  # type: ignore[arg-type]
    assert "cpu" in ei.value.message


@pytest.mark.parametrize(
    ("millicores", "text"), [(2000, "2"), (1500, "1500m"), (500, "500m"), (0, "0")]
)
def test_format_cpu(millicores: int, text: str) -> None:
    assert format_cpu(millicores) == text


@pytest.mark.parametrize(("mib", "text"), [(4096, "4Gi"), (1536, "1536Mi"), (0, "0Mi"), (1, "1Mi")])
def test_format_memory(mib: int, text: str) -> None:
    assert format_memory(mib) == text


def test_small_helpers() -> None:
    assert cores(1500) == 1.5
    assert millicores_from_cores(2.25) == 2250
    assert gib(1536) == 1.5
    assert (MILLICORES_PER_CORE, MIB_PER_GIB, BYTES_PER_MIB) == (1000, 1024, 1 << 20)
    assert MILLISECONDS_PER_SECOND == 1000
    assert mib_from_gib(1.5) == 1536.0
    assert bytes_from_mib(2) == 2 * 1024 * 1024
    assert mib_from_bytes(3 * 1024 * 1024) == 3.0
    assert milliseconds(0.25) == 250.0


def test_truncating_millicores_truncates() -> None:
    # the simulator's reported use truncates; rounding would give 1000 and -1000
    assert millicores_from_cores_truncated(0.9999) == 999
    assert millicores_from_cores_truncated(-0.9999) == -999
    assert millicores_from_cores(0.9999) == 1000


def test_int_in_int_out() -> None:
    # literals like ``64 * 1024`` MiB or ``512 * 1024 * 1024`` bytes stay ints
    assert type(mib_from_gib(64)) is int and mib_from_gib(64) == 65536
    assert type(bytes_from_mib(512)) is int and bytes_from_mib(512) == 512 * 1024 * 1024
    assert type(mib_from_gib(64.0)) is float
    assert type(mib_from_bytes(1 << 20)) is float


_floats = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
_ints = st.integers(min_value=-(2**40), max_value=2**40)


@given(_floats, _ints)
def test_helpers_are_the_literal_arithmetic_bit_for_bit(x: float, n: int) -> None:
    """Each helper is exactly the hand-written expression it replaced (issue 10: same floats)."""
    for v in (x, n):
        assert repr(cores(v)) == repr(v / 1000) == repr(v / 1000.0)
        assert repr(gib(v)) == repr(v / 1024) == repr(v / 1024.0)
        assert repr(mib_from_gib(v)) == repr(v * 1024)
        assert repr(bytes_from_mib(v)) == repr(v * 1024 * 1024)
        assert repr(mib_from_bytes(v)) == repr(v / 2**20) == repr(v / (1024.0 * 1024.0))
        assert repr(milliseconds(v)) == repr(v * 1000)
    assert millicores_from_cores(x) == int(round(x * 1000))
    assert millicores_from_cores_truncated(x) == int(x * 1000)


def test_numpy_division_by_the_constants_is_unchanged() -> None:
    arr = np.array([0, 1, 250, 1500, 7, 12_345], dtype=np.int64)
    far = arr.astype(np.float64) * 1.1
    for a in (arr, far):
        assert np.array_equal(a / MILLICORES_PER_CORE, a / 1000.0)
        assert (a / MILLICORES_PER_CORE).dtype == (a / 1000.0).dtype
        assert np.array_equal(a / MIB_PER_GIB, a / 1024.0)


@given(st.integers(min_value=0, max_value=10**7))
def test_memory_round_trip(mib: int) -> None:
    assert memory_mib(format_memory(mib)) == mib


@given(st.integers(min_value=0, max_value=10**7))
def test_cpu_round_trip(millicores: int) -> None:
    assert cpu_millicores(format_cpu(millicores)) == millicores
