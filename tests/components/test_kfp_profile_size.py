"""The profile step sized to its trials: ``dlrover_profile_size`` gives the largest trial plus
the master, the compiled pipelines size the profile task with it (request = limit), and the
profiler runs only the trials that fit its container's cgroup limits (the rest are recorded
with the reason)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("kfp")

from dlrover_core import api
from dlrover_core.errors import InputError
from dlrover_core.runtime.cgroup import MASTER_SHARE, CgroupLimits
from dlrover_core.runtime.profiler import (
    fit_trials,
    profile,
    profile_configs,
    profile_size,
    trial_spec,
)
from dlrover_core.spec import load_spec
from dlrover_core.types import NodeResources
from dlrover_rm.components.profile.component import dlrover_profile_size
from pipelines import kfp_recurring_retrain as pipeline

SPEC_PATH = Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml"
SPEC_YAML = SPEC_PATH.read_text()
TINY = ["data.rows=20000"]


def _plans(n: int = 3) -> list:
    return profile_configs(trial_spec(load_spec(yaml.safe_load(SPEC_YAML), TINY)), n)


def test_the_size_is_the_largest_trial_plus_the_master() -> None:
    plans = _plans(3)
    # each trial: workers x size + PS x size (small.yaml's sampling moves), by hand
    totals = [
        (
            p.workers.count * p.workers.resources.cpu_millicores
            + p.ps.count * p.ps.resources.cpu_millicores,
            p.workers.count * p.workers.resources.memory_mib
            + p.ps.count * p.ps.resources.memory_mib,
        )
        for p in plans
    ]
    cpu = max(c for c, _ in totals) + MASTER_SHARE.cpu_millicores
    mem = max(m for _, m in totals) + MASTER_SHARE.memory_mib
    assert profile_size(plans) == NodeResources(cpu, mem)
    assert len({t for t in totals}) == 3  # three distinct trials: the max is a real choice
    size = api.profile_size(SPEC_YAML and yaml.safe_load(SPEC_YAML), overrides=TINY, n_configs=3)
    assert (size["cpu_millicores"], size["memory_mib"], size["trials"]) == (cpu, mem, 3)
    out = dlrover_profile_size.python_func(spec_yaml=SPEC_YAML, overrides=TINY, n_configs=3)
    assert (out.cpu, out.memory) == (size["cpu"], size["memory"])
    with pytest.raises(InputError, match="nothing to size"):
        profile_size([])


@pytest.mark.parametrize(
    ("cpu", "mem", "runs", "skipped_for"),
    [
        (None, None, [0, 1, 2], []),
        (2000, None, [0, 1, 2], []),  # the largest trial + master is exactly 2 CPU
        (1999, None, [0], ["CPU", "CPU"]),
        (None, 3480, [0, 1], ["memory"]),
        (1500, 3480, [0], ["CPU", "CPU and memory"]),
        (1000, None, [], ["CPU", "CPU", "CPU"]),
    ],
)
def test_trials_above_the_container_are_not_run(
    cpu: int | None, mem: int | None, runs: list[int], skipped_for: list[str]
) -> None:
    plans = _plans(3)
    run, why = fit_trials(plans, CgroupLimits(cpu, mem, "test"))
    assert run == runs
    reasons = [w for w in why if w is not None]
    assert len(reasons) == len(skipped_for)
    for w, what in zip(reasons, skipped_for, strict=True):
        assert f"above this container's {what} limit" in w and w.startswith("not run: needs ")


def test_a_container_no_trial_fits_is_one_line() -> None:
    js = load_spec(yaml.safe_load(SPEC_YAML), TINY)
    with pytest.raises(InputError) as e:
        profile(js, n_configs=3, limits=CgroupLimits(800, 1024, "/sys/fs/cgroup/cpu.max"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("no profiling trial fits this container (800m CPU, 1Gi")
    assert "give the profile step at least 2 CPU / 4708Mi (request = limit)" in msg


@pytest.mark.parametrize("kubernetes", [False, True], ids=["local", "k8s"])
def test_the_compiled_profile_task_is_sized_by_the_size_step(kubernetes: bool) -> None:
    path = pipeline.COMPILED_K8S if kubernetes else pipeline.COMPILED
    doc = next(yaml.safe_load_all(path.read_text()))
    res = doc["deploymentSpec"]["executors"]["exec-dlrover-profile"]["container"]["resources"]
    cpu = "{{$.inputs.parameters['pipelinechannel--dlrover-profile-size-cpu']}}"
    mem = "{{$.inputs.parameters['pipelinechannel--dlrover-profile-size-memory']}}"
    assert (res["resourceCpuRequest"], res["resourceCpuLimit"]) == (cpu, cpu)
    assert (res["resourceMemoryRequest"], res["resourceMemoryLimit"]) == (mem, mem)
    tasks = doc["root"]["dag"]["tasks"]
    size_in = tasks["dlrover-profile-size"]["inputs"]["parameters"]
    prof_in = tasks["dlrover-profile"]["inputs"]["parameters"]
    # the size step plans the same trials the profile step runs
    for k in ("spec_yaml", "overrides", "n_configs"):
        assert size_in[k] == prof_in[k], k


def test_the_cli_reads_the_cgroup_and_says_no_trial_fits(tmp_path: Path) -> None:
    """End to end through the cgroup files: ``cpu.max`` 800m (v2), no memory limit."""
    import os
    import subprocess
    import sys

    (tmp_path / "cpu.max").write_text("80000 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    env = {**os.environ, "DLROVER_RM_CGROUP_ROOT": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "dlrover_core.cli", "profile", "--spec", str(SPEC_PATH),
         "--configs", "3", "--set", "data.rows=20000"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "no profiling trial fits this container (800m CPU, no memory limit" in lines[0]
    assert str(tmp_path / "cpu.max") in lines[0]


def test_profile_runs_only_the_trials_that_fit_and_records_the_rest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dlrover_core.runtime import profiler

    ran: list[int] = []

    def fake_trial(spec, plan, run_dir, windows):  # type: ignore[no-untyped-def]
        ran.append(int(run_dir.name.removeprefix("trial-")))
        return None  # no steady window: the notes still record the trial

    monkeypatch.setattr(profiler, "run_trial", fake_trial)
    js = load_spec(yaml.safe_load(SPEC_YAML), TINY)
    samples, notes = profile(js, n_configs=3, limits=CgroupLimits(1999, None, "t"))
    assert ran == [0] and samples == []
    assert [n["skipped"] is None for n in notes] == [True, False, False]
    assert [n["needs_cpu_millicores"] for n in notes] == [1500, 2000, 2000]
    assert all(n["container"] == "1999m CPU, no memory limit" for n in notes)
    ran.clear()
    with caplog.at_level("WARNING", logger="dlrover_rm.profile"):
        profile(js, n_configs=3, limits=CgroupLimits(None, None, "t"))
    assert ran == [0, 1, 2]
    assert "no CPU limit: each trial's speed is measured on whatever CPU" in caplog.text
    assert "give the step 2 CPU / 4708Mi (request = limit)" in caplog.text


@pytest.mark.parametrize(("rows", "epochs"), [(1000, 5000), (100, 10_000), (400_000, 13)])
def test_a_file_trial_gets_enough_epochs_not_to_run_out(
    tmp_path: Path, rows: int, epochs: int
) -> None:
    """A trial stops once measured; over a file it cycles epochs up to TRIAL_ROWS (5M rows),
    within the spec's epoch limit (10k)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dlrover_core.spec import use_data_file

    n = rows + 10  # 10 held out
    cols = {"label": np.zeros(n, np.int64)}
    cols |= {f"I{i + 1}": np.zeros(n, np.int64) for i in range(13)}
    cols |= {f"C{i + 1}": np.zeros(n, np.int64) for i in range(8)}
    pq.write_table(pa.table(cols), tmp_path / "d.parquet")
    spec = use_data_file(yaml.safe_load(SPEC_YAML), "parquet", str(tmp_path / "d.parquet"))
    js = load_spec(spec, ["data.eval_rows=10"])
    assert trial_spec(js).training.epochs == epochs
