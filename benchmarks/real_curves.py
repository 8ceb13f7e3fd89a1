"""Fit the throughput models to published measured curves and report held-out MAPE.

    python benchmarks/real_curves.py [--data benchmarks/data] [--json OUT]

Data: the CSV files in ``benchmarks/data`` (sources, commits and caveats in its README.md):
PaddlePaddle's VGG16 CPU parameter-server cluster (workers 20–100, PS 3–20, batch 32–256)
and TensorFlow's tf_cnn_benchmarks on EC2 K80s (1–64 GPU workers, 1–8 PS).

Per curve and model:

* interpolation — leave one out: every point whose workers, PS and batch lie inside the
  range of the remaining points is predicted from a fit to those remaining points;
* extrapolation — fit to the points with workers <= 0.65 × the curve's largest worker
  count, predict the larger ones (Paddle: fit 20–60 workers, predict 80 and 100; TF: fit
  1–32 GPUs, predict 64).

Targets from issue 10: <= 10 % MAPE interpolating, <= 20 % extrapolating.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.errors import DLRoverError
from dlrover_core.model.selection import ModelChoice
from dlrover_core.model.throughput import fit_throughput_model
from dlrover_core.types import Sample

# "planner": the planner's own choice (ModelChoice, the default throughput_form): the
# bottleneck form, or the linear forms where cross-validation on the fitted points says so
STRATEGIES = ("ps", "ps_extended", "ps_overlap", "ps_bottleneck", "planner")
EXTRAPOLATE_FROM = 0.65  # fit on workers <= this share of the largest worker count


def read_curves(path: Path) -> dict[str, list[Sample]]:
    curves: dict[str, list[Sample]] = defaultdict(list)
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh), start=2):
            try:
                s = Sample(
                    workers=int(row["workers"]),
                    ps=int(row["ps"]),
                    worker_cpu_cores=float(row["worker_cpu"]),
                    ps_cpu_cores=float(row["ps_cpu"]),
                    throughput_sps=float(row["throughput_sps"]),
                    batch_size=int(row["batch_size"]),
                )
            except (KeyError, ValueError) as exc:
                raise SystemExit(f"{path}:{i}: bad row ({exc}); fix the CSV") from exc
            curves[row["curve"]].append(s)
    return dict(curves)


def _predict(train: list[Sample], test: list[Sample], strategy: str) -> list[float] | str:
    try:
        b = train[0].batch_size or 512
        if strategy == "planner":
            m = ModelChoice()(train, "ps", b)
        else:
            m = fit_throughput_model(train, strategy, batch_size=b)
        cfg = np.array(
            [[t.workers, t.ps, t.worker_cpu_cores, t.ps_cpu_cores, t.batch_size] for t in test],
            dtype=float,
        )
        return [float(x) for x in m.predict_many(cfg)]
    except DLRoverError as exc:
        return str(exc).splitlines()[0]


def _inside(s: Sample, others: list[Sample]) -> bool:
    for get in (lambda x: x.workers, lambda x: x.ps, lambda x: x.batch_size or 0):
        vals = [get(o) for o in others]
        if not min(vals) <= get(s) <= max(vals):
            return False
    return True


def evaluate(points: list[Sample], strategy: str) -> dict[str, Any]:
    interp: list[float] = []
    why: list[str] = []
    for i, s in enumerate(points):
        rest = points[:i] + points[i + 1 :]
        if not _inside(s, rest):
            continue
        pred = _predict(rest, [s], strategy)
        if isinstance(pred, str):
            why.append(pred)
            continue
        interp.append(abs(pred[0] / s.throughput_sps - 1.0))
    wmax = max(p.workers for p in points)
    train = [p for p in points if p.workers <= EXTRAPOLATE_FROM * wmax]
    test = [p for p in points if p.workers > EXTRAPOLATE_FROM * wmax]
    pred = _predict(train, test, strategy)
    extrap = (
        [abs(x / t.throughput_sps - 1.0) for x, t in zip(pred, test, strict=True)]
        if not isinstance(pred, str)
        else []
    )
    return {
        "interpolation_errors": interp,
        "interpolation_mape": float(np.mean(interp)) if interp else None,
        "extrapolation_errors": extrap,
        "extrapolation_mape": float(np.mean(extrap)) if extrap else None,
        "extrapolation_train_workers": sorted({p.workers for p in train}),
        "extrapolation_test_workers": sorted({p.workers for p in test}),
        "not_fitted": why + ([pred] if isinstance(pred, str) else []),
    }


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).parent / "data")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    files = sorted(a.data.glob("*.csv"))
    if not files:
        print(f"no CSV files in {a.data}; see benchmarks/data/README.md", file=sys.stderr)
        return 2
    doc: dict[str, Any] = {}
    print("| data | curve | points | model | interp. MAPE (n) | extrap. MAPE (n) |")
    print("|---|---|---|---|---|---|")
    pooled: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: {"i": [], "e": []})
    for f in files:
        for name, points in read_curves(f).items():
            for strategy in STRATEGIES:
                r = evaluate(points, strategy)
                doc.setdefault(f.name, {}).setdefault(name, {})[strategy] = r
                pooled[(f.name, strategy)]["i"] += r["interpolation_errors"]
                pooled[(f.name, strategy)]["e"] += r["extrapolation_errors"]
                print(
                    f"| {f.stem} | {name} | {len(points)} | {strategy} | "
                    f"{_pct(r['interpolation_mape'])} ({len(r['interpolation_errors'])}) | "
                    f"{_pct(r['extrapolation_mape'])} ({len(r['extrapolation_errors'])}) |"
                )
    print("\nPooled over the curves of each file (targets: interp <= 10 %, extrap <= 20 %):")
    summary: dict[str, dict[str, Any]] = {}
    for (fname, strategy), errs in pooled.items():
        i = float(np.mean(errs["i"])) if errs["i"] else None
        e = float(np.mean(errs["e"])) if errs["e"] else None
        summary.setdefault(fname, {})[strategy] = {
            "interpolation_mape": i,
            "extrapolation_mape": e,
            "n_interp": len(errs["i"]),
            "n_extrap": len(errs["e"]),
        }
        ok_i = "✓" if i is not None and i <= 0.10 else "✗"
        ok_e = "✓" if e is not None and e <= 0.20 else "✗"
        print(
            f"  {fname:<36} {strategy:<12} interp {_pct(i)} {ok_i} (n={len(errs['i'])})  "
            f"extrap {_pct(e)} {ok_e} (n={len(errs['e'])})"
        )
    if a.json:
        a.json.write_text(json.dumps({"curves": doc, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
