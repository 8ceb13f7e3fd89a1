"""The train component's function called directly (``.python_func``) on a tiny job planned by
the plan component: the run, its metrics, the exported ``Model`` and the rich outputs."""

import base64
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("kfp")

from kfp.dsl import HTML, Artifact, Dataset, Markdown, Metrics, Model

from dlrover_rm.components.plan.component import dlrover_plan
from dlrover_rm.components.train.component import dlrover_train

SPEC_YAML = (Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml").read_text()
TINY = ["data.rows=20000", "data.eval_rows=2000"]


def artifact(cls: type, tmp: Path, name: str) -> Artifact:
    return cls(name=name, uri=str(tmp / name))


def plan_step(tmp: Path, **kw: object) -> Artifact:
    """Run the plan component; returns its plan artifact."""
    plan = artifact(Artifact, tmp, "plan.json")
    reasons = artifact(Markdown, tmp, "reasons.md")
    dlrover_plan.python_func(spec_yaml=SPEC_YAML, plan=plan, reasons=reasons, **kw)
    return plan


@pytest.mark.slow
def test_train_runs_the_plan_and_logs_metrics(tmp_path: Path) -> None:
    plan = plan_step(tmp_path, overrides=TINY)
    metrics = artifact(Metrics, tmp_path, "metrics")
    run = artifact(Artifact, tmp_path, "run")
    model = artifact(Model, tmp_path, "model")
    summary, dashboard = artifact(Markdown, tmp_path, "summary"), artifact(HTML, tmp_path, "dash")
    state = dlrover_train.python_func(
        spec_yaml=SPEC_YAML, plan=plan, metrics=metrics, run=run, model=model,
        summary=summary, dashboard=dashboard, overrides=TINY,
    )  # fmt: skip
    assert state == "succeeded"
    report = json.loads((Path(run.path) / "report.json").read_text())
    check_rich_outputs(report, Path(run.path), Path(summary.path), Path(dashboard.path))
    assert {"auc", "throughput_sps", "wall_s"} <= set(metrics.metadata)
    assert 0.0 <= metrics.metadata["auc"] <= 1.0
    assert (Path(run.path) / "report.json").exists()
    # Output[Model]: the exported files, and metadata an eval or serving step can read
    assert (Path(model.path) / "model.pt").exists()
    assert model.metadata["framework"] == "torch"
    assert model.metadata["held_out_auc"] == pytest.approx(metrics.metadata["auc"], abs=0.005)
    assert model.metadata["feature_keys"][0] == "c0" and model.metadata["tables"]["c4"] == 1000


@pytest.mark.slow
def test_train_reads_an_input_dataset(tmp_path: Path) -> None:
    """Input[Dataset]: an upstream step's Parquet file becomes the training data."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dlrover_core.training.data import SyntheticCriteo

    b = SyntheticCriteo(num_dense=13, num_sparse=8, num_rows=9000).rows(0, 9000)
    cols: dict = {"label": b.labels.astype(np.int64)}
    ints = np.rint(np.expm1(b.dense.astype(np.float64))).astype(np.int64)
    cols |= {f"I{i + 1}": ints[:, i] for i in range(13)}
    cols |= {f"C{i + 1}": b.sparse[:, i] for i in range(8)}
    data = artifact(Dataset, tmp_path, "train.parquet")
    pq.write_table(pa.table(cols), data.path, row_group_size=2000)
    plan = plan_step(tmp_path, overrides=TINY)
    metrics = artifact(Metrics, tmp_path, "metrics")
    run, model = artifact(Artifact, tmp_path, "run"), artifact(Model, tmp_path, "model")
    summary, dashboard = artifact(Markdown, tmp_path, "summary"), artifact(HTML, tmp_path, "dash")
    state = dlrover_train.python_func(
        spec_yaml=SPEC_YAML, plan=plan, metrics=metrics, run=run, model=model,
        summary=summary, dashboard=dashboard, overrides=["data.eval_rows=1000"], dataset=data,
    )  # fmt: skip
    assert state == "succeeded"
    report = json.loads((Path(run.path) / "report.json").read_text())
    assert report["data"]["records"] == 8000 and report["data"]["malformed"] == 0
    assert report["samples_done"] == 8000
    assert model.metadata["data"]["source"] == "parquet"
    md = Path(summary.path).read_text()
    assert "## Data (all rows)" in md and "| 8,000 | 0 | 1,000 |" in md  # per-file counts


def check_rich_outputs(report: dict, run_dir: Path, summary: Path, dashboard: Path) -> None:
    """Output[Markdown] holds the outcome, the figures, every plan's stage and reasons;
    Output[HTML] embeds report.png byte for byte."""
    md = summary.read_text()
    assert md.startswith(f"# {report['job']}: succeeded")
    assert f"| held-out AUC | {report['auc']:.4f} |" in md
    assert f"{report['samples_done']:,} / {report['samples_total']:,}" in md
    assert "## Plans (stages)" in md
    for i, p in enumerate(report["plans"], 1):
        assert f"| {i} |" in md and f"### Why plan {i} ({p['stage']})" in md
        assert all(" ".join(r.split()) in md for r in p["reasons"])
    page = dashboard.read_text()
    assert page.startswith("<!doctype html>") and "held-out AUC" in page
    (b64,) = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert base64.b64decode(b64) == (run_dir / "report.png").read_bytes()
