"""How much of dlrover-rm's per-core gap to the oracle each planner stage holds (a diagnostic
on the simulator; issue 10, sessions 14-15).

    python benchmarks/sim_bounds.py [--seed 0] [--jobs 300] [--model-forms N | --where]
        [--json OUT]

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
4. ``--model-forms N``: offline, no planner. For the first 40 first runs, N configurations
   drawn at random from the oracle's grid within the quota, measured on the truth with 5 %
   noise, fitted by the planner's model choice (``default_model_factory``) and by the same
   forms with a saturating CPU per node, λ -> κ·(1 - exp(-λ/κ)) for workers and PS, κ
   chosen per role from a small grid by the training error. The objective's best grid point
   of each fit, judged on the truth. Shows what a form that saturates with CPU per node buys
   when the samples vary every input (the planner's own samples mostly do not).
5. ``--where`` (session 15): the oracle's rule blind to the trace's per-PS-count load draws
   (each PS count's hottest share at its expected value), against the oracle's; then
6. where dlrover-rm's per-core figure goes, first runs apart from re-runs: core-seconds
   with no progress, the first and last configurations' true per-core rate, the last with
   its workers right-sized for its PS, and what the jobs under 0.7 have too much of.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.errors import DLRoverError
from dlrover_core.model.selection import default_model_factory
from dlrover_core.model.throughput import PSOverlapThroughputModel
from dlrover_core.planner.config import PlannerConfig
from dlrover_core.sim import engine as E
from dlrover_core.sim import truth as T
from dlrover_core.sim.runner import (
    POLICIES,
    _oracle_of_job,
    cluster_capacity,
    policy_factories,
    run_policy,
)
from dlrover_core.sim.trace import TraceJob, generate_trace
from dlrover_core.types import NodeResources, ResourcePlan, RolePlan, Sample

_ORIGINAL_APPLY = E.Engine._apply


def _truth_grid(job: TraceJob) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """True throughput, cores, memory (MiB) and the quota mask on the oracle's grid
    (``JobTruth.oracle_grid``: axes W, Lw, P, Lp)."""
    g = job.truth.oracle_grid(job.quota.cpu_cores, job.quota.memory_mib)
    x = g.inv ** (-1.0 / job.truth.smooth_k)
    return x, g.cores, np.broadcast_to(g.mem, x.shape), g.ok


def _objective(x: np.ndarray, cores: np.ndarray, mem: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """The planner's objective (``scaling._evaluate``: log X − θ·log cost, cost = cores +
    GiB / ``memory_gib_per_core``) on the grid, −inf where the quota is exceeded."""
    cfg = PlannerConfig()
    c = cores + mem / 1024 / cfg.memory_gib_per_core
    j = np.log(np.maximum(x, 1e-12)) - cfg.min_elasticity * np.log(c)
    j[~ok] = -np.inf
    return j


def objective_on_truth(jobs: list[TraceJob]) -> dict[str, Any]:
    ratios = []
    for job in jobs:
        if not job.name.endswith("-r0"):
            continue
        o = _oracle_of_job(job)
        x, cores, mem, ok = _truth_grid(job)
        i = int(np.argmax(_objective(x, cores, mem, ok)))
        ratios.append(
            (x.flat[i] / cores.flat[i] / o.throughput_per_core, x.flat[i] / o.throughput_sps)
        )
    a = np.array(ratios)
    print(f"1. objective on the truth, {len(a)} first runs (p10 / median):")
    print(f"   per-core / oracle's {np.percentile(a[:, 0], 10):.3f} / {np.median(a[:, 0]):.3f}")
    print(f"   speed / oracle's    {np.percentile(a[:, 1], 10):.3f} / {np.median(a[:, 1]):.3f}")
    return {
        "first_runs": len(a),
        "per_core_p10": float(np.percentile(a[:, 0], 10)),
        "per_core_median": float(np.median(a[:, 0])),
        "speed_p10": float(np.percentile(a[:, 1], 10)),
        "speed_median": float(np.median(a[:, 1])),
    }


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


def _with_engine(name: str, hook: Callable[..., Any] | None, run: Callable[[], Any]) -> Any:
    """``run()`` with ``Engine.<name>`` replaced by ``hook`` (None: as it is), then restored."""
    original = getattr(E.Engine, name)
    setattr(E.Engine, name, hook or original)
    try:
        return run()
    finally:
        setattr(E.Engine, name, original)


def bounds(jobs: list[TraceJob], seed: int) -> list[dict[str, Any]]:
    print("2. per-core / oracle's with some stages' plans replaced by the oracle's configuration:")
    cases = [
        ((), "both"),
        (("scaling",), "both"),
        (("warm_start",), "ps"),
        (("warm_start",), "workers"),
        (("warm_start",), "both"),
        (("warm_start", "scaling"), "both"),
    ]
    out = []
    for stages, part in cases:

        def hook(self: E.Engine, r: Any, plan: ResourcePlan, t: float, st=stages, pt=part) -> Any:
            if plan.stage.value in st:
                ok = _ORIGINAL_APPLY(self, r, _oracle_plan(r.job, plan, pt), t)
                if ok or r.plan is not None:
                    return ok
                r.pending_plan = None  # the first plan must start: the job's own, then
            return _ORIGINAL_APPLY(self, r, plan, t)

        m = _with_engine(
            "_apply", hook if stages else None, lambda: run_policy(jobs, "dlrover-rm", seed)
        )
        label = "as is" if not stages else f"{'+'.join(stages)} ({part})"
        print(
            f"   {label:<30} {m['oracle_throughput_ratio']:.3f}   JCT median/mean/p90 "
            f"{m['jct_median_s'] / 60:.0f}/{m['jct_mean_s'] / 60:.0f}/{m['jct_p90_s'] / 60:.0f} min"
        )
        out.append(
            {
                "replaced": label,
                "per_core_vs_oracle": m["oracle_throughput_ratio"],
                **{k: m[k] for k in ("jct_median_s", "jct_mean_s", "jct_p90_s")},
            }
        )
    return out


def warm_starts(jobs: list[TraceJob], seed: int) -> dict[str, Any]:
    applied: dict[str, list[ResourcePlan]] = collections.defaultdict(list)

    def hook(self: E.Engine, r: Any, plan: ResourcePlan, t: float) -> Any:
        applied[r.job.name].append(plan)
        return _ORIGINAL_APPLY(self, r, plan, t)

    m = _with_engine("_apply", hook, lambda: run_policy(jobs, "dlrover-rm", seed))
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
    a = np.array(rows, dtype=float).reshape(-1, 2)
    varied = []
    for lo, hi in ((0, 40), (40, 80), (80, float("inf"))):
        s = a[(a[:, 1] >= lo) & (a[:, 1] < hi)]
        if len(s):
            print(
                f"   first runs of {lo}-{hi:g} min that varied the PS count: "
                f"{s[:, 0].mean():.2f} (n={len(s)})"
            )
            varied.append({"minutes": [lo, hi], "share": float(s[:, 0].mean()), "n": len(s)})
    return {"reruns_on_one_ps": one_ps, "reruns_oracle_more_ps": more, "first_runs": varied}


def _saturated(lam: Any, k: float) -> Any:
    return lam if not np.isfinite(k) else k * (1.0 - np.exp(-np.asarray(lam, dtype=float) / k))


class _SaturatingCPU(PSOverlapThroughputModel):
    """The overlap form on κ·(1 - exp(-λ/κ)) in place of each role's CPU (κ: class fields)."""

    kw = float("inf")
    kp = float("inf")

    def _features(self, w: Any, p: Any, lw: Any, lp: Any, b: Any) -> Any:
        return super()._features(w, p, _saturated(lw, self.kw), _saturated(lp, self.kp), b)

    def _features_scalar(self, w: Any, p: Any, lw: Any, lp: Any, b: Any) -> Any:
        lw, lp = float(_saturated(lw, self.kw)), float(_saturated(lp, self.kp))
        return super()._features_scalar(w, p, lw, lp, b)

    def _feature_terms(self, w: Any, p: Any, lw: Any, lp: Any, b: Any) -> Any:
        return super()._feature_terms(w, p, _saturated(lw, self.kw), _saturated(lp, self.kp), b)


