"""What the three KFP components share: they are thin shells on the project's image, set in
one place at compile time. Each component's own tests sit beside it
(``components/<name>/test_<name>_component.py``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kfp")

from dlrover_rm.components.plan.component import dlrover_plan
from dlrover_rm.components.profile.component import dlrover_profile
from dlrover_rm.components.train.component import dlrover_train

ROOT = Path(__file__).resolve().parents[2]


def test_components_are_thin_shells_on_the_project_image() -> None:
    for comp in (dlrover_profile, dlrover_plan, dlrover_train):
        container = comp.component_spec.implementation.container
        assert container.image == "dlrover-rm:0.1.0"
        assert "pip install" not in " ".join(container.command or [])


def _compile_with_image(tmp: Path, image: str) -> subprocess.CompletedProcess[str]:
    script = ROOT / "pipelines" / "kfp_recurring_retrain.py"
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
    committed = ROOT / "pipelines" / "kfp_recurring_retrain.yaml"
    assert {e["container"]["image"] for e in yaml.safe_load(committed.read_text())[
        "deploymentSpec"]["executors"].values()} == {"dlrover-rm:0.1.0"}  # fmt: skip
    bad = _compile_with_image(tmp_path, "two words")
    assert bad.returncode != 0
    assert "DLROVER_RM_IMAGE='two words' is not an image reference" in bad.stderr
