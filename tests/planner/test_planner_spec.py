"""The spec's ``planner:`` section: validated field by field, mapped onto PlannerConfig, and
picked up by ``Planner(spec)`` without a hand-built config."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dlrover_core.errors import SpecError
from dlrover_core.planner import Planner, PlannerConfig
from dlrover_core.spec import PlannerSpec, load_spec, spec_to_dict
from dlrover_core.types import Stage
from tests.factories import make_obs, make_plan, make_spec, make_spec_dict
from tests.planner.test_planner import CURRENT, WB, planner_with, truth_at


def _problems(planner: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as ei:
        load_spec(make_spec_dict(planner=planner))
    return ei.value.problems


def test_every_field_is_a_planner_config_field() -> None:
    config = {f.name: f.type for f in dataclasses.fields(PlannerConfig)}
    for name in PlannerSpec.model_fields:
        assert name in config, f"planner.{name} maps onto no PlannerConfig field"


def test_left_out_fields_keep_the_planner_defaults() -> None:
    assert PlannerConfig.from_spec(make_spec()) == PlannerConfig.from_spec(make_spec(), **{})
    assert PlannerConfig.from_spec(make_spec()).min_remaining_to_sample_s == 1800.0


def test_the_section_reaches_planner_spec_alone() -> None:
    spec = make_spec(
        planner={
            "worker_change_pause_s": 45,
            "ps_change_pause_s": 240.5,
            "min_remaining_to_sample_s": 600,
            "max_worker_step": 3,
            "hot_ps_cpu_util": 0.8,
            "ps_memory_defer_s": 0,
        }
    )
    cfg = Planner(spec).config
    assert cfg.ps_memory_defer_s == 0.0
    assert (cfg.worker_change_pause_s, cfg.ps_change_pause_s) == (45.0, 240.5)
    assert cfg.min_remaining_to_sample_s == 600.0
    assert cfg.max_worker_step == 3 and isinstance(cfg.max_worker_step, int)
    assert cfg.hot_ps_cpu_util == 0.8
    assert cfg.min_gain == PlannerConfig().min_gain  # not set: the default
    # keyword overrides (tests, callers) still win over the spec
    assert PlannerConfig.from_spec(spec, max_worker_step=5).max_worker_step == 5


def test_the_section_round_trips_and_an_unset_one_stays_out() -> None:
    spec = make_spec(planner={"min_gain": 0.05})
    d = spec_to_dict(spec)
    assert d["planner"] == {"min_gain": 0.05}
    assert load_spec(d) == spec
    assert spec_to_dict(make_spec())["planner"] == {}


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("worker_change_pause_s", -1, "greater than or equal to 0"),
        ("ps_change_pause_s", "slow", "valid number"),
        ("min_remaining_to_sample_s", float("inf"), "finite number"),
        ("min_saved_fraction", 1.5, "less than or equal to 1"),
        ("min_saved_pause_multiple", -0.5, "greater than or equal to 0"),
        ("min_gain", -0.01, "greater than or equal to 0"),
        ("min_elasticity", 2, "less than or equal to 1"),
        ("memory_gib_per_core", 0, "greater than 0"),
        ("max_worker_step", 0, "greater than or equal to 1"),
        ("max_worker_step", 2.5, "valid integer"),
        ("max_sampling_configs", -1, "greater than or equal to 0"),
        ("max_trust_rel_error", 0, "greater than 0"),
        ("recheck_fraction", 3, "less than or equal to 1"),
        ("hot_ps_cpu_util", 1.2, "less than or equal to 1"),
        ("idle_ps_cpu_util", 1.0, "less than 1"),
        ("ps_memory_defer_s", -60, "greater than or equal to 0"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field(field: str, value: Any, says: str) -> None:
    problems = _problems({field: value})
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"planner.{field}: ") and says in problems[0], problems
    assert "\n" not in problems[0]


def test_idle_must_stay_below_hot() -> None:
    (p,) = _problems({"hot_ps_cpu_util": 0.5, "idle_ps_cpu_util": 0.6})
    assert p.startswith("planner: ") and "idle_ps_cpu_util (0.6)" in p
    assert "lower idle_ps_cpu_util or raise hot_ps_cpu_util" in p


def test_an_unknown_field_is_named() -> None:
    (p,) = _problems({"min_remaining_s": 600})
    assert p.startswith("planner.min_remaining_s: unknown field")


def test_the_pause_costs_from_the_spec_change_the_decision() -> None:
    """The same job, samples and observations: with the default pauses the model's move pays
    (it saves most of the ~190 min left); with a spec saying a change pauses the job for a
    day, the planner keeps the plan and says why."""
    obs = [make_obs(10.0, ps_util=[0.5], ps_cpu=2000, worker_cpu=1000, worker_mem=2048,
                    worker_speeds=[100, 100], samples_total=20_000_000)]  # fmt: skip
    d = planner_with(WB).replan(CURRENT, obs, truth_at(CURRENT), 20.0)
    assert d.plan is not None and d.plan.workers.count > CURRENT.workers.count
    slow = {"planner": {"worker_change_pause_s": 86_400, "ps_change_pause_s": 86_400}}
    d = planner_with(WB, **slow).replan(CURRENT, obs, truth_at(CURRENT), 20.0)
    assert d.plan is None
    assert d.notes[0].startswith("not worth a 86400 s pause")


def test_max_worker_step_from_the_spec_bounds_the_step() -> None:
    d = planner_with(WB, planner={"max_worker_step": 2, "max_worker_growth": 0}).replan(
        CURRENT, [], truth_at(CURRENT), 20.0
    )
    assert d.plan is not None and d.plan.workers.count == CURRENT.workers.count + 2


def _not_worth(planner: Planner) -> float | None:
    obs = [make_obs(10.0, ps_util=[0.5], ps_cpu=2000, worker_cpu=1000, worker_mem=2048,
                    worker_speeds=[100, 100], samples_total=20_000_000)]  # fmt: skip
    d = planner.replan(CURRENT, obs, truth_at(CURRENT), 20.0)
    assert d.plan is None and d.notes[0].startswith("not worth")
    return d.next_check_s


def test_the_no_move_back_off_is_off_unless_the_spec_turns_it_on() -> None:
    """No move worth it: by default the next stage-2 check is one re-plan interval (10 s in
    the test spec) away; ``recheck_fraction`` backs it off, never past ``recheck_max_s``."""
    slow = {"worker_change_pause_s": 86_400, "ps_change_pause_s": 86_400}
    assert _not_worth(planner_with(WB, planner=slow)) == 20.0 + 10.0
    back_off = {**slow, "recheck_fraction": 0.5, "recheck_max_s": 900}
    assert _not_worth(planner_with(WB, planner=back_off)) == 20.0 + 900.0  # ~96 min > 900 s


def test_monitor_runs_stage_3_alone() -> None:
    current = make_plan((2, 1000, 2048), (2, 2000, 4096), created_at_s=0.0)
    hot = [make_obs(t, ps_util=[0.95, 0.4], ps_cpu=2000, ps_mem=4096) for t in (1.0, 2.0, 3.0)]
    d = planner_with(WB).monitor(current, hot, 4.0)
    assert d.plan is not None and d.plan.stage is Stage.POST_SCALING
    calm = [make_obs(t, ps_util=[0.5, 0.5], ps_cpu=2000, ps_mem=4096) for t in (1.0, 2.0, 3.0)]
    d = planner_with(WB).monitor(current, calm, 4.0)
    assert d.plan is None  # and no stage 2 either: it would scale this job up
    assert planner_with(WB).replan(current, calm, truth_at(current), 20.0).plan is not None
