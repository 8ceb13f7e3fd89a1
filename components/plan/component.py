"""KFP component: plan a DLRM job's resources (a shell over dlrover_core.api)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Output

from dlrover_rm.components import BASE_IMAGE


@dsl.component(base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False)
def dlrover_plan(
    spec_yaml: str,
    plan: Output[Artifact],
    reasons: Output[Markdown],
    samples: Input[Dataset] = None,
    overrides: list = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    history: str = "",
    dataset: Input[Dataset] = None,
) -> NamedTuple(
    "PlanOutputs",
    [
        ("workers", int),
        ("worker_cpu", str),
        ("worker_memory", str),
        ("ps", int),
        ("ps_cpu", str),
        ("ps_memory", str),
        ("train_cpu", str),
        ("train_memory", str),
    ],
):
    """Plan workers and parameter servers (count, CPU, memory) for the job.

    Args:
        spec_yaml: The job spec as YAML text.
        plan: Output. The plan as JSON (what `dlrover-rm plan --out` writes).
        reasons: Output. The plan as Markdown: stage, workers and PS with their sizes, the
            history it read, and why (the planner's reasons).
        samples: Optional samples CSV from the profile step; without it, a cold-start plan.
        overrides: `path.to.field=value` overrides applied to the spec (as `--set`).
        history: Optional run-history URL for warm start; empty for none.
        dataset: Optional: the training data the train step gets (its data.source is part
            of the job's history signature, so plan and train must agree on it).

    Returns:
        workers / ps: node counts. worker_cpu, worker_memory, ps_cpu, ps_memory: one node's
        resources as Kubernetes quantities ("1500m", "2Gi"). train_cpu, train_memory: the
        train step's pod: with the local backend it hosts every node (the plan's total plus
        the job master's own share); on Kubernetes it only submits and follows the job.
    """
    import json
    from collections import namedtuple

    import yaml

    from dlrover_core import api
    from dlrover_core.runtime.render import plan_markdown
    from dlrover_core.units import format_cpu, format_memory

    spec = yaml.safe_load(spec_yaml)
    if dataset is not None:
        from dlrover_core.spec import use_data_file
        from dlrover_core.training.data import source_for_path

        fmt = str((dataset.metadata or {}).get("format") or source_for_path(dataset.path))
        spec = use_data_file(spec, fmt, dataset.path)
    p = api.plan(
        spec,
        overrides=overrides,
        samples=samples.path if samples is not None else None,
        history=history or None,
    )
    with open(plan.path, "w") as f:
        json.dump(p, f, indent=2)
    with open(reasons.path, "w", encoding="utf-8") as f:
        f.write(plan_markdown(p))
    outputs = namedtuple(
        "PlanOutputs",
        "workers worker_cpu worker_memory ps ps_cpu ps_memory train_cpu train_memory",
    )
    w, s, t = p["workers"], p["ps"], p["train_step"]
    return outputs(
        w["count"],
        format_cpu(w["cpu_millicores"]),
        format_memory(w["memory_mib"]),
        s["count"],
        format_cpu(s["cpu_millicores"]),
        format_memory(s["memory_mib"]),
        format_cpu(t["cpu_millicores"]),
        format_memory(t["memory_mib"]),
    )
