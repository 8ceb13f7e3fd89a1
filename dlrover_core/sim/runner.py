"""Run every policy on the same trace and report paper-style metrics.

Same trace, same truths, same arrival times and the same per-job random streams (failures,
stragglers, measurement noise) for every policy: differences come from the policies alone.

``oracle_throughput_ratio`` is the median over completed jobs of (samples done / allocated
core-seconds while running) ÷ (the oracle configuration's true throughput per allocated core).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlrover_core.sim.engine import Engine, EngineConfig, cluster_capacity
from dlrover_core.sim.policies import POLICIES
from dlrover_core.sim.registry import policy_factories, unavailable_policies
from dlrover_core.sim.trace import TraceJob, generate_trace
from dlrover_core.sim.truth import OracleConfig

METRICS = (
    "jct_median_s",
    "jct_mean_s",
    "jct_p90_s",
    "completion_rate",
    "cpu_util",
    "mem_util",
    "scaling_ops",
    "oom_count",
    "oracle_throughput_ratio",
)
PAPER_CLAIMS = {
    "jct_change": -0.31,
    "completion_points": 0.06,
    "cpu_points": 0.15,
    "mem_points": 0.20,
}


def available_policies() -> list[str]:
    return list(policy_factories(POLICIES))


__all__ = ["available_policies", "format_table", "run_policy", "simulate", "unavailable_policies"]


def run_policy(
    jobs: Sequence[TraceJob], name: str, seed: int, config: EngineConfig | None = None
) -> dict[str, Any]:
    """Simulate one policy; returns its metrics plus per-job outcomes under ``"jobs"``."""
    metrics = _run_policy(jobs, name, seed, config)
    _set_oracle_ratio(metrics, lambda i: _oracle_of_job(jobs[i]))
    return metrics


def _oracle_of_job(j: TraceJob) -> OracleConfig:
    if j.strategy == "allreduce":
        return j.truth.allreduce_oracle_config(j.quota.cpu_cores, j.quota.memory_mib, j.batch_size)
    return j.truth.oracle_config(j.quota.cpu_cores, j.quota.memory_mib)


def _set_oracle_ratio(metrics: dict[str, Any], oracle: Callable[[int], OracleConfig]) -> None:
    """Fill ``oracle_throughput_ratio`` from the completed jobs' measured per-core rates
    (``_per_core``: job position, samples / allocated core-second) and each job's oracle
    configuration (``oracle(position)``): the median of their quotients."""
    ratios = [rate / oracle(i).throughput_per_core for i, rate in metrics.pop("_per_core")]
    metrics["oracle_throughput_ratio"] = float(np.median(ratios)) if ratios else 0.0


def _run_policy(
    jobs: Sequence[TraceJob], name: str, seed: int, config: EngineConfig | None = None
) -> dict[str, Any]:
    """``run_policy`` without the oracle ratio: it needs every completed job's oracle
    configuration (a grid search per job), which ``simulate`` computes apart, in parallel
    with the policies; the metrics carry the inputs (``_per_core``) instead."""
    table = policy_factories(POLICIES)
    if name not in table:
        raise KeyError(f"unknown policy {name!r}; registered: {', '.join(table)}")
    policy = table[name]()
    bind = getattr(policy, "bind_truths", None)
    if bind is not None:
        bind({j.name: j.truth for j in jobs})
    engine = Engine(jobs, policy, cluster_capacity(jobs), seed, config)
    cpu0 = time.process_time()
    info = engine.run()
    cpu_s = time.process_time() - cpu0
    runs = engine.runs
    done = [r for r in runs if r.status == "completed"]
    jct = np.array([r.end_s - r.job.submit_s for r in done]) if done else np.array([np.nan])
    position = {id(j): i for i, j in enumerate(jobs)}
    per_core = [(position[id(r.job)], r.done / r.cpu_alloc_cs) for r in done if r.cpu_alloc_cs > 0]
    cpu_alloc = sum(r.cpu_alloc_cs for r in runs)
    mem_alloc = sum(r.mem_alloc_ms for r in runs)
    metrics: dict[str, Any] = {
        "jct_median_s": float(np.median(jct)),
        "jct_mean_s": float(np.mean(jct)),
        "jct_p90_s": float(np.percentile(jct, 90)),
        "completion_rate": len(done) / len(runs) if runs else 0.0,
        "cpu_util": sum(r.cpu_used_cs for r in runs) / cpu_alloc if cpu_alloc else 0.0,
        "mem_util": sum(r.mem_used_ms for r in runs) / mem_alloc if mem_alloc else 0.0,
        "scaling_ops": int(sum(r.scaling_ops for r in runs)),
        "oom_count": int(sum(r.oom_count for r in runs)),
        "oracle_throughput_ratio": 0.0,  # set by _set_oracle_ratio from "_per_core"
        "max_alloc_cpu_millicores": info["max_alloc"].cpu_millicores,
        "max_alloc_memory_mib": info["max_alloc"].memory_mib,
        "capacity_cpu_millicores": info["capacity"].cpu_millicores,
        "capacity_memory_mib": info["capacity"].memory_mib,
        "cpu_s": cpu_s,  # CPU time of this policy's simulation (a measurement, not a result)
        "_per_core": per_core,
    }
    metrics["jobs"] = [
        {
            "name": r.job.name,
            "status": r.status,
            "reason": r.fail_reason,
            "submit_s": r.job.submit_s,
            "start_s": r.start_s,
            "end_s": r.end_s,
            "samples_done": r.done,
            "samples_total": r.job.samples_total,
        }
        for r in runs
    ]
    return metrics


_JOBS: list[TraceJob] = []
# the slowest policies first, so that a pool of two processes balances (longest first): with
# two processes dlrover-rm has one to itself and the other runs the oracle search and the rest;
# the oracle policy right after the search, in the process that holds its results (elsewhere
# it would search again)
_COST_ORDER = {
    "dlrover-rm": 0,
    "oracle": 1,
    "vpa": 2,
    "dlrover-oss": 3,
    "autopilot": 4,
    "optimus": 5,
}
_ORACLES = "\0oracles"  # the task that computes every job's oracle configuration


def _oracles(jobs: Sequence[TraceJob]) -> list[OracleConfig]:
    """Each job's oracle configuration (a grid search per job, deterministic; kept on the
    job's truth, so that a policy run later in the same process reuses it)."""
    return [_oracle_of_job(j) for j in jobs]


