"""Why did a node exit? Exit code, termination reason and signal -> one ``ExitClass``.

The rule is three tables, read in this order (the first hit wins):

1. ``exit_code == 0`` -> SUCCEEDED. The process says it finished; a stray reason (Kubernetes
   can report ``OOMKilled`` for a container whose *child* was OOM-killed) does not undo that.
2. ``STRONG_REASONS``: a reason that says more than any exit code. ``137`` + ``OOMKilled`` is
   an OOM, not a plain kill; ``NodeLost`` is hardware whatever code came back.
3. ``EXIT_CODES``: codes with a meaning of their own (``1`` = code error, ``247`` = DLRover's
   OOM code).
4. ``SIGNALS``: the signal that ended the process, taken from ``signal=``, from a negative
   exit code (Python's ``Popen.returncode`` is ``-N`` for signal N) or from a shell-style code
   ``128 + N``. So 134 (SIGABRT) is FATAL; 137 (SIGKILL) and 143 (SIGTERM) are KILLED.
5. ``WEAK_REASONS``: reasons that only say "it failed". Kubernetes reports ``Error`` for *any*
   non-zero exit, so ``Error`` decides only when no exit code or signal is known (then FATAL);
   with a code, the code decides (``137`` + ``Error`` is KILLED, ``2`` + ``Error`` is UNKNOWN).
6. Anything else is UNKNOWN (the relaunch policy retries it within a small budget).

Reasons match case-insensitively, ignoring surrounding blanks.

``DeadlineExceeded`` (Kubernetes ``activeDeadlineSeconds``) is FATAL, not KILLED: the user's
own deadline ended the node, and relaunching would defeat it.

Contract with the local-process backend: a process killed by the memory limiter dies of
SIGKILL (returncode ``-9``), which alone reads as KILLED. The backend must report it with
``reason=OOM_REASON`` (``"OOMKilled"``, the Kubernetes spelling), which wins over the signal.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class ExitClass(StrEnum):
    """What kind of exit a node had; the relaunch policy is keyed on it."""

    SUCCEEDED = "succeeded"
    OOM = "oom"  # out of memory: relaunch with more memory
    KILLED = "killed"  # preempted, evicted, SIGKILL/SIGTERM: not the job's fault
    FATAL = "fatal"  # a code error: the same code fails again, do not retry
    HARDWARE = "hardware"  # the machine failed: relaunch elsewhere
    UNKNOWN = "unknown"  # anything else: retry within a small budget


OOM_REASON = "OOMKilled"
"""The reason every backend reports for a node killed for exceeding its memory."""

DELETED_REASON = "Deleted"
"""A node's pod vanished without a final status and nobody asked for it (KILLED)."""

DISRUPTED_REASON = "DisruptionTarget"
"""Kubernetes' condition for a pod it is about to disrupt (preemption, eviction; KILLED)."""

FATAL_WAITING_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
"""Kubernetes waiting reasons that no relaunch of the same pod can fix (FATAL)."""

PENDING_REASONS = frozenset({"Unschedulable"})
"""Reasons a node is *pending*, not ended: the pending rule (``faults.pending``) decides, not
``classify_exit``. A backend never reports them as an exit."""

DLROVER_OOM_EXIT_CODE = 247
"""Exit code DLRover's agent uses for an out-of-memory exit."""

