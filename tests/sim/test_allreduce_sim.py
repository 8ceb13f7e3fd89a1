"""The simulator's all-reduce jobs (issue 33 item 3): traces with a share of them, every policy
runs them to an end state, no PS in them, dlrover-rm resizes them through the planner's
all-reduce stages, and the default share changes nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import cache

import numpy as np
import pytest

from dlrover_core.sim import Engine, cluster_capacity, generate_trace, run_policy, simulate
from dlrover_core.sim.policies import POLICIES
from dlrover_core.sim.registry import policy_factories
from dlrover_core.sim.rm_policy import DLRoverRMPolicy
from dlrover_core.sim.trace import TraceJob
from dlrover_core.types import Stage

N, SEED, SHARE = 16, 5, 0.5


@cache
def _trace(n: int = N, seed: int = SEED, share: float = SHARE) -> tuple[TraceJob, ...]:
    return tuple(generate_trace(n, seed, share))


@cache
def _engine(name: str) -> tuple[Engine, object]:
    jobs = list(_trace())
    policy = policy_factories(POLICIES)[name]()
    bind = getattr(policy, "bind_truths", None)
    if bind is not None:
        bind({j.name: j.truth for j in jobs})
    engine = Engine(jobs, policy, cluster_capacity(jobs), SEED)
    engine.run()
    return engine, policy


def test_share_draws_from_its_own_stream() -> None:
    """At share 0 the trace is the PS-only trace; at a share > 0 its PS jobs are those of the
    PS-only trace, draw for draw (only whole signatures turn all-reduce)."""
    base = generate_trace(60, 11)
    assert all(j.strategy == "ps" for j in base)
    assert [j.name for j in generate_trace(60, 11, 0.0)] == [j.name for j in base]
    mixed = generate_trace(60, 11, 0.4)
    assert [j.name for j in mixed] == [j.name for j in base]
    ar = [j for j in mixed if j.strategy == "allreduce"]
    assert 0 < len(ar) < len(mixed)
    for a, b in zip(base, mixed, strict=True):
        if b.strategy == "ps":
            assert (a.manual_plan, a.submit_s, a.quota, a.samples_total) == (
                b.manual_plan,
                b.submit_s,
                b.quota,
                b.samples_total,
            )
            assert a.truth.c_w == b.truth.c_w and a.truth.emb_k == b.truth.emb_k
    sigs = {j.signature: j.strategy for j in mixed}
    assert all(sigs[j.signature] == j.strategy for j in mixed)  # every run of a signature
    for j in ar:
        assert j.manual_plan.ps.count == 0 and j.manual_plan.workers.count >= 1
        assert j.truth.rank_table_mib > 0 and j.truth.sync_bytes_per_sample > 0
        assert j.manual_plan.total.fits_in(j.quota)
    with pytest.raises(ValueError, match="allreduce_share"):
        generate_trace(5, 1, 1.5)


def test_rank_truth_memory_shrinks_and_sync_grows_with_ranks() -> None:
    j = next(j for j in _trace() if j.strategy == "allreduce")
    t = j.truth
    assert t.rank_memory_mib(1) > t.rank_memory_mib(2) > t.rank_memory_mib(16)
    assert t.rank_memory_mib(64) > t.worker_memory_mib
    # per-rank throughput falls as the ring grows (the exchange), so an oracle exists
    per_rank = [t.allreduce_throughput(w, 8.0, j.batch_size) / w for w in (1, 4, 16, 64)]
    assert per_rank == sorted(per_rank, reverse=True)
    o = t.allreduce_oracle_config(j.quota.cpu_cores, j.quota.memory_mib, j.batch_size)
    assert o.ps == 0 and o.cores <= j.quota.cpu_cores
    assert o.workers * o.worker_memory_mib <= j.quota.memory_mib
    assert o.worker_memory_mib >= t.rank_memory_mib(o.workers)
    # a straggler slows the whole group; its rank reads busy while the others wait
    assert t.allreduce_throughput(4, 8.0, j.batch_size, 0.5) < t.allreduce_throughput(
        4, 8.0, j.batch_size
    )
    cpus, speeds = np.full(4, 8.0), np.array([1.0, 1.0, 0.4, 1.0])
    x = t.allreduce_throughput(4, 8.0, j.batch_size, 0.4)
    used = t.allreduce_cpu_used(cpus, speeds, x)
    assert used[2] > 2 * float(np.median(np.delete(used, 2)))


@pytest.mark.parametrize("name", list(policy_factories(POLICIES)))
def test_every_policy_runs_allreduce_jobs_to_an_end_state(name: str) -> None:
    engine, _ = _engine(name)
    ar = [r for r in engine.runs if r.job.strategy == "allreduce"]
    assert ar and len(ar) < len(engine.runs)
    assert all(r.status in ("completed", "failed") for r in engine.runs)
    for r in ar:
        assert r.ps == [] and r.plan is not None and r.plan.ps.count == 0
        assert r.done <= r.job.samples_total
    done = [r for r in ar if r.status == "completed"]
    assert done, f"{name}: no all-reduce job completed"
    # the cluster was never over-allocated (the engine raises if it is) and all is released
    assert engine.free_cpu == engine.capacity.cpu_millicores
    assert engine.free_mem == engine.capacity.memory_mib


def test_dlrover_rm_resizes_allreduce_jobs_through_the_planner_stages() -> None:
    engine, policy = _engine("dlrover-rm")
    assert isinstance(policy, DLRoverRMPolicy)
    ar = [r for r in engine.runs if r.job.strategy == "allreduce"]
    stage2 = stage3 = 0
    for r in ar:
        plans = policy._jobs[r.job.name].plans
        assert all(p.ps.count == 0 for p in plans)
        stage2 += sum(
            p.stage is Stage.SCALING and p.reasons[0].startswith("all-reduce:") for p in plans
        )
        stage3 += sum(
            p.stage is Stage.POST_SCALING and p.reasons[0].startswith("all-reduce") for p in plans
        )
    assert stage2 > 0 and stage3 > 0
    assert sum(r.scaling_ops for r in ar) > 0
    # first runs are profiled (the model needs several configurations), later runs of the
    # signature start warm from the history and are not
    first = {r.job.signature: r for r in sorted(ar, key=lambda r: r.job.submit_s)}
    assert any(r.profiled_s > 0 for r in ar)
    later = [r for r in ar if r is not first[r.job.signature] and r.start_s > 0]
    assert all(r.profiled_s == 0 for r in later if policy._jobs[r.job.name].prior)
    # each resize's downtime reaches the planner, which prices the next one on it (the
    # runtime's strategy does the same): none priced at the prior once one was measured
    resized = [r for r in ar if r.scaling_ops > 0]
    for r in resized:
        cost = policy._jobs[r.job.name].planner.resize_cost
        assert len(cost.measured_s) == r.scaling_ops
        assert cost.estimate_s == engine.cfg.allreduce_pause_s


def test_dlrover_oss_and_manual_keep_the_users_ranks() -> None:
    for name in ("manual", "dlrover-oss"):
        engine, _ = _engine(name)
        for r in engine.runs:
            if r.job.strategy == "allreduce" and r.plan is not None:
                assert r.plan.workers.count == r.job.manual_plan.workers.count
                assert r.scaling_ops == 0


def test_oracle_starts_allreduce_jobs_at_their_oracle_ranks() -> None:
    engine, _ = _engine("oracle")
    for r in engine.runs:
        j = r.job
        if j.strategy == "allreduce" and r.plan is not None:
            o = j.truth.allreduce_oracle_config(j.quota.cpu_cores, j.quota.memory_mib, j.batch_size)
            assert r.plan.workers.count == o.workers
            assert r.oom_count == 0


def test_simulate_reports_the_share() -> None:
    res = simulate(N, SEED, ["manual", "oracle"], processes=1, allreduce_share=SHARE)
    assert res["allreduce_jobs"] == sum(j.strategy == "allreduce" for j in _trace())
    assert "allreduce_share" not in simulate(4, SEED, ["manual"], processes=1)


# per policy and job: (name, status, reason, end, samples done), then scaling ops and OOMs,
# of a 20-job PS trace (seed 7) before the simulator ran all-reduce jobs (commit 3199d01);
# dlrover-rm's entries re-pinned when the simulated spec's PS cap went from 15 to the oracle's
# 32 (the other policies' entries unchanged, checked)
DEFAULT_SHARE_DIGEST = "12fd062de47aab08b42de305ef6a6f684acf22c38af4fedabf23482ba6a7bdf2"


def test_default_share_reproduces_the_ps_only_results() -> None:
    out = {}
    for name in policy_factories(POLICIES):
        r = run_policy(generate_trace(20, 7), name, 7)
        out[name] = [
            (j["name"], j["status"], j["reason"], round(j["end_s"], 3), round(j["samples_done"]))
            for j in r["jobs"]
        ] + [r["scaling_ops"], r["oom_count"]]
    digest = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    assert digest == DEFAULT_SHARE_DIGEST


def test_manual_allreduce_job_below_its_memory_crash_loops_and_fails() -> None:
    """A rank below its need runs out of memory as it loads its shards; manual relaunches
    the group at the same memory until the fault rule's budget is spent."""
    jobs = [
        j
        for j in generate_trace(120, 3, 1.0)
        if j.manual_plan.workers.resources.memory_mib
        < j.truth.rank_memory_mib(j.manual_plan.workers.count)
    ][:1]
    assert jobs, "no under-provisioned all-reduce job in the trace"
    job = dataclasses.replace(jobs[0], index=0, submit_s=0.0, fatal_at_fraction=None)
    eng = Engine([job], policy_factories(POLICIES)["manual"](), cluster_capacity([job]), 1)
    eng.run()
    (run,) = eng.runs
    assert run.status == "failed" and "OOM" in run.fail_reason and run.oom_count >= 2
