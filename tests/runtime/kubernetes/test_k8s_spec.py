"""The ``backend`` section of a job spec for Kubernetes, and the backend built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver import ApiServerThread

from dlrover_core.errors import InputError, SpecError
from dlrover_core.runtime.backends.kubernetes import backend_from_spec
from dlrover_core.spec import JobSpec, parse_spec

ROOT = Path(__file__).resolve().parents[3]


def _spec(**backend: Any) -> JobSpec:
    data = yaml.safe_load((ROOT / "pipelines" / "specs" / "small.yaml").read_text())
    data["backend"] = {"kind": "kubernetes", "namespace": "ml", **backend}
    return parse_spec(data)


def test_defaults_for_kubernetes() -> None:
    b = _spec(state_pvc="dlrover-rm-state").backend
    assert b.image == "dlrover-rm:latest" and b.service_account == "dlrover-rm-node"
    assert b.resize and b.api_outage_s == 300 and b.state_mount_path == "/var/lib/dlrover-rm"


@pytest.mark.parametrize(
    ("backend", "needle"),
    [
        ({"namespace": "ML_team"}, "backend.namespace 'ML_team'"),
        ({"image": "  "}, "backend.image is empty"),
        ({"state_url": "bucket/prefix"}, "has no scheme"),
        ({"state_mount_path": "data"}, "absolute path"),
        ({"api_retry_initial_s": 5, "api_retry_max_s": 1}, "api_retry_max_s must be >="),
        ({"api_outage_s": 0}, "api_outage_s"),
        ({"image_pull_policy": "Sometimes"}, "image_pull_policy"),
        ({"replicas": 3}, "replicas"),
    ],
)
def test_bad_backend_fields_are_one_clear_line(backend: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as err:
        _spec(**backend)
    assert needle in str(err.value)
    assert "Traceback" not in str(err.value)


def test_local_ignores_the_kubernetes_fields() -> None:
    data = yaml.safe_load((ROOT / "pipelines" / "specs" / "small.yaml").read_text())
    data["backend"] = {"kind": "local", "namespace": "Not_Checked"}
    assert parse_spec(data).backend.kind == "local"


def test_backend_from_spec(apiserver: ApiServerThread) -> None:
    spec = _spec(state_pvc="st", resize=False, api_outage_s=42, resync_s=3, image="r/i:1")
    b = backend_from_spec(spec.backend, spec.name, api_client=apiserver.client())
    assert b.cfg.namespace == "ml" and b.cfg.image == "r/i:1" and b.cfg.state_pvc == "st"
    assert b._call.policy.outage_s == 42 and not b._resize_enabled and b._resync_s == 3
    with pytest.raises(InputError, match=r"state_pvc or backend\.state_url is required"):
        backend_from_spec(_spec().backend, "small", api_client=apiserver.client())
