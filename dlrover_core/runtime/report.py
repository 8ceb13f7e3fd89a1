"""The end-of-run report: ``report.json`` (the figures) and ``report.png`` (throughput and
allocated vs used CPU and memory over time, plan changes and faults marked)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from dlrover_core.runtime.files import atomic_write_json
from dlrover_core.runtime.state import MasterState
from dlrover_core.spec import JobSpec
from dlrover_core.units import cores, gib

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


def _span_rate(timeline: list[dict[str, Any]]) -> float:
    """Samples/s over the timeline's span: for a job too short for any worker to report a
    measured rate (its samples came between two observations), not a 0/s that never was."""
    rows = [r for r in timeline if "samples_done" in r and "t" in r]
    if len(rows) < 2 or rows[-1]["t"] <= rows[0]["t"]:
        return 0.0
    return max(
        0.0, (rows[-1]["samples_done"] - rows[0]["samples_done"]) / (rows[-1]["t"] - rows[0]["t"])
    )


SETTLED_SHARE = 0.4  # a change's settled speed: the last 40 % of its span


def change_kind(before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    """What a plan change changed, as the planner prices it: ``ps`` (the PS set: its size or
    its nodes) or ``worker`` (workers only, or nothing it can see)."""
    if before is not None and before.get("ps") != after.get("ps"):
        return "ps"
    return "worker"


def plan_change_costs(
    plan_times: list[float | None],
    timeline: list[dict[str, Any]],
    kinds: list[str] | None = None,
) -> list[dict[str, Any]]:
    """What each plan change after the first cost the job, from the timeline (samples done
    against time), as the planner prices a change: a pause, then the new speed. For change
    k at t_k, until the next change (the last one: until 90 % of the job's final samples,
    before the last shards' tail): ``speed_after_sps`` over the span's last
    ``SETTLED_SHARE``; ``lost_s`` the span minus the time its samples would take at that
    speed; ``stall_s`` the longest stretch in the span with no sample done;
    ``speed_before_sps`` the previous configuration's settled speed; ``kind`` (``kinds[k]``:
    see :func:`change_kind`) what it changed. A figure that cannot be measured (too short a
    span, no progress) is None."""
    rows = sorted(
        (float(r["t"]), float(r["samples_done"]))
        for r in timeline
        if isinstance(r.get("t"), (int, float)) and isinstance(r.get("samples_done"), (int, float))
    )
    out: list[dict[str, Any]] = []
    if len(rows) < 2:
        return out
    ts, ds = (np.array(col) for col in zip(*rows, strict=True))

    def done_at(t: float) -> float:
        """Samples done at ``t``, linear between the timeline's rows."""
        return float(np.interp(t, ts, ds))

    tail = float(ts[int(np.argmax(ds >= 0.9 * ds[-1]))])
    kept = [
        (float(t), kinds[i] if kinds is not None and i < len(kinds) else None)
        for i, t in enumerate(plan_times)
        if t is not None
    ]
    times, kind_of = [t for t, _ in kept], [k for _, k in kept]

    def settled(a: float, b: float) -> float | None:
        lo = b - SETTLED_SHARE * (b - a)
        if b - lo <= 0:
            return None
        rate = (done_at(b) - done_at(lo)) / (b - lo)
        return rate if rate > 0 else None

    for k in range(1, len(times)):
        t_c = times[k]
        t_n = times[k + 1] if k + 1 < len(times) else max(tail, t_c)
        after, before = settled(t_c, t_n), settled(times[k - 1], t_c)
        lost = None
        if after is not None:
            lost = (t_n - t_c) - (done_at(t_n) - done_at(t_c)) / after
        # only the rows of the span (t_c, t_n]: the spans follow each other, so all the
        # changes together read the timeline once
        stall, last_t, last_s = 0.0, t_c, done_at(t_c)
        i, j = np.searchsorted(ts, t_c, side="right"), np.searchsorted(ts, t_n, side="right")
        for t, done in zip(ts[i:j].tolist(), ds[i:j].tolist(), strict=True):
            if done > last_s:
                last_t, last_s = t, done
            stall = max(stall, t - last_t)
        out.append(
            {
                "time_s": t_c,
                "kind": kind_of[k],
                "speed_before_sps": before,
                "speed_after_sps": after,
                "lost_s": lost,
                "stall_s": stall if t_n > t_c else None,
            }
        )
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
    model_choice: dict[str, Any] | None = None,
    stop_flush: dict[str, Any] | None = None,
    strategy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``stop_flush``: what a clean stop kept for the resume, and how long it took.
    ``model_choice``: the planner's model-form choice (``Planner.model_choice``), which
    the history keeps for the job's next run. ``strategy``: the strategy's contribution
    (``Strategy.report``: e.g. its PS-set change or resize downtimes)."""
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
        "throughput_sps": sum(tputs) / len(tputs) if tputs else _span_rate(timeline),
        "wall_s": wall_s,
        "auc": auc,
        "cpu_util": sum(r["used_cpu_m"] for r in timeline) / alloc_cpu if alloc_cpu else None,
        "mem_util": sum(r["used_mem_mib"] for r in timeline) / alloc_mem if alloc_mem else None,
        "master_starts": state.master_starts,
        "plans": [
            {
                "stage": p.get("stage"),
                "action": p.get("action") or None,  # the stage-3 rule that made it, if any
                "time_s": p.get("time_s"),
                "reasons": p.get("reasons", []),
                "workers": p.get("workers"),
                "ps": p.get("ps"),
            }
            for p in state.plans
        ],
        "faults": list(state.faults),
        "planner_errors": list(state.planner_errors),
        # what each plan change cost in progress (a pause, then the new speed): the figure
        # the planner's worker_change_pause_s / ps_change_pause_s stand for
        "plan_changes": plan_change_costs(
            [p.get("time_s") for p in state.plans],
            timeline,
            [change_kind(a, b) for a, b in zip([None, *state.plans], state.plans, strict=False)],
        ),
        "model_choice": model_choice,
        "stop_flush": stop_flush,
        "launches": list(launches or []),
        "first_shard_taken_s": _first_takes(state),
        "registered_at_s": {
            f"{r.role.value}-{r.node_id}": r.registered_at_s
            for r in state.nodes.values()
            if r.registered_at_s is not None
        },
        **(strategy or {}),
    }
    report = json_safe(report)
    atomic_write_json(run_dir / "report.json", report)
    plot_report(run_dir, timeline, report)
    return report


def json_safe(v: Any) -> Any:
    """``v`` with every NaN or infinity replaced by None (``report.json`` stays valid JSON:
    ``json.dumps`` would write ``NaN``, which JSON parsers reject)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def _write(run_dir: Path, report: dict[str, Any]) -> None:
    path = run_dir / "report.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)


