"""Running a job on this machine, and reading a run directory (IO at the edge)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrover_core.errors import DLRoverError, InputError, StoreUnavailableError
from dlrover_core.runtime import state_url
from dlrover_core.runtime.backends.targets import target_for
from dlrover_core.spec import JobSpec
from dlrover_core.types import HistoryRecord, ResourcePlan, Role

if TYPE_CHECKING:
    from dlrover_core.training.pin import Pins

log = logging.getLogger(__name__)


def default_run_dir(spec: JobSpec) -> Path:
    return Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run the job (:func:`_train`); the pinned-inputs variable it sets for this process's
    reads is removed afterwards (a later job in this process has inputs of its own)."""
    from dlrover_core.training.pin import PIN_ENV

    before = os.environ.get(PIN_ENV)
    try:
        return _train(*args, **kwargs)
    finally:
        if before is None:
            os.environ.pop(PIN_ENV, None)
        else:
            os.environ[PIN_ENV] = before


def _train(
    spec: JobSpec,
    *,
    plan: ResourcePlan | None = None,
    run_dir: str | Path | None = None,
    history: list[HistoryRecord] | None = None,
    progress: bool = True,
    history_url: str | None = None,
    model_dir: str | Path | None = None,
    history_read: dict[str, Any] | None = None,
    init_note: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``history_read``: which store the history came from and how many records matched
    (``api.read_history``), for the report."""
    from dlrover_core.logs import quiet_third_party
    from dlrover_core.runtime.controller import JobMaster
    from dlrover_core.runtime.progress import Progress

    shown = Progress() if progress else None  # a tqdm bar on a terminal, log records elsewhere
    quiet_third_party()  # node processes inherit the filters: no pynvml warning in their logs
    rd = Path(run_dir) if run_dir else default_run_dir(spec)
    spec, clamp_note = fit_to_container(spec)
    target = target_for(spec)
    backend, extra = target.master_backend(spec)
    if run_dir is None:  # on Kubernetes: on the state volume, one path for master and nodes
        rd = target.run_dir(spec) or rd
    surl = state_url_of(spec, rd)
    if surl is not None:
        _state_url_start(spec, rd, surl)
    spec = snapshot_inputs(spec, rd)
    data, problem = check_data(spec)
    pins: Pins | None = None
    if problem is None:
        pins, problem = pin_inputs(spec, rd, data)
    if problem is not None:
        from dlrover_core.runtime.report import failed_report

        log.error("job %s not started: %s", spec.name, problem)
        report = failed_report(rd, spec, problem, {"data": data})
        report["run_dir"] = str(rd)
        report["history_run_id"] = None
        report["samples"] = []
        _complete(rd, report)
        if surl is not None:
            _publish(rd, report, surl, None)
        return report
    from dlrover_core.training.carry import prepare_parent

    lineage = prepare_parent(spec, rd)  # training.init_from: checked before anything starts
    on_tick = _with_input_check(shown, pins, data)
    master = JobMaster(  # it holds the strategy spec.strategy names (strategies.strategy_for)
        spec,
        rd,
        backend,
        **extra,
        plan=plan,
        history=history or [],
        on_tick=on_tick,
    )
    try:
        report = master.run()
    except BaseException:
        if shown is not None:
            shown.close()
        raise
    if shown is not None:
        shown.close(report)
    report["run_dir"] = str(rd)
    report["quota_clamped"] = clamp_note
    report["samples"] = [dataclasses.asdict(s) for s in master.samples]
    report["history_run_id"] = None
    if history_read is not None:
        report["history"] = dict(history_read)
    report["init_from"] = {**(init_note or {}), **(lineage or {})} or None
    mdir = Path(model_dir) if model_dir else rd / "model"
    if report.get("state") == "succeeded":
        if surl is not None:
            _pull_checkpoints(rd, surl)
        export_after_train(report, rd, mdir)
        gate_model(spec, report, rd, mdir, history or [])
    if surl is not None:
        report["run_url"] = surl
        report["model_url"] = state_url.join(surl, "model") if report.get("model_dir") else None
    _amend(rd, report, data)
    if report.get("state") in ("succeeded", "rejected") and master.plan is not None:
        # a rejected run is recorded too (its sizes are worth knowing), as not succeeded: no
        # warm start and no init_from: last reads it
        report["history_run_id"] = record_history(spec, report, master, history_url)
        if report["history_run_id"] is not None and (rd / "report.json").exists():
            from dlrover_core.runtime.report import amend_report

            amend_report(rd, {"history_run_id": report["history_run_id"]})  # for any reader
    _complete(rd, report)
    if surl is not None:
        _publish(rd, report, surl, mdir if report.get("model_url") else None)
    return report


def state_url_of(spec: JobSpec, rd: Path) -> str | None:
    """Where this run's durable files go when no claim is shared (``backend.state_url`` on
    Kubernetes without ``state_pvc``): ``<state_url>/<rd relative to the state mount>``, or
    ``<state_url>/runs/<job>`` for a run directory elsewhere. None otherwise."""
    b = spec.backend
    if b.kind != "kubernetes" or not b.state_url or b.state_pvc:
        return None
    import os

    mount = os.environ.get(state_url.ENV_STATE_MOUNT, b.state_mount_path)
    key = state_url.state_key(rd.absolute(), mount)
    return state_url.join(b.state_url, key if key else f"runs/{spec.name}")


def _state_url_start(spec: JobSpec, rd: Path, url: str) -> None:
    """Before the master starts: the job token from its Secret (the nodes get the same one)
    and ``spec.json`` at the URL, where the node pods read it."""
    import os

    from dlrover_core.runtime.files import atomic_write_json
    from dlrover_core.spec import spec_to_dict

    rd.mkdir(parents=True, exist_ok=True)
    token = os.environ.get(state_url.ENV_TOKEN)
    if token:
        state_url.write_token(rd, token)
    if not (rd / "spec.json").exists():
        atomic_write_json(rd / "spec.json", spec_to_dict(spec))
    try:
        state_url.push_files(rd, ["spec.json"], url)
    except OSError as e:
        raise InputError(
            f"cannot write to backend.state_url {url!r}: {e}; check the URL and the pod's "
            "credentials for it"
        ) from None
    log.info("state: run directory %s mirrored at %s", rd, url)


def _pull_checkpoints(rd: Path, url: str) -> None:
    """The PS checkpoints each PS pod pushed when it stopped, into the run directory (the
    export reads them there)."""
    try:
        n = state_url.pull_tree(state_url.join(url, "ps"), rd / "ps")
    except (DLRoverError, OSError) as e:
        log.error("cannot read the PS checkpoints at %s: %s", url, e)
        return
    log.info("state: %d checkpoint file(s) read from %s", n, state_url.join(url, "ps"))


def _publish(rd: Path, report: dict[str, Any], url: str, mdir: Path | None) -> None:
    """The exported model, then report.json, report.png and master.json, to the state URL:
    the run directory is scratch and goes with the pod. A failed copy is in the report (and
    the report line): never a model silently lost."""
    from dlrover_core.runtime.report import amend_report

    try:
        n = 0
        if mdir is not None:
            n += state_url.push_tree(mdir, state_url.join(url, "model"))
        n += state_url.push_files(rd, state_url.RUN_FILES, url)
        log.info("state: %d file(s) written to %s", n, url)
    except (DLRoverError, OSError) as e:
        why = f"the model and report could not be written to {url}: {e}"
        log.error("%s", why)
        report["model_url"] = None
        report["export_error"] = why
        if (rd / "report.json").exists():
            amend_report(rd, {"model_url": None, "export_error": why})


def _complete(rd: Path, report: dict[str, Any]) -> None:
    """Mark report.json complete: the export and the history record are in it. A reader that
    sees the job state terminal (the master's report is written first) waits for this."""
    from dlrover_core.runtime.report import amend_report

    report["complete"] = True
    if (rd / "report.json").exists():
        amend_report(rd, {"complete": True})


def fit_to_container(spec: JobSpec) -> tuple[JobSpec, str | None]:
    """On the local backend every node shares this container's cgroup: the quota is clamped
    to its ``cpu.max``/``memory.max`` less the master's share (``runtime/cgroup.py``). Returns
    the spec to run and the note when it was clamped. ``DLROVER_RM_CGROUP_ROOT`` points at
    another cgroup root (tests)."""
    if not target_for(spec).shares_container:
        return spec, None  # every node is a pod of its own
    import os

    from dlrover_core.runtime.cgroup import CGROUP_ROOT, clamp_quota, read_limits
    from dlrover_core.spec import QuotaSpec

    limits = read_limits(Path(os.environ.get("DLROVER_RM_CGROUP_ROOT", CGROUP_ROOT)))
    if not limits.any:
        return spec, None
    quota, note = clamp_quota(spec.quota.resources, limits, spec.minimum_job)
    if note is None:
        return spec, None
    log.warning("%s", note)
    q = QuotaSpec.model_validate(
        {"cpu": f"{quota.cpu_millicores}m", "memory": f"{quota.memory_mib}Mi"}
    )
    return spec.model_copy(update={"quota": q}), note


def snapshot_inputs(spec: JobSpec, rd: Path) -> JobSpec:
    """``data.snapshot``: copy the input into the run directory (once: a resumed job keeps
    the copy it took at its start) and train on the copy."""
    if not spec.data.snapshot or spec.data.path is None:
        return spec
    from dlrover_core.training.pin import SNAPSHOT_DIR, snapshot

    rd.mkdir(parents=True, exist_ok=True)
    try:
        copy = snapshot(spec.data.path, rd / SNAPSHOT_DIR)
    except OSError as e:
        raise InputError(
            f"data.snapshot: cannot copy data.path into {rd / SNAPSHOT_DIR} ({e}); free space "
            "there or set data.snapshot: false"
        ) from None
    log.info("data: training on a snapshot of the input, %s", copy)
    return spec.model_copy(update={"data": spec.data.model_copy(update={"path": copy})})


def pin_inputs(
    spec: JobSpec, rd: Path, data: dict[str, Any] | None
) -> tuple[Pins | None, str | None]:
    """Fingerprint the input files (``RUN/data_pin.json``), or on a resumed job check them
    against the fingerprints it started with: ``(pins, why the job cannot run or None)``; a
    change is also written into the report's data section (``data.changed``)."""
    from dlrover_core.training.data import from_spec
    from dlrover_core.training.pin import PIN_ENV, PIN_FILE, Pins, message

    if spec.data.path is None:
        return None, None
    path = rd / PIN_FILE
    if path.exists():  # a resumed job: the files it started with, checked in full
        pins = Pins.load(path)
        changed = pins.changes(deep=True)
        if changed:
            if data is not None:
                data["changed"] = changed
            return pins, message(changed)
    else:
        pins = Pins.of(from_spec(spec))
        rd.mkdir(parents=True, exist_ok=True)
        pins.save(path)
    os.environ[PIN_ENV] = str(path)  # this process's reads (the master's evaluation) check too
    return pins, None


def _with_input_check(
    shown: Any, pins: Pins | None, data: dict[str, Any] | None
) -> Callable[[Any], None] | None:
    """The master's per-tick hook: the progress display, then the pinned inputs' check; a
    change fails the job at once (the report's ``data.changed`` says which file, how)."""
    if pins is None:
        return shown
    from dlrover_core.training.pin import InputChangedError

    def tick(master: Any) -> None:
        if shown is not None:
            shown(master)
        if master.failure is not None:
            return
        try:
            pins.check()
        except InputChangedError as e:
            if data is not None:
                data["changed"] = e.changes
            master.failure = str(e)
            log.error("%s", master.failure)

    return tick


def check_data(spec: JobSpec) -> tuple[dict[str, Any] | None, str | None]:
    """Scan a file data source once before the job starts: ``(the report's data section,
    why the data is unusable or None)``. Generated data has nothing to scan."""
    from dlrover_core.training.data import data_quality, from_spec

    q = data_quality(from_spec(spec))
    if q is None:
        return None, None
    log.info(
        "data: %d records, %d malformed, %d held out in %d file(s)",
        q.records,
        q.malformed,
        q.held_out_records,
        len(q.files),
    )
    return q.to_dict(), q.problem(spec.data.eval_rows)


def _amend(rd: Path, report: dict[str, Any], data: dict[str, Any] | None) -> None:
    from dlrover_core.runtime.report import amend_report, json_safe

    keys = (
        "model_dir",
        "model_held_out",
        "export_error",
        "quota_clamped",
        "run_url",
        "model_url",
        "history",
        "init_from",
        "quality",
        "rejected_model_dir",
    )
    extra: dict[str, Any] = {k: report[k] for k in keys if k in report}
    if report.get("state") == "rejected":  # the gate's verdict after the master's report
        extra.update(state=report["state"], reason=report.get("reason"))
    if data is not None:
        extra["data"] = data
    if extra and (rd / "report.json").exists():
        amend_report(rd, extra)
    report.update(json_safe(extra))
    for k, v in list(report.items()):
        if isinstance(v, float):
            report[k] = json_safe(v)


REJECTED_DIR = "rejected"


def gate_model(
    spec: JobSpec, report: dict[str, Any], rd: Path, mdir: Path, history: list[HistoryRecord]
) -> None:
    """The quality gate (``quality.*``, :mod:`dlrover_core.quality`) on a trained model: a
    model that misses it is moved to ``RUN/rejected/model`` and the run ends ``rejected``
    (its report says why; nothing publishes the model)."""
    import shutil

    from dlrover_core.quality import gate

    held = report.get("model_held_out") or {}
    auc = held.get("auc") if held.get("auc") is not None else report.get("auc")
    prev = next(
        (
            r.extra.get("auc")
            for r in sorted(history, key=lambda r: r.finished_at_s, reverse=True)
            if r.succeeded and r.extra.get("auc") is not None
        ),
        None,
    )
    v = gate(spec.quality, auc, prev)
    report["quality"] = v.to_dict()  # report.json gets it (and a rejection) through _amend
    if v.passed:
        if spec.quality.min_auc is not None or spec.quality.max_auc_drop is not None:
            log.info("quality gate passed: %s", v.reason)
        return
    kept = None
    if mdir.exists():
        dest = rd / REJECTED_DIR / "model"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.move(str(mdir), str(dest))
        kept = str(dest)
    report.update(state="rejected", reason=v.reason, model_dir=None, rejected_model_dir=kept)
    log.error("model rejected: %s; kept in %s, published nowhere", v.reason, kept)


def export_after_train(report: dict[str, Any], run_dir: Path, out: Path) -> None:
    """Export the model of a successful run into ``out``; a failed export is reported (the
    run itself succeeded: ``dlrover-rm export`` can be retried on its run directory)."""
    from dlrover_core.runtime.export import export_run

    report["model_dir"] = None
    try:
        card = export_run(run_dir, out)
    except DLRoverError as e:
        log.error("model export failed: %s", e)
        report["export_error"] = str(e)
        return
    report["model_dir"] = str(out)
    report["model_held_out"] = card["held_out"]


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
    if url and url.lower() in ("none", "off"):
        return None  # `--history none`: no store read, none written
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
    """Live status from the master when it runs, else what the run directory holds.

    Reads the run directory read-only; a missing or corrupt file is one clear line
    (:class:`InputError`) naming it."""
    rd = Path(run_dir)
    if not rd.is_dir():
        raise InputError(
            f"run directory {str(rd)!r} does not exist; pass the --run-dir of a `dlrover-rm train`"
        )
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
        except (DLRoverError, OSError, ValueError, KeyError, TypeError):
            pass  # the master is not running (or the file is stale): read the files
    return _offline_status(rd)


def _read_json_file(path: Path, what: str) -> dict[str, Any]:
    fix = "restore it from a backup, or look at report.json and the logs/ folder"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} ({what}) is missing; {fix}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{path} ({what}) is corrupt: {e}; {fix}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} ({what}) is corrupt: not a JSON object; {fix}")
    return data


