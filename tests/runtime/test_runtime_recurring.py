"""A recurring job: the second run warm-starts from the first run's history (its final
configuration and its speed samples) and needs fewer plan changes. Real processes; slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_core import api

pytestmark = pytest.mark.slow
SMALL = str(Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml")


def test_second_run_warm_starts_and_changes_less(tmp_path: Path) -> None:
    over = [
        "data.rows=600000",
        "pacing.sample_window_s=1.0",
        "pacing.min_speed_samples=2",
        "pacing.replan_interval_s=3",
        "pacing.heartbeat_interval_s=0.5",
        f"history.url=sqlite:///{tmp_path / 'history.db'}",
    ]
    first = api.train(SMALL, overrides=over, run_dir=tmp_path / "r1", progress=False)
    second = api.train(SMALL, overrides=over, run_dir=tmp_path / "r2", progress=False)
    assert first["state"] == second["state"] == "succeeded"
    assert first["history_run_id"] is not None and second["history_run_id"] is not None
    assert first["plans"][0]["stage"] == "cold_start"
    assert second["plans"][0]["stage"] == "warm_start"
    assert "warm start from 1 similar run" in second["plans"][0]["reasons"][0]

    # configurations the first run measured are not sampled again (total plan counts also
    # include hot-PS moves and deceleration reverts, which depend on load: the demo measured
    # 8 plans for the first run and 3 for the second on an idle machine)
    def sampled(r: dict) -> int:
        return sum(p["stage"] == "sampling" for p in r["plans"])

    # (the cost-aware planner does not sample a job this short: sampling cannot pay back its
    # pauses, so the cold run may sample nothing; the warm run must never sample more)
    assert sampled(second) <= sampled(first), (first["plans"], second["plans"])

    # the planner's model-form choice goes into the report and the history (None until it
    # cross-validated one: from 3 measured configurations), where the next run reads it
    from dlrover_core.history.store import HistoryStore

    assert "model_choice" in first and "model_choice" in second
    with HistoryStore(f"sqlite:///{tmp_path / 'history.db'}") as store:
        recs = store.similar(first["signature"], 1e12, 1e12)
    kept = [r.extra.get("model_choice") for r in recs]
    assert kept == [first["model_choice"], second["model_choice"]]
