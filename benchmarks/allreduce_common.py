"""Shared by the all-reduce benchmarks: run small-allreduce through real rank processes
against a real master (the controller's stand-in, LocalGroupHarness) and read the events."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "pipelines" / "specs" / "small-allreduce.yaml"


def spec_dict(**overrides: Any) -> dict[str, Any]:
    """small-allreduce.yaml as a dict, with ``a.b=value`` overrides."""
    from dlrover_core.spec import apply_overrides, read_spec_file

    return apply_overrides(read_spec_file(SPEC), [f"{k}={v}" for k, v in overrides.items()])


def event_t(rp: Any, name: str) -> float:
    e = rp.event(name)
    if e is None:
        raise RuntimeError(f"rank {rp.args.rank} gen {rp.args.generation} has no {name!r} event")
    return float(e["t"])


def write_json(path: str | None, data: Any) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1, sort_keys=True))
        print(f"wrote {path}")


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)
