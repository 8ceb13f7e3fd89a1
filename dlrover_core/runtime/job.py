"""Running a job on this machine, and reading a run directory (IO at the edge)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from dlrover_core.errors import DLRoverError, InputError, StoreUnavailableError
from dlrover_core.spec import JobSpec, parse_spec
from dlrover_core.types import HistoryRecord, ResourcePlan, Role

log = logging.getLogger(__name__)


def default_run_dir(spec: JobSpec) -> Path:
    return Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"


class ProgressPrinter:
    """One status line: samples, samples/s, nodes, the current plan."""

    def __init__(self, every_s: float = 1.0, stream: Any = None) -> None:
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self._last = 0.0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, master: Any) -> None:
        now = time.monotonic()
        if now - self._last < (self.every_s if self._tty else 5 * self.every_s):
            return
        self._last = now
        st = master.state
        q = st.shards
        done, total = q.samples_done, max(1, q.samples_total)
        width = 24
        fill = int(width * done / total)
        plan = master.plan
        obs = master.observations[-1] if master.observations else None
        tput = obs.throughput_sps if obs else 0.0
        nw = sum(1 for n in master.nodes.values() if n.role is Role.WORKER and n.handle)
        nps = sum(1 for n in master.nodes.values() if n.role is Role.PS and n.handle)
        line = (
            f"[{'#' * fill}{'.' * (width - fill)}] {done:,}/{total:,} samples  "
            f"{tput:,.0f}/s  workers {nw} ps {nps}  plan: {plan.stage.value if plan else '-'}"
        )
        if self._tty:
            self.stream.write("\r" + line[:150].ljust(150))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def train(
    spec: JobSpec,
    *,
    plan: ResourcePlan | None = None,
    run_dir: str | Path | None = None,
    history: list[HistoryRecord] | None = None,
    progress: bool = True,
    history_url: str | None = None,
) -> dict[str, Any]:
    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster

    if spec.backend.kind != "local":
        raise InputError(
            f"backend.kind {spec.backend.kind!r} is not available in this version; "
            "use backend.kind=local"
        )
    rd = Path(run_dir) if run_dir else default_run_dir(spec)
    master = JobMaster(
        spec,
        rd,
        LocalBackend(),
        plan=plan,
        history=history or [],
        on_tick=ProgressPrinter() if progress else None,
    )
    report = master.run()
    if progress:
        sys.stderr.write("\n")
    report["run_dir"] = str(rd)
    report["samples"] = [dataclasses.asdict(s) for s in master.samples]
    report["history_run_id"] = None
    if report.get("state") == "succeeded" and master.plan is not None:
        report["history_run_id"] = record_history(spec, report, master, history_url)
    return report


def run_peaks(observations: Any) -> dict[str, int | None]:
    """Peak CPU and memory used by one worker and by one PS over the run."""
    out: dict[str, int | None] = {}
    for role, name in ((Role.WORKER, "worker"), (Role.PS, "ps")):
        nodes = [n for o in observations for n in o.nodes if n.role is role]
        out[f"{name}_cpu_used_millicores"] = max(
            (n.cpu_used_millicores for n in nodes), default=None
        )
        out[f"{name}_memory_used_mib"] = max((n.memory_used_mib for n in nodes), default=None)
    return out


def record_history(
    spec: JobSpec, report: dict[str, Any], master: Any, history_url: str | None = None
) -> int | None:
    """Record a finished run in the history store (``history_url`` unless it is a JSON export,
    else the spec's ``history.url`` or the default). A store failure only warns."""
    from dlrover_core.history.store import HistoryStore
    from dlrover_core.spec import spec_to_dict

    url = history_url
    if url and url.removeprefix("file://").endswith(".json"):
        url = None
    store = None
    try:
        store = HistoryStore(url or spec.history.url)
        return store.record_run(
            spec_to_dict(spec),
            spec.signature_key,
            report,
            master.plan,
            list(master.samples),
            run_peaks(master.observations),
        )
    except StoreUnavailableError as e:
        log.warning("run not recorded in the history: %s", e)
        return None
    finally:
        if store is not None:
            store.close()


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """Live status from the master when it runs, else what the run directory holds."""
    rd = Path(run_dir)
    if not (rd / "master.json").exists():
        raise InputError(
            f"{str(rd)!r} is not a run directory (no master.json); pass the --run-dir of a "
            "`dlrover-rm train`"
        )
    addr = rd / "master.addr"
    if addr.exists():
        from dlrover_core.runtime import wire
        from dlrover_core.runtime.master_client import MasterClient

        try:
            info = json.loads(addr.read_text())
            c = MasterClient(info["address"], wire.read_token(rd), retry_for_s=1.0)
            try:
                st = c.status()
                st["source"] = "master"
                return st
            finally:
                c.close()
        except (DLRoverError, OSError, ValueError, KeyError):
            pass  # the master is not running: read the files
    return _offline_status(rd)


def _offline_status(rd: Path) -> dict[str, Any]:
    from dlrover_core.runtime.shards import ShardQueue
    from dlrover_core.training.data import from_spec

    snap = json.loads((rd / "master.json").read_text())
    spec = parse_spec(json.loads((rd / "spec.json").read_text()), source=str(rd / "spec.json"))
    q = ShardQueue.open(
        rd / "shards.db", from_spec(spec).num_rows, spec.shard_size, spec.training.epochs or 1
    )
    try:
        shards = q.summary()
    finally:
        q.close()
    return {
        "source": "run directory (master not running)",
        "job_state": snap.get("job_state"),
        "nodes": [
            {
                "role": n.get("role"),
                "id": n.get("node_id"),
                "pid": n.get("pid"),
                "state": n.get("state"),
                "restarts": n.get("restarts", 0),
            }
            for n in snap.get("nodes", [])
        ],
        "shards": shards,
        "global_step": snap.get("global_step", 0),
        "throughput_sps": None,
        "master_starts": snap.get("master_starts"),
    }
