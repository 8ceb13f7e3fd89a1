"""Throughput models: iteration time linear in non-negative coefficients, fitted by NNLS.

Two strategies share one implementation (:class:`_LinearThroughputModel`):

* :class:`PSThroughputModel` — asynchronous parameter-server training (DOMAIN.md)::

      T_iter(w, p, λw, λp) = a0 + a1·B/λw + b1·(w/p)·B/λp + b2·(w/p)·B + b3·p
      X = w·B / T_iter                                   (samples/s)

  ``a0`` fixed per-step overhead, ``a1`` worker compute (B samples on λw cores), ``b1`` PS
  compute (each PS serves w/p workers' B-row lookups/updates on λp cores), ``b2`` PS network
  (bytes ∝ w/p·B, not helped by CPU), ``b3`` per-PS fan-out cost (one RPC per PS per step).

* :class:`AllReduceThroughputModel` — synchronous all-reduce (no PS)::

      T_iter(w, λw) = a0 + a1·B/λw + c1·(w-1)/w + c2·(w-1)

  A ring all-reduce of M bytes costs 2·(w-1)/w·M/bandwidth + 2·(w-1)·alpha (alpha: per-hop latency);
  M and the bandwidth are constants of a job, so they fold into ``c1``; ``c2`` is the latency
  term. Both vanish for w = 1, as they should.

Design choices (recorded here, as DESIGN.md asks):

* Repeated samples of one configuration are kept as separate rows: replicates measure noise,
  which the bounds need. Identifiability counts *distinct* configurations (w, p, λw, λp).
* Rows are weighted by 1/T_iter (each row and its target divided by the measured T_iter), so
  NNLS minimises Σ((T̂ - T)/T)²: the squared *relative* error. Since X̂/X - 1 ≈ -(T̂ - T)/T,
  this is (to first order) the squared relative throughput error, the quantity MAPE and the
  planner care about; unweighted, configurations with long iterations (few cores) dominate
  the fit and small, fast configurations get large relative errors.
* Bounds: sigma = relative residual std (Σr²/dof, dof = rows - active coefficients); the
  prediction's relative standard error is sigma·sqrt(1 + h) with h the leverage of the new point
  (extrapolation widens the band); the band is X·exp(∓t·se), with t the Student-t 97.5 %
  quantile for dof (≈2 for many rows, larger for few: "widened when few degrees of
  freedom"). With dof = 0 there is no residual information, so sigma falls back to the
  ``prior_rel_std`` parameter. An exact fit has sigma = 0 and the band collapses onto X.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt
from scipy.linalg import lapack
from scipy.optimize import least_squares, nnls
from scipy.special import stdtrit

from dlrover_core.errors import InputError, NotFittedError, TooFewSamplesError
from dlrover_core.types import Sample

FloatArray = npt.NDArray[np.float64]
_MAX_LOG_BAND = 50.0  # the widest log half-band a prediction reports

_T_FLOOR = 1e-12  # seconds; guards a zero predicted iteration time (infinite throughput)
_PROFILE_HINT = "profile more configurations, e.g. `dlrover-rm profile --spec SPEC`"


@dataclass(frozen=True)
class ThroughputPrediction:
    """Predicted samples/s with a ~95 % band (VPA-style target / lower / upper)."""

    throughput_sps: float
    lower_sps: float
    upper_sps: float

    def to_dict(self) -> dict[str, float]:
        return {
            "throughput_sps": self.throughput_sps,
            "lower_sps": self.lower_sps,
            "upper_sps": self.upper_sps,
        }


ConfigKey = tuple[int, int, float, float]


@functools.lru_cache(maxsize=512)
def _t975(dof: int) -> float:
    """Student-t 97.5 % quantile: the ufunc ``stdtrit`` that ``scipy.stats.t.ppf`` calls
    (the same value; ~2 µs where ppf's argument handling costs ~0.1–1 ms, and in the
    runtime every new sample is a new dof)."""
    return float(stdtrit(dof, 0.975))


class _LinearThroughputModel:
    """Shared machinery; subclasses define the features of T_iter."""

    kind: ClassVar[str] = ""
    feature_names: ClassVar[tuple[str, ...]] = ()
    min_configs: ClassVar[int] = 0
    uses_ps: ClassVar[bool] = True

    def __init__(self, *, batch_size: int = 512, prior_rel_std: float = 0.25) -> None:
        self.batch_size = batch_size
        self.prior_rel_std = prior_rel_std

    # ----------------------------------------------------------------- features (subclass)
    def _features(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: FloatArray
    ) -> FloatArray:
        raise NotImplementedError

    def _features_scalar(
        self, w: float, p: float, lw: float, lp: float, b: float
    ) -> tuple[float, ...]:
        raise NotImplementedError

    def _feature_terms(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: float
    ) -> tuple[FloatArray | float, ...]:
        """The features as broadcastable terms (for :meth:`predict_grid`)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- checks
    @classmethod
    def _config_problems(cls, w: float, p: float, lw: float, lp: float) -> list[str]:
        out: list[str] = []
        if not (math.isfinite(w) and w >= 1 and float(w).is_integer()):
            out.append(f"workers={w!r} must be a whole number >= 1")
        if not math.isfinite(lw) or lw <= 0:
            out.append(f"worker_cpu={lw!r} must be > 0 cores")
        if cls.uses_ps:
            if not (math.isfinite(p) and p >= 1 and float(p).is_integer()):
                out.append(f"ps={p!r} must be a whole number >= 1 for the PS strategy")
            if not math.isfinite(lp) or lp <= 0:
                out.append(f"ps_cpu={lp!r} must be > 0 cores for the PS strategy")
        return out

    def _config_key(self, s: Sample) -> ConfigKey:
        if self.uses_ps:
            return s.config
        return (s.workers, 0, s.worker_cpu_cores, 0.0)

    @classmethod
    def count_configs(cls, samples: Sequence[Sample]) -> int:
        """Distinct configurations among ``samples`` (for all-reduce: distinct (w, λw))."""
        if cls.uses_ps:
            return len({s.config for s in samples})
        return len({(s.workers, s.worker_cpu_cores) for s in samples})

    @staticmethod
    def _rows(samples: Sequence[Sample]) -> FloatArray:
        """(n, 6) rows: workers, ps, worker_cpu, ps_cpu, batch size (NaN: not given),
        throughput."""
        nan = math.nan
        return np.array(
            [
                (
                    s.workers,
                    s.ps,
                    s.worker_cpu_cores,
                    s.ps_cpu_cores,
                    nan if s.batch_size is None else s.batch_size,
                    s.throughput_sps,
                )
                for s in samples
            ],
            dtype=np.float64,
        ).reshape(-1, 6)

    def _rows_valid(self, arr: FloatArray) -> bool:
        """Every row passes the checks :meth:`_validate` words (one pass over the array)."""
        w, p, lw, lp, b, x = arr.T
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(w) & (w >= 1) & (w == np.floor(w)) & np.isfinite(lw) & (lw > 0)
            ok &= np.isfinite(x) & (x > 0) & (np.isnan(b) | (b > 0))
            if self.uses_ps:
                ok &= np.isfinite(p) & (p >= 1) & (p == np.floor(p))
                ok &= np.isfinite(lp) & (lp > 0)
        return bool(ok.all())

    def _validate(self, samples: Sequence[Sample], rows: FloatArray | None = None) -> None:
        if rows is not None and self._rows_valid(rows):
            return  # the common case; the loop below words what is wrong
        problems: list[str] = []
        for i, s in enumerate(samples):
            row = self._config_problems(s.workers, s.ps, s.worker_cpu_cores, s.ps_cpu_cores)
            if not math.isfinite(s.throughput_sps) or s.throughput_sps <= 0:
                row.append(f"throughput={s.throughput_sps!r} must be > 0 samples/s")
            if s.batch_size is not None and s.batch_size <= 0:
                row.append(f"batch_size={s.batch_size!r} must be > 0")
            problems.extend(f"sample {i}: {msg}" for msg in row)
        if problems:
            raise InputError(
                f"{len(problems)} problem(s) in the samples given to {type(self).__name__}.fit; "
                "drop or fix these rows (a window with no progress is not a steady sample)",
                problems=problems,
            )

    def _design(
        self, samples: Sequence[Sample], rows: FloatArray | None = None
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Returns (features F, batch sizes B, measured T_iter); ``rows``: ``_rows(samples)``
        when the caller has them."""
        arr = self._rows(samples) if rows is None else rows
        w, p, lw, lp, b, x = arr.T
        b = np.where(np.isnan(b), float(self.batch_size), b)
        feats = self._features(w, p, lw, lp, b)
        return feats, b, w * b / x

    def _identifiability_problem(self, samples: Sequence[Sample]) -> str | None:
        n_cfg = self.count_configs(samples)
        k = len(self.feature_names)
        what = "(w, p, λw, λp)" if self.uses_ps else "(w, λw)"
        if n_cfg < self.min_configs:
            return (
                f"{type(self).__name__} needs at least {self.min_configs} distinct {what} "
                f"configurations to fit its {k} coefficients, got {n_cfg} "
                f"(from {len(samples)} samples); {_PROFILE_HINT}"
            )
        feats, _, t_meas = self._design(samples)
        a = feats / t_meas[:, None]
        norms = np.linalg.norm(a, axis=0)
        norms[norms == 0] = 1.0
        rank = _rank(a / norms)
        if rank < k:
            fixed = self._constant_inputs(samples)
            hint = f" ({', '.join(fixed)} never changed)" if fixed else ""
            return (
                f"the {n_cfg} distinct {what} configurations do not vary enough to identify "
                f"the {k} coefficients (rank {rank} < {k}){hint}; {_PROFILE_HINT} that also "
                "vary the worker count" + (", PS count" if self.uses_ps else "") + " and CPUs"
            )
        return None

    def _constant_inputs(self, samples: Sequence[Sample]) -> list[str]:
        cols: list[tuple[str, set[float]]] = [
            ("workers", {float(s.workers) for s in samples}),
            ("worker_cpu", {s.worker_cpu_cores for s in samples}),
        ]
        if self.uses_ps:
            cols += [
                ("ps", {float(s.ps) for s in samples}),
                ("ps_cpu", {s.ps_cpu_cores for s in samples}),
            ]
        return [name for name, vals in cols if len(vals) <= 1]

    def is_identifiable(self, samples: Sequence[Sample]) -> bool:
        """True when ``fit(samples)`` would not raise :class:`TooFewSamplesError`
        (enough distinct configurations, varied enough to pin every coefficient)."""
        try:
            self._validate(list(samples))
        except InputError:
            return False
        return self._identifiability_problem(samples) is None

    # ----------------------------------------------------------------- fit
    def _span(self, rows: FloatArray) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
        """The inputs that never varied in the fitted rows (with their one value), and the
        (min, max) of each input: the span the data cover."""
        cols = [("workers", 0), ("worker_cpu", 2)]
        if self.uses_ps:
            cols += [("ps", 1), ("ps_cpu", 3)]
        lo, hi = rows[:, :4].min(axis=0).tolist(), rows[:, :4].max(axis=0).tolist()
        fixed = {name: lo[j] for name, j in cols if lo[j] == hi[j]}
        return fixed, {name: (lo[j], hi[j]) for name, j in cols}

    @staticmethod
    def _independent_columns(a: FloatArray) -> npt.NDArray[np.bool_]:
        """Greedy, in the features' order: keep a column when it adds rank (the identifiable
        part of the model; a dropped column is a combination of kept ones on these data)."""
        norms = np.linalg.norm(a, axis=0)
        norms[norms == 0] = 1.0
        an = a / norms
        if _rank(an) == a.shape[1]:
            # full column rank: every column adds rank, the greedy pass keeps them all
            return np.ones(a.shape[1], dtype=bool)
        keep = np.zeros(a.shape[1], dtype=bool)
        rank = 0
        for j in range(a.shape[1]):
            keep[j] = True
            r = _rank(an[:, keep])
            if r > rank:
                rank = r
            else:
                keep[j] = False
        return keep

    def fit(self, samples: Sequence[Sample]) -> Self:
        """Fit the coefficients the samples identify.

        Samples that vary only some inputs (e.g. workers and PS at fixed CPUs, as Optimus
        profiles) fit the identifiable part: coefficients whose features are combinations of
        others on these data are folded into them (``identified_`` lists what was fitted) and
        the inputs that never varied are recorded in ``fixed_inputs_``; a prediction that moves
        one of them is refused (see :meth:`span_problems`). Fewer than two distinct
        configurations identify nothing about the resources and are refused."""
        samples = list(samples)
        rows = self._checked_rows(samples)
        self._fit_nnls(samples, rows, *self._design(samples, rows))
        return self

    def _checked_rows(self, samples: list[Sample]) -> FloatArray:
        """``_rows(samples)`` once the samples are valid and hold two configurations."""
        rows = self._rows(samples)
        self._validate(samples, rows)
        n_cfg = self.count_configs(samples)
        if n_cfg < 2:
            what = "(w, p, λw, λp)" if self.uses_ps else "(w, λw)"
            raise TooFewSamplesError(
                f"{type(self).__name__} needs at least 2 distinct {what} configurations to "
                f"learn how throughput changes with resources, got {n_cfg} (from "
                f"{len(samples)} samples); {_PROFILE_HINT}"
            )
        return rows

    def _fit_nnls(
        self,
        samples: list[Sample],
        rows: FloatArray,
        feats: FloatArray,
        b: FloatArray,
        t_meas: FloatArray,
        band: bool = True,
    ) -> Callable[[], None]:
        """The NNLS fit of the identifiable columns. Returns what sets its band (called
        here unless ``band`` is False: a subclass that may replace the fit sets it only
        when it keeps it)."""
        k = feats.shape[1]
        # relative weighting (see module docstring): row i and its target divided by T_i
        a = feats / t_meas[:, None]
        y = np.ones(len(t_meas))
        ident = self._independent_columns(a)
        scale = np.linalg.norm(a, axis=0)  # column scaling: conditioning for NNLS
        scale[scale == 0] = 1.0
        coef = np.zeros(k)
        sol, _ = nnls(a[:, ident] / scale[ident], y, maxiter=50 * k)
        coef[ident] = sol / scale[ident]
        resid = a @ coef - y  # (T̂ - T)/T
        active = coef > 0
        dof = len(y) - int(active.sum())
        self.identified_ = tuple(
            n for n, keep in zip(self.feature_names, ident, strict=True) if keep
        )
        self.fixed_inputs_, self.ranges_ = self._span(rows)
        self.full_rank_ = bool(ident.all())
        x_hat = 1.0 / np.maximum(a @ coef, _T_FLOOR)  # X̂/X = T/T̂
        self.coef_array_ = coef
        self.n_samples_ = len(samples)
        self.n_configs_ = self.count_configs(samples)
        self.relative_error_ = float(np.mean(np.abs(x_hat - 1.0)))
        self.default_batch_size_ = int(Counter(b.astype(int).tolist()).most_common(1)[0][0])

        def set_band() -> None:
            self._set_band(resid, dof, active, lambda: a)
            self._cache()

        if band:
            set_band()
        return set_band

    def span_problems(self, configs: npt.ArrayLike) -> list[str]:
        """Rows that move an input the fitted samples never varied (refused by predict)."""
        fixed = getattr(self, "fixed_inputs_", {})
        if not fixed:
            return []
        cfg = np.asarray(configs, dtype=np.float64).reshape(-1, np.shape(configs)[-1])
        col = {"workers": 0, "ps": 1, "worker_cpu": 2, "ps_cpu": 3}
        out: list[str] = []
        for name, val in fixed.items():
            bad = np.flatnonzero(np.abs(cfg[:, col[name]] - val) > 1e-9)
            if bad.size:
                out.append(
                    f"{name} never varied in the fitted samples (always {val:g}); rows "
                    f"{bad[:10].tolist()} ask for other values: profile configurations that "
                    f"vary {name}, or predict at {name}={val:g}"
                )
        return out

    def _set_band(
        self,
        resid: FloatArray,
        dof: int,
        active: npt.NDArray[np.bool_],
        jacobian: Callable[[], FloatArray],
    ) -> None:
        """The ~95 % band's parts from a fit's relative residuals: ``rel_std_`` and the
        Student-t ``z_`` over ``dof`` residual degrees of freedom (the prior and 2 without
        any), ``cov_`` from the active columns of ``jacobian()`` (computed only if some
        coefficient is active)."""
        if dof > 0:
            sigma = float(np.sqrt(np.sum(resid**2) / dof))
            z = _t975(dof)
        else:
            sigma = float(self.prior_rel_std)
            z = 2.0
        k = len(active)
        cov = np.zeros((k, k))
        if active.any():
            j_act = jacobian()[:, active]
            cov[np.ix_(active, active)] = np.linalg.pinv(j_act.T @ j_act)
        self.cov_ = cov
        self.rel_std_ = sigma
        self.z_ = z
        self.dof_ = dof

    def _cache(self) -> None:
        self._coef_t = tuple(float(c) for c in self.coef_array_)
        self._cov_t = tuple(tuple(float(v) for v in row) for row in self.cov_)

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_array_"):
            raise NotFittedError(
                f"{type(self).__name__} is not fitted; call fit(samples) first or load a "
                "fitted model with model_from_dict(...)"
            )

    @property
    def coef_(self) -> dict[str, float]:
        self._check_fitted()
        return dict(zip(self.feature_names, self._coef_t, strict=True))

    # the coefficients through which each CPU input acts (the B/λ terms of the forms)
    cpu_terms: ClassVar[dict[str, tuple[str, ...]]] = {
        "worker_cpu": ("a1", "a2"),
        "ps_cpu": ("b1", "b4", "b5"),
    }

    def cpu_has_effect(self, name: str) -> bool:
        """Whether the fit lets CPU input ``name`` ("worker_cpu", "ps_cpu") act: some
        coefficient of its terms is positive (NNLS may leave them all at 0, and CPU would
        then look free)."""
        coef = self.coef_
        return any(coef.get(n, 0.0) > 0 for n in self.cpu_terms.get(name, ()))

    def trustworthy(self, max_rel_error: float = 0.15) -> bool:
        """Fitted, with residual degrees of freedom and a training MAPE within bounds."""
        if not hasattr(self, "coef_array_"):
            return False
        return self.dof_ > 0 and self.relative_error_ <= max_rel_error

    # ----------------------------------------------------------------- predict
    def predict(
        self,
        workers: int,
        ps: int,
        worker_cpu_cores: float,
        ps_cpu_cores: float,
        batch_size: int | None = None,
    ) -> ThroughputPrediction:
        """Throughput of one configuration, with a ~95 % band (pure Python: a few µs)."""
        self._check_fitted()
        problems = self._config_problems(workers, ps, worker_cpu_cores, ps_cpu_cores)
        bsz = float(self.default_batch_size_ if batch_size is None else batch_size)
        if not bsz > 0:
            problems.append(f"batch_size={batch_size!r} must be > 0")
        if not problems:
            problems = self.span_problems([[workers, ps, worker_cpu_cores, ps_cpu_cores]])
        if problems:
            raise InputError("cannot predict this configuration", problems=problems)
        f = self._features_scalar(workers, ps, worker_cpu_cores, ps_cpu_cores, bsz)
        t_hat = max(sum(c * x for c, x in zip(self._coef_t, f, strict=True)), _T_FLOOR)
        x_sps = workers * bsz / t_hat
        q = 0.0
        for fi, row in zip(f, self._cov_t, strict=True):
            if fi:
                q += fi * sum(cij * fj for cij, fj in zip(row, f, strict=True))
        se = self.rel_std_ * math.sqrt(1.0 + max(q, 0.0) / (t_hat * t_hat))
        half = min(self.z_ * se, _MAX_LOG_BAND)  # finite however far out (see below)
        return ThroughputPrediction(x_sps, x_sps * math.exp(-half), x_sps * math.exp(half))

    def _unpack(self, configs: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        cfg = np.asarray(configs, dtype=np.float64)
        if cfg.ndim == 1:
            cfg = cfg.reshape(1, -1)
        if cfg.ndim != 2 or cfg.shape[1] not in (4, 5):
            raise InputError(
                f"configs must have shape (n, 4) [workers, ps, worker_cpu, ps_cpu] or (n, 5) "
                f"[... , batch_size], got {cfg.shape}"
            )
        w, p, lw, lp = cfg[:, 0], cfg[:, 1], cfg[:, 2], cfg[:, 3]
        b = np.full(len(cfg), float(self.default_batch_size_))
        if cfg.shape[1] == 5:
            b = np.where(np.isnan(cfg[:, 4]), b, cfg[:, 4])
        bad = ~(np.isfinite(w) & (w >= 1) & np.isfinite(lw) & (lw > 0) & (b > 0))
        if self.uses_ps:
            bad |= ~(np.isfinite(p) & (p >= 1) & np.isfinite(lp) & (lp > 0))
        if bad.any():
            rows = np.flatnonzero(bad)
            raise InputError(
                f"{len(rows)} config row(s) cannot be predicted: workers must be >= 1, CPUs > 0"
                + (", ps >= 1" if self.uses_ps else "")
                + "; fix these rows",
                problems=[f"row {int(i)}: {cfg[i].tolist()}" for i in rows[:20]],
            )
        span = self.span_problems(cfg[:, :4])
        if span:
            raise InputError("cannot predict outside the fitted samples' span", problems=span)
        feats = self._features(w, p, lw, lp, b)
        return feats, w * b / self._t_hat(feats)

    def _t_hat(self, feats: FloatArray) -> FloatArray:
        """Predicted iteration time (s) of design rows ``feats``: the features' sum."""
        return np.asarray(np.maximum(feats @ self.coef_array_, _T_FLOOR), dtype=np.float64)

    def _rel_var(self, feats: FloatArray, t_hat: FloatArray) -> FloatArray:
        """Leverage-like term of each row: g·cov·g with g = ∂log T̂/∂coef (= f / T̂)."""
        q = np.einsum("ij,jk,ik->i", feats, self.cov_, feats) / (t_hat * t_hat)
        return np.asarray(q, dtype=np.float64)

    def predict_many(self, configs: npt.ArrayLike) -> FloatArray:
        """Vectorised throughput (samples/s) for rows [workers, ps, worker_cpu, ps_cpu
        (, batch_size)]; a NaN batch size means the model's default."""
        self._check_fitted()
        return self._unpack(configs)[1]

    def predict_grid(
        self,
        workers: npt.ArrayLike,
        ps: npt.ArrayLike,
        worker_cpu_cores: npt.ArrayLike,
        ps_cpu_cores: npt.ArrayLike,
    ) -> FloatArray:
        """Throughput (samples/s) on the full grid of the four axes: an array of shape
        (len(workers), len(ps), len(worker_cpu), len(ps_cpu)), element [i, j, k, l] the
        prediction of ``predict_many([[workers[i], ps[j], worker_cpu[k], ps_cpu[l]]])`` at
        the default batch size. Each feature is computed on its own axes and broadcast, so a
        planner's grid costs a few array operations instead of a 4 × n design matrix (the
        same terms, summed in the features' order: equal to ``predict_many`` to rounding)."""
        self._check_fitted()
        axes = [
            np.asarray(a, dtype=np.float64).ravel()
            for a in (workers, ps, worker_cpu_cores, ps_cpu_cores)
        ]
        w, p, lw, lp = (
            a.reshape([-1 if i == j else 1 for j in range(4)]) for i, a in enumerate(axes)
        )
        b = float(self.default_batch_size_)
        bad = [f"workers={v:g}" for v in axes[0] if not (math.isfinite(v) and v >= 1)]
        bad += [f"worker_cpu={v:g}" for v in axes[2] if not (math.isfinite(v) and v > 0)]
        if self.uses_ps:
            bad += [f"ps={v:g}" for v in axes[1] if not (math.isfinite(v) and v >= 1)]
            bad += [f"ps_cpu={v:g}" for v in axes[3] if not (math.isfinite(v) and v > 0)]
        if bad:
            raise InputError(
                "grid axes cannot be predicted: workers must be >= 1, CPUs > 0"
                + (", ps >= 1" if self.uses_ps else "")
                + "; fix these values",
                problems=bad[:20],
            )
        fixed = getattr(self, "fixed_inputs_", {})
        if fixed:
            col = {"workers": 0, "ps": 1, "worker_cpu": 2, "ps_cpu": 3}
            span = [
                f"{name} never varied in the fitted samples (always {val:g}); the grid asks "
                f"for other values: predict at {name}={val:g}"
                for name, val in fixed.items()
                if np.any(np.abs(axes[col[name]] - val) > 1e-9)
            ]
            if span:
                raise InputError("cannot predict outside the fitted samples' span", problems=span)
        return self._x_grid(w, p, lw, lp, b, tuple(len(a) for a in axes))

    def _x_grid(
        self,
        w: FloatArray,
        p: FloatArray,
        lw: FloatArray,
        lp: FloatArray,
        b: float,
        shape: tuple[int, ...],
    ) -> FloatArray:
        """Throughput on the grid of the broadcast axes ``w, p, lw, lp`` (for
        :meth:`predict_grid`, which checked them)."""
        t_hat = np.asarray(self._t_hat_terms(self._feature_terms(w, p, lw, lp, b)))
        if t_hat.shape == shape and t_hat.dtype == np.float64:
            # a new array of the grid's size: the floor and the division in place (on a
            # planner's grid of ~50k points each full-size temporary costs ~0.1 ms)
            np.maximum(t_hat, _T_FLOOR, out=t_hat)
            return np.asarray(np.divide(w * b, t_hat, out=t_hat), dtype=np.float64)
        t_full = np.broadcast_to(np.maximum(t_hat, _T_FLOOR), shape)
        return np.asarray(w * b / t_full, dtype=np.float64)

    def _t_hat_terms(self, terms: Sequence[FloatArray | float]) -> FloatArray | float:
        """Iteration time from broadcastable feature terms (summed in the features' order);
        a new array (the caller may overwrite it)."""
        t_hat: FloatArray | float = 0.0
        for c, f in zip(self._coef_t, terms, strict=True):
            t_hat = t_hat + c * f
        return t_hat

    def predict_bounds_many(
        self, configs: npt.ArrayLike
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Vectorised (throughput, lower, upper) in samples/s."""
        self._check_fitted()
        feats, x_sps = self._unpack(configs)
        q = self._rel_var(feats, self._t_hat(feats))
        half = self.z_ * self.rel_std_ * np.sqrt(1.0 + np.maximum(q, 0.0))
        # far outside the data the band is uninformative, but stays finite (exp overflows
        # past ~709): a factor of e^50 either way already means "anything"
        half = np.minimum(half, _MAX_LOG_BAND)
        return x_sps, x_sps * np.exp(-half), x_sps * np.exp(half)

    # ----------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind,
            "version": 1,
            "params": {"batch_size": self.batch_size, "prior_rel_std": self.prior_rel_std},
            "fitted": None,
        }
        if hasattr(self, "coef_array_"):
            d["fitted"] = {
                "coef": self.coef_,
                "cov": self.cov_.tolist(),
                "rel_std": self.rel_std_,
                "z": self.z_,
                "dof": self.dof_,
                "n_samples": self.n_samples_,
                "n_configs": self.n_configs_,
                "relative_error": self.relative_error_,
                "default_batch_size": self.default_batch_size_,
                "identified": list(self.identified_),
                "fixed_inputs": dict(self.fixed_inputs_),
                "ranges": {k: list(v) for k, v in self.ranges_.items()},
                **self._fitted_extra(),
            }
        return d

    def _fitted_extra(self) -> dict[str, Any]:
        """Fitted state a subclass adds to ``to_dict()["fitted"]``."""
        return {}

    def _load_extra(self, fitted: Mapping[str, Any]) -> None:
        """Reads back what :meth:`_fitted_extra` wrote (before ``_cache``)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        if d.get("kind") != cls.kind:
            raise InputError(
                f"model kind {d.get('kind')!r} is not {cls.kind!r}; "
                "load it with model_from_dict(...) or refit with `dlrover-rm model fit`"
            )
        try:
            params = d.get("params", {})
            model = cls(
                batch_size=int(params.get("batch_size", 512)),
                prior_rel_std=float(params.get("prior_rel_std", 0.25)),
            )
            fitted = d.get("fitted")
            if fitted is not None:
                model.coef_array_ = np.array(
                    [float(fitted["coef"][n]) for n in cls.feature_names], dtype=np.float64
                )
                model.cov_ = np.array(fitted["cov"], dtype=np.float64).reshape(
                    len(cls.feature_names), len(cls.feature_names)
                )
                model.rel_std_ = float(fitted["rel_std"])
                model.z_ = float(fitted["z"])
                model.dof_ = int(fitted["dof"])
                model.n_samples_ = int(fitted["n_samples"])
                model.n_configs_ = int(fitted["n_configs"])
                model.relative_error_ = float(fitted["relative_error"])
                model.default_batch_size_ = int(fitted["default_batch_size"])
                model.identified_ = tuple(
                    str(n) for n in fitted.get("identified", cls.feature_names)
                )
                model.full_rank_ = len(model.identified_) == len(cls.feature_names)
                model.fixed_inputs_ = {
                    str(k): float(v) for k, v in fitted.get("fixed_inputs", {}).items()
                }
                model.ranges_ = {
                    str(k): (float(v[0]), float(v[1])) for k, v in fitted.get("ranges", {}).items()
                }
                model._load_extra(fitted)
                model._cache()
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"malformed {cls.kind} model document ({type(exc).__name__}: {exc}); "
                "refit it with `dlrover-rm model fit`"
            ) from exc
        return model

    def __repr__(self) -> str:
        state = (
            ", ".join(f"{k}={v:.4g}" for k, v in self.coef_.items())
            if hasattr(self, "coef_array_")
            else "unfitted"
        )
        return f"{type(self).__name__}(batch_size={self.batch_size}; {state})"


