"""Discrete-event simulator of a shared CPU cluster running DLRM jobs under one policy: PS jobs
(workers + parameter servers) and all-reduce jobs (a lockstep group of ranks, no PS).

Between events every job runs at a constant true rate, so progress, CPU/memory integrals,
the failure hazard and the PS memory growth are integrated exactly and the next event
(completion, OOM crossing, node failure, code bug, node back up, pause end, policy call) is
solved for in closed form: no ticks, no wall clock, no threads.

Policies see only ``Observation``s, steady-window ``Sample``s, exits with their class and
``HistoryRecord``s of earlier runs of the same signature (see policies.py).

All-reduce jobs (``TraceJob.strategy == "allreduce"``): the group trains only while every rank
is up, at ``JobTruth.allreduce_throughput`` (the slowest rank sets the pace); a rank needs
``JobTruth.rank_memory_mib`` (OOM below it); a resize pauses the group ``allreduce_pause_s``
(checkpoint, new world size, resharded load); a rank's exit stops the whole group, which is
relaunched (every rank down ``relaunch_delay_s``) under the fault rule's budgets counted per
group, as the runtime's all-reduce strategy does. A policy may ask for profiling trials
before a job trains (``profile_plans``, optional): each costs ``profile_trial_s`` of the job's
wall time and its cores, and leaves one speed sample.

Conservation laws (tested): the allocated total never exceeds the cluster capacity; every job
ends (completed or failed; a horizon guard fails what is left); samples done <= total.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dlrover_core.faults import DEFAULT_FAULT_POLICY, FaultPolicy
from dlrover_core.faults import RelaunchDecision as FaultRuling
from dlrover_core.sim.policies import ExitClass, JobView, Policy, RelaunchDecision
from dlrover_core.sim.trace import TraceJob
from dlrover_core.types import (
    HistoryRecord,
    NodeObservation,
    NodeOverride,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
    Sample,
)
from dlrover_core.units import cores, millicores_from_cores_truncated

INF = math.inf


def _node_observation(
    role: Role,
    node_id: int,
    state: NodeState,
    allocated: NodeResources,
    cpu_used_millicores: int,
    memory_used_mib: int,
    state_since_s: float,
    throughput_sps: float,
) -> NodeObservation:
    """``NodeObservation(...)`` with every field given, without the frozen dataclass's
    field-by-field ``object.__setattr__`` (half the cost; observations of jobs with a hundred
    workers are the simulator's hottest loop). The same value: tests/sim compares the two."""
    o = _new(NodeObservation)
    _set(o, "__dict__", {
        "role": role, "node_id": node_id, "state": state, "allocated": allocated,
        "cpu_used_millicores": cpu_used_millicores, "memory_used_mib": memory_used_mib,
        "state_since_s": state_since_s, "throughput_sps": throughput_sps,
    })  # fmt: skip
    return o


_new = object.__new__
_set = object.__setattr__


def _sample(fields: dict[str, Any]) -> Sample:
    """``Sample(**fields)`` (every field given, by name) without the frozen dataclass's
    field-by-field ``object.__setattr__``: one is built per steady window of every running
    job. The same value: tests/sim compares the two."""
    o = _new(Sample)
    _set(o, "__dict__", fields)
    return o


@dataclass(frozen=True)
class EngineConfig:
    worker_pause_s: float = 30.0  # job-wide pause when workers are added/resized
    ps_pause_s: float = 120.0  # job-wide pause for a PS change / migration
    relaunch_delay_s: float = 60.0  # a relaunched node is allocated but not up yet
    sample_window_s: float = 60.0  # config stable this long -> a Sample (a speed window)
    # the runtime's relaunch rule (budgets per node and exit class, the OOM cap): one rule book
    faults: FaultPolicy = DEFAULT_FAULT_POLICY
    node_failure_per_hour: float = 1.0 / 150.0  # Poisson, per allocated node
    hardware_fraction: float = 0.3  # of failures; the rest are KILLED (preemption)
    straggler_prob: float = 0.05
    straggler_speed: tuple[float, float] = (0.3, 0.6)
    keep_observations: int = 24
    keep_samples: int = 64
    head_reservation_s: float = 1800.0  # queue head waiting longer blocks backfill
    horizon_extra_s: float = 14 * 86_400.0
    hang_s: float = 6 * 3600.0  # no progress this long: the job is declared hung and fails
    # all-reduce: a resize stops the group (checkpoint, new world size, resharded load); the
    # runtime's pre-warmed resize measured 3 s at 2 ranks and 25-38 s at 48-64 ranks
    # (benchmarks/README.md, allreduce_rendezvous)
    allreduce_pause_s: float = 30.0
    profile_trial_s: float = 120.0  # one profiling trial (a policy's ``profile_plans``)


class _Node:
    __slots__ = (
        "down_since",
        "down_until",
        "node_id",
        "pending",
        "relaunches",
        "res",
        "role",
        "speed",
    )

    def __init__(self, role: Role, node_id: int, res: NodeResources, speed: float, up: float):
        self.role = role
        self.node_id = node_id
        self.res = res
        self.speed = speed
        self.down_until = up
        self.down_since = up  # when it last went down (pending/relaunching since)
        # relaunches after exits, per exit class (the key the runtime's rule counts by)
        self.relaunches: dict[str, int] = {}
        self.pending: NodeResources | None = None  # waiting for capacity to relaunch


@dataclass
class _Run:
    job: TraceJob
    view: JobView
    rng_fail: np.random.Generator
    rng_strag: np.random.Generator
    rng_noise: np.random.Generator
    status: str = "queued"  # queued | running | completed | failed
    plan: ResourcePlan | None = None
    pending_plan: ResourcePlan | None = None
    pending_since: float = 0.0
    workers: list[_Node] = field(default_factory=list)
    ps: list[_Node] = field(default_factory=list)
    start_s: float = 0.0
    end_s: float = 0.0
    t_last: float = 0.0
    done: float = 0.0
    paused_until: float = 0.0
    config_since: float = 0.0
    next_sample_s: float = INF  # end of the next steady speed window
    next_policy_s: float = INF
    version: int = 0
    hazard: float = 0.0
    hazard_next: float = 0.0
    last_progress_s: float = 0.0
    # current piecewise-constant state
    x: float = 0.0
    xw: float = 0.0
    w_used: np.ndarray = field(default_factory=lambda: np.zeros(0))
    p_used: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cpu_used: float = 0.0  # cores
    alloc_cpu_m: int = 0
    alloc_mem: int = 0
    n_alloc: int = 0
    up_workers: list[_Node] = field(default_factory=list)
    ps_all_up: bool = False
    allreduce: bool = False  # a group of ranks, no PS (``TraceJob.strategy``)
    w_mem_need: float = 0.0  # MiB a worker (rank) uses now: the truth's, at this rank count
    group_relaunches: dict[str, int] = field(default_factory=dict)  # all-reduce, per class
    profiled_s: float = 0.0  # wall time of the policy's profiling trials (``_profile``)
    # set by every full ``_refresh`` (which follows every change to the nodes): the earliest
    # time a node of the run comes up (INF: none down), whether a node waits for capacity,
    # and whether the job was paused then; between changes the up set is constant until
    # ``next_up_s``, so an event before it finds the same state (-INF: never refreshed)
    next_up_s: float = -INF
    any_pending: bool = False
    paused_at_refresh: bool = False
    total_of: ResourcePlan | None = None  # the plan ``plan_total`` is the total of
    plan_total: NodeResources | None = None
    rate_key: tuple[Any, ...] | None = None  # what x, w_used, p_used were computed from
    oom_key: tuple[float, ...] | None = None  # PS memory limits n_oom was computed for
    n_oom: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # accounting
    cpu_used_cs: float = 0.0
    cpu_alloc_cs: float = 0.0
    mem_used_ms: float = 0.0
    mem_alloc_ms: float = 0.0
    scaling_ops: int = 0
    oom_count: int = 0
    fail_reason: str = ""
    peak_w_cpu: float = 0.0
    peak_w_mem: float = 0.0
    peak_p_cpu: float = 0.0
    peak_p_mem: float = 0.0
    observations: list[Observation] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)


