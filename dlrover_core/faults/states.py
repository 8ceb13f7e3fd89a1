"""Node state transitions as a table (after DLRover's ``NodeStateFlow``).

Each allowed (from, to) pair says whether the move should trigger a relaunch evaluation
(``FaultPolicy.decide``). A node never comes back from SUCCEEDED, FAILED or DELETED: a
relaunch is a *new* node that starts in PENDING. Repeating the current state is allowed (watch
streams repeat events) and triggers nothing.

A DELETED node that was PENDING or RUNNING is evaluated for relaunch: someone other than the
job (eviction, preemption, an operator) removed it. When the master deletes a node itself
(scale down, PS migration) it must not ask for a relaunch; it knows why it deleted the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dlrover_core.errors import InputError
from dlrover_core.types import NodeState

P, R, S, F, D = (
    NodeState.PENDING,
    NodeState.RUNNING,
    NodeState.SUCCEEDED,
    NodeState.FAILED,
    NodeState.DELETED,
)


@dataclass(frozen=True)
class Transition:
    from_state: NodeState
    to_state: NodeState
    evaluate_relaunch: bool
    event: str


TRANSITIONS: Mapping[tuple[NodeState, NodeState], Transition] = MappingProxyType(
    {
        (a, b): Transition(a, b, relaunch, event)
        for a, b, relaunch, event in (
            (P, P, False, "still pending"),
            (P, R, False, "started"),
            (P, S, False, "finished before it was seen running"),
            (P, F, True, "failed before running (image, scheduling or start-up)"),
            (P, D, True, "deleted while pending"),
            (R, R, False, "still running"),
            (R, S, False, "succeeded"),
            (R, F, True, "failed"),
            (R, D, True, "deleted while running"),
            (S, S, False, "still succeeded"),
            (S, D, False, "cleaned up after success"),
            (F, F, False, "still failed"),
            (F, D, False, "cleaned up after failure"),
            (D, D, False, "still deleted"),
        )
    }
)
"""Every allowed move, keyed by (from, to)."""

TERMINAL_STATES: frozenset[NodeState] = frozenset({S, F, D})


def allowed_next(from_state: NodeState) -> frozenset[NodeState]:
    return frozenset(b for a, b in TRANSITIONS if a is from_state)


def is_terminal(state: NodeState) -> bool:
    return state in TERMINAL_STATES


def transition(from_state: NodeState, to_state: NodeState) -> Transition:
    """The table entry for this move; InputError if the move is illegal."""
    try:
        return TRANSITIONS[(from_state, to_state)]
    except KeyError:
        pass
    allowed = ", ".join(sorted(s.value for s in allowed_next(from_state))) or "nothing"
    hint = (
        " A relaunch is a new node: create one in pending instead of reviving this one."
        if is_terminal(from_state)
        else ""
    )
    raise InputError(
        f"illegal node state transition {from_state.value} -> {to_state.value}: "
        f"a {from_state.value} node can only go to {allowed}.{hint}"
    )
