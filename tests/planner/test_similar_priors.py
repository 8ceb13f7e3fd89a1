"""Stage 1 for a new signature: the similar-job prior (issue 38, planner/similar.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlrover_core.planner import Planner
from dlrover_core.planner.similar import (
    JobFeatures,
    SimilarConfig,
    job_features,
    nearest,
    record_features,
    similar_jobs,
)
from dlrover_core.spec import JobSpec, spec_to_dict
from dlrover_core.types import HistoryRecord, Stage
from tests.factories import make_plan, make_spec

DAY = 86400.0
NOW = 10 * DAY
ROOT = Path(__file__).resolve().parents[2]


def _run(spec: JobSpec, run_id: int, *, with_spec: bool = True, **kw: Any) -> HistoryRecord:
    extra: dict[str, Any] = {"run_id": run_id}
    if with_spec:
        extra["spec"] = spec_to_dict(spec)
    args: dict[str, Any] = {
        "worker_cpu_used_millicores": 1600,
        "worker_memory_used_mib": 2000,
        "ps_cpu_used_millicores": 1000,
        "ps_memory_used_mib": 3000,
        "throughput_sps": 1000.0,
    }
    args.update(kw)
    return HistoryRecord(
        spec.signature_key,
        NOW - DAY,
        make_plan((3, 2000, 4096), (2, 2000, 4096)),
        extra=extra,
        strategy=spec.strategy,
        **args,
    )


OLD = make_spec(signature__model="m1")


def test_a_renamed_model_starts_from_its_twin_and_names_it() -> None:
    new = make_spec(signature__model="m1-v2")
    plan = Planner(new).initial_plan([_run(OLD, 7), _run(OLD, 8)], NOW)
    assert plan.stage is Stage.WARM_START
    first = plan.reasons[0]
    assert first.startswith("similar-job prior")
    assert "test/m1/synthetic (distance 0.00; runs 7, 8)" in first
    # the twin's final configuration, as a warm start of its own signature would give
    twin = Planner(OLD).initial_plan([_run(OLD, 7), _run(OLD, 8)], NOW)
    assert (plan.workers, plan.ps) == (twin.workers, twin.ps)


def test_an_exact_signature_match_still_comes_first() -> None:
    own = _run(OLD, 1, worker_cpu_used_millicores=900)
    plan = Planner(OLD).initial_plan([own, _run(make_spec(signature__model="x"), 2)], NOW)
    assert plan.reasons[0].startswith("warm start from 1 similar run(s) of 'test/m1/")
    assert not any("similar-job prior" in r for r in plan.reasons)


def test_one_more_table_is_near_and_its_memory_scales_up() -> None:
    tables = [{"name": n, "num_embeddings": "dynamic"} for n in "abc"]
    old = make_spec(signature__model="m1", model__embedding_tables=tables, data__rows=10**7)
    new = make_spec(
        signature__model="m2",
        model__embedding_tables=[*tables, {"name": "d", "num_embeddings": "dynamic"}],
        data__rows=10**7,
    )
    found = similar_jobs(new, [_run(old, 3)], NOW, 7 * DAY)
    assert found.found
    d = found.neighbours[0].distance
    assert 0.0 < d < SimilarConfig().max_distance
    plan = Planner(new).initial_plan([_run(old, 3)], NOW)
    base = Planner(old).initial_plan([_run(old, 3)], NOW)
    assert plan.ps.resources.memory_mib > base.ps.resources.memory_mib
    assert any(re.match(r"PS memory × 1\.\d\d: this spec expects", r) for r in plan.reasons)


def test_too_distant_falls_back_to_the_cold_start_and_says_so() -> None:
    far = make_spec(
        signature__model="far",
        training__batch_size=4096,
        model__embedding_dim=128,
        model__dense_arch=[256, 128],
        quota__cpu=64,
    )
    plan = Planner(far).initial_plan([_run(OLD, 5)], NOW)
    assert plan.stage is Stage.COLD_START
    note = next(r for r in plan.reasons if r.startswith("no similar job near enough"))
    m = re.search(r"test/m1/synthetic, is at distance ([0-9.]+) > 0\.3", note)
    assert m and float(m.group(1)) > 0.3


def test_another_strategy_is_no_neighbour() -> None:
    ar = make_spec(signature__model="m1-ar", strategy="allreduce")
    plan = Planner(ar).initial_plan([_run(OLD, 5)], NOW)
    assert plan.stage is Stage.COLD_START
    assert any("of another strategy/architecture/data source" in r for r in plan.reasons)


def test_records_without_features_are_not_candidates() -> None:
    new = make_spec(signature__model="m1-v2")
    recs = [_run(OLD, 5, with_spec=False)]
    assert record_features(recs[0]) is None
    with_none = Planner(new).initial_plan(recs, NOW)
    empty = Planner(new).initial_plan((), NOW)
    assert with_none == empty


def test_runs_outside_the_window_or_failed_are_not_candidates() -> None:
    new = make_spec(signature__model="m1-v2")
    old = _run(OLD, 5)
    stale = HistoryRecord(**{**old.__dict__, "finished_at_s": NOW - 30 * DAY})
    failed = HistoryRecord(**{**old.__dict__, "succeeded": False})
    assert not similar_jobs(new, [stale, failed], NOW, 7 * DAY).found


def test_similar_none_plans_as_before() -> None:
    new = make_spec(signature__model="m1-v2")
    off = Planner(new, similar=None).initial_plan([_run(OLD, 5)], NOW)
    assert off == Planner(new).initial_plan((), NOW)


def test_features_round_trip_and_the_nearest_come_first() -> None:
    f = job_features(OLD)
    assert JobFeatures.from_dict(f.to_dict()) == f
    near = make_spec(signature__model="n", data__rows=2 * OLD.data.rows)
    far = make_spec(signature__model="f", training__batch_size=64, quota__cpu=40)
    pool = [(_run(far, 1), job_features(far)), (_run(near, 2), job_features(near))]
    for scaling in ("log2", "standard"):
        ranked = nearest(f, pool, SimilarConfig(scaling=scaling))
        assert [s for s, _ in ranked] == ["test/n/synthetic", "test/f/synthetic"]
    # twice the data: one feature of 13 doubled, about 1/sqrt(13)
    assert nearest(f, pool)[0][1] == pytest.approx(13**-0.5, abs=0.03)


def test_importing_the_planner_does_not_import_sklearn() -> None:
    code = (
        "import sys, dlrover_core.planner.planner, dlrover_core.runtime.controller;"
        "assert 'sklearn' not in sys.modules, 'sklearn imported at start-up'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_plan_of_a_renamed_small_job_learns_from_the_store(tmp_path: Path) -> None:
    """The issue's case: after runs of small.yaml, the same job under a new model name."""
    pytest.importorskip("sqlalchemy")
    from dlrover_core import api
    from dlrover_core.history.store import HistoryStore

    url = f"sqlite:///{tmp_path}/h.db"
    small = ROOT / "pipelines/specs/small.yaml"
    spec = api.resolve_spec(str(small))
    with HistoryStore(url) as st:
        for i in range(2):
            st.record_run(
                spec_to_dict(spec),
                spec.signature_key,
                {"state": "succeeded", "wall_s": 60, "throughput_sps": 2000.0},
                make_plan((2, 500, 1536), (1, 500, 1024)),
                [],
                {"worker_cpu_used_millicores": 450, "ps_memory_used_mib": 700},
                finished_at_s=time.time() - 100 * (i + 1),
            )
    out = api.plan(str(small), overrides=["signature.model=dlrm-small-v2"], history=url)
    assert out["stage"] == "warm_start"
    assert out["history"]["records"] == 0 and out["history"]["similar_records"] == 2
    assert (
        "example-retrain/dlrm-small/synthetic-criteo (distance 0.00; runs 2, 1)"
        in (out["reasons"][0])
    )
    same = api.plan(str(small), history=url)  # its own signature: no similar read
    assert "similar_records" not in same["history"]
    assert same["reasons"][0].startswith("warm start from 2 similar run(s)")
