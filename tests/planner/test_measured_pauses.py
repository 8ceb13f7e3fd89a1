"""Plan changes priced at what they cost: each run stores what its changes lost by kind
(report.plan_changes -> the history's extra["pauses"]); the next run's planner prices its
changes with the median of similar runs' measurements instead of the constants, unless the
spec sets the pause; too few measurements keep the constants."""

from __future__ import annotations

from pathlib import Path

from dlrover_core.history.store import HistoryStore, measured_pauses
from dlrover_core.planner import Planner
from dlrover_core.spec import spec_to_dict
from dlrover_core.types import HistoryRecord
from tests.factories import make_plan, make_spec


def record(spec_sig: str, pauses: dict[str, list[float]], t: float = 1000.0) -> HistoryRecord:
    return HistoryRecord(spec_sig, t, make_plan(), extra={"pauses": pauses})


def test_measured_pauses_by_kind_skip_what_was_not_measured() -> None:
    changes = [
        {"kind": "ps", "lost_s": 40.5},
        {"kind": "worker", "lost_s": 3.2},
        {"kind": "worker", "lost_s": None},
        {"kind": "worker", "lost_s": -0.4},  # faster right away: it cost nothing
        {"kind": None, "lost_s": 9.0},
    ]
    assert measured_pauses(changes) == {"ps": [40.5], "worker": [3.2, 0.0]}


def test_the_planner_learns_the_pauses_of_similar_runs() -> None:
    spec = make_spec()
    sig = spec.signature_key
    history = [record(sig, {"worker": [4.0, 6.0], "ps": [50.0]}),
               record(sig, {"worker": [5.0], "ps": [70.0]}, t=1100.0)]  # fmt: skip
    p = Planner(spec)
    default_ps = p.config.ps_change_pause_s
    notes = p.learn_pauses(history, now_s=1200.0)
    assert p.config.worker_change_pause_s == 5.0 and p.config.ps_change_pause_s == 60.0
    assert default_ps != 60.0 and len(notes) == 2 and "3 change(s)" in notes[0]
    # another signature's runs teach nothing; one measurement is too few
    other = Planner(spec)
    assert other.learn_pauses([record("x/y/z", {"worker": [4.0, 6.0]})], 1200.0) == []
    assert other.learn_pauses([record(sig, {"ps": [10.0]})], 1200.0) == []
    assert other.config.ps_change_pause_s == default_ps


def test_the_spec_sets_the_pause_and_wins() -> None:
    spec = make_spec(planner={"worker_change_pause_s": 12.0})
    p = Planner(spec)
    notes = p.learn_pauses([record(spec.signature_key, {"worker": [1.0, 2.0, 3.0]})], 1200.0)
    assert p.config.worker_change_pause_s == 12.0 and notes == []


def test_a_run_stores_its_pauses_and_the_next_reads_them(tmp_path: Path) -> None:
    spec = make_spec()
    url = f"sqlite:///{tmp_path / 'h.db'}"
    report = {"state": "succeeded", "wall_s": 10.0, "job": spec.name,
              "plan_changes": [{"kind": "worker", "lost_s": 2.5},
                               {"kind": "worker", "lost_s": 3.5}]}  # fmt: skip
    with HistoryStore(url) as store:
        store.record_run(spec_to_dict(spec), spec.signature_key, report, make_plan(), [], {})
        (rec,) = store.similar(spec.signature_key, now_s=1e12, window_s=1e13)
    assert rec.extra["pauses"] == {"worker": [2.5, 3.5]}
    p = Planner(spec)
    p.learn_pauses([rec], now_s=rec.finished_at_s + 1)
    assert p.config.worker_change_pause_s == 3.0
