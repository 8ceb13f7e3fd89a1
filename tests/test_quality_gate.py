"""The model gate (issue 36 item 2): the verdict (pure), and a real run it rejects: its own
state and exit code, the model kept under rejected/, published nowhere (no model_dir, not
``init_from: last``, not a warm start)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover_core.history.store import HistoryStore
from dlrover_core.quality import gate
from dlrover_core.spec import QualitySpec

SMALL = str(Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml")


@pytest.mark.parametrize(
    ("q", "auc", "prev", "passed", "says"),
    [
        (QualitySpec(), 0.5, None, True, "no quality gate"),
        (QualitySpec(min_auc=0.6), 0.7, None, True, ">= min_auc 0.6000"),
        (QualitySpec(min_auc=0.6), 0.59, None, False, "below quality.min_auc"),
        (QualitySpec(min_auc=0.6), None, None, False, "no held-out AUC"),
        (QualitySpec(min_auc=0.6), float("nan"), None, False, "no held-out AUC"),
        (QualitySpec(max_auc_drop=0.02), 0.70, None, True, "no quality gate"),  # no previous
        (QualitySpec(max_auc_drop=0.02), 0.70, 0.71, True, "within 0.0200"),
        (QualitySpec(max_auc_drop=0.02), 0.68, 0.71, False, "more than quality.max_auc_drop"),
    ],
)
def test_the_verdict(
    q: QualitySpec, auc: float | None, prev: float | None, passed: bool, says: str
) -> None:
    v = gate(q, auc, prev)
    assert v.passed is passed and says in v.reason, v.reason


def _train(run: Path, db: str, *sets: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dlrover_core.cli", "train", "--spec", SMALL]
    cmd += ["--run-dir", str(run), "--history", db]
    for s in ("data.rows=20000", "data.eval_rows=3000", "training.init_from=last", *sets):
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_a_rejected_model_is_kept_and_published_nowhere(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'h.db'}"
    good = _train(tmp_path / "good", db, "quality.min_auc=0.5")
    assert good.returncode == 0, good.stderr[-2000:]
    bad = _train(tmp_path / "bad", db, "quality.min_auc=0.99")
    assert bad.returncode == 4, bad.stderr[-2000:]
    assert "rejected: held-out AUC" in bad.stderr and "below quality.min_auc" in bad.stderr
    r = json.loads((tmp_path / "bad" / "report.json").read_text())
    assert r["state"] == "rejected" and r["model_dir"] is None and r["quality"]["passed"] is False
    assert (tmp_path / "bad" / "rejected" / "model" / "model_card.json").exists()
    assert not (tmp_path / "bad" / "model").exists()
    with HistoryStore(db) as store:
        runs = store.runs()
    assert [x["state"] for x in runs] == ["rejected", "succeeded"]  # newest first
    # the next run starts from the last *good* model, and is compared with it
    nxt = _train(tmp_path / "next", db, "quality.max_auc_drop=0.2")
    assert nxt.returncode == 0, nxt.stderr[-2000:]
    r3 = json.loads((tmp_path / "next" / "report.json").read_text())
    assert r3["init_from"]["model"] == str(tmp_path / "good" / "model")
    assert r3["quality"]["previous_auc"] is not None and r3["quality"]["passed"]
