"""KFP component: train a DLRM job elastically (a shell over dlrover_core.api)."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from dlrover_rm.components import BASE_IMAGE


@dsl.component(base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False)
def dlrover_train(
    spec_yaml: str,
    plan: Input[Artifact],
    metrics: Output[Metrics],
    run: Output[Artifact],
    model: Output[Model],
    summary: Output[Markdown],
    dashboard: Output[HTML],
    overrides: list = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    history: str = "",
    dataset: Input[Dataset] = None,
    history_secret: str = "",
    state_pvc: str = "",
    run_id: str = "",
    poll_interval: float = 5.0,
    init_from: str = "",
    init_model: Input[Model] = None,
    min_auc: float = 0.0,
    max_auc_drop: float = -1.0,
) -> str:
    """Run the job with the plan; the job master re-plans and scales while it trains.

    Args:
        spec_yaml: The job spec as YAML text.
        plan: The plan JSON from the plan step.
        metrics: Output. auc, throughput_sps, wall_s, cpu_util, mem_util, samples_done,
            shards_done, shards_total (those the report has).
        run: Output. The run directory (report.json, report.png, checkpoints, logs).
        model: Output. The exported model (model.pt: torch tensors, loadable with
            weights_only=True; model_card.json); its metadata holds the held-out AUC and
            logloss, the feature keys and table sizes. Load it with
            dlrover_core.training.load_exported(model.path).
        summary: Output. The report as Markdown: the outcome and figures, every plan (stage,
            size) with its reasons, the faults, the data counts.
        dashboard: Output. One HTML page: the same figures with report.png embedded.
        overrides: `path.to.field=value` overrides applied to the spec (as `--set`).
        history: Optional run-history URL; empty for none.
        dataset: Optional training data from an upstream step (a Criteo TSV or Parquet file
            or folder): it becomes data.path, with data.source from the artifact's
            metadata "format" ("criteo_tsv" or "parquet") or the file name. On Kubernetes
            the task first copies it (the launcher's local copy) into the job's shared
            storage, which every pod of the job reads: the state claim mounted here
            (<state_mount_path>/datasets/<job>/) or the state URL (<state_url>/datasets/<job>/).
        history_secret: On Kubernetes: NAME or NAME:KEY (key "url") of the Secret that holds
            the history store URL; the master Job reads it as $DLROVER_RM_HISTORY, so the URL
            is never a pipeline parameter (mount the same Secret into this task's env, e.g.
            with kfp-kubernetes use_secret_as_env, for the plan step's warm start).
        state_pvc: On Kubernetes: the job's state claim (backend.state_pvc); mount it in this
            task at backend.state_mount_path, so the report and the model come back as
            artifacts. Without a claim (backend.state_url, fsspec), the master writes the
            model and the report to the URL and this task reads them from there.
        run_id: The pipeline run's id (dsl.PIPELINE_JOB_ID_PLACEHOLDER). On Kubernetes the
            job is named <spec name>-<8 hex of it>: each run is a job of its own, and a
            retried task follows its run's job instead of submitting another.
        poll_interval: On Kubernetes: seconds between reads of the job's state and log.
        init_from: Start from an earlier model (training.init_from): "last" for the newest
            model of the job's signature in the run history (a fresh start, said in the log
            and the report, when there is none), a model directory or an fsspec URL of one;
            empty: the spec's own setting.
        init_model: Start from this model (an upstream or imported Model artifact, e.g. a
            dsl.importer of yesterday's model URI); wins over init_from.
        min_auc: The quality gate (quality.min_auc): a model whose held-out AUC is below it is
            rejected: the task fails and the model output is left empty (0: the spec's own).
        max_auc_drop: The quality gate (quality.max_auc_drop): how far below the previous good
            model of the signature its AUC may fall (negative: the spec's own).

    With backend.kind kubernetes (in the spec or an override) the task submits the job's
    master as a Kubernetes Job and follows it through the API, streaming the master's log
    into the task's log; the task's pod hosts neither the master nor the nodes.

    Returns:
        The job's final state ("succeeded"); a job that did not succeed fails the task.
    """
    import json
    import logging
    from pathlib import Path

    import yaml

    from dlrover_core import api, logs

    root = logging.getLogger()
    if root.handlers:  # the KFP executor's own handler: keep it (one line a record), redacted
        logs.quiet_third_party()
        for h in root.handlers:
            h.addFilter(logs.RedactingFilter())
        root.setLevel(logging.INFO)
    else:
        logs.setup("info")  # the master's launch/plan/progress/export lines reach the pod log

    spec = yaml.safe_load(spec_yaml)
    over = list(overrides)
    if init_model is not None:
        over.append(f"training.init_from={init_model.path}")
    elif init_from:
        over.append(f"training.init_from={init_from}")
    if min_auc > 0:
        over.append(f"quality.min_auc={min_auc}")
    if max_auc_drop >= 0:
        over.append(f"quality.max_auc_drop={max_auc_drop}")
    if state_pvc:
        over.append(f"backend.state_pvc={state_pvc}")
    js = api.resolve_spec(spec, over)
    on_k8s = api.submits(js)  # Kubernetes: the master runs as its own Job, this task follows
    if on_k8s and run_id:
        import hashlib

        over.append(f"name={js.name}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}")
        js = api.resolve_spec(spec, over)
    if dataset is not None:
        from dlrover_core.spec import use_data_file
        from dlrover_core.training.data import source_for_path

        fmt = str((dataset.metadata or {}).get("format") or source_for_path(dataset.path))
        where = dataset.path
        if on_k8s:  # the job's pods see neither this task's copy nor (minio://) its URI
            from dlrover_core.runtime.state_url import stage_dataset

            where = stage_dataset(dataset.path, js.backend, js.name)
            logging.getLogger("dlrover_rm.kfp").info("dataset staged at %s", where)
        spec = use_data_file(spec, fmt, where)
    if not on_k8s:
        report = api.run(
            spec,
            overrides=over,
            plan=plan.path,
            run_dir=run.path,
            history=history or None,
            progress=True,  # not a terminal: one progress record every 15 s in the pod log
            model_dir=model.path,
        )
    else:
        import shutil

        log = logging.getLogger("dlrover_rm.kfp")
        report = api.run(
            spec,
            overrides=over,
            plan=plan.path,
            history=history or None,
            history_secret=history_secret or None,
            poll_interval=poll_interval,
            on_line=lambda pod, line: log.info("%s | %s", pod, line),
        )
        # the run directory and the model are on the job's state volume: copy what the
        # artifacts need (this task mounts the claim where the master wrote them)
        Path(run.path).mkdir(parents=True, exist_ok=True)
        src = Path(str(report.get("run_dir") or "/nonexistent"))
        for name in ("report.png", "master.json"):
            if (src / name).is_file():
                shutil.copy2(src / name, Path(run.path) / name)
        from dlrover_core.runtime.report import json_safe

        # the master's report.json with what it learnt after (history run id, job, namespace)
        text = json.dumps(json_safe(report), indent=2, allow_nan=False)
        Path(run.path, "report.json").write_text(text + "\n", encoding="utf-8")
        mdir = Path(str(report.get("model_dir") or "/nonexistent"))
        if report["state"] == "succeeded" and (mdir / "model_card.json").is_file():
            shutil.copytree(mdir, model.path, dirs_exist_ok=True)
        elif report["state"] == "succeeded" and report.get("model_url"):
            # no shared claim: the master wrote the model and report.png to backend.state_url
            from dlrover_core.runtime import state_url

            state_url.pull_tree(str(report["model_url"]), model.path)
            if report.get("run_url") and not (Path(run.path) / "report.png").is_file():
                png_url = state_url.join(str(report["run_url"]), "report.png")
                state_url.pull_file(png_url, Path(run.path) / "report.png")
            if not (Path(model.path) / "model_card.json").is_file():
                report["export_error"] = f"no model_card.json at {report['model_url']}"
        elif report["state"] == "succeeded" and not report.get("export_error"):
            report["export_error"] = (
                f"the model is on the job's state volume ({report.get('model_dir')}), not "
                f"readable here: mount claim {js.backend.state_pvc or '<job>-state'} in this "
                f"task at {js.backend.state_mount_path} (kfp-kubernetes mount_pvc)"
            )
    from dlrover_core.runtime.render import report_html, report_markdown

    Path(summary.path).write_text(report_markdown(report), encoding="utf-8")
    png = Path(run.path) / "report.png"
    Path(dashboard.path).write_text(report_html(report, png), encoding="utf-8")
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
    card_path = Path(model.path) / "model_card.json"
    if report["state"] == "succeeded" and card_path.exists():
        card = json.loads(card_path.read_text())
        model.framework = "torch"
        model.metadata.update(
            {
                "format": "dlrover-rm-dlrm/{}".format(card["format"]),
                "held_out_auc": card["held_out"]["auc"],
                "held_out_logloss": card["held_out"]["logloss"],
                "held_out_rows": card["held_out"]["rows"],
                "feature_keys": card["feature_keys"],
                "tables": {t["name"]: t["rows"] for t in card["tables"]},
                "signature": card["signature"],
                "data": card["data"],
            }
        )
    elif report["state"] == "succeeded":
        raise RuntimeError(f"the model was not exported: {report.get('export_error')}")
    if report["state"] != "succeeded":  # failed, stopped, or rejected by the quality gate
        why = report.get("failure") or report.get("reason")
        raise RuntimeError(f"training ended {report['state']}: {why}")
    return report["state"]
