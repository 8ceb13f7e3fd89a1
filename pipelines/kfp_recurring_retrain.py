"""The example recurring DLRM retrain as a Kubeflow pipeline: profile → plan → train.

The train task's CPU and memory requests and limits come from the plan task's outputs, so KFP
compiles them to run-time placeholders and each run's training pod is sized by its own plan.

    python pipelines/kfp_recurring_retrain.py --compile OUT.yaml   # write the pipeline YAML
    python pipelines/kfp_recurring_retrain.py --local              # run it here (kfp.local)
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml
from kfp import compiler, dsl

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from components.plan.component import dlrover_plan  # noqa: E402
from components.profile.component import dlrover_profile  # noqa: E402
from components.train.component import dlrover_train  # noqa: E402

# The example spec as one line of JSON (JSON is YAML): the KFP compiler copies parameter
# defaults into a header comment, and a multi-line default would break the YAML it writes.
DEFAULT_SPEC = json.dumps(
    yaml.safe_load((Path(__file__).resolve().parent / "specs" / "small.yaml").read_text())
)
COMPILED = Path(__file__).resolve().with_suffix(".yaml")
# Settings that keep a --local run short on a small machine (2 profile configs, few rows).
LOCAL_OVERRIDES = ["data.rows=20000", "data.eval_rows=2000"]
LOCAL_N_CONFIGS = 2


@dsl.pipeline(
    name="dlrm-recurring-retrain",
    description="Profile, plan and train a DLRM job; the train step is sized by the plan.",
)
def recurring_retrain(
    spec_yaml: str = DEFAULT_SPEC,
    overrides: list = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    n_configs: int = 6,
    history: str = "",
):
    profile_task = dlrover_profile(spec_yaml=spec_yaml, overrides=overrides, n_configs=n_configs)
    plan_task = dlrover_plan(
        spec_yaml=spec_yaml,
        samples=profile_task.outputs["samples"],
        overrides=overrides,
        history=history,
    )
    train_task = dlrover_train(
        spec_yaml=spec_yaml,
        plan=plan_task.outputs["plan"],
        overrides=overrides,
        history=history,
    )
    # The local backend runs the master, PS and workers inside this one pod: size it to the
    # plan's total (request == limit, so the pod gets what the plan assumed).
    train_task.set_cpu_request(plan_task.outputs["train_cpu"])
    train_task.set_cpu_limit(plan_task.outputs["train_cpu"])
    train_task.set_memory_request(plan_task.outputs["train_memory"])
    train_task.set_memory_limit(plan_task.outputs["train_memory"])
    train_task.set_caching_options(False)
    profile_task.set_caching_options(False)


def compile_pipeline(out: "str | Path") -> Path:
    compiler.Compiler().compile(recurring_retrain, package_path=str(out))
    return Path(out)


def run_local(
    overrides: list[str] | None = None,
    n_configs: int = LOCAL_N_CONFIGS,
    pipeline_root: str | None = None,
) -> object:
    """Run the pipeline end to end on this machine (no Docker); returns the pipeline task."""
    from kfp import local

    root = pipeline_root or tempfile.mkdtemp(prefix="dlrover-kfp-")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    return recurring_retrain(
        overrides=list(LOCAL_OVERRIDES if overrides is None else overrides), n_configs=n_configs
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--compile", metavar="OUT.yaml", help="write the compiled pipeline YAML")
    g.add_argument("--local", action="store_true", help="run end to end here with kfp.local")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="PATH=VALUE",
        help=f"spec override for --local (default: {' '.join(LOCAL_OVERRIDES)})",
    )
    ap.add_argument("--n-configs", type=int, default=LOCAL_N_CONFIGS, help="profile configs")
    ap.add_argument("--pipeline-root", help="where --local writes artifacts (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.compile:
        print(compile_pipeline(args.compile))
        return 0
    run_local(args.overrides, args.n_configs, args.pipeline_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
