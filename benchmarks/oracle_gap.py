"""How close dlrover-rm comes to the oracle on traces it was never tuned on, and where the
remaining time goes (issue 33, item 2).

    PYTHONPATH=$PWD python benchmarks/oracle_gap.py [--seeds 9001-9003] [--jobs 300] \\
        [--json benchmarks/results/oracle_gap.json] [--check]
        [--planner FIELD=VALUE ...] [--oracle-start cold_start,warm_start]

Each trace is run under ``dlrover-rm`` (ours), ``oracle`` and ``dlrover-oss`` (DLRover's
heuristics), one policy after the other in this one process. The engine is
``dlrover_core.sim.engine.Engine`` unchanged but for a subclass here that *watches*: it
overrides ``_advance`` (called for every interval over which a run's state is constant),
``_apply`` and ``_node_exit`` to record, then calls the engine's own method. No decision
changes (``--check`` reruns each policy through ``runner.run_policy`` and compares).
Two what-ifs, for dlrover-rm only: ``--planner FIELD=VALUE`` overrides a ``PlannerConfig``
field on top of each job's own configuration; ``--oracle-start STAGES`` replaces its first
plan of those stages by the oracle's configuration as the engine applies it (an upper bound
on what a better stage 1 buys, as ``sim_bounds.py`` does for whole stages; a first plan
that does not fit the cluster at once starts as the job's own).

Targets (issue 33, item 2), per trace:

* median JCT <= 1.10x the oracle's: the median over jobs completed under both policies of
  JCT(policy) / JCT(oracle), same job; the ratio of the two medians (each over its own
  completed jobs, as ``simulate`` reports JCT) and the geometric mean are printed too;
* per-core throughput >= 0.92 of the oracle's: ``runner``'s figure, the median over
  completed jobs of samples / allocated core-seconds / the oracle configuration's true rate
  per core (the same figure as the issue-10 tables); next to it, the same median for the
  oracle's own run (faults and stragglers keep it under 1) and the median per-job quotient
  of the policy's measured rate to the oracle run's;
* scaling operations <= 0.3 a job: the engine's ``scaling_ops`` over the trace's jobs;
* completion at the trace's ceiling: completion rate >= ``completion_bound`` (jobs without
  a code bug); the oracle's own completion is printed with it.

The breakdown. For a job completed under a policy, with ``X_o`` the true throughput of the
oracle's configuration (``JobTruth.oracle_config``) and ``N`` its samples,

    JCT = queue + N / X_o + sum over the run's constant intervals of dt * (1 - x / X_o)

exactly (``x``: the rate of the interval; the samples trained sum to ``N``). Each interval's
``dt * (1 - x / X_o)``, the time the interval loses to a job running the oracle's
configuration without a fault, goes to one part, and the oracle's own run is split the same
way; a part's difference between the two runs of a job is that part's share of the JCT
difference, and the parts add up to it (the script checks the identity per job):

1. ``queue``: start - submit (waiting for room in the cluster before the first node).
2. ``pauses``: intervals with the job paused by a plan change (the engine's
   ``worker_pause_s`` / ``ps_pause_s`` after each scaling operation), the whole ``dt``;
   except those of a plan made for a fault (stage ``fault``, e.g. more PS after a PS OOM),
   which go to faults.
3. ``start``: running (x > 0) in the stage-1 plan (``cold_start``: a first run's priors,
   ``warm_start``: its own history or similar jobs'), ``dt * (1 - x_cfg / X_o)`` with
   ``x_cfg`` the true rate of the configuration, every node up at nominal speed.
4. ``exploration``: the same in stage-2 sampling configurations (``sampling``): the samples
   those intervals trained short of what the oracle's configuration would have trained in
   the same time, in seconds of the oracle's configuration.
5. ``aim`` and 6. ``misprediction``: the same in model-chosen configurations (``scaling``,
   ``post_scaling``), split at ``X_aim``, the true rate of the configuration the planner's
   own objective (log X - theta * log cost, cost = cores + GiB / 4, theta =
   ``min_elasticity``) picks on the true throughput over the oracle's grid and memory:
   ``aim = dt * (1 - X_aim / X_o)`` (the objective aims elsewhere than the oracle's rule:
   negative where it aims faster, at more cores), ``misprediction = dt * (X_aim - x_cfg) /
   X_o`` (the model, or the planner's reluctance to move, left the job in a configuration
   its objective would not pick on the truth). ``start`` is split the same way
   (``cold aim``, ``cold miss``, ``warm aim``, ``warm miss``; theta =
   ``prior_start_elasticity`` for a cold start, the theta of ``_prior_start``).
7. ``faults``: intervals with no progress and no pause (a node relaunching after an exit or
   waiting for room: ``relaunch_delay_s``; hardware, preemption, OOM), workers down while
   the rest run (``dt * (x_cfg - x_up) / X_o``), stragglers (``dt * (x_up - x) / X_o``,
   ``x_up`` the up nodes at nominal speed), pauses and configurations of fault plans.

Parts 3-6 are the steady-state gap of the brief ("misprediction" there): 3 is the first
plan, 5 what the objective asks for, 6 the model's error and the planner's reluctance to
move. The oracle runs its own configuration (x_cfg = X_o), so only its ``queue`` and
``faults`` are non-zero. The split by stage is dlrover-rm's alone: dlrover-oss labels every
plan ``scaling``, so its parts 3-6 are printed as one, ``config``. Parts are reported per
job in minutes (mean over the jobs both policies completed), as shares of the oracle's JCT
(their mean adds to the mean JCT ratio - 1), and over the "median band" (the jobs whose
ratio lies between the 40th and 60th percentiles: what the median ratio is made of). A few
long jobs dominate the means of ``aim`` and ``misprediction`` (the objective on the truth
can sit far from the oracle's rule where memory dominates the cost; the two then cancel in
part): read their sum, and the median band. Seeds 9001-9003 were never used before this
script (the earlier reports used 0-887).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, too

from dlrover_core.planner.config import PlannerConfig
from dlrover_core.sim.engine import Engine, cluster_capacity
from dlrover_core.sim.policies import POLICIES, ExitClass
from dlrover_core.sim.registry import policy_factories
from dlrover_core.sim.rm_policy import DLRoverRMPolicy
from dlrover_core.sim.runner import completion_bound, run_policy
from dlrover_core.sim.spec_bridge import job_view_to_spec
from dlrover_core.sim.trace import TraceJob, generate_trace
from dlrover_core.types import NodeResources, ResourcePlan, RolePlan, Stage
from dlrover_core.units import millicores_from_cores

OURS, ORACLE, PEER = "dlrover-rm", "oracle", "dlrover-oss"
POLICY_ORDER = (ORACLE, OURS, PEER)
PARTS = ("queue", "pauses", "start", "exploration", "aim", "misprediction", "faults")
TARGETS = {
    "jct_median_ratio": 1.10,
    "per_core_vs_oracle": 0.92,
    "scaling_ops_per_job": 0.3,
}
SUB = ("cold aim", "cold miss", "warm aim", "warm miss")  # inside "start"
START = (Stage.COLD_START.value, Stage.WARM_START.value)


def aim_config(job: TraceJob, cfg: PlannerConfig, theta: float) -> tuple[float, float]:
    """(true throughput, cores) of the configuration that maximises the planner's objective
    log X - theta * log cost on the truth, over the oracle's grid with the true memory per
    node (``JobTruth.oracle_grid``); the oracle's own configuration when nothing fits."""
    g = job.truth.oracle_grid(job.quota.cpu_cores, job.quota.memory_mib)
    if not g.ok.any():
        o = job.truth.oracle_config(job.quota.cpu_cores, job.quota.memory_mib)
        return o.throughput_sps, o.cores
    x = g.inv ** (-1.0 / job.truth.smooth_k)
    cost = g.cores + np.broadcast_to(g.mem, x.shape) / 1024.0 / cfg.memory_gib_per_core
    j = np.log(np.maximum(x, 1e-12)) - theta * np.log(cost)
    j[~g.ok] = -np.inf
    k = int(np.argmax(j))
    return float(x.flat[k]), float(g.cores.flat[k])