class PSThroughputModel(_LinearThroughputModel):
    """Asynchronous parameter-server throughput: see the module docstring for the form."""

    kind: ClassVar[str] = "ps_throughput"
    feature_names: ClassVar[tuple[str, ...]] = ("a0", "a1", "b1", "b2", "b3")
    min_configs: ClassVar[int] = 5
    uses_ps: ClassVar[bool] = True

    def _features(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: FloatArray
    ) -> FloatArray:
        wpb = w / p * b
        return np.stack([np.ones_like(w), b / lw, wpb / lp, wpb, p], axis=1)

    def _features_scalar(
        self, w: float, p: float, lw: float, lp: float, b: float
    ) -> tuple[float, ...]:
        wpb = w / p * b
        return (1.0, b / lw, wpb / lp, wpb, float(p))

    def _feature_terms(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: float
    ) -> tuple[FloatArray | float, ...]:
        wpb = w / p * b
        return (1.0, b / lw, wpb / lp, wpb, p)


class PSExtendedThroughputModel(PSThroughputModel):
    """The PS form plus ``b4·B/λp``: a step's own PS service time when no other worker
    contends (the light-load limit of a queueing PS; the paper form only has the saturated
    ``(w/p)·B/λp`` term). On a closed-queueing (MVA) truth it halves held-out MAPE (see
    tests/model/test_throughput.py) at the cost of one more coefficient (6 configurations)."""

    kind: ClassVar[str] = "ps_extended_throughput"
    feature_names: ClassVar[tuple[str, ...]] = ("a0", "a1", "b1", "b2", "b3", "b4")
    min_configs: ClassVar[int] = 6

    def _features(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: FloatArray
    ) -> FloatArray:
        wpb = w / p * b
        return np.stack([np.ones_like(w), b / lw, wpb / lp, wpb, p, b / lp], axis=1)

    def _features_scalar(
        self, w: float, p: float, lw: float, lp: float, b: float
    ) -> tuple[float, ...]:
        wpb = w / p * b
        return (1.0, b / lw, wpb / lp, wpb, float(p), b / lp)

    def _feature_terms(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: float
    ) -> tuple[FloatArray | float, ...]:
        wpb = w / p * b
        return (1.0, b / lw, wpb / lp, wpb, p, b / lp)


