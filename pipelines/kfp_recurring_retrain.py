"""The example recurring DLRM retrain as a Kubeflow pipeline: profile → plan → train.

Two shapes of one pipeline:

- ``recurring_retrain`` (local backend): the train task runs the whole job in its pod; its CPU
  and memory requests and limits come from the plan task's outputs, so KFP compiles them to
  run-time placeholders and each run's training pod is sized by its own plan.
- ``recurring_retrain_k8s`` (``backend.kind: kubernetes``): the train task submits the job's
  master as a Kubernetes Job and follows it (the master and every node are pods of their
  own), so its pod is sized for that alone (``api.SUBMITTER_RESOURCES``). The run history's
  URL comes from a Secret (``history_secret``, key ``url``): the plan task reads it as
  ``$DLROVER_RM_HISTORY`` (kfp-kubernetes), the master Job the same way; it is never a
  pipeline parameter. The job's state claim is mounted in the train task, so the report and
  the model come back as artifacts. Its data comes from an upstream step's ``Dataset``
  (``example_data``, synthetic Criteo-format Parquet: replace it with your own data-prep):
  profile, plan and train all read it, and the train task stages it on the claim for the
  job's pods.

    python pipelines/kfp_recurring_retrain.py --compile OUT.yaml [--kubernetes]
    python pipelines/kfp_recurring_retrain.py --local [--kubernetes]   # run it here (kfp.local)
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml
from kfp import compiler, dsl
from kfp.dsl import Dataset, Output

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from dlrover_core.api import SUBMITTER_RESOURCES  # noqa: E402
from dlrover_core.units import format_cpu, format_memory  # noqa: E402
from dlrover_rm.components import BASE_IMAGE  # noqa: E402
from dlrover_rm.components.plan.component import dlrover_plan  # noqa: E402
from dlrover_rm.components.profile.component import (  # noqa: E402
    dlrover_profile,
    dlrover_profile_size,
)
from dlrover_rm.components.train.component import dlrover_train  # noqa: E402

# The example spec as one line of JSON (JSON is YAML): the KFP compiler copies parameter
# defaults into a header comment, and a multi-line default would break the YAML it writes.
DEFAULT_SPEC = json.dumps(
    yaml.safe_load((Path(__file__).resolve().parent / "specs" / "small.yaml").read_text())
)
COMPILED = Path(__file__).resolve().with_suffix(".yaml")
COMPILED_K8S = COMPILED.with_name(COMPILED.stem + "_k8s.yaml")
# The Kubernetes shape's defaults: the job's master and nodes run on the components' image.
K8S_OVERRIDES = [
    "backend.kind=kubernetes",
    "backend.namespace=dlrover",
    f"backend.image={BASE_IMAGE}",
]
HISTORY_SECRET = "dlrover-rm-history"  # key "url": a SQLAlchemy URL (PostgreSQL, ...)
STATE_PVC = "dlrover-rm-state"  # ReadWriteMany, shared by the runs (runs/<job> each)
STATE_MOUNT = "/var/lib/dlrover-rm"  # backend.state_mount_path's default
# Settings that keep a --local run short on a small machine (2 profile configs, few rows).
LOCAL_OVERRIDES = ["data.rows=20000", "data.eval_rows=2000"]
LOCAL_N_CONFIGS = 2
# The quality gate's defaults: a model no better than chance, or one that fell more than 0.1
# held-out AUC below the last good model, is rejected and published nowhere. (The example's
# synthetic data are the same rows every run: a model carried forward over them loses ~0.05
# a run as it overfits; your data-prep step gives each run new rows.)
MIN_AUC = 0.55
MAX_AUC_DROP = 0.1
EXAMPLE_ROWS = 200_000  # the k8s shape's example data-prep step
LOCAL_EXAMPLE_ROWS = 22_000  # a --local run: LOCAL_OVERRIDES' 20000 rows + 2000 held out


@dsl.component(base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False)
def example_data(spec_yaml: str, rows: int, dataset: Output[Dataset]) -> int:
    """The example's data-prep step: ``rows`` Criteo-format records as Parquet (``label``,
    ``I1..``, ``C1..`` with the spec's dense feature and table counts), from the project's
    synthetic generator. Replace it with your own step that outputs a ``Dataset`` (Parquet
    or Criteo TSV; metadata ``format``).

    Returns:
        The number of rows written.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from dlrover_core.spec import parse_spec
    from dlrover_core.training.data import SyntheticCriteo

    js = parse_spec(yaml.safe_load(spec_yaml))
    dense, tables = js.model.dense_features, len(js.model.embedding_tables)
    b = SyntheticCriteo(num_dense=dense, num_sparse=tables, num_rows=rows).rows(0, rows)
    cols = {"label": b.labels.astype(np.int64)}
    ints = np.rint(np.expm1(b.dense.astype(np.float64))).astype(np.int64)  # raw counts
    cols |= {f"I{i + 1}": ints[:, i] for i in range(dense)}
    cols |= {f"C{i + 1}": b.sparse[:, i] for i in range(tables)}
    pq.write_table(pa.table(cols), dataset.path, row_group_size=50_000)
    dataset.metadata["format"] = "parquet"
    dataset.metadata["rows"] = rows
    return rows


