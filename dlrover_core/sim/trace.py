"""A generated cluster trace in the schema of Alibaba PAI cluster-trace-gpu-v2020.

The real PAI files cannot be fetched here, so jobs are drawn from distributions chosen to land
where production does under users' manual configuration: ~20% CPU and ~15% memory utilisation,
~84–90% completion, with OOM from under-provisioned PS memory and hot PS from too few PS.

Jobs come in recurring groups (one signature retrained daily, so history exists for warm
start) and one-offs; ~30% are "large" (>= 100 requested cores).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlrover_core.sim.truth import JobTruth
from dlrover_core.types import NodeResources, ResourcePlan, RolePlan, Stage
from dlrover_core.units import gib, mib_from_bytes, mib_from_gib, millicores_from_cores

DAY_S = 86_400.0
LARGE_JOB_CORES = 100.0
FATAL_BUG_PROB = 0.025  # a code bug kills the job whatever its resources
PS_MEMORY_UNDER_PROB = {"small": 0.07, "large": 0.16}  # users who under-provision PS memory
HOT_PS_PROB = 0.2  # users who configure far too few PS
ALLREDUCE_MEMORY_UNDER_PROB = 0.1  # all-reduce users who ask for too little memory per rank

PAI_COLUMNS = (
    "job_name",
    "task_name",
    "inst_id",
    "user",
    "status",
    "submit_time",
    "start_time",
    "end_time",
    "inst_num",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "cpu_usage",
    "avg_mem",
    "max_mem",
    "signature",
)


@dataclass(frozen=True)
class TraceJob:
    """One submitted job: what the user asked for, and (hidden) how it really behaves."""

    index: int
    name: str
    user: str
    signature: str
    recurring: bool
    submit_s: float
    manual_plan: ResourcePlan
    quota: NodeResources
    batch_size: int
    samples_total: int
    rows: int
    epochs: int
    embedding_dim: int
    sparse_features: int
    dense_features: int
    size_class: str  # "small" | "large"
    fatal_at_fraction: float | None  # a code bug exits the job at this progress (all policies)
    manual_duration_s: float  # the generator's target wall time under the manual plan
    truth: JobTruth
    strategy: str = "ps"  # "ps" | "allreduce" (ranks only: no PS; see ``_as_allreduce``)

    @property
    def seed(self) -> int:
        return self.truth.seed


def _plan(w: int, wcpu: float, wmem: int, p: int, pcpu: float, pmem: int) -> ResourcePlan:
    return ResourcePlan(
        workers=RolePlan(w, NodeResources(millicores_from_cores(wcpu), int(wmem))),
        ps=RolePlan(p, NodeResources(millicores_from_cores(pcpu), int(pmem))),
        stage=Stage.COLD_START,
        reasons=("user's manual configuration",),
    )


@dataclass(frozen=True)
class _Signature:
    name: str
    user: str
    size_class: str
    truth: JobTruth
    batch_size: int
    embedding_dim: int
    sparse_features: int
    dense_features: int
    epochs: int
    manual: ResourcePlan
    duration_s: float
    x_manual: float
    strategy: str = "ps"


def _make_signature(rng: np.random.Generator, sig_id: int, seed: int) -> _Signature:
    large = bool(rng.random() < 0.3)
    batch = int(rng.choice([256, 512, 1024, 2048]))
    dim = int(rng.choice([16, 32, 64, 128]))
    sparse = int(rng.integers(10, 41))
    c_w = float(np.exp(rng.normal(np.log(1.5e-3), 0.4)))
    row_mib = mib_from_bytes(dim * 4 * 3)  # fp32 row + two optimizer slots
    beta = float(rng.uniform(0.5, 0.9))
    truth = JobTruth(
        seed=int(seed * 100_003 + sig_id),
        samples_total=1,  # set below, per run
        c_w=c_w,
        k_w=float(rng.uniform(2.5, 8.0)),
        o_w=float(rng.uniform(0.5, 1.5)),
        c_p=c_w * float(rng.uniform(0.15, 0.5)),
        k_p=float(rng.uniform(6.0, 16.0)),
        o_p=float(rng.uniform(0.5, 1.0)),
        net_bytes_per_sample=sparse * dim * 4 * 2 * float(rng.uniform(0.8, 1.2)),
        ps_bandwidth_bps=1.25e9 * float(rng.uniform(0.6, 1.0)),
        skew_alpha=float(np.exp(rng.uniform(np.log(1.5), np.log(40.0)))),
        worker_memory_mib=float(mib_from_gib(rng.uniform(2.0, 6.0))),
        ps_base_memory_mib=float(mib_from_gib(rng.uniform(1.0, 2.0))),
        dense_memory_mib=float(mib_from_gib(rng.uniform(0.2, 4.0))),
        emb_k=1.0,  # set below
        emb_beta=beta,
        row_mib=row_mib,
    )
    # the user's manual request: oversized nodes, a guessed PS count
    wcpu = float(rng.choice([12, 16, 24, 32], p=[0.15, 0.3, 0.3, 0.25]))
    pcpu = float(rng.choice([8, 16, 24, 32], p=[0.3, 0.35, 0.2, 0.15]))
    if large:
        w = int(rng.integers(max(3, math.ceil(70 / wcpu)), max(8, math.ceil(400 / wcpu)) + 1))
    else:
        w = int(rng.integers(1, max(2, int(60 // wcpu)) + 1))
    xw = truth.throughput(w, 64, wcpu, 64.0)  # worker-bound rate
    p_need = 1
    while p_need < 32 and truth.rates([wcpu] * w, [pcpu] * p_need)[2] < xw:
        p_need += 1
    if rng.random() < HOT_PS_PROB:
        p = max(1, int(round(p_need * rng.uniform(0.25, 0.5))))
    else:
        p = max(1, int(round(p_need * rng.uniform(1.0, 2.0))))
    if not large:
        while p > 1 and w * wcpu + p * pcpu >= LARGE_JOB_CORES:
            p -= 1
        while w > 1 and w * wcpu + p * pcpu >= LARGE_JOB_CORES:
            w -= 1
    x_manual = truth.throughput(w, p, wcpu, pcpu)
    duration = float(np.clip(np.exp(rng.normal(np.log(1.5 * 3600), 0.7)), 900, 12 * 3600))
    if large:
        duration = min(duration * 1.5, 16 * 3600)
    samples = int(x_manual * duration)
    u_end = float(np.exp(rng.uniform(np.log(2e6), np.log(6e7 if large else 1.5e7))))
    truth = dataclasses.replace(
        truth, samples_total=samples, emb_k=u_end / samples**beta, _shares={}, _oracle={}
    )
    wmem = int(mib_from_gib(math.ceil(gib(truth.worker_memory_mib * rng.uniform(4.0, 9.0)))))
    need = float(truth.ps_memory_used(p, samples).max())
    if rng.random() < PS_MEMORY_UNDER_PROB["large" if large else "small"]:
        pmem = int(need * rng.uniform(0.55, 0.9))
    else:
        pmem = int(mib_from_gib(math.ceil(gib(need * rng.uniform(2.5, 6.0)))))
    return _Signature(
        name=f"sig{sig_id:04d}",
        user=f"user{int(rng.integers(0, 60)):02d}",
        size_class="large" if w * wcpu + p * pcpu >= LARGE_JOB_CORES else "small",
        truth=truth,
        batch_size=batch,
        embedding_dim=dim,
        sparse_features=sparse,
        dense_features=int(rng.integers(8, 64)),
        epochs=int(rng.integers(1, 4)),
        manual=_plan(w, wcpu, wmem, p, pcpu, pmem),
        duration_s=duration,
        x_manual=x_manual,
    )


def _as_allreduce(sig: _Signature, rng: np.random.Generator) -> _Signature:
    """``sig`` trained by all-reduce instead (ranks, no PS), drawn from ``rng``.

    The ranks compute as the signature's workers do (``c_w``, ``k_w``, ``o_w``: CPU-bound
    DLRM steps); each step they synchronise (a ring): ``sync_hop_s`` per hop, 1–8 ms
    (gloo's latency over TCP and the dense gradients' chunk per hop), and the pooled
    embeddings' all-to-all, ``sparse x dim x 4 B`` forward and backward per sample, at
    0.6–1.4 GB/s per rank (DOMAIN.md: gloo bulk ~1.4 GB/s). The tables are fixed-size as the
    trainer builds them (100,003 rows per table, fp32 weights + one optimizer slot), sharded
    over the ranks (``JobTruth.rank_memory_mib``). The user asks for the signature's worker
    count as ranks (at most 32) at its CPU per worker, and memory per rank 1.3–3x the true
    need, or (``ALLREDUCE_MEMORY_UNDER_PROB``) 0.6–0.95x of it. The run is as long as the
    signature's under that request."""
    t = sig.truth
    dim, sparse = sig.embedding_dim, sig.sparse_features
    truth = dataclasses.replace(
        t,
        sync_hop_s=float(np.exp(rng.uniform(np.log(1e-3), np.log(8e-3)))),
        sync_bytes_per_sample=sparse * dim * 4 * 2 * float(rng.uniform(0.8, 1.2)),
        ps_bandwidth_bps=float(rng.uniform(0.6e9, 1.4e9)),
        rank_table_mib=mib_from_bytes(sparse * 100_003 * dim * 4 * 2),
        _shares={},
        _oracle={},
        _ar_oracle={},
    )
    w = min(32, sig.manual.workers.count)
    wcpu = sig.manual.workers.resources.cpu_cores
    x_manual = truth.allreduce_throughput(w, wcpu, sig.batch_size)
    samples = int(x_manual * sig.duration_s)
    truth = dataclasses.replace(truth, samples_total=samples, _ar_oracle={})
    need = truth.rank_memory_mib(w)
    if rng.random() < ALLREDUCE_MEMORY_UNDER_PROB:
        wmem = int(need * rng.uniform(0.6, 0.95))
    else:
        wmem = int(mib_from_gib(math.ceil(gib(need * rng.uniform(1.3, 3.0)))))
    manual = ResourcePlan(
        workers=RolePlan(w, NodeResources(millicores_from_cores(wcpu), wmem)),
        ps=RolePlan(0, NodeResources(0, 0)),
        stage=Stage.COLD_START,
        reasons=("user's manual configuration (all-reduce ranks)",),
    )
    return dataclasses.replace(
        sig,
        size_class="large" if w * wcpu >= LARGE_JOB_CORES else "small",
        truth=truth,
        manual=manual,
        x_manual=x_manual,
        strategy="allreduce",
    )


