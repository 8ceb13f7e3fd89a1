"""A job's hidden true behaviour: what the cluster really does, never shown to a policy.

The family is deliberately *not* the planner's model (``T_iter = a0 + a1·B/λw + ...``):

* worker compute: ``c_w`` core-seconds per sample on a worker whose threads saturate: the
  effective cores of a node with ``λ`` cores are ``k·(1 − exp(−λ/k))·λ/(λ + o)`` (``o``:
  framework overhead, ``k`` a per-job parallelism cap of ~4–16 cores);
* PS service: ``c_p`` core-seconds per sample for the whole PS set, split by per-PS load shares
  drawn from a Dirichlet (hot IDs), so the hottest PS bounds the rate (hot PS);
* per-PS network bandwidth cap (bytes per sample split by the same shares);
* the three rates are combined by a smooth minimum ``(Xw^-k + Xps^-k + Xnet^-k)^(-1/k)``
  (queueing near the bottleneck);
* worker memory is constant; PS memory is dense + growing embeddings ``U(n) = K·n^β`` rows,
  split by memory shares (a blend of the load shares and an even split).

CPU used by a node is a baseline plus the busy fraction ``ρ`` of what it can burn: a saturated
right-sized node reads ~90% busy, a node far above its parallelism cap reads low even when
saturated (idle threads do not burn CPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dlrover_core.units import millicores_from_cores_truncated

FloatArray = npt.NDArray[np.float64]

# candidate grid of the oracle's exhaustive search
_ORACLE_W = np.array(
    [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128],
    dtype=np.float64,
)
_ORACLE_P = np.array([*list(range(1, 17)), 20, 24, 32], dtype=np.float64)
ORACLE_MAX_PS = int(_ORACLE_P.max())  # the most PS the oracle may choose
_ORACLE_CPU = np.array([1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32], dtype=np.float64)
# allocated cores of every grid configuration, (W, Lw, P, Lp): the same for every job
_ORACLE_CORES = (_ORACLE_W[:, None] * _ORACLE_CPU[None, :])[:, :, None, None] + (
    _ORACLE_P[:, None] * _ORACLE_CPU[None, :]
)[None, None, :, :]
ORACLE_EFFICIENCY_KEEP = 0.8  # oracle: fastest config keeping >= 80% of the best per-core rate
MEMORY_MARGIN = 1.1  # oracle's memory headroom over the true end-of-training peak


@dataclass(frozen=True)
class OracleConfig:
    workers: int
    ps: int
    worker_cpu_cores: float
    ps_cpu_cores: float
    worker_memory_mib: int
    ps_memory_mib: int
    throughput_sps: float

    @property
    def cores(self) -> float:
        return self.workers * self.worker_cpu_cores + self.ps * self.ps_cpu_cores

    @property
    def throughput_per_core(self) -> float:
        return self.throughput_sps / self.cores


@dataclass(frozen=True)
class OracleGrid:
    """The oracle's candidate grid of one job, axes (workers, CPU per worker, PS, CPU per PS):
    ``inv`` the sum of each stage's rate to the power −k (throughput is
    ``inv ** (-1 / smooth_k)``), ``cores`` and ``mem`` (MiB) the allocation, ``ok`` where
    it fits the quota; memory per worker, and per PS for each PS count."""

    inv: FloatArray
    cores: FloatArray
    mem: FloatArray
    ok: npt.NDArray[np.bool_]
    worker_memory_mib: int
    ps_memory_mib: FloatArray

    def choice(self, smooth_k: float) -> tuple[int, float]:
        """The oracle's rule on this grid: among the configurations that fit (the smallest
        when none does), the fastest whose throughput per core is at least
        ``ORACLE_EFFICIENCY_KEEP`` of the best; (its flat index, its throughput). The flat
        order is kept, so the first best wins."""
        ok = self.ok if self.ok.any() else self.cores == self.cores.min()
        where = np.flatnonzero(ok)
        x_ok = self.inv.ravel()[where] ** (-1.0 / smooth_k)
        per_core = x_ok / self.cores.ravel()[where]
        good = per_core >= ORACLE_EFFICIENCY_KEEP * per_core.max()
        best = int(np.argmax(np.where(good, x_ok, -1.0)))
        return int(where[best]), float(x_ok[best])


@dataclass
class JobTruth:
    """Hidden ground truth of one job (shared by every run of a recurring signature)."""

    seed: int
    samples_total: int
    c_w: float  # worker core-seconds per sample
    k_w: float  # worker parallelism cap (cores)
    o_w: float  # worker framework overhead (cores)
    c_p: float  # PS core-seconds per sample, whole PS set
    k_p: float
    o_p: float
    net_bytes_per_sample: float
    ps_bandwidth_bps: float  # bytes/s per PS
    skew_alpha: float  # Dirichlet concentration of PS load shares (low = skewed)
    worker_memory_mib: float
    ps_base_memory_mib: float
    dense_memory_mib: float  # dense params x (1 + optimizer slots)
    emb_k: float  # U(n) = emb_k * n ** emb_beta distinct embedding rows after n samples
    emb_beta: float
    row_mib: float  # MiB per embedding row incl. optimizer slots
    smooth_k: float = 4.0
    noise_sigma: float = 0.05  # multiplicative measurement noise of throughput
    # all-reduce (no PS): each step the ranks synchronise their gradients; a step costs
    # ``sync_hop_s`` per hop of the exchange (latency, per-collective overheads) on top of
    # ``sync_bytes_per_sample`` over ``ps_bandwidth_bps`` (see ``allreduce_throughput``)
    sync_hop_s: float = 1e-3
    sync_bytes_per_sample: float = 0.0
    # all-reduce: embedding tables (weights + optimizer state) sharded over the ranks, MiB in
    # all; a rank holds its share on top of ``worker_memory_mib`` (see ``rank_memory_mib``)
    rank_table_mib: float = 0.0
    _shares: dict[int, FloatArray] = field(default_factory=dict, repr=False, compare=False)
    _mshares: dict[int, FloatArray] = field(default_factory=dict, repr=False, compare=False)
    _mshare_max: dict[int, float] = field(default_factory=dict, repr=False, compare=False)
    _oracle: dict[tuple[int, int], OracleConfig] = field(
        default_factory=dict, repr=False, compare=False
    )
    _ar_oracle: dict[tuple[int, int, int], OracleConfig] = field(
        default_factory=dict, repr=False, compare=False
    )

    # ---- structure -------------------------------------------------------------------
    def load_shares(self, p: int) -> FloatArray:
        """Per-PS load shares for a PS set of size ``p`` (deterministic per job and p)."""
        s = self._shares.get(p)
        if s is None:
            rng = np.random.default_rng([self.seed, 7919, p])
            s = rng.dirichlet(np.full(p, self.skew_alpha)) if p > 1 else np.ones(1)
            self._shares[p] = s
        return s

    def memory_shares(self, p: int) -> FloatArray:
        s = self._mshares.get(p)
        if s is None:
            s = self._mshares[p] = 0.5 * self.load_shares(p) + 0.5 / p
        return s

    def max_memory_share(self, p: int) -> float:
        """``float(memory_shares(p).max())`` (memoised per ``p``)."""
        m = self._mshare_max.get(p)
        if m is None:
            m = self._mshare_max[p] = float(self.memory_shares(p).max())
        return m

    def max_share(self, p: int) -> float:
        return float(self.load_shares(p).max())

    def eff_worker(self, cpu: FloatArray | float) -> FloatArray | float:
        c = np.maximum(np.asarray(cpu, dtype=np.float64), 0.0)
        return self.k_w * (1.0 - np.exp(-c / self.k_w)) * c / (c + self.o_w)

    def eff_ps(self, cpu: FloatArray | float) -> FloatArray | float:
        c = np.maximum(np.asarray(cpu, dtype=np.float64), 0.0)
        return self.k_p * (1.0 - np.exp(-c / self.k_p)) * c / (c + self.o_p)

    # ---- throughput ------------------------------------------------------------------
    def rates(
        self,
        worker_cpus: Sequence[float] | FloatArray,
        ps_cpus: Sequence[float] | FloatArray,
        worker_speeds: Sequence[float] | FloatArray | None = None,
    ) -> tuple[float, float, float, float]:
        """(X, Xw, Xps, Xnet) for the given per-node CPU (cores) and worker speeds."""
        wc = np.asarray(worker_cpus, dtype=np.float64)
        pc = np.asarray(ps_cpus, dtype=np.float64)
        if wc.size == 0 or pc.size == 0:
            return 0.0, 0.0, 0.0, 0.0
        ew = np.asarray(self.eff_worker(wc))
        if worker_speeds is not None:
            ew = ew * np.asarray(worker_speeds, dtype=np.float64)
        xw = float(ew.sum()) / self.c_w
        shares = self.load_shares(int(pc.size))
        ep = np.asarray(self.eff_ps(pc))
        xps = float(np.min(ep / (self.c_p * shares)))
        xnet = self.ps_bandwidth_bps / (self.net_bytes_per_sample * float(shares.max()))
        if xw <= 0 or xps <= 0:
            return 0.0, xw, xps, xnet
        k = self.smooth_k
        x = (xw**-k + xps**-k + xnet**-k) ** (-1.0 / k)
        return float(x), xw, xps, xnet

    def throughput(
        self,
        w: int,
        p: int,
        worker_cpu: float,
        ps_cpu: float,
        worker_speeds: Sequence[float] | None = None,
    ) -> float:
        """True samples/s of ``w`` workers x ``worker_cpu`` cores and ``p`` PS x ``ps_cpu``."""
        return self.rates([worker_cpu] * w, [ps_cpu] * p, worker_speeds)[0]

    def allreduce_throughput(
        self, ranks: int, cpu: float, batch_per_rank: int, slowest_speed: float = 1.0
    ) -> float:
        """True samples/s of a synchronous all-reduce group of ``ranks`` x ``cpu`` cores.

        Lockstep: the group computes at the rate of ``ranks`` equal ranks (the same
        saturating cores as a worker: ``eff_worker``), then waits for the exchange, whose
        step time grows with the hops (``2(w-1)``, a ring) and moves ``2(w-1)/w`` of the
        synchronised bytes per rank; the two rates meet in the smooth minimum of the PS
        family. Not the planner's all-reduce form (a sum of step-time terms, linear in CPU).
        ``slowest_speed``: the slowest rank's speed (a straggler; every rank waits for it)."""
        w = max(1, int(ranks))
        x_compute = w * float(self.eff_worker(cpu)) * slowest_speed / self.c_w
        if w == 1:
            return x_compute
        step_rows = w * batch_per_rank
        sync_s = 2 * (w - 1) * self.sync_hop_s + (
            2 * (w - 1) / w * self.sync_bytes_per_sample * step_rows / self.ps_bandwidth_bps
        )
        x_sync = step_rows / sync_s if sync_s > 0 else math.inf
        k = self.smooth_k
        return float((x_compute**-k + x_sync**-k) ** (-1.0 / k))

    def rank_memory_mib(self, ranks: int) -> float:
        """MiB one all-reduce rank uses at ``ranks`` ranks: the runtime (``worker_memory_mib``)
        plus its share of the tables, 10 % above an even split when there are several ranks
        (tables do not split evenly)."""
        w = max(1, int(ranks))
        share = 1.0 if w == 1 else 1.1 / w
        return self.worker_memory_mib + self.rank_table_mib * share

    def allreduce_cpu_used(self, cpus: FloatArray, speeds: FloatArray, x: float) -> FloatArray:
        """Cores used per rank of a lockstep group running at ``x`` samples/s: a rank
        computes its ``x / ranks`` samples/s at its own speed and waits for the others (and
        the exchange) the rest of the time, burning its baseline only; so a slow rank reads
        busy while the others read idle (what stage 3's straggler rule looks for)."""
        base = np.minimum(0.5 * self.o_w, cpus)
        if x <= 0 or cpus.size == 0:
            return np.asarray(base, dtype=np.float64)
        eff = np.asarray(self.eff_worker(cpus))
        rate = eff * speeds / self.c_w  # samples/s each rank computes when busy
        busy = rate > 0
        rho = np.where(busy, np.minimum(1.0, (x / cpus.size) / np.where(busy, rate, 1.0)), 0.0)
        used = base + rho * self._busy_cores(cpus, eff, 0.5 * self.o_w)
        return np.asarray(np.minimum(used, cpus), dtype=np.float64)

    # ---- resource usage --------------------------------------------------------------
    def _busy_cores(self, cpu: FloatArray, eff: FloatArray, base: float) -> FloatArray:
        return np.minimum(np.maximum(cpu - base, 0.0), 1.15 * eff)

    def cpu_used(
        self,
        worker_cpus: FloatArray,
        ps_cpus: FloatArray,
        x: float,
        xw: float,
    ) -> tuple[FloatArray, FloatArray]:
        """Cores used per worker and per PS while the job runs at ``x`` samples/s."""
        wbase = np.minimum(0.5 * self.o_w, worker_cpus)
        rho_w = min(1.0, x / xw) if xw > 0 else 0.0
        w_used = wbase + rho_w * self._busy_cores(
            worker_cpus, np.asarray(self.eff_worker(worker_cpus)), 0.5 * self.o_w
        )
        pbase = np.minimum(0.5 * self.o_p, ps_cpus)
        eff_p = np.asarray(self.eff_ps(ps_cpus))
        shares = self.load_shares(int(ps_cpus.size))
        # a PS with no effective CPU does no work (divided by 1 there, then masked: the other
        # PS' values are the same operations; cheaper than an errstate context per call)
        busy = eff_p > 0
        rho_p = np.where(
            busy, np.minimum(1.0, x * self.c_p * shares / np.where(busy, eff_p, 1.0)), 0.0
        )
        p_used = pbase + rho_p * self._busy_cores(ps_cpus, eff_p, 0.5 * self.o_p)
        return np.minimum(w_used, worker_cpus), np.minimum(p_used, ps_cpus)

    def distinct_ids(self, samples_done: float) -> float:
        return self.emb_k * max(samples_done, 0.0) ** self.emb_beta

    def ps_memory_used(self, p: int, samples_done: float) -> FloatArray:
        """MiB used by each of ``p`` PS after ``samples_done`` samples."""
        model = self.dense_memory_mib + self.distinct_ids(samples_done) * self.row_mib
        return self.ps_base_memory_mib + self.memory_shares(p) * model

    def ps_memory_peak(self, p: int, samples_done: float) -> float:
        """``float(ps_memory_used(p, samples_done).max())`` without the array: the PS of the
        largest memory share, by the same operations (rounding is monotone, so the largest
        share's value is the largest value)."""
        model = self.dense_memory_mib + self.distinct_ids(samples_done) * self.row_mib
        return self.ps_base_memory_mib + self.max_memory_share(p) * model

    def memory_used(self, p: int, samples_done: float) -> tuple[float, FloatArray]:
        """(MiB per worker, MiB per PS) after ``samples_done`` samples."""
        return self.worker_memory_mib, self.ps_memory_used(p, samples_done)

    def ps_oom_samples_each(self, p: int, ps_limits_mib: FloatArray) -> FloatArray:
        """Per PS: samples done at which it exceeds its limit (0 if it already does)."""
        shares = self.memory_shares(p)
        room = (ps_limits_mib - self.ps_base_memory_mib) / shares - self.dense_memory_mib
        n = (np.maximum(room, 0.0) / (self.emb_k * self.row_mib)) ** (1.0 / self.emb_beta)
        return np.asarray(n, dtype=np.float64)

    def ps_oom_samples(self, p: int, ps_limits_mib: FloatArray) -> float:
        """Samples done at which the first PS exceeds its limit (0 if one already does)."""
        return float(self.ps_oom_samples_each(p, ps_limits_mib).min())

    # ---- oracle ----------------------------------------------------------------------
    def oracle_config(self, quota_cpu_cores: float, quota_memory_mib: float) -> OracleConfig:
        """Best configuration within the quota, knowing the truth.

        Objective (documented choice): among all grid configurations whose throughput per
        allocated core is at least ``ORACLE_EFFICIENCY_KEEP`` of the best attainable per-core
        rate, take the fastest. Pure per-core maximisation would pick a tiny, very slow job;
        pure speed would waste cores on the flat tail of the curve. Memory is the true
        end-of-training peak plus ``MEMORY_MARGIN``, so the oracle never OOMs.
        """
        key = (millicores_from_cores_truncated(quota_cpu_cores), int(quota_memory_mib))
        hit = self._oracle.get(key)
        if hit is not None:
            return hit
        g = self.oracle_grid(quota_cpu_cores, quota_memory_mib)
        flat, x_best = g.choice(self.smooth_k)
        iw, ilw, ip, ilp = (int(i) for i in np.unravel_index(flat, g.inv.shape))
        cfg = OracleConfig(
            workers=int(_ORACLE_W[iw]),
            ps=int(_ORACLE_P[ip]),
            worker_cpu_cores=float(_ORACLE_CPU[ilw]),
            ps_cpu_cores=float(_ORACLE_CPU[ilp]),
            worker_memory_mib=int(g.worker_memory_mib),
            ps_memory_mib=int(g.ps_memory_mib[ip]),
            throughput_sps=x_best,
        )
        self._oracle[key] = cfg
        return cfg

    def allreduce_oracle_config(
        self, quota_cpu_cores: float, quota_memory_mib: float, batch_per_rank: int
    ) -> OracleConfig:
        """The oracle of an all-reduce job: ranks (``_ORACLE_W``) x CPU per rank
        (``_ORACLE_CPU``), memory per rank its true need plus ``MEMORY_MARGIN``, chosen by
        the PS oracle's rule (the fastest configuration whose throughput per core is at least
        ``ORACLE_EFFICIENCY_KEEP`` of the best, among those that fit the quota; the smallest
        when none does). No PS (``ps`` 0)."""
        key = (
            millicores_from_cores_truncated(quota_cpu_cores),
            int(quota_memory_mib),
            int(batch_per_rank),
        )
        hit = self._ar_oracle.get(key)
        if hit is not None:
            return hit
        w, lw = _ORACLE_W, _ORACLE_CPU
        mem = np.array([math.ceil(self.rank_memory_mib(int(r)) * MEMORY_MARGIN) for r in w])
        x = np.array(
            [[self.allreduce_throughput(int(r), float(c), batch_per_rank) for c in lw] for r in w]
        )
        cores = w[:, None] * lw[None, :]
        ok = (cores <= quota_cpu_cores + 1e-9) & ((w * mem)[:, None] <= quota_memory_mib)
        if not ok.any():
            ok = cores == cores.min()
        per_core = np.where(ok, x / cores, -1.0)
        good = ok & (per_core >= ORACLE_EFFICIENCY_KEEP * per_core.max())
        flat = int(np.argmax(np.where(good, x, -1.0)))
        iw, il = (int(i) for i in np.unravel_index(flat, x.shape))
        cfg = OracleConfig(
            workers=int(w[iw]),
            ps=0,
            worker_cpu_cores=float(lw[il]),
            ps_cpu_cores=0.0,
            worker_memory_mib=int(mem[iw]),
            ps_memory_mib=0,
            throughput_sps=float(x[iw, il]),
        )
        self._ar_oracle[key] = cfg
        return cfg

    def oracle_grid(
        self,
        quota_cpu_cores: float,
        quota_memory_mib: float,
        max_shares: FloatArray | None = None,
    ) -> OracleGrid:
        """The oracle's candidate grid (axes ``_ORACLE_W``, ``_ORACLE_CPU``, ``_ORACLE_P``,
        ``_ORACLE_CPU``) for this job: what :meth:`oracle_config` chooses from. Memory per
        node is the true end-of-training peak plus ``MEMORY_MARGIN`` (PS: × 1.1).
        ``max_shares``: the hottest PS's load share for each PS count of ``_ORACLE_P`` in
        place of this job's own draws (e.g. their expected values, for an oracle that does
        not know the draws)."""
        wmem = math.ceil(self.worker_memory_mib * MEMORY_MARGIN)
        w, p, lw, lp = _ORACLE_W, _ORACLE_P, _ORACLE_CPU, _ORACLE_CPU
        pmem = np.array(
            [
                math.ceil(float(self.ps_memory_used(int(pi), self.samples_total).max()) * 1.1)
                for pi in p
            ]
        )
        maxs = (
            np.array([self.max_share(int(pi)) for pi in p])
            if max_shares is None
            else np.asarray(max_shares, dtype=np.float64)
        )
        xw = (w[:, None] * np.asarray(self.eff_worker(lw))[None, :]) / self.c_w  # (W, Lw)
        xps = np.asarray(self.eff_ps(lp))[None, :] / (self.c_p * maxs[:, None])  # (P, Lp)
        xnet = self.ps_bandwidth_bps / (self.net_bytes_per_sample * maxs)  # (P,)
        k = self.smooth_k
        # the powers on the small per-role grids, then one broadcast sum (same values)
        inv = (
            (np.maximum(xw, 1e-12) ** -k)[:, :, None, None]
            + (np.maximum(xps, 1e-12) ** -k)[None, None, :, :]
            + (xnet**-k)[None, None, :, None]
        )
        cores = _ORACLE_CORES
        mem = (w * wmem)[:, None, None, None] + (p * pmem)[None, None, :, None]
        ok = (cores <= quota_cpu_cores + 1e-9) & (mem <= quota_memory_mib)
        return OracleGrid(inv, cores, mem, ok, wmem, pmem)
