"""KFP component: profile a DLRM job with short real trials (a shell over dlrover_core.api)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from dlrover_rm.components import BASE_IMAGE


@dsl.component(base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False)
def dlrover_profile(
    spec_yaml: str,
    samples: Output[Dataset],
    overrides: list = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    n_configs: int = 6,
    dataset: Input[Dataset] = None,
) -> int:
    """Run short real trials at the planner's sampling configurations.

    Args:
        spec_yaml: The job spec as YAML text (the same file `dlrover-rm` takes).
        samples: Output. The samples CSV (one row per steady window), the plan step's input.
        overrides: `path.to.field=value` overrides applied to the spec (as `--set`).
        n_configs: How many configurations to try (about 10 s each).
        dataset: Optional training data (Criteo TSV or Parquet) from an upstream step: the
            trials read it (they run in this pod) instead of the spec's data.

    Every trial runs in this task's container: size it with ``dlrover_profile_size`` (request =
    limit). A trial above the container's cgroup limits is not run (it would be measured
    throttled, or OOM-killed); the log says which and why.

    Returns:
        The number of trials run.
    """
    import logging

    import yaml

    from dlrover_core import api

    log = logging.getLogger("dlrover_rm.kfp")
    spec = yaml.safe_load(spec_yaml)
    if dataset is not None:
        from dlrover_core.spec import use_data_file
        from dlrover_core.training.data import source_for_path

        fmt = str((dataset.metadata or {}).get("format") or source_for_path(dataset.path))
        spec = use_data_file(spec, fmt, dataset.path)
    result = api.profile(spec, overrides=overrides, out=samples.path, n_configs=n_configs)
    for t in result["trials"]:
        log.info(
            "trial %dw x %.2g CPU, %dps x %.2g CPU (needs %dm, %d MiB in %s): %s",
            t["workers"], t["worker_cpu"], t["ps"], t["ps_cpu"], t["needs_cpu_millicores"],
            t["needs_memory_mib"], t["container"],
            t["skipped"] or f"{t['throughput']} samples/s",
        )  # fmt: skip
    return sum(1 for t in result["trials"] if not t["skipped"])


@dsl.component(base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False)
def dlrover_profile_size(
    spec_yaml: str,
    overrides: list = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    n_configs: int = 6,
) -> NamedTuple("ProfileSize", cpu=str, memory=str):  # type: ignore[valid-type]
    """The profile step's pod size: its largest trial plus the master (the trials run one after
    another in that pod). Plans the trials; runs nothing.

    Args:
        spec_yaml: The job spec as YAML text.
        overrides: `path.to.field=value` overrides applied to the spec (as `--set`).
        n_configs: The profile step's n_configs.

    Returns:
        cpu and memory as Kubernetes quantities, for the profile task's request and limit.
    """
    from collections import namedtuple

    import yaml

    from dlrover_core import api

    size = api.profile_size(yaml.safe_load(spec_yaml), overrides=overrides, n_configs=n_configs)
    return namedtuple("ProfileSize", ["cpu", "memory"])(size["cpu"], size["memory"])
