"""Helpers for the fault matrix: start real `dlrover-rm train` processes, read the run directory
read-only, inject faults into real node processes, and check that nothing is left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "pipelines" / "specs" / "small.yaml"

# fast liveness so that every fault is seen within seconds
FAST = [
    "pacing.heartbeat_interval_s=0.5",
    "pacing.dead_after_s=8",
    "pacing.pending_timeout_s=90",
    "pacing.replan_interval_s=100000",
]


def env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DLROVER_RM_HISTORY": f"sqlite:///{tmp / 'history.db'}",
        "PYTHONUNBUFFERED": "1",
    }


def train_cmd(run_dir: Path, *sets: str, spec: Path = SMALL) -> list[str]:
    cmd = [sys.executable, "-m", "dlrover_core.cli", "train", "--spec", str(spec)]
    cmd += ["--run-dir", str(run_dir)]
    for s in (*FAST, *sets):
        cmd += ["--set", s]
    return cmd


def start_train(
    tmp: Path, run_dir: Path, *sets: str, log: str = "master.log", spec: Path = SMALL
) -> subprocess.Popen[bytes]:
    out = open(tmp / log, "ab")  # noqa: SIM115 - closed with the process by the OS
    return subprocess.Popen(
        train_cmd(run_dir, *sets, spec=spec), stdout=out, stderr=subprocess.STDOUT, env=env(tmp)
    )


def wait_for(
    cond: Callable[[], Any],
    timeout_s: float,
    what: str,
    every_s: float = 0.1,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    run_dir: Path | None = None,
) -> Any:
    """Poll ``cond`` until it is truthy. With ``proc``: fail at once when that process ends
    first (the condition can no longer come). With ``log`` (and ``run_dir``): a failure quotes
    the log's tail and the run's node states, so that a CI log says why, not only when."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the process ended (exit {proc.returncode}) before {what}{_context(log, run_dir)}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {what}{_context(log, run_dir)}"
            )
        time.sleep(every_s)


def _context(log: Path | None, run_dir: Path | None, chars: int = 3000) -> str:
    out = ""
    if run_dir is not None:
        nodes = [
            f"{n['role']}-{n['node_id']}:{n['state']}#{n['incarnation']}"
            for n in state(run_dir).get("nodes", [])
        ]
        out += f"\nnodes: {' '.join(nodes) or '(no master.json)'}"
        out += f"; samples done: {samples_done(run_dir):,}"
    if log is not None:
        try:
            tail = log.read_text(errors="replace")[-chars:]
        except OSError as e:
            tail = f"(unreadable: {e})"
        out += f"\n--- {log.name}, its tail:\n{tail}"
    return out


def wait_trained(
    p: subprocess.Popen[bytes], tmp: Path, run_dir: Path, samples: float, timeout_s: float = 300
) -> None:
    """Wait until the job of ``p`` (started by :func:`start_train` in ``tmp``) has trained more
    than ``samples``; fail at once, quoting its log, if it ends first."""
    wait_for(
        lambda: samples_done(run_dir) > samples,
        timeout_s,
        f"{samples:,.0f} samples trained",
        proc=p,
        log=tmp / "master.log",
        run_dir=run_dir,
    )


def state(run_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run_dir / "master.json").read_text()))
    except (OSError, ValueError):
        return {}


def samples_done(run_dir: Path) -> int:
    tl = run_dir / "timeline.jsonl"
    try:
        lines = tl.read_text().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["samples_done"])
        except (ValueError, KeyError):
            continue
    return 0


def node(run_dir: Path, role: str, node_id: int) -> dict[str, Any] | None:
    for n in state(run_dir).get("nodes", []):
        if n["role"] == role and n["node_id"] == node_id:
            return dict(n)
    return None


def running_pid(run_dir: Path, role: str, node_id: int, min_incarnation: int = 0) -> int | None:
    """The pid of a node that registered (state running), by the backend's ref."""
    n = node(run_dir, role, node_id)
    if n is None or n["state"] != "running" or n["incarnation"] < min_incarnation or not n["ref"]:
        return None
    pid = int(n["ref"])
    return pid if psutil.pid_exists(pid) else None


def processes_of(run_dir: Path) -> list[psutil.Process]:
    """Every live process whose command line names the run directory (its nodes, its master)."""
    key = str(run_dir)
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(key in a for a in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            continue
    return out


def assert_no_orphans(run_dir: Path, within_s: float = 10.0) -> None:
    wait_for(lambda: not processes_of(run_dir), within_s, f"every process of {run_dir} to end")


def kill_all(run_dir: Path) -> None:
    for p in processes_of(run_dir):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            with contextlib.suppress(psutil.Error):
                p.kill()


def report(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "report.json").read_text()))


def check_exactly_once(r: dict[str, Any]) -> None:
    assert r["state"] == "succeeded", r.get("failure")
    assert r["shards_done"] == r["shards_total"]
    assert r["shards_completed_twice"] == 0
    assert r["shards_lost"] == 0
    assert r["samples_done"] == r["samples_total"]