def _worker(args: tuple[str, int]) -> tuple[str, Any]:
    name, seed = args
    if name == _ORACLES:
        return name, _oracles(_JOBS)
    return name, _run_policy(_JOBS, name, seed)


def simulate(
    n_jobs: int,
    seed: int,
    policies: Sequence[str] | None = None,
    processes: int = 2,
    keep_jobs: bool = False,
    keep_timing: bool = False,
    allreduce_share: float = 0.0,
) -> dict[str, Any]:
    """Run ``policies`` (default: every registered one) on one generated trace
    (``allreduce_share``: the share of its signatures trained by all-reduce, see
    ``generate_trace``; at 0 the result has no ``allreduce_share`` key, as before).

    With ``processes > 1`` the policies run in a pool of forked processes, the costliest
    first; the jobs' oracle configurations (needed by every policy's
    ``oracle_throughput_ratio`` and by the oracle policy) are one more task of that pool, so
    that the costliest policy does not wait for them (same values: the search is
    deterministic).

    ``keep_timing``: each policy's ``cpu_s`` (simulation CPU time) stays in its metrics; by
    default it is dropped so that a result depends on the trace and the policies alone."""
    global _JOBS
    table = policy_factories(POLICIES)
    names = list(policies) if policies else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise KeyError(f"unknown policies {unknown}; registered: {', '.join(table)}")
    jobs = generate_trace(n_jobs, seed, allreduce_share)
    _JOBS = jobs
    results: dict[str, dict[str, Any]] = {}
    if processes > 1 and len(names) > 1 and "fork" in mp.get_all_start_methods():
        ctx = mp.get_context("fork")
        # the oracle search goes right after the first policy: the second process starts it
        order = sorted(names, key=lambda n: _COST_ORDER.get(n, 9))
        tasks = [*order[:1], _ORACLES, *order[1:]]
        oracles: list[OracleConfig] = []
        with ctx.Pool(min(processes, len(tasks))) as pool:
            for name, res in pool.imap_unordered(_worker, [(n, seed) for n in tasks]):
                if name == _ORACLES:
                    oracles = res
                else:
                    results[name] = res
        for res in results.values():
            _set_oracle_ratio(res, oracles.__getitem__)
    else:
        for n in names:
            results[n] = run_policy(jobs, n, seed)
    for res in results.values():
        if not keep_jobs:
            res.pop("jobs", None)
        if not keep_timing:
            res.pop("cpu_s", None)
    out = {
        "policies": {n: results[n] for n in names},
        "jobs": n_jobs,
        "seed": seed,
        "completion_bound": completion_bound(jobs),
    }
    if allreduce_share:
        out["allreduce_share"] = allreduce_share
        out["allreduce_jobs"] = sum(j.strategy == "allreduce" for j in jobs)
    return out