def _sized_profile(spec_yaml: str, overrides: list, n_configs: int, dataset=None):  # type: ignore[no-untyped-def]
    """The profile task, sized to its largest trial plus the master (request = limit): its
    trials run in its pod, and a trial on arbitrary CPU would measure arbitrary speeds."""
    size_task = dlrover_profile_size(spec_yaml=spec_yaml, overrides=overrides, n_configs=n_configs)
    size_task.set_caching_options(False)
    extra = {} if dataset is None else {"dataset": dataset}
    profile_task = dlrover_profile(
        spec_yaml=spec_yaml, overrides=overrides, n_configs=n_configs, **extra
    )
    cpu, memory = size_task.outputs["cpu"], size_task.outputs["memory"]
    profile_task.set_cpu_request(cpu).set_cpu_limit(cpu)
    profile_task.set_memory_request(memory).set_memory_limit(memory)
    # resource placeholders are no data dependency: without this, a runner may start the
    # profile task before its size is known (kfp.local did: "task ... not found")
    profile_task.after(size_task)
    return profile_task


@dsl.pipeline(
    name="dlrm-recurring-retrain",
    description="Profile, plan and train a DLRM job; the train step is sized by the plan.",
)
def recurring_retrain(
    spec_yaml: str = DEFAULT_SPEC,
    overrides: list = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    n_configs: int = 6,
    history: str = "",
    init_from: str = "last",
    min_auc: float = MIN_AUC,
    max_auc_drop: float = MAX_AUC_DROP,
):
    profile_task = _sized_profile(spec_yaml, overrides, n_configs)
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
        init_from=init_from,  # "last": yesterday's model from the history, else a fresh start
        min_auc=min_auc,  # the gate: a model below it, or too far below yesterday's, fails
        max_auc_drop=max_auc_drop,  # the task and publishes nothing
    )
    # The local backend runs the master, PS and workers inside this one pod: size it to the
    # plan's total (request == limit, so the pod gets what the plan assumed).
    train_task.set_cpu_request(plan_task.outputs["train_cpu"])
    train_task.set_cpu_limit(plan_task.outputs["train_cpu"])
    train_task.set_memory_request(plan_task.outputs["train_memory"])
    train_task.set_memory_limit(plan_task.outputs["train_memory"])
    train_task.set_caching_options(False)
    profile_task.set_caching_options(False)