_LOG_FLOOR = 1e-300  # stage time floor inside logs and powers (a stage with no cost)


# a residual function for :func:`_bounded_lm`: x -> (residuals, a thunk giving their
# Jacobian at x), so the Jacobian of an accepted point reuses what its residuals computed
ResidualFn = Callable[[FloatArray], tuple[FloatArray, Callable[[], FloatArray]]]


def _rank(a: FloatArray, tol: float = 1e-9) -> int:
    """``np.linalg.matrix_rank(a, tol=tol)``: singular values above ``tol``, from the same
    LAPACK routine (gesdd) called directly; numpy's wrapper costs more than the
    decomposition of the few columns fitted here, and the fits call it thousands of times."""
    _, sv, _, info = lapack.dgesdd(a, compute_uv=0)
    if info != 0:  # not converged: numpy's own call says so (LinAlgError)
        return int(np.linalg.matrix_rank(a, tol=tol))
    return int(np.count_nonzero(sv > tol))


def _solve(a: FloatArray, b: FloatArray) -> tuple[FloatArray, int]:
    """``np.linalg.solve(a, b)`` (LU, LAPACK gesv, called directly, without numpy's per-call
    overhead; the same to rounding: numpy's and scipy's OpenBLAS kernels can differ in the
    last bits on some CPUs) and gesv's ``info`` (> 0: ``a`` is singular)."""
    _, _, x, info = lapack.dgesv(a, b)
    return x, int(info)


