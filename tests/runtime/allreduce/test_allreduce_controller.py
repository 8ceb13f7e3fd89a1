"""All-reduce jobs driven by the controller (:class:`JobMaster` holding an
:class:`AllReduceStrategy`): real master, real
rank processes (gloo DMP over torchrec) on the local backend, real checkpoints.

Exactly once is checked in the master's shard queue (every shard done once, no duplicate)
and in the final checkpoint (its model holds the updates of exactly ``data.rows`` rows)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlrover_core.allreduce_config import AllReduceOptions
from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.runtime.job import train
from dlrover_core.runtime.strategies.allreduce.agent import CKPT_DIR, DELAY_ENV
from dlrover_core.runtime.strategies.allreduce.checkpoint import CheckpointStore
from dlrover_core.runtime.strategies.allreduce.strategy import AllReduceStrategy
from dlrover_core.spec import load_spec
from dlrover_core.training.export import load_exported
from dlrover_core.types import NodeResources, ResourcePlan, Role, RolePlan, Stage
from tests.factories import make_spec_dict

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("drive_allreduce_master.py")
OPTIONS = AllReduceOptions(checkpoint_interval_s=1.0)
NO_PS = RolePlan(0, NodeResources(0, 0))
PLAN_1 = ResourcePlan(
    RolePlan(1, NodeResources(1000, 1536)), NO_PS, Stage.COLD_START, ("test: 1 rank",)
)


def spec_dict(rows: int = 38_400, **extra: Any) -> dict[str, Any]:
    return make_spec_dict(
        name="ar-controller",
        strategy="allreduce",
        data__rows=rows,  # shards of 1280 rows
        data__eval_rows=2000,
        data__shard_batches=5,
        training__batch_size=256,
        quota={"cpu": 2, "memory": "6Gi"},
        constraints={"workers": {"min": 1, "max": 2}},
        pacing__heartbeat_interval_s=0.2,
        pacing__dead_after_s=10,
        pacing__pending_timeout_s=60,
        model__embedding_tables=[{"name": f"t{i}", "num_embeddings": 2000} for i in range(3)],
        **extra,
    )


def assert_exactly_once(run_dir: Path, report: dict[str, Any], rows: int) -> None:
    assert report["state"] == "succeeded", report.get("failure")
    assert report["shards_done"] == report["shards_total"], report
    assert report["shards_completed_twice"] == 0 and report["samples_done"] == rows, report
    final = CheckpointStore(run_dir / CKPT_DIR).latest()
    assert final is not None and final.meta.job_done and final.meta.final
    assert final.meta.samples == rows, final.meta  # the model saw every row exactly once


def no_rank_left(run_dir: Path) -> None:
    deadline = time.monotonic() + 15
    while True:
        left = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if str(run_dir) in " ".join(p.info["cmdline"] or [])
            and "rank" in (p.info["cmdline"] or [])
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == [], f"rank processes left behind: {left}"


def test_small_allreduce_trains_through_the_controller(tmp_path: Path) -> None:
    """`train` of pipelines/specs/small-allreduce.yaml: exactly once, AUC, an exported model."""
    spec = load_spec(ROOT / "pipelines" / "specs" / "small-allreduce.yaml", ["data.rows=60000"])
    rd = tmp_path / "run"
    report = train(spec, plan=PLAN_1, run_dir=rd, progress=False, history=[])
    assert_exactly_once(rd, report, 60_000)
    assert report["auc"] is not None and report["auc"] > 0.7, report["auc"]
    assert report["model_dir"] and report["model_held_out"]["auc"] == pytest.approx(
        report["auc"], abs=1e-6
    )
    assert load_exported(report["model_dir"]) is not None
    no_rank_left(rd)


def ar_master(spec: Any, rd: Path, options: AllReduceOptions, **kw: Any) -> JobMaster:
    """The job master of an all-reduce job on this machine, at PLAN_1."""
    strategy = AllReduceStrategy.for_run(rd, options)
    return JobMaster(spec, rd, LocalBackend(), plan=PLAN_1, strategy=strategy, **kw)


def test_resize_1_2_1_then_a_killed_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller resizes 1 -> 2 -> 1 ranks (pre-warmed groups, resharded checkpoints),
    then rank 0 is SIGKILLed: the group is relaunched from its checkpoint; exactly once."""
    monkeypatch.setenv(DELAY_ENV, "1.0")  # rank 0 waits per round: the job lasts long enough
    rows = 76_800  # 60 shards
    spec = load_spec(spec_dict(rows))
    two = ResourcePlan(RolePlan(2, NodeResources(1000, 1536)), NO_PS, Stage.SCALING, ("2",))
    phase = 0

    def on_tick(m: JobMaster) -> None:
        nonlocal phase
        assert m.state is not None
        ar = m.strategy
        assert isinstance(ar, AllReduceStrategy)
        done = m.state.shards.samples_done / rows
        if phase == 0 and done >= 0.1:
            phase = 1
            m.apply(two)
        elif phase == 1 and len(ar.resize_downtimes_s) == 1 and done >= 0.35:
            phase = 2
            m.apply(PLAN_1)
        elif phase == 2 and len(ar.resize_downtimes_s) == 2 and done >= 0.6:
            phase = 3
            g = ar._current()
            assert g is not None and g.world_size == 1
            n = m.nodes[(Role.WORKER, g.first_node_id)]
            assert n.handle is not None
            os.killpg(int(n.handle.ref), signal.SIGKILL)

    rd = tmp_path / "run"
    m = ar_master(spec, rd, OPTIONS, on_tick=on_tick, replan=False)
    report = m.run()
    assert phase == 3, f"the job ended in phase {phase}"
    assert_exactly_once(rd, report, rows)
    assert len(report["resize_downtimes_s"]) == 2, report.get("resize_downtimes_s")
    # pre-warmed: a resize costs the checkpoint, the stop and the resharded load (<= 10 s on
    # an idle machine); the bound leaves room for a loaded CI machine
    assert max(report["resize_downtimes_s"]) < 45, report["resize_downtimes_s"]
    faults = report["faults"]
    assert any(f.get("action") == "relaunch the group" for f in faults), faults
    sizes = [g["count"] for g in json.loads((rd / "master.json").read_text())["generations"]]
    assert sizes[:3] == [1, 2, 1] and len(sizes) == 4, sizes
    assert report["auc"] is not None and report["auc"] > 0.6
    no_rank_left(rd)


