"""End to end on real processes: the small job trains; faults are survived; a killed master
resumes. Slow (each run starts torch in several processes), so marked, but run in CI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrover_core import api
from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.spec import load_spec
from dlrover_core.types import NodeOverride, NodeResources, ResourcePlan, Role, RolePlan, Stage
from tests.runtime import faultkit as fk

pytestmark = pytest.mark.slow
SMALL = str(Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml")


def test_small_job_trains_end_to_end(tmp_path: Path) -> None:
    t0 = time.monotonic()
    report = api.train(SMALL, run_dir=tmp_path / "run", progress=False)
    wall = time.monotonic() - t0
    fk.check_exactly_once(report)
    assert report["auc"] is not None and report["auc"] > 0.6
    assert wall < 120, f"small.yaml took {wall:.0f} s"
    assert (tmp_path / "run" / "report.png").stat().st_size > 1000
    # the timeline ends where the job ended (it may train its last rows between two
    # observations), and the rate is never a 0/s for a job that trained
    last = json.loads((tmp_path / "run" / "timeline.jsonl").read_text().splitlines()[-1])
    assert last["samples_done"] == report["samples_total"], last
    assert report["throughput_sps"] > 0, report["throughput_sps"]
    status = api.status(tmp_path / "run")
    assert status["job_state"] == "succeeded"
    assert status["shards"]["done"] == report["shards_total"]


def _plan(workers: int, worker_mem: int = 1536, ps: int = 1) -> ResourcePlan:
    return ResourcePlan(
        RolePlan(workers, NodeResources(1000, worker_mem)),
        RolePlan(ps, NodeResources(500, 1536)),
        Stage.COLD_START,
        ("test plan",),
    )


class Killer:
    """Kills nodes when training reaches given fractions (on the master's tick)."""

    def __init__(self, steps: list[tuple[float, Role, int]]) -> None:
        self.steps = sorted(steps, key=lambda s: s[0])
        self.done: list[tuple[Role, int, float]] = []

    def __call__(self, m: JobMaster) -> None:
        if not self.steps or m.state is None:
            return
        q = m.state.shards
        frac = q.samples_done / max(1, q.samples_total)
        at, role, node_id = self.steps[0]
        n = m.nodes.get((role, node_id))
        if frac >= at and n is not None and n.handle is not None:
            m.backend.kill(n.handle)
            self.done.append((role, node_id, frac))
            self.steps.pop(0)


def test_faults_worker_kill_ps_kill_and_worker_oom(tmp_path: Path) -> None:
    """SIGKILL a worker (its shards go back, it is relaunched), SIGKILL a PS (relaunched from
    its checkpoint; workers wait and resume), and start a worker below its memory need (it
    ends as an OOM and is relaunched bigger). The job completes, every shard exactly once,
    and the AUC stays close to a fault-free run of the same job (asynchronous SGD makes two
    fault-free runs differ by ~0.006 AUC here; faults measured ~0.001 from their mean)."""
    spec = load_spec(SMALL, ["data.rows=250000"])
    clean = JobMaster(spec, tmp_path / "clean", LocalBackend(), plan=_plan(2), tick_s=0.2).run()
    fk.check_exactly_once(clean)
    killer = Killer([(0.2, Role.WORKER, 0), (0.45, Role.PS, 0)])
    # worker 1 starts with too little memory: it ends as an OOM and is relaunched bigger
    plan = _plan(2).replace(
        overrides=(NodeOverride(Role.WORKER, 1, NodeResources(1000, 200), "test: too small"),)
    )
    m = JobMaster(spec, tmp_path / "run", LocalBackend(), plan=plan, on_tick=killer, tick_s=0.2)
    report = m.run()
    fk.check_exactly_once(report)
    classes = [(f["node"], f["exit_class"], f["action"]) for f in report["faults"]]
    assert ("worker-0", "killed", "relaunch") in classes
    assert ("ps-0", "killed", "relaunch") in classes
    assert ("worker-1", "oom", "relaunch") in classes
    oom = next(f for f in report["faults"] if f["exit_class"] == "oom")
    assert oom["resources"]["memory_mib"] >= 400  # the OOM bump: 2 × 200 MiB at least
    assert len(killer.done) == 2
    # Both learned, and kept the dense features (a run that lost them, every bottom-MLP ReLU
    # dead, scores ~0.67: the collapse the dense warm-up prevents, benchmarks/ps_accuracy_seeds.py).
    # Fault-free runs differ by ~0.006 here; under CI load a tighter difference is not checked.
    assert report["auc"] is not None and clean["auc"] is not None
    assert report["auc"] > 0.7 and clean["auc"] > 0.7, (report["auc"], clean["auc"])


def test_killed_master_resumes_without_losing_or_repeating_a_shard(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "dlrover_core.cli", "train", "--spec", SMALL,
           "--run-dir", str(run), "--set", "data.rows=600000"]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # kill it about a sixth of the way through (at 60,000 rows a fast machine trained them
    # all between two timeline lines, and the kill came too late); fail at once, with the
    # node states, if the job ends first or never gets there
    try:
        fk.wait_for(lambda: fk.samples_done(run) > 100_000, 120, "100,000 samples trained",
                    every_s=0.2, proc=p, run_dir=run)  # fmt: skip
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not (run / "report.json").exists(), "the job finished before the kill: more rows"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((run / "report.json").read_text())
    fk.check_exactly_once(report)
    assert report["master_starts"] == 2


def test_planner_adds_a_ps_and_a_worker_while_the_job_runs(tmp_path: Path) -> None:
    """Real planner, small pacing: its sampling stage adds a PS (the PS set is re-sharded from
    checkpoints) and a worker, in the order it chooses. Worker CPU and memory are pinned so no
    worker is resized (a resize would restart it); worker-0 must never restart and the new
    worker must start work quickly."""
    overrides = [
        # enough rows that a worker the planner launches late (its 4th sampling move, ~20 s
        # in) registers before the job ends: at ~70k samples/s 1M rows ended first
        "data.rows=3000000",
        "pacing.sample_window_s=1.0",
        "pacing.min_speed_samples=2",
        "pacing.replan_interval_s=3",
        "pacing.heartbeat_interval_s=0.5",
        "quota.cpu=4",
        "constraints.workers.max=3",
        "constraints.workers.cpu=1",
        "constraints.workers.memory=1228Mi",
        "constraints.ps.cpu=1",
        # the default PS form (bottleneck) fits one configuration through its priors and acts
        # only where the lower band saves more than the pause: a job with under a minute left
        # is rightly left alone (tests/planner covers that). This test is about the runtime
        # carrying out the sampling stage's PS and worker additions, which the linear forms
        # drive while the model is not identified
        "planner.throughput_form=linear",
    ]
    from dlrover_core.planner import Planner
    from dlrover_core.planner.config import PlannerConfig

    spec = load_spec(SMALL, overrides)
    # the production pauses (30 s a worker change, 120 s a PS change, no sampling with under
    # 20 min left) rightly leave a one-minute job alone; here the pauses are what they measure
    # on this machine, so the planner's sampling stage acts within the test
    # (and 3 workers + 2 PS share 2 cores here: one of them is always slow, so the straggler
    # rule, tested on its own, is off)
    cfg = PlannerConfig.from_spec(
        spec,
        worker_change_pause_s=1.0,
        ps_change_pause_s=3.0,
        min_remaining_to_sample_s=0.0,
        straggler_ratio=0.01,
    )
    report = JobMaster(spec, tmp_path / "run", LocalBackend(), planner=Planner(spec, cfg)).run()
    fk.check_exactly_once(report)
    ps_counts = [p["ps"]["count"] for p in report["plans"]]
    worker_counts = [p["workers"]["count"] for p in report["plans"]]
    assert max(ps_counts) >= 2, report["plans"]
    assert max(worker_counts) >= 2, report["plans"]
    # which comes first is the planner's choice from what it measured (on a loaded machine it
    # has sampled 3 workers before 2 PS): both must happen, through its own stages
    stages = {p["stage"] for p in report["plans"][1:]}
    assert stages <= {"sampling", "scaling", "post_scaling"}, stages
    launches = [x["node"] for x in report["launches"]]
    assert launches.count("worker-0") == 1  # never restarted
    assert not report["faults"]
    # the runtime measures what each change cost (the planner's pause): one entry a change
    costs = report["plan_changes"]
    assert [c["time_s"] for c in costs] == [p["time_s"] for p in report["plans"][1:]]
    assert all(c["lost_s"] is None or c["lost_s"] < 60 for c in costs), costs
    up = report["registered_at_s"]["worker-1"]
    first = report["first_shard_taken_s"]["worker-1"]
    assert first - up < 5.0, f"worker-1 took its first shard {first - up:.1f} s after start"
