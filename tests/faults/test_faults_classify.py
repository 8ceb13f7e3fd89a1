"""Every row of the exit tables, and the order in which the tables are read."""

from __future__ import annotations

import pytest

from dlrover_core.faults import ExitClass, classify_exit, explain_exit, signal_of

K, OOM, F, H, S, U = (
    ExitClass.KILLED,
    ExitClass.OOM,
    ExitClass.FATAL,
    ExitClass.HARDWARE,
    ExitClass.SUCCEEDED,
    ExitClass.UNKNOWN,
)


@pytest.mark.parametrize(
    ("exit_code", "reason", "signal", "expected"),
    [
        # exit codes alone
        (0, None, None, S),
        (1, None, None, F),
        (247, None, None, OOM),  # DLRover's OOM code
        (134, None, None, F),  # 128 + SIGABRT
        (137, None, None, K),  # 128 + SIGKILL
        (143, None, None, K),  # 128 + SIGTERM
        (130, None, None, K),  # 128 + SIGINT
        (-9, None, None, K),  # Python returncode for SIGKILL
        (-15, None, None, K),
        (-6, None, None, F),
        (2, None, None, U),
        (139, None, None, U),  # SIGSEGV: not in the table
        (255, None, None, U),
        (None, None, None, U),
        # explicit signal
        (None, None, 9, K),
        (None, None, 15, K),
        (None, None, 6, F),
        (None, None, 11, U),
        # strong reasons win over the code
        (137, "OOMKilled", None, OOM),
        (-9, "OOMKilled", None, OOM),  # local memory limiter contract
        (None, "oomkilled", None, OOM),
        (1, "Evicted", None, K),
        (None, "Preempted", None, K),
        (None, "Killed", None, K),
        (None, "DeadlineExceeded", None, F),
        (None, "ContainerCannotRun", None, F),
        (None, "NodeLost", None, H),
        (137, "NodeLost", None, H),
        (None, "HardwareError", None, H),
        (None, " GPUError ", None, H),
        (None, "NCCLERROR", None, H),
        # exit 0 wins over everything
        (0, "OOMKilled", None, S),
        # weak reasons decide only without a code or a signal
        (None, "Error", None, F),
        (137, "Error", None, K),
        (2, "Error", None, U),
        (None, "Completed", None, S),
        (None, "SomethingElse", None, U),
    ],
)
def test_classify_exit(
    exit_code: int | None, reason: str | None, signal: int | None, expected: ExitClass
) -> None:
    assert classify_exit(exit_code, reason, signal) is expected


def test_explain_names_the_rule() -> None:
    assert explain_exit(137, "OOMKilled") == (OOM, "reason 'OOMKilled'")
    assert explain_exit(143)[1] == "signal 15 (exit code 143)"


@pytest.mark.parametrize(
    ("exit_code", "signal", "expected"),
    [
        (-9, None, 9),
        (137, None, 9),
        (129, None, 1),
        (128, None, None),
        (247, None, None),  # 247 is no signal (> 128 + 64)
        (1, None, None),
        (None, 15, 15),
        (0, 9, 9),
        (None, None, None),
    ],
)
def test_signal_of(exit_code: int | None, signal: int | None, expected: int | None) -> None:
    assert signal_of(exit_code, signal) == expected