def read_shard_summary(path: Path) -> dict[str, int]:
    """Shard counts from a run's ``shards.db``, opened read-only (nothing is created or
    migrated); a corrupt or foreign file is one clear line."""
    import sqlite3

    if not path.exists():
        raise InputError(f"{path} (the shard queue) is missing; the run never started training")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            by_state = dict(con.execute("SELECT state, COUNT(*) FROM shards GROUP BY state"))
            (done_rows,) = con.execute(
                "SELECT COALESCE(SUM(end_row-start_row), 0) FROM shards WHERE state='done'"
            ).fetchone()
            (twice,) = con.execute("SELECT COUNT(*) FROM duplicates").fetchone()
            (retrained,) = con.execute(
                "SELECT COALESCE(SUM(s.end_row-s.start_row), 0) FROM duplicates d "
                "JOIN shards s ON s.id=d.shard_id"
            ).fetchone()
            meta = dict(con.execute("SELECT key, value FROM meta"))
            rows, size, epochs = (int(meta[k]) for k in ("total_rows", "shard_size", "epochs"))
        finally:
            con.close()
    except (sqlite3.Error, KeyError, ValueError, TypeError) as e:
        raise InputError(
            f"{path} (the shard queue) is corrupt or not a dlrover-rm shard table ({e}); "
            "restore it from a backup, or start the job in a new run directory"
        ) from None
    out = {k: int(by_state.get(k, 0)) for k in ("todo", "doing", "done", "failed")}
    out["total"] = -(-rows // max(size, 1)) * epochs
    out["completed_twice"] = int(twice)
    out["lost"] = out["total"] - sum(out[k] for k in ("todo", "doing", "done", "failed"))
    out["samples_done"] = int(done_rows)
    out["samples_total"] = rows * epochs
    out["samples_retrained"] = int(retrained)
    return out


def _offline_status(rd: Path) -> dict[str, Any]:
    snap = _read_json_file(rd / "master.json", "the master state")
    nodes = snap.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise InputError(f"{rd / 'master.json'} (the master state) is corrupt: bad nodes list")
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
            for n in nodes
        ],
        "shards": read_shard_summary(rd / "shards.db"),
        "global_step": snap.get("global_step", 0),
        "throughput_sps": None,
        "master_starts": snap.get("master_starts"),
    }