def oracle_plan(job: TraceJob, plan: ResourcePlan) -> ResourcePlan:
    """``plan`` with the oracle's configuration (counts, CPU, the truth's memory per node)."""
    o = job.truth.oracle_config(job.quota.cpu_cores, job.quota.memory_mib)
    return plan.replace(
        workers=RolePlan(
            o.workers, NodeResources(millicores_from_cores(o.worker_cpu_cores), o.worker_memory_mib)
        ),
        ps=RolePlan(o.ps, NodeResources(millicores_from_cores(o.ps_cpu_cores), o.ps_memory_mib)),
    )


class OverriddenRM(DLRoverRMPolicy):
    """dlrover-rm with some ``PlannerConfig`` fields overridden on top of each job's own
    configuration (``PlannerConfig.from_spec``, as the policy builds it)."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        super().__init__()
        self.overrides = overrides

    def _job(self, job: Any) -> Any:
        if job.name not in self._jobs:
            self.config = PlannerConfig.from_spec(job_view_to_spec(job), **self.overrides)
        try:
            return super()._job(job)
        finally:
            self.config = None


class GapEngine(Engine):
    """The engine, watched: every constant interval of a running job is split into parts
    (module docstring). Decisions are the engine's own (each override calls it)."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        policy: Any,
        seed: int,
        x_oracle: dict[int, float],
        x_aim: dict[int, tuple[float, float]] | None,
        oracle_start: Sequence[str] = (),
    ) -> None:
        super().__init__(jobs, policy, cluster_capacity(jobs), seed)
        self.oracle_start = tuple(oracle_start)  # first plans of these stages: the oracle's
        self.x_oracle = x_oracle
        self.x_aim = x_aim  # None: no aim/misprediction split (not the planner's stages)
        self.parts: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.stage_s: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.moving_s: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.pause_cause: dict[int, str] = {}
        self.pauses: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.actions: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.last_exit: dict[int, str] = {}
        self.exits: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._cfg_rates: dict[int, tuple[Any, float, float]] = {}

    def _rates(self, run: Any) -> tuple[float, float]:
        """(x_cfg, x_up): every node of the configuration up at nominal speed; the up nodes
        at nominal speed (memoised per run on the nodes' CPUs and up set)."""
        key = (
            tuple(n.res.cpu_millicores for n in run.workers),
            tuple(n.res.cpu_millicores for n in run.ps),
            tuple(n.res.cpu_millicores for n in run.up_workers),
        )
        hit = self._cfg_rates.get(run.job.index)
        if hit is not None and hit[0] == key:
            return hit[1], hit[2]
        truth = run.job.truth
        pc = [c / 1000 for c in key[1]]
        x_cfg = truth.rates([c / 1000 for c in key[0]], pc)[0]
        x_up = truth.rates([c / 1000 for c in key[2]], pc)[0]
        self._cfg_rates[run.job.index] = (key, x_cfg, x_up)
        return x_cfg, x_up

    def _advance(self, run: Any, t: float) -> None:
        dt = t - run.t_last
        if dt > 0 and run.status == "running" and run.plan is not None:
            i = run.job.index
            xo = self.x_oracle[i]
            stage = run.plan.stage.value
            self.stage_s[i]["paused" if run.x <= 0 and run.paused_at_refresh else stage] += dt
            p = self.parts[i]
            if run.x <= 0:
                if run.paused_at_refresh:
                    cause = self.pause_cause.get(i, stage)
                    p["pause:fault" if cause == Stage.FAULT.value else "pause"] += dt
                else:
                    p[f"down:{self.last_exit.get(i, 'none')}"] += dt
            else:
                x_cfg, x_up = self._rates(run)
                self.moving_s[i][stage] += dt
                p["straggler"] += dt * (x_up - run.x) / xo
                p["degraded"] += dt * (x_cfg - x_up) / xo
                if stage == Stage.FAULT.value or self.x_aim is None:
                    p[f"config:{stage}"] += dt * (1.0 - x_cfg / xo)
                else:
                    xa = self.x_aim[i][stage == Stage.COLD_START.value]
                    p[f"aim:{stage}"] += dt * (1.0 - xa / xo)
                    p[f"miss:{stage}"] += dt * (xa - x_cfg) / xo
        super()._advance(run, t)

    def _apply(self, run: Any, plan: ResourcePlan, t: float) -> bool:
        if run.plan is None and plan.stage.value in self.oracle_start:
            if super()._apply(run, oracle_plan(run.job, plan), t):
                return True
            run.pending_plan = None  # no room for the oracle's: the job's own plan starts
        before, ops = run.paused_until, run.scaling_ops
        ok = super()._apply(run, plan, t)
        if run.scaling_ops > ops:
            self.pauses[run.job.index][plan.stage.value] += 1
            self.actions[run.job.index][plan.action or "(none)"] += 1
        if run.paused_until > before:
            self.pause_cause[run.job.index] = plan.stage.value
        return ok

    def _node_exit(self, run: Any, node: Any, cls: ExitClass, t: float) -> None:
        self.last_exit[run.job.index] = cls.value
        self.exits[run.job.index][cls.value] += 1
        super()._node_exit(run, node, cls, t)