def _bounded_lm(
    fun: ResidualFn,
    x0: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    max_iter: int = 100,
    ftol: float = 1e-9,
) -> tuple[FloatArray, float]:
    """Levenberg–Marquardt on a box: minimises Σ r(x)² with lo <= x <= hi.

    Each step solves the damped normal equations on the free variables (a variable at a
    bound whose gradient points out of the box is held there), projects onto the box and
    is kept only when it lowers the cost; the damping falls after a kept step and rises
    after a refused one. It stops when a kept step lowers the cost by less than ``ftol``
    of it (scipy's least_squares stops at 1e-8): on noisy data the residuals stay large,
    Gauss–Newton converges linearly (about ×10 a step here), and the last digits of the
    cost are worth nothing to a model fitted to 5 % noise.

    Small problems (≤ 10 unknowns) take a few tens of µs a step, a fraction of scipy's
    trust-region reflective solver's overhead: on a dozen rows numpy's per-call cost
    dominates, so a step makes as few calls as it can (the Jacobian comes with the
    residuals, the damping is added on the diagonal in place)."""
    x = np.minimum(np.maximum(np.asarray(x0, dtype=np.float64), lo), hi)
    r, jac = fun(x)
    cost = float(r @ r)
    lam = 1e-3
    for _ in range(max_iter):
        jm = jac()
        grad = jm.T @ r
        free = ~(((x <= lo) & (grad > 0)) | ((x >= hi) & (grad < 0)))
        n_free = int(np.count_nonzero(free))
        if n_free == 0:
            break
        all_free = n_free == len(x)
        if not all_free:
            jm = jm[:, free]
        h = jm.T @ jm
        d = np.maximum(h.diagonal(), 1e-12)
        g_free = -grad if all_free else -grad[free]
        improved = False
        while lam < 1e12:
            a = h.copy()
            a.flat[:: n_free + 1] += lam * d  # the damping on the diagonal
            step, info = _solve(a, g_free)
            if info != 0:  # singular
                lam *= 10.0
                continue
            if all_free:
                x_new = x + step
            else:
                x_new = x.copy()
                x_new[free] += step
            x_new = np.minimum(np.maximum(x_new, lo), hi)
            r_new, jac_new = fun(x_new)
            c_new = float(r_new @ r_new)
            if math.isfinite(c_new) and c_new < cost:
                gain = cost - c_new
                x, r, jac, cost = x_new, r_new, jac_new, c_new
                lam = max(lam / 3.0, 1e-9)
                improved = gain > ftol * max(cost, 1e-30)
                break
            lam *= 4.0
        if not improved:
            break
    return x, cost


def _aicc(rss: float, k: int, n: int) -> float:
    """Corrected Akaike criterion of a least-squares fit (lower is better); inf when the
    fit has no residual degrees of freedom."""
    if n - k - 1 <= 0:
        return math.inf
    return n * math.log(max(rss, 1e-300) / n) + 2 * k + 2 * k * (k + 1) / (n - k - 1)


@functools.cache
def _stage_onehot(stage_of: tuple[int, ...]) -> FloatArray:
    """Feature j's column of ones in its stage (features × stages), read-only: built once."""
    stage = np.asarray(stage_of)
    out = np.asarray(np.eye(int(stage.max()) + 1)[stage], dtype=np.float64)
    out.flags.writeable = False
    return out


