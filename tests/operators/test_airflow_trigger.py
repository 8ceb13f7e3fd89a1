"""DLRoverJobTrigger: serialize round trip; run() yields exactly one event when the job ends."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

from dlrover_rm.operators.triggers import DLRoverJobTrigger


def _events(trigger: DLRoverJobTrigger) -> list[Any]:
    async def collect() -> list[Any]:
        return [e async for e in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=20))


def test_serialize_round_trips() -> None:
    t = DLRoverJobTrigger("/tmp/run", 3.5, pid=42, hostname="h", start_timeout=9)
    path, kwargs = t.serialize()
    mod, _, name = path.rpartition(".")
    cls = getattr(__import__(mod, fromlist=[name]), name)
    assert cls is DLRoverJobTrigger
    t2 = cls(**kwargs)
    assert t2.serialize() == (path, kwargs)
    json.dumps(kwargs)  # the triggerer stores the kwargs


@pytest.mark.parametrize("final", ["succeeded", "failed", "stopped"])
def test_one_event_when_the_job_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, final: str
) -> None:
    from dlrover_core import api
    from dlrover_core.errors import InputError

    # the master writes its report with the terminal state; the train process then adds the
    # export and the history record and marks it complete: the event carries that one
    states = iter([None, "running", "evaluating", final, final, final])
    reports = iter([{"state": final}, {"state": final, "model_dir": "m", "complete": True}])

    def status(run_dir: str) -> dict[str, Any]:
        s = next(states)
        if s is None:
            raise InputError("no master.json yet")
        if s == final:
            (tmp_path / "report.json").write_text(json.dumps(next(reports, {"state": "?"})))
        return {"job_state": s}

    monkeypatch.setattr(api, "status", status)
    (ev,) = _events(DLRoverJobTrigger(str(tmp_path), 0.01))
    assert ev.payload["status"] == final
    want = {"state": final, "model_dir": "m", "complete": True, "run_dir": str(tmp_path)}
    assert ev.payload["report"] == want


def test_a_report_that_never_says_complete_is_taken_after_a_while(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dlrover_core import api
    from dlrover_rm.operators import triggers

    monkeypatch.setattr(triggers, "FINALIZE_S", 0.05)
    (tmp_path / "report.json").write_text(json.dumps({"state": "succeeded"}))
    monkeypatch.setattr(api, "status", lambda rd: {"job_state": "succeeded"})
    (ev,) = _events(DLRoverJobTrigger(str(tmp_path), 0.01))
    assert ev.payload["report"]["state"] == "succeeded"


def test_never_started_fails(tmp_path: Path) -> None:
    (ev,) = _events(DLRoverJobTrigger(str(tmp_path), 0.01, start_timeout=0.05))
    assert ev.payload["status"] == "failed"
    assert "no job started" in ev.payload["message"]


def test_master_gone_while_running_fails(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (tmp_path / "master.json").write_text("{}")
    from dlrover_core import api

    mp = pytest.MonkeyPatch()
    mp.setattr(api, "status", lambda rd: {"job_state": "running"})
    try:
        trig = DLRoverJobTrigger(str(tmp_path), 0.01, pid=proc.pid, hostname=socket.gethostname())
        (ev,) = _events(trig)
    finally:
        mp.undo()
    assert ev.payload["status"] == "failed"
    assert str(proc.pid) in ev.payload["message"]
    assert os.getpid() != proc.pid
