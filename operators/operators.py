"""DLRover-RM operators: profile → plan → train, each a thin shell over ``dlrover_core.api``.

XCom results are JSON-able: the profile operator returns the samples CSV's text (the plan
operator's ``samples`` takes that text or a path), the plan operator the plan dict, the train
operator the job's report dict.

``DLRoverTrainOperator`` is deferrable: ``execute`` starts ``python -m dlrover_core.cli train``
as a detached process (its own session, so it outlives the worker slot and can be stopped as a
group), records ``{pid, hostname}`` in ``RUN_DIR/airflow-job.json`` and defers to
``DLRoverJobTrigger``; ``execute_complete`` returns the report or raises on a failed job.

With ``backend.kind: kubernetes`` (in the spec, the operator's overrides or the connection's
``backend``) ``execute`` instead submits the job's master as a Kubernetes Job
(``dlrover_core.api.run``, not waiting) and defers to ``DLRoverKubernetesJobTrigger``, which
watches it through the Kubernetes API from any triggerer and streams the master's log into the
task log; the worker and the triggerer need only a kubeconfig or an in-cluster service account.
``on_kill`` (and the trigger's ``on_kill``) cancel the job (``dlrover_core.api.cancel``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from dlrover_rm.operators.hooks import DLRoverHook
from dlrover_rm.operators.triggers import DLRoverJobTrigger, DLRoverKubernetesJobTrigger

JOB_FILE = "airflow-job.json"
PLAN_FILE = "airflow-plan.json"
LOG_FILE = "airflow-train.log"


def _overrides(value: str | Sequence[str] | None) -> list[str]:
    """Overrides as a list; a rendered template may give one string, one override a line."""
    if not value:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.splitlines() if v.strip()]
    return [str(v) for v in value]


def _default_path(context: Context, name: str) -> str:
    ti = context["ti"]
    run = re.sub(r"[^A-Za-z0-9_.-]", "_", str(context["run_id"]))
    return str(Path(tempfile.gettempdir()) / "dlrover-rm" / ti.dag_id / run / ti.task_id / name)


def _is_node(pid: int) -> bool:
    """Whether ``pid`` still runs a DLRover-RM node (not a reused pid): its environment says so."""
    try:
        return b"DLROVER_RM_ROLE=" in Path(f"/proc/{int(pid)}/environ").read_bytes()
    except (OSError, ValueError):
        return False


class _DLRoverBase(BaseOperator):
    ui_color = "#d9ecf2"

    def __init__(
        self,
        *,
        spec: str,
        overrides: str | Sequence[str] | None = None,
        dlrover_conn_id: str | None = DLRoverHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.overrides = overrides
        self.dlrover_conn_id = dlrover_conn_id

    @cached_property
    def hook(self) -> DLRoverHook:
        return DLRoverHook(dlrover_conn_id=self.dlrover_conn_id)


class DLRoverProfileOperator(_DLRoverBase):
    """Short real trials; returns the samples CSV's text (a few rows: an XCom the plan task
    reads on any worker, where a path would name a file on this one). The file is also
    written to ``out`` (or a per-run temp path) on this worker."""

    template_fields: Sequence[str] = ("spec", "overrides", "out", "n_configs")

    def __init__(self, *, out: str | None = None, n_configs: int | str = 6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.out = out
        self.n_configs = n_configs

    def execute(self, context: Context) -> str:
        out = self.out or _default_path(context, "samples.csv")
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        res = self.hook.profile(self.spec, _overrides(self.overrides), out, int(self.n_configs))
        for t in res["trials"]:
            self.log.info("trial %s", t)
        self.log.info("samples written to %s (returned as text)", res["out"])
        return Path(res["out"]).read_text()


class DLRoverPlanOperator(_DLRoverBase):
    """The plan dict (``api.plan``); also written to ``out`` when given."""

    template_fields: Sequence[str] = ("spec", "overrides", "samples", "history", "out")

    def __init__(
        self,
        *,
        samples: str | None = None,
        history: str | None = None,
        out: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.samples = samples
        self.history = history
        self.out = out

    def execute(self, context: Context) -> dict[str, Any]:
        result = self.hook.plan(
            self.spec, _overrides(self.overrides), self.samples or None, self.history
        )
        if self.out:
            Path(self.out).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out).write_text(json.dumps(result, indent=2) + "\n")
        self.log.info("plan: %s", json.dumps(result)[:2000])
        return result


class DLRoverTrainOperator(_DLRoverBase):
    """Train on the plan; deferrable; returns the report dict. ``plan`` may be a dict (an
    upstream XCom), a JSON string (a rendered template) or a plan file path."""

    template_fields: Sequence[str] = (
        "spec",
        "overrides",
        "plan",
        "run_dir",
        "poll_interval",
        "init_from",
    )

    def __init__(
        self,
        *,
        plan: Mapping[str, Any] | str | None = None,
        run_dir: str | None = None,
        poll_interval: float | str = 5.0,
        start_timeout: float = 300.0,
        init_from: str | None = None,
        **kwargs: Any,
    ) -> None:
        """``init_from``: start from an earlier model (``training.init_from``): ``"last"``
        (the newest of the signature in the history; a fresh start, said so, when none), a
        model directory or URL, e.g. ``"{{ ti.xcom_pull(task_ids='train', key='model_url',
        include_prior_dates=True) }}"`` (renders "None" before the first run: a fresh start)."""
        super().__init__(**kwargs)
        self.init_from = init_from
        self.plan = plan
        self.run_dir = run_dir
        self.poll_interval = poll_interval
        self.start_timeout = start_timeout

    def _plan_file(self, rd: Path) -> str | None:
        plan: Any = self.plan
        if isinstance(plan, str) and plan.strip().startswith("{"):
            plan = json.loads(plan)
        if isinstance(plan, Mapping):
            path = rd / PLAN_FILE
            path.write_text(json.dumps(dict(plan), indent=2) + "\n")
            return str(path)
        return str(plan) if plan else None

    def _init_over(self) -> list[str]:
        v = None if self.init_from is None else str(self.init_from).strip()
        if not v or v == "None":  # a template with nothing to render: the spec's own setting
            return []
        return [f"training.init_from={v}"]

    def _kubernetes_job(self) -> tuple[str, str] | None:
        """``(job, namespace)`` when the spec (after every override) runs on Kubernetes."""
        from dlrover_core import api

        js = api.resolve_spec(self.spec, self.hook.overrides(_overrides(self.overrides)))
        return (js.name, js.backend.namespace) if api.submits(js) else None

    def _submit(self, job: tuple[str, str]) -> None:
        from dlrover_core import api

        url = self.hook.history_url
        if url and url.removeprefix("file://").endswith(".json"):
            self.log.warning(
                "the connection's history is a JSON export on this host; the master on "
                "Kubernetes cannot read it and records to the spec's history.url"
            )
            url = None
        if url and url.lower() in api.NO_HISTORY:
            url = None
        plan: Any = self.plan or None
        if isinstance(plan, str) and plan.strip().startswith("{"):
            plan = json.loads(plan)  # a rendered template
        # the connection's store (it may hold a password) goes into a Secret the Job owns;
        # the master reads it from there, never from its command line or the ConfigMap
        res = api.run(
            self.spec,
            overrides=[*self.hook.overrides(_overrides(self.overrides)), *self._init_over()],
            plan=plan,
            history=url or None,
            wait=False,  # the trigger follows it while the task is deferred
        )
        self.k8s_job = job
        self.log.info(
            "submitted job %s to namespace %s: %s", job[0], job[1], ", ".join(res["created"])
        )
        self.defer(
            trigger=DLRoverKubernetesJobTrigger(
                job[0], job[1], float(self.poll_interval), start_timeout=self.start_timeout
            ),
            method_name="execute_complete",
        )

    def execute(self, context: Context) -> None:
        job = self._kubernetes_job()
        if job is not None:
            self._submit(job)
            return
        rd = Path(self.run_dir or _default_path(context, "run"))
        rd.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "dlrover_core.cli", "--log-level", "info"]
        cmd += ["run", "--spec", str(self.spec)]
        cmd += ["--run-dir", str(rd)]
        plan = self._plan_file(rd)
        if plan:
            cmd += ["--plan", plan]
        env = dict(os.environ)
        url = self.hook.history_url
        if url and url.removeprefix("file://").endswith(".json"):
            cmd += ["--history", url]  # a JSON export: a path, no credential
        elif url:
            # a database URL may hold a password: pass it in the environment, not the argv
            # (which `ps` shows every user) and never in a log line
            env["DLROVER_RM_HISTORY"] = url
            cmd += ["--set", "history.url=null"]
        for o in [*self.hook.overrides(_overrides(self.overrides)), *self._init_over()]:
            cmd += ["--set", o]
        from dlrover_core.history.redact import redact_text

        self.log.info("starting: %s", redact_text(" ".join(cmd)))
        with open(rd / LOG_FILE, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=os.getcwd(),
                env=env,
            )
        self.job_pid = proc.pid
        host = socket.gethostname()
        (rd / JOB_FILE).write_text(json.dumps({"pid": proc.pid, "hostname": host}) + "\n")
        self.defer(
            trigger=DLRoverJobTrigger(
                str(rd),
                float(self.poll_interval),
                pid=proc.pid,
                hostname=host,
                start_timeout=self.start_timeout,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        status, report = event.get("status"), event.get("report")
        where = (
            f"{event['job']} in namespace {event.get('namespace')}"
            if event.get("job")
            else f"in {event.get('run_dir')}"
        )
        if status != "succeeded":  # failed, stopped, or rejected by the quality gate
            r = report or {}
            raise AirflowException(
                f"DLRover-RM job {where} {status}: "
                f"{r.get('failure') or r.get('reason') or event.get('message')}"
                + (
                    f"; model kept in {r['rejected_model_dir']}"
                    if r.get("rejected_model_dir")
                    else ""
                )
            )
        report = dict(report or {})
        if event.get("job"):  # on Kubernetes: on the job's state volume, or at its state URL
            if report.get("run_url") and not report.get("model_url"):
                raise AirflowException(
                    f"DLRover-RM job {where} succeeded but its model is not at "
                    f"{report['run_url']}: {report.get('export_error') or 'not exported'}"
                )
            if report.get("model_url"):  # no claim: the master wrote it to backend.state_url
                report["model_dir"] = str(report["model_url"])
                context["ti"].xcom_push(key="model_url", value=str(report["model_url"]))
            if report.get("model_dir"):
                context["ti"].xcom_push(key="model_dir", value=str(report["model_dir"]))
            self.log.info("job succeeded: %s", json.dumps(report)[:2000])
            return report
        model_dir = Path(str(event.get("run_dir") or report.get("run_dir") or "")) / "model"
        if (model_dir / "model_card.json").exists():
            report["model_dir"] = str(model_dir)
            context["ti"].xcom_push(key="model_dir", value=str(model_dir))
            # the next run's init_from (a path here; a URL when the job ran on Kubernetes)
            context["ti"].xcom_push(key="model_url", value=str(model_dir))
        self.log.info("job succeeded: %s", json.dumps(report)[:2000])
        return report

    def on_kill(self) -> None:
        """Stop the job. On Kubernetes: cancel it (the master Job, its pods, the nodes).
        Locally: SIGTERM the master's process group, then its nodes' groups (the local backend
        starts every node in a session of its own, so they survive the master)."""
        job = getattr(self, "k8s_job", None)
        if job is None:
            try:
                job = self._kubernetes_job()
            except Exception as e:  # best effort: a spec that does not load ran nothing
                self.log.warning("cannot read the spec to stop its job: %s", e)
        if job is not None:
            from dlrover_core import api

            res = api.cancel(job[0], job[1])
            self.log.info("cancelled job %s: deleted %s", job[0], ", ".join(res["deleted"]))
            return
        rd = Path(self.run_dir) if self.run_dir else None
        pid = getattr(self, "job_pid", None)
        if pid is None and rd is not None and (rd / JOB_FILE).exists():
            pid = json.loads((rd / JOB_FILE).read_text()).get("pid")
        if pid is None:
            return
        self._signal_group(int(pid))
        if rd is None:
            return
        try:
            nodes = self.hook.status(str(rd)).get("nodes") or []
        except Exception as e:  # best effort: the run dir may be half written
            self.log.warning("could not read the nodes of %s: %s", rd, e)
            return
        for n in nodes:
            if n.get("pid") and n.get("state") in ("running", "pending") and _is_node(n["pid"]):
                self._signal_group(int(n["pid"]))

    def _signal_group(self, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGTERM)
            self.log.info("sent SIGTERM to process group %d", pid)
        except ProcessLookupError:
            pass
        except PermissionError as e:
            self.log.warning("cannot stop process group %d: %s", pid, e)