def job_view(job: TraceJob) -> JobView:
    return JobView(
        name=job.name,
        signature=job.signature,
        user=job.user,
        manual_plan=job.manual_plan,
        quota=job.quota,
        batch_size=job.batch_size,
        samples_total=job.samples_total,
        rows=job.rows,
        epochs=job.epochs,
        embedding_dim=job.embedding_dim,
        sparse_features=job.sparse_features,
        dense_features=job.dense_features,
        submit_s=job.submit_s,
        strategy=job.strategy,
    )


def cluster_capacity(jobs: Sequence[TraceJob], load: float = 0.8) -> NodeResources:
    """Cluster size at which the manual requests keep it ~``load`` busy on average (so
    over-requests queue) yet any single quota fits four times over."""
    span = max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs) + 3600.0
    cpu = sum(j.manual_plan.total.cpu_millicores * j.manual_duration_s for j in jobs) / span
    mem = sum(j.manual_plan.total.memory_mib * j.manual_duration_s for j in jobs) / span
    big = max(j.quota.cpu_millicores for j in jobs)
    bigm = max(j.quota.memory_mib for j in jobs)
    return NodeResources(int(max(cpu / load, 2 * big)), int(max(mem / load, 2 * bigm)))


class Engine:
    """Run ``policy`` over ``jobs`` on a cluster of ``capacity``."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        policy: Policy,
        capacity: NodeResources,
        seed: int,
        config: EngineConfig | None = None,
    ) -> None:
        self.cfg = config or EngineConfig()
        self.policy = policy
        # a policy that never reads speed samples (``uses_samples = False``) gets none built:
        # their noise is still drawn, so every other random stream stays the same
        self._build_samples = bool(getattr(policy, "uses_samples", True))
        self.capacity = capacity
        self.seed = seed
        self.runs = [
            _Run(
                job=j,
                view=job_view(j),
                rng_fail=np.random.default_rng([seed, j.index, 101]),
                rng_strag=np.random.default_rng([seed, j.index, 102]),
                rng_noise=np.random.default_rng([seed, j.index, 103]),
                allreduce=j.strategy == "allreduce",
                w_mem_need=j.truth.worker_memory_mib,
            )
            for j in jobs
        ]
        self.free_cpu = capacity.cpu_millicores
        self.free_mem = capacity.memory_mib
        self.max_alloc = NodeResources(0, 0)
        self.queue: list[_Run] = []
        self.history: dict[str, list[HistoryRecord]] = {}
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._fail_rate = self.cfg.node_failure_per_hour / 3600.0
        self.now = 0.0
        self.running: set[int] = set()

    # ---- bookkeeping ---------------------------------------------------------------------
    def _alloc(self, cpu_m: int, mem: int) -> None:
        self.free_cpu -= cpu_m
        self.free_mem -= mem
        if self.free_cpu < 0 or self.free_mem < 0:
            raise RuntimeError("simulator bug: allocation exceeds cluster capacity")
        used = self.capacity - NodeResources(self.free_cpu, self.free_mem)
        if not used.fits_in(self.max_alloc):
            self.max_alloc = NodeResources(
                max(used.cpu_millicores, self.max_alloc.cpu_millicores),
                max(used.memory_mib, self.max_alloc.memory_mib),
            )

    def _fits(self, cpu_m: int, mem: int) -> bool:
        return cpu_m <= self.free_cpu and mem <= self.free_mem

    def _push(self, t: float, run_idx: int, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, run_idx, version))

    def _new_worker(self, run: _Run, node_id: int, res: NodeResources, up: float) -> _Node:
        speed = 1.0
        if run.rng_strag.random() < self.cfg.straggler_prob:
            speed = float(run.rng_strag.uniform(*self.cfg.straggler_speed))
        return _Node(Role.WORKER, node_id, res, speed, up)

    # ---- state of one run ----------------------------------------------------------------
    def _refresh_event(self, run: _Run, t: float) -> None:
        """``_refresh`` at an event that changed no node: a no-op while no node has come up
        and the pause has not ended since the last full refresh (every change to a run's
        nodes or pause is followed by a full ``_refresh``), else the full one."""
        if t < run.next_up_s and (t < run.paused_until) == run.paused_at_refresh:
            return
        self._refresh(run, t)

    def _refresh(self, run: _Run, t: float) -> None:
        """Recompute the piecewise-constant rate and usage after any change at time t.

        The rates and per-node usage are a pure function of the up nodes' CPU and speed and
        the pause: most events (policy calls) leave those unchanged, so they are memoised on
        the run and recomputed only when they change (same values, not an approximation)."""
        truth = run.job.truth
        cpu_m = mem = n_alloc = 0
        next_up = INF
        any_pending = False
        up_workers = []
        for n in run.workers:
            if n.pending is None:
                cpu_m += n.res.cpu_millicores
                mem += n.res.memory_mib
                n_alloc += 1
            else:
                any_pending = True
            d = n.down_until
            if d <= t:
                up_workers.append(n)
            elif d < next_up:
                next_up = d
        ps_all_up = bool(run.ps)
        for n in run.ps:
            if n.pending is None:
                cpu_m += n.res.cpu_millicores
                mem += n.res.memory_mib
                n_alloc += 1
            else:
                any_pending = True
            d = n.down_until
            if d > t:
                ps_all_up = False
                if d < next_up:
                    next_up = d
        run.alloc_cpu_m = cpu_m
        run.alloc_mem = mem
        run.n_alloc = n_alloc
        run.up_workers = up_workers
        run.ps_all_up = ps_all_up
        run.next_up_s = next_up
        run.any_pending = any_pending
        paused = t < run.paused_until
        run.paused_at_refresh = paused
        key = (
            tuple((n.res.cpu_millicores, n.speed) for n in run.up_workers),
            tuple(n.res.cpu_millicores for n in run.ps),
            run.ps_all_up,
            paused,
        )
        if key == run.rate_key:
            return
        run.rate_key = key
        wc = np.array([n.res.cpu_cores for n in run.up_workers])
        pc = np.array([n.res.cpu_cores for n in run.ps])
        if run.allreduce:
            self._refresh_group(run, wc, paused)
            return
        if run.up_workers and run.ps_all_up:
            x, xw, _, _ = truth.rates(wc, pc, [n.speed for n in run.up_workers])
        else:
            x, xw = 0.0, 0.0
        if paused:
            x = 0.0
        run.x = x
        run.xw = xw
        if run.ps_all_up and run.up_workers:
            run.w_used, run.p_used = truth.cpu_used(wc, pc, x, xw if xw > 0 else 1.0)
        else:
            run.w_used = np.minimum(wc, 0.5 * truth.o_w)
            run.p_used = np.minimum(pc, 0.5 * truth.o_p) if run.ps_all_up else np.zeros(0)
        run.cpu_used = float(run.w_used.sum() + run.p_used.sum())
        if run.w_used.size:
            run.peak_w_cpu = max(run.peak_w_cpu, float(run.w_used.max()))
            run.peak_w_mem = max(run.peak_w_mem, truth.worker_memory_mib)
        if run.p_used.size:
            run.peak_p_cpu = max(run.peak_p_cpu, float(run.p_used.max()))

    def _refresh_group(self, run: _Run, wc: np.ndarray, paused: bool) -> None:
        """``_refresh``'s rates and usage of an all-reduce group: it trains only with every
        rank up, at the pace of its slowest rank (the smallest CPU, the lowest speed)."""
        truth = run.job.truth
        n = len(run.workers)
        run.w_mem_need = truth.rank_memory_mib(n)
        speeds = np.array([nd.speed for nd in run.up_workers])
        x = 0.0
        if n and len(run.up_workers) == n and not paused:
            x = truth.allreduce_throughput(
                n, float(wc.min()), run.job.batch_size, float(speeds.min())
            )
        run.x = x
        run.xw = x
        run.w_used = truth.allreduce_cpu_used(wc, speeds, x)
        run.p_used = np.zeros(0)
        run.cpu_used = float(run.w_used.sum())
        if run.w_used.size:
            run.peak_w_cpu = max(run.peak_w_cpu, float(run.w_used.max()))
            run.peak_w_mem = max(run.peak_w_mem, run.w_mem_need)

    def _ps_oom_each(self, run: _Run) -> np.ndarray:
        """Per PS, the samples done at which it exceeds its limit (memoised on the limits)."""
        key = tuple(float(n.res.memory_mib) for n in run.ps)
        if key != run.oom_key:
            run.oom_key = key
            limits = np.array(key, dtype=np.float64)
            run.n_oom = run.job.truth.ps_oom_samples_each(len(run.ps), limits)
        return run.n_oom

    def _ps_mem(self, run: _Run, n: float) -> np.ndarray:
        return run.job.truth.ps_memory_used(len(run.ps), n) if run.ps else np.zeros(0)

    def _new_window(self, run: _Run, t: float) -> None:
        """The configuration changed at ``t``: speed windows restart."""
        run.config_since = t
        run.next_sample_s = t + self.cfg.sample_window_s

    def _emit_samples(self, run: _Run, t: float) -> None:
        """One ``Sample`` per steady window ending in (t_last, t] (the state is constant
        there): what a master's metrics loop records whether or not the policy is called.
        Only the last ``keep_samples`` windows are built (the rest would be dropped)."""
        window = self.cfg.sample_window_s
        g0 = run.next_sample_s
        n = int((t - g0) // window) + 1
        run.next_sample_s = g0 + n * window
        steady = run.x > 0 and len(run.up_workers) == len(run.workers)
        if not steady or run.plan is None:
            return
        skip = max(0, n - self.cfg.keep_samples)
        truth = run.job.truth
        if not self._build_samples:
            run.rng_noise.normal(0.0, truth.noise_sigma, size=n - skip)
            return
        ps_util = None
        if run.p_used.size:
            ps_util = max(
                millicores_from_cores_truncated(u) / nd.res.cpu_millicores
                for u, nd in zip(run.p_used.tolist(), run.ps, strict=False)
            )
        w_utils = [
            millicores_from_cores_truncated(u) / nd.res.cpu_millicores
            for u, nd in zip(run.w_used.tolist(), run.up_workers, strict=False)
        ]
        w_util = sum(w_utils) / len(w_utils) if w_utils else 0.0
        gs = g0 + window * np.arange(skip, n)
        noise = np.exp(run.rng_noise.normal(0.0, truth.noise_sigma, size=gs.size))
        done = np.minimum(float(run.job.samples_total), run.done + run.x * (gs - run.t_last))
        ids = truth.emb_k * np.maximum(done, 0.0) ** truth.emb_beta
        p = len(run.ps)
        pmax = (
            truth.ps_base_memory_mib
            + truth.max_memory_share(p) * (truth.dense_memory_mib + ids * truth.row_mib)
            if p
            else None
        )
        # every field but the throughput, the PS memory and the time is the window's own
        base = {
            "workers": len(run.workers),
            "ps": p,
            "worker_cpu_cores": run.plan.workers.resources.cpu_cores,
            "ps_cpu_cores": run.plan.ps.resources.cpu_cores if run.ps else 0.0,
            "throughput_sps": 0.0,
            "batch_size": run.job.batch_size,
            "worker_memory_mib": run.w_mem_need,
            "ps_memory_mib": None,
            "ps_cpu_util": ps_util,
            "worker_cpu_util": w_util,
            "timestamp_s": None,
        }
        x = run.x
        pm = pmax.tolist() if pmax is not None else None
        append = run.samples.append
        for i, (nz, g) in enumerate(zip(noise.tolist(), gs.tolist(), strict=True)):
            d = base.copy()
            d["throughput_sps"] = x * nz
            if pm is not None:
                d["ps_memory_mib"] = pm[i]
            d["timestamp_s"] = g
            append(_sample(d))
        if len(run.samples) > self.cfg.keep_samples:
            del run.samples[: -self.cfg.keep_samples]

    def _advance(self, run: _Run, t: float) -> None:
        dt = t - run.t_last
        if dt <= 0:
            return
        if run.next_sample_s <= t:
            self._emit_samples(run, t)
        n0 = run.done
        run.done = min(float(run.job.samples_total), run.done + run.x * dt)
        run.cpu_used_cs += run.cpu_used * dt
        run.cpu_alloc_cs += cores(run.alloc_cpu_m) * dt
        run.mem_alloc_ms += run.alloc_mem * dt
        truth = run.job.truth
        mem = len(run.up_workers) * run.w_mem_need
        if run.ps_all_up:
            pm = self._ps_mem(run, 0.5 * (n0 + run.done))
            mem += float(pm.sum())
            run.peak_p_mem = max(run.peak_p_mem, truth.ps_memory_peak(len(run.ps), run.done))
        run.mem_used_ms += mem * dt
        run.hazard += run.n_alloc * self._fail_rate * dt
        run.t_last = t
        if run.allreduce and run.x > 0:
            # progress up to t: a job whose next event is an exit is not hung (PS jobs still
            # mark progress at handled events only, see ``_handle``: their results stay)
            run.last_progress_s = t

    def _next_event(self, run: _Run, t: float) -> float:
        cands = [run.next_policy_s]
        if run.paused_until > t:
            cands.append(run.paused_until)
        if run.next_up_s > t:  # no node came up since the last refresh: the same minimum
            if run.next_up_s < INF:
                cands.append(run.next_up_s)
        else:
            for n in run.workers + run.ps:
                if t < n.down_until < INF:
                    cands.append(n.down_until)
        total = run.job.samples_total
        if run.x > 0:
            cands.append(t + (total - run.done) / run.x)
            if run.job.fatal_at_fraction is not None:
                cands.append(t + max(0.0, run.job.fatal_at_fraction * total - run.done) / run.x)
            if run.ps:
                n_oom = float(self._ps_oom_each(run).min())
                cands.append(t + max(0.0, n_oom - run.done) / run.x)
        else:
            cands.append(run.last_progress_s + self.cfg.hang_s)
        if run.n_alloc:
            cands.append(t + (run.hazard_next - run.hazard) / (run.n_alloc * self._fail_rate))
        if run.allreduce and any(n.res.memory_mib < run.w_mem_need for n in run.up_workers):
            cands.append(t)  # a rank below its need runs out of memory as it loads its shards
        return max(t, min(cands))

    def _schedule(self, run_idx: int, t: float) -> None:
        run = self.runs[run_idx]
        run.version += 1
        if run.status == "running":
            self._push(self._next_event(run, t), run_idx, run.version)

    # ---- plans ---------------------------------------------------------------------------
    def _valid(self, run: _Run, plan: ResourcePlan) -> bool:
        if run.allreduce:  # ranks only: a plan with PS is not one for this job
            return (
                plan.workers.count >= 1
                and plan.ps.count == 0
                and plan.workers.resources.cpu_millicores > 0
                and plan.total.fits_in(run.job.quota)
            )
        return (
            plan.workers.count >= 1
            and plan.ps.count >= 1
            and plan.workers.resources.cpu_millicores > 0
            and plan.ps.resources.cpu_millicores > 0
            and plan.total.fits_in(run.job.quota)
        )

    def _apply(self, run: _Run, plan: ResourcePlan, t: float, fault: bool = False) -> bool:
        """Apply a new plan if the cluster has room for the difference; else keep it pending.
        ``fault``: an all-reduce group relaunched after an exit (the caller prices it: no
        scaling operation, no resize pause)."""
        old_over = {
            (o.role, o.node_id, o.resources) for o in (run.plan.overrides if run.plan else ())
        }
        new_w: list[_Node] = []
        new_p: list[_Node] = []
        for role, old_nodes, out in ((Role.WORKER, run.workers, new_w), (Role.PS, run.ps, new_p)):
            for i in range(plan.role(role).count):
                res = plan.node_resources(role, i)
                old = old_nodes[i] if i < len(old_nodes) else None
                fresh_override = any(
                    o.role is role
                    and o.node_id == i
                    and (o.role, o.node_id, o.resources) not in old_over
                    for o in plan.overrides
                )
                if (
                    old is not None
                    and old.res == res
                    and not fresh_override
                    and old.pending is None
                    and old.down_until < INF
                ):
                    out.append(old)
                elif role is Role.WORKER:
                    out.append(self._new_worker(run, i, res, t))
                else:
                    out.append(_Node(Role.PS, i, res, 1.0, t))
        old_cpu, old_mem = run.alloc_cpu_m, run.alloc_mem
        new_cpu = sum(n.res.cpu_millicores for n in new_w + new_p)
        new_mem = sum(n.res.memory_mib for n in new_w + new_p)
        if not self._fits(new_cpu - old_cpu, new_mem - old_mem):
            if run.pending_plan is None or not run.pending_plan.same_allocation(plan):
                run.pending_since = t
            run.pending_plan = plan
            return False
        ps_changed = len(new_p) != len(run.ps) or any(
            a is not b for a, b in zip(new_p, run.ps, strict=True)
        )
        w_changed = len(new_w) != len(run.workers) or any(
            a is not b for a, b in zip(new_w, run.workers, strict=True)
        )
        self._alloc(new_cpu - old_cpu, new_mem - old_mem)
        run.workers, run.ps = new_w, new_p
        first = run.plan is None
        run.plan = plan
        run.pending_plan = None
        if not first and not fault and (ps_changed or w_changed):
            run.scaling_ops += 1
            if run.allreduce:
                pause = self.cfg.allreduce_pause_s
                # the group's downtime, as the runtime's all-reduce strategy measures each
                # resize and tells its planner (``Planner.record_resize``)
                resized = getattr(self.policy, "on_resize", None)
                if resized is not None:
                    resized(run.view, pause)
            else:
                pause = self.cfg.ps_pause_s if ps_changed else self.cfg.worker_pause_s
            run.paused_until = max(run.paused_until, t + pause)
            self._new_window(run, t)
        self._refresh(run, t)
        return True

    # ---- observations --------------------------------------------------------------------
    def _observe(self, run: _Run, t: float) -> Observation:
        truth = run.job.truth
        noise = float(np.exp(run.rng_noise.normal(0.0, truth.noise_sigma)))
        nodes: list[NodeObservation] = []
        append = nodes.append
        up_i = 0
        w_total_speed = sum(n.speed for n in run.up_workers) or 1.0
        pmem = self._ps_mem(run, run.done).tolist()
        w_used = run.w_used.tolist()
        p_used = run.p_used.tolist()
        x_noise = run.x * noise
        w_mem = int(run.w_mem_need)
        since = run.config_since
        worker, ps, running = Role.WORKER, Role.PS, NodeState.RUNNING
        new, set_ = _new, _set  # running nodes as _node_observation builds them, inlined
        to_millicores = millicores_from_cores_truncated
        for n in run.workers:
            if n.down_until <= t:
                used = w_used[up_i] if up_i < len(w_used) else 0.0
                up_i += 1
                o = new(NodeObservation)
                set_(o, "__dict__", {
                    "role": worker, "node_id": n.node_id, "state": running, "allocated": n.res,
                    "cpu_used_millicores": to_millicores(used), "memory_used_mib": w_mem,
                    "state_since_s": since, "throughput_sps": x_noise * n.speed / w_total_speed,
                })  # fmt: skip
                append(o)
            else:
                append(
                    NodeObservation(
                        worker,
                        n.node_id,
                        NodeState.PENDING,
                        n.pending or n.res,  # a node waiting for room: what it asks for
                        state_since_s=n.down_since,
                    )
                )
        for i, n in enumerate(run.ps):
            if n.down_until <= t and p_used:
                o = new(NodeObservation)
                set_(o, "__dict__", {
                    "role": ps, "node_id": n.node_id, "state": running, "allocated": n.res,
                    "cpu_used_millicores": to_millicores(p_used[i]),
                    "memory_used_mib": int(pmem[i]),
                    "state_since_s": since, "throughput_sps": 0.0,
                })  # fmt: skip
                append(o)
            else:
                append(
                    NodeObservation(
                        ps,
                        n.node_id,
                        NodeState.PENDING,
                        n.pending or n.res,  # a node waiting for room: what it asks for
                        state_since_s=n.down_since,
                    )
                )
        if run.pending_plan is not None:
            for role, have in ((Role.WORKER, len(run.workers)), (Role.PS, len(run.ps))):
                for i in range(have, run.pending_plan.role(role).count):
                    nodes.append(
                        NodeObservation(
                            role,
                            i,
                            NodeState.PENDING,
                            run.pending_plan.node_resources(role, i),
                            state_since_s=run.pending_since,
                        )
                    )
        return Observation(
            time_s=t,
            nodes=tuple(nodes),
            throughput_sps=run.x * noise,
            samples_done=int(run.done),
            samples_total=run.job.samples_total,
            distinct_ids=int(truth.distinct_ids(run.done)),
        )

    def _policy_call(self, run: _Run, t: float) -> None:
        obs = self._observe(run, t)
        run.observations.append(obs)
        del run.observations[: -self.cfg.keep_observations]
        assert run.plan is not None
        new = self.policy.replan(run.view, run.plan, run.observations, run.samples, t)
        if new is not None and self._valid(run, new) and not new.same_allocation(run.plan):
            self._apply(run, new, t)
        elif run.pending_plan is not None:
            self._apply(run, run.pending_plan, t)
        self._pace(run, t)

    def _pace(self, run: _Run, t: float) -> None:
        nxt = self.policy.next_call_s(run.view, t)
        run.next_policy_s = INF if nxt is None else max(nxt, t + 1.0)

    # ---- exits ---------------------------------------------------------------------------
    def _finish(self, run: _Run, t: float, ok: bool, reason: str = "") -> None:
        run.status = "completed" if ok else "failed"
        self.running.discard(run.job.index)
        run.fail_reason = reason
        run.end_s = t
        self._alloc(-run.alloc_cpu_m, -run.alloc_mem)
        run.alloc_cpu_m = run.alloc_mem = run.n_alloc = 0
        run.version += 1
        if run.plan is not None:
            wall = t - run.start_s
            self.history.setdefault(run.job.signature, []).append(
                HistoryRecord(
                    signature=run.job.signature,
                    finished_at_s=t,
                    final_plan=run.plan,
                    succeeded=ok,
                    worker_cpu_used_millicores=millicores_from_cores_truncated(run.peak_w_cpu),
                    worker_memory_used_mib=int(run.peak_w_mem),
                    ps_cpu_used_millicores=millicores_from_cores_truncated(run.peak_p_cpu),
                    ps_memory_used_mib=int(run.peak_p_mem),
                    throughput_sps=run.done / wall if wall > 0 else 0.0,
                    wall_s=wall,
                    strategy=run.job.strategy,
                    # a real history store keeps the run's speed samples too (issue 4)
                    extra={
                        "job": run.job.name,
                        "oom_count": run.oom_count,
                        "reason": reason,
                        "samples": tuple(run.samples),
                        **self._history_extra(run),
                    },
                )
            )

    def _history_extra(self, run: _Run) -> Mapping[str, Any]:
        """What the policy adds to the run's history record (``history_extra``, optional)."""
        extra = getattr(self.policy, "history_extra", None)
        return extra(run.view) if extra is not None else {}

    def relaunch_rule(
        self, node_role: Role, cls: ExitClass, current: NodeResources, planned: NodeResources,
        relaunches: dict[str, int],
    ) -> tuple[str, int, FaultRuling]:  # fmt: skip
        """The runtime's rule for an exit: (the budget key, relaunches under it so far, the
        ruling). The policy only chooses *how* to relaunch a node the rule lets go on."""
        key = cls.value
        tries = relaunches.get(key, 0)
        return key, tries, self.cfg.faults.decide(node_role, cls, current, planned, tries)

    def _node_exit(self, run: _Run, node: _Node, cls: ExitClass, t: float) -> None:
        if run.allreduce:
            self._rank_exit(run, node, cls, t)
            return
        if cls is ExitClass.OOM:
            run.oom_count += 1
        assert run.plan is not None
        planned = run.plan.node_resources(node.role, node.node_id)
        key, tries, rule = self.relaunch_rule(node.role, cls, node.res, planned, node.relaunches)
        if rule.fail_job:
            self._finish(
                run, t, False, f"{node.role.value}-{node.node_id} lost ({cls.value}: {rule.reason})"
            )
            return
        if not rule.relaunch:
            dec = RelaunchDecision(False, reason=rule.reason)
        else:
            dec = self.policy.on_node_exit(
                run.view, node.role, node.node_id, cls, node.res, run.plan, tries
            )
            new_res = dec.resources or node.res
            if (
                cls is ExitClass.OOM
                and dec.plan is None
                and dec.relaunch
                and new_res.memory_mib <= node.res.memory_mib
            ):
                # a policy that relaunches an OOM node without more memory (the runtime always
                # bumps it) would crash-loop: such retries spend the UNKNOWN-exit budget
                key = "oom-same-memory"
                tries = node.relaunches.get(key, 0)
                if tries >= self.cfg.faults.max_relaunches:
                    dec = RelaunchDecision(
                        False,
                        reason=f"OOM relaunched without more memory {tries} times: budget spent",
                    )
        if dec.plan is not None and self._valid(run, dec.plan):
            node.relaunches[key] = tries + 1
            counts = dict(node.relaunches)
            if self._apply(run, dec.plan, t):
                group = run.workers if node.role is Role.WORKER else run.ps
                if node.node_id < len(group):
                    group[node.node_id].relaunches = counts
                    if group[node.node_id] is node:
                        node.down_until = t + self.cfg.relaunch_delay_s
                        node.down_since = t
                    self._new_window(run, t)
                self._refresh(run, t)
                return
        if dec.relaunch or (dec.plan is not None):
            new_res = dec.resources or node.res
            if cls is ExitClass.OOM and dec.plan is not None and rule.resources is not None:
                # the policy's plan for the OOM waits for room (pending): the node itself
                # gets the fault rule's memory bump meanwhile, as the runtime's would, never
                # its old memory (it would OOM again at once)
                new_res = rule.resources
            node.relaunches[key] = tries + 1
            self._new_window(run, t)
            if new_res != node.res:
                d_cpu = new_res.cpu_millicores - node.res.cpu_millicores
                d_mem = new_res.memory_mib - node.res.memory_mib
                if self._fits(d_cpu, d_mem):
                    self._alloc(d_cpu, d_mem)
                    node.res = new_res
                    run.plan = _with_override(run.plan, node.role, node.node_id, new_res)
                else:  # wait for room: release the old allocation, relaunch when it fits
                    self._alloc(-node.res.cpu_millicores, -node.res.memory_mib)
                    node.pending = new_res
                    node.down_until = INF
                    node.down_since = t
                    self._refresh(run, t)
                    return
            if node.role is Role.WORKER:
                fresh = self._new_worker(run, node.node_id, node.res, t)
                node.speed = fresh.speed
            node.down_until = t + self.cfg.relaunch_delay_s
            node.down_since = t
            self._refresh(run, t)
            return
        if node.role is Role.PS:
            self._finish(run, t, False, f"ps-{node.node_id} lost ({cls.value}, {dec.reason})")
            return
        # a worker that is not relaunched: the job continues with fewer workers
        self._alloc(-node.res.cpu_millicores, -node.res.memory_mib)
        run.workers = [n for n in run.workers if n is not node]
        for i, n in enumerate(run.workers):
            n.node_id = i
        if not run.workers:
            self._finish(run, t, False, "no worker left")
            return
        run.plan = replace(
            run.plan,
            workers=replace(run.plan.workers, count=len(run.workers)),
            overrides=tuple(o for o in run.plan.overrides if o.role is Role.PS),
        )
        self._refresh(run, t)

    def _rank_exit(self, run: _Run, node: _Node, cls: ExitClass, t: float) -> None:
        """A rank of an all-reduce group exited: the group stops. The runtime's rule decides
        whether it goes on (budgets per exit class, counted for the group); the policy how
        (``RelaunchDecision.resources``: every rank's new size, e.g. more memory after an
        OOM; ``plan``: a new plan). Every rank is then down ``relaunch_delay_s``; a group
        whose new size does not fit the cluster waits for room with every rank down."""
        if cls is ExitClass.OOM:
            run.oom_count += 1
        plan = run.plan
        assert plan is not None
        planned = plan.node_resources(node.role, node.node_id)
        key, tries, rule = self.relaunch_rule(
            node.role, cls, node.res, planned, run.group_relaunches
        )
        who = f"{node.role.value}-{node.node_id}"
        if rule.fail_job or not rule.relaunch:
            self._finish(run, t, False, f"{who} lost ({cls.value}: {rule.reason}); no group")
            return
        dec = self.policy.on_node_exit(
            run.view, node.role, node.node_id, cls, node.res, plan, tries
        )
        if not dec.relaunch and dec.plan is None:
            self._finish(run, t, False, f"{who} lost ({cls.value}, {dec.reason}); no group")
            return
        new = dec.plan
        if new is None:
            res = dec.resources or node.res
            if cls is ExitClass.OOM and res.memory_mib <= node.res.memory_mib:
                # relaunched without more memory (the runtime always bumps it): such retries
                # spend their own budget, as for a PS job's node
                key = "oom-same-memory"
                tries = run.group_relaunches.get(key, 0)
                if tries >= self.cfg.faults.max_relaunches:
                    self._finish(
                        run, t, False,
                        f"{who} OOM: group relaunched without more memory {tries} times",
                    )  # fmt: skip
                    return
            new = replace(
                plan,
                workers=replace(plan.workers, resources=res),
                overrides=tuple(o for o in plan.overrides if o.node_id != node.node_id),
            )
        run.group_relaunches[key] = tries + 1
        if not self._valid(run, new):
            new = plan
        changed = new is not plan and not new.same_allocation(plan)
        if changed and not self._apply(run, new, t, fault=True):  # waits for room
            for n in run.workers:  # every rank down until the group fits
                n.down_until = INF
                n.down_since = t
            self._new_window(run, t)
            self._refresh(run, t)
            return
        if node in run.workers:  # the failed rank comes back on a fresh machine
            node.speed = self._new_worker(run, node.node_id, node.res, t).speed
        for n in run.workers:
            n.down_until = t + self.cfg.relaunch_delay_s
            n.down_since = t
        self._new_window(run, t)
        self._refresh(run, t)

    def _retry_pending_nodes(self, run: _Run, t: float) -> bool:
        changed = False
        for n in run.workers + run.ps:
            if n.pending is not None and self._fits(n.pending.cpu_millicores, n.pending.memory_mib):
                self._alloc(n.pending.cpu_millicores, n.pending.memory_mib)
                n.res = n.pending
                n.pending = None
                n.down_until = t + self.cfg.relaunch_delay_s
                n.down_since = t
                assert run.plan is not None
                run.plan = _with_override(run.plan, n.role, n.node_id, n.res)
                changed = True
        if changed:
            self._refresh(run, t)
        return changed

    # ---- the loop ------------------------------------------------------------------------
    def _start(self, run: _Run, t: float) -> None:
        run.status = "running"
        self.running.add(run.job.index)
        run.start_s = t
        run.t_last = t
        self._new_window(run, t)
        run.last_progress_s = t
        run.hazard_next = float(run.rng_fail.exponential())
        plan = run.plan
        run.plan = None
        assert plan is not None
        self._apply(run, plan, t)
        self._profile(run, plan, t)
        self._pace(run, t)

    def _profile(self, run: _Run, plan: ResourcePlan, t: float) -> None:
        """The policy's profiling trials before the job trains (``profile_plans``, optional;
        all-reduce jobs only): trials run one after another, ``profile_trial_s`` each, and
        each leaves one speed sample (the trial configuration's true rate, with the
        measurement noise of a steady window). The job holds its first plan's allocation
        meanwhile and makes no progress; the trials' own cores and memory are what the job
        is charged for that time (the cluster's capacity is checked for the first plan only)."""
        hook = getattr(self.policy, "profile_plans", None)
        if hook is None or not run.allreduce:
            return
        trials = [p for p in hook(run.view, plan) if self._valid(run, p)]
        if not trials:
            return
        truth = run.job.truth
        dur = self.cfg.profile_trial_s
        rng = np.random.default_rng([self.seed, run.job.index, 104])
        for k, p in enumerate(trials):
            w = p.workers
            x = truth.allreduce_throughput(w.count, w.resources.cpu_cores, run.job.batch_size)
            run.samples.append(
                Sample(
                    workers=w.count,
                    ps=0,
                    worker_cpu_cores=w.resources.cpu_cores,
                    ps_cpu_cores=0.0,
                    throughput_sps=x * float(np.exp(rng.normal(0.0, truth.noise_sigma))),
                    batch_size=run.job.batch_size,
                    worker_memory_mib=truth.rank_memory_mib(w.count),
                    timestamp_s=t + (k + 1) * dur,
                )
            )
        total_s = dur * len(trials)
        run.cpu_alloc_cs += sum(p.total.cpu_cores for p in trials) * dur
        run.cpu_alloc_cs -= cores(run.alloc_cpu_m) * total_s  # counted by ``_advance``
        run.mem_alloc_ms += sum(p.total.memory_mib for p in trials) * dur
        run.mem_alloc_ms -= run.alloc_mem * total_s
        run.paused_until = max(run.paused_until, t + total_s)
        run.profiled_s = total_s
        self._new_window(run, t + total_s)
        self._refresh(run, t)

    def _try_admit(self, t: float) -> None:
        for idx in sorted(self.running):
            run = self.runs[idx]
            if run.status == "running" and (run.pending_plan is not None or run.any_pending):
                self._advance(run, t)
                changed = self._retry_pending_nodes(run, t)
                if run.pending_plan is not None:
                    changed = self._apply(run, run.pending_plan, t) or changed
                if changed:
                    self._schedule(idx, t)
        still: list[_Run] = []
        blocked = False
        for run in self.queue:
            assert run.plan is not None
            if run.total_of is not run.plan:
                run.total_of, run.plan_total = run.plan, run.plan.total
            tot = run.plan_total
            assert tot is not None
            if not blocked and self._fits(tot.cpu_millicores, tot.memory_mib):
                self._start(run, t)
                self._schedule(run.job.index, t)
            else:
                still.append(run)
                if not still[1:] and t - run.job.submit_s > self.cfg.head_reservation_s:
                    blocked = True
        self.queue = still

    def _arrive(self, run: _Run, t: float) -> None:
        hist = [h for h in self.history.get(run.job.signature, []) if h.finished_at_s <= t]
        plan = self.policy.initial_plan(run.view, hist, t)
        if not self._valid(run, plan):
            plan = run.job.manual_plan
        run.plan = plan
        self.queue.append(run)

    def _handle(self, run: _Run, t: float) -> None:
        self._advance(run, t)
        total = run.job.samples_total
        if run.done >= total * (1 - 1e-9) - 1e-6:
            run.done = float(total)
            self._finish(run, t, True)
            return
        frac = run.job.fatal_at_fraction
        if frac is not None and run.done >= frac * total * (1 - 1e-9) - 1e-6:
            self._finish(run, t, False, "fatal code error")
            return
        self._refresh_event(run, t)
        # OOM: any up node above its limit
        for n in run.up_workers:
            if run.w_mem_need > n.res.memory_mib:
                self._node_exit(run, n, ExitClass.OOM, t)
                return
        if run.ps_all_up:
            n_oom = self._ps_oom_each(run)
            i = int(np.argmin(n_oom))
            if run.done >= n_oom[i] * (1 - 1e-9) - 1e-6:
                self._node_exit(run, run.ps[i], ExitClass.OOM, t)
                return
        if run.n_alloc and run.hazard >= run.hazard_next - 1e-9:
            run.hazard_next = run.hazard + float(run.rng_fail.exponential())
            alive = [n for n in run.workers + run.ps if n.pending is None]
            victim = alive[int(run.rng_fail.integers(0, len(alive)))]
            hw = run.rng_fail.random() < self.cfg.hardware_fraction
            self._node_exit(run, victim, ExitClass.HARDWARE if hw else ExitClass.KILLED, t)
            return
        if run.x > 0:
            run.last_progress_s = t
        elif t >= run.last_progress_s + self.cfg.hang_s:  # as ``_next_event`` schedules it
            # (``t - last >= hang_s`` can miss by an ulp at that very event: a loop at ``t``)
            self._finish(run, t, False, "hung: no progress")
            return
        if t >= run.next_policy_s:
            self._policy_call(run, t)

    def run(self) -> dict[str, Any]:
        if not self.runs:
            return self._result(0.0)
        arrivals = sorted(range(len(self.runs)), key=lambda i: self.runs[i].job.submit_s)
        horizon = self.runs[arrivals[-1]].job.submit_s + self.cfg.horizon_extra_s
        ai = 0
        t = 0.0
        while True:
            t_arr = self.runs[arrivals[ai]].job.submit_s if ai < len(arrivals) else INF
            t_ev = self._heap[0][0] if self._heap else INF
            t = min(t_arr, t_ev)
            if t == INF or t > horizon:
                break
            self.now = t
            if t_arr <= t_ev:
                self._arrive(self.runs[arrivals[ai]], t)
                ai += 1
                self._try_admit(t)
                continue
            _, _, idx, version = heapq.heappop(self._heap)
            run = self.runs[idx]
            if version != run.version or run.status != "running":
                continue
            before = (run.alloc_cpu_m, run.alloc_mem, run.status)
            self._handle(run, t)
            self._schedule(idx, t)
            after = (run.alloc_cpu_m, run.alloc_mem, run.status)
            if after != before or self.queue:
                self._try_admit(t)
        end = min(t, horizon)
        for run in self.runs:
            if run.status == "running":
                self._advance(run, end)
                self._finish(run, end, False, "horizon reached")
            elif run.status == "queued":
                run.status = "failed"
                run.fail_reason = "never scheduled before the horizon"
                run.end_s = end
        return self._result(end)

    def _result(self, end: float) -> dict[str, Any]:
        return {"end_s": end, "max_alloc": self.max_alloc, "capacity": self.capacity}


def _with_override(
    plan: ResourcePlan, role: Role, node_id: int, res: NodeResources
) -> ResourcePlan:
    rest = tuple(o for o in plan.overrides if not (o.role is role and o.node_id == node_id))
    if plan.role(role).resources == res:
        return replace(plan, overrides=rest)
    return replace(plan, overrides=(*rest, NodeOverride(role, node_id, res, "relaunch after exit")))
