"""Units at one boundary: Kubernetes quantities <-> memory_mib / cpu_millicores."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_core.errors import InputError
from dlrover_core.units import (
    cores,
    cpu_millicores,
    format_cpu,
    format_memory,
    gib,
    memory_mib,
    millicores_from_cores,
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


@given(st.integers(min_value=0, max_value=10**7))
def test_memory_round_trip(mib: int) -> None:
    assert memory_mib(format_memory(mib)) == mib


@given(st.integers(min_value=0, max_value=10**7))
def test_cpu_round_trip(millicores: int) -> None:
    assert cpu_millicores(format_cpu(millicores)) == millicores
