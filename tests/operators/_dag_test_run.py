"""Run the example DAG (or the DAG file given as the second argument) under ``dag.test()``;
meant for a subprocess whose environment sets
AIRFLOW_HOME (Airflow reads its configuration once, at import). Prints one JSON line:
``{"state": ..., "tis": {task_id: state}, "report": ...}``."""

from __future__ import annotations

import json
import sys

from airflow.utils.db import initdb  # noqa: F401  (fails early when Airflow is broken)


def main() -> int:
    import importlib.util
    from pathlib import Path

    conf = json.loads(sys.argv[1])
    path = Path(__file__).resolve().parents[2] / "pipelines" / "airflow_recurring_retrain.py"
    if len(sys.argv) > 2:
        path = Path(sys.argv[2])
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    dr = mod.dag.test(run_conf=conf)
    tis = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    report = model_dir = None
    for ti in dr.get_task_instances():
        if ti.task_id == "train":
            report = ti.xcom_pull(task_ids="train")
            model_dir = ti.xcom_pull(task_ids="train", key="model_dir")
    out = {"state": str(dr.state), "tis": tis, "report": report, "model_dir": model_dir}
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
