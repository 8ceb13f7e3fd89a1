"""The end-of-run report: ``report.json`` (the figures) and ``report.png`` (throughput and
allocated vs used CPU and memory over time, plan changes and faults marked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlrover_core.runtime.files import atomic_write_json
from dlrover_core.runtime.state import MasterState
from dlrover_core.spec import JobSpec

TIMELINE_FILE = "timeline.jsonl"


def read_timeline(run_dir: Path) -> list[dict[str, Any]]:
    p = run_dir / TIMELINE_FILE
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: skip it
    return out


def write_report(
    run_dir: Path,
    state: MasterState,
    spec: JobSpec,
    *,
    auc: float | None,
    failure: str | None,
    wall_s: float,
    launches: list[dict[str, Any]] | None = None,
    stopped: str | None = None,
) -> dict[str, Any]:
    q = state.shards
    counts = q.counts()
    timeline = read_timeline(run_dir)
    tputs = [r["throughput_sps"] for r in timeline if r.get("throughput_sps", 0) > 0]
    alloc_cpu = sum(r["alloc_cpu_m"] for r in timeline)
    alloc_mem = sum(r["alloc_mem_mib"] for r in timeline)
    report: dict[str, Any] = {
        "job": spec.name,
        "signature": spec.signature_key,
        "state": "failed" if failure is not None else ("stopped" if stopped else "succeeded"),
        "stopped": stopped,
        "failure": failure,
        "reason": failure or stopped,
        "samples_total": q.samples_total,
        "samples_done": q.samples_done,
        "shards_total": counts["total"],
        "shards_done": counts["done"],
        "shards_failed": counts["failed"],
        "shards_completed_twice": q.completed_twice,
        "shards_lost": q.lost,
        "shards_replayed": q.replayed,
        "samples_retrained": q.samples_retrained,
        "throughput_sps": sum(tputs) / len(tputs) if tputs else 0.0,
        "wall_s": wall_s,
        "auc": auc,
        "cpu_util": sum(r["used_cpu_m"] for r in timeline) / alloc_cpu if alloc_cpu else None,
        "mem_util": sum(r["used_mem_mib"] for r in timeline) / alloc_mem if alloc_mem else None,
        "master_starts": state.master_starts,
        "plans": [
            {
                "stage": p.get("stage"),
                "time_s": p.get("time_s"),
                "reasons": p.get("reasons", []),
                "workers": p.get("workers"),
                "ps": p.get("ps"),
            }
            for p in state.plans
        ],
        "faults": list(state.faults),
        "launches": list(launches or []),
        "first_shard_taken_s": _first_takes(state),
        "registered_at_s": {
            f"{r.role.value}-{r.node_id}": r.registered_at_s
            for r in state.nodes.values()
            if r.registered_at_s is not None
        },
    }
    atomic_write_json(run_dir / "report.json", report)
    plot_report(run_dir, timeline, report)
    return report


def plot_report(run_dir: Path, timeline: list[dict[str, Any]], report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    t0 = timeline[0]["t"] if timeline else 0.0
    t = [r["t"] - t0 for r in timeline]
    axes[0].plot(t, [r["throughput_sps"] for r in timeline], color="tab:blue")
    axes[0].set_ylabel("samples/s")
    axes[0].set_title(
        f"{report['job']}: {report['state']}, AUC {report['auc'] or float('nan'):.3f}"
    )
    axes[1].plot(t, [r["alloc_cpu_m"] / 1000 for r in timeline], label="allocated")
    axes[1].plot(t, [r["used_cpu_m"] / 1000 for r in timeline], label="used")
    axes[1].set_ylabel("CPU (cores)")
    axes[1].legend(loc="upper right")
    axes[2].plot(t, [r["alloc_mem_mib"] / 1024 for r in timeline], label="allocated")
    axes[2].plot(t, [r["used_mem_mib"] / 1024 for r in timeline], label="used")
    axes[2].set_ylabel("memory (GiB)")
    axes[2].set_xlabel("time (s)")
    axes[2].legend(loc="upper right")
    for p in report["plans"]:
        if p.get("time_s") is None:
            continue
        for ax in axes:
            ax.axvline(p["time_s"] - t0, color="tab:green", alpha=0.4, linestyle="--")
    for f in report["faults"]:
        for ax in axes:
            ax.axvline(f["time_s"] - t0, color="tab:red", alpha=0.6)
    fig.tight_layout()
    fig.savefig(run_dir / "report.png", dpi=80)
    plt.close(fig)


def _first_takes(state: MasterState) -> dict[str, float]:
    """When each worker took its first shard (for the elasticity check)."""
    import sqlite3

    con = sqlite3.connect(state.shards.path)
    try:
        rows = con.execute(
            "SELECT done_by, MIN(taken_at) FROM shards WHERE done_by IS NOT NULL GROUP BY done_by"
        ).fetchall()
    finally:
        con.close()
    return {f"worker-{w}": float(t) for w, t in rows if t is not None}
