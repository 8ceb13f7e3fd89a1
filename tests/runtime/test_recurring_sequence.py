"""The recurring retrain as users run it (issue 35 item 6): six consecutive "days" on one
history store (SQLite here; PostgreSQL too where ``DLROVER_RM_TEST_PG_URL`` names a server, as
in CI), each day a new file of a drifting stream, every run with ``training.init_from: last``
as the example pipelines set it:

1. PS (no earlier model: a fresh start, said so);
2. PS, carried forward from day 1;
3. all-reduce, carried forward from day 2's PS model (PS history does not size it);
4. PS, cancelled (SIGTERM) mid-run and resumed;
5. all-reduce, its master killed (SIGKILL) mid-run and resumed;
6. PS, carried forward from day 5's all-reduce model.

Every day succeeds exactly once with nothing left running; from day 2 on at most 2 plans a run;
the carried days' held-out AUC at least a from-scratch run's on the same rows, within noise.
Real `dlrover-rm train` processes; slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlrover_core.spec import load_spec
from dlrover_core.training.data import drifting_day, file_spec, write_criteo_tsv
from tests.runtime import faultkit as fk

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SPECS = {
    "ps": ROOT / "pipelines/specs/small.yaml",
    "ar": ROOT / "pipelines/specs/small-allreduce.yaml",
}
# LONG: the interrupted days; long enough that a third of it is seen (the master's timeline,
# once a tick) well before the end: 1 rank trains 200k rows in about 3 s since a node computes
# on its whole cores (a kill meant for a third of the way in found the job done)
ROWS, LONG, EVAL = 40_000, 600_000, 5_000
NOISE = 0.01  # AUC: two runs of one job on 40k rows differ by up to ~0.005 here
SETS = ["pacing.heartbeat_interval_s=0.5", "pacing.dead_after_s=8", "training.init_from=last"]


def stores() -> list[str]:
    out = ["sqlite"]
    if os.environ.get("DLROVER_RM_TEST_PG_URL"):
        out.append("postgresql")
    return out


class Days:
    def __init__(self, tmp: Path, history: str) -> None:
        self.tmp, self.history = tmp, history
        self.tag = uuid.uuid4().hex[:8]

    def spec_file(self, kind: str, day: int, rows: int) -> Path:
        data = self.tmp / f"day{day}-{rows}.tsv"
        if not data.exists():
            b = drifting_day(load_spec(SPECS[kind]), day, rows, EVAL)
            write_criteo_tsv(data, b)
        d = file_spec(yaml.safe_load(SPECS[kind].read_text()), data, rows, EVAL)
        d["signature"]["pipeline"] = f"sequence-{self.tag}"  # one history, maybe shared
        out = self.tmp / f"spec-{kind}-{day}-{rows}.json"
        out.write_text(json.dumps(d))
        return out

    def cmd(
        self, kind: str, day: int, rows: int, run: Path, *extra: str, history: str = ""
    ) -> list[str]:
        cmd = [sys.executable, "-m", "dlrover_core.cli", "train"]
        cmd += ["--spec", str(self.spec_file(kind, day, rows)), "--run-dir", str(run)]
        cmd += ["--history", history or self.history]
        for s in (*SETS, *extra):
            cmd += ["--set", s]
        return cmd

    def train(
        self, kind: str, day: int, rows: int, run: Path, *extra: str, history: str = ""
    ) -> dict[str, Any]:
        r = subprocess.run(
            self.cmd(kind, day, rows, run, *extra, history=history),
            capture_output=True,
            text=True,
            timeout=600,
            env=fk.env(self.tmp),
            check=False,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return fk.report(run)

    def interrupted(self, kind: str, day: int, run: Path, sig: int) -> dict[str, Any]:
        """Start the day, send ``sig`` to its master about a third of the way in, resume."""
        log = self.tmp / f"day{day}.log"
        with open(log, "ab") as out:
            p = subprocess.Popen(
                self.cmd(kind, day, LONG, run), stdout=out, stderr=subprocess.STDOUT,
                env=fk.env(self.tmp),
            )  # fmt: skip
        try:
            fk.wait_for(lambda: fk.samples_done(run) > LONG // 3, 300, "a third trained",
                        every_s=0.2, proc=p, log=log, run_dir=run)  # fmt: skip
        finally:
            if p.poll() is None:
                p.send_signal(sig)
        p.wait(timeout=120)
        assert not (run / "report.json").exists() or fk.report(run)["state"] == "stopped"
        if sig == signal.SIGKILL:
            fk.kill_all(run)  # what the master left: the nodes exit on their own too, later
        else:
            fk.assert_no_orphans(run)
        return self.train(kind, day, LONG, run)


def check_once(r: dict[str, Any], run: Path) -> None:
    fk.check_exactly_once(r)
    fk.assert_no_orphans(run)


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("store", stores())
def test_six_days_on_one_history(tmp_path: Path, store: str) -> None:
    history = (
        f"sqlite:///{tmp_path / 'history.db'}"
        if store == "sqlite"
        else os.environ["DLROVER_RM_TEST_PG_URL"]
    )
    d = Days(tmp_path, history)
    runs = {i: tmp_path / f"day{i}" for i in range(1, 7)}

    r1 = d.train("ps", 1, ROWS, runs[1])
    check_once(r1, runs[1])
    assert r1["init_from"]["model"] is None and "fresh start" in r1["init_from"]["note"]

    r2 = d.train("ps", 2, ROWS, runs[2])
    check_once(r2, runs[2])
    assert r2["init_from"]["model"] == r1["model_dir"]
    # the from-scratch reference: same rows, no model carried, no history read or written
    scratch2 = d.train("ps", 2, ROWS, tmp_path / "s2", "training.init_from=null", history="none")
    assert r2["auc"] >= scratch2["auc"] - NOISE, (r2["auc"], scratch2["auc"])

    r3 = d.train("ar", 3, ROWS, runs[3])
    check_once(r3, runs[3])
    assert r3["init_from"]["model"] == r2["model_dir"] and r3["init_from"]["strategy"] == "ps"
    # the PS runs' sizes and samples did not drive the all-reduce job: it starts cold and
    # says why, or, where the history is shared (CI's PostgreSQL keeps earlier runs), from
    # the runs of similar all-reduce jobs (similar jobs must share the strategy)
    first = r3["plans"][0]
    if first["stage"] == "cold_start":
        assert any("strategy ps not used" in x for x in first["reasons"]), first
    else:
        assert first["reasons"][0].startswith("similar-job prior"), first
    assert r3["planner_errors"] == []

    r4 = d.interrupted("ps", 4, runs[4], signal.SIGTERM)
    check_once(r4, runs[4])
    assert r4["master_starts"] == 2 and r4["faults"] == [] and r4["shards_replayed"] == 0
    assert r4["init_from"]["model"] == r3["model_dir"]

    r5 = d.interrupted("ar", 5, runs[5], signal.SIGKILL)
    check_once(r5, runs[5])
    assert r5["master_starts"] == 2
    assert r5["init_from"]["model"] == r4["model_dir"]

    r6 = d.train("ps", 6, ROWS, runs[6])
    check_once(r6, runs[6])
    assert (
        r6["init_from"]["model"] == r5["model_dir"] and r6["init_from"]["strategy"] == "allreduce"
    )
    scratch6 = d.train("ps", 6, ROWS, tmp_path / "s6", "training.init_from=null", history="none")
    assert r6["auc"] >= scratch6["auc"] - NOISE, (r6["auc"], scratch6["auc"])

    reports = [r1, r2, r3, r4, r5, r6]
    # from day 2 on, at most 2 plans a run (a warm start needs no exploring)
    plans = [len(r["plans"]) for r in reports]
    why = [[(p["stage"], p["reasons"][:2]) for p in r["plans"]] for r in reports]
    assert all(n <= 2 for n in plans[1:]), (plans, why)
    # every day recorded once, in order; the lineage counts the rows of the whole chain
    ids = [r["history_run_id"] for r in reports]
    assert None not in ids and len(set(ids)) == 6
    cards = [json.loads((Path(r["model_dir"]) / "model_card.json").read_text()) for r in reports]
    assert [c["lineage"]["generation"] for c in cards] == [0, 1, 2, 3, 4, 5]
    total = [c["lineage"]["rows_trained_total"] for c in cards]
    assert total == [ROWS, 2 * ROWS, 3 * ROWS, 3 * ROWS + LONG, 3 * ROWS + 2 * LONG,
                     4 * ROWS + 2 * LONG], total  # fmt: skip
