"""What `dlrover-rm train` shows while it runs: the note that says why a job is not moving
(table-driven over master statuses), the tqdm bar on a terminal, plain lines or log records
elsewhere, a real MasterState mid PS-set change, and the CLI's --quiet."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlrover_core.runtime.progress import Progress, ProgressView, progress_note, progress_view
from dlrover_core.runtime.state import GEN_ACTIVE, GEN_STARTING, MasterState
from dlrover_core.types import NodeResources, Role

SMALL = str(Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml")


def node(name: str, state: str, incarnation: int = 0) -> dict[str, Any]:
    return {"name": name, "role": name.split("-")[0], "state": state, "incarnation": incarnation}


def status(*nodes: dict[str, Any], done: int = 3, gens: list[dict] | None = None) -> dict:
    return {
        "nodes": list(nodes),
        "shards": {"done": done, "total": 8, "samples_done": done * 2500, "samples_total": 20000},
        "window_throughput_sps": 1234.4,
        "ps": {"generations": gens or [{"id": 1, "count": 1, "state": GEN_ACTIVE}]},
    }


TRAINING = (node("ps-0", "running"), node("worker-0", "running"))


@pytest.mark.parametrize(
    ("st", "note"),
    [
        (status(*TRAINING), ""),
        (
            status(
                *TRAINING,
                gens=[{"count": 1, "state": GEN_ACTIVE}, {"count": 2, "state": "freezing"}],
            ),
            "PS set changing to 2 PS (checkpointing the old set): workers wait",
        ),
        (
            status(
                *TRAINING,
                gens=[{"count": 1, "state": "retired"}, {"count": 2, "state": GEN_STARTING}],
            ),
            "PS set changing to 2 PS (starting it): workers wait, so 0 samples/s",
        ),
        (
            status(*TRAINING, node("worker-1", "pending", incarnation=2)),
            "worker-1 restarting (a resize or a relaunch): throughput drops",
        ),
        (
            status(
                *TRAINING,
                gens=[
                    {"count": 2, "state": GEN_ACTIVE, "kind": "ranks"},
                    {"count": 4, "state": GEN_STARTING, "kind": "ranks"},
                ],
            ),
            "worker group changing to 4 ranks (re-forming the ring)",
        ),
        (status(*TRAINING, node("worker-1", "pending")), "worker-1 starting (scaling out)"),
        (status(TRAINING[0], node("worker-0", "pending"), done=0), "worker-0 starting"),
        (status(node("ps-0", "pending"), done=0), "starting the nodes"),
        (status(gens=[{"count": 1, "state": GEN_STARTING}], done=0), "starting the nodes"),
        (status(node("ps-0", "failed"), done=5), "no node running: waiting for relaunched"),
        (status(node("ps-0", "running"), node("worker-0", "deleted")), "waiting for a worker"),
        (status(*TRAINING, done=0), "waiting for the first shard to finish"),
    ],
    ids=[
        "training",
        "freezing",
        "starting",
        "restart",
        "allreduce-group",
        "scale-out",
        "first-worker",
        "boot",
        "first-ps-set",
        "relaunch",
        "no-worker",
        "first-shard",
    ],
)
def test_the_note_says_why_the_job_is_not_moving(st: dict, note: str) -> None:
    got = progress_note(st)
    assert (note in got) if note else got == ""


def test_the_view_counts_running_nodes_and_shards() -> None:
    st = status(*TRAINING, node("worker-1", "running"), node("worker-2", "deleted"))
    v = progress_view(st, "scaling")
    assert v == ProgressView(3, 8, 7500, 20000, 1234.4, 2, 1, "scaling", "")
    assert v.line() == "7,500/20,000 samples, 1,234 samples/s, workers 2 ps 1, plan scaling"


def test_a_terminal_gets_a_tqdm_bar() -> None:
    out = io.StringIO()
    p = Progress(out, tty=True)
    p.show(progress_view(status(*TRAINING), "cold_start"))
    switch = [{"count": 1, "state": GEN_ACTIVE}, {"count": 2, "state": GEN_STARTING}]
    p.show(progress_view(status(*TRAINING, done=5, gens=switch), "cold_start"))
    p.close({"state": "succeeded", "shards_done": 8, "shards_total": 8, "samples_done": 20000})
    text = out.getvalue()
    assert "3/8 shards" in text and "5/8 shards" in text and "\r" in text  # redrawn in place
    assert "7,500/20,000 samples, 1,234/s, 1w 1ps, cold_start" in text
    assert "PS set changing to 2 PS" in text
    assert text.rstrip().endswith("20,000/20,000 samples, 1,234/s, 1w 1ps, cold_start | succeeded")
    assert "8/8 shards" in text


def test_elsewhere_plain_lines_or_log_records(caplog: pytest.LogCaptureFixture) -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers[:] = []  # as the CLI at its default level: INFO would be dropped
    try:
        with caplog.at_level(logging.WARNING):
            root.handlers[:] = []
            Progress(out, tty=False).show(progress_view(status(*TRAINING), "cold_start"))
    finally:
        root.handlers[:] = saved
    assert out.getvalue() == (
        "progress: 3/8 shards, 7,500/20,000 samples, 1,234 samples/s, workers 1 ps 1, "
        "plan cold_start\n"
    )
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="dlrover_rm.progress"):
        Progress(out, tty=False).show(progress_view(status(*TRAINING, done=0), "cold_start"))
    assert out.getvalue() == ""  # a KFP pod / Airflow task log: a record instead
    (rec,) = [r for r in caplog.records if r.name == "dlrover_rm.progress"]
    assert rec.levelno == logging.INFO
    assert rec.getMessage().startswith("progress: 0/8 shards, 0/20,000 samples")
    assert "waiting for the first shard" in rec.getMessage()


class _Master:
    def __init__(self, state: MasterState) -> None:
        self.state = state
        self.plan = None


def test_on_a_real_master_state_mid_ps_switch_with_a_rate_limit(tmp_path: Path) -> None:
    state = MasterState(tmp_path, total_rows=100, shard_size=10, synchronous="NORMAL")
    state.record_launch(Role.PS, 0, 0, NodeResources(500, 1024), ref="p0")
    state.register(Role.PS, 0, address="127.0.0.1:1")
    state.record_launch(Role.WORKER, 0, 0, NodeResources(500, 1024), ref="w0")
    state.register(Role.WORKER, 0)
    g1 = state.begin_generation(1, [], 0, GEN_STARTING)
    state.update_generation(int(g1["id"]), state=GEN_ACTIVE)
    state.begin_generation(2, ["x"], 0, GEN_STARTING)
    t = [100.0]
    out = io.StringIO()
    p = Progress(out, tty=False, log_every_s=15.0, clock=lambda: t[0])
    root = logging.getLogger()
    saved, root.handlers[:] = root.handlers[:], []
    try:
        m = _Master(state)
        p(m)
        t[0] += 5.0
        p(m)  # within 15 s: nothing new
        t[0] += 10.0
        p(m)
    finally:
        root.handlers[:] = saved
        state.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("progress: 0/10 shards, 0/100 samples, 0 samples/s, workers 1")
    assert "PS set changing to 2 PS (starting it)" in lines[0]
    assert p.last_view is not None and p.last_view.stage == "-"


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [False, True], ids=["progress", "quiet"])
def test_cli_train_shows_progress_unless_quiet(tmp_path: Path, quiet: bool) -> None:
    cmd = [sys.executable, "-m", "dlrover_core.cli", "train", "--spec", SMALL,
           "--set", "data.rows=6000", "--set", "data.eval_rows=500",
           "--run-dir", str(tmp_path / "run"), *(["--quiet"] if quiet else [])]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("progress: ")]
    if quiet:
        assert lines == []
    else:
        # stderr is a pipe here, not a terminal: plain lines, the first at the first tick
        assert lines and lines[0].startswith("progress: 0/")
        assert "starting the nodes" in lines[0] or "waiting for" in lines[0]
    assert "job small succeeded" in p.stdout