def grouped(p: dict[str, float]) -> dict[str, float]:
    """The fine parts of one run in the headline parts of the module docstring (queue
    apart), and the split of ``start`` into its cold and warm starts' aim and misprediction
    (``SUB``)."""
    g = dict.fromkeys((*PARTS[1:], *SUB), 0.0)
    for k, v in p.items():
        kind, _, stage = k.partition(":")
        if k == "pause":
            g["pauses"] += v
        elif kind in ("aim", "miss") and stage in START:
            g["start"] += v
            g[f"{stage.split('_')[0]} {kind}"] += v
        elif kind == "config" and stage in START:  # no split (not our planner)
            g["start"] += v
        elif kind in ("aim", "miss", "config") and stage == Stage.SAMPLING.value:
            g["exploration"] += v
        elif kind == "aim":
            g["aim"] += v
        elif kind == "miss" or (kind == "config" and stage != Stage.FAULT.value):
            g["misprediction"] += v  # scaling, post_scaling (no split: all of it)
        else:  # pause:fault, down:*, degraded, straggler, config:fault
            g["faults"] += v
    return g


def run_one(
    jobs: Sequence[TraceJob], name: str, seed: int, x_oracle: dict[int, float],
    x_aim: dict[int, tuple[float, float]], overrides: dict[str, Any] | None = None,
    oracle_start: Sequence[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """One policy on the trace under ``GapEngine``; for dlrover-rm, ``overrides`` (planner
    configuration fields) and ``oracle_start`` (stage-1 plans replaced by the oracle's
    configuration: an upper bound, not a policy)."""
    ours = name == OURS
    policy = OverriddenRM(overrides) if ours and overrides else policy_factories(POLICIES)[name]()
    bind = getattr(policy, "bind_truths", None)
    if bind is not None:
        bind({j.name: j.truth for j in jobs})
    eng = GapEngine(
        jobs, policy, seed, x_oracle, x_aim if ours else None, oracle_start if ours else ()
    )
    c0 = time.process_time()
    eng.run()
    cpu_s = time.process_time() - c0
    per_job: dict[int, dict[str, Any]] = {}
    residual = 0.0
    for r in eng.runs:
        i = r.job.index
        rec: dict[str, Any] = {
            "status": r.status,
            "scaling_ops": r.scaling_ops,
            "ooms": r.oom_count,
            "pauses": dict(eng.pauses[i]),
            "actions": dict(eng.actions[i]),
        }
        if r.status == "completed":
            ideal = r.job.samples_total / x_oracle[i]
            fine = dict(eng.parts[i])
            g = grouped(fine)
            run_s = r.end_s - r.start_s
            lost = sum(g[k] for k in PARTS[1:])
            residual = max(residual, abs(run_s - ideal - lost) / run_s)
            rec.update(
                jct_s=r.end_s - r.job.submit_s,
                queue_s=r.start_s - r.job.submit_s,
                run_s=run_s,
                ideal_s=ideal,
                per_core=r.done / r.cpu_alloc_cs,
                parts={"queue": r.start_s - r.job.submit_s, **g},
                fine=fine,
                stage_s=dict(eng.stage_s[i]),
                start_moving_s=sum(eng.moving_s[i].get(k, 0.0) for k in START),
                exits=dict(eng.exits[i]),
            )
        per_job[i] = rec
    n = len(jobs)
    done = [v for v in per_job.values() if v["status"] == "completed"]
    o_pc = {i: x_oracle[i] / jobs[i].truth.oracle_config(
        jobs[i].quota.cpu_cores, jobs[i].quota.memory_mib).cores for i in per_job}  # fmt: skip
    metrics = {
        "completion_rate": len(done) / n,
        "jct_median_s": float(np.median([v["jct_s"] for v in done])),
        "scaling_ops_per_job": sum(v["scaling_ops"] for v in per_job.values()) / n,
        "oom_count": sum(v["ooms"] for v in per_job.values()),
        "per_core_vs_oracle": float(
            np.median([v["per_core"] / o_pc[i] for i, v in per_job.items() if "per_core" in v])
        ),
        "cpu_s": cpu_s,
        "identity_residual_max": residual,
    }
    return {"metrics": metrics, "jobs": per_job}


def _pcts(a: np.ndarray) -> list[float]:
    return [float(v) for v in np.percentile(a, [10, 25, 50, 75, 90])]


KEYS = (*PARTS, *SUB)


def _nanmedian(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(np.median(a)) if a.size else None


BANDS = ("all", "median_band_p40_p60", "first_runs", "re_runs")


def job_arrays(
    runs: dict[str, dict[str, Any]], name: str, jobs: Sequence[TraceJob]
) -> dict[str, Any]:
    """Per job completed under both ``name`` and the oracle: the JCT ratio, the extra time
    and each part's difference (seconds; ``KEYS``), the oracle's JCT, first run or not."""
    pj, oj = runs[name]["jobs"], runs[ORACLE]["jobs"]
    both = [i for i in pj if pj[i]["status"] == "completed" and oj[i]["status"] == "completed"]
    return {
        "ratio": np.array([pj[i]["jct_s"] / oj[i]["jct_s"] for i in both]),
        "djct": np.array([pj[i]["jct_s"] - oj[i]["jct_s"] for i in both]),
        "oracle_jct": np.array([oj[i]["jct_s"] for i in both]),
        "diff": {k: np.array([pj[i]["parts"][k] - oj[i]["parts"][k] for i in both]) for k in KEYS},
        "pc_ratio": np.array([pj[i]["per_core"] / oj[i]["per_core"] for i in both]),
        "first": np.array([jobs[i].name.endswith("-r0") for i in both], dtype=bool),
        "ops": np.array([pj[i]["scaling_ops"] for i in both]),
        # the stage-1 configuration: its mean speed / the oracle configuration's while the
        # job progressed in it (nan: never), and that time / the run
        "start_speed": np.array(
            [
                1.0 - pj[i]["parts"]["start"] / pj[i]["start_moving_s"]
                if pj[i]["start_moving_s"] > 0
                else np.nan
                for i in both
            ]
        ),
        "start_time_share": np.array([pj[i]["start_moving_s"] / pj[i]["run_s"] for i in both]),
        "names": [jobs[i].name for i in both],
    }


def concat(arrs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in arrs[0]:
        if k == "diff":
            out[k] = {p: np.concatenate([a[k][p] for a in arrs]) for p in KEYS}
        elif k == "names":
            out[k] = [n for a in arrs for n in a[k]]
        else:
            out[k] = np.concatenate([a[k] for a in arrs])
    return out


def summary(a: dict[str, Any]) -> dict[str, Any]:
    """JCT ratios and the breakdown: every job, the median band (ratio between its 40th and
    60th percentiles), first runs, re-runs."""
    ratio, djct, diff = a["ratio"], a["djct"], a["diff"]
    check = sum(diff[k] for k in PARTS) - djct
    lo, hi = np.percentile(ratio, [40, 60])

    def split(mask: np.ndarray) -> dict[str, Any]:
        if not mask.any():
            return {"jobs": 0}
        extra = float(djct[mask].sum())
        return {
            "jobs": int(mask.sum()),
            "first_runs": int(a["first"][mask].sum()),
            "jct_ratio_median": float(np.median(ratio[mask])),
            "no_scaling_op_share": float((a["ops"][mask] == 0).mean()),
            "start_time_share_median": float(np.median(a["start_time_share"][mask])),
            "start_speed_vs_oracle_median": _nanmedian(a["start_speed"][mask]),
            "delta_jct_min_mean": float(djct[mask].mean() / 60),
            "parts_min_mean": {k: float(diff[k][mask].mean() / 60) for k in KEYS},
            "parts_share_of_oracle_jct_mean": {
                k: float((diff[k][mask] / a["oracle_jct"][mask]).mean()) for k in KEYS
            },
            "parts_share_of_extra_time": {
                k: float(diff[k][mask].sum() / extra) if extra else 0.0 for k in KEYS
            },
        }

    return {
        "jobs_both_completed": int(ratio.size),
        "jct_ratio_median": float(np.median(ratio)),
        "jct_ratio_geomean": float(np.exp(np.mean(np.log(ratio)))),
        "jct_ratio_percentiles_10_25_50_75_90": _pcts(ratio),
        "per_core_vs_oracle_run_median": float(np.median(a["pc_ratio"])),
        "identity_check_max_abs_error_s": float(np.max(np.abs(check))),
        "all": split(np.ones(ratio.size, dtype=bool)),
        "median_band_p40_p60": split((ratio >= lo) & (ratio <= hi)),
        "first_runs": split(a["first"]),
        "re_runs": split(~a["first"]),
    }


def targets(
    s: dict[str, Any], m: dict[str, Any], om: dict[str, Any], bound: float
) -> dict[str, dict[str, Any]]:
    """Issue 33 item 2's targets for one policy on one trace (module docstring)."""
    of_medians = m["jct_median_s"] / om["jct_median_s"]
    rows = (
        ("JCT ratio, median per job", s["jct_ratio_median"], "<= 1.10", "jct_median_ratio"),
        ("JCT median / oracle's median", of_medians, "<= 1.10", "jct_median_ratio"),
        ("per-core / oracle config", m["per_core_vs_oracle"], ">= 0.92", "per_core_vs_oracle"),
        ("scaling ops / job", m["scaling_ops_per_job"], "<= 0.30", "scaling_ops_per_job"),
    )
    out = {}
    for label, v, target, key in rows:
        lim = TARGETS[key]
        ok = v >= lim if target.startswith(">") else v <= lim + 1e-12
        out[label] = {"value": v, "target": target, "pass": bool(ok)}
    out["completion at the ceiling"] = {
        "value": m["completion_rate"],
        "target": f">= {bound:.4f}",
        "pass": m["completion_rate"] >= bound - 1e-12,
    }
    return out


def objective_on_truth(jobs: Sequence[TraceJob], cfg: PlannerConfig) -> dict[str, Any]:
    """The planner's objective maximised on the truth (its aim, no model error), against the
    oracle's configuration: median speed and per-core ratios, per theta."""
    out = {}
    for label, theta in (
        ("min_elasticity", cfg.min_elasticity),
        ("prior_start_elasticity", cfg.prior_start_elasticity),
    ):
        sp, pc = [], []
        for j in jobs:
            o = j.truth.oracle_config(j.quota.cpu_cores, j.quota.memory_mib)
            x, c = aim_config(j, cfg, theta)
            sp.append(x / o.throughput_sps)
            pc.append(x / c / o.throughput_per_core)
        out[label] = {
            "theta": theta,
            "speed_vs_oracle_median": float(np.median(sp)),
            "per_core_vs_oracle_median": float(np.median(pc)),
        }
    return out


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b) + 1) if b else [int(a)])
    return out


def print_breakdown(title: str, s: dict[str, Any], merged: bool) -> None:
    """The parts, mean minutes per job; ``merged``: start to misprediction as one
    "configuration" column (a policy whose plans carry no planner stages)."""
    cols: list[tuple[str, tuple[str, ...]]] = [("queue", ("queue",)), ("pauses", ("pauses",))]
    if merged:
        cols.append(("config", ("start", "exploration", "aim", "misprediction")))
    else:
        cols += [(k[:9], (k,)) for k in ("start", "exploration", "aim", "misprediction")]
    cols += [("faults", ("faults",))]
    if not merged:
        cols += [(k, (k,)) for k in SUB]
    head = f"  {'':<24} {'jobs':>4} " + " ".join(f"{c:>9}" for c, _ in cols) + "  = total"
    print(f"  {title}: extra time per job against the oracle (mean minutes)")
    print(head)
    mins, share, band = "parts_min_mean", "parts_share_of_oracle_jct_mean", "median_band_p40_p60"
    for label, key, field, fmt in (
        ("all", "all", mins, "9.2f"),
        ("median band (p40-p60)", band, mins, "9.2f"),
        ("first runs (-r0)", "first_runs", mins, "9.2f"),
        ("re-runs", "re_runs", mins, "9.2f"),
        ("all, / oracle JCT", "all", share, "9.3f"),
        ("median band, / oracle JCT", band, share, "9.3f"),
    ):
        d = s[key]
        if not d.get("jobs"):
            print(f"  {label:<24} (no jobs)")
            continue
        v = d[field]
        cells = " ".join(format(sum(v[k] for k in ks), fmt) for _, ks in cols)
        total = sum(v[k] for k in PARTS)
        print(f"  {label:<24} {d['jobs']:4d} {cells}  = {format(total, fmt).strip()}")
    if not merged:
        print(
            "  the stage-1 configuration (all / median band / first runs / re-runs): jobs "
            "never scaled "
            + " / ".join(f"{s[k]['no_scaling_op_share']:.0%}" for k in BANDS)
            + "; median share of the run in it "
            + " / ".join(f"{s[k]['start_time_share_median']:.0%}" for k in BANDS)
            + "; median speed there / the oracle's "
            + " / ".join(f"{s[k]['start_speed_vs_oracle_median']:.3f}" for k in BANDS)
        )
    if not merged:
        print(
            "  share of the extra time, all jobs: "
            + ", ".join(f"{k} {s['all']['parts_share_of_extra_time'][k]:+.0%}" for k in PARTS)
        )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--seeds", default="9001-9003", help="trace seeds (A-B or A,B,C)")
    ap.add_argument("--jobs", type=int, default=300, help="jobs per generated trace")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the figures as JSON")
    ap.add_argument(
        "--check", action="store_true", help="rerun each policy with runner.run_policy and compare"
    )
    ap.add_argument(
        "--planner",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="what-if: a PlannerConfig field for dlrover-rm (JSON value), e.g. "
        "idle_min_remaining_s=7200; repeatable",
    )
    ap.add_argument(
        "--oracle-start",
        default="",
        metavar="STAGES",
        help="upper bound: dlrover-rm's first plan of these stages (cold_start, warm_start; "
        "comma-separated) replaced by the oracle's configuration, as the engine applies it",
    )
    a = ap.parse_args()
    overrides = {k: json.loads(v) for k, v in (o.split("=", 1) for o in a.planner)}
    oracle_start = tuple(x for x in a.oracle_start.split(",") if x)
    if overrides or oracle_start:
        print(f"what-if run: planner overrides {overrides}, oracle start {oracle_start}")
    seeds = _seeds(a.seeds)
    cfg = PlannerConfig()
    t0, c0 = time.perf_counter(), time.process_time()
    traces: list[dict[str, Any]] = []
    arrays: dict[str, list[dict[str, Any]]] = {OURS: [], PEER: []}
    for seed in seeds:
        jobs = generate_trace(a.jobs, seed)
        x_oracle = {
            j.index: j.truth.oracle_config(j.quota.cpu_cores, j.quota.memory_mib).throughput_sps
            for j in jobs
        }
        x_aim = {
            j.index: (
                aim_config(j, cfg, cfg.min_elasticity)[0],
                aim_config(j, cfg, cfg.prior_start_elasticity)[0],
            )
            for j in jobs
        }
        bound = completion_bound(jobs)
        runs = {
            n: run_one(jobs, n, seed, x_oracle, x_aim, overrides, oracle_start)
            for n in POLICY_ORDER
        }
        if a.check:
            for n in POLICY_ORDER if not (overrides or oracle_start) else ():
                m = run_policy(jobs, n, seed)
                mine = runs[n]["metrics"]
                same = (
                    m["jct_median_s"] == mine["jct_median_s"]
                    and m["scaling_ops"] / a.jobs == mine["scaling_ops_per_job"]
                    and m["oracle_throughput_ratio"] == mine["per_core_vs_oracle"]
                    and m["completion_rate"] == mine["completion_rate"]
                )
                print(f"check seed {seed} {n}: {'same' if same else 'DIFFERENT'} as run_policy")
                if not same:
                    return 1
        om = runs[ORACLE]["metrics"]
        aim = objective_on_truth(jobs, cfg)
        print(
            f"\n== {a.jobs} jobs, seed {seed}: ceiling {bound:.1%}; oracle: completion "
            f"{om['completion_rate']:.1%}, per-core {om['per_core_vs_oracle']:.3f} of its "
            f"configuration's rate, JCT median {om['jct_median_s'] / 60:.1f} min"
        )
        print(
            "   the planner's objective on the truth vs the oracle (median speed / per-core): "
            + "; ".join(
                f"theta {v['theta']}: {v['speed_vs_oracle_median']:.3f} / "
                f"{v['per_core_vs_oracle_median']:.3f}"
                for v in aim.values()
            )
        )
        entry: dict[str, Any] = {
            "seed": seed,
            "jobs": a.jobs,
            "completion_bound": bound,
            "oracle": om,
            "objective_on_truth": aim,
            "policies": {},
        }
        for n in (OURS, PEER):
            arr = job_arrays(runs, n, jobs)
            arrays[n].append(arr)
            s = summary(arr)
            m = runs[n]["metrics"]
            tg = targets(s, m, om, bound)
            print(
                f"{n}: JCT ratio median {s['jct_ratio_median']:.3f}, geomean "
                f"{s['jct_ratio_geomean']:.3f}; median / oracle's median "
                f"{m['jct_median_s'] / om['jct_median_s']:.3f}; per-core "
                f"{m['per_core_vs_oracle']:.3f} (/ the oracle run's, per job: "
                f"{s['per_core_vs_oracle_run_median']:.3f}); ops/job "
                f"{m['scaling_ops_per_job']:.3f}; completion {m['completion_rate']:.1%}; OOMs "
                f"{m['oom_count']}; {m['cpu_s']:.0f} CPU s"
            )
            print(
                "  "
                + "; ".join(
                    f"{k} {v['value']:.3f} {'PASS' if v['pass'] else 'FAIL'}" for k, v in tg.items()
                )
            )
            print_breakdown(n, s, merged=n != OURS)
            stage_tot: dict[str, float] = defaultdict(float)
            ops_by: dict[str, int] = defaultdict(int)
            ops_act: dict[str, int] = defaultdict(int)
            for rec in runs[n]["jobs"].values():
                for k, v in rec.get("stage_s", {}).items():
                    stage_tot[k] += v
                for k, c in rec["pauses"].items():
                    ops_by[k] += c
                for k, c in rec["actions"].items():
                    ops_act[k] += c
            if n == OURS:
                print(
                    "  scaling operations by plan stage: "
                    + ", ".join(f"{k} {v}" for k, v in sorted(ops_by.items()))
                    + "; by action: "
                    + ", ".join(
                        f"{k} {v}" for k, v in sorted(ops_act.items(), key=lambda kv: -kv[1])
                    )
                )
            tot = sum(stage_tot.values()) or 1.0
            worst = np.argsort(-arr["djct"])[:8]
            entry["policies"][n] = {
                "metrics": m,
                "targets": tg,
                **s,
                "running_time_share_by_stage": {k: v / tot for k, v in sorted(stage_tot.items())},
                "scaling_ops_by_stage": dict(sorted(ops_by.items())),
                "scaling_ops_by_action": dict(sorted(ops_act.items())),
                "largest_extra_time": [
                    {
                        "job": arr["names"][k],
                        "jct_ratio": float(arr["ratio"][k]),
                        "delta_jct_min": float(arr["djct"][k] / 60),
                        "parts_min": {p: float(arr["diff"][p][k] / 60) for p in KEYS},
                    }
                    for k in worst
                ],
            }
        traces.append(entry)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    overall: dict[str, Any] = {}
    print(f"\n== pooled over seeds {seeds} ({len(seeds)} x {a.jobs} jobs)")
    for n in (OURS, PEER):
        s = summary(concat(arrays[n]))
        per_trace = {
            label: [t["policies"][n]["targets"][label]["value"] for t in traces]
            for label in traces[0]["policies"][n]["targets"]
        }
        s["per_trace"] = per_trace
        s["traces_passing"] = {
            label: sum(t["policies"][n]["targets"][label]["pass"] for t in traces)
            for label in per_trace
        }
        overall[n] = s
        print(
            f"{n}: {s['jobs_both_completed']} jobs; JCT ratio median {s['jct_ratio_median']:.3f}, "
            f"geomean {s['jct_ratio_geomean']:.3f}, p10/25/50/75/90 "
            + "/".join(f"{v:.2f}" for v in s["jct_ratio_percentiles_10_25_50_75_90"])
        )
        for label, vals in per_trace.items():
            print(
                f"   {label:<30} "
                + " ".join(f"{v:7.3f}" for v in vals)
                + f"   passing {s['traces_passing'][label]}/{len(traces)}"
            )
        print_breakdown(n, s, merged=n != OURS)
    print(f"\n{wall:.0f} s wall, {cpu:.0f} s CPU (this process)")
    if a.json:
        doc = {
            "command": "PYTHONPATH=$PWD python benchmarks/oracle_gap.py " + " ".join(sys.argv[1:]),
            "targets": TARGETS,
            "planner_overrides": overrides,
            "oracle_start": list(oracle_start),
            "parts": list(PARTS),
            "start_split": list(SUB),
            "wall_s": wall,
            "cpu_s": cpu,
            "traces": traces,
            "overall": overall,
        }
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
