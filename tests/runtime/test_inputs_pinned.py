"""Inputs pinned (issue 36 item 1): an input file rewritten, truncated, appended to or replaced
while the job reads it fails the job at once, naming the file and the change (exit 1, report
``data.changed``), locally and through an fsspec URL; with ``data.snapshot: true`` the job
trains on the copy it took at the start; a resumed job checks the files it started with.
Real `dlrover-rm train` processes; slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlrover_core.spec import load_spec
from dlrover_core.training.data import drifting_day, file_spec, write_criteo_tsv
from tests.runtime import faultkit as fk

pytestmark = pytest.mark.slow
SMALL = Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml"
ROWS, EVAL = 200_000, 2_000


def write(path: Path, day: int, rows: int) -> None:
    write_criteo_tsv(path, drifting_day(load_spec(SMALL), day, rows - EVAL, EVAL))


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("exports")
    out = {"a": d / "a.tsv", "b": d / "b.tsv"}
    write(out["a"], 0, ROWS)
    write(out["b"], 5, 150_000)  # "a regenerated export of 150k rows from another source"
    return out


def start(tmp: Path, data: str, run: Path, *sets: str) -> subprocess.Popen[bytes]:
    spec = file_spec(yaml.safe_load(SMALL.read_text()), data, ROWS - 10_000, EVAL)
    (tmp / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "dlrover_core.cli", "train", "--spec", str(tmp / "spec.json")]
    cmd += ["--run-dir", str(run), "--history", "none"]
    for s in ("pacing.heartbeat_interval_s=0.5", *sets):
        cmd += ["--set", s]
    out = open(tmp / "master.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=fk.env(tmp))


def change(kind: str, path: Path, other: Path) -> None:
    if kind == "rewrite":  # the same path written again, in place, from another source
        path.write_bytes(other.read_bytes())
    elif kind == "truncate":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif kind == "append":
        with open(path, "ab") as f:
            f.write(other.read_bytes()[:100_000])
    elif kind == "replace":  # an upstream step that writes a new file and renames it over
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(other.read_bytes())
        os.replace(tmp, path)
    else:  # "touch-rewrite": same size, same bytes at the edges, new modification time
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def run_and_change(
    tmp: Path, exports: dict[str, Path], kind: str, url: bool, *sets: str
) -> tuple[int, dict[str, Any], float, Path]:
    data = tmp / "input.tsv"
    data.write_bytes(exports["a"].read_bytes())
    run = tmp / "run"
    p = start(tmp, f"file://{data}" if url else str(data), run, *sets)
    try:
        fk.wait_trained(p, tmp, run, 20_000)
        change(kind, data, exports["b"])
        t0 = time.monotonic()
        rc = p.wait(timeout=300)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    fk.assert_no_orphans(run)
    return rc, fk.report(run), took, run


@pytest.mark.parametrize(
    ("kind", "url"),
    [("rewrite", False), ("truncate", False), ("append", True), ("replace", True)],
)
def test_a_changed_input_fails_the_job_at_once(
    tmp_path: Path, exports: dict[str, Path], kind: str, url: bool
) -> None:
    rc, r, took, run = run_and_change(tmp_path, exports, kind, url)
    assert rc == 1 and r["state"] == "failed", (rc, r.get("failure"))
    assert "input.tsv changed since the job started" in r["failure"], r["failure"]
    assert r["data"]["changed"][0]["file"].endswith("input.tsv"), r["data"]
    assert r.get("model_dir") is None and not (run / "model").exists()  # nothing published
    assert took < 15, took  # the change to the failure (a stat every 0.5 s, then the stop)


def test_a_snapshot_trains_on_the_copy_taken_at_the_start(
    tmp_path: Path, exports: dict[str, Path]
) -> None:
    rc, r, _, run = run_and_change(tmp_path, exports, "replace", False, "data.snapshot=true")
    assert rc == 0, r.get("failure")
    fk.check_exactly_once(r)
    assert r["data"]["files"][0]["records"] == ROWS - 10_000 and "changed" not in r["data"]
    assert (run / "data-snapshot" / "input.tsv").read_bytes() == exports["a"].read_bytes()


def test_a_resumed_job_checks_the_files_it_started_with(
    tmp_path: Path, exports: dict[str, Path]
) -> None:
    data = tmp_path / "input.tsv"
    data.write_bytes(exports["a"].read_bytes())
    run = tmp_path / "run"
    p = start(tmp_path, str(data), run)
    fk.wait_trained(p, tmp_path, run, 20_000)
    p.kill()  # the master dies; its nodes exit on their own
    p.wait()
    fk.kill_all(run)
    change("touch-rewrite", data, exports["b"])  # same size: only the time tells
    rc = start(tmp_path, str(data), run).wait(timeout=300)
    r = fk.report(run)
    assert rc == 1 and "changed since the job started" in r["failure"], r.get("failure")
    assert "rewritten" in r["data"]["changed"][0]["change"]
