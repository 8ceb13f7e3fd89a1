"""A planner error never fails a job (issue 35 item 3): exceptions injected into the planner
at random ticks of a PS job and of an all-reduce job; each job finishes exactly once, keeps
its plan and reports every error as a ``planner_error``. Real processes; slow."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from dlrover_core import api
from dlrover_core.planner import Planner
from dlrover_core.planner import planner as planner_module

pytestmark = pytest.mark.slow
SPECS = Path(__file__).resolve().parents[2] / "pipelines" / "specs"
FAST = [
    "data.rows=120000",
    "data.eval_rows=2000",
    "pacing.sample_window_s=1.0",
    "pacing.min_speed_samples=2",
    "pacing.replan_interval_s=1",
    "pacing.heartbeat_interval_s=0.5",
]


class Injected(RuntimeError):
    """What the test throws into the planner."""


def flaky(fn: Any, rng: random.Random, calls: list[bool]) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        fail = rng.random() < 0.6
        calls.append(fail)
        if fail:
            raise Injected(f"injected planner failure #{len(calls)}")
        return fn(*args, **kwargs)

    return wrapped


def check(report: dict[str, Any], calls: list[bool]) -> None:
    assert report["state"] == "succeeded", report.get("failure")
    assert report["shards_done"] == report["shards_total"] > 0
    assert report["shards_completed_twice"] == 0 and report["shards_lost"] == 0
    errors = report["planner_errors"]
    assert sum(calls) >= 1 and len(errors) == sum(calls), (calls, errors)
    for e in errors:
        assert e["kind"] == "planner_error" and "Injected" in e["error"]
        assert "kept the current plan" in e["action"]


@pytest.mark.parametrize("seed", [1, 2])
def test_planner_errors_at_random_ticks_of_a_ps_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng, calls = random.Random(seed), []  # type: ignore[var-annotated]
    monkeypatch.setattr(Planner, "replan", flaky(Planner.replan, rng, calls))
    report = api.train(
        str(SPECS / "small.yaml"),
        overrides=FAST,
        run_dir=tmp_path / "run",
        history="none",
        progress=False,
    )
    check(report, calls)


def test_planner_errors_at_random_ticks_of_an_allreduce_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng, calls = random.Random(7), []  # type: ignore[var-annotated]
    # the all-reduce strategy re-plans through Planner.replan, whose all-reduce stage 3 this is
    monkeypatch.setattr(
        planner_module,
        "allreduce_post_scale",
        flaky(planner_module.allreduce_post_scale, rng, calls),
    )
    report = api.train(
        str(SPECS / "small-allreduce.yaml"),
        overrides=FAST,
        run_dir=tmp_path / "run",
        history="none",
        progress=False,
    )
    check(report, calls)


def test_a_failing_first_plan_starts_cold_and_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Planner.initial_plan

    def initial_plan(self: Planner, history: Any = (), now_s: float = 0.0) -> Any:
        if history:
            raise Injected("the history broke the planner")
        return real(self, history, now_s)

    monkeypatch.setattr(Planner, "initial_plan", initial_plan)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    over = [*FAST, "data.rows=40000", "pacing.replan_interval_s=30"]
    first = api.train(
        str(SPECS / "small.yaml"), overrides=over, run_dir=tmp_path / "a", history=db,
        progress=False,
    )  # fmt: skip
    second = api.train(
        str(SPECS / "small.yaml"), overrides=over, run_dir=tmp_path / "b", history=db,
        progress=False,
    )  # fmt: skip
    assert first["state"] == second["state"] == "succeeded"
    assert first["planner_errors"] == []
    assert second["history"]["records"] == 1
    assert [e["step"] for e in second["planner_errors"]] == ["initial_plan"]
    assert second["plans"][0]["stage"] == "cold_start"
