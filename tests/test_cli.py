"""The CLI over the api seam: outputs, files, and clear errors without tracebacks."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover_core.cli import main
from dlrover_core.history.records import record_to_dict
from dlrover_core.model import model_from_dict
from dlrover_core.model.samples_io import write_samples_csv
from dlrover_core.types import HistoryRecord, NodeResources, ResourcePlan, RolePlan, Sample, Stage

SMALL = str(Path(__file__).resolve().parent.parent / "pipelines" / "specs" / "small.yaml")
B = 256
COEF = {"a0": 0.004, "a1": 2e-5, "b1": 3e-5, "b2": 1e-6, "b3": 0.001}


def t_iter(w: int, p: int, lw: float, lp: float) -> float:
    c = COEF
    return (
        c["a0"]
        + c["a1"] * B / lw
        + c["b1"] * (w / p) * B / lp
        + c["b2"] * (w / p) * B
        + c["b3"] * p
    )


def make_samples() -> list[Sample]:
    cfgs = [(1, 1, 1, 1), (2, 1, 1, 1), (2, 2, 1, 1), (2, 2, 2, 1), (2, 2, 2, 2), (4, 2, 1, 2),
            (4, 1, 2, 1), (3, 3, 1, 2)]  # fmt: skip
    return [
        Sample(w, p, lw, lp, w * B / t_iter(w, p, lw, lp), batch_size=B) for w, p, lw, lp in cfgs
    ]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plan_prints_readable_plan(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["plan", "--spec", SMALL], capsys)
    assert rc == 0
    assert "stage:    cold_start" in out and "workers:  1 x" in out


def test_plan_json_and_out_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "plan.json"
    rc, out, _ = run(["plan", "--spec", SMALL, "--json", "--out", str(out_file)], capsys)
    assert rc == 0
    printed, written = json.loads(out), json.loads(out_file.read_text())
    assert printed["stage"] == written["stage"] == "cold_start"
    assert ResourcePlan.from_dict(written).workers.count == 1


def test_plan_with_samples_is_model_based(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path = tmp_path / "samples.csv"
    write_samples_csv(csv_path, make_samples())
    rc, out, _ = run(
        ["plan", "--spec", SMALL, "--samples", str(csv_path), "--set", "quota.cpu=16",
         "--set", "quota.memory=64Gi", "--set", "constraints.workers.max=16", "--json"],
        capsys,
    )  # fmt: skip
    assert rc == 0
    d = json.loads(out)
    assert d["stage"] == "scaling"
    assert d["predicted_throughput_sps"] > 0
    assert d["total"]["cpu_millicores"] <= 16000


def test_plan_warm_start_from_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    final = ResourcePlan(
        RolePlan(2, NodeResources(1000, 2048)), RolePlan(1, NodeResources(500, 1024)), Stage.SCALING
    )
    rec = HistoryRecord("example-retrain/dlrm-small/synthetic-criteo", 1e18, final)
    hist = tmp_path / "history.json"
    hist.write_text(json.dumps([record_to_dict(rec)]))
    rc, out, _ = run(["plan", "--spec", SMALL, "--history", str(hist), "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    # finished_at_s lies in the future of "now", so it is outside the history window
    assert d["stage"] == "cold_start"
    rec = HistoryRecord("example-retrain/dlrm-small/synthetic-criteo", 0.0, final)
    hist.write_text(json.dumps([record_to_dict(rec)]))
    assert main(["plan", "--spec", SMALL, "--history", str(hist), "--json"]) == 0
    # now the record is older than the 7-day window (now = wall clock): still cold
    assert json.loads(capsys.readouterr().out)["stage"] == "cold_start"


def test_model_fit_and_predict_roundtrip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples_csv, model_json, configs_csv = (
        tmp_path / "s.csv",
        tmp_path / "m.json",
        tmp_path / "c.csv",
    )
    write_samples_csv(samples_csv, make_samples())
    rc, out, _ = run(
        ["model", "fit", "--samples", str(samples_csv), "--out", str(model_json)], capsys
    )
    assert rc == 0 and model_json.exists()
    configs_csv.write_text("workers,ps,worker_cpu,ps_cpu,note\n8,2,2,2,x\n16,4,1,4,y\n")
    rc, out, _ = run(
        ["model", "predict", "--model", str(model_json), "--configs", str(configs_csv)], capsys
    )
    assert rc == 0
    rows = list(csv.DictReader(out.splitlines()))
    assert [r["note"] for r in rows] == ["x", "y"]
    for r in rows:
        w, p, lw, lp = int(r["workers"]), int(r["ps"]), float(r["worker_cpu"]), float(r["ps_cpu"])
        truth = w * B / t_iter(w, p, lw, lp)
        assert float(r["predicted_throughput"]) == pytest.approx(truth, rel=1e-4)


def test_model_fit_overlap_strategy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples_csv, model_json, configs_csv = (
        tmp_path / "s.csv",
        tmp_path / "m.json",
        tmp_path / "c.csv",
    )
    write_samples_csv(samples_csv, make_samples())
    argv = ["model", "fit", "--samples", str(samples_csv), "--out", str(model_json)]
    rc, _, _ = run([*argv, "--strategy", "ps_overlap"], capsys)
    assert rc == 0
    doc = json.loads(model_json.read_text())
    assert doc["kind"] == "ps_overlap_throughput" and "gamma" in doc["fitted"]
    model = model_from_dict(doc)
    configs_csv.write_text("workers,ps,worker_cpu,ps_cpu\n2,2,2,2\n")
    rc, out, _ = run(
        ["model", "predict", "--model", str(model_json), "--configs", str(configs_csv)], capsys
    )
    assert rc == 0
    (row,) = list(csv.DictReader(out.splitlines()))
    assert float(row["predicted_throughput"]) == pytest.approx(
        model.predict(2, 2, 2.0, 2.0).throughput_sps, rel=1e-5
    )
    # (2, 2, 2, 2) was profiled: the fit reproduces it
    assert float(row["predicted_throughput"]) == pytest.approx(2 * B / t_iter(2, 2, 2, 2), rel=1e-3)
    with pytest.raises(SystemExit) as exc:  # argparse: usage and the choices on stderr
        main([*argv, "--strategy", "nonsense"])
    assert exc.value.code == 2 and "ps_overlap" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "--spec", "/nonexistent.yaml"], "does not exist"),
        (["plan", "--spec", SMALL, "--set", "quota.cpu=0.1"], "smaller than the minimum job"),
        (["plan", "--spec", SMALL, "--set", "nonsense"], "path.to.field=value"),
        (["plan", "--spec", SMALL, "--samples", "/nope.csv"], "nope.csv"),
        (["model", "predict", "--model", "/nope.json", "--configs", "/x.csv"], "does not exist"),
    ],
)
def test_errors_are_clear(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(argv, capsys)
    assert rc == 2
    assert needle in err
    assert "Traceback" not in err


def test_no_traceback_in_a_real_process(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nmodel: {embedding_tables: []}\nquota: {cpu: -1, memory: 4Gx}\nextra: 1\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "dlrover_core.cli", "plan", "--spec", str(bad)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    # one line per problem, each naming its field
    for field in ("model.embedding_tables", "quota.cpu", "quota.memory", "extra"):
        assert f"- {field}" in p.stderr, p.stderr


def test_cli_plan_equals_api_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """Parity: the CLI is a shell over api.plan (the KFP and Airflow parity tests live with
    their shells, tests/components and tests/operators)."""
    from dlrover_core import api

    rc, out, _ = run(["plan", "--spec", SMALL, "--set", "quota.cpu=4", "--json"], capsys)
    assert rc == 0
    via_cli = json.loads(out)
    via_api = api.plan(SMALL, overrides=["quota.cpu=4"])
    for d in (via_cli, via_api):
        d.pop("created_at_s")
        d.pop("planning_ms")
    assert via_cli == via_api


def test_plan_says_which_history_store_it_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f"sqlite:///{tmp_path / 'h.db'}"
    monkeypatch.setenv("DLROVER_RM_HISTORY", store)
    rc, out, _ = run(["plan", "--spec", SMALL], capsys)
    assert rc == 0 and f"history: {store} (0 matching run(s) read)" in out
    rc, out, _ = run(["plan", "--spec", SMALL, "--history", "none"], capsys)
    assert rc == 0 and "history: none read (cold start)" in out
    url = "postgresql://u:s3cret@127.0.0.1:1/x"
    # a store that cannot be read is one line naming it (password hidden) and the fix, exit 2
    rc, out, err = run(["plan", "--spec", SMALL, "--history", url, "--json"], capsys)
    assert rc == 2 and "s3cret" not in out + err and err.count("\n") == 1, err
    assert "u:***@127.0.0.1:1/x" in err and "history.on_error" in err
    # ... unless the spec says to plan cold then: the plan says which store failed
    cold = ["--set", "history.on_error=cold_start"]
    rc, out, err = run(["plan", "--spec", SMALL, "--history", url, "--json", *cold], capsys)
    assert rc == 0 and "s3cret" not in out + err
    h = json.loads(out)["history"]
    assert h["store"] == "postgresql://u:***@127.0.0.1:1/x" and h["records"] == 0
    assert "unavailable" in h["error"] and "s3cret" not in h["error"]


def test_log_json_lines_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    rc, _, _ = run(["--log-level", "info", "--log-json", "plan", "--spec", SMALL], capsys)
    assert rc == 0
    logging.getLogger("x").warning("store postgresql://u:pw@h/db down")
    err = capsys.readouterr().err
    rec = json.loads(err.strip().splitlines()[-1])
    assert rec["level"] == "warning" and rec["msg"] == "store postgresql://u:***@h/db down"
    from dlrover_core import logs

    logs.setup("warning")  # back to the default for the other tests


# --------------------------------------------------------------- submit (Kubernetes)


@pytest.fixture
def k8s_cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The test API server and the Job controller stand-in (no kubelet: nothing trains)."""
    pytest.importorskip("kmock")
    ops = str(Path(__file__).resolve().parent / "operators")
    if ops not in sys.path:
        sys.path.append(ops)
    from _k8s import cluster

    with cluster(tmp_path / "k8s", run_pods=False) as c:
        yield c