STRONG_REASONS: Mapping[str, ExitClass] = MappingProxyType(
    {
        "oomkilled": ExitClass.OOM,
        "evicted": ExitClass.KILLED,
        "preempted": ExitClass.KILLED,
        "preempting": ExitClass.KILLED,
        "killed": ExitClass.KILLED,
        "deadlineexceeded": ExitClass.FATAL,
        "containercannotrun": ExitClass.FATAL,
        # Kubernetes (added with the Kubernetes backend): the pod ended for a reason outside
        # the job (relaunch), or could never start (no relaunch can fix it)
        "deleted": ExitClass.KILLED,
        "disruptiontarget": ExitClass.KILLED,
        "shutdown": ExitClass.KILLED,
        "nodeshutdown": ExitClass.KILLED,
        "terminated": ExitClass.KILLED,
        "imagepullbackoff": ExitClass.FATAL,
        "errimagepull": ExitClass.FATAL,
        "invalidimagename": ExitClass.FATAL,
        "createcontainerconfigerror": ExitClass.FATAL,
        "createcontainererror": ExitClass.FATAL,
        "nodelost": ExitClass.HARDWARE,
        "hardwareerror": ExitClass.HARDWARE,
        "gpuerror": ExitClass.HARDWARE,
        "ncclerror": ExitClass.HARDWARE,
    }
)
"""Reasons (lower case) that decide the class whatever the exit code says."""

EXIT_CODES: Mapping[int, ExitClass] = MappingProxyType(
    {
        0: ExitClass.SUCCEEDED,
        1: ExitClass.FATAL,
        DLROVER_OOM_EXIT_CODE: ExitClass.OOM,
    }
)
"""Exit codes with a meaning of their own (checked before reading a code as 128 + signal)."""

SIGNALS: Mapping[int, ExitClass] = MappingProxyType(
    {
        int(_signal.SIGABRT): ExitClass.FATAL,  # 6, exit 134: abort() from a failed check
        int(_signal.SIGKILL): ExitClass.KILLED,  # 9, exit 137
        int(_signal.SIGTERM): ExitClass.KILLED,  # 15, exit 143
        int(_signal.SIGINT): ExitClass.KILLED,  # 2, exit 130: interrupted by an operator
    }
)
"""Signals that ended a process, by number."""

WEAK_REASONS: Mapping[str, ExitClass] = MappingProxyType(
    {
        "error": ExitClass.FATAL,
        "completed": ExitClass.SUCCEEDED,
    }
)
"""Reasons (lower case) used only when neither an exit code nor a signal is known."""

_SHELL_SIGNAL_BASE = 128
_MAX_SIGNAL = 64


def signal_of(exit_code: int | None, signal: int | None = None) -> int | None:
    """The signal that ended the process: ``signal`` if given, else read from the exit code
    (``-N`` as Python reports it, or ``128 + N`` as a shell or container runtime does)."""
    if signal is not None:
        return signal
    if exit_code is None:
        return None
    if -_MAX_SIGNAL <= exit_code < 0:
        return -exit_code
    if _SHELL_SIGNAL_BASE < exit_code <= _SHELL_SIGNAL_BASE + _MAX_SIGNAL:
        return exit_code - _SHELL_SIGNAL_BASE
    return None


def explain_exit(
    exit_code: int | None, reason: str | None = None, signal: int | None = None
) -> tuple[ExitClass, str]:
    """``classify_exit`` plus one line saying which rule decided (for reports and logs)."""
    key = reason.strip().lower() if reason else ""
    if exit_code == 0:
        return ExitClass.SUCCEEDED, "exit code 0"
    if key in STRONG_REASONS:
        return STRONG_REASONS[key], f"reason {reason!r}"
    if exit_code is not None and exit_code in EXIT_CODES:
        return EXIT_CODES[exit_code], f"exit code {exit_code}"
    sig = signal_of(exit_code, signal)
    if sig is not None and sig in SIGNALS:
        return SIGNALS[sig], f"signal {sig} (exit code {exit_code})"
    if exit_code is None and sig is None and key in WEAK_REASONS:
        return WEAK_REASONS[key], f"reason {reason!r} without an exit code"
    return (
        ExitClass.UNKNOWN,
        f"unrecognised exit (code {exit_code}, reason {reason!r}, signal {sig})",
    )


def classify_exit(
    exit_code: int | None, reason: str | None = None, signal: int | None = None
) -> ExitClass:
    """Classify a node's exit. See the module docstring for the table and its order."""
    return explain_exit(exit_code, reason, signal)[0]