class PSOverlapThroughputModel(PSThroughputModel):
    """The PS form with the stages a worker's step waits on combined with overlap.

    Three stages, each linear in non-negative coefficients::

        S_worker  = a0 + a1·B/λw + a2·B/λw²         (step overhead, compute, lost cores)
        S_ps      = b1·(w/p)·B/λp + b3·p + b4·B/λp + b5·w·B/λp
                    (PS service under load, fan-out, own service time, hot shard)
        S_network = b2·(w/p)·B                      (PS network)
        T_iter    = (S_worker^γ + S_ps^γ + S_network^γ)^(1/γ),  1 <= γ <= max_overlap
        X         = w·B / T_iter

    * ``γ`` is the overlap exponent of Pollux (OSDI'21, ``T_iter = (T_grad^γ + T_sync^γ)^(1/γ)``):
      γ = 1 is no overlap (the stages add up: exactly the paper's form with two more terms);
      γ → ∞ is perfect overlap (the slowest stage alone sets the pace, the bottleneck or
      roofline bound). Asynchronous PS workers compute while the PS serve other workers'
      pulls and pushes, so measured curves bend between the two; γ is fitted.
    * ``a2·B/λw²`` is the first-order term of ``B/(λw − o)``: ``o = a2/a1`` cores of each
      worker go to the framework, input pipeline and communication threads, so small nodes
      are slower per core than ``1/λw`` predicts.
    * ``b4·B/λp``: a step's own PS service time when no other worker contends (the
      light-load limit of a queueing PS, as in :class:`PSExtendedThroughputModel`).
    * ``b5·w·B/λp``: the hottest PS serves a share ``(1 − h)/p + h`` of the lookups when a
      fraction ``h`` of the traffic goes to hot IDs that more PS do not spread out (skewed
      CTR features), so adding PS stops helping before ``(w/p)`` says.

    Fitting: the γ = 1 form is fitted by NNLS as for the other models (its identifiable part
    when some inputs never varied); with at least as many distinct configurations as
    identified coefficients plus one, those coefficients and γ are refined by bounded least
    squares on log(T̂/T) (coefficients >= 0, 1 <= γ <= ``max_overlap``), from two starting exponents;
    the refinement is kept only when it lowers the small-sample Akaike criterion (AICc):
    a lower error that does not pay for the extra parameter is not kept (a γ fitted
    exactly from a handful of points extrapolates badly). The band uses the Jacobian of
    log T̂ at the solution in place of the linear design.
    """

    kind: ClassVar[str] = "ps_overlap_throughput"
    feature_names: ClassVar[tuple[str, ...]] = ("a0", "a1", "a2", "b1", "b2", "b3", "b4", "b5")
    stage_of: ClassVar[tuple[int, ...]] = (0, 0, 0, 1, 2, 1, 1, 1)  # worker, ps, network
    min_configs: ClassVar[int] = 9  # eight coefficients and γ
    overlap_starts: ClassVar[tuple[float, ...]] = (2.0, 5.0)

    def __init__(
        self, *, batch_size: int = 512, prior_rel_std: float = 0.25, max_overlap: float = 8.0
    ) -> None:
        super().__init__(batch_size=batch_size, prior_rel_std=prior_rel_std)
        self.max_overlap = max_overlap  # 1: no overlap (the stages add up, NNLS only)

    # ----------------------------------------------------------------- features
    def _features(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: FloatArray
    ) -> FloatArray:
        wpb = w / p * b
        return np.stack(
            [np.ones_like(w), b / lw, b / (lw * lw), wpb / lp, wpb, p, b / lp, w * b / lp], axis=1
        )

    def _features_scalar(
        self, w: float, p: float, lw: float, lp: float, b: float
    ) -> tuple[float, ...]:
        wpb = w / p * b
        return (1.0, b / lw, b / (lw * lw), wpb / lp, wpb, float(p), b / lp, w * b / lp)

    def _feature_terms(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: float
    ) -> tuple[FloatArray | float, ...]:
        wpb = w / p * b
        return (1.0, b / lw, b / (lw * lw), wpb / lp, wpb, p, b / lp, w * b / lp)

    # ----------------------------------------------------------------- the combination
    @property
    def _onehot(self) -> FloatArray:
        return _stage_onehot(self.stage_of)

    def _stage_sums(self, feats: FloatArray, coef: FloatArray) -> FloatArray:
        return np.asarray(np.maximum((feats * coef) @ self._onehot, 0.0), dtype=np.float64)

    def _t_hat(self, feats: FloatArray) -> FloatArray:
        g = self.gamma_
        s_ = self._stage_sums(feats, self.coef_array_)
        t = np.sum(s_**g, axis=1) ** (1.0 / g)
        return np.asarray(np.maximum(t, _T_FLOOR), dtype=np.float64)

    def _grad_log_t(self, feats: FloatArray, coef: FloatArray, g: float) -> FloatArray:
        """∂ log T̂ / ∂ coef_j = S_stage(j)^(γ-1) · f_j / Σ S^γ, per row."""
        s_ = np.maximum(self._stage_sums(feats, coef), _LOG_FLOOR)
        tot = np.maximum(np.sum(s_**g, axis=1), _LOG_FLOOR)
        return np.asarray(
            (s_ ** (g - 1.0))[:, list(self.stage_of)] * feats / tot[:, None], dtype=np.float64
        )

    def _rel_var(self, feats: FloatArray, t_hat: FloatArray) -> FloatArray:
        gr = self._grad_log_t(feats, self.coef_array_, self.gamma_)
        return np.asarray(np.einsum("ij,jk,ik->i", gr, self.cov_, gr), dtype=np.float64)

    def _t_hat_terms(self, terms: Sequence[FloatArray | float]) -> FloatArray | float:
        tot = self._stage_powers_sum(terms)
        g = self.gamma_
        if tot.ndim == 0:
            return np.asarray(tot ** (1.0 / g), dtype=np.float64)
        return np.asarray(np.power(tot, 1.0 / g, out=tot), dtype=np.float64)

    def _stage_powers_sum(self, terms: Sequence[FloatArray | float]) -> FloatArray:
        """Σ S_stage^γ from broadcastable feature terms: a new array (or a 0-d one)."""
        n_st = max(self.stage_of) + 1
        stages: list[FloatArray | float] = [0.0] * n_st
        for c, f, st in zip(self._coef_t, terms, self.stage_of, strict=True):
            stages[st] = stages[st] + c * f
        g = self.gamma_
        # the stages live on fewer axes than the grid (the worker stage on λw alone, the
        # network on (w, p)): powered on their own shapes and added smallest first, so the
        # grid's size is reached by one addition (then one power, or one log, in place)
        powered = sorted((np.maximum(sv, 0.0) ** g for sv in stages), key=np.size)
        tot = np.asarray(powered[0], dtype=np.float64)
        for pw in powered[1:]:
            tot = np.asarray(tot + pw, dtype=np.float64)
        return tot

    def _x_grid(
        self,
        w: FloatArray,
        p: FloatArray,
        lw: FloatArray,
        lp: FloatArray,
        b: float,
        shape: tuple[int, ...],
    ) -> FloatArray:
        """X = w·B / T̂ = exp(log(w·B) − log(Σ S^γ)/γ): on the full grid one log and one exp
        (~20 % less than the power and the division; the same to ~1e-15)."""
        tot = np.asarray(self._stage_powers_sum(self._feature_terms(w, p, lw, lp, b)))
        if tot.shape != shape:
            tot = np.array(np.broadcast_to(tot, shape), dtype=np.float64)
        with np.errstate(divide="ignore"):  # a stage-free point: log 0 = -inf, floored
            log_t = np.log(tot, out=tot)
        log_t *= 1.0 / self.gamma_
        np.maximum(log_t, math.log(_T_FLOOR), out=log_t)
        np.subtract(np.log(w * b), log_t, out=log_t)
        return np.asarray(np.exp(log_t, out=log_t), dtype=np.float64)

    # ----------------------------------------------------------------- fit
    def fit(
        self, samples: Sequence[Sample], *, start_from: PSOverlapThroughputModel | None = None
    ) -> Self:
        """NNLS at γ = 1 (see :meth:`_LinearThroughputModel.fit`), then the bounded
        refinement of the coefficients and γ when the samples identify every column.

        ``start_from``: a fitted model of the same job (e.g. the previous fit, before a few
        more replicates were measured) whose coefficients and γ start the refinement, in
        place of the cold starts (``overlap_starts``): a warm start converges in a few steps
        instead of tens. Ignored unless it was refined (γ > 1)."""
        samples = list(samples)
        self.gamma_ = 1.0
        rows = self._checked_rows(samples)
        feats, b, t_meas = self._design(samples, rows)
        set_linear_band = self._fit_nnls(samples, rows, feats, b, t_meas, band=False)
        # as many distinct configurations as the parameters it refines (identified + γ)
        if not (
            self.max_overlap > 1.0
            and self.n_configs_ >= len(self.identified_) + 1
            and self._refine(feats, t_meas, start_from)
        ):
            set_linear_band()
        return self

    def _refine(
        self, feats: FloatArray, t_meas: FloatArray, start: PSOverlapThroughputModel | None
    ) -> bool:
        """True when the refinement is kept (its coefficients, γ and band set)."""
        log_t = np.log(t_meas)
        # only the identified columns are refined; the others stay folded into them (0)
        ident = np.array([n in self.identified_ for n in self.feature_names])
        k_all = feats.shape[1]
        scale = np.linalg.norm(feats / t_meas[:, None], axis=0)
        scale[scale == 0] = 1.0
        fs = (feats / scale)[:, ident]  # coef_j = z_j / scale_j: O(1) unknowns for the solver
        scale = scale[ident]
        n, k = fs.shape
        onehot = self._onehot[ident]
        cols = [st for st, keep in zip(self.stage_of, ident, strict=True) if keep]

        def fun(x: FloatArray) -> tuple[FloatArray, Callable[[], FloatArray]]:
            """log T̂ − log T, and (lazily) its Jacobian in z and γ from the same parts."""
            g = float(x[k])
            s_ = np.maximum((fs * x[:k]) @ onehot, _LOG_FLOOR)  # stage times
            sg = s_**g
            tot = np.maximum(sg.sum(axis=1), _LOG_FLOOR)
            log_tot = np.log(tot)

            def jac() -> FloatArray:
                out = np.empty((n, k + 1))
                # ∂/∂z_j = S^(γ-1)·f_j / Σ S^γ  (S^γ / S = S^(γ-1); 0 for an empty stage)
                out[:, :k] = (sg / (s_ * tot[:, None]))[:, cols] * fs
                out[:, k] = (sg * np.log(s_)).sum(axis=1) / (g * tot) - log_tot / (g * g)
                return out

            return log_tot / g - log_t, jac

        def resid(x: FloatArray) -> FloatArray:
            return fun(x)[0]

        z_lin = self.coef_array_[ident] * scale
        base = np.r_[z_lin, 1.0]
        base_cost = float(np.sum(resid(base) ** 2))
        best_x, best_cost = base, base_cost
        lo = np.r_[np.zeros(k), 1.0]
        hi = np.r_[np.full(k, np.inf), self.max_overlap]
        starts: list[FloatArray] = []
        if (
            start is not None
            and hasattr(start, "coef_array_")
            and start.gamma_ > 1.0
            and start.feature_names == self.feature_names
        ):
            starts.append(np.r_[start.coef_array_[ident] * scale, min(start.gamma_, hi[k])])
        else:
            # a coefficient at 0 has no gradient once γ > 1 (0^(γ-1) = 0): start it off the
            # bound
            z0 = np.where(z_lin > 0, z_lin, 0.05 * max(float(z_lin.max()), 1e-12))
            starts.extend(np.r_[z0, min(g0, self.max_overlap)] for g0 in self.overlap_starts)
        for x0 in starts:
            x0[:k] *= math.exp(-float(np.mean(resid(x0))))  # T̂ is 1-homogeneous in coef
            x0 = np.clip(x0, lo, hi)
            x, cost = _bounded_lm(fun, x0, lo, hi)
            if np.all(np.isfinite(x)) and cost < best_cost:
                best_x, best_cost = x, cost
        if best_x is base:
            return False
        # keep the refinement only when it pays for its extra parameter (AICc, small-sample
        # Akaike criterion on the log residuals): few points fit exactly by a free γ are
        # no evidence of overlap, and such a γ extrapolates badly
        k_lin = int(np.count_nonzero(z_lin > 0))
        k_ref = int(np.count_nonzero(best_x[:k] > 0)) + 1
        if _aicc(best_cost, k_ref, n) >= _aicc(base_cost, k_lin, n):
            return False
        z_best = np.where(best_x[:k] > 1e-12 * max(float(best_x[:k].max()), 1.0), best_x[:k], 0.0)
        g = float(best_x[k])
        r = resid(np.r_[z_best, g])
        coef = np.zeros(k_all)
        coef[ident] = z_best / scale
        active = coef > 0
        dof = len(r) - int(active.sum()) - 1  # γ is a fitted parameter too
        self._set_band(r, dof, active, lambda: self._grad_log_t(feats, coef, g))
        self.coef_array_ = coef
        self.gamma_ = g
        self.relative_error_ = float(np.mean(np.abs(np.exp(-r) - 1.0)))
        self._cache()
        return True

    # ----------------------------------------------------------------- predict / (de)serialise
    def predict(
        self,
        workers: int,
        ps: int,
        worker_cpu_cores: float,
        ps_cpu_cores: float,
        batch_size: int | None = None,
    ) -> ThroughputPrediction:
        """Throughput of one configuration, with a ~95 % band (the vectorised path)."""
        self._check_fitted()
        problems = self._config_problems(workers, ps, worker_cpu_cores, ps_cpu_cores)
        if batch_size is not None and not batch_size > 0:
            problems.append(f"batch_size={batch_size!r} must be > 0")
        if problems:
            raise InputError("cannot predict this configuration", problems=problems)
        bsz = float("nan") if batch_size is None else float(batch_size)
        x, lo, up = self.predict_bounds_many([[workers, ps, worker_cpu_cores, ps_cpu_cores, bsz]])
        return ThroughputPrediction(float(x[0]), float(lo[0]), float(up[0]))

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["params"]["max_overlap"] = self.max_overlap
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        model = super().from_dict(d)
        if d.get("fitted") is None:
            try:
                model.max_overlap = float(d.get("params", {}).get("max_overlap", 8.0))
            except (TypeError, ValueError) as exc:
                raise InputError(
                    f"malformed {cls.kind} model document (params.max_overlap: {exc}); "
                    "refit it with `dlrover-rm model fit`"
                ) from exc
        return model

    def _fitted_extra(self) -> dict[str, Any]:
        return {"gamma": self.gamma_, "max_overlap": self.max_overlap}

    def _load_extra(self, fitted: Mapping[str, Any]) -> None:
        self.gamma_ = float(fitted.get("gamma", 1.0))
        self.max_overlap = float(fitted.get("max_overlap", self.max_overlap))
        if not (math.isfinite(self.gamma_) and self.gamma_ >= 1.0):
            raise ValueError(f"gamma={self.gamma_!r} must be >= 1")

    def __repr__(self) -> str:
        base = super().__repr__()
        if hasattr(self, "coef_array_"):
            return base[:-1] + f", gamma={self.gamma_:.3g})"
        return base


