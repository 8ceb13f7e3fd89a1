"""The example KFP pipeline: the committed YAML is fresh, the train step is sized by the plan
step's outputs (run-time placeholders), and the pipeline runs end to end under kfp.local."""

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kfp")

from pipelines import kfp_recurring_retrain as pipeline

COMMITTED = Path(pipeline.__file__).with_suffix(".yaml")
RESOURCES = {
    "resourceCpuRequest": "train_cpu",
    "resourceCpuLimit": "train_cpu",
    "resourceMemoryRequest": "train_memory",
    "resourceMemoryLimit": "train_memory",
}


def test_committed_yaml_is_fresh(tmp_path: Path) -> None:
    out = pipeline.compile_pipeline(tmp_path / "p.yaml")
    assert out.read_text() == COMMITTED.read_text(), (
        "pipelines/kfp_recurring_retrain.yaml is stale; run "
        "`python pipelines/kfp_recurring_retrain.py --compile pipelines/kfp_recurring_retrain.yaml`"
    )


def test_train_resources_are_placeholders_bound_to_the_plan_outputs() -> None:
    doc = yaml.safe_load(COMMITTED.read_text())
    resources = doc["deploymentSpec"]["executors"]["exec-dlrover-train"]["container"]["resources"]
    params = doc["root"]["dag"]["tasks"]["dlrover-train"]["inputs"]["parameters"]
    for field, output in RESOURCES.items():
        channel = f"pipelinechannel--dlrover-plan-{output}"
        assert resources[field] == f"{{{{$.inputs.parameters['{channel}']}}}}"
        assert params[channel]["taskOutputParameter"] == {
            "producerTask": "dlrover-plan",
            "outputParameterKey": output,
        }
    # And the steps run in order: profile -> plan -> train.
    tasks = doc["root"]["dag"]["tasks"]
    assert tasks["dlrover-plan"]["dependentTasks"] == ["dlrover-profile"]
    assert tasks["dlrover-train"]["dependentTasks"] == ["dlrover-plan"]


@pytest.mark.slow
def test_pipeline_runs_end_to_end_locally(
    tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one run history for both scheduled runs (the tasks read it from the environment)
    monkeypatch.setenv("DLROVER_RM_HISTORY", f"sqlite:///{tmp_path / 'history.db'}")
    root = tmp_path / "root1"
    pipeline.run_local(pipeline_root=str(root))  # kfp.local raises if a task fails
    # the train task's log has progress records, once each (through the KFP executor's handler)
    log = capfd.readouterr()
    lines = [ln for ln in (log.out + log.err).splitlines() if "progress: 0/" in ln]
    assert lines and len(lines) == len(set(lines)), lines
    assert not [ln for ln in lines if "dlrover_rm.progress:" in ln], "logged twice"
    (run,) = root.iterdir()
    assert (run / "dlrover-profile" / "samples").read_text().strip()
    plan_out = json.loads((run / "dlrover-plan" / "executor_output.json").read_text())
    plan = json.loads((run / "dlrover-plan" / "plan").read_text())
    assert plan_out["parameterValues"]["workers"] == plan["workers"]["count"]
    train_out = json.loads((run / "dlrover-train" / "executor_output.json").read_text())
    assert train_out["parameterValues"]["Output"] == "succeeded"
    (metrics,) = train_out["artifacts"]["metrics"]["artifacts"]
    assert 0.0 <= metrics["metadata"]["auc"] <= 1.0
    report = json.loads((run / "dlrover-train" / "run" / "report.json").read_text())
    # the model out: loaded with plain torch/torchrec, scored on the held-out rows, it
    # reproduces the report's AUC
    import torch

    from dlrover_core.spec import load_spec
    from dlrover_core.training import load_exported
    from dlrover_core.training.data import from_spec
    from dlrover_core.training.metrics import auc
    from dlrover_core.training.model import to_kjt

    model_dir = run / "dlrover-train" / "model"
    assert torch.load(model_dir / "model.pt", weights_only=True)
    model = load_exported(model_dir)
    spec = load_spec(json.loads((run / "dlrover-train" / "run" / "spec.json").read_text()))
    held = from_spec(spec).eval_rows(spec.data.eval_rows)
    with torch.no_grad():
        logits = model(torch.from_numpy(held.dense), to_kjt(held.sparse, model.keys)).numpy()
    assert abs(auc(held.labels, logits) - report["auc"]) < 0.005
    (model_art,) = train_out["artifacts"]["model"]["artifacts"]
    assert model_art["metadata"]["framework"] == "torch"
    # the rich outputs the KFP UI shows: the plan's reasons, the report, report.png
    reasons = (run / "dlrover-plan" / "reasons").read_text()
    assert reasons.startswith("# Plan for small: ") and "### Why" in reasons
    assert all(" ".join(r.split()) in reasons for r in plan["reasons"])
    summary = (run / "dlrover-train" / "summary").read_text()
    assert summary.startswith("# small: succeeded") and "## Plans (stages)" in summary
    dashboard = (run / "dlrover-train" / "dashboard").read_text()
    assert "data:image/png;base64," in dashboard
    for name, key in (("dlrover-plan", "reasons"), ("dlrover-train", "summary")):
        out = json.loads((run / name / "executor_output.json").read_text())
        (art,) = out["artifacts"][key]["artifacts"]
        assert art["uri"].endswith(f"/{name}/{key}")
    # the gate's verdict shows in the summary; a fresh start says so
    assert "| quality gate | passed: held-out AUC" in summary, summary
    assert report["init_from"]["model"] is None and "fresh start" in report["init_from"]["note"]

    # the next scheduled run starts from this run's model (init_from: last, the default)
    pipeline.run_local(pipeline_root=str(tmp_path / "root2"))
    (run2,) = (tmp_path / "root2").iterdir()
    report2 = json.loads((run2 / "dlrover-train" / "run" / "report.json").read_text())
    assert report2["state"] == "succeeded"
    assert report2["init_from"]["model"] == str(model_dir), report2["init_from"]
    card2 = json.loads((run2 / "dlrover-train" / "model" / "model_card.json").read_text())
    assert card2["lineage"]["generation"] == 1
    assert card2["lineage"]["parent"]["source"] == str(model_dir)
    summary2 = (run2 / "dlrover-train" / "summary").read_text()
    assert f"| started from | {model_dir} (generation 1) |" in summary2, summary2
