"""Simulator: conservation laws, determinism, calibration, baselines."""

from __future__ import annotations

import csv
import io
from functools import cache
from typing import Any

import numpy as np
import pytest

from dlrover_core.sim import (
    PAI_COLUMNS,
    Engine,
    cluster_capacity,
    generate_trace,
    run_policy,
    simulate,
    trace_to_rows,
)
from dlrover_core.sim.registry import policy_factories
from dlrover_core.sim.trace import TraceJob

BASELINES = ["manual", "vpa", "autopilot", "optimus", "oracle"]


@cache
def _trace(n: int, seed: int) -> list[TraceJob]:
    return generate_trace(n, seed)


@cache
def _run(name: str, n: int = 120, seed: int = 3) -> dict[str, Any]:
    return run_policy(_trace(n, seed), name, seed)


@pytest.mark.parametrize("name", BASELINES)
def test_conservation_laws(name: str) -> None:
    jobs = _trace(120, 3)
    cap = cluster_capacity(jobs)
    engine = Engine(jobs, policy_factories()[name](), cap, seed=3)
    engine.run()
    # never more allocated than the cluster has
    assert engine.max_alloc.fits_in(cap)
    assert engine.free_cpu == cap.cpu_millicores and engine.free_mem == cap.memory_mib
    for r in engine.runs:
        assert r.status in ("completed", "failed")  # every job ends
        assert 0 <= r.done <= r.job.samples_total  # progress never exceeds the total
        if r.status == "completed":
            assert r.done == r.job.samples_total
            assert r.end_s >= r.start_s >= r.job.submit_s
        assert r.cpu_used_cs <= r.cpu_alloc_cs * (1 + 1e-9)
        assert r.mem_used_ms <= r.mem_alloc_ms * (1 + 1e-9)


def test_deterministic() -> None:
    a = simulate(40, 11, ["manual", "vpa"], processes=1)
    b = simulate(40, 11, ["manual", "vpa"], processes=1)
    assert a == b


def test_manual_calibration() -> None:
    m = run_policy(_trace(200, 5), "manual", 5)
    # production under manual configuration: ~20% CPU, ~15% memory, 84-90% completion
    assert m["cpu_util"] == pytest.approx(0.2, abs=0.07)
    assert m["mem_util"] == pytest.approx(0.15, abs=0.07)
    assert 0.8 <= m["completion_rate"] <= 0.93


def test_oracle_beats_manual_per_core() -> None:
    assert _run("oracle")["oracle_throughput_ratio"] > _run("manual")["oracle_throughput_ratio"]
    assert _run("oracle")["oracle_throughput_ratio"] == pytest.approx(1.0, abs=0.1)
    assert _run("oracle")["oom_count"] == 0


def test_oracle_config_is_the_fastest_efficient_point_of_its_grid() -> None:
    from dlrover_core.sim import truth as T

    for j in _trace(20, 3):
        q = j.quota
        o = j.truth.oracle_config(q.cpu_cores, q.memory_mib)
        g = j.truth.oracle_grid(q.cpu_cores, q.memory_mib)
        x = g.inv ** (-1.0 / j.truth.smooth_k)
        at = (
            list(T._ORACLE_W).index(o.workers),
            list(T._ORACLE_CPU).index(o.worker_cpu_cores),
            list(T._ORACLE_P).index(o.ps),
            list(T._ORACLE_CPU).index(o.ps_cpu_cores),
        )
        assert g.ok[at] and x[at] == pytest.approx(o.throughput_sps)
        per_core = x / g.cores
        efficient = g.ok & (per_core >= T.ORACLE_EFFICIENCY_KEEP * per_core[g.ok].max())
        assert x[efficient].max() == pytest.approx(o.throughput_sps)
        assert o.ps_memory_mib == g.ps_memory_mib[at[2]]
        # the job's own hottest shares passed in give the same grid, and its choice
        own = [j.truth.max_share(int(p)) for p in T._ORACLE_P]
        g2 = j.truth.oracle_grid(q.cpu_cores, q.memory_mib, np.array(own))
        assert np.array_equal(g2.inv, g.inv)
        flat, x_best = g2.choice(j.truth.smooth_k)
        assert np.unravel_index(flat, g.inv.shape) == at and x_best == o.throughput_sps


@pytest.mark.parametrize("name", BASELINES)
def test_each_baseline_runs(name: str) -> None:
    m = _run(name)
    assert 0 < m["completion_rate"] <= 1
    assert 0 < m["cpu_util"] <= 1 and 0 < m["mem_util"] <= 1
    assert m["jct_median_s"] > 0


def test_trace_schema_and_csv() -> None:
    jobs = _trace(30, 2)
    rows = trace_to_rows(jobs)
    assert len(rows) == 2 * len(jobs)
    assert all(tuple(r) == PAI_COLUMNS for r in rows)
    assert {r["task_name"] for r in rows} == {"ps", "worker"}
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(PAI_COLUMNS))
    w.writeheader()
    w.writerows(rows)
    assert buf.getvalue().count("\n") == len(rows) + 1
    for r in rows:
        assert r["plan_cpu"] > 0 and r["cpu_usage"] <= r["plan_cpu"] + 1e-6


