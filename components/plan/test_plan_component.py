"""The plan component's function called directly (``.python_func``) on a tiny job, and the
plan parity: it gives the plan ``api.plan`` gives for the same spec."""

import json
from pathlib import Path

import pytest

pytest.importorskip("kfp")

from kfp.dsl import Artifact, Dataset, Markdown

from dlrover_core import api
from dlrover_core.units import cpu_millicores, memory_mib
from dlrover_rm.components.plan.component import dlrover_plan

SPEC_PATH = Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml"
SPEC_YAML = SPEC_PATH.read_text()
TINY = ["data.rows=20000", "data.eval_rows=2000"]
VOLATILE = ("created_at_s", "planning_ms")


def artifact(cls: type, tmp: Path, name: str) -> Artifact:
    return cls(name=name, uri=str(tmp / name))


def stable(plan: dict) -> dict:
    return {k: v for k, v in plan.items() if k not in VOLATILE}


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
    assert f"| workers | {p['workers']['count']} × " in md
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
    plan = artifact(Artifact, tmp_path, "plan.json")
    reasons = artifact(Markdown, tmp_path, "reasons.md")
    dlrover_plan.python_func(
        spec_yaml=SPEC_YAML, plan=plan, reasons=reasons, samples=samples, overrides=TINY
    )
    via_kfp = json.loads(Path(plan.path).read_text())
    via_api = api.plan(str(SPEC_PATH), overrides=TINY, samples=csv_path)
    assert stable(via_kfp) == stable(json.loads(json.dumps(via_api)))
