"""Where a PS-runtime worker step goes: one PS process + one in-process worker, pinned to one
core each, against an in-process master service (real gRPC everywhere).

    python benchmarks/ps_step.py [--rows 100000] [--staleness 1] [--transfer fp32]
        [--optimizer adagrad] [--profile OUT.prof] [--json OUT]

Prints samples/s and the worker's :class:`~dlrover_core.runtime.strategies.ps.step.StepTimes`
per step: ``plan`` (dedup + routing), ``wait`` (blocked on a PS reply), ``compute``
(forward/backward), ``flush`` (drain before a shard is reported), and ``exchange`` (the round
trips' own time, in the background when staleness > 0). ``--profile`` writes a cProfile of the
worker's thread.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMALL = Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml"


def _cores() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[0], cpus[-1]


def measure(
    rows: int,
    staleness: int = 1,
    transfer: str = "fp32",
    optimizer: str = "adagrad",
    profile: Path | None = None,
    overrides: tuple[str, ...] = (),
) -> dict[str, Any]:
    import torch

    from dlrover_core.runtime import wire
    from dlrover_core.runtime.service import MasterState, serve_master
    from dlrover_core.runtime.strategies.ps.client import PSClient
    from dlrover_core.runtime.strategies.ps.server import read_addr
    from dlrover_core.runtime.strategies.ps.step import evaluate_on_ps
    from dlrover_core.runtime.strategies.ps.worker import SPEC_FILE, Worker
    from dlrover_core.spec import load_spec, spec_to_dict

    spec = load_spec(
        str(SMALL),
        [
            f"data.rows={rows}",
            f"training.staleness={staleness}",
            f"training.transfer={transfer}",
            f"training.optimizer.name={optimizer}",
            *overrides,
        ],
    )
    worker_cpu, ps_cpu = _cores()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        token = wire.create_token(run)
        (run / SPEC_FILE).write_text(json.dumps(spec_to_dict(spec)))
        ps = subprocess.Popen(
            [
                "taskset",
                "-c",
                str(ps_cpu),
                sys.executable,
                "-m",
                "dlrover_core.runtime.strategies.ps.server",
                "--run-dir",
                str(run),
                "--index",
                "0",
                "--num-ps",
                "1",
                "--checkpoint-every-s",
                "0",
                "--lr",
                str(spec.training.optimizer.lr),
                "--threads",
                "2",
            ],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stderr=subprocess.DEVNULL,
        )
        state = MasterState(run, total_rows=rows, shard_size=spec.shard_size)
        server, port = serve_master(state, token)
        before = os.sched_getaffinity(0)
        try:
            deadline = time.monotonic() + 60
            addr = None
            while addr is None:
                if time.monotonic() > deadline or ps.poll() is not None:
                    raise RuntimeError("the PS process did not start")
                time.sleep(0.05)
                addr = read_addr(run / "ps" / "ps-0.addr")
            state.set_ps_set([addr["address"]], 1)
            os.sched_setaffinity(0, {worker_cpu})
            torch.set_num_threads(1)
            w = Worker(run, 0, f"127.0.0.1:{port}", threads=1)
            prof = cProfile.Profile() if profile else None
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            rc = w.run()
            if prof:
                prof.disable()
                prof.dump_stats(str(profile))
            wall = time.perf_counter() - t0
            os.sched_setaffinity(0, before)
            if rc != 0:
                raise RuntimeError(f"the worker exited {rc}: {w.exit_reason}")
            tables = {t.name: spec.model.table_dim(t) for t in spec.model.embedding_tables}
            with PSClient([addr["address"]], token, tables) as c:
                auc, _ = evaluate_on_ps(spec, c)
        finally:
            os.sched_setaffinity(0, before)
            server.stop(0)
            state.close()
            ps.terminate()
            ps.wait(30)
    t = w.times
    per_step = {
        k: 1e3 * getattr(t, k) / max(1, t.steps)
        for k in ("plan", "wait", "compute", "flush", "exchange")
    }
    return {
        "rows": rows,
        "staleness": staleness,
        "transfer": transfer,
        "optimizer": optimizer,
        "samples_per_s": w.samples / wall,
        "steps": t.steps,
        "exchanges": t.exchanges,
        "ms_per_step": 1e3 * wall / max(1, t.steps),
        "breakdown_ms_per_step": per_step,
        "auc": auc,
    }


def format_breakdown(r: dict[str, Any]) -> str:
    b = r["breakdown_ms_per_step"]
    return (
        f"{r['ms_per_step']:.2f} ms/step: plan {b['plan']:.2f}, wait for PS {b['wait']:.2f}, "
        f"compute {b['compute']:.2f}, flush {b['flush']:.2f}; round trip {b['exchange']:.2f} "
        f"({'background' if r['staleness'] else 'inline'}); "
        f"{r['exchanges'] / max(1, r['steps']):.2f} round trips/step"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--transfer", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--optimizer", default="adagrad", choices=["adagrad", "adam", "sgd"])
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    r = measure(a.rows, a.staleness, a.transfer, a.optimizer, a.profile)
    print(
        f"1 PS + 1 worker (one core each), staleness {a.staleness}, {a.transfer}: "
        f"{r['samples_per_s']:,.0f} samples/s, AUC {r['auc']:.3f}"
    )
    print("step: " + format_breakdown(r))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
