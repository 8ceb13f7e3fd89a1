"""The simulator's policies, listed explicitly (no import-time registration).

``policy_factories()`` builds the table on call: the built-in baselines, our planner
(``dlrover-rm``) and, when the optional ``dlrover`` package imports, the open-source peer.
A missing peer is reported by ``unavailable_policies()``, never dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dlrover_core.sim import dlrover_oss
from dlrover_core.sim.policies import (
    AutopilotPolicy,
    ManualPolicy,
    OptimusPolicy,
    OraclePolicy,
    Policy,
    VpaPolicy,
)
from dlrover_core.sim.rm_policy import DLRoverRMPolicy

PolicyFactory = Callable[[], Policy]


def policy_factories(extra: Mapping[str, PolicyFactory] | None = None) -> dict[str, PolicyFactory]:
    """Every runnable policy by name; ``extra`` adds (or replaces) entries."""
    table: dict[str, PolicyFactory] = {
        "manual": ManualPolicy,
        "dlrover-oss": dlrover_oss.DlroverOssPolicy,
        "vpa": VpaPolicy,
        "autopilot": AutopilotPolicy,
        "optimus": OptimusPolicy,
        "oracle": OraclePolicy,
        "dlrover-rm": DLRoverRMPolicy,
    }
    if dlrover_oss.DLROVER_OSS_UNAVAILABLE is not None:
        del table["dlrover-oss"]
    table.update(extra or {})
    return table


def unavailable_policies() -> dict[str, str]:
    """Known peers that cannot run here, with the reason (e.g. the optional dlrover extra)."""
    if dlrover_oss.DLROVER_OSS_UNAVAILABLE:
        return {"dlrover-oss": dlrover_oss.DLROVER_OSS_UNAVAILABLE}
    return {}
