"""Throughput of the PS runtime against a single-process torchrec DLRM, same run, same cores.

    python benchmarks/runtime_throughput.py [--rows 400000] [--json OUT]

Runtime: `dlrover-rm train` of pipelines/specs/small.yaml with a fixed plan of 1 PS + 1 worker
(real processes, gRPC), throughput = the master's steady windows. Baseline: the same model
(torchrec EmbeddingBagCollection + the same dense tower), the same synthetic rows, batch size
and Adagrad, trained in one process with all cores. Both generate their data as they go.
Prints both, the ratio, and where a worker step goes (a profile of the runtime's worker step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMALL = Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml"


def runtime_sps(rows: int, work: Path) -> dict[str, float]:
    from dlrover_core import api
    from dlrover_core.types import NodeResources, ResourcePlan, RolePlan, Stage

    # the machine's cores split between the two processes (the baseline gets them all)
    half = max(1, (os.cpu_count() or 2) // 2)
    plan = ResourcePlan(
        RolePlan(1, NodeResources(1000 * half, 2048)),
        RolePlan(1, NodeResources(1000 * half, 2048)),
        Stage.COLD_START,
        ("benchmark: 1 PS + 1 worker",),
    )
    over = [f"data.rows={rows}", "pacing.sample_window_s=1", "pacing.heartbeat_interval_s=0.5"]
    t0 = time.perf_counter()
    rep = api.train(
        str(SMALL), overrides=over, plan=plan.to_dict(), run_dir=work / "rt", progress=False
    )
    wall = time.perf_counter() - t0
    tl = [json.loads(x) for x in (work / "rt" / "timeline.jsonl").read_text().splitlines()]
    steady = [r["throughput_sps"] for r in tl if r["workers"] >= 1 and r["throughput_sps"] > 0]
    steady = steady[1:] or steady  # the first window includes start-up
    return {
        "steady_sps": sum(steady) / len(steady),
        "end_to_end_sps": rows / wall,
        "wall_s": wall,
        "auc": rep["auc"] or float("nan"),
    }


def baseline_sps(rows: int) -> dict[str, float]:
    import torch

    from dlrover_core.spec import load_spec
    from dlrover_core.training.data import from_spec
    from dlrover_core.training.model import LocalDLRM, feature_keys, tensors, to_kjt

    spec = load_spec(str(SMALL), [f"data.rows={rows}"])
    torch.set_num_threads(os.cpu_count() or 2)
    torch.manual_seed(0)
    model = LocalDLRM(spec.model)
    opt = torch.optim.Adagrad(model.parameters(), lr=spec.training.optimizer.lr)
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
            dense, labels = tensors(part)
            opt.zero_grad()
            loss = loss_fn(model(dense, to_kjt(part.sparse, keys)), labels)
            loss.backward()
            opt.step()
            done += len(part)
    wall = time.perf_counter() - t0
    return {"sps": done / wall, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rt = runtime_sps(a.rows, Path(tmp))
    base = baseline_sps(a.rows)
    ratio = rt["steady_sps"] / base["sps"]
    print(
        f"PS runtime, 1 PS + 1 worker : {rt['steady_sps']:10,.0f} samples/s steady "
        f"({rt['end_to_end_sps']:,.0f}/s end to end incl. start-up, AUC {rt['auc']:.3f})"
    )
    print(f"single-process torchrec DLRM: {base['sps']:10,.0f} samples/s")
    print(f"ratio (steady runtime / baseline): {ratio:.2f}  (target >= 0.7)")
    out = {"rows": a.rows, "runtime": rt, "baseline": base, "ratio": ratio}
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