class AllReduceThroughputModel(_LinearThroughputModel):
    """Synchronous all-reduce throughput (no PS; ``ps`` / ``ps_cpu`` are ignored, 0 allowed)."""

    kind: ClassVar[str] = "allreduce_throughput"
    feature_names: ClassVar[tuple[str, ...]] = ("a0", "a1", "c1", "c2")
    min_configs: ClassVar[int] = 4
    uses_ps: ClassVar[bool] = False

    def _features(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: FloatArray
    ) -> FloatArray:
        return np.stack([np.ones_like(w), b / lw, (w - 1.0) / w, w - 1.0], axis=1)

    def _features_scalar(
        self, w: float, p: float, lw: float, lp: float, b: float
    ) -> tuple[float, ...]:
        return (1.0, b / lw, (w - 1.0) / w, w - 1.0)

    def _feature_terms(
        self, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: float
    ) -> tuple[FloatArray | float, ...]:
        return (1.0, b / lw, (w - 1.0) / w, w - 1.0)


# ----------------------------------------------------------------- the bottleneck form
# A bottleneck throughput model of PS training: few physical parameters, fitted with priors.
#
# The linear forms of :mod:`dlrover_core.model.throughput` need as many distinct
# configurations as they have coefficients, and a recurring job's first runs measure two to
# five (the planner samples few: each costs a pause). With so few, those forms predict a soft
# knee where PS-bound jobs have a plateau, and, since three of their four PS terms fall when
# the PS are made fewer and fatter, they rate one fat PS above many thin ones. Measured in
# the simulator's loop (issue 10, session 16): the planner on the job's true throughput reaches
# 0.89 of the oracle's per-core rate, and still 0.83 when that truth carries a random 20 %
# error per configuration, against 0.77 with the fitted linear forms. What the planner needs
# is the right *shape* from few samples, more than precision.
#
# The form: a step waits on three stages, each a rate in samples/s::
#
#     X_worker  = w · r · e(λw; κw, ow) / (1 + φ·(p − 1))
#                                                   (w workers, λw cores each; φ: see below)
#     X_ps      = ρp · r · e(λp; κp, op) · p^β     (p PS, λp cores each, hottest shard p^-β)
#     X_network = ρn · r · p^β                      (the hottest PS's link)
#     X         = (X_worker^-γ + X_ps^-γ + X_network^-γ)^(-1/γ)
#
#     e(λ; κ, o) = κ·(1 − exp(−λ/κ)) · λ/(λ + o)    (cores a node turns into work)
#
# * ``r``: samples/s per effective worker core; ``ρp``, ``ρn``: the PS and network rates
#   relative to it.
# * ``κ``: a node's parallelism cap (a process stops gaining from cores past a few κ: threads,
#   locks, memory bandwidth); ``o``: cores lost to the framework (fixed, not fitted).
# * ``β``: how the hottest PS's share falls with more PS (1: evenly spread; less with skewed
#   IDs).
# * ``γ``: the overlap exponent of Pollux (OSDI'21): large, the slowest stage alone sets the
#   pace; 1, the stages add up.
# * ``φ`` (``ps_fanout``, off unless its prior centre is > 0): the share of a worker's step
#   that each further PS adds (one more lookup and one more push a step, each with its fixed
#   RPC cost). Measured on this repository's runtime (benchmarks/sim_to_real.py): one worker
#   of 0.5 CPU trains 39k samples/s against one PS and 27k against two.
#
# Fitting is a maximum a posteriori estimate: least squares on log throughput (one row per
# configuration, weighted by its replicates) plus one row per parameter for its prior
# (log-normal, except β normal). The priors identify what the samples do not vary, so one
# configuration already yields a prediction everywhere; the band says how little that
# prediction knows: it is the Laplace approximation of the posterior (the fit's Jacobian),
# propagated to each configuration and added to the measurement noise, so it widens along
# inputs the samples never moved and with distance from them. A prediction is therefore never
# refused for lack of variation (``fixed_inputs_`` is empty); the band carries the doubt.
#
# The prior centres are constructor parameters. Their defaults sit at the middle of the
# simulator's ranges (a worker gains up to ~5 cores, a PS up to ~10, γ = 4.5 the median of
# the cluster's own overlap fits); benchmarks/README.md reports the planner's figures with
# them moved ×0.6 and ×1.6. The batch size does not enter: throughput is per sample.

