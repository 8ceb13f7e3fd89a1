"""Held-out AUC of PS training over many random starts, with and without faults, against the
single-process model on the same rows (the "collapse": docs/decisions.md, "PS data plane").

    python benchmarks/ps_accuracy_seeds.py [--runs 12 | --seeds 36,9] [--rows 200000]
        [--fault-runs 3 --fault-rows 120000] [--baseline-runs 3]
        [--sim-seeds 24 --sim-rows 30000] [--set training.dense_warmup=0] [--json OUT]

- ``--runs``: 1 PS + 1 worker (real processes, gRPC; ``runtime_throughput.runtime_run``, the
  plan pinned) with ``training.seed`` null, i.e. a random dense start per run (``--seeds``:
  one run per given ``training.seed`` instead).
- ``--fault-runs``: 1 PS + 2 workers, random start; at 20 % of the samples worker 0 is killed
  (SIGKILL, its shards go back, it is relaunched) and at 45 % PS 0 (relaunched from its
  checkpoint, the shards done after it replayed): the fault sequence of the Kubernetes e2e job
  (tests/runtime/kubernetes/test_k8s_e2e.py), on the local backend.
- ``--baseline-runs``: the single-process torchrec DLRM (torch's Adagrad) on the same rows
  (``--rows``, and ``--fault-rows`` when kill runs were made), torch seeds 0, 1, ...
- ``--sim-seeds``: the one-process torch model of the pipeline (``runtime_throughput.
  delayed_run``: the PS's row init, delayed-update Adagrad, lr/τ, the dense warm-up) for
  staleness 0, 1 and 3, seeds 0..N-1, ``--sim-rows`` rows: how many of the bottom MLP's
  output units are still alive (ReLU output > 0 for some held-out row) — 0 is a collapse.

Every real run also reports, from its PS's final checkpoint, the alive units of the bottom MLP
and the spread of its held-out logits. ``--set`` applies spec overrides to every run, e.g.
``training.dense_warmup=0`` for the PS without the warm-up (the code before it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.runtime_throughput import SMALL, baseline_run, delayed_run, runtime_run
from tests.runtime.test_runtime_e2e import Killer  # the e2e test's fault driver

COLLAPSED_AUC = 0.72  # below what either the dense or the sparse features alone reach


def alive_units(tower: Any, dense: Any) -> int:
    """Output units of the bottom MLP (DenseArch, ReLU-terminated) that are > 0 for at least
    one of the rows ``dense``: 0 means the model cannot see the dense features at all."""
    import torch

    with torch.no_grad():
        out = tower.dense_arch(torch.from_numpy(dense))
    return int(((out > 0).sum(0) > 0).sum())


def final_model(run_dir: Path, extra: tuple[str, ...]) -> dict[str, Any]:
    """Alive bottom-MLP units and the held-out logit spread of the dense parameters in the
    newest PS checkpoint of ``run_dir`` (the PS writes a final one when it stops)."""
    import torch

    from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
    from dlrover_core.runtime.strategies.ps.step import load_dense
    from dlrover_core.spec import load_spec
    from dlrover_core.training.data import from_spec
    from dlrover_core.training.model import DenseTower

    dirs = sorted({p.parent for p in run_dir.rglob("ckpt-*.npz")}, key=lambda d: d.stat().st_mtime)
    for d in reversed(dirs):
        loaded = ckpt.load_latest(d)
        if loaded is None or not loaded.state.dense:
            continue
        spec = load_spec(str(SMALL), list(extra))
        tower = DenseTower(spec.model)
        load_dense(tower, {n: s.weight for n, s in loaded.state.dense.items()})
        held = from_spec(spec).eval_rows(spec.data.eval_rows)
        steps = max(s.steps for s in loaded.state.dense.values())
        with torch.no_grad():
            h = tower.dense_arch(torch.from_numpy(held.dense))
        return {
            "alive_units": alive_units(tower, held.dense),
            "units": int(h.shape[1]),
            "dense_updates": int(steps),
        }
    return {}


def fault_run(rows: int, work: Path, extra: tuple[str, ...]) -> dict[str, Any]:
    """2 workers + 1 PS; worker 0 killed at 20 %, PS 0 at 45 % of the samples."""
    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster
    from dlrover_core.spec import load_spec
    from dlrover_core.types import NodeResources, ResourcePlan, Role, RolePlan, Stage

    spec = load_spec(str(SMALL), [f"data.rows={rows}", "pacing.pending_timeout_s=240", *extra])
    plan = ResourcePlan(
        RolePlan(2, NodeResources(1000, 1536)),
        RolePlan(1, NodeResources(500, 1536)),
        Stage.COLD_START,
        ("benchmark: 1 PS + 2 workers, faults",),
    )
    killer = Killer([(0.2, Role.WORKER, 0), (0.45, Role.PS, 0)])
    run_dir = work / f"fault-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    rep = JobMaster(spec, run_dir, LocalBackend(), plan=plan, on_tick=killer, tick_s=0.2).run()
    out: dict[str, Any] = {
        "auc": rep.get("auc") if rep.get("auc") is not None else float("nan"),
        "state": rep.get("state"),
        "faults": [f"{r.value}-{i}@{f:.2f}" for r, i, f in killer.done],
        "shards_completed_twice": rep.get("shards_completed_twice"),
        "shards_lost": rep.get("shards_lost"),
        "wall_s": time.perf_counter() - t0,
    }
    out.update(final_model(run_dir, (f"data.rows={rows}", *extra)))
    return out


def one_worker_run(rows: int, work: Path, extra: tuple[str, ...]) -> dict[str, Any]:
    before = set(work.iterdir())
    r: dict[str, Any] = dict(runtime_run(rows, work, 1, extra))
    new = [p for p in work.iterdir() if p not in before]
    if new:
        r.update(final_model(new[0], (f"data.rows={rows}", *extra)))
    return r


def sim_alive(rows: int, staleness: int, seed: int, extra: tuple[str, ...]) -> dict[str, Any]:
    """delayed_run's model after ``rows`` rows: AUC and alive bottom-MLP units."""
    from dlrover_core.spec import load_spec
    from dlrover_core.training.data import from_spec

    spec = load_spec(str(SMALL), [f"data.rows={rows}", *extra])
    held = from_spec(spec).eval_rows(spec.data.eval_rows)
    got: dict[str, Any] = {}
    r = delayed_run(rows, staleness, seed, True, extra, keep=got)
    return {"auc": r["auc"], "alive_units": alive_units(got["tower"], held.dense)}