def test_a_bad_spec_fails_before_any_rank_starts(tmp_path: Path) -> None:
    """embedding_dim 6 cannot use fbgemm's fused kernels, and table_wise is the only type
    allowed: one line naming it, no process started."""
    spec = load_spec(spec_dict(model__embedding_dim=6, model__dense_arch=[64, 6]))
    rd = tmp_path / "run"
    options = AllReduceOptions(sharding=("table_wise",), checkpoint_interval_s=1.0)
    report = ar_master(spec, rd, options).run()
    assert report["state"] == "failed"
    assert "embedding_dim" in report["failure"] and "\n" not in report["failure"]
    assert not (rd / "logs").exists() or not list((rd / "logs").iterdir())


@pytest.mark.parametrize("scenario", ["steady", "resize"])
def test_master_killed_then_resumed(tmp_path: Path, scenario: str) -> None:
    """SIGKILL the master (steady: the group is adopted; during a resize: the half-done
    resize is stopped and a new group starts from the checkpoint); a new master finishes the
    job exactly once."""
    rows = 76_800
    rd = tmp_path / "run"
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec_dict(rows)))
    env = {**os.environ, DELAY_ENV: "0.5", "PYTHONPATH": str(ROOT)}
    first = subprocess.run(
        [sys.executable, str(DRIVER), str(rd), str(spec_path), scenario],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    spec = load_spec(json.loads(spec_path.read_text()))
    report = ar_master(spec, rd, OPTIONS).run()
    assert_exactly_once(rd, report, rows)
    assert report["master_starts"] == 2
    state = json.loads((rd / "master.json").read_text())
    groups = state["generations"]
    if scenario == "steady":
        assert len(groups) == 1, groups  # adopted, not relaunched
    else:
        assert [g["state"] for g in groups][:2] == ["aborted", "aborted"], groups
    no_rank_left(rd)
