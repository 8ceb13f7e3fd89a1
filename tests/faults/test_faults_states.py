"""The node state transition table."""

from __future__ import annotations

import pytest

from dlrover_core.errors import InputError
from dlrover_core.faults import TRANSITIONS, allowed_next, is_terminal, transition
from dlrover_core.types import NodeState

P, R, S, F, D = (
    NodeState.PENDING,
    NodeState.RUNNING,
    NodeState.SUCCEEDED,
    NodeState.FAILED,
    NodeState.DELETED,
)


@pytest.mark.parametrize(
    ("a", "b", "evaluate"),
    [
        (P, R, False),
        (P, F, True),
        (P, D, True),
        (R, S, False),
        (R, F, True),
        (R, D, True),
        (S, D, False),
        (F, D, False),
        (R, R, False),
    ],
)
def test_allowed(a: NodeState, b: NodeState, evaluate: bool) -> None:
    t = transition(a, b)
    assert (t.from_state, t.to_state, t.evaluate_relaunch) == (a, b, evaluate)


@pytest.mark.parametrize(("a", "b"), [(R, P), (S, R), (F, R), (D, P), (S, F), (F, S)])
def test_illegal(a: NodeState, b: NodeState) -> None:
    with pytest.raises(InputError, match=f"illegal node state transition {a.value} -> {b.value}"):
        transition(a, b)


def test_illegal_message_says_what_to_do() -> None:
    with pytest.raises(InputError) as err:
        transition(S, R)
    assert str(err.value) == (
        "illegal node state transition succeeded -> running: a succeeded node can only go to "
        "deleted, succeeded. A relaunch is a new node: create one in pending instead of "
        "reviving this one."
    )


def test_table_shape() -> None:
    assert allowed_next(D) == {D}
    assert allowed_next(P) == {P, R, S, F, D}
    assert [s for s in NodeState if is_terminal(s)] == [S, F, D]
    assert all(k == (t.from_state, t.to_state) for k, t in TRANSITIONS.items())
