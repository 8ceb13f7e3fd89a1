"""Fault policies as data: exit classification, relaunch budgets, OOM bump, pending nodes,
heartbeats, hangs, stragglers and node state transitions. Pure: inputs in, decisions out.

Run by the job master (runtime/) and by the cluster simulator (sim/), so both behave alike.
"""

from dlrover_core.faults.classify import (
    DLROVER_OOM_EXIT_CODE,
    EXIT_CODES,
    OOM_REASON,
    SIGNALS,
    STRONG_REASONS,
    WEAK_REASONS,
    ExitClass,
    classify_exit,
    explain_exit,
    signal_of,
)
from dlrover_core.faults.health import (
    DEFAULT_HANG_POLICY,
    DEFAULT_HEARTBEAT_POLICY,
    HangPolicy,
    HeartbeatPolicy,
    find_stragglers,
    is_dead,
    is_hung,
)
from dlrover_core.faults.pending import (
    DEFAULT_PENDING_POLICY,
    PendingAction,
    PendingDecision,
    PendingPolicy,
    pending_action,
)
from dlrover_core.faults.policy import (
    DEFAULT_FAULT_POLICY,
    FaultPolicy,
    OomBump,
    PsOomAction,
    PsOomDecision,
    RelaunchDecision,
    ps_oom_action,
)
from dlrover_core.faults.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    Transition,
    allowed_next,
    is_terminal,
    transition,
)

__all__ = [
    "DEFAULT_FAULT_POLICY",
    "DEFAULT_HANG_POLICY",
    "DEFAULT_HEARTBEAT_POLICY",
    "DEFAULT_PENDING_POLICY",
    "DLROVER_OOM_EXIT_CODE",
    "EXIT_CODES",
    "OOM_REASON",
    "SIGNALS",
    "STRONG_REASONS",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "WEAK_REASONS",
    "ExitClass",
    "FaultPolicy",
    "HangPolicy",
    "HeartbeatPolicy",
    "OomBump",
    "PendingAction",
    "PendingDecision",
    "PendingPolicy",
    "PsOomAction",
    "PsOomDecision",
    "RelaunchDecision",
    "Transition",
    "allowed_next",
    "classify_exit",
    "explain_exit",
    "find_stragglers",
    "is_dead",
    "is_hung",
    "is_terminal",
    "pending_action",
    "ps_oom_action",
    "signal_of",
    "transition",
]
