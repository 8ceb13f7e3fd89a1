"""What each documented install path promises, checked inside that fresh environment.

Run by tests/install/test_install_paths.py with the fresh environment's Python (this file is
not a test module: it needs nothing but the environment under test and the repository's
pipelines/ folder): ``python smoke.py PATH WORKDIR``; exits non-zero naming the broken promise.

Paths (README "Install"):
- ``core``     ``pip install dlrover-rm``: plan (cold start), model, simulate; a command that
               needs an extra says which, in one line, exit 2.
- ``cli``      + the torch pair, torchrec (--no-deps), ``[runtime,history]``: train, status,
               export, and the next plan warm-starts from the history.
- ``airflow``  + ``[airflow]``: the provider is found and its operators import; train works.
- ``image``    exactly the Dockerfile's pip steps: every module a component, an example
               pipeline step or a job's master/node on Kubernetes loads imports, and the example
               KFP pipeline runs end to end with kfp.local (profile -> plan -> train).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY = ["--set", "data.rows=6000", "--set", "data.eval_rows=1000"]


def cli(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        [str(BIN / "dlrover-rm"), *args], capture_output=True, text=True, timeout=600
    )
    if p.returncode != expect:
        raise SystemExit(
            f"`dlrover-rm {' '.join(args)}` exited {p.returncode}, expected {expect}:\n"
            f"{p.stdout[-1500:]}\n{p.stderr[-3000:]}"
        )
    return p


def example_spec() -> str:
    """The example spec as installed (package data), not the checkout's copy."""
    import dlrover_rm

    spec = Path(dlrover_rm.__file__).parent / "pipelines" / "specs" / "small.yaml"
    assert spec.is_file(), f"the wheel lacks its example spec: {spec}"
    assert str(REPO) not in str(spec.resolve()), f"{spec} resolves into the checkout"
    return str(spec)


def one_line_extra(p: subprocess.CompletedProcess[str], extra: str) -> None:
    err = p.stderr.strip().splitlines()
    assert err and f"'{extra}'" in err[-1] and "extra" in err[-1], p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "a bug in dlrover-rm" not in p.stderr, p.stderr


def core(work: Path) -> None:
    spec = example_spec()
    d = json.loads(cli("plan", "--spec", spec, "--history", "none", "--json").stdout)
    assert d["stage"] == "cold_start", d
    cli("simulate", "--jobs", "4", "--policies", "manual,dlrover-rm")
    one_line_extra(cli("train", "--spec", spec, *TINY, expect=2), "runtime")
    url = f"sqlite:///{work / 'h.db'}"
    one_line_extra(cli("plan", "--spec", spec, "--history", url, expect=2), "history")


def cli_path(work: Path) -> None:
    spec = example_spec()
    hist = ["--set", f"history.url=sqlite:///{work / 'h.db'}"]
    run = work / "run1"
    out = cli("train", "--spec", spec, *TINY, *hist, "--run-dir", str(run), "--quiet").stdout
    assert "succeeded" in out, out
    assert json.loads(cli("status", "--run-dir", str(run)).stdout)["job_state"] == "succeeded"
    cli("export", "--run-dir", str(run), "--out", str(work / "model"))
    d = json.loads(cli("plan", "--spec", spec, *hist, "--json").stdout)
    assert d["stage"] == "warm_start", d["stage"]


def airflow(work: Path) -> None:
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="apache_airflow_provider") if "dlrover" in e.value]
    assert eps, "the dlrover-rm provider entry point is not installed"
    info = eps[0].load()()
    assert info["package-name"] == "dlrover-rm", info
    ops = importlib.import_module("dlrover_rm.operators.operators")
    for name in ("DLRoverProfileOperator", "DLRoverPlanOperator", "DLRoverTrainOperator"):
        assert hasattr(ops, name), name
    importlib.import_module("dlrover_rm.operators.triggers")
    cli_path(work)


# not the image's: the open-source DLRover (a simulator peer, the `oss` extra)
NOT_IN_IMAGE = ("dlrover_core.sim.dlrover_oss",)


def image_modules() -> list[str]:
    """Every module of dlrover_core (the master and its nodes on Kubernetes, the components'
    core) and of the KFP components, found by walking the installed packages."""
    import pkgutil

    import dlrover_core
    import dlrover_rm.components

    out = ["kfp.kubernetes", "pyarrow.parquet"]  # the example pipeline's k8s shape, data step
    for pkg in (dlrover_core, dlrover_rm.components):
        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            name = m.name
            if name.startswith(NOT_IN_IMAGE) or ".test_" in name or name.endswith("conftest"):
                continue
            if ".migrations." in name:  # alembic loads these itself (env.py needs its context)
                continue
            out.append(name)
    return out


def image(work: Path) -> None:
    modules = image_modules()
    assert len(modules) > 60, modules
    for m in modules:
        importlib.import_module(m)
    sys.path.insert(0, str(REPO))
    pipeline = importlib.import_module("pipelines.kfp_recurring_retrain")
    pipeline.compile_pipeline(work / "k8s.yaml", kubernetes=True)
    pipeline.example_data.python_func  # noqa: B018 (the data step exists; it runs on k8s)
    os.environ["DLROVER_RM_HISTORY"] = f"sqlite:///{work / 'h.db'}"
    pipeline.run_local(pipeline_root=str(work / "root"))  # raises if a task fails
    rows = pipeline.LOCAL_EXAMPLE_ROWS
    from kfp.dsl import Dataset

    ds = Dataset(name="d", uri=str(work / "data.parquet"))
    assert (
        pipeline.example_data.python_func(spec_yaml=pipeline.DEFAULT_SPEC, rows=rows, dataset=ds)
        == rows
    )


PATHS = {"core": core, "cli": cli_path, "airflow": airflow, "image": image}

if __name__ == "__main__":
    which, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    os.environ["HOME"] = str(work)  # no ~/.dlrover-rm from the machine
    PATHS[which](work)
    print(f"install path {which}: ok")
