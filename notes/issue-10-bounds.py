"""Issue 10, session 14: how much of dlrover-rm's per-core gap each planner stage holds.

    python notes/issue-10-bounds.py [--seed 0] [--jobs 300]

Three measurements on one generated trace (dlrover-rm only, the table's per-core figure:
the median over completed jobs of samples per allocated core-second / the oracle's):

1. The objective on the truth: for every first run, the configuration of the oracle's grid
   that maximises the planner's objective (log X - min_elasticity·log cost) with the true
   throughput, against the oracle's configuration. Per-core ~1.0 here means the objective
   is not what loses per-core; the model and the stages before it are.
2. Upper bounds: dlrover-rm rerun with the plans of chosen stages replaced, as the engine
   applies them, by the oracle's configuration (all of it, or only its PS or its workers).
   What the per-core figure would be if those stages chose perfectly and nothing else
   changed (a first plan that does not fit the cluster at once starts as the job's own).
   This patches ``Engine._apply`` in this process only (a diagnostic, not a policy).
3. The warm starts of re-runs: how many start on one PS while the oracle uses more, and how
   many first runs ever varied the PS count (by first-run duration).
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.planner.config import PlannerConfig
from dlrover_core.sim import engine as E
from dlrover_core.sim import truth as T
from dlrover_core.sim.runner import _oracle_of_job, run_policy
from dlrover_core.sim.trace import TraceJob, generate_trace
from dlrover_core.types import NodeResources, ResourcePlan, RolePlan

_ORIGINAL_APPLY = E.Engine._apply


def _truth_grid(job: TraceJob) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """True throughput, cores, memory and the quota mask on the oracle's grid (W, Lw, P, Lp),
    the same arithmetic as ``JobTruth.oracle_config``."""
    t = job.truth
    w, p, lv = T._ORACLE_W, T._ORACLE_P, T._ORACLE_CPU
    wmem = np.ceil(t.worker_memory_mib * T.MEMORY_MARGIN)
    pmem = np.array(
        [np.ceil(float(t.ps_memory_used(int(pi), t.samples_total).max()) * 1.1) for pi in p]
    )
    maxs = np.array([t.max_share(int(pi)) for pi in p])
    xw = (w[:, None] * np.asarray(t.eff_worker(lv))[None, :]) / t.c_w
    xps = np.asarray(t.eff_ps(lv))[None, :] / (t.c_p * maxs[:, None])
    xnet = t.ps_bandwidth_bps / (t.net_bytes_per_sample * maxs)
    k = t.smooth_k
    inv = (
        (np.maximum(xw, 1e-12) ** -k)[:, :, None, None]
        + (np.maximum(xps, 1e-12) ** -k)[None, None, :, :]
        + (xnet**-k)[None, None, :, None]
    )
    x = inv ** (-1.0 / k)
    cores = T._ORACLE_CORES
    mem = np.broadcast_to(
        (w * wmem)[:, None, None, None] + (p * pmem)[None, None, :, None], x.shape
    )
    ok = (cores <= job.quota.cpu_cores + 1e-9) & (mem <= job.quota.memory_mib)
    return x, cores, mem, ok


def objective_on_truth(jobs: list[TraceJob]) -> None:
    cfg = PlannerConfig()
    ratios = []
    for job in jobs:
        if not job.name.endswith("-r0"):
            continue
        o = _oracle_of_job(job)
        x, cores, mem, ok = _truth_grid(job)
        j = np.log(x) - cfg.min_elasticity * np.log(cores + mem / 1024 / cfg.memory_gib_per_core)
        j[~ok] = -np.inf
        i = int(np.argmax(j))
        ratios.append(
            (x.flat[i] / cores.flat[i] / o.throughput_per_core, x.flat[i] / o.throughput_sps)
        )
    a = np.array(ratios)
    print(f"1. objective on the truth, {len(a)} first runs (p10 / median):")
    print(f"   per-core / oracle's {np.percentile(a[:, 0], 10):.3f} / {np.median(a[:, 0]):.3f}")
    print(f"   speed / oracle's    {np.percentile(a[:, 1], 10):.3f} / {np.median(a[:, 1]):.3f}")


def _oracle_plan(job: TraceJob, plan: ResourcePlan, part: str) -> ResourcePlan:
    o = _oracle_of_job(job)
    workers, ps = plan.workers, plan.ps
    if part in ("both", "workers"):
        mem = max(o.worker_memory_mib, workers.resources.memory_mib)
        workers = RolePlan(o.workers, NodeResources(int(o.worker_cpu_cores * 1000), mem))
    if part in ("both", "ps"):
        mem = max(o.ps_memory_mib, ps.resources.memory_mib if ps.count == o.ps else 0)
        ps = RolePlan(o.ps, NodeResources(int(o.ps_cpu_cores * 1000), mem))
    return plan.replace(workers=workers, ps=ps)


def _with_apply(
    hook: Callable[..., Any] | None, run: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    E.Engine._apply = hook or _ORIGINAL_APPLY  # type: ignore[method-assign]
    try:
        return run()
    finally:
        E.Engine._apply = _ORIGINAL_APPLY  # type: ignore[method-assign]


def bounds(jobs: list[TraceJob], seed: int) -> None:
    print("2. per-core / oracle's with some stages' plans replaced by the oracle's configuration:")
    cases = [
        ((), "both"),
        (("scaling",), "both"),
        (("warm_start",), "ps"),
        (("warm_start",), "workers"),
        (("warm_start",), "both"),
        (("warm_start", "scaling"), "both"),
    ]
    for stages, part in cases:

        def hook(self: E.Engine, r: Any, plan: ResourcePlan, t: float, st=stages, pt=part) -> Any:
            if plan.stage.value in st:
                ok = _ORIGINAL_APPLY(self, r, _oracle_plan(r.job, plan, pt), t)
                if ok or r.plan is not None:
                    return ok
                r.pending_plan = None  # the first plan must start: the job's own, then
            return _ORIGINAL_APPLY(self, r, plan, t)

        m = _with_apply(hook if stages else None, lambda: run_policy(jobs, "dlrover-rm", seed))
        label = "as is" if not stages else f"{'+'.join(stages)} ({part})"
        print(
            f"   {label:<30} {m['oracle_throughput_ratio']:.3f}   JCT median/mean/p90 "
            f"{m['jct_median_s'] / 60:.0f}/{m['jct_mean_s'] / 60:.0f}/{m['jct_p90_s'] / 60:.0f} min"
        )


def warm_starts(jobs: list[TraceJob], seed: int) -> None:
    applied: dict[str, list[ResourcePlan]] = collections.defaultdict(list)

    def hook(self: E.Engine, r: Any, plan: ResourcePlan, t: float) -> Any:
        applied[r.job.name].append(plan)
        return _ORIGINAL_APPLY(self, r, plan, t)

    m = _with_apply(hook, lambda: run_policy(jobs, "dlrover-rm", seed))
    done = {j["name"]: j for j in m["jobs"] if j["status"] == "completed"}
    one_ps = more = 0
    for job in jobs:
        if job.name.endswith("-r0") or job.name not in done or not applied[job.name]:
            continue
        first = applied[job.name][0]
        o = _oracle_of_job(job)
        more += o.ps > 1
        one_ps += first.ps.count == 1 and o.ps > 1
    print(f"3. re-runs warm-started on 1 PS where the oracle uses more: {one_ps} of {more}")
    rows = []
    for job in jobs:
        if job.name.endswith("-r0") and job.name in done and applied[job.name]:
            d = done[job.name]
            rows.append(
                (len({p.ps.count for p in applied[job.name]}) > 1, (d["end_s"] - d["start_s"]) / 60)
            )
    a = np.array(rows, dtype=float)
    for lo, hi in ((0, 40), (40, 80), (80, float("inf"))):
        s = a[(a[:, 1] >= lo) & (a[:, 1] < hi)]
        if len(s):
            print(
                f"   first runs of {lo}-{hi:g} min that varied the PS count: "
                f"{s[:, 0].mean():.2f} (n={len(s)})"
            )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=300)
    a = ap.parse_args()
    jobs = generate_trace(a.jobs, a.seed)
    print(f"dlrover-rm, {a.jobs} jobs, seed {a.seed}")
    objective_on_truth(jobs)
    bounds(jobs, a.seed)
    warm_starts(jobs, a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
