"""Profiling: short real trials at the configurations the planner's sampling stage asks for,
each measured in steady windows, written as samples (the model's input)."""

from __future__ import annotations

import logging
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlrover_core.errors import InputError
from dlrover_core.planner import Planner, PlannerConfig
from dlrover_core.runtime.cgroup import MASTER_SHARE, CgroupLimits, describe
from dlrover_core.spec import JobSpec, load_spec, spec_to_dict
from dlrover_core.types import NodeResources, ResourcePlan, Sample

log = logging.getLogger("dlrover_rm.profile")

TRIAL_ROWS = 5_000_000
TRIAL_OVERRIDES = ("pacing.sample_window_s=1.0", "pacing.heartbeat_interval_s=0.5")


def trial_spec(spec: JobSpec) -> JobSpec:
    """The spec a trial runs: a short sample window so that each trial takes seconds."""
    trial = list(TRIAL_OVERRIDES)
    if spec.data.source == "synthetic":
        # a trial stops once measured: give it enough rows never to run out first
        trial.append(f"data.rows={max(spec.data.rows, TRIAL_ROWS)}")
    else:  # a file: enough epochs over it (the trial stops once measured)
        from dlrover_core.spec import LIMITS
        from dlrover_core.training.data import from_spec

        rows = max(1, from_spec(spec).num_rows)
        epochs = max(spec.training.epochs or 1, -(-TRIAL_ROWS // rows))
        trial.append(f"training.epochs={min(epochs, LIMITS['epochs'])}")
    return load_spec(spec_to_dict(spec), trial)


def trial_needs(plan: ResourcePlan, master: NodeResources = MASTER_SHARE) -> NodeResources:
    """What one trial takes in one container: every node of the plan plus the master."""
    return plan.total + master


def profile_size(
    plans: Sequence[ResourcePlan], master: NodeResources = MASTER_SHARE
) -> NodeResources:
    """The container that runs every trial at its planned size: the largest CPU and the
    largest memory any trial needs (trials run one after another)."""
    if not plans:
        raise InputError("no profiling configuration: nothing to size")
    needs = [trial_needs(p, master) for p in plans]
    return NodeResources(max(n.cpu_millicores for n in needs), max(n.memory_mib for n in needs))


def fit_trials(
    plans: Sequence[ResourcePlan], limits: CgroupLimits, master: NodeResources = MASTER_SHARE
) -> tuple[list[int], list[str | None]]:
    """Which trials fit this container (pure): the indexes to run, and per trial why it is
    skipped (None when it runs). A trial above the cgroup's ``cpu.max``/``memory.max`` would
    be measured throttled (or OOM-killed): its sample would be wrong, so it is not run."""
    run: list[int] = []
    why: list[str | None] = []
    for i, p in enumerate(plans):
        need = trial_needs(p, master)
        over = []
        if limits.cpu_millicores is not None and need.cpu_millicores > limits.cpu_millicores:
            over.append("CPU")
        if limits.memory_mib is not None and need.memory_mib > limits.memory_mib:
            over.append("memory")
        if over:
            why.append(
                f"not run: needs {need} with the master's {master}, above this container's "
                f"{' and '.join(over)} limit ({describe(limits)})"
            )
        else:
            run.append(i)
            why.append(None)
    return run, why


def profile_configs(spec: JobSpec, n: int = 6) -> list[ResourcePlan]:
    """DLRover's cold-start plan (1 worker + min PS) and the sampling moves from it, distinct
    and inside the quota: short trials from the smallest configuration up, spread over the
    inputs, whatever first configuration the job itself would start from."""
    planner = Planner(spec, PlannerConfig.from_spec(spec, cold_start="dlrover"))
    return planner.trial_plans(planner.initial_plan(), n)


def run_trial(
    spec: JobSpec, plan: ResourcePlan, run_dir: Path, windows: int = 4, max_s: float = 90.0
) -> Sample | None:
    """Run ``plan`` (no re-planning) until ``windows`` steady speed samples are taken; the
    median of them is the trial's sample (None: no steady window within ``max_s``)."""
    import time

    from dlrover_core.runtime.backends.local import LocalBackend
    from dlrover_core.runtime.controller import JobMaster

    t0 = time.monotonic()

    def enough(m: JobMaster) -> None:
        if len(m.samples) >= windows:
            m.stop_reason = "profiling trial measured"
        elif time.monotonic() - t0 > max_s:
            m.stop_reason = "profiling trial timed out"

    backend = LocalBackend(cpu_limit=spec.backend.cpu_limit)
    master = JobMaster(spec, run_dir, backend, plan=plan, on_tick=enough, replan=False)
    master.run()
    got = master.samples[-windows:]
    if not got:
        return None
    med = statistics.median(s.throughput_sps for s in got)
    return Sample(
        workers=plan.workers.count,
        ps=plan.ps.count,
        worker_cpu_cores=plan.workers.resources.cpu_cores,
        ps_cpu_cores=plan.ps.resources.cpu_cores,
        throughput_sps=med,
        batch_size=spec.training.batch_size,
        worker_memory_mib=max((s.worker_memory_mib or 0) for s in got) or None,
        ps_memory_mib=max((s.ps_memory_mib or 0) for s in got) or None,
        ps_cpu_util=statistics.median(s.ps_cpu_util or 0 for s in got),
        worker_cpu_util=statistics.median(s.worker_cpu_util or 0 for s in got),
        timestamp_s=got[-1].timestamp_s,
    )


def profile(
    spec: JobSpec,
    *,
    configs: Sequence[ResourcePlan] | None = None,
    n_configs: int = 6,
    windows: int = 4,
    work_dir: str | Path | None = None,
    limits: CgroupLimits | None = None,
) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Trials at ``configs`` (default: :func:`profile_configs`). Returns the samples and a
    note per trial. Trials use a short sample window so that each takes seconds. Every trial
    runs in this container: one that does not fit its cgroup limits (``limits``, read from
    ``/sys/fs/cgroup`` or ``$DLROVER_RM_CGROUP_ROOT`` by default) is not run and its note
    says why; none fitting is one clear error naming the size to give the container."""
    tspec = trial_spec(spec)
    plans = list(configs) if configs is not None else profile_configs(tspec, n_configs)
    if limits is None:
        import os

        from dlrover_core.runtime.cgroup import CGROUP_ROOT, read_limits

        limits = read_limits(Path(os.environ.get("DLROVER_RM_CGROUP_ROOT", CGROUP_ROOT)))
    run, why = fit_trials(plans, limits)
    if plans and limits.cpu_millicores is None:
        log.warning(
            "profiling in a container with no CPU limit: each trial's speed is measured on "
            "whatever CPU the host has free; give the step %s (request = limit)",
            profile_size(plans),
        )
    if plans and not run:
        smallest = min(
            (trial_needs(p) for p in plans), key=lambda r: (r.cpu_millicores, r.memory_mib)
        )
        raise InputError(
            f"no profiling trial fits this container ({describe(limits)}, from "
            f"{limits.source}): the smallest needs {smallest}; give the profile step at least "
            f"{profile_size(plans)} (request = limit) or lower quota"
        )
    samples: list[Sample] = []
    notes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        for i, plan in enumerate(plans):
            s = run_trial(tspec, plan, Path(tmp) / f"trial-{i}", windows) if i in run else None
            need = trial_needs(plan)
            notes.append(
                {
                    "workers": plan.workers.count,
                    "ps": plan.ps.count,
                    "worker_cpu": plan.workers.resources.cpu_cores,
                    "ps_cpu": plan.ps.resources.cpu_cores,
                    "throughput": s.throughput_sps if s else None,
                    "why": plan.reasons[0] if plan.reasons else "",
                    "needs_cpu_millicores": need.cpu_millicores,
                    "needs_memory_mib": need.memory_mib,
                    "container": describe(limits),
                    "skipped": why[i],
                }
            )
            if s is not None:
                samples.append(s)
    return samples, notes
