"""Model selection: which throughput-model form a job's samples are fitted with.

For PS jobs the bottleneck form
(:class:`~dlrover_core.model.throughput.PSBottleneckThroughputModel`) is the default; from
``SELECT_MIN_CONFIGS`` distinct configurations a cross-validation over configurations
(:func:`held_out_errors`) weighs it against the linear forms (the paper's form or its
extension, and the overlap form: :func:`linear_model_factory`). :class:`ModelChoice`
remembers the choice, so that it is made again only when the measured configurations have grown
by ``CHOOSE_AGAIN_GROWTH``, and a recurring job can adopt a past run's. Pure: samples in, a
fitted model out; the planner (:mod:`dlrover_core.planner.planner`) calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dlrover_core.errors import DLRoverError
from dlrover_core.model.throughput import (
    PSBottleneckThroughputModel,
    PSExtendedThroughputModel,
    PSOverlapThroughputModel,
    ThroughputModel,
    fit_throughput_model,
)
from dlrover_core.types import Sample

ModelFactory = Callable[[Sequence[Sample], str, int], ThroughputModel]


def _baseline_ps_model(samples: Sequence[Sample], batch_size: int) -> ThroughputModel:
    """The extended form (paper form + a light-load PS term, b4·B/λp) once six
    configurations identify it — it halves the held-out error on queueing-like data
    (tests/model) — and the paper's five-coefficient form before that."""
    if PSExtendedThroughputModel.count_configs(samples) >= 6:
        # fit it once and keep it when every coefficient was identified (what
        # ``is_identifiable`` would check first, at the cost of a second design and rank)
        try:
            ext = PSExtendedThroughputModel(batch_size=batch_size).fit(samples)
        except DLRoverError:
            ext = None
        if ext is not None and ext.full_rank_:
            return ext
    return fit_throughput_model(samples, "ps", batch_size=batch_size)


def _overlap_ps_model(
    samples: Sequence[Sample],
    batch_size: int,
    start_from: PSOverlapThroughputModel | None = None,
) -> PSOverlapThroughputModel:
    """``start_from``: an earlier fit of this job that warm-starts the refinement."""
    return PSOverlapThroughputModel(batch_size=batch_size).fit(samples, start_from=start_from)


# the overlap model is weighed from this many distinct configurations (its identifiable
# part fits from two; leave-one-configuration-out needs some left in every fold)
OVERLAP_MIN_CONFIGS = 5
# at most this many cross-validation folds (two fits each): the cost stays bounded as the
# configurations accumulate (up to five configurations it is leave-one-out)
OVERLAP_FOLDS: int | None = 5
# and chosen only when its mean held-out error is lower by at least this much (half a point
# of MAPE): a smaller difference is rounding or noise, not worth the extra parameters
OVERLAP_MIN_IMPROVEMENT = 0.005
# once chosen by cross-validation (from OVERLAP_MIN_CONFIGS configurations), the form is
# chosen again when the configurations have grown by this factor (5, 8, 12, 18, ...): a
# form that predicted the held-out configurations of n rarely loses to the other on a
# few more, and each choice costs ten fits. In between only the chosen form is refitted.
CHOOSE_AGAIN_GROWTH = 1.5


def held_out_errors(
    fit: Callable[[Sequence[Sample]], ThroughputModel],
    samples: Sequence[Sample],
    folds: int | None = None,
) -> dict[tuple[int, int, float, float], float]:
    """Cross-validation over configurations: the distinct configurations, in the order
    first seen, are dealt into ``folds`` folds (None: one per configuration, i.e.
    leave-one-configuration-out); the model fitted to the other folds' samples predicts
    each configuration of a fold. Returns each configuration's absolute relative error
    against its mean measured throughput; configurations a fold cannot predict (too few
    configurations left, or an input the others never varied) are left out."""
    by_cfg: dict[tuple[int, int, float, float], list[Sample]] = {}
    for s in samples:
        by_cfg.setdefault(s.config, []).append(s)
    cfgs = list(by_cfg)
    k = len(cfgs) if folds is None else max(1, min(folds, len(cfgs)))
    out: dict[tuple[int, int, float, float], float] = {}
    for f in range(k):
        held = set(cfgs[f::k])
        try:
            model = fit([s for s in samples if s.config not in held])
        except DLRoverError:
            continue
        for cfg in cfgs[f::k]:
            own = by_cfg[cfg]
            b = own[0].batch_size
            row = np.array([[*cfg, float(b) if b is not None else math.nan]])
            if model.span_problems(row):
                continue
            x_hat = float(model.predict_many(row)[0])
            x = float(np.mean([s.throughput_sps for s in own]))
            out[cfg] = abs(x_hat / x - 1.0)
    return out


