"""The model gate: may a trained model be published? Pure: numbers in, a verdict out.

A run whose held-out AUC misses ``quality.min_auc``, or falls more than
``quality.max_auc_drop`` below the previous good model of its signature, ends ``rejected``:
its report and its model are kept (under ``rejected/``), and nothing uses the model: no
pipeline output, no warm start, no ``init_from: last``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlrover_core.spec import QualitySpec


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str
    auc: float | None
    min_auc: float | None = None
    previous_auc: float | None = None
    max_auc_drop: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "auc": self.auc,
            "min_auc": self.min_auc,
            "previous_auc": self.previous_auc,
            "max_auc_drop": self.max_auc_drop,
        }


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def gate(q: QualitySpec, auc: Any, previous_auc: Any = None) -> Verdict:
    """The verdict on a model of held-out ``auc`` (None: not measured); ``previous_auc``: the
    previous good model's of the signature (None: there is none)."""
    a, prev = _finite(auc), _finite(previous_auc)
    common = {"auc": a, "min_auc": q.min_auc, "previous_auc": prev, "max_auc_drop": q.max_auc_drop}
    if q.min_auc is None and (q.max_auc_drop is None or prev is None):
        return Verdict(True, "no quality gate applies", **common)
    if a is None:
        return Verdict(
            False,
            "no held-out AUC to check the quality gate with (data.eval_rows 0, or the "
            "evaluation failed); raise data.eval_rows or remove quality.*",
            **common,
        )
    if q.min_auc is not None and a < q.min_auc:
        return Verdict(
            False, f"held-out AUC {a:.4f} is below quality.min_auc {q.min_auc:.4f}", **common
        )
    if q.max_auc_drop is not None and prev is not None and a < prev - q.max_auc_drop:
        return Verdict(
            False,
            f"held-out AUC {a:.4f} is {prev - a:.4f} below the previous good model's "
            f"{prev:.4f}, more than quality.max_auc_drop {q.max_auc_drop:.4f}",
            **common,
        )
    parts = []
    if q.min_auc is not None:
        parts.append(f">= min_auc {q.min_auc:.4f}")
    if q.max_auc_drop is not None and prev is not None:
        parts.append(f"within {q.max_auc_drop:.4f} of the previous {prev:.4f}")
    return Verdict(True, f"held-out AUC {a:.4f} " + " and ".join(parts), **common)
