"""The triggers: ``DLRoverJobTrigger`` waits for a local ``dlrover-rm train`` job (below);
``DLRoverKubernetesJobTrigger`` (end of the module) for a job submitted to Kubernetes.

``DLRoverJobTrigger``: waits, in the triggerer, for a ``dlrover-rm train`` job to end.

It polls ``dlrover_core.api.status(run_dir)`` (blocking IO, so in a thread) every
``poll_interval`` seconds and yields exactly one ``TriggerEvent``
``{"status": "succeeded"|"failed"|"stopped", "run_dir", "report", "message"}`` when the job ends.

The status reads the run directory even when the job master is gone, so a triggerer restart
(or another triggerer) picks the wait up from ``serialize()``. Two ways a job can end without a
terminal state, both reported as ``failed``:
- no ``master.json`` appears within ``start_timeout`` seconds (the job never started);
- the master process (``pid`` on ``hostname``; only checked on that host) is gone while the run
  directory still says the job is running.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

TERMINAL = ("succeeded", "failed", "stopped")
# after the job's terminal state, the model export and the history record are added to its
# report; a report that never says complete (a master of an older version) is taken after this
FINALIZE_S = 180.0


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, i.e. exited but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read_report(run_dir: str) -> dict[str, Any] | None:
    path = Path(run_dir) / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    report.setdefault("run_dir", str(run_dir))
    return report


class DLRoverJobTrigger(BaseTrigger):
    def __init__(
        self,
        run_dir: str,
        poll_interval: float = 5.0,
        *,
        pid: int | None = None,
        hostname: str | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        super().__init__()
        self.run_dir = str(run_dir)
        self.poll_interval = float(poll_interval)
        self.pid = pid
        self.hostname = hostname
        self.start_timeout = float(start_timeout)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "run_dir": self.run_dir,
                "poll_interval": self.poll_interval,
                "pid": self.pid,
                "hostname": self.hostname,
                "start_timeout": self.start_timeout,
            },
        )

    def _master_gone(self) -> bool:
        if self.pid is None or self.hostname != socket.gethostname():
            return False
        return not _alive(self.pid)

    def _event(self, status: str, message: str, report: dict[str, Any] | None) -> TriggerEvent:
        return TriggerEvent(
            {"status": status, "run_dir": self.run_dir, "message": message, "report": report}
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from dlrover_core import api
        from dlrover_core.errors import InputError

        started = time.monotonic()
        gone_once = False
        reported: float | None = None
        while True:
            try:
                st = await asyncio.to_thread(api.status, self.run_dir)
            except InputError:  # no master.json yet: the job is starting
                st = None
            state = (st or {}).get("job_state")
            if state in TERMINAL:
                # the state turns terminal just before report.json is written, and the export
                # and the history record are added to it after: wait until it says complete
                gone = self._master_gone()  # read after: a report read then is final
                report = await asyncio.to_thread(read_report, self.run_dir)
                if report is not None and reported is None:
                    reported = time.monotonic()
                waited = reported is not None and time.monotonic() - reported > FINALIZE_S
                if (report is not None and (report.get("complete") or waited)) or gone or gone_once:
                    # the report's state is the final word: a trained model the quality gate
                    # rejected ends "rejected" although the training succeeded
                    final = str((report or {}).get("state") or state)
                    yield self._event(final, f"job {final}", report)
                    return
                gone_once = self.pid is None and report is None  # no pid: one more poll
            elif self._master_gone():
                if gone_once:  # twice in a row: not a race with the last write
                    yield self._event(
                        "failed",
                        f"the job master (pid {self.pid}) exited while the run directory says "
                        f"{state or 'not started'}; see {self.run_dir}/airflow-train.log",
                        await asyncio.to_thread(read_report, self.run_dir),
                    )
                    return
                gone_once = True
            elif st is None and time.monotonic() - started > self.start_timeout:
                yield self._event(
                    "failed",
                    f"no job started in {self.run_dir} within {self.start_timeout:g} s; see "
                    f"{self.run_dir}/airflow-train.log",
                    None,
                )
                return
            await asyncio.sleep(self.poll_interval)


class DLRoverKubernetesJobTrigger(BaseTrigger):
    """Waits, in the triggerer (any host), for a job ``dlrover-rm submit`` put on Kubernetes
    (``backend.kind: kubernetes``): every ``poll_interval`` seconds it reads the master Job's
    state (``dlrover_core.api.job_status``) and the master pods' logs
    (``dlrover_core.api.master_logs``) through the Kubernetes API, in a thread, and logs the
    log lines it has not logged before into the task log. When the Job is Complete or Failed it
    yields one ``TriggerEvent`` ``{"status", "job", "namespace", "report", "message"}`` with the
    master's ``DLROVER-RM-REPORT`` line parsed as ``report``. A job that vanished (cancelled,
    deleted), a Job without a running master after ``start_timeout`` seconds, or an API that
    stays unreachable for ``outage_s`` seconds end it as ``failed`` with the reason.

    ``on_kill`` (the user marked the deferred task failed or cleared it) cancels the job.
    """

    def __init__(
        self,
        job: str,
        namespace: str = "default",
        poll_interval: float = 5.0,
        *,
        start_timeout: float = 600.0,
        outage_s: float = 300.0,
    ) -> None:
        super().__init__()
        self.job = str(job)
        self.namespace = str(namespace)
        self.poll_interval = float(poll_interval)
        self.start_timeout = float(start_timeout)
        self.outage_s = float(outage_s)
        self._logged: dict[str, int] = {}  # pod -> complete lines already logged

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job": self.job,
                "namespace": self.namespace,
                "poll_interval": self.poll_interval,
                "start_timeout": self.start_timeout,
                "outage_s": self.outage_s,
            },
        )

    def _poll(self) -> tuple[dict[str, Any], dict[str, str]]:
        from dlrover_core import api

        st = api.job_status(self.job, self.namespace)
        return st, api.master_logs(self.job, self.namespace)

    def _stream(self, logs: dict[str, str], final: bool) -> None:
        """Log the complete lines not logged before (the last, unfinished one too when the
        job has ended)."""
        from dlrover_core.runtime.backends.submit import new_log_lines

        lines, self._logged = new_log_lines(logs, self._logged, final)
        for pod, line in lines:
            self.log.info("%s | %s", pod, line)

    def _event(self, status: str, message: str, report: dict[str, Any] | None) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": status,
                "job": self.job,
                "namespace": self.namespace,
                "message": message,
                "report": report,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from dlrover_core.runtime.backends.submit import JobGoneError, job_outcome

        started = time.monotonic()
        ok_at = started
        where = f"job {self.job} in namespace {self.namespace}"
        while True:
            try:
                st, logs = await asyncio.to_thread(self._poll)
            except JobGoneError as e:
                yield self._event("failed", f"{where} is gone (cancelled or deleted): {e}", None)
                return
            except Exception as e:  # the API unreachable: retried until outage_s
                if time.monotonic() - ok_at > self.outage_s:
                    yield self._event(
                        "failed", f"cannot read {where} for {self.outage_s:g} s: {e}", None
                    )
                    return
                self.log.warning("cannot read %s (retrying): %s", where, e)
                await asyncio.sleep(self.poll_interval)
                continue
            ok_at = time.monotonic()
            outcome = job_outcome(st, logs)
            self._stream(logs, outcome is not None)
            if outcome is not None:
                yield self._event(*outcome)
                return
            if not logs and time.monotonic() - started > self.start_timeout:
                yield self._event(
                    "failed",
                    f"no master of {where} started within {self.start_timeout:g} s (state "
                    f"{st.get('state')}); see `kubectl describe job {self.job}-master -n "
                    f"{self.namespace}`",
                    None,
                )
                return
            await asyncio.sleep(self.poll_interval)

    async def on_kill(self) -> None:
        """The user killed the deferred task: cancel the job (idempotent)."""
        from dlrover_core import api

        res = await asyncio.to_thread(api.cancel, self.job, self.namespace)
        self.log.info("cancelled %s: deleted %s", self.job, ", ".join(res["deleted"]) or "nothing")
