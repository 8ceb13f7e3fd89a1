"""From an observation of the job to what the master keeps of it: a speed sample of a settled
configuration (the model's input) and a line of the timeline (the report's)."""

from __future__ import annotations

import json
from pathlib import Path

from dlrover_core.runtime.backends.base import Backend
from dlrover_core.runtime.nodes import Node, NodeKey
from dlrover_core.runtime.report import TIMELINE_FILE
from dlrover_core.runtime.state import MasterState
from dlrover_core.spec import JobSpec
from dlrover_core.types import Observation, ResourcePlan, Role, Sample


def speed_sample(spec: JobSpec, plan: ResourcePlan, obs: Observation, now: float) -> Sample:
    """The plan's configuration and the speed observed of it (every worker up)."""
    running = obs.of(Role.WORKER)
    w, p = plan.workers, plan.ps
    return Sample(
        workers=w.count,
        ps=p.count,
        worker_cpu_cores=w.resources.cpu_cores,
        ps_cpu_cores=p.resources.cpu_cores,
        throughput_sps=obs.throughput_sps,
        batch_size=spec.training.batch_size,
        worker_memory_mib=max((n.memory_used_mib for n in running), default=None),
        ps_memory_mib=max((n.memory_used_mib for n in obs.of(Role.PS)), default=None),
        ps_cpu_util=max((n.cpu_util for n in obs.of(Role.PS)), default=None),
        worker_cpu_util=sum(n.cpu_util for n in running) / max(1, len(running)),
        timestamp_s=now,
    )


def append_timeline(run_dir: Path, obs: Observation) -> None:
    """One line of ``timeline.jsonl``: speed, progress, allocated and used resources."""
    rec = {
        "t": obs.time_s,
        "throughput_sps": obs.throughput_sps,
        "samples_done": obs.samples_done,
        "alloc_cpu_m": sum(n.allocated.cpu_millicores for n in obs.nodes),
        "alloc_mem_mib": sum(n.allocated.memory_mib for n in obs.nodes),
        "used_cpu_m": sum(n.cpu_used_millicores for n in obs.nodes),
        "used_mem_mib": sum(n.memory_used_mib for n in obs.nodes),
        "workers": len(obs.of(Role.WORKER)),
        "ps": len(obs.of(Role.PS)),
    }
    with open(run_dir / TIMELINE_FILE, "a") as f:
        f.write(json.dumps(rec) + "\n")


def measure_ps(nodes: dict[NodeKey, Node], backend: Backend, state: MasterState) -> None:
    """PS CPU and memory through the backend (their rows come with their heartbeats)."""
    for (role, node_id), n in nodes.items():
        if role is not Role.PS or n.handle is None:
            continue
        u = backend.usage(n.handle)
        if u is not None:
            state.record_node_stats(
                Role.PS, node_id, {"cpu_percent": u.cpu_percent, "rss_mib": u.rss_mib}
            )
