"""Throughput of 2 all-reduce ranks against single-process DMP on the same cores, same run.

    python benchmarks/allreduce_throughput.py [--rows 200000] [--repeats 2] [--json OUT]

Both run pipelines/specs/small-allreduce.yaml through the same agent against a real master
(shards from the queue, heartbeats, one final DCP checkpoint): "1 rank" is torchrec
DistributedModelParallel in one process with torch threads = the machine's cores; "2 ranks"
is two gloo processes with cores/2 threads each (table-wise/column-wise/data-parallel as the
torchrec planner chooses). Per rank the batch is 256, so the 2-rank group steps 512 rows.
Throughput = training rows / (first step -> last step) on rank 0. Runs alternate
(1, 2, 1, 2, ...) so load from other processes hits both; the table gives each run and the
ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from allreduce_common import event_t, spec_dict, table, write_json

from dlrover_core.allreduce_config import AllReduceOptions
from dlrover_core.runtime.strategies.allreduce.launch import LocalGroupHarness


def one_run(world: int, rows: int, work: Path) -> dict[str, float]:
    cores = os.cpu_count() or 2
    threads = max(1, cores // world)
    d = spec_dict(**{"data.rows": rows, "data.eval_rows": 0})
    opts = AllReduceOptions(checkpoint_interval_s=1e6)  # one checkpoint, at the end
    with LocalGroupHarness(work, d, options=opts, threads=threads) as h:
        t0 = time.monotonic()
        h.launch(world)
        codes = h.wait(timeout=900)
        wall = time.monotonic() - t0
        if codes != [0] * world:
            raise RuntimeError(f"ranks exited {codes}: {[rp.stderr[-3:] for rp in h.ranks]}")
        s = h.shards()
        assert s["done"] == s["total"] and s["completed_twice"] == 0, s
        r0 = h.ranks[0]
        train_s = event_t(r0, "done_seen") - event_t(r0, "ready")
        return {
            "world_size": world,
            "threads_per_rank": threads,
            "rows": rows,
            "train_s": train_s,
            "throughput_sps": rows / train_s,
            "wall_s": wall,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for world in (1, 2):
                r = one_run(world, a.rows, Path(tmp) / f"run{i}-{world}")
                r["repeat"] = i
                runs.append(r)
                print(f"  {world} rank(s): {r['throughput_sps']:.0f} samples/s", flush=True)
    med = {
        w: statistics.median(r["throughput_sps"] for r in runs if r["world_size"] == w)
        for w in (1, 2)
    }
    print(
        table(
            [
                [
                    r["repeat"],
                    r["world_size"],
                    r["threads_per_rank"],
                    r["train_s"],
                    round(r["throughput_sps"]),
                ]
                for r in runs
            ],
            ["repeat", "ranks", "threads/rank", "train s", "samples/s"],
        )
    )
    ratio = med[2] / med[1]
    print(
        f"median: 1 rank {med[1]:.0f} samples/s, 2 ranks {med[2]:.0f} samples/s, "
        f"ratio 2/1 = {ratio:.2f} (cores: {os.cpu_count()})"
    )
    write_json(
        a.json,
        {"runs": runs, "median_sps": med, "ratio_2_over_1": ratio, "cpu_count": os.cpu_count()},
    )


if __name__ == "__main__":
    main()
