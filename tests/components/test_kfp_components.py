"""Each KFP component's function called directly (``.python_func``) on a tiny job, and the
plan parity: the KFP plan component gives the plan ``api.plan`` gives for the same spec."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kfp")

from kfp.dsl import HTML, Artifact, Dataset, Markdown, Metrics, Model

from dlrover_core import api
from dlrover_core.units import cpu_millicores, memory_mib
from dlrover_rm.components.plan.component import dlrover_plan
from dlrover_rm.components.profile.component import dlrover_profile
from dlrover_rm.components.train.component import dlrover_train

SPEC_PATH = Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml"
SPEC_YAML = SPEC_PATH.read_text()
TINY = ["data.rows=20000", "data.eval_rows=2000"]
VOLATILE = ("created_at_s", "planning_ms")


def artifact(cls: type, tmp: Path, name: str) -> Artifact:
    return cls(name=name, uri=str(tmp / name))


@pytest.fixture(scope="module")
def samples_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real profile run (2 configurations) shared by the tests of this module."""
    tmp = tmp_path_factory.mktemp("profile")
    samples = artifact(Dataset, tmp, "samples.csv")
    n = dlrover_profile.python_func(
        spec_yaml=SPEC_YAML, samples=samples, overrides=TINY, n_configs=2
    )
    assert n == 2
    return Path(samples.path)


def w_count(plan: dict) -> int:
    return int(plan["workers"]["count"])


def plan_step(tmp: Path, **kw: object) -> Artifact:
    """Run the plan component; returns its plan artifact."""
    plan = artifact(Artifact, tmp, "plan.json")
    reasons = artifact(Markdown, tmp, "reasons.md")
    dlrover_plan.python_func(spec_yaml=SPEC_YAML, plan=plan, reasons=reasons, **kw)
    return plan


def stable(plan: dict) -> dict:
    return {k: v for k, v in plan.items() if k not in VOLATILE}


@pytest.mark.slow
def test_profile_writes_samples_csv(samples_csv: Path) -> None:
    with samples_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert rows, "the profile step wrote no samples"


@pytest.mark.parametrize(
    "with_samples",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # samples: a real profile, ~20 s
    ids=["cold", "samples"],
)
def test_plan_outputs_match_the_plan_artifact(
    tmp_path: Path, with_samples: bool, request: pytest.FixtureRequest
) -> None:
    samples = None
    if with_samples:
        samples = Dataset(name="samples", uri=str(request.getfixturevalue("samples_csv")))
    plan = artifact(Artifact, tmp_path, "plan.json")
    reasons = artifact(Markdown, tmp_path, "reasons.md")
    out = dlrover_plan.python_func(
        spec_yaml=SPEC_YAML, plan=plan, reasons=reasons, samples=samples, overrides=TINY
    )
    p = json.loads(Path(plan.path).read_text())
    # Output[Markdown]: the plan's stage, sizes and every reason, for the KFP UI
    md = Path(reasons.path).read_text()
    assert md.startswith(f"# Plan for small: {p['stage']}")
    assert f"| workers | {w_count(p)} × " in md
    assert p["reasons"] and all(" ".join(r.split()) in md for r in p["reasons"])
    w, s, t = p["workers"], p["ps"], p["total"]
    assert (out.workers, out.ps) == (w["count"], s["count"])
    assert cpu_millicores(out.worker_cpu) == w["cpu_millicores"]
    assert memory_mib(out.worker_memory) == w["memory_mib"]
    assert cpu_millicores(out.ps_cpu) == s["cpu_millicores"]
    assert memory_mib(out.ps_memory) == s["memory_mib"]
    # The train step's pod holds every node (local backend) and the job master: the total
    # plus the master's 500m CPU and 1 GiB.
    assert cpu_millicores(out.train_cpu) == t["cpu_millicores"] + 500
    assert memory_mib(out.train_memory) == t["memory_mib"] + 1024
    assert p["train_step"] == {
        "cpu_millicores": t["cpu_millicores"] + 500,
        "memory_mib": t["memory_mib"] + 1024,
    }


@pytest.mark.parametrize("with_samples", [False, True], ids=["cold", "samples"])
def test_plan_parity_with_api(
    tmp_path: Path, with_samples: bool, request: pytest.FixtureRequest
) -> None:
    csv_path = request.getfixturevalue("samples_csv") if with_samples else None
    samples = Dataset(name="samples", uri=str(csv_path)) if csv_path else None
    plan = plan_step(tmp_path, samples=samples, overrides=TINY)
    via_kfp = json.loads(Path(plan.path).read_text())
    via_api = api.plan(str(SPEC_PATH), overrides=TINY, samples=csv_path)
    assert stable(via_kfp) == stable(json.loads(json.dumps(via_api)))


def test_components_are_thin_shells_on_the_project_image() -> None:
    for comp in (dlrover_profile, dlrover_plan, dlrover_train):
        container = comp.component_spec.implementation.container
        assert container.image == "dlrover-rm:0.1.0"
        assert "pip install" not in " ".join(container.command or [])


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


def test_spec_text_is_the_spec_file() -> None:
    assert yaml.safe_load(SPEC_YAML)["name"] == "small"


def check_rich_outputs(report: dict, run_dir: Path, summary: Path, dashboard: Path) -> None:
    """Output[Markdown] holds the outcome, the figures, every plan's stage and reasons;
    Output[HTML] embeds report.png byte for byte."""
    import base64
    import re

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


def _compile_with_image(tmp: Path, image: str) -> subprocess.CompletedProcess[str]:
    script = Path(__file__).resolve().parents[2] / "pipelines" / "kfp_recurring_retrain.py"
    env = {**os.environ, "DLROVER_RM_IMAGE": image}
    return subprocess.run(
        [sys.executable, str(script), "--compile", str(tmp / "p.yaml")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_image_is_set_in_one_place_at_compile_time(tmp_path: Path) -> None:
    """DLROVER_RM_IMAGE, read when the components are imported, is every executor's image;
    the default (unset) is the committed YAML's dlrover-rm:0.1.0."""
    r = _compile_with_image(tmp_path, "registry.example/ml/dlrover-rm:1.2.3")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    images = {k: e["container"]["image"] for k, e in doc["deploymentSpec"]["executors"].items()}
    assert images == {
        "exec-dlrover-profile": "registry.example/ml/dlrover-rm:1.2.3",
        "exec-dlrover-profile-size": "registry.example/ml/dlrover-rm:1.2.3",
        "exec-dlrover-plan": "registry.example/ml/dlrover-rm:1.2.3",
        "exec-dlrover-train": "registry.example/ml/dlrover-rm:1.2.3",
    }
    committed = Path(__file__).resolve().parents[2] / "pipelines" / "kfp_recurring_retrain.yaml"
    assert {e["container"]["image"] for e in yaml.safe_load(committed.read_text())[
        "deploymentSpec"]["executors"].values()} == {"dlrover-rm:0.1.0"}  # fmt: skip
    bad = _compile_with_image(tmp_path, "two words")
    assert bad.returncode != 0
    assert "DLROVER_RM_IMAGE='two words' is not an image reference" in bad.stderr
