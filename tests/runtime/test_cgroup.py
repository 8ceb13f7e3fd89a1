"""Sizing honesty on one pod: the container's cgroup limits (v2 and v1 files, written here as the
kernel shows them) clamp the quota of a job whose nodes all run inside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover_core.errors import InputError
from dlrover_core.runtime.cgroup import MASTER_SHARE, CgroupLimits, clamp_quota, read_limits
from dlrover_core.runtime.job import fit_to_container
from dlrover_core.spec import load_spec
from dlrover_core.types import NodeResources

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "pipelines" / "specs" / "small.yaml"  # quota: 2 CPU, 6Gi


def _v2(root: Path, cpu: str, mem: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(cpu + "\n")
    (root / "memory.max").write_text(mem + "\n")
    return root


def _v1(root: Path, quota: str, period: str, mem: str) -> Path:
    (root / "cpu").mkdir(parents=True)
    (root / "memory").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text(period + "\n")
    (root / "memory" / "memory.limit_in_bytes").write_text(mem + "\n")
    return root


def test_cgroup_v2_limits(tmp_path: Path) -> None:
    got = read_limits(_v2(tmp_path, "250000 100000", str(8 << 30)))
    assert (got.cpu_millicores, got.memory_mib) == (2500, 8192)
    none = read_limits(_v2(tmp_path / "n", "max 100000", "max"))
    assert (none.cpu_millicores, none.memory_mib, none.any) == (None, None, False)


def test_cgroup_v1_limits(tmp_path: Path) -> None:
    got = read_limits(_v1(tmp_path / "a", "150000", "100000", str(3 << 30)))
    assert (got.cpu_millicores, got.memory_mib) == (1500, 3072)
    # "no limit" as v1 shows it: quota -1, memory a page-rounded 2^63 - 1
    none = read_limits(_v1(tmp_path / "b", "-1", "100000", "9223372036854771712"))
    assert not none.any


def test_no_cgroup_files_means_no_limit(tmp_path: Path) -> None:
    assert not read_limits(tmp_path).any
    assert not read_limits(_v2(tmp_path / "bad", "garbage", "lots")).any


def test_clamp_leaves_the_master_its_share() -> None:
    limits = CgroupLimits(3000, 4096, "test")
    quota, note = clamp_quota(NodeResources(8000, 16384), limits, NodeResources(1000, 1024))
    assert quota == NodeResources(
        3000 - MASTER_SHARE.cpu_millicores, 4096 - MASTER_SHARE.memory_mib
    )
    assert note is not None and "clamped" in note and "3 CPU, 4Gi" in note
    same, none = clamp_quota(NodeResources(1000, 2048), limits, NodeResources(1000, 1024))
    assert same == NodeResources(1000, 2048) and none is None


def test_clamp_refuses_a_container_too_small_for_the_minimum_job() -> None:
    with pytest.raises(InputError, match="less than the job's minimum"):
        clamp_quota(
            NodeResources(4000, 8192), CgroupLimits(1000, None, "f"), NodeResources(1000, 1024)
        )


def test_the_local_job_is_clamped_and_the_kubernetes_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLROVER_RM_CGROUP_ROOT", str(_v2(tmp_path, "max 100000", str(5 << 30))))
    spec = load_spec(SMALL)
    run, note = fit_to_container(spec)
    assert run.quota.resources == NodeResources(spec.quota.cpu_millicores, 5 * 1024 - 1024)
    assert note is not None and "6Gi" in note
    k8s = load_spec(SMALL, ["backend.kind=kubernetes", "backend.state_pvc=s"])
    assert fit_to_container(k8s) == (k8s, None)


def test_train_in_a_too_small_container_is_one_line(tmp_path: Path) -> None:
    """Through the CLI, as a KFP task with a 1-CPU limit would run it: one line, exit 2,
    no run directory."""
    root = _v2(tmp_path / "cg", "100000 100000", "max")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DLROVER_RM_CGROUP_ROOT": str(root)}
    env["DLROVER_RM_HISTORY"] = f"sqlite:///{tmp_path / 'h.db'}"
    run = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlrover_core.cli",
            "train",
            "--spec",
            str(SMALL),
            "--run-dir",
            str(run),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "cgroup" in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not run.exists()
