"""The master's Prometheus endpoint: scraped over HTTP, parsed with prometheus_client's own
parser, while real workers (gRPC clients) complete shards; and a real JobMaster serving it."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dlrover_core.errors import SpecError
from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.runtime.controller import JobMaster
from dlrover_core.runtime.master_client import MasterClient
from dlrover_core.runtime.metrics import METRICS_ADDR_FILE, serve_metrics, start_master_metrics
from dlrover_core.runtime.service import serve_master
from dlrover_core.runtime.state import MasterState
from dlrover_core.runtime.wire import create_token
from dlrover_core.spec import load_spec
from dlrover_core.types import NodeResources, ResourcePlan, Role, RolePlan, Stage

SMALL = Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} not scraped; have {sorted(n for n, _ in samples)}"
    return samples[key]


def test_metrics_follow_the_shards_of_a_served_master(tmp_path: Path) -> None:
    token = create_token(tmp_path)
    state = MasterState(tmp_path, total_rows=200, shard_size=10, synchronous="NORMAL")
    state.set_ps_set(["127.0.0.1:1"], 1)
    state.record_plan(
        ResourcePlan(
            RolePlan(2, NodeResources(1500, 2048)),
            RolePlan(1, NodeResources(500, 1024)),
            Stage.COLD_START,
            ("test",),
            predicted_throughput_sps=1234.0,
        )
    )
    state.record_launch(Role.WORKER, 0, 0, NodeResources(1500, 2048), ref="r0")
    state.record_launch(Role.WORKER, 1, 0, NodeResources(1500, 2048), ref="r1")
    grpc_server, port = serve_master(state, token)
    metrics, mport = serve_metrics(state, "127.0.0.1", 0, job="ctr-job")
    url = f"http://127.0.0.1:{mport}/metrics"
    clients = [MasterClient(f"127.0.0.1:{port}", token) for _ in range(2)]
    try:
        s0 = scrape(url)
        J = {"job": "ctr-job"}
        assert value(s0, "dlrover_rm_job_state", state="running", **J) == 1.0
        assert value(s0, "dlrover_rm_job_state", state="succeeded", **J) == 0.0
        assert value(s0, "dlrover_rm_shards", state="todo", **J) == 20.0
        assert value(s0, "dlrover_rm_shards", state="done", **J) == 0.0
        assert value(s0, "dlrover_rm_samples_planned", **J) == 200.0
        assert value(s0, "dlrover_rm_nodes", role="worker", state="pending", **J) == 2.0
        assert value(s0, "dlrover_rm_plan_nodes", role="worker", **J) == 2.0
        assert value(s0, "dlrover_rm_plan_cpu", role="worker", **J) == 3.0  # 2 x 1.5 cores
        assert value(s0, "dlrover_rm_plan_memory_bytes", role="ps", **J) == 1024 * 2**20
        assert value(s0, "dlrover_rm_plan_stage", stage="cold_start", **J) == 1.0
        assert value(s0, "dlrover_rm_plans_total", **J) == 1.0
        assert value(s0, "dlrover_rm_plan_predicted_throughput_samples_per_second", **J) == 1234

        for i, c in enumerate(clients):
            c.register("worker", i, pid=os.getpid())
        c = clients[0]
        for _ in range(5):  # worker 0 does 5 shards, worker 1 holds one
            r = c.get_shard()
            assert r.shard is not None
            c.shard_done(r.shard.shard_id, r.shard.rows, loss=0.5)
        held = clients[1].get_shard()
        assert held.shard is not None
        c.heartbeat(cpu_percent=150.0, rss_mib=300.0, step=5, samples_per_s=40.0)
        s1 = scrape(url)
        assert value(s1, "dlrover_rm_shards", state="done", **J) == 5.0
        assert value(s1, "dlrover_rm_shards", state="doing", **J) == 1.0
        assert value(s1, "dlrover_rm_shards", state="todo", **J) == 14.0
        assert value(s1, "dlrover_rm_samples_done", **J) == 50.0
        assert value(s1, "dlrover_rm_nodes", role="worker", state="running", **J) == 2.0
        assert value(s1, "dlrover_rm_throughput_samples_per_second", **J) == 40.0
        assert value(s1, "dlrover_rm_window_throughput_samples_per_second", **J) > 0
        w0 = {"node": "worker-0", "role": "worker", **J}
        assert value(s1, "dlrover_rm_node_cpu_used", **w0) == 1.5
        assert value(s1, "dlrover_rm_node_cpu_allocated", **w0) == 1.5
        assert value(s1, "dlrover_rm_node_memory_used_bytes", **w0) == 300 * 2**20
        assert value(s1, "dlrover_rm_node_memory_allocated_bytes", **w0) == 2048 * 2**20
        assert value(s1, "dlrover_rm_loss", **J) == 0.5

        # a fault: worker 1 is OOM-killed and relaunched (its shard goes back)
        state.record_fault({"node": "worker-1", "exit_class": "oom", "action": "relaunch"})
        state.record_launch(Role.WORKER, 1, 1, NodeResources(1500, 3072), ref="r1b")
        s2 = scrape(url)
        assert value(s2, "dlrover_rm_faults_total", cls="oom", **J) == 1.0
        assert value(s2, "dlrover_rm_faults_total", cls="killed", **J) == 0.0
        assert value(s2, "dlrover_rm_node_restarts_total", role="worker", **J) == 1.0
        assert value(s2, "dlrover_rm_shards", state="doing", **J) == 0.0
        assert value(s2, "dlrover_rm_shards", state="todo", **J) == 15.0
        assert value(s2, "dlrover_rm_generation_switch_in_progress", **J) == 0.0
        g1 = state.begin_generation(1, [], 0, "active")
        state.begin_generation(2, ["x"], 0, "starting")  # a PS-set change under way
        assert value(scrape(url), "dlrover_rm_generation_switch_in_progress", **J) == 1.0
        state.update_generation(int(g1["id"]) + 1, state="active")
        assert value(scrape(url), "dlrover_rm_generation_switch_in_progress", **J) == 0.0

        while (r := c.get_shard()).shard is not None:
            c.shard_done(r.shard.shard_id, r.shard.rows)
        state.set_job_state("succeeded")
        s3 = scrape(url)
        assert value(s3, "dlrover_rm_shards", state="done", **J) == 20.0
        assert value(s3, "dlrover_rm_samples_done", **J) == 200.0
        assert value(s3, "dlrover_rm_job_state", state="succeeded", **J) == 1.0
        assert value(s3, "dlrover_rm_job_state", state="running", **J) == 0.0
        # its own registry: nothing lands in the process-global one
        assert not [n for n in prometheus_client.REGISTRY._names_to_collectors if "dlrover" in n]
    finally:
        for cl in clients:
            cl.close()
        grpc_server.stop(0)
        metrics.stop()
        state.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    metrics.stop()  # idempotent


def test_a_closed_state_gives_no_series_not_an_error(tmp_path: Path) -> None:
    state = MasterState(tmp_path, total_rows=20, shard_size=10, synchronous="NORMAL")
    srv, port = serve_metrics(state, "127.0.0.1", 0)
    try:
        state.close()
        assert scrape(f"http://127.0.0.1:{port}/metrics") == {}
    finally:
        srv.stop()


def test_a_taken_port_turns_metrics_off_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = MasterState(tmp_path, total_rows=20, shard_size=10, synchronous="NORMAL")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert start_master_metrics(state, port, "127.0.0.1", "127.0.0.1", "j") is None
    assert "pacing.metrics_port" in caplog.text and str(port) in caplog.text
    assert start_master_metrics(state, None, "127.0.0.1", "127.0.0.1", "j") is None
    assert not (tmp_path / METRICS_ADDR_FILE).exists()
    state.close()


@pytest.mark.parametrize("port", ["-1", "65536", "'x'", "1.5"])
def test_metrics_port_is_validated(port: str) -> None:
    with pytest.raises(SpecError, match="metrics_port"):
        load_spec(SMALL, [f"pacing.metrics_port={port}"])


def test_metrics_port_defaults_off() -> None:
    assert load_spec(SMALL).pacing.metrics_port is None
    assert load_spec(SMALL, ["pacing.metrics_port=0"]).pacing.metrics_port == 0


@pytest.mark.slow
def test_a_job_master_serves_metrics_while_it_trains(tmp_path: Path) -> None:
    """A real JobMaster (local backend, real worker and PS processes) with
    ``pacing.metrics_port: 0``: ``metrics.addr`` names the endpoint, scrapes during the run
    see shards complete, the endpoint is gone after the run."""
    spec = load_spec(
        SMALL, ["pacing.metrics_port=0", "data.rows=60000", "data.eval_rows=500", "name=mjob"]
    )
    plan = ResourcePlan(
        RolePlan(1, NodeResources(1000, 1536)),
        RolePlan(1, NodeResources(500, 1536)),
        Stage.COLD_START,
        ("metrics test plan",),
    )
    seen: list[Samples] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def on_tick(m: JobMaster) -> None:
        addr = m.run_dir / METRICS_ADDR_FILE
        if not addr.exists() or len(seen) > 200:
            return
        try:
            s = scrape(json.loads(addr.read_text())["url"])
        except Exception as e:  # reported by the test below
            errors.append(e)
            return
        with lock:
            seen.append(s)

    run_dir = tmp_path / "run"
    report = JobMaster(
        spec, run_dir, LocalBackend(), plan=plan, on_tick=on_tick, replan=False, tick_s=0.2
    ).run()
    assert report["state"] == "succeeded", report.get("failure")
    assert not errors, errors
    url = json.loads((run_dir / METRICS_ADDR_FILE).read_text())["url"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    J = {"job": "mjob"}
    done = [value(s, "dlrover_rm_shards", state="done", **J) for s in seen]
    total = value(seen[-1], "dlrover_rm_shards_planned", **J)
    assert done == sorted(done), "shards done never go back in a clean run"
    assert done[-1] > done[0], done
    assert 0 < done[-1] <= total
    assert max(value(s, "dlrover_rm_nodes", role="ps", state="running", **J) for s in seen) == 1
    assert value(seen[-1], "dlrover_rm_plan_nodes", role="worker", **J) == 1.0
    t0 = time.monotonic()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    assert time.monotonic() - t0 < 5


# --- the Kubernetes submit path ---------------------------------------------------------------


def _k8s_spec_text(**pacing: object) -> str:
    import yaml

    data = yaml.safe_load(SMALL.read_text())
    data["backend"] = {"kind": "kubernetes", "namespace": "ml", "state_pvc": "rm-state"}
    data.setdefault("pacing", {}).update(pacing)
    return yaml.safe_dump(data, sort_keys=False)


def test_submitted_master_is_annotated_for_prometheus() -> None:
    import kubernetes_validate
    import yaml

    from dlrover_core.runtime.backends.manifests import MasterConfig, submit_objects
    from dlrover_core.spec import parse_spec

    text = _k8s_spec_text(metrics_port=9100)
    cfg = MasterConfig.from_spec(parse_spec(yaml.safe_load(text)), text)
    objs = {o["kind"]: o for o in submit_objects(cfg, "0123456789abcdef0123456789abcdef")}
    for obj in objs.values():
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    want = {"prometheus.io/scrape": "true", "prometheus.io/port": "9100"}
    pod = objs["Job"]["spec"]["template"]
    assert want.items() <= pod["metadata"]["annotations"].items()
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    (container,) = pod["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9100} in container["ports"]
    svc = objs["Service"]
    assert want.items() <= svc["metadata"]["annotations"].items()
    assert {"name": "metrics", "port": 9100, "targetPort": 9100} in svc["spec"]["ports"]
    rules = objs["NetworkPolicy"]["spec"]["ingress"]
    assert {"ports": [{"protocol": "TCP", "port": 9100}]} in rules  # scrapers may connect
    assert len(rules) == 2 and "from" in rules[0]  # everything else: the job's own pods only

    off = _k8s_spec_text()
    cfg = MasterConfig.from_spec(parse_spec(yaml.safe_load(off)), off)
    objs = {o["kind"]: o for o in submit_objects(cfg, "0123456789abcdef0123456789abcdef")}
    assert "annotations" not in objs["Job"]["spec"]["template"]["metadata"]
    assert len(objs["Service"]["spec"]["ports"]) == 1
    assert len(objs["NetworkPolicy"]["spec"]["ingress"]) == 1


def test_any_free_port_is_refused_on_kubernetes() -> None:
    import yaml

    from dlrover_core.errors import InputError
    from dlrover_core.runtime.backends.manifests import MasterConfig
    from dlrover_core.spec import parse_spec

    text = _k8s_spec_text(metrics_port=0)
    with pytest.raises(InputError, match=r"pacing\.metrics_port is 0"):
        MasterConfig.from_spec(parse_spec(yaml.safe_load(text)), text)
