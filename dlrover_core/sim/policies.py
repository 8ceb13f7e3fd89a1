"""Resource policies the simulator compares, behind one ``Policy`` protocol.

A policy sees only what a real system sees: the job as submitted (``JobView``), history records
of earlier runs of the same signature, live ``Observation``s and steady-window ``Sample``s, and
node exits with their class. Only the ``oracle`` is handed the hidden truth.

All-reduce jobs (``JobView.strategy == "allreduce"``: ranks, no PS; every plan has 0 PS):
``manual`` keeps the user's ranks; ``vpa`` and ``autopilot`` size the ranks' requests from
their usage as they size any container (counts stay); ``optimus`` fits its synchronous form
without PS terms, ``w / X = θ0 + θ1·w``, and adds ranks greedily; the ``oracle`` takes the
true best ranks x CPU per rank (``JobTruth.allreduce_oracle_config``).

The table of runnable policies is built explicitly by ``registry.policy_factories()``;
``register_policy(name, factory)`` adds a user's own policy to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from scipy.optimize import nnls

from dlrover_core.faults import ExitClass, OomBump
from dlrover_core.types import (
    HistoryRecord,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
    RolePlan,
    Sample,
    Stage,
)
from dlrover_core.units import millicores_from_cores

if TYPE_CHECKING:
    from dlrover_core.sim.truth import JobTruth


@dataclass(frozen=True)
class RelaunchDecision:
    """What to do with a node that exited.

    ``resources``: the size to relaunch it with (None = same size). ``plan``: a new plan for
    the whole job instead (e.g. PS OOM -> more PS); the node is then relaunched per the plan.
    """

    relaunch: bool
    resources: NodeResources | None = None
    plan: ResourcePlan | None = None
    reason: str = ""


@dataclass(frozen=True)
class JobView:
    """What a real system knows of a submitted job (never its true behaviour)."""

    name: str
    signature: str
    user: str
    manual_plan: ResourcePlan
    quota: NodeResources
    batch_size: int
    samples_total: int
    rows: int
    epochs: int
    embedding_dim: int
    sparse_features: int
    dense_features: int
    submit_s: float
    strategy: str = "ps"  # "ps" | "allreduce" (the spec's ``strategy``: ranks, no PS)


class Policy(Protocol):
    """A resource policy. ``next_call_s`` paces ``replan`` (None: not called again); the
    built-in ones call it every ``interval_s`` (see :class:`FixedInterval`)."""

    name: str
    interval_s: float | None

    def next_call_s(self, job: JobView, now_s: float) -> float | None: ...

    def initial_plan(
        self, job: JobView, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan: ...

    def replan(
        self,
        job: JobView,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None: ...

    def on_node_exit(
        self,
        job: JobView,
        role: Role,
        node_id: int,
        exit_class: ExitClass,
        current: NodeResources,
        plan: ResourcePlan,
        relaunches: int,
    ) -> RelaunchDecision: ...


class TruthAware(Protocol):
    """A policy that may see the truth (only the oracle)."""

    def bind_truths(self, truths: dict[str, JobTruth]) -> None: ...


class FixedInterval:
    """``replan`` every ``interval_s`` seconds of simulated time (None: never)."""

    interval_s: float | None = None

    def next_call_s(self, job: JobView, now_s: float) -> float | None:
        return None if self.interval_s is None else now_s + self.interval_s


POLICIES: dict[str, Callable[[], Policy]] = {}  # a user's own policies (none built in)


def register_policy(name: str, factory: Callable[[], Policy]) -> None:
    """Make a user's policy ``name`` available to ``simulate`` (a later registration
    replaces an earlier one or a built-in of the same name)."""
    POLICIES[name] = factory


# ---- helpers ------------------------------------------------------------------------------
def _res(cpu_cores: float, memory_mib: float) -> NodeResources:
    return NodeResources(
        max(100, millicores_from_cores(cpu_cores)), max(256, int(math.ceil(memory_mib)))
    )


def _fit_quota(plan: ResourcePlan, quota: NodeResources) -> ResourcePlan:
    """Drop workers (then PS) until the plan fits the quota."""
    w, p = plan.workers.count, plan.ps.count
    while not plan.total.fits_in(quota) and (w > 1 or p > 1):
        if w > 1 and (w >= p or p == 1):
            w -= 1
        else:
            p -= 1
        plan = replace(
            plan,
            workers=RolePlan(w, plan.workers.resources),
            ps=RolePlan(p, plan.ps.resources),
            overrides=tuple(
                o for o in plan.overrides if o.node_id < (w if o.role is Role.WORKER else p)
            ),
        )
    return plan


def _resized(
    current: ResourcePlan,
    roles: dict[Role, RolePlan],
    reason: str,
    now_s: float,
    quota: NodeResources,
) -> ResourcePlan:
    """``current`` with per-role node sizes ``roles`` (counts unchanged), inside the quota."""
    plan = replace(
        current,
        workers=roles[Role.WORKER],
        ps=roles[Role.PS],
        overrides=(),
        stage=Stage.POST_SCALING,
        reasons=(reason,),
        created_at_s=now_s,
    )
    return _fit_quota(plan, quota)


def _percentile(values: Sequence[float], q: float) -> float:
    """``np.percentile(values, q)`` (linear method), the same arithmetic in plain floats:
    the policies take percentiles of a few dozen values, where NumPy's call overhead
    dominates."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("percentile of no values")
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return float(xs[-1])
    if virtual < 0:
        return float(xs[0])
    lo = math.floor(virtual)
    a, b = xs[lo], xs[lo + 1]
    t = virtual - lo
    d = b - a
    return float(b - d * (1 - t)) if t >= 0.5 else float(a + d * t)


