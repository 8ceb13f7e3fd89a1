"""Airflow provider metadata, behind the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    from dlrover_core import __version__

    return {
        "package-name": "dlrover-rm",
        "name": "DLRover-RM",
        "description": "Auto-sized, elastic DLRM training steps for Airflow DAGs.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "DLRover-RM",
                "external-doc-url": "https://github.com/intelligent-machine-learning/dlrover",
                "tags": ["software"],
            }
        ],
        "operators": [
            {"integration-name": "DLRover-RM", "python-modules": ["operators.operators"]}
        ],
        "hooks": [{"integration-name": "DLRover-RM", "python-modules": ["operators.hooks"]}],
        "triggers": [{"integration-name": "DLRover-RM", "python-modules": ["operators.triggers"]}],
        "connection-types": [
            {"connection-type": "dlrover", "hook-class-name": "operators.hooks.DLRoverHook"}
        ],
    }
