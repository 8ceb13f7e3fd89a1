"""`dlrover-rm submit`, `status --job` and `cancel --job` as a user runs them, against the test
API server (an extended kmock, not a real API server: no Job controller, so the submitted Job
never gets a pod) through a kubeconfig, in a subprocess: real CLI, real client, real HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from apiserver import ApiServerThread

ROOT = Path(__file__).resolve().parents[3]


def _kubeconfig(tmp: Path, url: str) -> Path:
    p = tmp / "kubeconfig"
    p.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": url}}],
                "users": [{"name": "test", "user": {"token": "test"}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return p


def _cli(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KUBECONFIG": str(_kubeconfig(tmp, url)),
        "PYTHONPATH": str(ROOT),
        "KUBERNETES_SERVICE_HOST": "",
    }
    env.pop("KUBERNETES_SERVICE_HOST")
    return subprocess.run(
        [sys.executable, "-m", "dlrover_core.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow  # over 3 s here: the full tier (make test-all)
def test_submit_status_cancel_from_the_command_line(
    apiserver: ApiServerThread, tmp_path: Path
) -> None:
    spec = str(ROOT / "pipelines" / "specs" / "small.yaml")
    k8s = [
        "--set", "backend.kind=kubernetes", "--set", "backend.namespace=dlrover",
        "--set", "backend.image=registry.example/dlrover-rm:0.1.0",
        "--set", "backend.state_pvc=dlrover-rm-state",
    ]  # fmt: skip
    sub = _cli(tmp_path, apiserver.url, "submit", "--spec", spec, *k8s)
    assert sub.returncode == 0, sub.stderr
    created = json.loads(sub.stdout)["created"]
    assert any(c.startswith("Job/") for c in created), created
    again = _cli(tmp_path, apiserver.url, "submit", "--spec", spec, *k8s)
    assert again.returncode == 2 and "already submitted" in again.stderr
    assert "Traceback" not in again.stderr
    st = _cli(tmp_path, apiserver.url, "status", "--job", "small", "--namespace", "dlrover")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["job"] is not None
    cn = _cli(tmp_path, apiserver.url, "cancel", "--job", "small", "--namespace", "dlrover")
    assert cn.returncode == 0, cn.stderr
    assert any(d.startswith("Job/") for d in json.loads(cn.stdout)["deleted"])
    gone = _cli(tmp_path, apiserver.url, "status", "--job", "small", "--namespace", "dlrover")
    assert gone.returncode == 2 and "no job small" in gone.stderr
