"""The DLRover-RM hook: one Airflow connection names the history store and the backend.

Connection type ``dlrover`` (conn id ``dlrover_default`` unless an operator names another):

- ``history_url`` (extra, or the connection's host when no extra is set): the run-history store
  the planner warm-starts from (whatever ``dlrover_core.api.plan(history=...)`` accepts).
- ``backend`` (extra, optional): ``backend.kind`` for the job (e.g. ``local``), applied as a spec
  override in front of the operator's own overrides.
- ``overrides`` (extra, optional): more ``path=value`` spec overrides, a list or a comma string.

The form (fields, labels, placeholders) is declared in ``provider.get_provider_info``
(``conn-fields``, ``ui-field-behaviour``), which Airflow 3.3 reads without importing the hook;
:meth:`DLRoverHook.test_connection` backs the UI's Test button.

No connection (or a missing ``dlrover_default``) means: no history (cold start), the spec as is.
The hook holds no logic: it reads the connection and calls ``dlrover_core.api``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException


class DLRoverHook(BaseHook):
    conn_name_attr = "dlrover_conn_id"
    default_conn_name = "dlrover_default"
    conn_type = "dlrover"
    hook_name = "DLRover-RM"

    def __init__(self, dlrover_conn_id: str | None = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dlrover_conn_id = dlrover_conn_id

    @cached_property
    def extras(self) -> dict[str, Any]:
        """The connection's extras plus ``host``; empty when there is no connection."""
        if not self.dlrover_conn_id:
            return {}
        try:
            conn = self.get_connection(self.dlrover_conn_id)
        except AirflowNotFoundException as e:
            if self.dlrover_conn_id != self.default_conn_name:
                raise
            self.log.info("no %r connection (%s): cold start, spec as is", self.dlrover_conn_id, e)
            return {}
        out = dict(conn.extra_dejson or {})
        if conn.host and "history_url" not in out:
            out["history_url"] = conn.host
        return out

    @property
    def history_url(self) -> str | None:
        return self.extras.get("history_url") or None

    def overrides(self, more: Iterable[str] = ()) -> list[str]:
        """The connection's overrides (backend first), then ``more`` (the operator's win)."""
        out: list[str] = []
        if self.extras.get("backend"):
            out.append(f"backend.kind={self.extras['backend']}")
        extra = self.extras.get("overrides") or []
        out.extend(extra.split(",") if isinstance(extra, str) else extra)
        out.extend(more)
        return [o.strip() for o in out if o and o.strip()]

    # --- the seam --------------------------------------------------------------------------
    def profile(self, spec: Any, overrides: Iterable[str], out: str, n_configs: int) -> dict:
        from dlrover_core import api

        return api.profile(spec, overrides=self.overrides(overrides), out=out, n_configs=n_configs)

    def plan(
        self,
        spec: Any,
        overrides: Iterable[str],
        samples: str | None,
        history: str | None = None,
    ) -> dict[str, Any]:
        from dlrover_core import api

        if samples and "\n" in samples:
            # the samples CSV itself (the profile task's XCom): readable on any worker, where a
            # path would name a file on the worker that profiled
            import tempfile

            with tempfile.TemporaryDirectory(prefix="dlrover-rm-") as tmp:
                path = Path(tmp) / "profile-samples.csv"
                path.write_text(samples)
                return self.plan(spec, overrides, str(path), history)
        return api.plan(
            spec,
            overrides=self.overrides(overrides),
            samples=samples or None,
            history=history or self.history_url,
        )

    def test_connection(self) -> tuple[bool, str]:
        """The UI's "Test" button: open the history store and count its runs (no write)."""
        url = self.history_url
        if not url:
            return True, "no history store configured: plans start cold"
        from dlrover_core import api
        from dlrover_core.errors import DLRoverError
        from dlrover_core.history.redact import redact_url

        try:
            if url.removeprefix("file://").endswith(".json"):
                n = len(api.load_history(url))
            else:
                from dlrover_core.history.store import HistoryStore

                with HistoryStore(url) as store:
                    n = store.count()
        except DLRoverError as e:
            return False, str(e)
        return True, f"history store {redact_url(url)} reachable: {n} run(s)"

    def status(self, run_dir: str) -> Mapping[str, Any]:
        from dlrover_core import api

        return api.status(run_dir)
