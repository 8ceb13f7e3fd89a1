"""Human-readable views of a plan and of a run's report: Markdown (the KFP UI's Markdown
viewer, a PR comment, a terminal) and a self-contained HTML page embedding ``report.png``.

Pure functions over the JSON the project already writes (``dlrover-rm plan --out``'s plan,
``report.json``); the only IO is :func:`report_html` reading the PNG it is given. One
intermediate (:func:`report_view`) feeds both formats, so they always say the same.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrover_core.units import format_cpu, format_memory


def _num(v: Any, fmt: str = ",.0f", none: str = "n/a") -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return none
    return format(v, fmt)


def _pct(v: Any) -> str:
    return _num(v * 100 if isinstance(v, (int, float)) else None, ".1f") + (
        " %" if isinstance(v, (int, float)) else ""
    )


def _group(g: Mapping[str, Any] | None) -> str:
    """``{count, cpu_millicores, memory_mib}`` as "2 × 1500m CPU / 2Gi"."""
    if not g:
        return "n/a"
    try:
        return (
            f"{int(g['count'])} × {format_cpu(int(g['cpu_millicores']))} CPU / "
            f"{format_memory(int(g['memory_mib']))}"
        )
    except (KeyError, TypeError, ValueError):
        return "n/a"


def _throughput(report: Mapping[str, Any]) -> str:
    tput, done, wall = (
        report.get("throughput_sps"),
        report.get("samples_done"),
        report.get("wall_s"),
    )
    out = f"{_num(tput)} samples/s"
    if not tput and isinstance(done, (int, float)) and done > 0:
        out = "not measured (no worker reported a rate before the end)"
    if isinstance(done, (int, float)) and isinstance(wall, (int, float)) and wall > 0:
        out += f"; samples / wall time: {_num(done / wall)} samples/s"
    return out


def _size(g: Mapping[str, Any] | None) -> str:
    if not g:
        return "n/a"
    return f"{format_cpu(int(g['cpu_millicores']))} CPU / {format_memory(int(g['memory_mib']))}"


@dataclass
class Table:
    header: tuple[str, ...]
    rows: list[tuple[str, ...]] = field(default_factory=list)


@dataclass
class View:
    """What a plan or report shows, format-free: a title, a lead line, key/value figures,
    then titled tables and titled bullet lists."""

    title: str
    lead: str = ""
    alert: tuple[str, str] | None = None  # ("Failure", why): shown in bold under the title
    figures: list[tuple[str, str]] = field(default_factory=list)
    tables: list[tuple[str, Table]] = field(default_factory=list)
    lists: list[tuple[str, list[str]]] = field(default_factory=list)


# --- the views ------------------------------------------------------------------------------


def plan_view(plan: Mapping[str, Any]) -> View:
    """A plan as ``dlrover-rm plan --out`` writes it (or a plan entry of ``report.json``)."""
    name = plan.get("job")
    v = View(
        title=f"Plan{f' for {name}' if name else ''}: {plan.get('stage', '?')}",
        lead=str(plan.get("signature") or ""),
    )
    v.figures += [
        ("stage", str(plan.get("stage", "n/a"))),
        ("workers", _group(plan.get("workers"))),
        ("parameter servers", _group(plan.get("ps"))),
    ]
    if plan.get("total"):
        v.figures.append(("total", _size(plan["total"])))
    if plan.get("train_step"):
        hosts = (
            "submits and follows"
            if plan.get("backend") == "kubernetes"
            else "all nodes + the master"
        )
        v.figures.append((f"train step pod ({hosts})", _size(plan["train_step"])))
    pred = plan.get("predicted_throughput_sps")
    v.figures.append(
        ("predicted throughput", f"{_num(pred)} samples/s" if pred is not None else "no model yet")
    )
    hist = plan.get("history")
    if isinstance(hist, Mapping):
        store = hist.get("store")
        v.figures.append(
            (
                "history read",
                f"{store} ({int(hist.get('records', 0))} matching run(s))"
                if store
                else "none (cold start)",
            )
        )
    overrides = list(plan.get("overrides") or [])
    if overrides:
        t = Table(("node", "size", "why"))
        for o in overrides:
            t.rows.append(
                (f"{o.get('role')}-{o.get('node_id')}", _size(o), str(o.get("reason", "")))
            )
        v.tables.append(("Per-node sizes", t))
    v.lists.append(("Why", [str(r) for r in plan.get("reasons") or []] or ["(no reason given)"]))
    return v


def report_view(report: Mapping[str, Any]) -> View:
    """A run's ``report.json``: the outcome, the figures, every plan (stage, size, reasons),
    the faults, the data."""
    state = str(report.get("state", "?"))
    v = View(title=f"{report.get('job', 'job')}: {state}", lead=str(report.get("signature") or ""))
    if report.get("reason"):
        kind = "Failure" if report.get("failure") else "Stopped"
        if state == "rejected":
            kind = "Rejected by the quality gate"
        v.alert = (kind, str(report["reason"]))
    held = report.get("model_held_out") or {}
    v.figures += [
        ("held-out AUC", _num(report.get("auc"), ".4f")),
        ("samples", f"{_num(report.get('samples_done'))} / {_num(report.get('samples_total'))}"),
        (
            "shards",
            f"{_num(report.get('shards_done'))} / {_num(report.get('shards_total'))} done "
            f"(failed {_num(report.get('shards_failed'))}, twice "
            f"{_num(report.get('shards_completed_twice'))}, lost {_num(report.get('shards_lost'))}"
            f", replayed {_num(report.get('shards_replayed'), none='0')})",
        ),
        ("throughput (workers' reports, mean)", _throughput(report)),
        ("wall time", f"{_num(report.get('wall_s'), ',.1f')} s"),
        ("CPU used / allocated", _pct(report.get("cpu_util"))),
        ("memory used / allocated", _pct(report.get("mem_util"))),
        ("master starts", _num(report.get("master_starts"), none="1")),
        ("faults", str(len(report.get("faults") or []))),
    ]
    if held:
        v.figures.append(
            (
                "exported model",
                f"AUC {_num(held.get('auc'), '.4f')}, log loss {_num(held.get('logloss'), '.4f')}"
                f" on {_num(held.get('rows'))} held-out rows",
            )
        )
    elif report.get("export_error"):
        v.figures.append(("exported model", f"not exported: {report['export_error']}"))
    q = report.get("quality")
    if isinstance(q, dict) and (q.get("min_auc") is not None or q.get("max_auc_drop") is not None):
        verdict = "passed" if q.get("passed") else "REJECTED"
        v.figures.append(("quality gate", f"{verdict}: {q.get('reason')}"))
    init = report.get("init_from")
    if isinstance(init, dict):
        src = init.get("source") if init.get("job") is not None else None
        v.figures.append(
            ("started from", f"{src} (generation {init.get('generation')})" if src else
             f"scratch: {init.get('note')}")
        )  # fmt: skip
    if report.get("ps_switch_s"):
        v.figures.append(
            ("PS-set switches", ", ".join(f"{_num(s, '.1f')} s" for s in report["ps_switch_s"]))
        )
    changes = [c for c in report.get("plan_changes") or [] if isinstance(c, dict)]
    if changes:
        v.figures.append(
            (
                "plan changes: time lost (pause at the new speed)",
                ", ".join(f"{_num(c.get('lost_s'), '.1f')} s" for c in changes),
            )
        )

    plans = list(report.get("plans") or [])
    t0 = next((p["time_s"] for p in plans if isinstance(p.get("time_s"), (int, float))), None)
    if plans:
        t = Table(("#", "at", "stage", "workers", "parameter servers"))
        for i, p in enumerate(plans, 1):
            at = p.get("time_s")
            when = f"+{at - t0:,.1f} s" if t0 is not None and isinstance(at, (int, float)) else ""
            t.rows.append(
                (str(i), when, str(p.get("stage")), _group(p.get("workers")), _group(p.get("ps")))
            )
        v.tables.append(("Plans (stages)", t))
        for i, p in enumerate(plans, 1):
            reasons = [str(r) for r in p.get("reasons") or []]
            v.lists.append((f"Why plan {i} ({p.get('stage')})", reasons or ["(no reason given)"]))
    faults = list(report.get("faults") or [])
    if faults:
        t = Table(("at", "node", "exit class", "action", "why"))
        for f in faults:
            at = f.get("time_s")
            when = f"+{at - t0:,.1f} s" if t0 is not None and isinstance(at, (int, float)) else ""
            t.rows.append(
                (
                    when,
                    str(f.get("node", "")),
                    str(f.get("exit_class", "")),
                    str(f.get("action", "")),
                    str(f.get("why") or f.get("reason") or ""),
                )
            )
        v.tables.append(("Faults", t))
    data = report.get("data")
    if isinstance(data, Mapping):
        t = Table(("file", "records", "malformed", "held out", "first malformed"))
        for f in data.get("files") or []:
            t.rows.append(
                (
                    str(f.get("path", "")),
                    _num(f.get("records")),
                    _num((f.get("malformed") or 0) + (f.get("held_out_malformed") or 0)),
                    _num(f.get("held_out_records")),
                    "" if f.get("first_malformed") is None else str(f["first_malformed"]),
                )
            )
        scope = "all rows" if data.get("complete") else "the first rows of each part (bounded)"
        v.tables.append((f"Data ({scope})", t))
    return v


# --- Markdown -------------------------------------------------------------------------------


def _md_cell(s: str) -> str:
    return " ".join(str(s).split()).replace("|", "\\|")


def _md_table(t: Table) -> list[str]:
    out = ["| " + " | ".join(_md_cell(h) for h in t.header) + " |"]
    out.append("|" + "|".join("---" for _ in t.header) + "|")
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
    return out


def to_markdown(v: View) -> str:
    lines = [f"# {_md_cell(v.title)}", ""]
    if v.lead:
        lines += [" ".join(v.lead.split()), ""]
    if v.alert:
        lines += [f"**{v.alert[0]}:** {' '.join(v.alert[1].split())}", ""]
    if v.figures:
        lines += [*_md_table(Table(("figure", "value"), [(k, val) for k, val in v.figures])), ""]
    for title, t in v.tables:
        lines += [f"## {title}", "", *_md_table(t), ""]
    for title, items in v.lists:
        lines += [f"### {title}", ""] + [f"- {' '.join(i.split())}" for i in items] + [""]
    return "\n".join(lines)


def plan_markdown(plan: Mapping[str, Any]) -> str:
    """The plan with its reasons, as Markdown."""
    return to_markdown(plan_view(plan))


def report_markdown(report: Mapping[str, Any]) -> str:
    """The report (outcome, figures, plans with stages and reasons, faults, data) as Markdown."""
    return to_markdown(report_view(report))


# --- HTML -----------------------------------------------------------------------------------

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:60em}"
    "table{border-collapse:collapse;margin:.5em 0 1em}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}"
    "th{background:#f3f3f3}img{max-width:100%;border:1px solid #ddd}"
)


def _html_table(t: Table, header: bool = True) -> str:
    e = html.escape
    head = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in t.header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in t.rows)
    return f"<table>{head}{body}</table>"


def to_html(v: View, png: bytes | None = None, png_alt: str = "") -> str:
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(v.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(v.title)}</h1>",
    ]
    if v.lead:
        parts.append(f"<p>{e(v.lead)}</p>")
    if v.alert:
        parts.append(f"<p><strong>{e(v.alert[0])}:</strong> {e(v.alert[1])}</p>")
    if v.figures:
        rows: list[tuple[str, ...]] = [(k, val) for k, val in v.figures]
        parts.append(_html_table(Table(("figure", "value"), rows), header=False))
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f'<img alt="{e(png_alt)}" src="data:image/png;base64,{data}">')
    for title, t in v.tables:
        parts.append(f"<h2>{e(title)}</h2>{_html_table(t)}")
    for title, items in v.lists:
        lis = "".join(f"<li>{e(i)}</li>" for i in items)
        parts.append(f"<h3>{e(title)}</h3><ul>{lis}</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def report_html(report: Mapping[str, Any], png: str | Path | None = None) -> str:
    """One self-contained page: the report's figures, ``png`` (report.png) embedded as
    base64, the plans and their reasons, the faults. A missing PNG is said, not an error."""
    v = report_view(report)
    data = None
    if png is not None and Path(png).is_file():
        data = Path(png).read_bytes()
    else:
        v.figures.append(("chart", "no report.png (the job did not start)"))
    alt = "throughput, CPU and memory (allocated vs used) over time; plan changes and faults"
    return to_html(v, data, alt)


def render_run(run_dir: str | Path) -> tuple[str, str]:
    """``(markdown, html)`` of a run directory's report.json and report.png."""
    import json

    rd = Path(run_dir)
    report = json.loads((rd / "report.json").read_text(encoding="utf-8"))
    return report_markdown(report), report_html(report, rd / "report.png")


__all__: Sequence[str] = (
    "plan_markdown",
    "plan_view",
    "render_run",
    "report_html",
    "report_markdown",
    "report_view",
)
