"""History records as JSON (export/import format).

The SQL history store (SQLAlchemy; SQLite by default, PostgreSQL by URL) reads and writes the
same dicts; until a run writes one, a JSON file of records can seed warm start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlrover_core.errors import InputError
from dlrover_core.types import HistoryRecord, ResourcePlan

_OPTIONAL_INTS = (
    "worker_cpu_used_millicores",
    "worker_memory_used_mib",
    "ps_cpu_used_millicores",
    "ps_memory_used_mib",
)


def record_to_dict(r: HistoryRecord) -> dict[str, Any]:
    d: dict[str, Any] = {
        "signature": r.signature,
        "finished_at_s": r.finished_at_s,
        "final_plan": r.final_plan.to_dict(),
        "succeeded": r.succeeded,
        "throughput_sps": r.throughput_sps,
        "wall_s": r.wall_s,
        "extra": r.extra,
        "strategy": r.strategy,
    }
    for k in _OPTIONAL_INTS:
        d[k] = getattr(r, k)
    return d


def record_from_dict(d: dict[str, Any]) -> HistoryRecord:
    try:
        return HistoryRecord(
            signature=str(d["signature"]),
            finished_at_s=float(d["finished_at_s"]),
            final_plan=ResourcePlan.from_dict(d["final_plan"]),
            succeeded=bool(d.get("succeeded", True)),
            throughput_sps=d.get("throughput_sps"),
            wall_s=d.get("wall_s"),
            extra=dict(d.get("extra") or {}),
            strategy=str(d.get("strategy") or (d.get("spec") or {}).get("strategy") or "ps"),
            **{k: (int(d[k]) if d.get(k) is not None else None) for k in _OPTIONAL_INTS},
        )
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(
            f"malformed history record ({type(e).__name__}: {e}); each record needs signature, "
            "finished_at_s and final_plan (as written by `dlrover-rm plan --json`)"
        ) from None


def read_history_json(path: str | Path) -> list[HistoryRecord]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"history file {str(p)!r} does not exist; pass an existing JSON file")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"history file {str(p)!r} is not valid JSON: {e}") from None
    if isinstance(data, dict):
        data = data.get("records", [])
    if not isinstance(data, list):
        raise InputError(f"history file {str(p)!r} must hold a list of records")
    return [record_from_dict(d) for d in data]