K8S = ["--set", "backend.kind=kubernetes", "--set", "backend.namespace=dlrover"]


def test_submit_with_a_plan(
    tmp_path: Path, k8s_cluster: object, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    assert main(["plan", "--spec", SMALL, "--history", "none", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["submit", "--spec", SMALL, *K8S, "--plan", str(plan)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["job"] == "small" and "Job/small-master" in out["created"]
    api = k8s_cluster.server.api  # type: ignore[attr-defined]
    (cm,) = api.objects_of("configmaps", "dlrover")
    (job,) = api.objects_of("jobs", "dlrover", group="batch")
    sent = json.loads(cm["data"]["plan.json"])
    assert sent["workers"] == json.loads(plan.read_text())["workers"]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == [
        "--plan",
        "/etc/dlrover-rm/plan.json",
    ]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[1, 2]", "holds a JSON list, not a plan"),
        ('"a plan"', "holds a JSON str, not a plan"),
        ("{not json", "is not valid JSON"),
        ('{"workers": {}}', "is not a plan written by `dlrover-rm plan`"),
        (None, "does not exist; write one with `dlrover-rm plan --out`"),
    ],
    ids=["list", "string", "not-json", "fields", "missing"],
)
def test_submit_with_a_bad_plan_is_one_line_and_creates_nothing(
    tmp_path: Path,
    k8s_cluster: object,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    needle: str,
) -> None:
    plan = tmp_path / "p.json"
    if content is not None:
        plan.write_text(content)
    assert main(["submit", "--spec", SMALL, *K8S, "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    assert str(plan) in err
    assert k8s_cluster.server.api.objects_of("jobs", "dlrover", group="batch") == []  # type: ignore[attr-defined]
    assert k8s_cluster.server.api.objects_of("secrets", "dlrover") == []  # type: ignore[attr-defined]


def test_submit_history_secret(k8s_cluster: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--spec", SMALL, *K8S, "--history-secret", "Not A Name"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not NAME or NAME:KEY of a Secret" in err, err
    assert main(["submit", "--spec", SMALL, *K8S, "--history-secret", "team-history"]) == 0
    assert json.loads(capsys.readouterr().out)["history"] == {"secret": "team-history:url"}
    (job,) = k8s_cluster.server.api.objects_of("jobs", "dlrover", group="batch")  # type: ignore[attr-defined]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DLROVER_RM_HISTORY"]["valueFrom"] == {
        "secretKeyRef": {"name": "team-history", "key": "url"}
    }


def test_a_missing_optional_dependency_names_its_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without SQLAlchemy, `plan` is one line naming the extra to install (exit 2), not "a bug
    in dlrover-rm" (rc 3)."""
    import sys as _sys

    for mod in [m for m in _sys.modules if m == "sqlalchemy" or m.startswith("sqlalchemy.")]:
        monkeypatch.delitem(_sys.modules, mod)
    for mod in [m for m in _sys.modules if m.startswith("dlrover_core.history.store")]:
        monkeypatch.delitem(_sys.modules, mod)
    monkeypatch.setitem(
        _sys.modules, "sqlalchemy", None
    )  # import sqlalchemy -> ModuleNotFoundError
    rc, _, err = run(["plan", "--spec", SMALL], capsys)
    assert rc == 2, err
    assert "sqlalchemy (the 'history' extra)" in err and "pip install 'dlrover-rm[history]'" in err
    assert "a bug" not in err and err.count("\n") == 1


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    from dlrover_core.cli import build_parser

    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(prefix: str, p: argparse.ArgumentParser) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, child in a.choices.items():
                    if name != "node":  # its own parser (runtime/node.py)
                        out.append((f"{prefix} {name}".strip(), child))
                        walk(f"{prefix} {name}", child)

    walk("", build_parser())
    return out


def test_every_flag_has_help_and_json_means_one_thing() -> None:
    """One CLI convention: every flag documents itself (its default shown by the formatter) and
    every command that prints a result takes --json."""
    for name, p in _commands():
        leaf = not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
        for a in p._actions:
            assert a.help, f"`dlrover-rm {name}` flag {a.option_strings or a.dest} has no help"
        if leaf and name != "demo":
            assert any("--json" in a.option_strings for a in p._actions), name
        if leaf:
            text = p.format_help()
            assert "exit codes: 0 ok" in text, name
            for a in p._actions:
                if a.default not in (None, False, [], argparse.SUPPRESS) and a.option_strings:
                    assert f"default: {a.default}" in " ".join(text.split()), (name, a.dest)


def test_json_prints_only_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "sim.json"
    argv = ["simulate", "--jobs", "3", "--policies", "dlrover-rm", "--json", "--out", str(out_file)]
    rc, out, _ = run(argv, capsys)
    assert rc == 0
    assert json.loads(out) == json.loads(out_file.read_text())
    rc, out, _ = run(["simulate", "--jobs", "3", "--policies", "dlrover-rm"], capsys)
    assert rc == 0 and not out.lstrip().startswith("{")


def test_node_help_exits_zero() -> None:
    for argv in (["node", "--help"], ["node", "-h"]):
        r = subprocess.run(
            [sys.executable, "-m", "dlrover_core.cli", *argv], capture_output=True, text=True
        )
        assert r.returncode == 0 and "ps|worker|rank" in r.stdout, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "dlrover_core.cli", "node", "bogus"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "usage" in r.stderr


def test_a_command_names_every_extra_it_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from dlrover_core import cli

    real = importlib.util.find_spec
    gone = {"torch", "sqlalchemy"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda m, *a: None if m in gone else real(m, *a)
    )
    line = cli.missing_extras("train")
    assert line and "'runtime' and 'history' extras" in line and "\n" not in line
    assert cli.missing_extras("plan") is None
    gone = {"torchrec"}
    line = cli.missing_extras("profile")
    assert line and "--no-deps torchrec" in line
    assert main(["train", "--spec", SMALL]) == 2


def test_run_dry_run_shows_the_request_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run verb: a dry run shows what would start (the master's command and the first
    plan's nodes locally; the Kubernetes objects, Secret values hidden) and starts nothing."""
    run_dir = tmp_path / "run"
    argv = ["run", "--spec", SMALL, "--history", "none", "--run-dir", str(run_dir), "--dry-run"]
    rc, out, _ = run(argv, capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["dry_run"] and d["backend"] == "local" and d["plan"]["stage"] == "cold_start"
    assert {n["node"] for n in d["nodes"]} == {"ps-0", "worker-0"}
    assert not run_dir.exists()
    url = "postgresql://u:secret@db/h"
    argv = ["run", "--spec", SMALL, "--set", "backend.kind=kubernetes", "--history", url,
            "--dry-run"]  # fmt: skip
    rc, out, _ = run(argv, capsys)
    assert rc == 0 and "secret@" not in out
    d = json.loads(out)
    kinds = [o["kind"] for o in d["objects"]]
    assert kinds[-1] == "Job" and kinds.count("Secret") == 2, kinds
