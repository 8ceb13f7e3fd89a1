"""Heartbeats, hangs and stragglers around their boundaries."""

from __future__ import annotations

import pytest

from dlrover_core.errors import InputError
from dlrover_core.faults import HangPolicy, HeartbeatPolicy, find_stragglers, is_dead, is_hung


@pytest.mark.parametrize(
    ("last", "now", "dead"),
    [
        (1000.0, 1599.0, False),
        (1000.0, 1600.0, True),  # exactly dead_after_s = 600
        (1000.0, 1601.0, True),
        (1000.0, 900.0, False),  # heartbeat "from the future": clock skew, alive
    ],
)
def test_is_dead(last: float, now: float, dead: bool) -> None:
    assert is_dead(last, now) is dead


def test_missed_heartbeats() -> None:
    assert HeartbeatPolicy().missed(0.0, 44.9) == 2  # 15 s interval
    assert HeartbeatPolicy(interval_s=1.0, dead_after_s=3.0).is_dead(0.0, 3.0)


def test_heartbeat_policy_validates() -> None:
    with pytest.raises(InputError, match="interval_s"):
        HeartbeatPolicy(interval_s=700.0, dead_after_s=600.0)


IDLE = [0.01, 0.02, 0.0]


@pytest.mark.parametrize(
    ("history", "since_progress_s", "hung"),
    [
        (IDLE, 1800.0, True),  # idle and no progress for exactly 1800 s
        (IDLE, 1799.0, False),  # not long enough
        ([0.01, 0.50, 0.0], 5000.0, False),  # one busy sample: slow, not hung
        ([0.01, 0.05, 0.0], 5000.0, False),  # 0.05 is not below 0.05
        ([0.01, 0.02], 5000.0, False),  # fewer than 3 samples: no evidence
        ([], 5000.0, False),
    ],
)
def test_is_hung(history: list[float], since_progress_s: float, hung: bool) -> None:
    assert is_hung(history, 100.0, 100.0 + since_progress_s) is hung


def test_hang_policy_is_configurable() -> None:
    policy = HangPolicy(cpu_util_below=0.2, no_progress_for_s=10.0, min_cpu_samples=1)
    assert policy.is_hung([0.1], 0.0, 10.0)


@pytest.mark.parametrize(
    ("speeds", "expected"),
    [
        ({0: 100.0, 1: 100.0, 2: 100.0}, []),
        ({0: 100.0, 1: 100.0, 2: 49.0}, [2]),  # 49 < 0.5 x median(100, 100)
        ({0: 100.0, 1: 100.0, 2: 50.0}, []),  # exactly half: not slower
        ({0: 100.0, 1: 90.0, 2: 30.0, 3: 20.0}, [2, 3]),  # medians of others: 30, 25 -> 55 ...
        ({0: 100.0, 2: 10.0}, []),  # fewer than min_workers
        ({5: 0.0, 7: 80.0, 9: 120.0}, [5]),
    ],
)
def test_find_stragglers(speeds: dict[int, float], expected: list[int]) -> None:
    assert find_stragglers(speeds) == expected


def test_find_stragglers_ratio_and_validation() -> None:
    assert find_stragglers({0: 100.0, 1: 100.0, 2: 79.0}, ratio=0.8) == [2]
    assert find_stragglers({0: 100.0, 1: 10.0}, min_workers=2) == [1]
    with pytest.raises(InputError, match="speeds"):
        find_stragglers({0: -1.0, 1: 1.0, 2: 1.0})