def completion_bound(jobs: Sequence[TraceJob]) -> float:
    """The highest completion rate any policy can reach on ``jobs``: the share of jobs without
    a code bug (a job with one exits at its ``fatal_at_fraction`` of progress, whatever its
    resources, under every policy)."""
    return sum(j.fatal_at_fraction is None for j in jobs) / len(jobs) if jobs else 0.0


def vs_manual(result: dict[str, Any], name: str) -> dict[str, float] | None:
    pols = result["policies"]
    if "manual" not in pols or name not in pols:
        return None
    m, p = pols["manual"], pols[name]
    return {
        "jct_change": p["jct_median_s"] / m["jct_median_s"] - 1.0,
        "completion_points": p["completion_rate"] - m["completion_rate"],
        "cpu_points": p["cpu_util"] - m["cpu_util"],
        "mem_points": p["mem_util"] - m["mem_util"],
    }


def format_table(result: dict[str, Any]) -> str:
    head = (
        f"{'policy':<12} {'JCT med':>8} {'JCT mean':>9} {'JCT p90':>8} {'compl':>6} "
        f"{'cpu':>5} {'mem':>5} {'scal':>6} {'oom':>5} {'/orc':>5} | "
        f"{'ΔJCT':>6} {'Δcompl':>7} {'Δcpu':>6} {'Δmem':>6}"
    )
    title = f"{result['jobs']} jobs, seed {result['seed']}"
    if "allreduce_jobs" in result:
        title += f", {result['allreduce_jobs']} of them all-reduce"
    lines = [title, head, "-" * len(head)]
    for name, m in result["policies"].items():
        d = vs_manual(result, name)
        rel = (
            f"{d['jct_change'] * 100:+5.0f}% {d['completion_points'] * 100:+6.1f}p "
            f"{d['cpu_points'] * 100:+5.1f}p {d['mem_points'] * 100:+5.1f}p"
            if d
            else ""
        )
        lines.append(
            f"{name:<12} {m['jct_median_s'] / 60:7.0f}m {m['jct_mean_s'] / 60:8.0f}m "
            f"{m['jct_p90_s'] / 60:7.0f}m {m['completion_rate']:6.1%} {m['cpu_util']:5.2f} "
            f"{m['mem_util']:5.2f} {m['scaling_ops']:6d} {m['oom_count']:5d} "
            f"{m['oracle_throughput_ratio']:5.2f} | {rel}"
        )
    return "\n".join(lines)