def _fit_saturating(samples: list[Sample]) -> Any:
    ks = [2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, float("inf")]
    best = None
    for kw in ks:
        for kp in ks:
            m = _SaturatingCPU(batch_size=512)
            m.kw, m.kp = kw, kp
            try:
                m.fit(samples)
            except DLRoverError:  # a κ pair the samples cannot fit is skipped
                continue
            if best is None or m.relative_error_ < best.relative_error_:
                best = m
    return best


def model_forms(jobs: list[TraceJob], n: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    w_ax, p_ax, l_ax = T._ORACLE_W, T._ORACLE_P, T._ORACLE_CPU
    out: dict[str, list[tuple[float, float]]] = {"planner's forms": [], "saturating CPU": []}
    for job in [j for j in jobs if j.name.endswith("-r0")][:40]:
        t, o = job.truth, _oracle_of_job(job)
        x, cores, mem, ok = _truth_grid(job)
        pick = rng.choice(np.flatnonzero(ok.ravel()), size=min(n, int(ok.sum())), replace=False)
        samples = []
        for f in pick:
            iw, ilw, ip, ilp = np.unravel_index(int(f), x.shape)
            w, lw, p, lp = int(w_ax[iw]), float(l_ax[ilw]), int(p_ax[ip]), float(l_ax[ilp])
            xt = t.throughput(w, p, lw, lp) * float(np.exp(rng.normal(0.0, 0.05)))
            samples.append(Sample(w, p, lw, lp, xt, batch_size=512))
        fits = {
            "planner's forms": default_model_factory(samples, "ps", 512),
            "saturating CPU": _fit_saturating(samples),
        }
        for name, m in fits.items():
            if m is None:
                continue
            xp = np.transpose(m.predict_grid(w_ax, p_ax, l_ax, l_ax), (0, 2, 1, 3))
            i = int(np.argmax(_objective(xp, cores, mem, ok)))
            out[name].append(
                (x.flat[i] / cores.flat[i] / o.throughput_per_core, x.flat[i] / o.throughput_sps)
            )
    print(f"4. the objective's best point of a fit on {n} random configurations (median, p25):")
    res: dict[str, Any] = {"configurations": n}
    for name, rows in out.items():
        a = np.array(rows)
        print(
            f"   {name:<16} per-core / oracle's {np.median(a[:, 0]):.3f} "
            f"({np.percentile(a[:, 0], 25):.3f}); speed {np.median(a[:, 1]):.3f} "
            f"({np.percentile(a[:, 1], 25):.3f})"
        )
        res[name] = {
            "per_core_median": float(np.median(a[:, 0])),
            "per_core_p25": float(np.percentile(a[:, 0], 25)),
            "speed_median": float(np.median(a[:, 1])),
            "speed_p25": float(np.percentile(a[:, 1], 25)),
        }
    return res


def fair_oracle(jobs: list[TraceJob]) -> dict[str, Any]:
    """The oracle's rule on a grid where each PS count's hottest load share is its expected
    value under the job's Dirichlet (400 draws, a fixed generator) instead of the job's own
    draw: an oracle that knows every hidden parameter but not which PS count happens to
    spread the load well. Its configuration, judged on the truth, against the oracle's."""
    rng = np.random.default_rng(12345)
    rows = []
    for job in [j for j in jobs if j.name.endswith("-r0")]:
        t, o = job.truth, _oracle_of_job(job)
        q = job.quota
        expected = np.array(
            [
                1.0
                if p == 1
                else float(rng.dirichlet(np.full(int(p), t.skew_alpha), 400).max(axis=1).mean())
                for p in T._ORACLE_P
            ]
        )
        b, _ = t.oracle_grid(q.cpu_cores, q.memory_mib, expected).choice(t.smooth_k)
        g = t.oracle_grid(q.cpu_cores, q.memory_mib)
        x_true = float(g.inv.ravel()[b] ** (-1.0 / t.smooth_k))
        rows.append(
            (x_true / g.cores.ravel()[b] / o.throughput_per_core, x_true / o.throughput_sps)
        )
    a = np.array(rows)
    print(
        f"5. an oracle blind to the per-PS-count load draws, {len(a)} first runs: per-core / "
        f"oracle's {np.median(a[:, 0]):.3f} (p25 {np.percentile(a[:, 0], 25):.3f}), speed "
        f"{np.median(a[:, 1]):.3f}"
    )
    return {
        "first_runs": len(a),
        "per_core_median": float(np.median(a[:, 0])),
        "per_core_p25": float(np.percentile(a[:, 0], 25)),
        "speed_median": float(np.median(a[:, 1])),
    }


def breakdown(jobs: list[TraceJob], seed: int) -> dict[str, Any]:
    """Where dlrover-rm's per-core figure goes, first runs apart from re-runs: the share of
    allocated core-seconds with no progress (pauses, start-up), the true per-core rate of the
    first and the last configuration measured, the last one with its workers right-sized
    for its PS (log X − θ·log cores on the truth, memory left out, over fewer workers and
    less CPU each), and what the final configurations of the jobs under 0.7 of the oracle
    have too much of."""
    zero: dict[int, float] = collections.defaultdict(float)
    orig = E.Engine._advance

    def advance(self: E.Engine, run: Any, t: float) -> None:
        if t > run.t_last and run.x <= 0:
            zero[id(run)] += run.alloc_cpu_m / 1000.0 * (t - run.t_last)
        orig(self, run, t)

    engine = E.Engine(
        jobs, policy_factories(POLICIES)["dlrover-rm"](), cluster_capacity(jobs), seed, None
    )
    _with_engine("_advance", advance, engine.run)
    cfg = PlannerConfig()
    groups: dict[bool, list[tuple[float, ...]]] = {True: [], False: []}
    poor: collections.Counter[str] = collections.Counter()
    for r in engine.runs:
        if r.status != "completed" or r.cpu_alloc_cs <= 0 or not r.samples:
            continue
        t, o = r.job.truth, _oracle_of_job(r.job)
        opc = o.throughput_per_core

        def pc(w: int, p: int, lw: float, lp: float, tt: T.JobTruth = t) -> float:
            return tt.throughput(w, p, lw, lp) / (w * lw + p * lp)

        w, p, lw, lp = r.samples[-1].config
        right = max(
            (
                (
                    np.log(t.throughput(w2, p, l2, lp))
                    - cfg.min_elasticity * np.log(w2 * l2 + p * lp),
                    w2,
                    l2,
                )
                for w2 in range(1, w + 1)
                for l2 in (*(c / 1000 for c in cfg.cpu_levels_millicores if c <= lw * 1000), lw)
            ),
        )
        measured = r.done / r.cpu_alloc_cs / opc
        z = zero.get(id(r), 0.0)
        groups[r.job.name.endswith("-r0")].append(
            (
                measured,
                r.done / max(r.cpu_alloc_cs - z, 1e-9) / opc,
                z / r.cpu_alloc_cs,
                pc(*r.samples[0].config) / opc,
                pc(w, p, lw, lp) / opc,
                pc(right[1], p, right[2], lp) / opc,
            )
        )
        if measured < 0.7:
            x, xw, _, _ = t.rates([lw] * w, [lp] * p)
            tags = []
            if xw > 1.5 * x:
                tags.append("workers > 1.5x what the PS serve")
            ep = float(t.eff_ps(lp)) / lp / (float(t.eff_ps(o.ps_cpu_cores)) / o.ps_cpu_cores)
            if ep < 0.8:
                tags.append("PS CPU per core < 0.8 of the oracle's")
            poor[" and ".join(tags) or "neither"] += 1
    print("6. where the per-core figure goes (medians):")
    print("   runs        n  measured  progress-only  zero-progress share  first cfg  last cfg  "
          "last, workers right-sized")  # fmt: skip
    res: dict[str, Any] = {}
    cols = ("measured", "progress_only", "zero_progress_share", "first_cfg", "last_cfg")
    for first, rows in groups.items():
        if not rows:  # e.g. a tiny trace with no re-run
            continue
        a = np.array(rows)
        m = np.median(a, axis=0)
        res["first_runs" if first else "reruns"] = {
            "n": len(a),
            **{c: float(v) for c, v in zip((*cols, "last_workers_right_sized"), m, strict=True)},
        }
        print(
            f"   {'first' if first else 're-runs':<9} {len(a):>4}  {m[0]:8.3f}  {m[1]:13.3f}  "
            f"{m[2]:19.3f}  {m[3]:9.3f}  {m[4]:8.3f}  {m[5]:8.3f}"
        )
    print(f"   jobs under 0.7 of the oracle: {sum(poor.values())}; their final configuration has")
    for tag, n in poor.most_common():
        print(f"     {n:>4}  {tag}")
    res["under_0.7"] = dict(poor.most_common())
    return res


def main() -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--seed", type=int, default=0, help="trace seed")
    ap.add_argument("--jobs", type=int, default=300, help="jobs in the generated trace")
    only = ap.add_mutually_exclusive_group()
    only.add_argument(
        "--model-forms", type=int, default=0, metavar="N", help="4 only, on N configurations"
    )
    only.add_argument("--where", action="store_true", help="5 and 6 only (fair oracle, breakdown)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the figures as JSON")
    a = ap.parse_args()
    if a.seed < 0:
        ap.error(f"--seed must be >= 0 (got {a.seed})")
    if a.jobs < 1:
        ap.error(f"--jobs must be >= 1 (got {a.jobs})")
    if a.model_forms < 0:
        ap.error(
            f"--model-forms must be >= 1 configurations, or 0 for the bounds (got {a.model_forms})"
        )
    jobs = generate_trace(a.jobs, a.seed)
    print(f"dlrover-rm, {a.jobs} jobs, seed {a.seed}")
    doc: dict[str, Any] = {"jobs": a.jobs, "seed": a.seed}
    if a.model_forms:
        doc["model_forms"] = model_forms(jobs, a.model_forms)
    elif a.where:
        doc["fair_oracle"] = fair_oracle(jobs)
        doc["breakdown"] = breakdown(jobs, a.seed)
    else:
        doc["objective_on_truth"] = objective_on_truth(jobs)
        doc["bounds"] = bounds(jobs, a.seed)
        doc["warm_starts"] = warm_starts(jobs, a.seed)
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
