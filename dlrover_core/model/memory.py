"""Memory models: embedding-ID growth, PS memory with OOM look-ahead, worker memory.

PS memory holds parameters, not activations, so it does not grow with the worker count; it
grows with the distinct embedding IDs seen so far, which keep arriving in CTR data
(Heaps'-law-like: U(n) ≈ K·n^β, 0 < β ≤ 1). Extrapolating U to the end of training tells the
planner to scale *before* a PS runs out of memory ("pre-tuning-based OOM prevention").
Worker memory is roughly constant in w: the largest observed use, times a margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self, overload

import numpy as np
import numpy.typing as npt

from dlrover_core.errors import InputError, NotFittedError, TooFewSamplesError
from dlrover_core.units import bytes_from_mib, mib_from_bytes

FloatArray = npt.NDArray[np.float64]
_BETA_MIN = 1e-6  # β is clipped into (0, 1]; "no growth" becomes a barely growing curve


class IdGrowthModel:
    """Distinct embedding IDs U after n samples: U(n) ≈ K·n^β, fitted by least squares on
    (log n, log U). β is clipped into (0, 1] (K refitted at the clipped β); ``max_ids`` (the
    vocabulary size, if known) caps the prediction."""

    kind: ClassVar[str] = "id_growth"
    min_points: ClassVar[int] = 2

    def __init__(self, *, max_ids: float | None = None) -> None:
        self.max_ids = max_ids

    def fit(self, samples_seen: Sequence[float], distinct_ids: Sequence[float]) -> Self:
        n = np.asarray(samples_seen, dtype=np.float64).ravel()
        u = np.asarray(distinct_ids, dtype=np.float64).ravel()
        if n.shape != u.shape:
            raise InputError(
                f"samples_seen has {n.size} values but distinct_ids has {u.size}; "
                "give one distinct-ID count per samples-seen point"
            )
        bad = [  # on plain floats: a per-element NumPy scalar check costs more than the fit
            f"point {i}: samples_seen={ni!r}, distinct_ids={ui!r} (both must be finite, > 0)"
            for i, (ni, ui) in enumerate(zip(n.tolist(), u.tolist(), strict=True))
            if not (math.isfinite(ni) and math.isfinite(ui) and ni > 0 and ui > 0)
        ]
        if bad:
            raise InputError("cannot fit ID growth from these points", problems=bad)
        if len(set(n.tolist())) < self.min_points:
            raise TooFewSamplesError(
                f"IdGrowthModel needs distinct-ID counts at >= {self.min_points} different "
                f"samples-seen points, got {len(set(n.tolist()))}; record distinct_ids at "
                "several points of training (every runtime sample carries it)"
            )
        return self._fit_checked(n, u)

    def _fit_checked(self, n: FloatArray, u: FloatArray) -> Self:
        """The fit on points already checked (finite, > 0, at >= ``min_points`` distinct
        samples-seen values): what :meth:`fit` does after its checks."""
        x, y = np.log(n), np.log(u)
        xm, ym = float(x.mean()), float(y.mean())
        beta = float(np.sum((x - xm) * (y - ym)) / np.sum((x - xm) ** 2))
        beta = min(max(beta, _BETA_MIN), 1.0)
        log_k = ym - beta * xm  # least-squares intercept at the (possibly clipped) slope
        resid = y - (log_k + beta * x)
        dof = n.size - 2
        self.k_ = float(math.exp(log_k))
        self.beta_ = beta
        self.log_residual_std_ = float(np.sqrt(np.sum(resid**2) / dof)) if dof > 0 else 0.0
        self.n_points_ = int(n.size)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "k_"):
            raise NotFittedError(
                "IdGrowthModel is not fitted; call fit(samples_seen, distinct_ids) first"
            )

    @overload
    def predict(self, samples_seen: float) -> float: ...
    @overload
    def predict(self, samples_seen: FloatArray) -> FloatArray: ...
    def predict(self, samples_seen: float | FloatArray) -> float | FloatArray:
        """Distinct IDs expected after ``samples_seen`` samples."""
        self._check_fitted()
        if isinstance(samples_seen, np.ndarray):
            out = self.k_ * np.power(np.maximum(samples_seen, 0.0), self.beta_)
            if self.max_ids is not None:
                out = np.minimum(out, float(self.max_ids))
            return np.asarray(out, dtype=np.float64)
        val = self.k_ * math.pow(max(float(samples_seen), 0.0), self.beta_)
        return min(val, float(self.max_ids)) if self.max_ids is not None else val

    def samples_for(self, distinct_ids: float) -> float:
        """Samples after which ``distinct_ids`` IDs are expected (inverse of predict);
        ``inf`` if the vocabulary cap is below it."""
        self._check_fitted()
        if self.max_ids is not None and distinct_ids > self.max_ids:
            return math.inf
        if distinct_ids <= 0:
            return 0.0
        return math.pow(distinct_ids / self.k_, 1.0 / self.beta_)

    def to_dict(self) -> dict[str, Any]:
        fitted = None
        if hasattr(self, "k_"):
            fitted = {
                "k": self.k_,
                "beta": self.beta_,
                "log_residual_std": self.log_residual_std_,
                "n_points": self.n_points_,
            }
        return {
            "kind": self.kind,
            "version": 1,
            "params": {"max_ids": self.max_ids},
            "fitted": fitted,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        if d.get("kind") != cls.kind:
            raise InputError(f"model kind {d.get('kind')!r} is not {cls.kind!r}")
        try:
            max_ids = d.get("params", {}).get("max_ids")
            model = cls(max_ids=None if max_ids is None else float(max_ids))
            f = d.get("fitted")
            if f is not None:
                model.k_ = float(f["k"])
                model.beta_ = float(f["beta"])
                model.log_residual_std_ = float(f.get("log_residual_std", 0.0))
                model.n_points_ = int(f.get("n_points", 0))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"malformed {cls.kind} model document: {exc}") from exc
        return model


@dataclass(frozen=True)
class OOMPrediction:
    """What PS memory will do by the end of training, and what avoids an OOM."""

    distinct_ids_at_end: float
    peak_per_ps_mib: float  # most-loaded PS at the end of training, current PS count
    limit_per_ps_mib: float
    oom_at_samples: int | None  # first sample count at which a PS exceeds its limit; None: never
    needed_num_ps: int | None  # PS count (same per-PS limit) for peak x margin <= limit
    needed_memory_per_ps_mib: int  # per-PS memory (same PS count) for peak x margin

    @property
    def will_oom(self) -> bool:
        return self.oom_at_samples is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "distinct_ids_at_end": self.distinct_ids_at_end,
            "peak_per_ps_mib": self.peak_per_ps_mib,
            "limit_per_ps_mib": self.limit_per_ps_mib,
            "oom_at_samples": self.oom_at_samples,
            "will_oom": self.will_oom,
            "needed_num_ps": self.needed_num_ps,
            "needed_memory_per_ps_mib": self.needed_memory_per_ps_mib,
        }


class PSMemoryModel:
    """PS memory as a formula (no fit needed)::

        data bytes = dense_params·bytes·(1+slots) + U·(dim·bytes·(1+slots) + row_overhead)
        per PS MiB = data/MiB / num_ps · imbalance + runtime_overhead_mib

    ``optimizer_slots``: extra values per parameter (Adagrad 1, Adam 2, SGD 0).
    ``row_overhead_bytes``: the ID hash map's key, pointer and bucket per row (~48 B).
    ``imbalance``: load of the most-loaded PS over the mean (1.0 = perfectly even).
    """

    def __init__(
        self,
        embedding_dim: int,
        *,
        bytes_per_value: int = 4,
        optimizer_slots: int = 1,
        dense_params: int = 0,
        row_overhead_bytes: float = 48.0,
        runtime_overhead_mib: float = 512.0,
    ) -> None:
        self.embedding_dim = embedding_dim
        self.bytes_per_value = bytes_per_value
        self.optimizer_slots = optimizer_slots
        self.dense_params = dense_params
        self.row_overhead_bytes = row_overhead_bytes
        self.runtime_overhead_mib = runtime_overhead_mib

    @property
    def bytes_per_row(self) -> float:
        return (
            self.embedding_dim * self.bytes_per_value * (1 + self.optimizer_slots)
            + self.row_overhead_bytes
        )

    @property
    def dense_bytes(self) -> float:
        return float(self.dense_params * self.bytes_per_value * (1 + self.optimizer_slots))

    def data_mib(self, distinct_ids: float) -> float:
        """Parameters + optimizer state + hash map of all PS together, MiB."""
        return mib_from_bytes(self.dense_bytes + distinct_ids * self.bytes_per_row)

    def total_mib(self, distinct_ids: float, num_ps: int = 1) -> float:
        return self.data_mib(distinct_ids) + self.runtime_overhead_mib * num_ps

    def per_ps_mib(self, distinct_ids: float, num_ps: int, imbalance: float = 1.0) -> float:
        """Memory of the most-loaded PS, MiB."""
        if num_ps < 1:
            raise InputError(f"num_ps={num_ps} must be >= 1")
        if imbalance < 1.0:
            raise InputError(f"imbalance={imbalance} must be >= 1.0 (max load / mean load)")
        return self.data_mib(distinct_ids) / num_ps * imbalance + self.runtime_overhead_mib

    def max_ids_per_limit(self, limit_mib: float, num_ps: int, imbalance: float = 1.0) -> float:
        """Distinct IDs at which the most-loaded PS reaches ``limit_mib`` (<= 0: never fits)."""
        data_budget = bytes_from_mib((limit_mib - self.runtime_overhead_mib) * num_ps / imbalance)
        return (data_budget - self.dense_bytes) / self.bytes_per_row

    def predict_oom(
        self,
        id_growth: IdGrowthModel,
        *,
        samples_seen: float,
        samples_total: float,
        num_ps: int,
        ps_memory_limit_mib: float,
        imbalance: float = 1.0,
        margin: float = 1.2,
        max_num_ps: int = 1024,
    ) -> OOMPrediction:
        """Extrapolate PS memory to the end of training and size the PS set to avoid OOM."""
        problems = []
        if not 0 <= samples_seen <= samples_total:
            problems.append(
                f"need 0 <= samples_seen ({samples_seen}) <= samples_total ({samples_total})"
            )
        if num_ps < 1:
            problems.append(f"num_ps={num_ps} must be >= 1")
        if ps_memory_limit_mib <= 0:
            problems.append(f"ps_memory_limit_mib={ps_memory_limit_mib} must be > 0")
        if margin < 1.0:
            problems.append(f"margin={margin} must be >= 1.0")
        if imbalance < 1.0:
            problems.append(f"imbalance={imbalance} must be >= 1.0")
        if problems:
            raise InputError("cannot predict PS OOM", problems=problems)
        u_end = id_growth.predict(float(samples_total))
        peak = self.per_ps_mib(u_end, num_ps, imbalance)
        oom_at: int | None = None
        if peak > ps_memory_limit_mib:
            u_star = self.max_ids_per_limit(ps_memory_limit_mib, num_ps, imbalance)
            n_star = id_growth.samples_for(u_star) if u_star > 0 else 0.0
            # ceil, forgiving float noise in the inverse power (2^24 must not become 2^24 + 1)
            oom_at = min(math.ceil(n_star * (1 - 1e-12)), math.ceil(samples_total))
        needed_ps: int | None = None
        if self.runtime_overhead_mib * margin < ps_memory_limit_mib:
            # (data/p·imb + runtime)·margin <= limit  <=>  p >= data·imb / (limit/margin - rt)
            need = (
                self.data_mib(u_end)
                * imbalance
                / (ps_memory_limit_mib / margin - self.runtime_overhead_mib)
            )
            p = max(1, math.ceil(need - 1e-9))
            needed_ps = p if p <= max_num_ps else None
        return OOMPrediction(
            distinct_ids_at_end=u_end,
            peak_per_ps_mib=peak,
            limit_per_ps_mib=float(ps_memory_limit_mib),
            oom_at_samples=oom_at,
            needed_num_ps=needed_ps,
            needed_memory_per_ps_mib=math.ceil(peak * margin - 1e-9),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "ps_memory",
            "embedding_dim": self.embedding_dim,
            "bytes_per_value": self.bytes_per_value,
            "optimizer_slots": self.optimizer_slots,
            "dense_params": self.dense_params,
            "row_overhead_bytes": self.row_overhead_bytes,
            "runtime_overhead_mib": self.runtime_overhead_mib,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        if d.get("kind") != "ps_memory":
            raise InputError(f"model kind {d.get('kind')!r} is not 'ps_memory'")
        try:
            return cls(
                int(d["embedding_dim"]),
                bytes_per_value=int(d.get("bytes_per_value", 4)),
                optimizer_slots=int(d.get("optimizer_slots", 1)),
                dense_params=int(d.get("dense_params", 0)),
                row_overhead_bytes=float(d.get("row_overhead_bytes", 48.0)),
                runtime_overhead_mib=float(d.get("runtime_overhead_mib", 512.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"malformed ps_memory model document: {exc}") from exc


class WorkerMemoryModel:
    """Worker memory does not grow with the worker count: recommend the largest observed use
    times ``margin`` (DLRover uses 1.5), clamped to [``floor_mib``, ``ceiling_mib``]."""

    kind: ClassVar[str] = "worker_memory"

    def __init__(
        self, *, margin: float = 1.5, floor_mib: float = 1024.0, ceiling_mib: float | None = None
    ) -> None:
        self.margin = margin
        self.floor_mib = floor_mib
        self.ceiling_mib = ceiling_mib

    def fit(self, used_mib: Sequence[float]) -> Self:
        vals = [float(v) for v in used_mib]
        bad = [f"value {i}: {v!r}" for i, v in enumerate(vals) if not math.isfinite(v) or v < 0]
        if bad:
            raise InputError("worker memory use must be finite MiB >= 0", problems=bad)
        if not vals:
            raise TooFewSamplesError(
                "WorkerMemoryModel needs at least one observed worker memory use (MiB); "
                "run a profiling trial first, e.g. `dlrover-rm profile`"
            )
        self.max_used_mib_ = max(vals)
        rec = max(self.max_used_mib_ * self.margin, self.floor_mib)
        if self.ceiling_mib is not None:
            rec = min(rec, self.ceiling_mib)
        self.recommended_mib_ = math.ceil(rec - 1e-9)
        return self

    def predict(self) -> int:
        """Recommended memory per worker, whole MiB."""
        if not hasattr(self, "recommended_mib_"):
            raise NotFittedError("WorkerMemoryModel is not fitted; call fit(used_mib) first")
        return self.recommended_mib_

    def to_dict(self) -> dict[str, Any]:
        fitted = None
        if hasattr(self, "recommended_mib_"):
            fitted = {"max_used_mib": self.max_used_mib_, "recommended_mib": self.recommended_mib_}
        return {
            "kind": self.kind,
            "params": {
                "margin": self.margin,
                "floor_mib": self.floor_mib,
                "ceiling_mib": self.ceiling_mib,
            },
            "fitted": fitted,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        if d.get("kind") != cls.kind:
            raise InputError(f"model kind {d.get('kind')!r} is not {cls.kind!r}")
        try:
            p = d.get("params", {})
            model = cls(
                margin=float(p.get("margin", 1.5)),
                floor_mib=float(p.get("floor_mib", 1024.0)),
                ceiling_mib=None if p.get("ceiling_mib") is None else float(p["ceiling_mib"]),
            )
            f = d.get("fitted")
            if f is not None:
                model.max_used_mib_ = float(f["max_used_mib"])
                model.recommended_mib_ = int(f["recommended_mib"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"malformed worker_memory model document: {exc}") from exc
        return model