THROUGHPUT_FORMS = ("bottleneck", "linear")
# from this many distinct configurations the bottleneck form is cross-validated against
# the linear forms (leave one configuration out: each fold keeps two to fit from)
SELECT_MIN_CONFIGS = 3
# the linear forms replace it only when their mean held-out error is at most this share
# of its own and lower by SELECT_MIN_GAIN: the bottleneck form's priors are what make a
# first run's plan, so it is kept unless the job's own measurements clearly contradict them
SELECT_MAX_RATIO = 0.5
SELECT_MIN_GAIN = 0.02


def linear_predicts_better(
    samples: Sequence[Sample], batch_size: int, bottleneck: PSBottleneckThroughputModel
) -> bool:
    """Whether the linear baseline form (:func:`_baseline_ps_model`) predicts held-out
    configurations clearly better than the bottleneck form (``bottleneck``: its fit to all
    ``samples``, which warm-starts the folds' fits): mean errors over the configurations
    both can predict, by ``SELECT_MAX_RATIO`` and ``SELECT_MIN_GAIN``."""

    params = {**bottleneck.params(), "batch_size": batch_size}

    def fit_bottleneck(s: Sequence[Sample]) -> ThroughputModel:
        return PSBottleneckThroughputModel(**params).fit(s, start=bottleneck)

    def fit_base(s: Sequence[Sample]) -> ThroughputModel:
        return _baseline_ps_model(s, batch_size)

    e_b = held_out_errors(fit_bottleneck, samples, OVERLAP_FOLDS)
    e_l = held_out_errors(fit_base, samples, OVERLAP_FOLDS)
    common = e_b.keys() & e_l.keys()
    if len(common) < 2:
        return False
    mean_b = sum(e_b[c] for c in common) / len(common)
    mean_l = sum(e_l[c] for c in common) / len(common)
    return mean_l <= SELECT_MAX_RATIO * mean_b and mean_b - mean_l >= SELECT_MIN_GAIN


def default_model_factory(
    samples: Sequence[Sample], strategy: str, batch_size: int
) -> ThroughputModel:
    """For PS jobs, :class:`PSBottleneckThroughputModel` (a prediction from one
    configuration on; see :func:`linear_model_factory` for the linear forms); other
    strategies' own model."""
    if strategy != "ps":
        return fit_throughput_model(samples, strategy, batch_size=batch_size)
    return PSBottleneckThroughputModel(batch_size=batch_size).fit(samples)


