"""`dlrover-rm ...` — a thin shell over dlrover_core.api. Errors print one clear message and
exit non-zero; no traceback reaches the user."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlrover_core import __version__, api
from dlrover_core.errors import DLRoverError, InputError

# Exit codes (also in --help and the README)
EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_BUG, EXIT_REJECTED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CODES = (
    "exit codes: 0 ok; 1 the job failed (or stopped); 2 bad input (spec, file, URL, history "
    "store); 3 a bug in dlrover-rm; 4 the model was rejected by the quality gate (quality.*); "
    "130 interrupted"
)

# the extra that installs a module a command may need (pyproject's optional dependencies)
EXTRAS = {
    "sqlalchemy": "history", "alembic": "history", "psycopg2": "history",
    "torch": "runtime", "grpc": "runtime", "google": "runtime", "psutil": "runtime",
    "matplotlib": "runtime", "tqdm": "runtime", "prometheus_client": "runtime",
    "torchmetrics": "runtime", "tensordict": "runtime", "fbgemm_gpu": "runtime",
    "pyarrow": "data", "fsspec": "data",
    "kubernetes": "kubernetes", "tenacity": "kubernetes",
    "kfp": "kfp", "airflow": "airflow", "dlrover": "oss",
}  # fmt: skip


def missing_extra(module: str) -> str:
    """One line for a missing optional dependency: what is missing and how to install it."""
    top = module.split(".")[0]
    if top == "torchrec":
        return (
            "this command needs torchrec, which installs without its dependencies (its metadata "
            "asks for the CUDA fbgemm-gpu): pip install 'dlrover-rm[runtime]' -c constraints.txt "
            "&& pip install --no-deps torchrec==1.8.0"
        )
    extra = EXTRAS.get(top)
    if extra is None:
        return (
            f"this command needs the Python module {module!r}, which is not installed; install "
            "the extra that provides it (pip install 'dlrover-rm[all]' for everything)"
        )
    return (
        f"this command needs {top} (the '{extra}' extra), which is not installed: pip install "
        f"'dlrover-rm[{extra}]' -c constraints.txt"
    )


# what each command cannot run without (a module that marks the extra), checked before it
# starts, so that one line names every extra missing rather than the first import to fail
NEEDS = {
    "train": ("runtime", "history"),
    "profile": ("runtime",),
    "export": ("runtime",),
    "demo": ("runtime", "history"),
    "submit": ("kubernetes",),
    "cancel": ("kubernetes",),
}
MARKERS = {"runtime": ("torch", "grpc", "torchrec"), "history": ("sqlalchemy",),
           "kubernetes": ("kubernetes",)}  # fmt: skip


def missing_extras(command: str) -> str | None:
    """One line naming the extras ``command`` needs that are not installed, or None."""
    from importlib.util import find_spec

    missing = [e for e in NEEDS.get(command, ()) if any(find_spec(m) is None for m in MARKERS[e])]
    if not missing:
        return None
    if missing == ["runtime"] and find_spec("torch") and find_spec("grpc"):
        return missing_extra("torchrec")
    names = " and ".join(f"'{e}'" for e in missing)
    return (
        f"`dlrover-rm {command}` needs the {names} extra{'s' if len(missing) > 1 else ''}, "
        f"not installed: pip install 'dlrover-rm[{','.join(missing)}]' -c constraints.txt"
        + (
            " (with torch's CPU wheel and torchrec --no-deps first: see the README's Install)"
            if "runtime" in missing
            else ""
        )
    )


def _example_spec() -> Path:
    """The demo's spec: ``specs/small.yaml`` of the installed ``dlrover_rm.pipelines`` (an
    editable install maps it to the checkout's pipelines/), else the checkout's own."""
    from importlib.resources import files

    try:
        return Path(str(files("dlrover_rm.pipelines") / "specs" / "small.yaml"))
    except ModuleNotFoundError:  # a checkout on sys.path, not installed
        return Path(__file__).resolve().parent.parent / "pipelines" / "specs" / "small.yaml"


EXAMPLE_SPEC = _example_spec()


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", required=True, help="job spec, YAML or JSON")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a spec field, e.g. --set quota.cpu=8 (repeatable)",
    )


def _write_json(data: Any, out: str | None) -> None:
    text = json.dumps(data, indent=2) + "\n"
    if out:
        Path(out).write_text(text)
    else:
        sys.stdout.write(text)


def cmd_plan(a: argparse.Namespace) -> int:
    result = api.plan(a.spec, overrides=a.overrides, samples=a.samples, history=a.history)
    if a.out:
        _write_json(result, a.out)
    if a.json:
        _write_json(result, None)
    else:
        from dlrover_core.types import ResourcePlan

        print(f"plan for job {result['job']!r} (signature {result['signature']})")
        print(ResourcePlan.from_dict(result).describe())
        h = result.get("history") or {}
        if h.get("store"):
            print(f"history: {h['store']} ({h['records']} matching run(s) read)")
        else:
            print("history: none read (cold start)")
        print(
            f"computed in {result['planning_ms']:.2f} ms"
            + (f"; written to {a.out}" if a.out else "")
        )
    return 0


def cmd_model_fit(a: argparse.Namespace) -> int:
    d = api.fit_model(a.samples, a.out, strategy=a.strategy)
    if a.json:
        _write_json(d, None)
        return 0
    fitted = d.get("fitted") or {}
    print(
        f"fitted {d['kind']} on {fitted.get('n_samples', '?')} samples "
        f"({fitted.get('n_configs', '?')} configurations); written to {a.out}"
    )
    return 0


def cmd_model_predict(a: argparse.Namespace) -> int:
    text = api.predict(a.model, a.configs)
    if a.json:  # the same table, as records
        import csv
        import io

        rows = list(csv.DictReader(io.StringIO(text)))
        _write_json([{k: float(v) for k, v in r.items()} for r in rows], None)
    else:
        sys.stdout.write(text)
    return 0


def cmd_simulate(a: argparse.Namespace) -> int:
    from dlrover_core.sim.runner import format_table

    policies = [p.strip() for p in a.policies.split(",")] if a.policies is not None else None
    try:
        share = float(a.allreduce_share)
    except ValueError:
        raise InputError(
            f"--allreduce-share must be a number in 0..1 (the share of all-reduce jobs); "
            f"got {a.allreduce_share!r}"
        ) from None
    result = api.simulate(a.jobs, a.seed, policies, allreduce_share=share)
    if a.out:
        _write_json(result, a.out)
    if a.json:
        _write_json(result, None)
        return 0
    print(format_table(result))
    if a.out:
        print(f"JSON written to {a.out}")
    return 0


def cmd_train(a: argparse.Namespace) -> int:
    import logging

    if logging.getLogger().getEffectiveLevel() > logging.INFO and not (a.quiet or a.json):
        # the master's decisions (plans and why, launches, relaunches and why, PS-set
        # changes, resizes) show at the default level; third-party chatter does not
        logging.getLogger("dlrover_rm.master").setLevel(logging.INFO)
    report = api.train(
        a.spec,
        overrides=a.overrides,
        plan=a.plan,
        run_dir=a.run_dir,
        history=a.history,
        progress=not (a.quiet or a.json),
    )
    if a.out:
        _write_json(report, a.out)
    if a.json:
        _write_json(report, None)
        if report["state"] != "succeeded" and report.get("failure"):
            print(f"error: job {report['state']}: {report['failure']}", file=sys.stderr)
        return {"succeeded": EXIT_OK, "rejected": EXIT_REJECTED}.get(report["state"], EXIT_FAILED)
    print(
        f"job {report['job']} {report['state']}: {report['samples_done']:,} samples in "
        f"{report['wall_s']:.1f} s ({report['throughput_sps']:,.0f}/s), AUC "
        f"{report['auc'] if report['auc'] is None else round(report['auc'], 4)}, shards done "
        f"{report['shards_done']}/{report['shards_total']} (twice: "
        f"{report['shards_completed_twice']}, lost: {report['shards_lost']})"
    )
    print(f"report: {report['run_dir']}/report.json, {report['run_dir']}/report.png")
    init = report.get("init_from")
    if init:  # what the model started from (training.init_from)
        if init.get("source") and init.get("job") is not None:
            auc = init.get("held_out_auc")
            print(
                f"started from: {init['source']} (job {init.get('job')}, "
                f"{init.get('strategy')}, AUC {'?' if auc is None else round(auc, 4)}; "
                f"generation {init.get('generation')}, optimizer state reset)"
            )
        else:
            print(f"started from: scratch ({init.get('note')})")
    h = report.get("history")
    if h and h.get("store"):
        print(f"history: {h['store']} ({h['records']} matching run(s) read)")
    if report["state"] != "succeeded" and report.get("failure"):
        print(f"error: job {report['state']}: {report['failure']}", file=sys.stderr)
    if report["state"] == "rejected":
        print(
            f"rejected: {report.get('reason')}; the model is kept in "
            f"{report.get('rejected_model_dir')} and published nowhere",
            file=sys.stderr,
        )
        return EXIT_REJECTED
    if report.get("model_dir"):
        print(f"model: {report['model_dir']} (model.pt, model_card.json)")
    elif report.get("export_error"):
        print(f"model not exported: {report['export_error']}", file=sys.stderr)
    if api.in_master_pod():  # the result for callers that see only the API (the pod log)
        print(api.report_line(report), flush=True)
    return 0 if report["state"] == "succeeded" else 1


def cmd_run(a: argparse.Namespace) -> int:
    """The job wherever its spec says: the master here (as ``train``), or submitted to
    Kubernetes and followed (as ``submit --wait``); ``--dry-run`` shows the request."""
    if a.dry_run:
        _write_json(
            api.run(
                a.spec,
                overrides=a.overrides,
                plan=a.plan,
                run_dir=a.run_dir,
                history=a.history,
                history_secret=a.history_secret,
                dry_run=True,
            ),
            a.out,
        )
        return 0
    if api.submits(a.spec, a.overrides):
        if a.history is not None and a.history_secret is not None:
            raise InputError("give --history or --history-secret, not both")
        a.wait = not a.no_wait
        if a.history is not None:  # on Kubernetes a URL goes into the job's own Secret
            return _submit(a, history_url=a.history)
        return cmd_submit(a)
    return cmd_train(a)


def cmd_profile(a: argparse.Namespace) -> int:
    res = api.profile(a.spec, overrides=a.overrides, out=a.out, n_configs=a.configs)
    if a.json:
        _write_json(res, None)
        return 0
    for t in res["trials"]:
        tput = "no steady window" if t["throughput"] is None else f"{t['throughput']:,.0f}/s"
        tput = t.get("skipped") or tput  # above this container's cgroup limits: not run
        print(
            f"  {t['workers']} worker(s) x {t['worker_cpu']:g} CPU, {t['ps']} PS x "
            f"{t['ps_cpu']:g} CPU: {tput}  ({t['why']})",
            file=sys.stderr,
        )
    if a.out:
        print(f"samples written to {a.out}", file=sys.stderr)
    else:
        sys.stdout.write(res["csv"])
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    card = api.export(a.run_dir, a.out)
    if a.json:
        _write_json(card, None)
        return 0
    ho = card["held_out"]
    sizes = ", ".join(f"{t['name']} {t['rows']:,}" for t in card["tables"])
    print(f"exported {card['job']} to {a.out}: model.pt + model_card.json")
    print(f"  tables (rows): {sizes}")
    auc = "n/a" if ho["auc"] is None else f"{ho['auc']:.4f}"
    ll = "n/a" if ho["logloss"] is None else f"{ho['logloss']:.4f}"
    print(f"  held-out: AUC {auc}, logloss {ll} on {ho['rows']:,} rows")
    print("  load: dlrover_core.training.load_exported(DIR) -> forward(dense, kjt) -> logits")
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    if (a.run_dir is None) == (a.job is None):
        raise InputError("status: give --run-dir DIR (a local run) or --job NAME (on Kubernetes)")
    if a.job is not None:
        _write_json(api.job_status(a.job, a.namespace), None)
    else:
        _write_json(api.status(a.run_dir), None)
    return 0


def cmd_submit(a: argparse.Namespace) -> int:
    return _submit(a)


def _submit(a: argparse.Namespace, history_url: str | None = None) -> int:
    res = api.submit(
        a.spec,
        overrides=a.overrides,
        plan=a.plan,
        history_url=history_url,
        history_secret=a.history_secret,
    )
    if not a.wait:
        _write_json(res, None)
        return 0
    print(f"submitted {res['job']} to namespace {res['namespace']}: waiting", file=sys.stderr)
    ev = api.follow(
        res["job"],
        res["namespace"],
        poll_interval=a.poll_interval,
        on_line=lambda pod, line: print(f"{pod} | {line}", file=sys.stderr),
    )
    res |= {"state": ev["status"], "message": ev["message"], "report": ev.get("report")}
    _write_json(res, None)
    if ev["status"] == "succeeded":
        return EXIT_OK
    print(f"error: {ev['message']}", file=sys.stderr)
    return EXIT_REJECTED if ev["status"] == "rejected" else EXIT_FAILED


def cmd_cancel(a: argparse.Namespace) -> int:
    _write_json(api.cancel(a.job, a.namespace), None)
    return 0


DEMO_OVERRIDES = [  # long enough for the planner to act; fast pacing for a demo
    "data.rows=600000",
    "pacing.sample_window_s=1.0",
    "pacing.min_speed_samples=2",
    "pacing.replan_interval_s=3",
    "pacing.heartbeat_interval_s=0.5",
]


def cmd_demo(a: argparse.Namespace) -> int:
    import time

    from dlrover_core.sim.runner import format_table
    from dlrover_core.types import ResourcePlan

    if a.jobs < 1:
        print("error: --jobs must be at least 1", file=sys.stderr)
        return 2
    root = Path(a.run_dir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    root.mkdir(parents=True, exist_ok=True)
    over = [*DEMO_OVERRIDES, f"history.url=sqlite:///{root / 'history.db'}"]
    print("== dlrover-rm demo: a recurring DLRM retrain, run twice, then a simulated cluster ==")
    print(f"   (everything goes to {root}; the run history is {root / 'history.db'})\n")
    reports = []
    for i in (1, 2):
        print(f"-- run {i}: plan {EXAMPLE_SPEC.name}")
        plan = api.plan(str(EXAMPLE_SPEC), overrides=over)
        print(ResourcePlan.from_dict(plan).describe())
        print(f"\n-- run {i}: train (job master, parameter server and workers as processes)")
        rep = api.train(str(EXAMPLE_SPEC), overrides=over, plan=plan, run_dir=root / f"run{i}")
        reports.append(rep)
        print(f"run {i} {rep['state']} in {rep['wall_s']:.1f} s\n")
    print("-- the two runs side by side")
    rows = [
        ("first plan", lambda r: r["plans"][0]["stage"]),
        ("plans (incl. first)", lambda r: str(len(r["plans"]))),
        ("completion time", lambda r: f"{r['wall_s']:.1f} s"),
        ("throughput", lambda r: f"{r['throughput_sps']:,.0f}/s"),
        ("CPU utilisation", lambda r: f"{r['cpu_util'] or 0:.2f}"),
        ("memory utilisation", lambda r: f"{r['mem_util'] or 0:.2f}"),
        ("held-out AUC", lambda r: f"{r['auc'] or float('nan'):.3f}"),
        ("shards twice / lost", lambda r: f"{r['shards_completed_twice']} / {r['shards_lost']}"),
    ]
    print(f"{'':22}{'run 1':>16}{'run 2':>16}")
    for name, get in rows:
        print(f"{name:22}{get(reports[0]):>16}{get(reports[1]):>16}")
    for r in reports:
        print(f"report: {r['run_dir']}/report.json, report.png")
    print(
        f"\n-- simulate {a.jobs} DLRM jobs on a shared CPU cluster, every policy on the same trace"
    )
    print(format_table(api.simulate(a.jobs, a.seed, None)))
    return 0 if all(r["state"] == "succeeded" for r in reports) else 1


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help shows its default (unless the default is nothing or the help says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action) or text


JSON_HELP = "print the result as JSON on stdout, and nothing else there"


def _command(sub: Any, name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, formatter_class=_Help, epilog=EXIT_CODES, **kw
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dlrover-rm",
        description="Auto-size and run elastic DLRM training (after DLRover-RM, VLDB 2024). "
        "On every command --json prints the result as JSON on stdout and --out FILE writes it "
        "to a file.",
        epilog=EXIT_CODES,
        formatter_class=_Help,
    )
    ap.add_argument("--version", action="version", version=f"dlrover-rm {__version__}")
    ap.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="log records on stderr at this level and above",
    )
    ap.add_argument(
        "--log-json", action="store_true", help="log records as JSON lines (for log collectors)"
    )
    sub = ap.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="one of these; COMMAND --help"
    )

    p = _command(sub, "plan", "plan resources for a job (stage 1, + stage 2 with samples)")
    _spec_args(p)
    p.add_argument(
        "--samples", help="profiled samples CSV (workers,ps,worker_cpu,ps_cpu,throughput)"
    )
    p.add_argument(
        "--history",
        help="run history for warm start: a store URL or a JSON export; 'none' reads no store "
        "(default: the spec's history.url, else $DLROVER_RM_HISTORY or ~/.dlrover-rm/history.db; "
        "the plan says which it read)",
    )
    p.add_argument("--out", help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_plan)

    m = _command(sub, "model", "fit or query the resource-performance model")
    msub = m.add_subparsers(
        dest="model_command", required=True, metavar="ACTION", help="fit or predict"
    )
    f = _command(msub, "fit", "fit the throughput model to a samples CSV")
    f.add_argument(
        "--samples", required=True, help="samples CSV (from `dlrover-rm profile` or a run)"
    )
    f.add_argument("--out", required=True, help="model JSON to write")
    f.add_argument(
        "--strategy",
        default="ps",
        choices=["ps", "ps_extended", "ps_overlap", "allreduce"],
        help="the model family to fit",
    )
    f.add_argument("--json", action="store_true", help=JSON_HELP)
    f.set_defaults(func=cmd_model_fit)
    pr = _command(msub, "predict", "predict throughput for configurations (CSV to stdout)")
    pr.add_argument("--model", required=True, help="model JSON (from `dlrover-rm model fit`)")
    pr.add_argument("--configs", required=True, help="CSV with workers,ps,worker_cpu,ps_cpu")
    pr.add_argument("--json", action="store_true", help=JSON_HELP)
    pr.set_defaults(func=cmd_model_predict)

    s = _command(sub, "simulate", "compare resource policies on a simulated shared cluster")
    s.add_argument("--jobs", type=int, default=200, help="jobs in the simulated trace")
    s.add_argument("--seed", type=int, default=0, help="the trace's random seed")
    s.add_argument("--policies", help="comma-separated policy names (default: every one available)")
    s.add_argument(
        "--allreduce-share",
        default="0",
        help="share (0..1) of the trace's jobs trained by all-reduce (ranks, no PS)",
    )
    s.add_argument("--out", help="write the results JSON here")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_simulate)

    r = _command(
        sub,
        "run",
        "run the job where its spec says: the master here (backend local), or submitted to "
        "Kubernetes and followed (backend kubernetes); --dry-run shows what it would start",
    )
    _spec_args(r)
    r.add_argument("--plan", help="start from this plan JSON (from `dlrover-rm plan --out`)")
    r.add_argument(
        "--run-dir", help="run directory (default: runs/NAME-TIME); an existing one resumes"
    )
    r.add_argument(
        "--history",
        help="run history: a store URL or a JSON export (on Kubernetes a URL, which goes "
        "into a Secret of the job's own)",
    )
    r.add_argument(
        "--history-secret",
        metavar="NAME[:KEY]",
        help="on Kubernetes: a Secret holding the history store URL (key 'url' by default)",
    )
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="start nothing: print the request (the master's command and the first plan's "
        "nodes, or the Kubernetes objects with Secret values hidden) as JSON",
    )
    r.add_argument(
        "--no-wait", action="store_true", help="on Kubernetes: submit and return at once"
    )
    r.add_argument(
        "--poll-interval", type=float, default=5.0, help="on Kubernetes: seconds between reads"
    )
    r.add_argument("--quiet", action="store_true", help="no progress and no decisions on stderr")
    r.add_argument("--out", help="write the report (or the dry run's request) JSON here too")
    r.add_argument("--json", action="store_true", help=JSON_HELP)
    r.set_defaults(func=cmd_run)

    t = _command(sub, "train", "run the job on this machine (elastic, fault-tolerant)")
    _spec_args(t)
    t.add_argument("--plan", help="start from this plan JSON (from `dlrover-rm plan --out`)")
    t.add_argument(
        "--run-dir", help="run directory (default: runs/NAME-TIME); an existing one resumes"
    )
    t.add_argument(
        "--history",
        help="run history for warm start: a store URL or a JSON export (default: as for plan)",
    )
    t.add_argument(
        "--quiet",
        action="store_true",
        help="no progress and no decisions on stderr (default: a bar on a terminal, a line "
        "every 15 s elsewhere, and each of the master's decisions)",
    )
    t.add_argument("--out", help="write the run's report JSON here too")
    t.add_argument("--json", action="store_true", help=JSON_HELP)
    t.set_defaults(func=cmd_train)

    pf = _command(sub, "profile", "short real trials -> samples CSV for the model")
    _spec_args(pf)
    pf.add_argument("--out", help="samples CSV to write (default: the CSV on stdout)")
    pf.add_argument("--configs", type=int, default=6, help="how many configurations to try")
    pf.add_argument("--json", action="store_true", help=JSON_HELP + " (the trials and the CSV)")
    pf.set_defaults(func=cmd_profile)

    ex = _command(sub, "export", "export a finished run's model (torch tensors + card)")
    ex.add_argument("--run-dir", required=True, help="the run directory of a finished train")
    ex.add_argument("--out", required=True, help="folder to write model.pt and model_card.json")
    ex.add_argument("--json", action="store_true", help=JSON_HELP + " (the model card)")
    ex.set_defaults(func=cmd_export)

    st = _command(sub, "status", "the status of a run (JSON on stdout)")
    st.add_argument("--run-dir", default=None, help="a local run directory")
    st.add_argument("--job", default=None, help="a job submitted to Kubernetes")
    st.add_argument("--namespace", default="default", help="with --job: its namespace")
    st.add_argument("--json", action="store_true", help="the default here: JSON on stdout")
    st.set_defaults(func=cmd_status)

    sm = _command(sub, "submit", "run the job's master as a Kubernetes Job (JSON on stdout)")
    _spec_args(sm)
    sm.add_argument(
        "--plan", help="the master trains on this plan JSON (from `dlrover-rm plan --out`)"
    )
    sm.add_argument(
        "--history-secret",
        metavar="NAME[:KEY]",
        help="a Secret holding the history store URL (key 'url' by default): the master "
        "reads it as $DLROVER_RM_HISTORY; a spec history.url with a password goes into a "
        "Secret of the job's own",
    )
    sm.add_argument(
        "--wait",
        action="store_true",
        help="follow the job (its master's log on stderr) until it ends; exit 0 when it "
        "succeeded, 1 when it failed or its master cannot start (image, crash loop, "
        "unschedulable: said within a minute), 4 when its model was rejected",
    )
    sm.add_argument(
        "--poll-interval", type=float, default=5.0, help="with --wait: seconds between reads"
    )
    sm.add_argument("--json", action="store_true", help="the default here: JSON on stdout")
    sm.set_defaults(func=cmd_submit)

    cn = _command(sub, "cancel", "cancel a job submitted to Kubernetes (JSON on stdout)")
    cn.add_argument("--job", required=True, help="the job's name (from submit)")
    cn.add_argument("--namespace", default="default", help="the job's namespace")
    cn.add_argument("--json", action="store_true", help="the default here: JSON on stdout")
    cn.set_defaults(func=cmd_cancel)

    sub.add_parser(
        "node",
        help="run one node of a job (ps|worker|rank); the job master starts these",
        add_help=False,
    )

    d = _command(sub, "demo", "the example, end to end, on the embedded defaults")
    d.add_argument("--jobs", type=int, default=200, help="jobs in the simulated cluster trace")
    d.add_argument(
        "--run-dir",
        default=None,
        help="where the demo's runs and history go (default: runs/demo-TIME)",
    )
    d.add_argument("--seed", type=int, default=0, help="the simulated trace's random seed")
    d.set_defaults(func=cmd_demo)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    from dlrover_core import logs

    logs.quiet_third_party()  # before anything imports torch or the open-source DLRover
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["node"]:  # a node of a running job: its own parser (see runtime/node.py)
        from dlrover_core.runtime.node import exit_process
        from dlrover_core.runtime.node import main as node_main

        code = node_main(raw[1:])
        if argv is None:  # the process is the node: end it as one (in-process calls return)
            exit_process(raw[1] if len(raw) > 1 else "", code)
        return code
    args = build_parser().parse_args(argv)
    logs.setup(args.log_level, json_lines=args.log_json)
    missing = missing_extras(args.command)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return EXIT_INPUT
    try:
        return int(args.func(args))
    except DLRoverError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:  # an optional dependency this command needs
        print(f"error: {missing_extra(e.name or '')}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as e:  # a bug, not bad input: still one line, the traceback in the log
        import logging

        logging.getLogger("dlrover_core.cli").debug("unexpected error", exc_info=True)
        print(
            f"error: unexpected {type(e).__name__}: {e} (a bug in dlrover-rm; rerun with "
            "--log-level debug for the traceback and report it)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
