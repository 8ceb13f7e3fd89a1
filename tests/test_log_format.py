"""What a user reads: one log line format for the CLI, the master and the nodes, and no
third-party chatter (alembic's notes on each store open, fbgemm's "Successfully loaded" lines,
pynvml's and torch.jit's deprecation warnings) at any level."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = str(Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml")
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: ")
CHATTER = ("alembic", "Successfully loaded", "FutureWarning", "is deprecated", "pynvml")


@pytest.mark.slow
@pytest.mark.parametrize("json_lines", [False, True], ids=["plain", "json"])
def test_one_format_and_no_chatter(tmp_path: Path, json_lines: bool) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "dlrover_core.cli", "--log-level", "info",
           *(["--log-json"] if json_lines else []), "train", "--spec", SMALL, "--quiet",
           "--set", "data.rows=6000", "--set", "data.eval_rows=500",
           "--set", f"history.url=sqlite:///{tmp_path / 'h.db'}",
           "--run-dir", str(run)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    node_logs = sorted((run / "logs").glob("*.log"))
    assert [f.name for f in node_logs if f.name.startswith(("ps-", "worker-"))]
    texts = {"stderr": p.stderr} | {f.name: f.read_text() for f in node_logs}
    n = 0
    for where, text in texts.items():
        for ln in text.splitlines():
            assert not any(c in ln for c in CHATTER), f"{where}: {ln}"
            if json_lines:
                rec = json.loads(ln)  # every line is one JSON record
                assert {"ts", "level", "logger", "msg"} <= rec.keys(), f"{where}: {ln}"
            else:
                assert LINE.match(ln), f"{where}: not the one format: {ln}"
            n += 1
    assert n >= 5  # the master's plan and launches, the nodes' start-up lines