@dsl.pipeline(
    name="dlrm-recurring-retrain-k8s",
    description="Profile, plan and train a DLRM job on Kubernetes: the train step submits "
    "the job's master as a Kubernetes Job and follows it; history from a Secret.",
)
def recurring_retrain_k8s(
    spec_yaml: str = DEFAULT_SPEC,
    overrides: list = K8S_OVERRIDES,
    n_configs: int = 6,
    history_secret: str = HISTORY_SECRET,
    state_pvc: str = STATE_PVC,
    poll_interval: float = 5.0,
    example_rows: int = EXAMPLE_ROWS,
    init_from: str = "last",
    min_auc: float = MIN_AUC,
    max_auc_drop: float = MAX_AUC_DROP,
):
    from kfp import kubernetes

    # data in: an upstream step's Dataset; profile, plan and train all read it (data.source
    # is part of the history signature), the train step stages it for the job's pods
    data_task = example_data(spec_yaml=spec_yaml, rows=example_rows)
    data_task.set_caching_options(False)
    data = data_task.outputs["dataset"]
    profile_task = _sized_profile(spec_yaml, overrides, n_configs, dataset=data)
    plan_task = dlrover_plan(
        spec_yaml=spec_yaml,
        samples=profile_task.outputs["samples"],
        overrides=overrides,
        dataset=data,
    )
    # warm start: the plan step reads the store through $DLROVER_RM_HISTORY (the default
    # store), from the Secret; optional, so a cluster without one plans cold
    kubernetes.use_secret_as_env(
        plan_task,
        secret_name=history_secret,
        secret_key_to_env={"url": "DLROVER_RM_HISTORY"},
        optional=True,
    )
    train_task = dlrover_train(
        spec_yaml=spec_yaml,
        plan=plan_task.outputs["plan"],
        overrides=overrides,
        history_secret=history_secret,
        state_pvc=state_pvc,
        dataset=data,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        poll_interval=poll_interval,
        init_from=init_from,  # "last": the newest model on the state claim, via the history
        min_auc=min_auc,
        max_auc_drop=max_auc_drop,
    )
    # the master and the nodes are pods of their own: this pod only submits and follows
    cpu = format_cpu(SUBMITTER_RESOURCES.cpu_millicores)
    memory = format_memory(SUBMITTER_RESOURCES.memory_mib)
    train_task.set_cpu_request(cpu).set_cpu_limit(cpu)
    train_task.set_memory_request(memory).set_memory_limit(memory)
    kubernetes.mount_pvc(train_task, pvc_name=state_pvc, mount_path=STATE_MOUNT)
    train_task.set_caching_options(False)
    profile_task.set_caching_options(False)


def compile_pipeline(out: "str | Path", kubernetes: bool = False) -> Path:
    fn = recurring_retrain_k8s if kubernetes else recurring_retrain
    compiler.Compiler().compile(fn, package_path=str(out))
    return Path(out)


def run_local(
    overrides: list[str] | None = None,
    n_configs: int = LOCAL_N_CONFIGS,
    pipeline_root: str | None = None,
    kubernetes: bool = False,
    **params: object,
) -> object:
    """Run the pipeline end to end on this machine (no Docker); returns the pipeline task.
    With ``kubernetes`` the Kubernetes shape, against the cluster ``$KUBECONFIG`` names
    (kfp.local ignores the kfp-kubernetes settings: the history Secret's URL comes from this
    process's ``$DLROVER_RM_HISTORY``, the claim is not mounted)."""
    from kfp import local

    root = pipeline_root or tempfile.mkdtemp(prefix="dlrover-kfp-")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    over = list(LOCAL_OVERRIDES if overrides is None else overrides)
    if kubernetes:
        params.setdefault("example_rows", LOCAL_EXAMPLE_ROWS)
        return recurring_retrain_k8s(
            overrides=[*K8S_OVERRIDES, *over], n_configs=n_configs, **params
        )
    return recurring_retrain(overrides=over, n_configs=n_configs, **params)


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
    ap.add_argument(
        "--kubernetes",
        action="store_true",
        help="the Kubernetes shape (train submits the master as a Job; history from a Secret)",
    )
    args = ap.parse_args(argv)
    if args.compile:
        print(compile_pipeline(args.compile, kubernetes=args.kubernetes))
        return 0
    run_local(args.overrides, args.n_configs, args.pipeline_root, kubernetes=args.kubernetes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
