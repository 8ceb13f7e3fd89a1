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
            {"integration-name": "DLRover-RM", "python-modules": ["dlrover_rm.operators.operators"]}
        ],
        "hooks": [
            {"integration-name": "DLRover-RM", "python-modules": ["dlrover_rm.operators.hooks"]}
        ],
        "triggers": [
            {"integration-name": "DLRover-RM", "python-modules": ["dlrover_rm.operators.triggers"]}
        ],
        "connection-types": [
            {
                "connection-type": "dlrover",
                "hook-class-name": "dlrover_rm.operators.hooks.DLRoverHook",
                "hook-name": "DLRover-RM",
                # declarative form metadata (Airflow 3.3 reads it without importing the hook)
                "ui-field-behaviour": {
                    "hidden-fields": ["port", "login", "password", "schema"],
                    "relabeling": {"host": "History store URL"},
                    "placeholders": {
                        "host": "sqlite:////var/lib/dlrover-rm/history.db",
                        "extra": '{"backend": "local", "overrides": ["quota.cpu=8"]}',
                    },
                },
                "conn-fields": {
                    "history_url": {
                        "label": "History store URL",
                        "description": "SQLAlchemy URL of the run history (a password in it "
                        "is kept secret); overrides the host field",
                        "schema": {"type": ["string", "null"], "format": "password"},
                    },
                    "backend": {
                        "label": "Backend",
                        "description": "backend.kind for the jobs of this connection",
                        "schema": {"type": ["string", "null"], "enum": ["local", "kubernetes"]},
                    },
                    "overrides": {
                        "label": "Spec overrides",
                        "description": "path=value spec overrides, comma-separated",
                        "schema": {"type": ["string", "null"]},
                    },
                },
            }
        ],
    }