def amend_report(run_dir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Add ``extra`` (the data scan, the exported model) to the ``report.json`` the master
    wrote; returns the whole report."""
    path = run_dir / "report.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        report = {}
    if not isinstance(report, dict):
        report = {}
    report.update(json_safe(extra))
    _write(run_dir, report)
    return report


def failed_report(
    run_dir: Path, spec: JobSpec, failure: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The report of a job that failed before it started (e.g. unusable data): state failed,
    the reason, nothing trained. Written to ``run_dir/report.json``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "job": spec.name,
        "signature": spec.signature_key,
        "state": "failed",
        "stopped": None,
        "failure": failure,
        "finished_unix": time.time(),
        "samples_total": 0,
        "samples_done": 0,
        "shards_total": 0,
        "shards_done": 0,
        "shards_failed": 0,
        "shards_completed_twice": 0,
        "shards_lost": 0,
        "samples_retrained": 0,
        "throughput_sps": 0.0,
        "wall_s": 0.0,
        "auc": None,
        "cpu_util": None,
        "mem_util": None,
        "plans": [],
        "faults": [],
        "planner_errors": [],
        "launches": [],
        **(extra or {}),
    }
    report = json_safe(report)
    _write(run_dir, report)
    return report


def done_rate(timeline: list[dict[str, Any]], window_s: float = 10.0) -> list[float]:
    """Samples/s of shards counted done, over the last ``window_s`` before each timeline point
    (moves with every shard, where the workers' own reports come every heartbeat)."""
    out: list[float] = []
    j = 0
    for i, r in enumerate(timeline):
        while j < i and r["t"] - timeline[j]["t"] > window_s:
            j += 1
        dt = r["t"] - timeline[j]["t"]
        dn = r.get("samples_done", 0) - timeline[j].get("samples_done", 0)
        out.append(max(0.0, dn / dt) if dt > 0 else 0.0)
    return out


def plot_report(run_dir: Path, timeline: list[dict[str, Any]], report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True)
    t0 = timeline[0]["t"] if timeline else 0.0
    t = [r["t"] - t0 for r in timeline]
    auc = report.get("auc")
    title = f"{report['job']}: {report['state']}" + (
        f", AUC {auc:.3f}" if isinstance(auc, (int, float)) else ", no AUC"
    )
    axes[0].plot(t, done_rate(timeline), color="tab:blue", label="from shards done (10 s window)")
    axes[0].plot(
        t,
        [r["throughput_sps"] for r in timeline],
        color="tab:cyan",
        linestyle=":",
        label="workers' reports (every heartbeat)",
    )
    axes[0].set_ylabel("samples/s")
    axes[0].set_title(title)
    axes[1].plot(t, [cores(r["alloc_cpu_m"]) for r in timeline], label="allocated")
    axes[1].plot(t, [cores(r["used_cpu_m"]) for r in timeline], label="used")
    axes[1].set_ylabel("CPU (cores)")
    axes[2].plot(t, [gib(r["alloc_mem_mib"]) for r in timeline], label="allocated")
    axes[2].plot(t, [gib(r["used_mem_mib"]) for r in timeline], label="used")
    axes[2].set_ylabel("memory (GiB)")
    axes[2].set_xlabel("time since the master started (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    for p in report["plans"]:
        if p.get("time_s") is None:
            continue
        for ax in axes:
            ax.axvline(p["time_s"] - t0, color="tab:green", alpha=0.5, linestyle="--")
        axes[0].annotate(
            str(p.get("stage", "")),
            (p["time_s"] - t0, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            rotation=90,
            va="top",
            ha="left",
            fontsize=8,
            color="tab:green",
        )
    for f in report["faults"]:
        for ax in axes:
            ax.axvline(f["time_s"] - t0, color="tab:red", alpha=0.6)
        axes[1].annotate(
            f"{f.get('node', '')} {f.get('exit_class', '')}".strip(),
            (f["time_s"] - t0, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            rotation=90,
            va="top",
            ha="left",
            fontsize=8,
            color="tab:red",
        )
    from matplotlib.lines import Line2D

    marks = [
        Line2D([], [], color="tab:green", linestyle="--", label="new plan"),
        Line2D([], [], color="tab:red", label="fault"),
    ]
    for i, ax in enumerate(axes):
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + (marks if i == 0 else []), loc="best", fontsize=8)
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
