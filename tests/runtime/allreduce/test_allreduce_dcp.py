"""Resharded DCP load: a checkpoint saved by 2 gloo ranks (table-wise) loads into 1 rank
(column-wise plan) and into the one-process model with every weight and optimizer state equal
to what the ranks held."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlrover_core.runtime.strategies.allreduce.launch import RANK_ENV, free_port

ROOT = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).with_name("dcp_ranks.py")


def run_ranks(world: int, mode: str, ckpt: Path, dump: Path, sharding: str) -> None:
    dump.mkdir(parents=True, exist_ok=True)
    rdzv = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPER), mode, str(ckpt), str(dump), sharding],
            env={
                **os.environ,
                **RANK_ENV,
                "PYTHONPATH": str(ROOT),
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "RDZV": rdzv,
                "OMP_NUM_THREADS": "1",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for r in range(world)
    ]
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-2000:]


def assembled(dump: Path) -> dict[str, np.ndarray]:
    """Tensor name -> full value, from every rank's pieces (row/column offsets)."""
    parts: dict[str, list[tuple[tuple[int, int] | None, np.ndarray]]] = {}
    for f in sorted(dump.glob("rank*.npz")):
        z = np.load(f)
        for key in z.files:
            name, _, off = key.partition("@")
            where = None if off == "full" else tuple(int(x) for x in off.split(","))
            parts.setdefault(name, []).append((where, z[key]))  # type: ignore[arg-type]
    out = {}
    for name, ps in parts.items():
        if ps[0][0] is None:
            out[name] = ps[0][1]
            continue
        rows = max(o[0] + a.shape[0] for o, a in ps)  # type: ignore[index]
        cols = max(o[1] + a.shape[1] for o, a in ps)  # type: ignore[index]
        full = np.full((rows, cols), np.nan, np.float32)
        for (r, c), a in ps:  # type: ignore[misc]
            full[r : r + a.shape[0], c : c + a.shape[1]] = a
        out[name] = full
    return out


@pytest.mark.slow
def test_saved_at_two_ranks_loads_resharded_at_one_and_in_one_process(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    run_ranks(2, "save", ckpt, tmp_path / "saved", "table_wise")
    run_ranks(1, "load", ckpt, tmp_path / "loaded", "column_wise")
    saved, loaded = assembled(tmp_path / "saved"), assembled(tmp_path / "loaded")
    tables = [k for k in saved if k.startswith("model/ebc.")]
    momenta = [k for k in saved if "momentum" in k]
    assert len(tables) == 3 and len(momenta) == 3 and any("tower" in k for k in saved)
    assert set(saved) == set(loaded)
    for k in saved:
        assert not np.isnan(saved[k]).any(), k  # every row and column was held by a rank
        np.testing.assert_array_equal(saved[k], loaded[k], err_msg=k)
    assert any(np.abs(saved[k]).sum() > 0 for k in momenta)  # training left optimizer state

    from dlrover_core.runtime.strategies.allreduce.checkpoint import load_local_model
    from dlrover_core.spec import load_spec
    from tests.runtime.allreduce.dcp_ranks import SPEC

    model = load_local_model(load_spec(SPEC), ckpt)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), saved[f"model/{name}"], err_msg=name)
