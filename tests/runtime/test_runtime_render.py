"""Markdown and HTML views of plans and reports (what the KFP UI shows): hand-made reports
whose every line can be checked, escaping of what a reason or path may hold, a missing PNG."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import matplotlib

from dlrover_core.runtime.render import plan_markdown, report_html, report_markdown
from dlrover_core.runtime.report import _span_rate, plan_change_costs

matplotlib.use("Agg")


def make_report(**kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "job": "ctr",
        "signature": "pipe/dlrm/ctr",
        "state": "succeeded",
        "failure": None,
        "stopped": None,
        "reason": None,
        "auc": 0.712345,
        "samples_done": 40000,
        "samples_total": 40000,
        "shards_done": 16,
        "shards_total": 16,
        "shards_failed": 0,
        "shards_completed_twice": 0,
        "shards_lost": 0,
        "shards_replayed": 2,
        "throughput_sps": 2500.0,
        "wall_s": 20.0,
        "cpu_util": 0.5,
        "mem_util": 0.25,
        "master_starts": 1,
        "plans": [
            {
                "stage": "cold_start",
                "time_s": 100.0,
                "reasons": ["cold start: no history", "PS memory sized for ~600 MiB"],
                "workers": {"count": 1, "cpu_millicores": 500, "memory_mib": 1024},
                "ps": {"count": 1, "cpu_millicores": 500, "memory_mib": 1536},
            },
            {
                "stage": "scaling",
                "time_s": 130.5,
                "reasons": ["model predicts 1.8x with 2 workers | 1 PS"],
                "workers": {"count": 2, "cpu_millicores": 1500, "memory_mib": 2048},
                "ps": {"count": 1, "cpu_millicores": 500, "memory_mib": 1536},
            },
        ],
        "faults": [
            {
                "time_s": 140.0,
                "node": "worker-1",
                "exit_class": "oom",
                "action": "relaunch",
                "why": "OOMKilled; relaunch with 3Gi",
            }
        ],
        "model_held_out": {"auc": 0.712345, "logloss": 0.5432, "rows": 2000},
    }
    r.update(kw)
    return r


def test_report_markdown_holds_the_figures_the_stages_and_the_reasons() -> None:
    md = report_markdown(make_report())
    assert md.startswith("# ctr: succeeded\n\npipe/dlrm/ctr\n")
    for line in (
        "| held-out AUC | 0.7123 |",
        "| samples | 40,000 / 40,000 |",
        "| shards | 16 / 16 done (failed 0, twice 0, lost 0, replayed 2) |",
        "| wall time | 20.0 s |",
        "| CPU used / allocated | 50.0 % |",
        "| memory used / allocated | 25.0 % |",
        "| faults | 1 |",
        "| exported model | AUC 0.7123, log loss 0.5432 on 2,000 held-out rows |",
        "| 1 | +0.0 s | cold_start | 1 × 500m CPU / 1Gi | 1 × 500m CPU / 1536Mi |",
        "| 2 | +30.5 s | scaling | 2 × 1500m CPU / 2Gi | 1 × 500m CPU / 1536Mi |",
        "### Why plan 1 (cold_start)",
        "- cold start: no history",
        "### Why plan 2 (scaling)",
        "- model predicts 1.8x with 2 workers | 1 PS",  # a list item keeps its pipe
        "| +40.0 s | worker-1 | oom | relaunch | OOMKilled; relaunch with 3Gi |",
    ):
        assert line in md, line
    assert "2,500 samples/s; samples / wall time: 2,000 samples/s" in md


def test_a_failed_report_says_why_and_pipes_in_cells_are_escaped() -> None:
    r = make_report(
        state="failed",
        failure="worker-0: fatal | exit 1",
        reason="worker-0: fatal | exit 1",
        auc=float("nan"),
        throughput_sps=0.0,
        model_held_out=None,
        plans=[],
        faults=[],
        data={
            "complete": False,
            "files": [
                {
                    "path": "/d/a|b.tsv",
                    "records": 0,
                    "malformed": 500,
                    "held_out_records": 0,
                    "held_out_malformed": 3,
                    "first_malformed": 1,
                }
            ],
        },
    )
    md = report_markdown(r)
    assert md.startswith("# ctr: failed")
    assert "**Failure:** worker-0: fatal | exit 1" in md
    assert "| held-out AUC | n/a |" in md
    assert "not measured (no worker reported a rate before the end)" in md
    assert "## Data (the first rows of each part (bounded))" in md
    assert "| /d/a\\|b.tsv | 0 | 503 | 0 | 1 |" in md
    assert "Plans" not in md and "Faults" not in md


def test_report_html_embeds_the_png_and_escapes_text(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    png = tmp_path / "report.png"
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    fig.savefig(png, dpi=40)
    plt.close(fig)
    r = make_report()
    r["plans"][0]["reasons"] = ["<script>alert(1)</script> & more"]
    page = report_html(r, png)
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    (b64,) = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert base64.b64decode(b64) == png.read_bytes()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "<td>held-out AUC</td><td>0.7123</td>" in page
    assert "<h3>Why plan 2 (scaling)</h3>" in page
    missing = report_html(r, tmp_path / "nope.png")
    assert "data:image/png" not in missing and "no report.png" in missing


def test_plan_markdown() -> None:
    plan = {
        "job": "ctr",
        "signature": "pipe/dlrm/ctr",
        "stage": "warm_start",
        "workers": {"count": 3, "cpu_millicores": 2000, "memory_mib": 4096},
        "ps": {"count": 2, "cpu_millicores": 1000, "memory_mib": 3072},
        "overrides": [
            {
                "role": "worker",
                "node_id": 2,
                "cpu_millicores": 3000,
                "memory_mib": 4096,
                "reason": "hot worker",
            }
        ],
        "reasons": ["warm start from 3 runs", "ps sized to 2.1 GiB"],
        "predicted_throughput_sps": 12345.6,
        "total": {"cpu_millicores": 9000, "memory_mib": 18432},
        "train_step": {"cpu_millicores": 9500, "memory_mib": 19456},
        "history": {"store": "postgresql://u:***@db/h", "records": 3},
    }
    md = plan_markdown(plan)
    for line in (
        "# Plan for ctr: warm_start",
        "| workers | 3 × 2 CPU / 4Gi |",
        "| parameter servers | 2 × 1 CPU / 3Gi |",
        "| total | 9 CPU / 18Gi |",
        "| train step pod (all nodes + the master) | 9500m CPU / 19Gi |",
        "| predicted throughput | 12,346 samples/s |",
        "| history read | postgresql://u:***@db/h (3 matching run(s)) |",
        "| worker-2 | 3 CPU / 4Gi | hot worker |",
        "- warm start from 3 runs",
        "- ps sized to 2.1 GiB",
    ):
        assert line in md, line
    cold = plan_markdown({**plan, "history": {"store": None, "records": 0}, "reasons": []})
    assert "| history read | none (cold start) |" in cold and "- (no reason given)" in cold


def test_done_rate_follows_the_shards_over_a_window() -> None:
    from dlrover_core.runtime.report import done_rate

    tl = [{"t": float(t), "samples_done": n} for t, n in [(0, 0), (1, 0), (2, 500), (3, 1000)]]
    tl += [{"t": 20.0, "samples_done": 1000}]
    # 500 samples a second from t=1 to t=3; over the 10 s window up to t=3: 1000 / 3 s;
    # at t=20 the window (10..20) saw nothing done
    assert done_rate(tl) == [0.0, 0.0, 250.0, 1000 / 3, 0.0]
    assert done_rate(tl, window_s=1.0) == [0.0, 0.0, 500.0, 500.0, 0.0]
    assert done_rate([]) == []


def test_report_png_is_drawn_with_plans_and_faults_marked(tmp_path: Path) -> None:
    from dlrover_core.runtime.report import plot_report

    tl = [
        {"t": 100.0 + i, "throughput_sps": 0.0, "samples_done": 1000 * i, "alloc_cpu_m": 2000,
         "alloc_mem_mib": 4096, "used_cpu_m": 900, "used_mem_mib": 1500}
        for i in range(60)
    ]  # fmt: skip
    plot_report(tmp_path, tl, make_report())
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_a_job_too_short_for_a_measured_rate_reports_its_rate_over_the_timeline() -> None:
    rows = [
        {"t": 100.0, "samples_done": 0, "throughput_sps": 0},
        {"t": 101.0, "samples_done": 7680, "throughput_sps": 0},
        {"t": 104.0, "samples_done": 60000, "throughput_sps": 0},
    ]
    assert _span_rate(rows) == 15000.0
    assert _span_rate(rows[:1]) == 0.0 and _span_rate([]) == 0.0
    assert _span_rate([rows[0], {**rows[0]}]) == 0.0  # no time passed: no rate, not a NaN


def _timeline(segments: list[tuple[float, float]], end: float) -> list[dict[str, Any]]:
    """One row a second; ``segments``: (from time, samples/s) in order, until ``end``."""
    rows, done = [], 0.0
    for t in range(int(end) + 1):
        rows.append({"t": float(t), "samples_done": done})
        rate = next(r for start, r in reversed(segments) if t >= start)
        done += rate
    return rows


def test_plan_change_costs_measure_the_pause_and_the_new_speed() -> None:
    # 100/s, a change at 10 s that stalls 3 s then runs at 50/s, a change at 30 s that runs
    # at 80/s without a stall until the end at 60 s
    rows = _timeline([(0, 100.0), (10, 0.0), (13, 50.0), (30, 80.0)], 60)
    first, second = plan_change_costs([0.0, 10.0, 30.0], rows)
    assert first["time_s"] == 10.0
    assert first["speed_before_sps"] == 100.0 and first["speed_after_sps"] == 50.0
    assert first["lost_s"] == 3.0 and first["stall_s"] == 3.0
    assert second["speed_before_sps"] == 50.0 and second["speed_after_sps"] == 80.0
    assert abs(second["lost_s"]) < 1e-9 and second["stall_s"] == 0.0
    # a change nothing can be measured after: no figure, not a made-up one
    flat = _timeline([(0, 100.0), (5, 0.0)], 20)
    (only,) = plan_change_costs([0.0, 5.0], flat)
    assert only["lost_s"] is None and only["speed_after_sps"] is None
    assert plan_change_costs([0.0, 5.0], []) == [] and plan_change_costs([None, 1.0], rows) == []


def test_the_report_shows_what_each_plan_change_cost() -> None:
    md = report_markdown(
        make_report(plan_changes=[{"time_s": 130.5, "lost_s": 2.25, "stall_s": 1.0}])
    )
    assert "| plan changes: time lost (pause at the new speed) | 2.2 s |" in md
    assert "plan changes" not in report_markdown(make_report())