def test_trace_has_recurring_groups_sizes_and_quota() -> None:
    jobs = _trace(200, 5)
    sigs = [j.signature for j in jobs]
    assert any(sigs.count(s) >= 3 for s in set(sigs))  # history exists for warm start
    assert {j.size_class for j in jobs} == {"small", "large"}
    assert all(j.manual_plan.total.fits_in(j.quota) for j in jobs)
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)


def test_result_shape() -> None:
    res = simulate(20, 1, ["manual", "oracle"], processes=1)
    assert res["jobs"] == 20 and res["seed"] == 1
    for m in res["policies"].values():
        for key in (
            "jct_median_s",
            "jct_mean_s",
            "jct_p90_s",
            "completion_rate",
            "cpu_util",
            "mem_util",
            "scaling_ops",
            "oom_count",
            "oracle_throughput_ratio",
        ):
            assert key in m


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(KeyError, match="unknown"):
        simulate(5, 1, ["nope"], processes=1)


def test_dlrover_oss_peer_runs_or_is_reported_unavailable() -> None:
    from dlrover_core.sim.runner import unavailable_policies

    if "dlrover-oss" in unavailable_policies():
        assert "dlrover-oss" not in policy_factories()
        pytest.skip(unavailable_policies()["dlrover-oss"])
    m = run_policy(_trace(60, 4), "dlrover-oss", 4)
    assert 0 < m["completion_rate"] <= 1 and m["scaling_ops"] > 0


def test_completion_bound_is_the_share_without_code_bugs_and_no_policy_passes_it() -> None:
    from dlrover_core.sim.runner import completion_bound

    jobs = _trace(60, 4)
    bugs = {j.name for j in jobs if j.fatal_at_fraction is not None}
    assert bugs  # the trace has code bugs: the bound is below 1
    assert completion_bound(jobs) == pytest.approx(1 - len(bugs) / len(jobs))
    assert completion_bound([]) == 0.0
    res = simulate(60, 4, ["manual", "dlrover-rm"], processes=1, keep_jobs=True)
    assert res["completion_bound"] == pytest.approx(completion_bound(jobs))
    for m in res["policies"].values():
        assert m["completion_rate"] <= res["completion_bound"] + 1e-12
        failed = {j["name"]: j["reason"] for j in m["jobs"] if j["status"] != "completed"}
        # every code bug fails its job under every policy, with its own reason
        assert bugs <= set(failed) and all(failed[b] == "fatal code error" for b in bugs)


def test_allreduce_truth_is_lockstep_compute_bounded_by_the_exchange() -> None:
    """``JobTruth.allreduce_throughput``: one rank is the worker compute rate; more ranks add
    compute but pay the exchange (hops and bytes), so the rate stays under both bounds and
    a slow exchange caps it however many cores the ranks get."""
    import dataclasses

    from dlrover_core.sim.truth import JobTruth

    t = JobTruth(
        seed=0, samples_total=1, c_w=1e-4, k_w=4.0, o_w=0.5, c_p=1e-5, k_p=8.0, o_p=0.5,
        net_bytes_per_sample=1.0, ps_bandwidth_bps=1e9, skew_alpha=40.0,
        worker_memory_mib=0.0, ps_base_memory_mib=0.0, dense_memory_mib=0.0, emb_k=1.0,
        emb_beta=0.5, row_mib=0.0, sync_hop_s=2e-3, sync_bytes_per_sample=100.0,
    )  # fmt: skip
    one = t.allreduce_throughput(1, 1.0, 256)
    assert one == pytest.approx(float(t.eff_worker(1.0)) / t.c_w)
    four = t.allreduce_throughput(4, 1.0, 256)
    assert one < four < 4 * one  # more ranks help, less than linearly
    assert t.allreduce_throughput(4, 2.0, 256) > four  # more cores per rank help
    slow = dataclasses.replace(t, sync_hop_s=1.0)
    cap = 4 * 256 / (2 * 3 * 1.0)  # the exchange alone: rows per step / its seconds
    assert slow.allreduce_throughput(4, 16.0, 256) < cap


def test_a_simulated_jobs_spec_lets_the_planner_reach_the_oracles_configuration() -> None:
    """The spec the simulator writes for a job bounds what the planner may choose: it must
    reach every configuration the oracle may pick (it capped PS at 15, and a quarter of the
    jobs had an oracle configuration of 16-32 PS)."""
    from dlrover_core.planner.bounds import JobBounds
    from dlrover_core.sim import truth as T
    from dlrover_core.sim.engine import job_view
    from dlrover_core.sim.spec_bridge import job_view_to_spec

    jobs = _trace(300, 1)
    oracle_ps = [j.truth.oracle_config(j.quota.cpu_cores, j.quota.memory_mib).ps for j in jobs]
    assert max(oracle_ps) > 15  # the trace needs more than the old cap
    for j in jobs[:20]:
        b = JobBounds.from_spec(job_view_to_spec(job_view(j)))
        assert b.ps.max_count >= T.ORACLE_MAX_PS
        assert b.workers.max_count >= int(T._ORACLE_W.max())