def _relaunch_same(*_: Any) -> RelaunchDecision:
    return RelaunchDecision(True, None, None, "relaunch with the same resources")


# ---- manual -------------------------------------------------------------------------------
class ManualPolicy(FixedInterval):
    """The user's request, unchanged; failed nodes relaunch at the same size."""

    uses_samples = False  # decides from observations only: the engine builds no Samples

    name = "manual"
    interval_s: float | None = None

    def initial_plan(
        self, job: JobView, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan:
        return job.manual_plan

    def replan(
        self,
        job: JobView,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None:
        return None

    def on_node_exit(
        self,
        job: JobView,
        role: Role,
        node_id: int,
        exit_class: ExitClass,
        current: NodeResources,
        plan: ResourcePlan,
        relaunches: int,
    ) -> RelaunchDecision:
        return _relaunch_same()


# ---- Kubernetes VPA recommender -----------------------------------------------------------
_BUCKET_TOPS: dict[tuple[float, float, int], list[float]] = {}


class _DecayingHistograms:
    """VPA-style histograms, one per row: exponential buckets (ratio 1.05), each sample
    weighted 2^((t - t_ref)/half_life) so old usage decays. The rows of one job sit in one
    array so that each observation's bucket indices are one NumPy pass and the percentiles of
    every row one cumulative sum (row by row the same additions in the same order, and
    ``np.cumsum`` along a row is the row's own running sum: the same values as one histogram
    per row)."""

    ratio = 1.05
    first = 1.0  # smallest bucket boundary (millicores or MiB)
    n_buckets = 400

    def __init__(self, half_life_s: float, rows: int) -> None:
        self.half_life_s = half_life_s
        self.w = np.zeros((rows, self.n_buckets))
        self.count = [0] * rows

    def add_rows(self, values: Sequence[Sequence[float]], t: float, weight: float = 1.0) -> None:
        """Add ``values[r]`` to row ``r`` (each in order, as ``np.add.at`` adds), all at ``t``."""
        flat = [v for row in values for v in row]
        if not flat:
            return
        v = np.maximum(np.asarray(flat, dtype=np.float64), self.first)
        idx = np.minimum(
            (np.log(v / self.first) / np.log(self.ratio)).astype(int), self.n_buckets - 1
        ).tolist()
        c = weight * 2.0 ** (t / self.half_life_s)
        k = 0
        for r, row in enumerate(values):
            if not row:
                continue
            w = self.w[r]
            for i in idx[k : k + len(row)]:  # a few nodes: no ufunc overhead
                w[i] += c
            k += len(row)
            self.count[r] += len(row)

    def add(self, row: int, value: float, t: float, weight: float = 1.0) -> None:
        values: list[list[float]] = [[] for _ in self.count]
        values[row].append(value)
        self.add_rows(values, t, weight)

    def percentiles(self, qs: Sequence[float]) -> list[list[float]]:
        """Per row, the ``qs`` percentiles (fractions): the top of the first bucket whose
        cumulative weight reaches ``q`` of the row's total (``np.searchsorted``, left)."""
        cw = np.cumsum(self.w, axis=1)
        target = np.asarray(qs)[None, :] * cw[:, -1:]
        # the number of cumulative weights below the target: searchsorted on a sorted row
        idx = (cw[:, None, :] < target[:, :, None]).sum(axis=2).tolist()
        top = self._tops()
        last = self.n_buckets - 1
        return [[top[min(i, last)] for i in row] for row in idx]

    @classmethod
    def _tops(cls) -> list[float]:
        """Each bucket's upper boundary (computed once per class)."""
        key = (cls.first, cls.ratio, cls.n_buckets)
        hit = _BUCKET_TOPS.get(key)
        if hit is None:
            hit = _BUCKET_TOPS[key] = [
                float(cls.first * cls.ratio ** (i + 1)) for i in range(cls.n_buckets)
            ]
        return hit


# the rows of a job's VPA histograms: (role, CPU or memory)
_VPA_ROWS = {
    (Role.WORKER, "cpu"): 0,
    (Role.WORKER, "mem"): 1,
    (Role.PS, "cpu"): 2,
    (Role.PS, "mem"): 3,
}


class VpaPolicy(FixedInterval):
    """Kubernetes VPA recommender: per-container requests from decaying usage histograms.

    Target = p90 x 1.15, lower bound p50 x 1.15, upper bound p95 x 1.15 x 2 (VPA's confidence
    interval, simplified); the updater re-creates a role's pods only when its request falls
    outside [lower, upper]. OOM: the memory sample recorded is max(1.2 x limit, limit +
    100 MiB). Replica counts stay the user's. Half-life 24 h.
    """

    uses_samples = False  # decides from observations only: the engine builds no Samples

    name = "vpa"
    interval_s: float | None = 300.0
    half_life_s = 86_400.0
    margin = 1.15
    min_observations = 3

    def __init__(self) -> None:
        self._hists: dict[str, _DecayingHistograms] = {}
        self._seen: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def _hist(self, job: str) -> _DecayingHistograms:
        h = self._hists.get(job)
        if h is None:
            h = self._hists[job] = _DecayingHistograms(self.half_life_s, len(_VPA_ROWS))
        return h

    def initial_plan(
        self, job: JobView, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan:
        return job.manual_plan

    def replan(
        self,
        job: JobView,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None:
        last = self._seen.get(job.name, -1.0)
        running = NodeState.RUNNING
        for obs in observations:
            if obs.time_s <= last:
                continue
            wc: list[float] = []
            wm: list[float] = []
            pc: list[float] = []
            pm: list[float] = []
            for n in obs.nodes:
                if n.state is running:
                    if n.role is Role.WORKER:
                        wc.append(n.cpu_used_millicores)
                        wm.append(n.memory_used_mib)
                    elif n.role is Role.PS:
                        pc.append(n.cpu_used_millicores)
                        pm.append(n.memory_used_mib)
            if wc or pc:
                self._hist(job.name).add_rows((wc, wm, pc, pm), obs.time_s)
            self._count[job.name] = self._count.get(job.name, 0) + 1
            last = obs.time_s
        self._seen[job.name] = last
        if self._count.get(job.name, 0) < self.min_observations:
            return None
        hist = self._hists.get(job.name)
        new_roles: dict[Role, RolePlan] = {}
        changed = False
        pct: list[list[float]] | None = None
        for role in (Role.WORKER, Role.PS):
            rp = current.role(role)
            r_cpu, r_mem = _VPA_ROWS[(role, "cpu")], _VPA_ROWS[(role, "mem")]
            if hist is None or not hist.count[r_cpu] or not hist.count[r_mem]:
                new_roles[role] = rp
                continue
            if pct is None:
                pct = hist.percentiles((0.5, 0.9, 0.95))
            c50, c90, c95 = pct[r_cpu]
            m50, m90, m95 = pct[r_mem]
            cpu_target = c90 * self.margin
            mem_target = m90 * self.margin
            cur = rp.resources
            cpu_lo, cpu_hi = c50 * self.margin, c95 * 2.3
            mem_lo, mem_hi = m50 * self.margin, m95 * 2.3
            outside = not (cpu_lo <= cur.cpu_millicores <= cpu_hi) or not (
                mem_lo <= cur.memory_mib <= mem_hi
            )
            if outside:
                changed = True
                new_roles[role] = RolePlan(
                    rp.count,
                    NodeResources(max(1000, int(cpu_target)), max(250, int(mem_target))),
                )
            else:
                new_roles[role] = rp
        if not changed:
            return None
        return _resized(
            current, new_roles, "vpa: request outside [lower, upper] bound", now_s, job.quota
        )

    def on_node_exit(
        self,
        job: JobView,
        role: Role,
        node_id: int,
        exit_class: ExitClass,
        current: NodeResources,
        plan: ResourcePlan,
        relaunches: int,
    ) -> RelaunchDecision:
        if exit_class is not ExitClass.OOM:
            return _relaunch_same()
        bumped = OomBump().bump(current.memory_mib)  # VPA's RecordOOM rule
        self._hist(job.name).add(_VPA_ROWS[(role, "mem")], bumped, plan.created_at_s, weight=10.0)
        return RelaunchDecision(
            True,
            NodeResources(current.cpu_millicores, bumped),
            None,
            "vpa oom bump",
        )


# ---- Autopilot ----------------------------------------------------------------------------
class AutopilotPolicy(FixedInterval):
    """Google Autopilot-style moving-window recommender per recurring job.

    CPU request = p95 of per-node usage over the window x 1.1; memory = max over the window
    (history of earlier runs of the signature + live) x 1.2. No replica scaling. A live change
    is applied only when it moves a request by more than 15%. OOM: memory x 1.5.
    """

    uses_samples = False  # decides from observations only: the engine builds no Samples

    name = "autopilot"
    interval_s: float | None = 600.0
    window = 24  # observations
    change_threshold = 0.15

    def __init__(self) -> None:
        self._hist_peak: dict[tuple[str, Role], tuple[float, float]] = {}
        self._live: dict[tuple[str, Role], list[tuple[float, float]]] = {}
        self._seen: dict[str, float] = {}

    def initial_plan(
        self, job: JobView, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan:
        plan = job.manual_plan
        recent = [h for h in history if h.signature == job.signature][-7:]
        if not recent:
            return plan
        roles = {}
        for role, cpu_attr, mem_attr in (
            (Role.WORKER, "worker_cpu_used_millicores", "worker_memory_used_mib"),
            (Role.PS, "ps_cpu_used_millicores", "ps_memory_used_mib"),
        ):
            cpus = [getattr(h, cpu_attr) for h in recent if getattr(h, cpu_attr)]
            mems = [getattr(h, mem_attr) for h in recent if getattr(h, mem_attr)]
            rp = plan.role(role)
            if not cpus or not mems:
                roles[role] = rp
                continue
            cpu = _percentile(cpus, 95) * 1.1
            mem = max(mems) * 1.2
            self._hist_peak[(job.name, role)] = (cpu, mem)
            roles[role] = RolePlan(rp.count, NodeResources(max(1000, int(cpu)), int(mem)))
        return replace(
            plan,
            workers=roles[Role.WORKER],
            ps=roles[Role.PS],
            stage=Stage.WARM_START,
            reasons=(f"autopilot: window over {len(recent)} earlier runs",),
            created_at_s=now_s,
        )

    def replan(
        self,
        job: JobView,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None:
        last = self._seen.get(job.name, -1.0)
        running = NodeState.RUNNING
        for obs in observations:
            if obs.time_s <= last:
                continue
            # per role, the largest CPU and memory use of a running node (one pass)
            peak: dict[Role, list[int]] = {}
            for n in obs.nodes:
                if n.state is running:
                    pk = peak.get(n.role)
                    if pk is None:
                        peak[n.role] = [n.cpu_used_millicores, n.memory_used_mib]
                    else:
                        if n.cpu_used_millicores > pk[0]:
                            pk[0] = n.cpu_used_millicores
                        if n.memory_used_mib > pk[1]:
                            pk[1] = n.memory_used_mib
            for role in (Role.WORKER, Role.PS):
                pk = peak.get(role)
                if pk is None:
                    continue
                live = self._live.setdefault((job.name, role), [])
                live.append((pk[0], pk[1]))
                del live[: -self.window]
            last = obs.time_s
        self._seen[job.name] = last
        roles = {}
        changed = False
        for role in (Role.WORKER, Role.PS):
            rp = current.role(role)
            live = self._live.get((job.name, role), [])
            if len(live) < 4:
                roles[role] = rp
                continue
            _hcpu, hmem = self._hist_peak.get((job.name, role), (0.0, 0.0))
            cpu = _percentile([c for c, _ in live], 95) * 1.1
            mem = max(max(m for _, m in live) * 1.2, hmem)
            cur = rp.resources
            if (
                abs(cpu - cur.cpu_millicores) > self.change_threshold * cur.cpu_millicores
                or abs(mem - cur.memory_mib) > self.change_threshold * cur.memory_mib
            ):
                changed = True
                roles[role] = RolePlan(rp.count, NodeResources(max(1000, int(cpu)), int(mem)))
            else:
                roles[role] = rp
        if not changed:
            return None
        return _resized(current, roles, "autopilot: moving-window percentile", now_s, job.quota)

    def on_node_exit(
        self,
        job: JobView,
        role: Role,
        node_id: int,
        exit_class: ExitClass,
        current: NodeResources,
        plan: ResourcePlan,
        relaunches: int,
    ) -> RelaunchDecision:
        if exit_class is not ExitClass.OOM:
            return _relaunch_same()
        mem = int(current.memory_mib * 1.5)
        key = (job.name, role)
        hcpu, hmem = self._hist_peak.get(key, (0.0, 0.0))
        self._hist_peak[key] = (hcpu, max(hmem, float(mem)))
        return RelaunchDecision(True, NodeResources(current.cpu_millicores, mem), None, "oom x1.5")


# ---- Optimus ------------------------------------------------------------------------------
class OptimusPolicy(FixedInterval):
    """Optimus (EuroSys'18): fit f(p, w) = w / (θ0 + θ1·w/p + θ2·w + θ3·p) from the job's own
    samples (NNLS on w/X), then greedily add the worker or PS with the larger marginal gain per
    core while the gain stays positive and the quota allows. Per-node CPU/memory stay the
    user's. Until 4 distinct (p, w) are seen it explores (+25% workers, then +1 PS)."""

    name = "optimus"
    interval_s: float | None = 600.0
    min_gain_per_core = 0.05  # stop when a unit adds < 5% of the average per-core throughput
    max_steps = 8

    def __init__(self) -> None:
        self._explore: dict[str, int] = {}

    def initial_plan(
        self, job: JobView, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan:
        return job.manual_plan

    @staticmethod
    def _fit(samples: Sequence[Sample]) -> np.ndarray | None:
        by_cfg: dict[tuple[int, int], list[float]] = {}
        for s in samples:
            if s.throughput_sps > 0:
                by_cfg.setdefault((s.workers, s.ps), []).append(s.throughput_sps)
        if len(by_cfg) < 4:
            return None
        a = []
        y = []
        for (w, p), xs in by_cfg.items():
            a.append([1.0, w / p, w, p])
            y.append(w / float(np.mean(xs)))
        theta, _ = nnls(np.asarray(a), np.asarray(y))
        return theta

    @staticmethod
    def _f(theta: np.ndarray, w: int, p: int) -> float:
        den = theta[0] + theta[1] * w / p + theta[2] * w + theta[3] * p
        return w / den if den > 0 else 0.0

    def replan(
        self,
        job: JobView,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None:
        if not samples or (samples[-1].workers, samples[-1].ps) != (
            current.workers.count,
            current.ps.count,
        ):
            return None  # wait for a steady sample of the current configuration
        if job.strategy == "allreduce":
            return self._replan_ranks(job, current, samples, now_s)
        w, p = current.workers.count, current.ps.count
        wcores = current.workers.resources.cpu_cores
        pcores = current.ps.resources.cpu_cores
        theta = self._fit(samples)
        if theta is None:
            step = self._explore.get(job.name, 0)
            self._explore[job.name] = step + 1
            if step % 2 == 0:
                w2, p2 = w + max(1, w // 4), p
            else:
                w2, p2 = w, p + 1
            if step > 6:
                return None
        else:
            w2, p2 = w, p
            for _ in range(self.max_steps):
                x = self._f(theta, w2, p2)
                avg = x / (w2 * wcores + p2 * pcores)
                dw = max(1, w2 // 8)
                gw = (self._f(theta, w2 + dw, p2) - x) / (dw * wcores)
                gp = (self._f(theta, w2, p2 + 1) - x) / pcores
                if max(gw, gp) < self.min_gain_per_core * avg:
                    break
                if gw >= gp:
                    w2 += dw
                else:
                    p2 += 1
            if (w2, p2) == (w, p):
                return None
        return self._move(job, current, w2, p2, theta is not None, now_s)

    @staticmethod
    def _move(
        job: JobView, current: ResourcePlan, w2: int, p2: int, fitted: bool, now_s: float
    ) -> ResourcePlan | None:
        """``current`` at ``w2`` workers (ranks) and ``p2`` PS, their sizes kept, fitted to
        the quota; None when the quota leaves both counts as they are."""
        plan = replace(
            current,
            workers=RolePlan(w2, current.workers.resources),
            ps=RolePlan(p2, current.ps.resources),
            overrides=(),
            stage=Stage.SCALING if fitted else Stage.SAMPLING,
            reasons=("optimus: greedy marginal gain" if fitted else "optimus: explore",),
            created_at_s=now_s,
        )
        out = _fit_quota(plan, job.quota)
        same = (out.workers.count, out.ps.count) == (current.workers.count, current.ps.count)
        return None if same else out

    def _replan_ranks(
        self, job: JobView, current: ResourcePlan, samples: Sequence[Sample], now_s: float
    ) -> ResourcePlan | None:
        """All-reduce: Optimus' synchronous form without PS terms, ``w / X = θ0 + θ1·w``
        (NNLS over the distinct rank counts measured), then ranks added greedily (+w/8 at a
        time) while a rank adds at least ``min_gain_per_core`` of the average per-core rate,
        inside the quota. Until 3 rank counts are measured it explores (+25% ranks)."""
        w = current.workers.count
        wcores = current.workers.resources.cpu_cores
        by_w: dict[int, list[float]] = {}
        for s in samples:
            if s.throughput_sps > 0:
                by_w.setdefault(s.workers, []).append(s.throughput_sps)
        theta: np.ndarray | None = None
        if len(by_w) >= 3:
            a = np.array([[1.0, float(n)] for n in by_w])
            y = np.array([n / float(np.mean(xs)) for n, xs in by_w.items()])
            theta, _ = nnls(a, y)

        def f(n: int) -> float:
            assert theta is not None
            den = theta[0] + theta[1] * n
            return n / den if den > 0 else 0.0

        if theta is None:
            step = self._explore.get(job.name, 0)
            self._explore[job.name] = step + 1
            if step >= 3:
                return None
            w2 = w + max(1, w // 4)
        else:
            w2 = w
            for _ in range(self.max_steps):
                x = f(w2)
                dw = max(1, w2 // 8)
                gain = (f(w2 + dw) - x) / (dw * wcores)
                if gain < self.min_gain_per_core * x / (w2 * wcores):
                    break
                w2 += dw
        if w2 == w:
            return None
        return self._move(job, current, w2, current.ps.count, theta is not None, now_s)

    def on_node_exit(
        self,
        job: JobView,
        role: Role,
        node_id: int,
        exit_class: ExitClass,
        current: NodeResources,
        plan: ResourcePlan,
        relaunches: int,
    ) -> RelaunchDecision:
        return _relaunch_same()


# ---- oracle -------------------------------------------------------------------------------
class OraclePolicy(FixedInterval):
    """Knows each job's truth: starts at ``JobTruth.oracle_config`` (all-reduce:
    ``allreduce_oracle_config``) and never changes."""

    uses_samples = False  # decides from observations only: the engine builds no Samples

    name = "oracle"
    interval_s: float | None = None

    def __init__(self) -> None:
        self._truths: dict[str, JobTruth] = {}

    def bind_truths(self, truths: dict[str, JobTruth]) -> None:
        self._truths = truths

    def initial_plan(
        self, job: JobView, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan:
        truth = self._truths.get(job.name)
        if truth is None:
            return job.manual_plan
        if job.strategy == "allreduce":
            c = truth.allreduce_oracle_config(
                job.quota.cpu_cores, job.quota.memory_mib, job.batch_size
            )
            return ResourcePlan(
                workers=RolePlan(c.workers, _res(c.worker_cpu_cores, c.worker_memory_mib)),
                ps=RolePlan(0, NodeResources(0, 0)),
                stage=Stage.WARM_START,
                reasons=("oracle: best per-core ranks x CPU of the true model",),
                predicted_throughput_sps=c.throughput_sps,
                created_at_s=now_s,
            )
        c = truth.oracle_config(job.quota.cpu_cores, job.quota.memory_mib)
        return ResourcePlan(
            workers=RolePlan(c.workers, _res(c.worker_cpu_cores, c.worker_memory_mib)),
            ps=RolePlan(c.ps, _res(c.ps_cpu_cores, c.ps_memory_mib)),
            stage=Stage.WARM_START,
            reasons=("oracle: best per-core configuration of the true model",),
            predicted_throughput_sps=c.throughput_sps,
            created_at_s=now_s,
        )

    def replan(
        self,
        job: JobView,
        current: ResourcePlan,
        observations: Sequence[Observation],
        samples: Sequence[Sample],
        now_s: float,
    ) -> ResourcePlan | None:
        return None

    def on_node_exit(
        self,
        job: JobView,
        role: Role,
        node_id: int,
        exit_class: ExitClass,
        current: NodeResources,
        plan: ResourcePlan,
        relaunches: int,
    ) -> RelaunchDecision:
        return _relaunch_same()
