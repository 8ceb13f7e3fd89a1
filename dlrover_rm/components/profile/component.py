"""KFP component: profile a DLRM job with short real trials (a shell over dlrover_core.api)."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from dlrover_rm.components import BASE_IMAGE


@dsl.component(base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False)
def dlrover_profile(
    spec_yaml: str,
    samples: Output[Dataset],
    overrides: list = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    n_configs: int = 6,
) -> int:
    """Run short real trials at the planner's sampling configurations.

    Args:
        spec_yaml: The job spec as YAML text (the same file `dlrover-rm` takes).
        samples: Output. The samples CSV (one row per steady window), the plan step's input.
        overrides: `path.to.field=value` overrides applied to the spec (as `--set`).
        n_configs: How many configurations to try (about 10 s each).

    Returns:
        The number of trials run.
    """
    import yaml

    from dlrover_core import api

    result = api.profile(
        yaml.safe_load(spec_yaml), overrides=overrides, out=samples.path, n_configs=n_configs
    )
    return len(result["trials"])
