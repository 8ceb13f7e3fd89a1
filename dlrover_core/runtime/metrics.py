"""Prometheus metrics of a running job, served by the master (``pacing.metrics_port``).

A custom collector reads :class:`~dlrover_core.runtime.state.MasterState` at scrape time (no
second copy of the numbers to keep in step): the job state, the shard queue, samples done,
throughput, nodes by role and state with their CPU and memory used vs allocated, restarts,
faults by exit class (OOMs included), PS-set switches, and the current plan (stage, nodes, CPU
and memory per role). Every series carries a ``job`` label. Units follow Prometheus'
conventions: cores, bytes, seconds.

:func:`serve_metrics` serves ``/metrics`` with prometheus_client's own HTTP server on a
registry of its own, so nothing is added to the process-global ``REGISTRY``.

The pure part, :func:`metric_families`, turns a status and a snapshot (the JSON-able views
``MasterState.status()`` / ``snapshot()`` give) into metric families, so it is testable
without a master.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from dlrover_core.runtime.files import atomic_write_json
from dlrover_core.runtime.state import GEN_FREEZING, GEN_STARTING, MasterState
from dlrover_core.types import NodeState, Role, Stage
from dlrover_core.units import bytes_from_mib, cores

log = logging.getLogger("dlrover_rm.master")

METRICS_ADDR_FILE = "metrics.addr"
PREFIX = "dlrover_rm"
JOB_STATES = ("running", "evaluating", "succeeded", "failed", "stopped")
NODE_STATES = tuple(s.value for s in NodeState)
SHARD_STATES = ("todo", "doing", "done", "failed")
ROLES = tuple(r.value for r in Role)
STAGES = tuple(s.value for s in Stage)


def _gauge(name: str, doc: str, labels: Iterable[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["job", *labels], unit=unit)


def _counter(name: str, doc: str, labels: Iterable[str]) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["job", *labels])


def metric_families(
    status: Mapping[str, Any], snapshot: Mapping[str, Any], job: str
) -> list[Metric]:
    """The metric families of one job from ``MasterState.status()`` and ``snapshot()``."""
    out: list[Metric] = []

    state = str(status.get("job_state", "running"))
    m: GaugeMetricFamily | CounterMetricFamily
    m = _gauge("job_state", "1 for the job's current state, 0 for the others", ["state"])
    for s in (*JOB_STATES, *([state] if state not in JOB_STATES else [])):
        m.add_metric([job, s], 1.0 if s == state else 0.0)
    out.append(m)

    up = _gauge("master_uptime", "seconds since this master started", [], unit="seconds")
    up.add_metric([job], float(status.get("uptime_s", 0.0)))
    out.append(up)
    starts = _counter("master_starts", "master processes started for this run", [])
    starts.add_metric([job], float(status.get("master_starts", 1)))
    out.append(starts)

    shards = status.get("shards", {})
    m = _gauge("shards", "shards of the job by state", ["state"])
    for s in SHARD_STATES:
        m.add_metric([job, s], float(shards.get(s, 0)))
    out.append(m)
    m = _gauge("shards_planned", "shards the job has (every epoch)", [])
    m.add_metric([job], float(shards.get("total", 0)))
    out.append(m)
    m = _gauge("samples_done", "samples in done shards (falls back when shards replay)", [])
    m.add_metric([job], float(shards.get("samples_done", 0)))
    out.append(m)
    m = _gauge("samples_planned", "samples the job trains (rows x epochs)", [])
    m.add_metric([job], float(shards.get("samples_total", 0)))
    out.append(m)
    m = _counter("samples_retrained", "samples trained again after a PS restore", [])
    m.add_metric([job], float(shards.get("samples_retrained", 0)))
    out.append(m)

    m = _gauge(
        "throughput_samples_per_second",
        "sum of the running workers' samples/s (their latest heartbeats)",
        [],
    )
    m.add_metric([job], float(status.get("throughput_sps", 0.0)))
    out.append(m)
    m = _gauge(
        "window_throughput_samples_per_second",
        "samples of shards done per second over the master's throughput window",
        [],
    )
    m.add_metric([job], float(status.get("window_throughput_sps", 0.0)))
    out.append(m)
    m = _gauge("global_step", "the job's global step", [])
    m.add_metric([job], float(status.get("global_step", 0)))
    out.append(m)
    loss = status.get("loss")
    if loss is not None:
        m = _gauge("loss", "mean training loss of the last shards done", [])
        m.add_metric([job], float(loss))
        out.append(m)

    nodes = list(status.get("nodes", []))
    persisted = {(n["role"], int(n["node_id"])): n for n in snapshot.get("nodes", [])}
    by_state: Counter[tuple[str, str]] = Counter((n["role"], n["state"]) for n in nodes)
    m = _gauge("nodes", "nodes by role and state", ["role", "state"])
    for role in ROLES:
        for s in NODE_STATES:
            m.add_metric([job, role, s], float(by_state.get((role, s), 0)))
    out.append(m)

    restarts: Counter[str] = Counter()
    for n in nodes:
        restarts[n["role"]] += int(n.get("restarts", 0))
    m = _counter("node_restarts", "relaunches of nodes (incarnations after the first)", ["role"])
    for role in ROLES:
        m.add_metric([job, role], float(restarts.get(role, 0)))
    out.append(m)

    cpu_used = _gauge("node_cpu_used", "CPU a node used (its latest report)", ["node", "role"])
    cpu_alloc = _gauge("node_cpu_allocated", "CPU a node was launched with", ["node", "role"])
    mem_used = _gauge(
        "node_memory_used", "resident memory of a node", ["node", "role"], unit="bytes"
    )
    mem_alloc = _gauge(
        "node_memory_allocated", "memory a node was launched with", ["node", "role"], unit="bytes"
    )
    for n in nodes:
        if n["state"] != "running":
            continue
        labels = [job, n["name"], n["role"]]
        stats = n.get("stats", {})
        if "cpu_percent" in stats:
            cpu_used.add_metric(labels, float(stats["cpu_percent"]) / 100.0)
        if "rss_mib" in stats:
            mem_used.add_metric(labels, bytes_from_mib(float(stats["rss_mib"])))
        res = (persisted.get((n["role"], int(n["id"]))) or {}).get("resources")
        if res:
            cpu_alloc.add_metric(labels, cores(int(res["cpu_millicores"])))
            mem_alloc.add_metric(labels, bytes_from_mib(int(res["memory_mib"])))
    out += [cpu_used, cpu_alloc, mem_used, mem_alloc]

    faults: Counter[str] = Counter(
        str(f.get("exit_class", "unknown")) for f in snapshot.get("faults", [])
    )
    m = _counter("faults", "faults handled by the master, by exit class (oom: OOMs)", ["cls"])
    for cls in sorted({"oom", "killed", "fatal", "hardware", "unknown", "lost", *faults}):
        m.add_metric([job, cls], float(faults.get(cls, 0)))
    out.append(m)

    gens = list(status.get("ps", {}).get("generations", []))
    m = _gauge(
        "generation_switch_in_progress",
        "1 while a new generation (a PS set; an all-reduce worker group) is being brought up: "
        "workers wait, throughput drops to 0",
        [],
    )
    m.add_metric(
        [job], 1.0 if any(g["state"] in (GEN_FREEZING, GEN_STARTING) for g in gens) else 0.0
    )
    out.append(m)
    m = _gauge("ps_set_version", "version of the PS set the workers are given", [])
    m.add_metric([job], float(status.get("ps", {}).get("version", 0)))
    out.append(m)

    plans = list(snapshot.get("plans", []))
    m = _counter("plans", "plans adopted (the first included)", [])
    m.add_metric([job], float(len(plans)))
    out.append(m)
    if plans:
        plan = plans[-1]
        stage = str(plan.get("stage", ""))
        m = _gauge("plan_stage", "1 for the current plan's stage", ["stage"])
        for s in (*STAGES, *([stage] if stage not in STAGES else [])):
            m.add_metric([job, s], 1.0 if s == stage else 0.0)
        out.append(m)
        count = _gauge("plan_nodes", "nodes of the current plan", ["role"])
        cpu = _gauge("plan_cpu", "CPU of the current plan (all nodes of the role)", ["role"])
        mem = _gauge(
            "plan_memory", "memory of the current plan (all nodes of the role)", ["role"], "bytes"
        )
        for role, key in (("worker", "workers"), ("ps", "ps")):
            rp = plan.get(key) or {}
            c = int(rp.get("count", 0))
            cpu_m, mem_m = c * int(rp.get("cpu_millicores", 0)), c * int(rp.get("memory_mib", 0))
            for o in plan.get("overrides", []):  # per-node sizes replace their group's
                if o.get("role") == role and int(o.get("node_id", c)) < c:
                    cpu_m += int(o["cpu_millicores"]) - int(rp.get("cpu_millicores", 0))
                    mem_m += int(o["memory_mib"]) - int(rp.get("memory_mib", 0))
            count.add_metric([job, role], float(c))
            cpu.add_metric([job, role], cores(cpu_m))
            mem.add_metric([job, role], float(bytes_from_mib(mem_m)))
        out += [count, cpu, mem]
        pred = plan.get("predicted_throughput_sps")
        if pred is not None:
            m = _gauge(
                "plan_predicted_throughput_samples_per_second",
                "the throughput the planner predicted for the current plan",
                [],
            )
            m.add_metric([job], float(pred))
            out.append(m)
    return out


class MasterCollector(Collector):
    """Reads a :class:`MasterState` at every scrape. A state that cannot be read (being
    closed at the job's end) gives no series rather than an error page."""

    def __init__(self, state: MasterState, job: str) -> None:
        self.state = state
        self.job = job

    def collect(self) -> Iterator[Metric]:
        try:
            status, snapshot = self.state.status(), self.state.snapshot()
        except Exception as e:  # the shard database closes at the job's end
            log.debug("metrics: the master state is not readable: %s", e)
            return
        yield from metric_families(status, snapshot, self.job)


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`stop` is idempotent."""

    server: Any
    thread: threading.Thread
    port: int
    url: str = ""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join(timeout=5.0)
        self.server.server_close()


def serve_metrics(
    state: MasterState, host: str = "127.0.0.1", port: int = 0, *, job: str | None = None
) -> tuple[MetricsServer, int]:
    """Serve ``state``'s metrics on ``http://host:port/metrics`` (``port`` 0: any free port)
    from a registry of its own; returns the server and the port it bound."""
    from prometheus_client.exposition import start_http_server

    name = job or str(state.config.get("name") or state.run_dir.name)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MasterCollector(state, name))
    server, thread = start_http_server(port, addr=host, registry=registry)
    bound = int(server.server_port)
    return MetricsServer(server, thread, bound, registry=registry), bound


def start_master_metrics(
    state: MasterState, port: int | None, bind: str, advertise: str, job: str
) -> MetricsServer | None:
    """The master's endpoint (``None`` when ``port`` is ``None``: metrics off, or when the port
    cannot be bound: logged, the job goes on); its URL goes to ``RUN_DIR/metrics.addr``
    (``{"url": ..., "port": ...}``) so people and scrapers can find it."""
    if port is None:
        return None
    try:
        srv, bound = serve_metrics(state, bind, port, job=job)
    except OSError as e:  # training matters more than its metrics: go on without them
        log.error(
            "metrics are off: cannot listen on %s:%d (%s); set pacing.metrics_port to a free "
            "port, or 0 for any free port",
            bind,
            port,
            e,
        )
        return None
    host = f"[{advertise}]" if ":" in advertise else advertise
    srv.url = f"http://{host}:{bound}/metrics"
    atomic_write_json(Path(state.run_dir) / METRICS_ADDR_FILE, {"url": srv.url, "port": bound})
    log.info("metrics on %s", srv.url)
    return srv
