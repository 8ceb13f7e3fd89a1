"""Throughput of the PS runtime against a single-process torchrec DLRM, same run, same cores.

    python benchmarks/runtime_throughput.py [--rows 400000] [--repeats 1]
        [--scaling [--scaling-repeats 1]]
        [--accuracy [--accuracy-rows 800000 --accuracy-runs 3 --accuracy-workers 1]]
        [--delay-sim S [--delay-seeds 0,1,2,3]] [--set training.transfer=bf16] [--json OUT]

Runtime: `dlrover-rm train` of pipelines/specs/small.yaml with a fixed plan of 1 PS + 1 worker
(real processes, gRPC, one core each), throughput = the master's steady windows (and end to
end, start-up included). Baseline: the same model (torchrec EmbeddingBagCollection + the same
dense tower), the same synthetic rows, batch size and optimizer (training.optimizer), trained in
one process with all cores. Runtime and baseline alternate ``--repeats`` times, so a machine
whose load changes meanwhile shows up as spread instead of as a biased ratio.

Also printed: where a worker step goes (benchmarks/ps_step.py: 1 PS + 1 in-process worker);
``--scaling``: 2 workers + 1 PS against 1 worker + 1 PS on the same total cores (throughput in
total and per worker); ``--accuracy``: held-out AUC of the runtime and of the single-process
model trained on the same rows (one epoch), ``--accuracy-runs`` each, with their spread
(``--accuracy-workers 2``: the runtime with 2 workers); ``--delay-sim S``: the same model and rows
in one process with torch's Adagrad, each step computed on parameters lacking the last
``min(k, S)`` updates of its shard, as the worker pipeline does with ``training.staleness=S``,
with and without the PS's lr/τ for stale dense gradients (held-out AUC per seed).
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

SMALL = Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml"


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def runtime_run(
    rows: int, work: Path, workers: int = 1, extra: tuple[str, ...] = ()
) -> dict[str, float]:
    from dlrover_core import api
    from dlrover_core.types import NodeResources, ResourcePlan, RolePlan, Stage

    # the cores split: half to the PS, half shared by the workers (the baseline gets them all)
    half = max(1, _cores() // 2)
    plan = ResourcePlan(
        RolePlan(workers, NodeResources(1000 * half // workers, 2048)),
        RolePlan(1, NodeResources(1000 * half, 2048)),
        Stage.COLD_START,
        (f"benchmark: 1 PS + {workers} worker(s)",),
    )
    over = [
        f"data.rows={rows}",
        "pacing.sample_window_s=1",
        "pacing.heartbeat_interval_s=0.5",
        # pinned: the live planner must not change the configuration being measured
        f"constraints.workers.max={max(2, workers)}",
        f"constraints.workers.count={workers}",
        "constraints.ps.count=1",
        f"constraints.workers.cpu={half / workers}",
        f"constraints.ps.cpu={half}",
        "constraints.workers.memory=2048Mi",
        "constraints.ps.memory=2048Mi",
        *extra,
    ]
    run_dir = work / f"rt-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    rep = api.train(
        str(SMALL), overrides=over, plan=plan.to_dict(), run_dir=run_dir, progress=False
    )
    wall = time.perf_counter() - t0
    tl = [json.loads(x) for x in (run_dir / "timeline.jsonl").read_text().splitlines()]
    steady = [
        r["throughput_sps"] for r in tl if r["workers"] >= workers and r["throughput_sps"] > 0
    ]
    steady = steady[1:] or steady  # the first window includes start-up
    return {
        "steady_sps": sum(steady) / len(steady) if steady else float("nan"),
        "end_to_end_sps": rows / wall,
        "wall_s": wall,
        "auc": rep["auc"] if rep.get("auc") is not None else float("nan"),
    }


def baseline_run(
    rows: int, extra: tuple[str, ...] = (), threads: int | None = None, seed: int = 0
) -> dict[str, float]:
    import torch

    from dlrover_core.spec import load_spec
    from dlrover_core.training.data import from_spec
    from dlrover_core.training.model import LocalDLRM, evaluate, feature_keys, tensors, to_kjt

    spec = load_spec(str(SMALL), [f"data.rows={rows}", *extra])
    torch.set_num_threads(threads or _cores())
    torch.manual_seed(seed)
    model = LocalDLRM(spec.model)
    lr = spec.training.optimizer.lr
    name = spec.training.optimizer.name
    tables = [p for n, p in model.named_parameters() if n.startswith("ebc.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("ebc.")]
    opts: list[torch.optim.Optimizer]
    if name == "adam":  # sparse rows: SparseAdam, as the PS does
        opts = [torch.optim.SparseAdam(tables, lr=lr), torch.optim.Adam(dense, lr=lr)]
    elif name == "sgd":
        opts = [torch.optim.SGD(model.parameters(), lr=lr)]
    else:
        opts = [torch.optim.Adagrad(model.parameters(), lr=lr)]
    loss_fn = torch.nn.BCEWithLogitsLoss()
    keys = feature_keys(spec.model)
    src = from_spec(spec)
    bs = spec.training.batch_size
    shard = spec.shard_size
    t0 = time.perf_counter()
    done = 0
    for start in range(0, rows, shard):
        batch = src.rows(start, min(rows, start + shard))
        for part in batch.split(bs):
            d, labels = tensors(part)
            for o in opts:
                o.zero_grad()
            loss = loss_fn(model(d, to_kjt(part.sparse, keys)), labels)
            loss.backward()
            for o in opts:
                o.step()
            done += len(part)
    wall = time.perf_counter() - t0
    auc, _ = evaluate(model.tower, model.lookup, src.eval_rows(spec.data.eval_rows))
    return {"sps": done / wall, "wall_s": wall, "auc": auc}


def delayed_run(
    rows: int,
    staleness: int,
    seed: int,
    scale_dense: bool,
    extra: tuple[str, ...] = (),
    keep: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Delayed-update Adagrad in one process (torch), the worker pipeline's staleness rule:
    step k of a shard computes on parameters lacking this shard's last ``min(k, staleness)``
    updates; a shard ends with all of them applied. ``scale_dense``: a dense gradient τ > 1
    updates old gets lr/τ, as the PS applies it; dense update k gets
    lr·min(1, k / training.dense_warmup), as the PS applies it. Same model, init (the PS's row
    init, the worker's tower from ``seed``), rows and optimizer as the runtime; returns
    held-out AUC (``keep``: filled with the trained ``tower``)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from dlrover_core.runtime.strategies.ps.step import embedding_ids, table_rows
    from dlrover_core.runtime.strategies.ps.store import init_rows
    from dlrover_core.spec import load_spec
    from dlrover_core.training.data import from_spec
    from dlrover_core.training.model import DenseTower, evaluate, feature_keys

    spec = load_spec(str(SMALL), [f"data.rows={rows}", *extra])
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    tower = DenseTower(spec.model)
    reader = DenseTower(spec.model)
    reader.load_state_dict(tower.state_dict())
    names, trows, dim = feature_keys(spec.model), table_rows(spec), spec.model.embedding_dim
    src = from_spec(spec)
    held_out = src.eval_rows(spec.data.eval_rows)
    ids = [src.rows(0, rows).sparse, held_out.sparse]
    keys = [
        np.unique(np.concatenate([embedding_ids(a, trows)[f] for a in ids]))
        for f in range(len(names))
    ]
    tables = [
        torch.nn.Parameter(torch.from_numpy(init_rows(n, k, dim)))
        for n, k in zip(names, keys, strict=True)
    ]
    seen = [t.detach().clone() for t in tables]
    lr = spec.training.optimizer.lr
    opt = torch.optim.Adagrad([{"params": tables}, {"params": list(tower.parameters())}], lr=lr)
    warmup, updates = spec.training.dense_warmup, 0

    def index(sparse: Any) -> list[torch.Tensor]:
        cols = embedding_ids(sparse, trows)
        return [torch.from_numpy(np.searchsorted(keys[f], c)) for f, c in enumerate(cols)]

    def catch_up(d: Any) -> None:
        with torch.no_grad():
            for f, (i, x) in enumerate(d[0]):
                seen[f][i] += x
            for p, x in zip(reader.parameters(), d[1], strict=True):
                p += x

    t0 = time.perf_counter()
    for start in range(0, rows, spec.shard_size):
        delayed: list[Any] = []
        for part in src.rows(start, min(rows, start + spec.shard_size)).split(
            spec.training.batch_size
        ):
            idx = index(part.sparse)
            leaves = [seen[f][i].clone().requires_grad_(True) for f, i in enumerate(idx)]
            reader.zero_grad(set_to_none=True)
            logits = reader(torch.from_numpy(part.dense), torch.stack(leaves, 1))
            F.binary_cross_entropy_with_logits(logits, torch.from_numpy(part.labels)).backward()
            for f, t in enumerate(tables):
                t.grad = torch.sparse_coo_tensor(idx[f][None], leaves[f].grad, t.shape)
            for p, q in zip(tower.parameters(), reader.parameters(), strict=True):
                p.grad = q.grad
            tau = len(delayed)
            updates += 1
            ramp = min(1.0, updates / warmup) if warmup else 1.0
            opt.param_groups[1]["lr"] = ramp * (lr / tau if scale_dense and tau > 1 else lr)
            with torch.no_grad():
                touched = [torch.unique(i) for i in idx]
                before = [t[i].clone() for t, i in zip(tables, touched, strict=True)]
                dense_before = [p.detach().clone() for p in tower.parameters()]
                opt.step()
                delayed.append(
                    (
                        [(i, t[i] - b) for t, i, b in zip(tables, touched, before, strict=True)],
                        [
                            p.detach() - b
                            for p, b in zip(tower.parameters(), dense_before, strict=True)
                        ],
                    )
                )
            while len(delayed) > staleness:
                catch_up(delayed.pop(0))
        for d in delayed:  # the shard's flush
            catch_up(d)

    def lookup(sparse: Any) -> torch.Tensor:
        return torch.stack([tables[f].detach()[i] for f, i in enumerate(index(sparse))], 1)

    auc, _ = evaluate(tower, lookup, held_out)
    if keep is not None:
        keep["tower"] = tower
    return {"auc": auc, "wall_s": time.perf_counter() - t0}


def _spread(xs: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(xs),
        "min": min(xs),
        "max": max(xs),
        "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "n": len(xs),
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--breakdown-rows", type=int, default=60_000)
    ap.add_argument("--scaling", action="store_true")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--accuracy-rows", type=int, default=800_000)
    ap.add_argument("--accuracy-runs", type=int, default=3)
    ap.add_argument("--accuracy-workers", type=int, default=1, help="workers of the runtime")
    ap.add_argument("--scaling-repeats", type=int, default=1)
    ap.add_argument(
        "--delay-sim",
        type=int,
        default=None,
        metavar="S",
        help="one-process delayed-update Adagrad with staleness S (see the module docstring)",
    )
    ap.add_argument("--delay-seeds", default="0,1,2,3")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument(
        "--baseline-threads",
        type=int,
        default=None,
        help="torch threads of the baseline (default: all cores; on a saturated machine 2 "
        "OpenMP threads collapsed to ~700 samples/s, 1 thread ran at ~20k)",
    )
    ap.add_argument("--set", action="append", default=[], help="spec override, e.g. x.y=z")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    extra = tuple(a.set)
    out: dict[str, Any] = {"rows": a.rows, "overrides": list(extra), "load_before": _load()}
    print(f"machine: {_cores()} cores, load average {out['load_before']} (shared machine)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not a.skip_throughput:
            rts, bases = [], []
            for _ in range(a.repeats):
                rts.append(runtime_run(a.rows, work, 1, extra))
                bases.append(baseline_run(a.rows, extra, a.baseline_threads))
            ratios = [r["steady_sps"] / b["sps"] for r, b in zip(rts, bases, strict=True)]
            e2e = [r["end_to_end_sps"] / b["sps"] for r, b in zip(rts, bases, strict=True)]
            out.update(runtime=rts, baseline=bases, ratio=_spread(ratios), e2e_ratio=_spread(e2e))
            for r, b, q in zip(rts, bases, ratios, strict=True):
                print(
                    f"PS runtime, 1 PS + 1 worker : {r['steady_sps']:10,.0f} samples/s steady "
                    f"({r['end_to_end_sps']:,.0f}/s end to end incl. start-up, AUC {r['auc']:.3f})"
                )
                print(f"single-process torchrec DLRM: {b['sps']:10,.0f} samples/s")
                print(f"ratio (steady runtime / baseline): {q:.2f}  (target >= 0.8)")
            if a.repeats > 1:
                s = out["ratio"]
                print(f"ratio over {s['n']} runs: {s['mean']:.2f} ({s['min']:.2f}-{s['max']:.2f})")

            from benchmarks.ps_step import format_breakdown, measure

            bd = measure(a.breakdown_rows, overrides=extra)
            out["step_breakdown"] = bd
            print(
                f"worker step (1 PS + 1 in-process worker, {bd['samples_per_s']:,.0f} samples/s): "
                + format_breakdown(bd)
            )
        if a.scaling:
            ones, twos = [], []
            for _ in range(a.scaling_repeats):
                ones.append(runtime_run(a.rows, work, 1, extra))
                twos.append(runtime_run(a.rows, work, 2, extra))
            one, two = ones[0], twos[0]
            qs = [t["steady_sps"] / o["steady_sps"] for o, t in zip(ones, twos, strict=True)]
            out["scaling"] = {
                "1w": one,
                "2w": two,
                "runs": {"1w": ones, "2w": twos},
                "ratio": _spread(qs),
                "auc": {
                    "1w": _spread([r["auc"] for r in ones]),
                    "2w": _spread([r["auc"] for r in twos]),
                },
            }
            for o, t, q in zip(ones, twos, qs, strict=True):
                for k, r, n in (("1 worker ", o, 1), ("2 workers", t, 2)):
                    print(
                        f"scaling, 1 PS + {k}: {r['steady_sps']:9,.0f} samples/s steady "
                        f"({r['steady_sps'] / n:,.0f} per worker), AUC {r['auc']:.3f}"
                    )
                print(f"scaling ratio 2w/1w on the same cores: {q:.2f}")
        if a.delay_sim is not None:
            seeds = [int(x) for x in a.delay_seeds.split(",") if x]
            sim: dict[str, list[float]] = {"unscaled": [], "lr_over_tau": []}
            for seed in seeds:
                for key, scale in (("unscaled", False), ("lr_over_tau", True)):
                    r = delayed_run(a.rows, a.delay_sim, seed, scale, extra)
                    sim[key].append(r["auc"])
                    print(
                        f"delayed Adagrad in one process, staleness {a.delay_sim}, seed {seed}, "
                        f"dense lr {'/ tau' if scale else 'unscaled'}: AUC {r['auc']:.4f}"
                    )
            out["delay_sim"] = {"staleness": a.delay_sim, "seeds": seeds, "auc": sim}
        if a.accuracy:
            rt_auc, base_auc = [], []
            for _ in range(a.accuracy_runs):
                rt_auc.append(runtime_run(a.accuracy_rows, work, a.accuracy_workers, extra)["auc"])
                base_auc.append(baseline_run(a.accuracy_rows, extra, a.baseline_threads)["auc"])
            out["accuracy"] = {
                "rows": a.accuracy_rows,
                "workers": a.accuracy_workers,
                "runtime_auc": _spread(rt_auc),
                "baseline_auc": _spread(base_auc),
                "runs": {"runtime": rt_auc, "baseline": base_auc},
            }
            ra, ba = out["accuracy"]["runtime_auc"], out["accuracy"]["baseline_auc"]
            print(
                f"held-out AUC, {a.accuracy_rows:,} rows, one epoch, {a.accuracy_runs} runs each: "
                f"runtime ({a.accuracy_workers} worker(s)) {ra['mean']:.4f} "
                f"({ra['min']:.4f}-{ra['max']:.4f}), "
                f"single process {ba['mean']:.4f} ({ba['min']:.4f}-{ba['max']:.4f}), "
                f"difference {ra['mean'] - ba['mean']:+.4f} (bound 0.01)"
            )
    out["load_after"] = _load()
    print(f"load average after: {out['load_after']}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
