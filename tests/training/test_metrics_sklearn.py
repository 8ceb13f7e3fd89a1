"""AUC through scikit-learn: the one-class NaN rule, ties, and the lazy import (issue 38)."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest

from dlrover_core.errors import InputError
from dlrover_core.training.metrics import auc, logloss


def _pairs_auc(y: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[y == 1], s[y == 0]
    pairs = list(itertools.product(pos, neg))
    return sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in pairs) / len(pairs)


@pytest.mark.parametrize("seed", [3, 17, 29])
def test_auc_with_heavy_ties_is_pair_counting(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.normal(size=200) + 0.7 * y)  # integer scores: many ties
    assert len(np.unique(s)) < 12
    assert auc(y, s) == pytest.approx(_pairs_auc(y, s), abs=1e-12)


def test_all_tied_scores_are_one_half() -> None:
    assert auc(np.array([0, 1, 1, 0, 1]), np.full(5, 0.3)) == pytest.approx(0.5)


@pytest.mark.parametrize("labels", [[0, 0, 0], [1, 1, 1], [0.9, 0.7, 1.0]])
def test_one_class_is_nan_without_a_warning(labels: list[float]) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(auc(np.array(labels), np.array([0.1, 0.1, 0.5])))


def test_soft_labels_split_at_one_half() -> None:
    # labels are thresholded at 0.5 (as before): 0.4 is a negative, 0.6 a positive
    assert auc(np.array([0.4, 0.6]), np.array([0.2, 0.9])) == 1.0
    assert auc(np.array([0.4, 0.6]), np.array([0.9, 0.2])) == 0.0


def test_lengths_must_match() -> None:
    with pytest.raises(InputError, match="differ in length"):
        auc(np.array([0, 1]), np.array([0.1, 0.2, 0.3]))


def test_logloss_agrees_with_sklearn_inside_float64_range() -> None:
    from sklearn.metrics import log_loss

    rng = np.random.default_rng(5)
    z = rng.normal(scale=6.0, size=500).clip(-30, 30)
    y = (rng.random(500) < 1 / (1 + np.exp(-z))).astype(float)
    p = 1 / (1 + np.exp(-z))
    assert logloss(y, z) == pytest.approx(log_loss(y, p, labels=[0, 1]), rel=1e-12)


def test_logloss_keeps_the_tail_sklearn_clips() -> None:
    # why log loss stays the logits form: scikit-learn clips probabilities at eps
    assert logloss(np.array([0.0]), np.array([40.0])) == pytest.approx(40.0)


def test_importing_the_metrics_does_not_import_sklearn() -> None:
    code = (
        "import sys, dlrover_core.training.metrics as m, numpy as np;"
        "assert 'sklearn' not in sys.modules;"
        "m.auc(np.array([0, 1]), np.array([0.1, 0.9]));"
        "assert 'sklearn.metrics' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