_BOTTLENECK_PARAMS = (
    "rate",
    "ps_ratio",
    "network_ratio",
    "worker_core_cap",
    "ps_core_cap",
    "ps_skew",
    "overlap",
)
_BOTTLENECK_LOG = (True, True, True, True, True, False, True)  # fitted in log space (β is not)
_N_BASE = len(_BOTTLENECK_PARAMS)  # the form without φ; φ, when on, comes after them
_FANOUT_LOG_STD = 1.0  # the prior's width of log φ (when the term is on)
_BOTTLENECK_Z = 1.96  # ~95 % band


def effective_cores(cpu: npt.ArrayLike, cap: float, overhead: float) -> FloatArray:
    """``e(λ; κ, o)``: the cores a node of ``cpu`` cores turns into work."""
    c = np.maximum(np.asarray(cpu, dtype=np.float64), 1e-9)
    return np.asarray(cap * -np.expm1(-c / cap) * c / (c + overhead), dtype=np.float64)


class PSBottleneckThroughputModel(PSThroughputModel):
    """The bottleneck form of the module docstring, fitted by MAP with priors."""

    kind: ClassVar[str] = "ps_bottleneck_throughput"
    feature_names: ClassVar[tuple[str, ...]] = _BOTTLENECK_PARAMS
    min_configs: ClassVar[int] = 1

    def __init__(
        self,
        *,
        batch_size: int = 512,
        prior_rel_std: float = 0.25,
        worker_core_cap: float = 5.0,
        ps_core_cap: float = 10.0,
        core_cap_log_std: float = 0.5,
        ps_ratio: float = 3.0,
        network_ratio: float = 300.0,
        ps_skew: float = 0.8,
        overlap: float = 4.5,
        worker_overhead_cores: float = 1.0,
        ps_overhead_cores: float = 0.75,
        noise_rel_std: float = 0.05,
        ps_fanout: float = 0.0,
    ) -> None:
        super().__init__(batch_size=batch_size, prior_rel_std=prior_rel_std)
        if not (math.isfinite(ps_fanout) and ps_fanout >= 0):
            raise InputError(f"ps_fanout={ps_fanout!r} must be >= 0 (0: no per-PS worker cost)")
        self.ps_fanout = ps_fanout
        self._names = _BOTTLENECK_PARAMS + (("ps_fanout",) if ps_fanout > 0 else ())
        self._logs = _BOTTLENECK_LOG + ((True,) if ps_fanout > 0 else ())
        for name, v in (
            ("worker_core_cap", worker_core_cap),
            ("ps_core_cap", ps_core_cap),
            ("core_cap_log_std", core_cap_log_std),
            ("ps_ratio", ps_ratio),
            ("network_ratio", network_ratio),
            ("overlap", overlap),
            ("noise_rel_std", noise_rel_std),
        ):
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"{name}={v!r} must be > 0 (a prior centre or width)")
        for name, v in (("worker_overhead_cores", worker_overhead_cores),
                        ("ps_overhead_cores", ps_overhead_cores)):  # fmt: skip
            if not (math.isfinite(v) and v >= 0):
                raise InputError(f"{name}={v!r} must be >= 0 cores")
        self.worker_overhead_cores = worker_overhead_cores
        self.ps_overhead_cores = ps_overhead_cores
        self.noise_rel_std = noise_rel_std
        self.prior_centre = {
            "worker_core_cap": worker_core_cap,
            "ps_core_cap": ps_core_cap,
            "ps_ratio": ps_ratio,
            "network_ratio": network_ratio,
            "ps_skew": ps_skew,
            "overlap": overlap,
        }
        self.core_cap_log_std = core_cap_log_std

    # ----------------------------------------------------------------- the form
    def _log_x(
        self, th: FloatArray, w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray
    ) -> FloatArray:
        lr, lrp, lrn, lkw, lkp, beta, lg = (float(v) for v in th[:_N_BASE])
        g = math.exp(lg)
        p = np.asarray(p, dtype=np.float64)
        spread = p**beta
        xw = w * effective_cores(lw, math.exp(lkw), self.worker_overhead_cores)
        if len(th) > _N_BASE:  # the per-PS worker cost (ps_fanout)
            xw = xw / (1.0 + math.exp(float(th[_N_BASE])) * (p - 1.0))
        xp = effective_cores(lp, math.exp(lkp), self.ps_overhead_cores) * math.exp(lrp) * spread
        xn = math.exp(lrn) * spread
        # log X = log r − log(Σ X_i^−γ)/γ, each stage powered on its own (broadcast) shape
        tot = np.asarray(xw**-g, dtype=np.float64) + xp**-g
        tot = tot + xn**-g
        return np.asarray(lr - np.log(tot) / g, dtype=np.float64)

    def _prior(self) -> tuple[FloatArray, FloatArray]:
        c = self.prior_centre
        m = np.array(
            [
                0.0,  # the rate: set from the data (a flat prior)
                math.log(c["ps_ratio"]),
                math.log(c["network_ratio"]),
                math.log(c["worker_core_cap"]),
                math.log(c["ps_core_cap"]),
                c["ps_skew"],
                math.log(c["overlap"]),
            ]
        )
        s = np.array([0.0, 1.0, 1.5, self.core_cap_log_std, self.core_cap_log_std, 0.2, 0.3])
        if self.ps_fanout > 0:
            m, s = np.r_[m, math.log(self.ps_fanout)], np.r_[s, _FANOUT_LOG_STD]
        return m, s

    # ----------------------------------------------------------------- fit
    def fit(self, samples: Sequence[Sample], start: Self | None = None) -> Self:
        """MAP fit to ``samples`` (one configuration is enough: the priors carry the rest).
        ``start``: a previous fit to warm-start the solver from."""
        samples = list(samples)
        if not samples:
            raise InputError(
                f"{type(self).__name__}.fit got no samples; profile at least one "
                "configuration, e.g. `dlrover-rm profile --spec SPEC`"
            )
        rows = self._rows(samples)
        self._validate(samples, rows)
        by: dict[tuple[float, ...], list[float]] = {}
        for r in rows:
            by.setdefault(tuple(r[:4].tolist()), []).append(math.log(r[5]))
        cfg = np.array(list(by), dtype=np.float64)
        y = np.array([np.mean(v) for v in by.values()])
        n = np.array([len(v) for v in by.values()], dtype=np.float64)
        sig = np.sqrt(self.noise_rel_std**2 / n + (0.4 * self.noise_rel_std) ** 2)
        w, p, lw, lp = cfg.T
        pm, ps = self._prior()
        has_prior = ps > 0
        # the rate's starting point: the fastest configuration's speed per worker core
        pm = pm.copy()
        th0 = pm.copy()
        th0[0] = float(np.max(y - np.log(w * effective_cores(lw, 5.0, 1.0))))
        if start is not None and len(getattr(start, "coef_array_", ())) == len(th0):
            th0 = np.array(start.coef_array_, dtype=np.float64)

        def residuals(th: FloatArray) -> FloatArray:
            fit_r = (self._log_x(th, w, p, lw, lp) - y) / sig
            return np.concatenate([fit_r, (th[has_prior] - pm[has_prior]) / ps[has_prior]])

        res = least_squares(residuals, th0, method="trf", x_scale=1.0, max_nfev=200)
        th = np.asarray(res.x, dtype=np.float64)
        jac = np.asarray(res.jac, dtype=np.float64)
        try:
            cov = np.linalg.inv(jac.T @ jac)
        except np.linalg.LinAlgError:
            cov = np.linalg.pinv(jac.T @ jac)
        y_hat = self._log_x(th, w, p, lw, lp)
        self.coef_array_ = th
        self.cov_ = np.asarray(cov, dtype=np.float64)
        self.n_samples_ = len(samples)
        self.n_configs_ = len(cfg)
        self.dof_ = len(cfg)
        self.relative_error_ = float(np.mean(np.abs(np.expm1(y_hat - y))))
        spread = [v for vals in by.values() for v in (np.asarray(vals) - np.mean(vals)).tolist()]
        self.rel_std_ = max(
            self.noise_rel_std,
            float(np.sqrt(np.mean(np.square(y_hat - y)))),
            float(np.std(spread)) if len(spread) > len(cfg) else 0.0,
        )
        self.z_ = _BOTTLENECK_Z
        bs = rows[:, 4]
        known = bs[~np.isnan(bs)]
        self.default_batch_size_ = int(known[0]) if known.size else self.batch_size
        self.identified_ = self._names
        self.full_rank_ = True
        self.fixed_inputs_: dict[str, float] = {}
        _, self.ranges_ = self._span(rows)
        self._cache()
        return self

    @classmethod
    def from_priors(
        cls, config: tuple[int, int, float, float], batch_size: int = 512, **params: float
    ) -> Self:
        """The model before any measurement: fitted to one placeholder of 1 sample/s at
        ``config`` (workers, ps, worker CPU, PS CPU). The rate's prior is flat, so the MAP
        puts every other parameter at its prior centre and the rate where the placeholder
        says: only ratios of its predictions mean anything. That is enough to choose a
        first configuration by an objective the rate's scale does not move (the planner's
        log X − θ·log cost)."""
        w, p, lw, lp = config
        one = Sample(int(w), int(p), float(lw), float(lp), 1.0, batch_size=batch_size)
        return cls(batch_size=batch_size, **params).fit([one])

    # ----------------------------------------------------------------- predict
    @property
    def coef_(self) -> dict[str, float]:
        """The parameters in their natural units (β as is, the rest exponentiated)."""
        self._check_fitted()
        return {
            n: (math.exp(v) if lg else v)
            for n, v, lg in zip(self._names, self.coef_array_.tolist(), self._logs, strict=True)
        }

    def trustworthy(self, max_rel_error: float = 0.15) -> bool:
        """Fitted, with a training MAPE within bounds (the priors stand for the missing
        degrees of freedom; the band says how wide the doubt is)."""
        return hasattr(self, "coef_array_") and self.relative_error_ <= max_rel_error

    def cpu_has_effect(self, name: str) -> bool:
        """CPU always acts in this form (through the parallelism caps)."""
        return True

    def _cfg(self, configs: npt.ArrayLike) -> FloatArray:
        cfg = np.asarray(configs, dtype=np.float64)
        if cfg.ndim == 1:
            cfg = cfg.reshape(1, -1)
        if cfg.ndim != 2 or cfg.shape[1] not in (4, 5):
            raise InputError(
                f"configs must have shape (n, 4) [workers, ps, worker_cpu, ps_cpu] or (n, 5) "
                f"[... , batch_size], got {cfg.shape}"
            )
        w, p, lw, lp = cfg[:, 0], cfg[:, 1], cfg[:, 2], cfg[:, 3]
        bad = ~(np.isfinite(w) & (w >= 1) & np.isfinite(lw) & (lw > 0))
        bad |= ~(np.isfinite(p) & (p >= 1) & np.isfinite(lp) & (lp > 0))
        if cfg.shape[1] == 5:
            bad |= ~(np.isnan(cfg[:, 4]) | (cfg[:, 4] > 0))
        if bad.any():
            rows = np.flatnonzero(bad)
            raise InputError(
                f"{len(rows)} config row(s) cannot be predicted: workers must be >= 1, CPUs > 0, "
                "ps >= 1; fix these rows",
                problems=[f"row {int(i)}: {cfg[i].tolist()}" for i in rows[:20]],
            )
        return cfg[:, :4]

    def predict_many(self, configs: npt.ArrayLike) -> FloatArray:
        self._check_fitted()
        c = self._cfg(configs)
        return np.exp(self._log_x(self.coef_array_, c[:, 0], c[:, 1], c[:, 2], c[:, 3]))

    def predict_bounds_many(
        self, configs: npt.ArrayLike
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(throughput, lower, upper): the Laplace band of the posterior, propagated by
        finite differences, plus the measurement noise."""
        self._check_fitted()
        c = self._cfg(configs)
        th = self.coef_array_
        args = (c[:, 0], c[:, 1], c[:, 2], c[:, 3])
        lx = self._log_x(th, *args)
        grad = np.empty((len(lx), len(th)))
        for j in range(len(th)):
            h = 1e-5 * max(1.0, abs(float(th[j])))
            t2 = th.copy()
            t2[j] += h
            grad[:, j] = (self._log_x(t2, *args) - lx) / h
        var = np.einsum("ij,jk,ik->i", grad, self.cov_, grad)
        half = np.minimum(self.z_ * np.sqrt(np.maximum(var, 0.0) + self.rel_std_**2), 50.0)
        x = np.exp(lx)
        return x, x * np.exp(-half), x * np.exp(half)

    def predict(
        self,
        workers: int,
        ps: int,
        worker_cpu_cores: float,
        ps_cpu_cores: float,
        batch_size: int | None = None,
    ) -> ThroughputPrediction:
        problems = self._config_problems(workers, ps, worker_cpu_cores, ps_cpu_cores)
        if batch_size is not None and not batch_size > 0:
            problems.append(f"batch_size={batch_size!r} must be > 0")
        if problems:
            raise InputError("cannot predict this configuration", problems=problems)
        x, lo, hi = self.predict_bounds_many([[workers, ps, worker_cpu_cores, ps_cpu_cores]])
        return ThroughputPrediction(float(x[0]), float(lo[0]), float(hi[0]))

    def _x_grid(
        self,
        w: FloatArray,
        p: FloatArray,
        lw: FloatArray,
        lp: FloatArray,
        b: float,
        shape: tuple[int, ...],
    ) -> FloatArray:
        x = np.exp(self._log_x(self.coef_array_, w, p, lw, lp))
        return np.asarray(np.broadcast_to(x, shape), dtype=np.float64).copy()

    # ----------------------------------------------------------------- (de)serialise
    def params(self) -> dict[str, Any]:
        """The constructor's arguments: a model like this one, unfitted, is ``cls(**params)``."""
        c = self.prior_centre
        return {
            "batch_size": self.batch_size,
            "prior_rel_std": self.prior_rel_std,
            "worker_core_cap": c["worker_core_cap"],
            "ps_core_cap": c["ps_core_cap"],
            "core_cap_log_std": self.core_cap_log_std,
            "ps_ratio": c["ps_ratio"],
            "network_ratio": c["network_ratio"],
            "ps_skew": c["ps_skew"],
            "overlap": c["overlap"],
            "worker_overhead_cores": self.worker_overhead_cores,
            "ps_overhead_cores": self.ps_overhead_cores,
            "noise_rel_std": self.noise_rel_std,
            "ps_fanout": self.ps_fanout,
        }

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "version": 1, "params": self.params(),
                             "fitted": None}  # fmt: skip
        if hasattr(self, "coef_array_"):
            d["fitted"] = {
                "theta": self.coef_array_.tolist(),
                "coef": self.coef_,
                "cov": self.cov_.tolist(),
                "rel_std": self.rel_std_,
                "n_samples": self.n_samples_,
                "n_configs": self.n_configs_,
                "relative_error": self.relative_error_,
                "default_batch_size": self.default_batch_size_,
                "ranges": {k: list(v) for k, v in self.ranges_.items()},
            }
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        if d.get("kind") != cls.kind:
            raise InputError(
                f"model kind {d.get('kind')!r} is not {cls.kind!r}; "
                "load it with model_from_dict(...) or refit with `dlrover-rm model fit`"
            )
        try:
            model = cls(**{str(k): v for k, v in dict(d.get("params", {})).items()})
            f = d.get("fitted")
            if f is not None:
                model.coef_array_ = np.array([float(v) for v in f["theta"]], dtype=np.float64)
                k = len(model._names)
                if model.coef_array_.shape != (k,):
                    raise ValueError(f"theta has {model.coef_array_.size} values, not {k}")
                model.cov_ = np.array(f["cov"], dtype=np.float64).reshape(k, k)
                model.rel_std_ = float(f["rel_std"])
                model.z_ = _BOTTLENECK_Z
                model.n_samples_ = int(f["n_samples"])
                model.n_configs_ = model.dof_ = int(f["n_configs"])
                model.relative_error_ = float(f["relative_error"])
                model.default_batch_size_ = int(f["default_batch_size"])
                model.identified_ = model._names
                model.full_rank_ = True
                model.fixed_inputs_ = {}
                model.ranges_ = {
                    str(a): (float(v[0]), float(v[1])) for a, v in f.get("ranges", {}).items()
                }
                model._cache()
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"malformed {cls.kind} model document ({type(exc).__name__}: {exc}); "
                "refit it with `dlrover-rm model fit`"
            ) from exc
        return model

    def __repr__(self) -> str:
        if not hasattr(self, "coef_array_"):
            return f"{type(self).__name__}(unfitted)"
        return (
            f"{type(self).__name__}("
            + ", ".join(f"{k}={v:.4g}" for k, v in self.coef_.items())
            + ")"
        )


