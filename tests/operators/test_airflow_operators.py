"""The operators: templated fields render; the plan operator gives api.plan's plan (parity);
the train operator fails on a failed job and stops the job on kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

from airflow.sdk.exceptions import AirflowException

from dlrover_rm.operators.operators import (
    JOB_FILE,
    DLRoverPlanOperator,
    DLRoverProfileOperator,
    DLRoverTrainOperator,
)

SPEC = str(Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml")
VOLATILE = ("created_at_s", "planning_ms")


def _render(op: Any, **context: Any) -> Any:
    op.render_template_fields({"params": {}, **context})
    return op


@pytest.mark.parametrize(
    ("cls", "extra"),
    [
        (DLRoverProfileOperator, {"out": "{{ params.d }}/s.csv", "n_configs": "{{ params.n }}"}),
        (DLRoverPlanOperator, {"samples": "{{ params.d }}/s.csv", "out": "{{ params.d }}/p"}),
        (DLRoverTrainOperator, {"plan": "{{ params.d }}/p", "run_dir": "{{ params.d }}/run"}),
    ],
)
def test_template_fields_render(cls: Any, extra: dict[str, str]) -> None:
    op = cls(
        task_id="t",
        spec="{{ params.spec }}",
        overrides="{{ params.o | join('\n') }}",
        dlrover_conn_id=None,
        **extra,
    )
    assert {"spec", "overrides", *extra} <= set(cls.template_fields)
    _render(op, params={"spec": SPEC, "o": ["a=1", "b=2"], "d": "/x", "n": 2})
    assert op.spec == SPEC
    assert op.overrides == "a=1\nb=2"
    for k in extra:
        assert getattr(op, k).startswith("/x") or getattr(op, k) == "2", k


def test_plan_operator_matches_api_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlrover_core import api

    monkeypatch.setenv("DLROVER_RM_HISTORY", f"sqlite:///{tmp_path / 'history.db'}")

    overrides = ["data.rows=50000", "quota.cpu=2"]
    op = DLRoverPlanOperator(
        task_id="plan", spec=SPEC, overrides="\n".join(overrides), dlrover_conn_id=None
    )
    got = op.execute({})
    want = api.plan(SPEC, overrides=overrides)
    json.dumps(got)  # XCom must be JSON-able
    strip = lambda d: {k: v for k, v in d.items() if k not in VOLATILE}  # noqa: E731
    assert strip(got) == strip(want)


def test_plan_operator_reads_the_samples_text_the_profile_task_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The profile task's XCom is the samples CSV's text, not a path on the worker that
    profiled: the plan task (any worker) plans from it exactly as from the file; a bad row
    in the text is one clear error naming the row."""
    from dlrover_core import api
    from dlrover_core.errors import InputError
    from dlrover_core.model.samples_io import write_samples_csv
    from tests.factories import GRID_CONFIGS, exact_samples

    monkeypatch.setenv("DLROVER_RM_HISTORY", f"sqlite:///{tmp_path / 'history.db'}")
    coef = {"a0": 0.05, "a1": 0.001, "b1": 0.00005, "b2": 1e-7, "b3": 0.001}
    csv = tmp_path / "samples.csv"
    write_samples_csv(csv, exact_samples(coef, GRID_CONFIGS[:8]))
    overrides = ["quota.cpu=16"]
    op = DLRoverPlanOperator(
        task_id="plan",
        spec=SPEC,
        overrides="\n".join(overrides),
        samples=csv.read_text(),
        dlrover_conn_id=None,
    )
    got = op.execute({})
    want = api.plan(SPEC, overrides=overrides, samples=str(csv))
    strip = lambda d: {k: v for k, v in d.items() if k not in VOLATILE}  # noqa: E731
    assert strip(got) == strip(want)
    assert got["stage"] == want["stage"]
    bad = DLRoverPlanOperator(
        task_id="plan",
        spec=SPEC,
        overrides="\n".join(overrides),
        samples=csv.read_text() + "1,1,x,1,100\n",
        dlrover_conn_id=None,
    )
    with pytest.raises(InputError, match=r"profile-samples\.csv:10: column 'worker_cpu'"):
        bad.execute({})


@pytest.mark.parametrize("status", ["failed", "stopped"])
def test_execute_complete_raises_unless_succeeded(status: str) -> None:
    op = DLRoverTrainOperator(task_id="train", spec=SPEC, dlrover_conn_id=None)
    event = {"status": status, "run_dir": "/r", "message": "m", "report": {"failure": "boom"}}
    with pytest.raises(AirflowException, match=status):
        op.execute_complete({}, event)


def test_execute_complete_returns_the_report() -> None:
    op = DLRoverTrainOperator(task_id="train", spec=SPEC, dlrover_conn_id=None)
    report = {"state": "succeeded", "auc": 0.7}
    assert op.execute_complete({}, {"status": "succeeded", "report": report}) == report


def test_on_kill_stops_the_recorded_process_group(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        (tmp_path / JOB_FILE).write_text(json.dumps({"pid": proc.pid, "hostname": "h"}))
        op = DLRoverTrainOperator(
            task_id="train", spec=SPEC, run_dir=str(tmp_path), dlrover_conn_id=None
        )
        op.on_kill()  # a fresh instance (after a deferral): finds the pid in the run dir
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class _TI:
    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def test_execute_complete_puts_the_model_path_in_xcom(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model_card.json").write_text("{}")
    op = DLRoverTrainOperator(task_id="train", spec=SPEC, dlrover_conn_id=None)
    ti = _TI()
    event = {"status": "succeeded", "run_dir": str(tmp_path), "report": {"state": "succeeded"}}
    out = op.execute_complete({"ti": ti}, event)
    assert out["model_dir"] == ti.pushed["model_dir"] == str(tmp_path / "model")


def test_train_keeps_the_history_password_out_of_argv_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    import dlrover_rm.operators.operators as ops

    url = "postgresql://user:s3cret@db.example/hist"
    seen: dict[str, Any] = {}

    class FakePopen:
        pid = 4242

        def __init__(self, cmd: list[str], **kw: Any) -> None:
            seen["cmd"], seen["env"] = cmd, kw.get("env") or {}

    monkeypatch.setattr(ops.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(ops.DLRoverHook, "history_url", property(lambda self: url))
    op = DLRoverTrainOperator(task_id="train", spec=SPEC, run_dir=str(tmp_path / "r"))
    with caplog.at_level("INFO"), pytest.raises(TaskDeferred):
        op.execute({})
    assert "s3cret" not in " ".join(seen["cmd"])
    assert seen["env"]["DLROVER_RM_HISTORY"] == url
    assert "s3cret" not in caplog.text
