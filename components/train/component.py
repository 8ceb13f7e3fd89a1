"""KFP component: train a DLRM job elastically (a shell over dlrover_core.api)."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Output

BASE_IMAGE = "dlrover-rm:0.1.0"


@dsl.component(base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False)
def dlrover_train(
    spec_yaml: str,
    plan: Input[Artifact],
    metrics: Output[Metrics],
    run: Output[Artifact],
    overrides: list = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    history: str = "",
) -> str:
    """Run the job with the plan; the job master re-plans and scales while it trains.

    Args:
        spec_yaml: The job spec as YAML text.
        plan: The plan JSON from the plan step.
        metrics: Output. auc, throughput_sps, wall_s, cpu_util, mem_util, samples_done,
            shards_done, shards_total (those the report has).
        run: Output. The run directory (report.json, report.png, checkpoints, logs).
        overrides: `path.to.field=value` overrides applied to the spec (as `--set`).
        history: Optional run-history URL; empty for none.

    Returns:
        The job's final state ("succeeded"); a job that did not succeed fails the task.
    """
    import yaml

    from dlrover_core import api

    report = api.train(
        yaml.safe_load(spec_yaml),
        overrides=overrides,
        plan=plan.path,
        run_dir=run.path,
        history=history or None,
        progress=False,
    )
    for key in (
        "auc",
        "throughput_sps",
        "wall_s",
        "cpu_util",
        "mem_util",
        "samples_done",
        "shards_done",
        "shards_total",
    ):
        if isinstance(report.get(key), (int, float)):
            metrics.log_metric(key, report[key])
    if report["state"] != "succeeded":
        raise RuntimeError(f"training ended {report['state']}: {report.get('failure')}")
    return report["state"]