def linear_model_factory(
    samples: Sequence[Sample], strategy: str, batch_size: int
) -> ThroughputModel:
    """For PS jobs, the baseline form (:func:`_baseline_ps_model`) or, from
    ``OVERLAP_MIN_CONFIGS`` distinct configurations, :class:`PSOverlapThroughputModel` when
    it predicts held-out configurations better: a mean cross-validated error (folds over
    configurations, :func:`held_out_errors`) lower by ``OVERLAP_MIN_IMPROVEMENT`` on the
    configurations both can predict. Its training error is no evidence: having the
    baseline's terms and more, it is (nearly) always the lower."""
    if strategy != "ps":
        return fit_throughput_model(samples, strategy, batch_size=batch_size)
    base = _baseline_ps_model(samples, batch_size)
    if PSOverlapThroughputModel.count_configs(samples) < OVERLAP_MIN_CONFIGS:
        return base
    if base.relative_error_ < OVERLAP_MIN_IMPROVEMENT and base.n_configs_ >= 2 * len(
        PSOverlapThroughputModel.feature_names
    ):
        # no lack of fit: the baseline reproduces many more configurations than the
        # overlap model has parameters to within the improvement asked of it, so there is
        # nothing left for its extra terms to explain (and its fits are not paid for)
        return base

    try:
        overlap = _overlap_ps_model(samples, batch_size)
    except DLRoverError:
        return base
    used = {n for n, c in overlap.coef_.items() if c > 0}
    if overlap.gamma_ == 1.0 and used <= set(base.feature_names):
        # no overlap and none of its extra terms: the baseline's fit over the same columns
        # (the same least-squares problem), nothing to cross-validate
        return base

    def fit_base(s: Sequence[Sample]) -> ThroughputModel:
        return _baseline_ps_model(s, batch_size)

    def fit_overlap(s: Sequence[Sample]) -> ThroughputModel:
        return _overlap_ps_model(s, batch_size)

    e_base = held_out_errors(fit_base, samples, OVERLAP_FOLDS)
    e_ov = held_out_errors(fit_overlap, samples, OVERLAP_FOLDS)
    common = e_base.keys() & e_ov.keys()
    if not common:
        return base
    gain = sum(e_base[c] - e_ov[c] for c in common) / len(common)
    return overlap if gain >= OVERLAP_MIN_IMPROVEMENT else base


