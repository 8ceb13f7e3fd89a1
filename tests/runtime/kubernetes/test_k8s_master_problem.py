"""Why a submitted job's master cannot start, from its pods (pure): an image that cannot be
pulled, a master that refused its input, a crash loop, a pod unschedulable for too long."""

from __future__ import annotations

from typing import Any

from dlrover_core.runtime.backends.submit import UNSCHEDULABLE_S, master_problem

T0 = 1_800_000_000.0
ISO0 = "2027-01-15T08:00:00Z"  # T0


def pod(name: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"dlrover-rm/role": "master"},
            "creationTimestamp": ISO0,
        },
        "status": status,
    }


def failed(name: str, code: int, ran_s: int = 3) -> dict[str, Any]:
    term = {
        "terminated": {
            "exitCode": code,
            "startedAt": "2027-01-15T08:00:00Z",
            "finishedAt": f"2027-01-15T08:{ran_s // 60:02d}:{ran_s % 60:02d}Z",
        }
    }
    return pod(name, phase="Failed", containerStatuses=[{"state": term}])


def test_nothing_wrong_while_a_master_starts_or_runs() -> None:
    assert master_problem([], {}, T0) is None
    assert master_problem([pod("m-1", phase="Running")], {}, T0) is None
    assert master_problem([failed("m-1", 1)], {"m-1": "boom"}, T0) is None  # one crash: retried


def test_an_image_that_cannot_be_pulled() -> None:
    w = {"waiting": {"reason": "ImagePullBackOff", "message": "image not found"}}
    why = master_problem([pod("m-1", phase="Pending", containerStatuses=[{"state": w}])], {}, T0)
    assert why == ("master pod m-1 cannot start: ImagePullBackOff: image not found", True)


def test_a_master_that_refuses_its_input_and_a_crash_loop() -> None:
    log = "starting\nerror: backend.state_pvc or backend.state_url is required\n"
    why, blocking = master_problem([failed("m-1", 2)], {"m-1": log}, T0) or ("", None)
    assert "refused its input (pod m-1, exit 2)" in why and blocking is False  # the Job fails
    assert why.endswith("backend.state_pvc or backend.state_url is required")
    why, blocking = master_problem(
        [failed("m-1", 1), failed("m-2", 137)], {"m-2": "killed"}, T0
    ) or ("", None)
    assert blocking is True
    assert (
        why
        == "the master crashed 2 times within 60 s of its start (last: pod m-2, exit 137): killed"
    )
    # a master that ran for minutes before it failed is left to the Job's retries
    assert master_problem([failed("m-1", 3, 300), failed("m-2", 3, 400)], {}, T0) is None


def test_an_unschedulable_master_after_a_while() -> None:
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes have enough cpu",
        "lastTransitionTime": ISO0,
    }
    p = pod("m-1", phase="Pending", conditions=[cond])
    assert master_problem([p], {}, T0 + UNSCHEDULABLE_S - 1) is None
    why, blocking = master_problem([p], {}, T0 + UNSCHEDULABLE_S + 1) or ("", None)
    assert "unschedulable for 46 s: 0/3 nodes have enough cpu" in why and blocking