def generate_trace(n_jobs: int, seed: int, allreduce_share: float = 0.0) -> list[TraceJob]:
    """``n_jobs`` jobs over ``max(3, n_jobs/100)`` days, sorted by submit time.

    ``allreduce_share``: the chance that a signature (all its runs) trains by all-reduce
    (``_as_allreduce``). Which ones, and their all-reduce parameters, come from a stream of
    their own, so the trace is the same otherwise: at 0 it is the PS-only trace, draw for draw."""
    if n_jobs < 1:
        raise ValueError("n_jobs must be >= 1")
    if not 0.0 <= allreduce_share <= 1.0:
        raise ValueError(f"allreduce_share must be in [0, 1], got {allreduce_share!r}")
    rng = np.random.default_rng([seed, 1])
    rng_ar = np.random.default_rng([seed, 2]) if allreduce_share > 0 else None
    days = max(3.0, n_jobs / 100.0)
    span = days * DAY_S
    entries: list[tuple[float, _Signature, int, bool]] = []
    sig_id = 0
    while len(entries) < n_jobs:
        sig = _make_signature(rng, sig_id, seed)
        sig_id += 1
        if rng_ar is not None and rng_ar.random() < allreduce_share:
            sig = _as_allreduce(sig, rng_ar)
        if rng.random() < 0.6:  # a recurring pipeline: daily retrains at the same hour
            runs = min(n_jobs - len(entries), int(rng.integers(3, 11)), max(1, int(days)))
            start = float(rng.uniform(0, DAY_S))
            for r in range(runs):
                t = start + r * DAY_S + float(rng.normal(0, 900))
                entries.append((min(max(t, 0.0), span), sig, r, True))
        else:
            entries.append((float(rng.uniform(0, span)), sig, 0, False))
    entries.sort(key=lambda e: e[0])
    jobs: list[TraceJob] = []
    for i, (t, sig, run, recurring) in enumerate(entries[:n_jobs]):
        growth = 1.0 + 0.02 * run  # the daily dataset grows a little
        samples = int(sig.truth.samples_total * growth)
        truth = dataclasses.replace(
            sig.truth, samples_total=samples, _shares={}, _oracle={}, _ar_oracle={}
        )
        manual = sig.manual
        tot = manual.total
        quota = NodeResources(
            max(2 * tot.cpu_millicores, 16_000), max(2 * tot.memory_mib, mib_from_gib(64))
        )
        fatal = float(rng.uniform(0.05, 0.9)) if rng.random() < FATAL_BUG_PROB else None
        jobs.append(
            TraceJob(
                index=i,
                name=f"job{i:05d}-{sig.name}-r{run}",
                user=sig.user,
                signature=sig.name,
                recurring=recurring,
                submit_s=t,
                manual_plan=manual,
                quota=quota,
                batch_size=sig.batch_size,
                samples_total=samples,
                rows=max(1, samples // sig.epochs),
                epochs=sig.epochs,
                embedding_dim=sig.embedding_dim,
                sparse_features=sig.sparse_features,
                dense_features=sig.dense_features,
                size_class=sig.size_class,
                fatal_at_fraction=fatal,
                manual_duration_s=sig.duration_s * growth,
                truth=truth,
                strategy=sig.strategy,
            )
        )
    return jobs


def trace_to_rows(
    jobs: list[TraceJob], outcomes: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One row per task (role) of each job, in PAI's column names (see ``PAI_COLUMNS``).

    ``plan_cpu`` is cores x 100 and memory is GiB, as in PAI. Usage columns come from
    ``outcomes[job_name]`` (keys: status, start_time, end_time, and per role
    ``{role}_cpu_usage`` / ``{role}_avg_mem`` / ``{role}_max_mem``) when given, else from the
    job's truth under its manual plan (what the trace "recorded").
    """
    rows: list[dict[str, Any]] = []
    for j in jobs:
        out = (outcomes or {}).get(j.name)
        plan = j.manual_plan
        wcpu = plan.workers.resources.cpu_cores
        pcpu = plan.ps.resources.cpu_cores
        roles: list[tuple[str, RolePlan, float, float, float]]
        if j.strategy == "allreduce":  # ranks only: one row, no PS
            n = plan.workers.count
            x = j.truth.allreduce_throughput(n, wcpu, j.batch_size)
            ru = j.truth.allreduce_cpu_used(np.full(n, wcpu), np.ones(n), x)
            need = j.truth.rank_memory_mib(n)
            roles = [("worker", plan.workers, float(ru.mean()), need, need)]
        else:
            x, xw, _, _ = j.truth.rates([wcpu] * plan.workers.count, [pcpu] * plan.ps.count)
            wu, pu = j.truth.cpu_used(
                np.full(plan.workers.count, wcpu), np.full(plan.ps.count, pcpu), x, xw
            )
            ps_end = j.truth.ps_memory_used(plan.ps.count, j.samples_total)
            ps_mid = j.truth.ps_memory_used(plan.ps.count, j.samples_total / 2)
            roles = [
                (
                    "worker",
                    plan.workers,
                    float(wu.mean()),
                    j.truth.worker_memory_mib,
                    j.truth.worker_memory_mib,
                ),
                ("ps", plan.ps, float(pu.mean()), float(ps_mid.mean()), float(ps_end.max())),
            ]
        for role, rp, cpu_use, avg_mem, max_mem in roles:
            status = out["status"] if out else "Terminated"
            start = out["start_time"] if out else j.submit_s
            end = out["end_time"] if out else j.submit_s + j.manual_duration_s
            if out:
                cpu_use = out.get(f"{role}_cpu_usage", cpu_use)
                avg_mem = out.get(f"{role}_avg_mem", avg_mem)
                max_mem = out.get(f"{role}_max_mem", max_mem)
            rows.append(
                {
                    "job_name": j.name,
                    "task_name": role,
                    "inst_id": j.index,
                    "user": j.user,
                    "status": status,
                    "submit_time": round(j.submit_s, 1),
                    "start_time": round(float(start), 1),
                    "end_time": round(float(end), 1),
                    "inst_num": rp.count,
                    "plan_cpu": round(rp.resources.cpu_cores * 100, 1),
                    "plan_mem": round(gib(rp.resources.memory_mib), 3),
                    "plan_gpu": 0,
                    "cpu_usage": round(cpu_use * 100, 1),
                    "avg_mem": round(gib(avg_mem), 3),
                    "max_mem": round(gib(max_mem), 3),
                    "signature": j.signature,
                }
            )
    return rows
