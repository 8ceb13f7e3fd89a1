"""The one seam: every shell (CLI, KFP component, Airflow operator) calls these functions with
JSON-able arguments and gets JSON-able results back."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dlrover_core.errors import DLRoverError, InputError, StoreUnavailableError
from dlrover_core.history.records import read_history_json
from dlrover_core.model.samples_io import read_configs_csv, read_samples_csv
from dlrover_core.model.throughput import fit_throughput_model, model_from_dict
from dlrover_core.planner import Planner
from dlrover_core.runtime.report_line import (  # noqa: F401 - the seam keeps these names
    REPORT_LINE,
    REPORT_LINE_FIELDS,
    parse_report_line,
    report_line,
)
from dlrover_core.spec import JobSpec, load_spec
from dlrover_core.types import HistoryRecord, NodeResources, ResourcePlan, Sample
from dlrover_core.units import milliseconds

SpecLike = str | Path | Mapping[str, Any] | JobSpec

MASTER_RESOURCES = NodeResources(cpu_millicores=500, memory_mib=1024)
"""What the job master itself needs beside the nodes (measured: ~0.2 core, ~400 MiB RSS)."""

SUBMITTER_RESOURCES = NodeResources(cpu_millicores=250, memory_mib=512)
"""A pipeline step that submits a job to Kubernetes and follows it (the master and the nodes
run in pods of their own): the Kubernetes client polling, the log streamed, the report
rendered. Measured: see docs/decisions.md, "Kubernetes"."""

log = logging.getLogger(__name__)


def resolve_spec(spec: SpecLike, overrides: Iterable[str] = ()) -> JobSpec:
    if isinstance(spec, JobSpec):
        if overrides:
            from dlrover_core.spec import spec_to_dict

            return load_spec(spec_to_dict(spec), overrides)
        return spec
    return load_spec(spec, overrides)


NO_HISTORY = ("none", "off")
"""``--history none``: plan cold, read no store."""


def history_source(url: str | None, spec: JobSpec | None = None) -> str | None:
    """Which store :func:`load_history` reads for these arguments, password hidden (None: no
    store is read)."""
    from dlrover_core.history.redact import redact_url

    if url and url.lower() in NO_HISTORY:
        return None
    if url:
        return redact_url(url)
    if spec is None:
        return None
    if spec.history.url:
        return redact_url(spec.history.url)
    from dlrover_core.history.store import default_url

    return redact_url(default_url())


def read_history(
    url: str | None, spec: JobSpec | None = None, now_s: float | None = None
) -> tuple[list[HistoryRecord], dict[str, Any]]:
    """:func:`load_history`, and what it read, for the plan and the report: ``{"store": the
    URL (password hidden; None: none read), "records": how many matched, "error": why the store
    could not be read (only with ``history.on_error: cold_start``)}``."""
    info: dict[str, Any] = {"store": history_source(url, spec), "records": 0}
    try:
        recs = _read_records(url, spec, now_s)
    except StoreUnavailableError as e:
        if spec is None or spec.history.on_error != "cold_start":
            raise StoreUnavailableError(
                f"{e} (or set history.on_error: cold_start to plan without it when it is down)"
            ) from None
        log.warning("%s; planning without history (cold start: history.on_error)", e)
        info["error"] = str(e)
        return [], info
    info["records"] = len(recs)
    return recs, info


def load_history(
    url: str | None, spec: JobSpec | None = None, now_s: float | None = None
) -> list[HistoryRecord]:
    """Records for warm start (:func:`read_history` without what it read).

    A JSON export (``path.json`` or ``file://path.json``) is read as is. Anything else is a
    history store URL (SQLAlchemy); with no URL, the spec's ``history.url`` or the default store
    (only when a spec says which signature to look for). With a spec, the store returns the
    successful runs of its signature in its ``pacing.history_window_s``. A store that cannot be
    read (down, unknown driver, malformed URL) raises :class:`StoreUnavailableError` (one line
    naming the URL and the fix), unless the spec says ``history.on_error: cold_start``: then
    it logs a warning and gives no records, and planning starts cold.
    """
    return read_history(url, spec, now_s)[0]


def _read_records(
    url: str | None, spec: JobSpec | None, now_s: float | None
) -> list[HistoryRecord]:
    """The records :func:`load_history` describes; a store that cannot be read raises."""
    if url and url.lower() in NO_HISTORY:
        return []
    if url:
        path = url.removeprefix("file://")
        if path.endswith(".json"):
            return read_history_json(path)
    elif spec is None:
        return []
    from dlrover_core.history.store import HistoryStore

    store = HistoryStore(url or (spec.history.url if spec is not None else None))
    try:
        if spec is None:
            return _all_records(store)
        return store.similar(
            spec.signature_key,
            now_s if now_s is not None else time.time(),
            spec.pacing.history_window_s,
        )
    finally:
        store.close()


def read_similar(
    url: str | None, spec: JobSpec, records: Sequence[HistoryRecord], now_s: float | None = None
) -> list[HistoryRecord]:
    """Runs of other signatures, with the spec each ran, for the similar-job prior of a
    signature that has no run of its own (and strategy) in ``records``
    (planner/similar.py); none when it has one, when the history is a JSON export (it holds
    every signature already) or none, or when the store cannot be read (a warning: the plan
    then starts as it would without them)."""
    from dlrover_core.planner.warm_start import similar_runs

    now = now_s if now_s is not None else time.time()
    window = spec.pacing.history_window_s
    if similar_runs(spec, records, now, window):
        return []
    if url and (url.lower() in NO_HISTORY or url.removeprefix("file://").endswith(".json")):
        return []
    from dlrover_core.history.store import HistoryStore

    store = HistoryStore(url or spec.history.url)
    try:
        recent = store.recent(now, window)
    except StoreUnavailableError as e:
        log.warning("similar jobs not read: %s", e)
        return []
    finally:
        store.close()
    return [r for r in recent if r.signature != spec.signature_key]


def _all_records(store: Any) -> list[HistoryRecord]:
    """Every successful run in the store, for callers that give no spec to filter by."""
    now = time.time()
    return [r for s in store.signatures() for r in store.similar(s, now, now)]


def plan(
    spec: SpecLike,
    *,
    overrides: Iterable[str] = (),
    samples: str | Path | Sequence[Sample] | None = None,
    history: str | None = None,
    now_s: float | None = None,
) -> dict[str, Any]:
    """Stage 1 (and stage 2 when ``samples`` identify the model): the plan as a dict."""
    js = resolve_spec(spec, overrides)
    smp = read_samples_csv(samples) if isinstance(samples, (str, Path)) else list(samples or [])
    recs, read = read_history(history, js, now_s)
    near = read_similar(history, js, recs, now_s) if "error" not in read else []
    if near:
        read["similar_records"] = len(near)
    t0 = time.perf_counter()
    p = Planner(js).offline_plan(smp, [*recs, *near], now_s if now_s is not None else time.time())
    out = p.to_dict()
    # a pipeline step that runs the whole job (local backend) hosts every node plus the
    # master; on Kubernetes it only submits and follows (the master and the nodes are pods)
    step = SUBMITTER_RESOURCES if js.backend.kind == "kubernetes" else p.total + MASTER_RESOURCES
    out["train_step"] = step.to_dict()
    out["backend"] = js.backend.kind
    out["job"] = js.name
    out["signature"] = js.signature_key
    out["planning_ms"] = round(milliseconds(time.perf_counter() - t0), 3)
    # which run history the plan read (never silently the default store)
    out["history"] = read
    return out


_first_plan = plan  # for functions whose ``plan`` argument (a given plan) shadows this one


def fit_model(
    samples: str | Path, out: str | Path | None = None, strategy: str = "ps"
) -> dict[str, Any]:
    smp = read_samples_csv(samples)
    batch = next((s.batch_size for s in smp if s.batch_size), 512)
    model = fit_throughput_model(smp, strategy, batch_size=batch)
    d = model.to_dict()
    if out is not None:
        Path(out).write_text(json.dumps(d, indent=2) + "\n")
    return d


def predict(model: str | Path | Mapping[str, Any], configs: str | Path) -> str:
    """CSV text: the input columns plus ``predicted_throughput`` (and its bounds)."""
    if isinstance(model, Mapping):
        md = dict(model)
    else:
        mp = Path(model)
        if not mp.exists():
            raise InputError(
                f"model file {str(mp)!r} does not exist; write one with `dlrover-rm model fit`"
            )
        try:
            md = json.loads(mp.read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"model file {str(mp)!r} is not valid JSON: {e}") from None
    m = model_from_dict(md)
    header, rows, arr = read_configs_csv(configs)
    x, lo, up = m.predict_bounds_many(arr)
    buf = io.StringIO()
    import csv

    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*header, "predicted_throughput", "predicted_lower", "predicted_upper"])
    for row, a, b, c in zip(rows, x, lo, up, strict=True):
        w.writerow([*row, f"{a:.6g}", f"{b:.6g}", f"{c:.6g}"])
    return buf.getvalue()


MAX_SIM_JOBS = 100_000


def simulate(
    jobs: int = 200,
    seed: int = 0,
    policies: Sequence[str] | None = None,
    allreduce_share: float = 0.0,
) -> dict[str, Any]:
    """Every policy (or ``policies``) on one generated trace of ``jobs`` jobs;
    ``allreduce_share`` of its signatures train by all-reduce (ranks, no PS)."""
    from dlrover_core.sim.runner import available_policies
    from dlrover_core.sim.runner import simulate as run_sim

    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_SIM_JOBS:
        raise InputError(f"--jobs must be a whole number in 1..{MAX_SIM_JOBS:,}; got {jobs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise InputError(f"--seed must be a whole number in 0..{2**32 - 1}; got {seed!r}")
    if (
        isinstance(allreduce_share, bool)
        or not isinstance(allreduce_share, (int, float))
        or not 0.0 <= allreduce_share <= 1.0
    ):
        raise InputError(
            f"--allreduce-share must be a number in 0..1 (the share of all-reduce jobs); "
            f"got {allreduce_share!r}"
        )
    if policies is not None:
        names = [str(p).strip() for p in policies]
        known = available_policies()
        if not names or any(not n for n in names):
            raise InputError(
                f"--policies has an empty name; give comma-separated names from: {', '.join(known)}"
            )
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(
                f"unknown polic{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"choose from: {', '.join(known)}"
            )
        policies = names
    return run_sim(jobs, seed, policies, allreduce_share=float(allreduce_share))


def train(
    spec: SpecLike,
    *,
    overrides: Iterable[str] = (),
    plan: str | Path | Mapping[str, Any] | None = None,
    run_dir: str | Path | None = None,
    history: str | None = None,
    progress: bool = True,
    model_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run the job on this machine (local processes); returns the report dict.

    A successful run exports its model to ``model_dir`` (default ``RUN_DIR/model``); the
    report's ``model_dir`` says where (None when the export failed: ``export_error`` says why).
    """
    from dlrover_core.runtime.job import train as run_job

    js = resolve_spec(spec, overrides)
    rp = _resolve_plan(plan)
    recs, read = read_history(history, js)
    js, init_note = resolve_init_from(js, recs)
    if rp is None and "error" not in read:
        rp = _similar_first_plan(js, recs, read, history)
    return run_job(
        js,
        plan=rp,
        run_dir=run_dir,
        history=recs,
        progress=progress,
        history_url=history,
        model_dir=model_dir,
        history_read=read,
        init_note=init_note,
    )


def run(
    spec: SpecLike,
    *,
    overrides: Iterable[str] = (),
    plan: str | Path | Mapping[str, Any] | None = None,
    run_dir: str | Path | None = None,
    history: str | None = None,
    history_secret: str | None = None,
    dry_run: bool = False,
    wait: bool = True,
    progress: bool = True,
    model_dir: str | Path | None = None,
    poll_interval: float = 5.0,
    on_line: Any = None,
) -> dict[str, Any]:
    """Run the job wherever its spec says (``backend.kind``), the one verb every shell uses
    (the CLI's ``run``, the KFP train component, the Airflow train operator).

    - The job master runs in this process (local processes; or in the master's own pod on
      Kubernetes): :func:`train`; returns the report.
    - Kubernetes, from outside the master's pod: :func:`submit`, then (``wait``) follow the
      job to its end and return its report (:func:`submit_and_follow`); without ``wait``,
      what was created.
    - ``dry_run``: nothing is created or started; returns the request that would be: the
      master's command and the first plan's nodes, or the Kubernetes objects (Secret values
      left out)."""
    from dlrover_core.runtime.backends.targets import master_here_request, target_for

    js = resolve_spec(spec, overrides)
    target = target_for(js)
    here = not target.submits or in_master_pod()
    if dry_run:
        rp = _resolve_plan(plan)
        out: dict[str, Any] = {"dry_run": True, "job": js.name, "backend": target.kind}
        out["plan"] = rp.to_dict() if rp is not None else None
        if here:
            if rp is None:  # the first plan the master would make (stage 1, read-only)
                out["plan"] = _first_plan(js, history=history)
            where = run_dir or target.run_dir(js)
            return out | master_here_request(js, out["plan"], where, plan_given=rp is not None)
        from dlrover_core.runtime.backends.manifests import submit_objects

        _, cfg, url, _ = _submission(js, (), plan, history, history_secret)
        objects = submit_objects(cfg, "<generated at submit>", url)
        for o in objects:
            if o.get("kind") == "Secret":
                o["stringData"] = {k: "<hidden>" for k in o.get("stringData") or {}}
                o.pop("data", None)
        out["master"] = {"where": f"a Job in namespace {cfg.namespace}"}
        return out | {"objects": objects, "nodes": "pods, created by the master as it plans"}
    if here:
        return train(js, plan=plan, run_dir=run_dir, history=history, progress=progress,
                     model_dir=model_dir)  # fmt: skip
    if not wait:
        return submit(js, plan=plan, history_url=history, history_secret=history_secret)
    return submit_and_follow(
        js,
        plan=plan,
        history_url=history,
        history_secret=history_secret,
        poll_interval=poll_interval,
        on_line=on_line,
    )


def submits(spec: SpecLike, overrides: Iterable[str] = ()) -> bool:
    """Whether :func:`run` submits this job (its master runs elsewhere) from this process."""
    from dlrover_core.runtime.backends.targets import target_for

    return target_for(resolve_spec(spec, overrides)).submits and not in_master_pod()


def _similar_first_plan(
    js: JobSpec, recs: Sequence[HistoryRecord], read: dict[str, Any], history: str | None
) -> ResourcePlan | None:
    """The first plan from similar jobs' runs, for a signature with no run of its own (the
    master's own stage 1 sees only the signature's records); None otherwise."""
    now = time.time()
    near = read_similar(history, js, recs, now)
    if not near:
        return None
    first = Planner(js).initial_plan([*recs, *near], now)
    if not first.reasons or not first.reasons[0].startswith("similar-job prior"):
        return None
    read["similar_records"] = len(near)
    return first


def resolve_init_from(
    js: JobSpec, history: Sequence[HistoryRecord]
) -> tuple[JobSpec, dict[str, Any] | None]:
    """``training.init_from: last`` made concrete: the newest model of the signature in the
    history, or none (a fresh start, said in the log and the report). Also an empty value or
    a template that rendered to nothing (Airflow's "None" when no earlier XCom exists)."""
    from dlrover_core.training.carry import LAST, last_model

    src = js.training.init_from
    if src is None:
        return js, None
    if src.strip() in ("", "None", "null", "none"):
        note = {"source": src, "model": None, "note": "no model given: a fresh start"}
        log.info("training.init_from is empty: a fresh start")
        return _with_init(js, None), note
    if src != LAST:
        return js, None
    model, why = last_model(history)
    if model is None:
        log.warning("training.init_from: last: %s", why)
    else:
        log.info("training.init_from: last: %s, %s", why, model)
    return _with_init(js, model), {"source": LAST, "model": model, "note": why}


def _with_init(js: JobSpec, model: str | None) -> JobSpec:
    t = js.training.model_copy(update={"init_from": model})
    return js.model_copy(update={"training": t})


def _resolve_plan(plan: str | Path | Mapping[str, Any] | None) -> Any:
    """A :class:`ResourcePlan` from a plan dict or a plan file (None for None)."""
    from dlrover_core.types import ResourcePlan

    if plan is None:
        return None
    if isinstance(plan, Mapping):
        try:
            return ResourcePlan.from_dict(dict(plan))
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise InputError(f"the plan given is not a plan from `plan` ({e!r})") from None
    pp = Path(plan)
    if not pp.exists():
        raise InputError(
            f"plan file {str(pp)!r} does not exist; write one with `dlrover-rm plan --out`"
        )
    return read_plan_file(pp)


def export(run_dir: str | Path, out: str | Path) -> dict[str, Any]:
    """Export the model a finished run trained (``model.pt`` + ``model_card.json`` in ``out``);
    returns the model card. Load it with :func:`dlrover_core.training.load_exported`."""
    from dlrover_core.runtime.export import export_run

    return export_run(run_dir, out)


def read_plan_file(path: Path) -> Any:
    """A :class:`ResourcePlan` from a file ``dlrover-rm plan --out`` wrote; one clear line
    for anything else (not UTF-8, not JSON, a list or a string, missing fields)."""
    from dlrover_core.types import ResourcePlan

    what = f"plan file {str(path)!r}"
    fix = "write one with `dlrover-rm plan --out PLAN.json`"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{what} is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{what} is not valid JSON ({e}); {fix}") from None
    if not isinstance(data, dict):
        raise InputError(
            f"{what} holds a JSON {type(data).__name__}, not a plan (a JSON object with "
            f"workers, ps, stage ...); {fix}"
        )
    try:
        return ResourcePlan.from_dict(data)
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        missing = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise InputError(f"{what} is not a plan written by `dlrover-rm plan` ({missing})") from None


def status(run_dir: str | Path) -> dict[str, Any]:
    from dlrover_core.runtime.job import read_status

    return read_status(run_dir)


def _submission(
    spec: SpecLike,
    overrides: Iterable[str],
    plan: str | Path | Mapping[str, Any] | None,
    history_url: str | None,
    history_secret: str | None,
) -> tuple[JobSpec, Any, str | None, tuple[str, str] | None]:
    """What :func:`submit` sends (pure; the dry run shows it): the spec, the master's config,
    the history URL for the job's own Secret, and the history Secret reference."""
    import yaml

    from dlrover_core.history.redact import redact_url
    from dlrover_core.runtime.backends import manifests as k8s
    from dlrover_core.spec import spec_to_dict

    s = resolve_spec(spec, overrides)
    rp = _resolve_plan(plan)
    if history_url is not None and history_secret is not None:
        raise InputError(
            "give the history store as a URL or as a Secret (--history-secret), not both"
        )
    if history_url is not None and history_url.lower() in NO_HISTORY:
        raise InputError(
            "on Kubernetes the master records every run; give a history store URL or a Secret"
        )
    url = history_url
    spec_url = s.history.url
    if url is None and history_secret is None and spec_url and redact_url(spec_url) != spec_url:
        url = spec_url  # a password: into the job's Secret, not the ConfigMap
    ref = k8s.parse_secret_ref(history_secret) if history_secret is not None else None
    if url is not None:
        ref = (f"{s.name}-history", k8s.HISTORY_SECRET_KEY)
    if ref is not None and s.history.url:
        s = resolve_spec(s, ["history.url=null"])  # the Secret's URL wins (the env is read)
    told = s
    if not s.backend.state_pvc and not s.backend.state_url:
        # submit creates the job's own claim (<job>-state): the master is told its name, or
        # it would refuse to run nodes without one
        told = resolve_spec(s, [f"backend.state_pvc={k8s.default_pvc_name(s.name)}"])
    cfg = k8s.MasterConfig.from_spec(
        s,
        yaml.safe_dump(spec_to_dict(told), sort_keys=False),
        plan_json=json.dumps(rp.to_dict(), allow_nan=False) if rp is not None else None,
        history_secret=ref,
    )
    return s, cfg, url, ref


def submit(
    spec: SpecLike,
    *,
    overrides: Iterable[str] = (),
    plan: str | Path | Mapping[str, Any] | None = None,
    history_url: str | None = None,
    history_secret: str | None = None,
) -> dict[str, Any]:
    """Submit the job to Kubernetes: its master as a Job (restarted by the control plane; it
    resumes from its state on the volume), with its Service, token Secret, spec ConfigMap,
    NetworkPolicy and state claim. Needs ``backend.kind: kubernetes``. ``plan`` (a plan dict
    or a plan file from ``plan``) travels in the ConfigMap and the master trains on it;
    without one the master plans the job itself.

    The run history the master reads and records to: ``history_secret`` (``NAME`` or
    ``NAME:KEY`` of a Secret you made, key ``url`` by default), or ``history_url``, which
    goes into a Secret of the job's own (``<job>-history``, owned by the Job), or the spec's
    ``history.url`` (moved into that Secret when it holds a password). Either way the master
    reads it as ``$DLROVER_RM_HISTORY`` from the Secret: the URL is never in the ConfigMap,
    the master's command line or a log line."""
    import secrets

    from dlrover_core.runtime.backends import submit as k8s
    from dlrover_core.runtime.backends.kubernetes_api import _default_client

    s, cfg, url, ref = _submission(spec, overrides, plan, history_url, history_secret)
    created = k8s.submit(_default_client(), cfg, secrets.token_hex(32), history_url=url)
    out: dict[str, Any] = {"job": s.name, "namespace": cfg.namespace, "created": created}
    out["history"] = {"secret": f"{ref[0]}:{ref[1]}"} if ref is not None else None
    return out


def follow(
    job: str,
    namespace: str = "default",
    *,
    poll_interval: float = 5.0,
    start_timeout: float = 600.0,
    outage_s: float = 300.0,
    on_line: Any = None,
) -> dict[str, Any]:
    """Wait for a submitted job through the Kubernetes API, handing each new line of its
    master's log to ``on_line(pod, line)`` (default: log it); returns ``{"status", "job",
    "namespace", "message", "report"}``, ``report`` being the master's report line (see
    :func:`report_line`)."""
    from dlrover_core.runtime.backends import submit as k8s
    from dlrover_core.runtime.backends.kubernetes_api import _default_client

    def log_line(pod: str, line: str) -> None:
        log.info("%s | %s", pod, line)

    def retry(e: Exception) -> None:
        log.warning("cannot read job %s in namespace %s (retrying): %s", job, namespace, e)

    return k8s.follow(
        _default_client,
        namespace,
        job,
        poll_interval=poll_interval,
        start_timeout=start_timeout,
        outage_s=outage_s,
        on_line=on_line or log_line,
        on_retry=retry,
    )


def submit_and_follow(
    spec: SpecLike,
    *,
    overrides: Iterable[str] = (),
    plan: str | Path | Mapping[str, Any] | None = None,
    history_url: str | None = None,
    history_secret: str | None = None,
    poll_interval: float = 5.0,
    start_timeout: float = 600.0,
    on_line: Any = None,
) -> dict[str, Any]:
    """:func:`submit` then :func:`follow`: what a pipeline step on Kubernetes runs (it hosts
    neither the master nor the nodes). A job of that name already submitted is followed, not
    submitted again (a retried step attaches to its own job). Returns the job's report:
    ``report.json`` from the state volume when this process mounts it where the master
    wrote it (``run_dir``), else the master's report line; a job that ended without either
    gives ``{"state": "failed", "failure": why}``. ``job`` and ``namespace`` are set."""
    from dlrover_core.runtime.backends.submit import JobExistsError

    js = resolve_spec(spec, overrides)
    ns = js.backend.namespace
    try:
        res = submit(js, plan=plan, history_url=history_url, history_secret=history_secret)
        log.info("submitted job %s to namespace %s: %s", js.name, ns, ", ".join(res["created"]))
    except JobExistsError:
        log.info("job %s is already submitted in namespace %s: following it", js.name, ns)
    ev = follow(
        js.name, ns, poll_interval=poll_interval, start_timeout=start_timeout, on_line=on_line
    )
    report: dict[str, Any] = dict(ev.get("report") or {})
    rd = report.get("run_dir")
    full = Path(str(rd)) / "report.json" if rd else None
    if full is not None and full.is_file():
        try:
            report = {**json.loads(full.read_text(encoding="utf-8")), **report}
        except (OSError, ValueError) as e:
            log.warning("cannot read %s (%s): using the master's report line", full, e)
    elif report.get("run_url"):  # no shared claim: the master wrote it to the state URL
        from dlrover_core.runtime import state_url

        src = state_url.join(str(report["run_url"]), "report.json")
        try:
            report = {**json.loads(state_url.read_text(src)), **report}
        except (DLRoverError, OSError, ValueError) as e:
            log.warning("cannot read %s (%s): using the master's report line", src, e)
    if ev["status"] != "succeeded" or not report.get("state"):
        report.setdefault("state", "failed")
        if report["state"] == "succeeded":
            report["state"] = str(ev["status"])
        report["failure"] = report.get("failure") or ev["message"]
    report.update(job=js.name, namespace=ns)
    return report


def job_status(job: str, namespace: str = "default") -> dict[str, Any]:
    """The state of a submitted job, read through the Kubernetes API."""
    from dlrover_core.runtime.backends import submit as k8s
    from dlrover_core.runtime.backends.kubernetes_api import _default_client

    return k8s.status(_default_client(), namespace, job)


def cancel(job: str, namespace: str = "default") -> dict[str, Any]:
    """Cancel a submitted job (idempotent): its master Job and node pods go; the claim with
    the checkpoints and the report stays."""
    from dlrover_core.runtime.backends import submit as k8s
    from dlrover_core.runtime.backends.kubernetes_api import _default_client

    return {"job": job, "deleted": k8s.cancel(_default_client(), namespace, job)}


def in_master_pod() -> bool:
    """Whether this process is a job master in a pod ``dlrover-rm submit`` created (its
    downward-API pod name is set)."""
    import os

    from dlrover_core.runtime.backends.base import ENV_POD_NAME  # no kubernetes import

    return bool(os.environ.get(ENV_POD_NAME))


def master_logs(
    job: str, namespace: str = "default", tail_lines: int | None = None
) -> dict[str, str]:
    """The log of every master pod of a submitted job (oldest first: the Job replaces a
    master pod that died), read through the Kubernetes API; a pod not started yet has none."""
    from dlrover_core.runtime.backends import submit as k8s
    from dlrover_core.runtime.backends.kubernetes_api import _default_client

    return k8s.master_logs(_default_client(), namespace, job, tail_lines)


def profile(
    spec: SpecLike,
    *,
    overrides: Iterable[str] = (),
    out: str | Path | None = None,
    n_configs: int = 6,
) -> dict[str, Any]:
    """Short real trials at the planner's sampling configurations; the samples CSV is written
    to ``out`` (the model's input). Returns {"samples": [...], "trials": [...], "out": ...}."""
    from dlrover_core.model.samples_io import samples_to_csv, write_samples_csv
    from dlrover_core.runtime.profiler import profile as run_profile

    js = resolve_spec(spec, overrides)
    # the plan step after this one reads the history: a store that cannot be read is said
    # now, before minutes of trials (history.on_error: cold_start lets it pass)
    read_history(None, js)
    samples, trials = run_profile(js, n_configs=n_configs)
    if out is not None:
        write_samples_csv(out, samples)
    return {"csv": samples_to_csv(samples), "trials": trials, "out": str(out) if out else None}


def profile_size(
    spec: SpecLike, *, overrides: Iterable[str] = (), n_configs: int = 6
) -> dict[str, Any]:
    """The container the profile step needs to run every trial at its planned size (the
    largest trial plus the master; request = limit). Pure: plans the trials, runs nothing.
    Returns {"cpu": "2500m", "memory": "3Gi", "cpu_millicores", "memory_mib", "trials"}."""
    from dlrover_core.runtime.profiler import profile_configs, trial_spec
    from dlrover_core.runtime.profiler import profile_size as size_of
    from dlrover_core.units import format_cpu, format_memory

    js = resolve_spec(spec, overrides)
    plans = profile_configs(trial_spec(js), n_configs)
    r = size_of(plans)
    return {
        "cpu": format_cpu(r.cpu_millicores),
        "memory": format_memory(r.memory_mib),
        "cpu_millicores": r.cpu_millicores,
        "memory_mib": r.memory_mib,
        "trials": len(plans),
    }
