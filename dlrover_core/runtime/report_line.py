"""The one stdout line ``dlrover-rm train`` prints in a pod (``DLROVER-RM-REPORT {JSON}``) and
its reader: a caller that sees only the Kubernetes API (``submit.follow``, the Airflow
trigger) reads the job's result from the master pod's log. Light: imports nothing heavy
(:mod:`dlrover_core.api` imports it at start-up)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

REPORT_LINE = "DLROVER-RM-REPORT"
"""The prefix of the one stdout line ``dlrover-rm train`` prints in a pod: a caller that sees
only the Kubernetes API (the Airflow trigger) reads the job's result from the pod log."""

REPORT_LINE_FIELDS = (
    "job", "state", "failure", "auc", "samples_done", "samples_total", "shards_done",
    "shards_total", "shards_completed_twice", "shards_lost", "throughput_sps", "wall_s",
    "model_dir", "export_error", "run_dir", "history_run_id", "run_url", "model_url",
)  # fmt: skip


def report_line(report: Mapping[str, Any]) -> str:
    """``DLROVER-RM-REPORT {compact JSON}``: the report's summary, valid JSON (no NaN)."""
    from dlrover_core.runtime.report import json_safe

    summary = {k: json_safe(report.get(k)) for k in REPORT_LINE_FIELDS if k in report}
    return f"{REPORT_LINE} " + json.dumps(summary, separators=(",", ":"), allow_nan=False)


def parse_report_line(log_text: str) -> dict[str, Any] | None:
    """The last ``DLROVER-RM-REPORT`` line of a log, parsed; None when there is none."""
    for line in reversed(log_text.splitlines()):
        if line.startswith(REPORT_LINE + " "):
            try:
                out = json.loads(line[len(REPORT_LINE) + 1 :])
            except ValueError:
                continue
            if isinstance(out, dict):
                return out
    return None