def _summary(xs: list[float]) -> dict[str, Any]:
    ok = [x for x in xs if x == x]  # NaN: a run without an AUC
    if not ok:
        return {"n": len(xs)}
    return {
        "n": len(xs),
        "min": min(ok),
        "median": statistics.median(ok),
        "max": max(ok),
        "mean": statistics.fmean(ok),
        "collapsed": sum(x < COLLAPSED_AUC for x in ok),
    }


def _fmt(s: dict[str, Any]) -> str:
    if "min" not in s:
        return f"n={s['n']} (no AUC)"
    return (
        f"min {s['min']:.4f} median {s['median']:.4f} max {s['max']:.4f} "
        f"(n={s['n']}, {s['collapsed']} below {COLLAPSED_AUC})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument(
        "--seeds",
        default="",
        help="comma-separated training.seed values: one 1-worker run each instead of --runs "
        "random starts (e.g. 36: a start the PS without the warm-up collapsed on)",
    )
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--fault-runs", type=int, default=3)
    ap.add_argument("--fault-rows", type=int, default=120_000)
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--baseline-threads", type=int, default=1)
    ap.add_argument("--sim-seeds", type=int, default=0)
    ap.add_argument("--sim-rows", type=int, default=30_000)
    ap.add_argument("--sim-staleness", default="0,1,3")
    ap.add_argument("--set", action="append", default=[], help="spec override, e.g. x.y=z")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    extra = tuple(a.set)
    out: dict[str, Any] = {
        "overrides": list(extra),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }

    def save() -> None:
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(out, indent=2) + "\n")

    print(f"overrides {list(extra)}, load average {out['load_before']}", flush=True)
    if a.sim_seeds:
        sim: dict[str, list[dict[str, Any]]] = {}
        for s in [int(x) for x in a.sim_staleness.split(",") if x]:
            runs = sim.setdefault(str(s), [])
            for seed in range(a.sim_seeds):
                runs.append({"seed": seed, **sim_alive(a.sim_rows, s, seed, extra)})
            alive = [r["alive_units"] for r in runs]
            print(
                f"one-process model of the pipeline, staleness {s}, {a.sim_rows:,} rows, "
                f"{a.sim_seeds} seeds: alive bottom-MLP units min {min(alive)} median "
                f"{statistics.median(alive):g} max {max(alive)}; "
                f"{sum(x == 0 for x in alive)} with none alive",
                flush=True,
            )
        out["sim"] = {"rows": a.sim_rows, "runs": sim}
        save()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if a.baseline_runs:
            base = []
            for seed in range(a.baseline_runs):
                r = baseline_run(a.rows, extra, a.baseline_threads, seed=seed)
                base.append({"seed": seed, **r})
                print(f"single process, seed {seed}: AUC {r['auc']:.4f}", flush=True)
            out["baseline"] = {
                "rows": a.rows,
                "runs": base,
                "auc": _summary([r["auc"] for r in base]),
            }
            save()
        seeds = [int(x) for x in a.seeds.split(",") if x]
        starts: list[int | None] = list(seeds) if seeds else [None] * a.runs
        if starts:
            runs = []
            for i, seed in enumerate(starts):
                with_seed = () if seed is None else (f"training.seed={seed}",)
                r = one_worker_run(a.rows, work, (*extra, *with_seed))
                r["seed"] = seed
                runs.append(r)
                start = "random start" if seed is None else f"training.seed={seed}"
                print(
                    f"1 PS + 1 worker, {start}, run {i + 1}/{len(starts)}: AUC {r['auc']:.4f}, "
                    f"alive bottom-MLP units {r.get('alive_units', '?')}",
                    flush=True,
                )
                out["one_worker"] = {"rows": a.rows, "runs": runs}
                save()
            out["one_worker"]["auc"] = _summary([r["auc"] for r in runs])
            save()
        if a.fault_runs:
            runs = []
            for i in range(a.fault_runs):
                r = fault_run(a.fault_rows, work, extra)
                runs.append(r)
                print(
                    f"1 PS + 2 workers, worker and PS killed, run {i + 1}/{a.fault_runs}: "
                    f"AUC {r['auc']:.4f} ({r['state']}, faults {r['faults']}), alive "
                    f"bottom-MLP units {r.get('alive_units', '?')}",
                    flush=True,
                )
                out["faults"] = {"rows": a.fault_rows, "runs": runs}
                save()
            out["faults"]["auc"] = _summary([r["auc"] for r in runs])
            if a.baseline_runs and a.fault_rows != a.rows:  # the single process on these rows
                base = []
                for seed in range(a.baseline_runs):
                    r = baseline_run(a.fault_rows, extra, a.baseline_threads, seed=seed)
                    base.append({"seed": seed, **r})
                    print(f"single process, {a.fault_rows:,} rows, seed {seed}: AUC {r['auc']:.4f}")
                out["baseline_fault_rows"] = {
                    "rows": a.fault_rows,
                    "runs": base,
                    "auc": _summary([r["auc"] for r in base]),
                }
            save()
    for key, title in (
        ("baseline", "single process"),
        ("one_worker", "1 PS + 1 worker"),
        ("faults", "1 PS + 2 workers, kills"),
        ("baseline_fault_rows", "single process on the kill runs' rows"),
    ):
        if key in out and "auc" in out[key]:
            print(f"{title}: AUC {_fmt(out[key]['auc'])}")
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
