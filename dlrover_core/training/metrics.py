"""Scoring without torch: ROC AUC and log loss over numpy arrays (the master uses them too).

AUC is scikit-learn's ``roc_auc_score`` (ties score one half, as the average rank does),
imported when first scored: ``sklearn.metrics`` takes about 0.7-1.0 s to import here, which
no node or master start-up should pay. Log loss stays the stable form over logits:
``sklearn.metrics.log_loss`` takes probabilities and clips them at float64's epsilon, so a
confidently wrong logit past about ±36 is scored 36 instead of its true loss (at 40: 36.04,
not 40). On logits inside that range the two agree to 1e-12 (tests/training).
"""

from __future__ import annotations

import numpy as np

from dlrover_core.errors import InputError


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (``sklearn.metrics.roc_auc_score``; tied scores count one
    half per pair).

    NaN when ``labels`` hold only one class (AUC is undefined there; scikit-learn would warn
    and return NaN too, this says so without a warning)."""
    y = np.asarray(labels).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise InputError(f"labels ({y.shape[0]}) and scores ({s.shape[0]}) differ in length")
    pos = int(y.sum())
    if pos == 0 or pos == y.shape[0]:
        return float("nan")
    from sklearn.metrics import roc_auc_score  # lazy: see the module docstring

    return float(roc_auc_score(y, s))


def logloss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of logits (numerically stable; the training loss's form)."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    if y.shape[0] == 0:
        return float("nan")
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))
