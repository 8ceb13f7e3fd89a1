"""A PS as a real process: address file, serving, SIGTERM (final checkpoint, exit 0), SIGKILL and
a relaunch that restores the last checkpoint, and a re-sharding start from old PS checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dlrover_core.runtime import wire
from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps.client import PSClient
from dlrover_core.runtime.strategies.ps.server import addr_path, checkpoint_dir, read_addr
from dlrover_core.runtime.strategies.ps.shard import PSShard

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"emb": 8}


def _start(run_dir: Path, index: int = 0, num_ps: int = 1, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "dlrover_core.runtime.strategies.ps.server",
        "--run-dir",
        str(run_dir),
        "--index",
        str(index),
        "--num-ps",
        str(num_ps),
        *extra,
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)


def _wait_addr(
    run_dir: Path, proc: subprocess.Popen[bytes], index: int = 0, path: Path | None = None
) -> dict[str, object]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        info = read_addr(path or addr_path(run_dir, index))
        if info is not None and info.get("pid") == proc.pid:
            return info
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"PS exited with {proc.returncode}: {err}")
        time.sleep(0.05)
    raise AssertionError("PS did not write its address file within 20 s")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    wire.create_token(tmp_path)
    return tmp_path


def test_ps_process_serves_and_exits_cleanly_on_sigterm(run_dir: Path) -> None:
    proc = _start(run_dir, 0, 1, "--checkpoint-every-s", "0")
    try:
        info = _wait_addr(run_dir, proc)
        assert info["index"] == 0 and info["num_ps"] == 1 and info["restored_step"] == 0
        assert (run_dir / "token").stat().st_mode & 0o077 == 0
        token = wire.read_token(run_dir)
        with PSClient([str(info["address"])], token, TABLES) as c:
            ids = np.arange(64)
            rows = c.pull("emb", ids)
            c.push("emb", ids, np.ones_like(rows))
            after = c.pull("emb", ids)
            _print_latency(c)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
    loaded = ckpt.load_latest(checkpoint_dir(run_dir, 0))
    assert loaded is not None and loaded.info.step >= 1  # the final checkpoint
    t = loaded.state.tables["emb"]
    assert np.array_equal(t.weights[np.argsort(t.ids)][:64], after)
    assert not addr_path(run_dir, 0).exists()  # a stopped PS leaves no stale address


def _print_latency(c: PSClient) -> None:
    """Measured, not asserted: one step over a real process boundary."""
    tables = {f"t{k}": 16 for k in range(8)}
    c.tables.update(tables)
    rng = np.random.default_rng(0)
    times = []
    for step in range(40):
        ids = {n: rng.zipf(1.2, 512) % 100_000 for n in tables}
        t0 = time.perf_counter()
        rows = c.pull_many(ids)
        c.push_many({n: (ids[n], np.ones_like(rows[n])) for n in tables})
        if step >= 10:
            times.append(time.perf_counter() - t0)
    print(
        f"\nPS process, 8 tables x 512 ids x dim 16: pull+push median "
        f"{np.median(times) * 1e3:.2f} ms"
    )


def test_sigkilled_ps_restarts_from_its_last_checkpoint(run_dir: Path) -> None:
    proc = _start(run_dir, 0, 1, "--checkpoint-every-s", "0.2")
    token = wire.read_token(run_dir)
    try:
        info = _wait_addr(run_dir, proc)
        with PSClient([str(info["address"])], token, TABLES) as c:
            ids = np.arange(1000)
            c.push("emb", ids, np.full((1000, 8), 0.5, np.float32))
            c.push("emb", ids[:10], np.full((10, 8), 0.5, np.float32))
            saved = c.pull("emb", ids)
            deadline = time.monotonic() + 10  # wait for a periodic checkpoint with both pushes
            while time.monotonic() < deadline:
                lc = ckpt.load_latest(checkpoint_dir(run_dir, 0))
                if lc is not None and lc.info.step == 2:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("no periodic checkpoint at step 2 within 10 s")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()

    again = _start(run_dir, 0, 1, "--checkpoint-every-s", "0")
    try:
        info2 = _wait_addr(run_dir, again)
        assert info2["restored_step"] == 2 and info2["restored_rows"] == 1000
        assert str(info2["restored_from"]).startswith("own:")
        with PSClient([str(info2["address"])], token, TABLES) as c:
            assert np.array_equal(c.pull("emb", ids), saved)
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=15) == 0


def test_new_ps_set_reshards_from_old_checkpoints(run_dir: Path) -> None:
    """1 PS → 2 PS: the new set starts from the old PS's checkpoint, with separate dirs."""
    token = wire.read_token(run_dir)
    old = _start(run_dir, 0, 1, "--checkpoint-every-s", "0")
    try:
        info = _wait_addr(run_dir, old)
        with PSClient([str(info["address"])], token, TABLES) as c:
            ids = np.arange(500)
            c.push("emb", ids, np.full((500, 8), 0.1, np.float32))
            c.init_dense({"w": np.ones(4)})
            before = c.pull("emb", ids)
            (res,) = c.checkpoint()
        old_dir = Path(str(res["path"])).parent
        # the new set runs next to the old one: it needs its own checkpoint dirs and addr files
        new = [
            _start(
                run_dir,
                i,
                2,
                "--restore-from",
                str(old_dir),
                "--checkpoint-every-s",
                "0",
                "--ckpt-dir",
                str(run_dir / "ps" / f"gen2-{i}"),
                "--addr-file",
                str(run_dir / "ps" / f"gen2-{i}.addr"),
            )
            for i in range(2)
        ]
        infos = [
            _wait_addr(run_dir, p, path=run_dir / "ps" / f"gen2-{i}.addr")
            for i, p in enumerate(new)
        ]
    finally:
        old.send_signal(signal.SIGTERM)
        assert old.wait(timeout=15) == 0
    try:
        assert sum(int(str(i["restored_rows"])) for i in infos) == 500
        with PSClient([str(i["address"]) for i in infos], token, TABLES) as c:
            assert np.array_equal(c.pull("emb", ids), before)
            assert c.pull_dense()["w"].tolist() == [1.0] * 4
    finally:
        for p in new:
            p.send_signal(signal.SIGTERM)
        for p in new:
            assert p.wait(timeout=15) == 0


def test_ps_with_corrupt_only_checkpoint_exits_1_with_a_clear_message(run_dir: Path) -> None:
    s_dir = checkpoint_dir(run_dir, 0)
    info = ckpt.save(PSShard(), s_dir)
    info.path.write_bytes(b"garbage")
    proc = _start(run_dir, 0, 1)
    assert proc.wait(timeout=20) == 1
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "no usable checkpoint" in err and "corrupt" in err
    assert json.loads(info.manifest_path.read_text())["step"] == 0
