"""Scoring without torch: rank AUC and log loss over numpy arrays (the master uses them too)."""

from __future__ import annotations

import numpy as np

from dlrover_core.errors import InputError


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by ranks (ties get their average rank).

    NaN when ``labels`` hold only one class (AUC is undefined there)."""
    y = np.asarray(labels).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise InputError(f"labels ({y.shape[0]}) and scores ({s.shape[0]}) differ in length")
    pos = int(y.sum())
    neg = y.shape[0] - pos
    if pos == 0 or neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    # average 1-based rank of each distinct score: tied values share the mean of their ranks
    ends = np.cumsum(counts)
    avg_rank = ends - (counts - 1) / 2.0
    rank_sum = float(avg_rank[inverse][y].sum())
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


def logloss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of logits (numerically stable)."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    if y.shape[0] == 0:
        return float("nan")
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))
