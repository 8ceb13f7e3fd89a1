"""Factories for tests: a small valid job spec, observations, plans and exact samples.

``make_spec(**overrides)`` takes ``section__field=value`` keywords (``__`` separates the path),
so ``make_spec(quota__cpu=4, constraints__workers__count=3)`` reads like the YAML it stands
for. Every default below is chosen so that derived numbers can be worked out by hand.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dlrover_core.model.throughput import PSThroughputModel
from dlrover_core.spec import JobSpec, load_spec
from dlrover_core.types import (
    NodeObservation,
    NodeResources,
    NodeState,
    Observation,
    ResourcePlan,
    Role,
    RolePlan,
    Sample,
    Stage,
)

B = 512  # the spec's batch size; throughput samples use it too

# Two static tables of 1000 rows, dim 16, Adagrad: the dense part has
# 13·64+64 + 64·16+16 (bottom MLP) + 19·64+64 + 64·1+1 (top MLP, 16 + C(3,2) = 19 inputs)
# = 3281 parameters.
BASE_SPEC: dict[str, Any] = {
    "name": "job",
    "signature": {"pipeline": "test"},
    "model": {
        "embedding_dim": 16,
        "embedding_tables": [
            {"name": "a", "num_embeddings": 1000},
            {"name": "b", "num_embeddings": 1000},
        ],
    },
    "training": {"batch_size": B, "epochs": 1},
    "quota": {"cpu": 10, "memory": "40Gi"},
    "pacing": {
        "replan_interval_s": 10,
        "worker_stable_s": 5,
        "min_speed_samples": 2,
        "ps_change_interval_s": 100,
        "hot_window": 3,
        "pending_timeout_s": 900,
    },
}


def set_path(data: dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def make_spec_dict(**overrides: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE_SPEC)
    for key, value in overrides.items():
        set_path(data, key.split("__"), copy.deepcopy(value))
    return data


def make_spec(**overrides: Any) -> JobSpec:
    return load_spec(make_spec_dict(**overrides))


def make_linear_spec(**overrides: Any) -> JobSpec:
    """``make_spec`` with the planner on the linear throughput forms (the tests of their
    sampling, cross-validated choice and exact fits of a linear truth)."""
    return make_spec(planner__throughput_form="linear", **overrides)


# --- plans ---------------------------------------------------------------------------------


def make_plan(
    workers: tuple[int, int, int] = (1, 2000, 4096),
    ps: tuple[int, int, int] = (1, 2000, 4096),
    *,
    created_at_s: float = 0.0,
    stage: Stage = Stage.SCALING,
) -> ResourcePlan:
    """``workers`` / ``ps`` are (count, cpu_millicores, memory_mib)."""
    return ResourcePlan(
        RolePlan(workers[0], NodeResources(workers[1], workers[2])),
        RolePlan(ps[0], NodeResources(ps[1], ps[2])),
        stage,
        created_at_s=created_at_s,
    )


def key_of(plan: ResourcePlan) -> tuple[int, int, int, int]:
    return (
        plan.workers.count,
        plan.ps.count,
        plan.workers.resources.cpu_millicores,
        plan.ps.resources.cpu_millicores,
    )


# --- observations --------------------------------------------------------------------------


def node(
    role: Role,
    node_id: int,
    *,
    cpu: int = 4000,
    mem: int = 8192,
    cpu_util: float = 0.5,
    mem_util: float = 0.25,
    speed: float = 0.0,
    state: NodeState = NodeState.RUNNING,
    since_s: float = 0.0,
) -> NodeObservation:
    return NodeObservation(
        role,
        node_id,
        state,
        NodeResources(cpu, mem),
        cpu_used_millicores=int(round(cpu * cpu_util)),
        memory_used_mib=int(round(mem * mem_util)),
        state_since_s=since_s,
        throughput_sps=speed,
    )


def make_obs(
    time_s: float,
    *,
    ps_util: Iterable[float] = (0.5,),
    ps_mem_util: Iterable[float] | None = None,
    ps_cpu: int = 4000,
    ps_mem: int = 8192,
    worker_speeds: Iterable[float] = (100.0,),
    worker_cpu: int = 2000,
    worker_mem: int = 4096,
    extra: Iterable[NodeObservation] = (),
    throughput_sps: float | None = None,
    samples_done: int = 0,
    samples_total: int = 10_000_000,
    distinct_ids: int | None = None,
    since_s: float = -86_400.0,
) -> Observation:
    """A running job: one PS per entry of ``ps_util`` (CPU utilisation), one worker per entry
    of ``worker_speeds`` (samples/s); job throughput defaults to the workers' sum. Its nodes
    run since ``since_s`` (default: long settled, past any start-up allowance)."""
    ps_u = list(ps_util)
    mem_u = list(ps_mem_util) if ps_mem_util is not None else [0.25] * len(ps_u)
    speeds = list(worker_speeds)
    nodes = [
        node(Role.PS, i, cpu=ps_cpu, mem=ps_mem, cpu_util=u, mem_util=m, since_s=since_s)
        for i, (u, m) in enumerate(zip(ps_u, mem_u, strict=True))
    ]
    nodes += [
        node(Role.WORKER, i, cpu=worker_cpu, mem=worker_mem, speed=s, since_s=since_s)
        for i, s in enumerate(speeds)
    ]
    nodes += list(extra)
    return Observation(
        time_s=time_s,
        nodes=tuple(nodes),
        throughput_sps=sum(speeds) if throughput_sps is None else throughput_sps,
        samples_done=samples_done,
        samples_total=samples_total,
        distinct_ids=distinct_ids,
    )


# --- throughput from the planner's own model form --------------------------------------------


def ps_throughput(
    coef: Mapping[str, float], w: int, p: int, lw: float, lp: float, b: int = B
) -> float:
    """X = w·B / T with T = a0 + a1·B/λw + b1·(w/p)·B/λp + b2·(w/p)·B + b3·p (DOMAIN.md)."""
    t = (
        coef["a0"]
        + coef["a1"] * b / lw
        + coef["b1"] * (w / p) * b / lp
        + coef["b2"] * (w / p) * b
        + coef["b3"] * p
    )
    return w * b / t


def exact_samples(
    coef: Mapping[str, float],
    configs: Iterable[tuple[int, int, float, float]],
    reps: int = 1,
    b: int = B,
) -> list[Sample]:
    return [
        Sample(w, p, lw, lp, ps_throughput(coef, w, p, lw, lp, b), batch_size=b)
        for w, p, lw, lp in configs
        for _ in range(reps)
    ]


GRID_CONFIGS = list(itertools.product([1, 2, 4, 8], [1, 2, 4], [1.0, 2.0, 4.0], [1.0, 2.0, 4.0]))


def fitted_model(coef: Mapping[str, float]) -> PSThroughputModel:
    """A PS model fitted to exact samples of ``coef`` on a rich grid (recovers ``coef``)."""
    return PSThroughputModel(batch_size=B).fit(exact_samples(coef, GRID_CONFIGS))


def samples_at(
    plan: ResourcePlan, throughput_sps: float | Sequence[float], reps: int = 2
) -> list[Sample]:
    """``reps`` samples of ``plan``'s configuration at a given throughput."""
    xs = [throughput_sps] * reps if isinstance(throughput_sps, int | float) else throughput_sps
    w, p, wc, pc = key_of(plan)
    return [Sample(w, p, wc / 1000, pc / 1000, float(x), batch_size=B) for x in xs]


def objective(x: float, cost_core_eq: float, theta: float) -> float:
    return math.log(x) - theta * math.log(cost_core_eq)