ThroughputModel = PSThroughputModel | AllReduceThroughputModel
ModelClass = type[PSThroughputModel] | type[AllReduceThroughputModel]

_KINDS: dict[str, ModelClass] = {
    PSThroughputModel.kind: PSThroughputModel,
    PSExtendedThroughputModel.kind: PSExtendedThroughputModel,
    PSOverlapThroughputModel.kind: PSOverlapThroughputModel,
    PSBottleneckThroughputModel.kind: PSBottleneckThroughputModel,
    AllReduceThroughputModel.kind: AllReduceThroughputModel,
}
_STRATEGIES: dict[str, ModelClass] = {
    "ps": PSThroughputModel,
    "parameter_server": PSThroughputModel,
    "ps_extended": PSExtendedThroughputModel,
    "ps_overlap": PSOverlapThroughputModel,
    "ps_bottleneck": PSBottleneckThroughputModel,
    "allreduce": AllReduceThroughputModel,
    "all_reduce": AllReduceThroughputModel,
    "all-reduce": AllReduceThroughputModel,
}


def model_from_dict(d: Mapping[str, Any]) -> ThroughputModel:
    """Load any throughput model written by ``to_dict`` (dispatch on its ``kind``)."""
    kind = d.get("kind") if isinstance(d, Mapping) else None
    cls = _KINDS.get(str(kind))
    if cls is None:
        raise InputError(
            f"unknown throughput model kind {kind!r}; expected one of {sorted(_KINDS)}. "
            "Was the file written by `dlrover-rm model fit`?"
        )
    return cls.from_dict(d)


def fit_throughput_model(
    samples: Sequence[Sample], strategy: str = "ps", *, batch_size: int = 512
) -> ThroughputModel:
    """Fit the model for ``strategy`` ("ps", "ps_extended", "ps_overlap" or "allreduce")
    to ``samples``."""
    cls = _STRATEGIES.get(strategy.lower())
    if cls is None:
        raise InputError(
            f"unknown strategy {strategy!r}; use 'ps' (parameter server), 'ps_extended' "
            "(PS form with a light-load PS term), 'ps_overlap' (PS stages with fitted "
            "overlap) or 'allreduce'"
        )
    return cls(batch_size=batch_size).fit(samples)