class ModelChoice:
    """:func:`default_model_factory` with its choice remembered: the cross-validation that
    picks the form runs when the set of measured configurations changes, not on every new
    replicate of one already measured (the runtime and the simulator add one per steady
    window); in between, only the chosen form is refitted, the overlap form warm-started from
    its previous fit (a few solver steps instead of two cold starts of tens: what keeps a plan
    under 10 ms). One per planner (per job)."""

    def __init__(
        self, form: str = "bottleneck", bottleneck_params: Mapping[str, float] | None = None
    ) -> None:
        """``bottleneck_params``: the bottleneck form's prior centres and widths over its
        defaults (:class:`PSBottleneckThroughputModel`'s keyword arguments)."""
        if form not in THROUGHPUT_FORMS:
            raise ValueError(f"throughput form {form!r}: use one of {THROUGHPUT_FORMS}")
        self.form = form
        self.bottleneck_params = dict(bottleneck_params or {})
        self._configs: frozenset[tuple[int, int, float, float]] | None = None
        self._overlap = False
        self._last_overlap: PSOverlapThroughputModel | None = None
        self._last_bottleneck: PSBottleneckThroughputModel | None = None
        # the bottleneck form's cross-validated choice: the configurations it was made
        # from (None: not made yet) and whether the linear forms won it
        self._selected_from: frozenset[tuple[int, int, float, float]] | None = None
        self._use_linear = False

    def __call__(
        self, samples: Sequence[Sample], strategy: str, batch_size: int
    ) -> ThroughputModel:
        if strategy != "ps":
            return fit_throughput_model(samples, strategy, batch_size=batch_size)
        if self.form == "bottleneck":
            return self._bottleneck_or_linear(samples, strategy, batch_size)
        return self._linear(samples, strategy, batch_size)

    def _fit_bottleneck(
        self, samples: Sequence[Sample], batch_size: int
    ) -> PSBottleneckThroughputModel:
        """Refitted from the previous fit (a few solver steps)."""
        bottleneck = PSBottleneckThroughputModel(
            batch_size=batch_size, **self.bottleneck_params
        ).fit(samples, start=self._last_bottleneck)
        self._last_bottleneck = bottleneck
        return bottleneck

    def _bottleneck_or_linear(
        self, samples: Sequence[Sample], strategy: str, batch_size: int
    ) -> ThroughputModel:
        """The bottleneck form, until ``SELECT_MIN_CONFIGS`` distinct configurations let a
        cross-validation weigh it against the linear forms (:func:`linear_predicts_better`):
        its priors, drawn for CPU parameter-server jobs, can contradict what a job
        measures (GPU workers whose PS never saturates: benchmarks/real_curves.py). Chosen
        again when the configurations grow by ``CHOOSE_AGAIN_GROWTH``."""
        configs = frozenset(s.config for s in samples)
        if len(configs) >= SELECT_MIN_CONFIGS and not self._selection_holds(configs):
            bottleneck = self._fit_bottleneck(samples, batch_size)
            self._use_linear = linear_predicts_better(samples, batch_size, bottleneck)
            self._selected_from = configs
            if not self._use_linear:
                return bottleneck
        if self._use_linear and self._selected_from is not None:
            try:
                return self._linear(samples, strategy, batch_size)
            except DLRoverError:
                pass  # the bottleneck form fits from any samples
        return self._fit_bottleneck(samples, batch_size)

    def _selection_holds(self, configs: frozenset[tuple[int, int, float, float]]) -> bool:
        return _choice_holds(self._selected_from, configs, SELECT_MIN_CONFIGS)

    def _linear(self, samples: Sequence[Sample], strategy: str, batch_size: int) -> ThroughputModel:
        configs = frozenset(s.config for s in samples)
        if configs == self._configs or self._still_chosen(configs):
            if not self._overlap:
                return _baseline_ps_model(samples, batch_size)
            try:
                fitted = _overlap_ps_model(samples, batch_size, self._last_overlap)
            except DLRoverError:
                pass  # choose again below
            else:
                self._last_overlap = fitted
                return fitted
        model = linear_model_factory(samples, strategy, batch_size)
        self._configs = configs
        self._overlap = isinstance(model, PSOverlapThroughputModel)
        self._last_overlap = model if isinstance(model, PSOverlapThroughputModel) else None
        return model

    def remembered(self) -> dict[str, Any] | None:
        """The last cross-validated choice, as a past run leaves it in the history (JSON):
        the form and the configurations it was chosen from; None before any. With the
        bottleneck form, the form is "ps_bottleneck" or "linear" (the linear forms won)."""
        if self.form == "bottleneck":
            if self._selected_from is None:
                return None
            form, seen = ("linear" if self._use_linear else "ps_bottleneck"), self._selected_from
        else:
            if self._configs is None or len(self._configs) < OVERLAP_MIN_CONFIGS:
                return None
            form, seen = ("ps_overlap" if self._overlap else "ps"), self._configs
        return {"form": form, "configs": [list(c) for c in sorted(seen)]}

    def adopt(self, remembered: Any) -> bool:
        """Start from a past run's choice (:meth:`remembered`, read back from the history)
        when none was made yet: a recurring job's next run then cross-validates again only
        once its configurations have grown by ``CHOOSE_AGAIN_GROWTH``. Anything malformed,
        or a choice this form does not make, is ignored (the choice is made afresh). True
        when adopted."""
        if not isinstance(remembered, Mapping):
            return False
        form, raw = remembered.get("form"), remembered.get("configs")
        bottleneck = self.form == "bottleneck"
        allowed = ("ps_bottleneck", "linear") if bottleneck else ("ps", "ps_overlap")
        made = self._selected_from if bottleneck else self._configs
        if made is not None or form not in allowed or not isinstance(raw, list):
            return False
        try:
            configs = frozenset(
                (int(c[0]), int(c[1]), float(c[2]), float(c[3])) for c in raw if len(c) == 4
            )
        except (TypeError, ValueError, KeyError, IndexError):
            return False
        least = SELECT_MIN_CONFIGS if bottleneck else OVERLAP_MIN_CONFIGS
        if len(configs) < least or len(configs) != len(raw):
            return False
        if bottleneck:
            self._selected_from = configs
            self._use_linear = form == "linear"
        else:
            self._configs = configs
            self._overlap = form == "ps_overlap"
            self._last_overlap = None
        return True

    def _still_chosen(self, configs: frozenset[tuple[int, int, float, float]]) -> bool:
        return _choice_holds(self._configs, configs, OVERLAP_MIN_CONFIGS)


def _choice_holds(
    seen: frozenset[tuple[int, int, float, float]] | None,
    configs: frozenset[tuple[int, int, float, float]],
    least: int,
) -> bool:
    """A form choice cross-validated on ``seen`` (at least ``least`` configurations) still
    holds: the configurations measured since (a superset of those it saw) have not grown by
    ``CHOOSE_AGAIN_GROWTH``."""
    if seen is None or len(seen) < least or not seen <= configs:
        return False
    return len(configs) < CHOOSE_AGAIN_GROWTH * len(seen)
