"""Every bad input of issue 11: one clear line on stderr, a non-zero exit, no traceback.

Table-driven over the CLI (in-process, so it is fast); one case also in a real process."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from dlrover_core.cli import main
from dlrover_core.spec import load_spec, use_data_file
from dlrover_core.training.data import SyntheticCriteo, write_criteo_tsv

SMALL = str(Path(__file__).resolve().parent.parent / "pipelines" / "specs" / "small.yaml")


def file_spec(tmp: Path, path: Path | str, source: str = "criteo_tsv") -> Path:
    """small.yaml reading ``path`` (its synthetic-only data settings dropped)."""
    out = tmp / "file-spec.yaml"
    out.write_text(
        yaml.safe_dump(use_data_file(yaml.safe_load(Path(SMALL).read_text()), source, str(path)))
    )
    return out


def _non_utf8(tmp: Path) -> list[str]:
    p = tmp / "latin1.yaml"
    p.write_bytes("name: caf\xe9\n".encode("latin-1"))
    return ["plan", "--spec", str(p)]


def _plan_file(content: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        p = tmp / "plan.json"
        p.write_text(content)
        return ["train", "--spec", SMALL, "--plan", str(p), "--run-dir", str(tmp / "r")]

    return make


def _run_dir(kind: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        rd = tmp / "run"
        rd.mkdir()
        if kind == "master-json":
            (rd / "master.json").write_text("{not json")
        elif kind == "master-list":
            (rd / "master.json").write_text("[1, 2]")
        elif kind == "shards-db":
            (rd / "master.json").write_text(json.dumps({"job_state": "running", "nodes": []}))
            (rd / "shards.db").write_bytes(b"this is not sqlite" * 100)
        elif kind == "shards-foreign":
            (rd / "master.json").write_text(json.dumps({"job_state": "running", "nodes": []}))
            sqlite3.connect(rd / "shards.db").execute("CREATE TABLE other (x)").connection.close()
        return ["status", "--run-dir", str(rd)]

    return make


def plan_set(*sets: str) -> Callable[[Path], list[str]]:
    return lambda t: ["plan", "--spec", SMALL, *(x for v in sets for x in ("--set", v))]


CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("non-utf8-spec", _non_utf8, "not UTF-8"),
    ("plan-list", _plan_file("[1, 2]"), "holds a JSON list"),
    ("plan-string", _plan_file('"a plan"'), "holds a JSON str"),
    ("plan-fields", _plan_file('{"stage": "x"}'), "not a plan written by"),
    ("plan-not-json", _plan_file("{"), "not valid JSON"),
    ("policies-nope", lambda t: ["simulate", "--jobs", "2", "--policies", "nope"], "nope"),
    ("policies-comma", lambda t: ["simulate", "--jobs", "2", "--policies", ","], "empty name"),
    ("policies-empty", lambda t: ["simulate", "--jobs", "2", "--policies", ""], "empty name"),
    ("seed-negative", lambda t: ["simulate", "--jobs", "2", "--seed", "-1"], "--seed"),
    ("jobs-zero", lambda t: ["simulate", "--jobs", "0"], "--jobs"),
    ("allreduce-share-2", lambda t: ["simulate", "--jobs", "2", "--allreduce-share", "2"], "0..1"),
    ("allreduce-share-x", lambda t: ["simulate", "--jobs", "2", "--allreduce-share", "x"], "0..1"),
    ("allreduce-share-nan", lambda t: ["simulate", "--allreduce-share", "nan"], "0..1"),
    ("status-missing", lambda t: ["status", "--run-dir", str(t / "nope")], "does not exist"),
    ("status-master-json", _run_dir("master-json"), "master.json"),
    ("status-master-list", _run_dir("master-list"), "not a JSON object"),
    ("status-shards-db", _run_dir("shards-db"), "shards.db"),
    ("status-shards-foreign", _run_dir("shards-foreign"), "not a dlrover-rm shard table"),
    (
        "num-embeddings-2^64",
        plan_set(f"model.embedding_tables.4.num_embeddings={2**64}"),
        "2^63",
    ),
    ("lr-inf", plan_set("training.optimizer.lr=.inf"), "lr"),
    ("rows-1e20", plan_set("data.rows=100000000000000000000"), "data.rows"),
    ("dcn", plan_set("model.architecture=dcn"), "not implemented"),
    ("deepfm", plan_set("model.architecture=deepfm"), "dlrm"),
    ("steps", plan_set("training.steps=10"), "training.steps"),
    ("rows-with-a-file", plan_set("data.source=criteo_tsv", f"data.path={SMALL}"), "only apply"),
    ("path-with-synthetic", plan_set(f"data.path={SMALL}"), "data.path is read only"),
    ("url-unknown-protocol", lambda t: ["plan", "--spec", str(file_spec(t, "nope://b/x"))], "nope"),
    ("export-nothing", lambda t: ["export", "--run-dir", str(t), "--out", f"{t}/m"], "spec.json"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_clear_line_and_non_zero_exit(
    make: Callable[[Path], list[str]],
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(make(tmp_path))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert needle in err, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[0].startswith("error: ")
    # a heading plus one line per problem at most (a spec with one mistake: two lines)
    assert len(lines) <= 2, err


def test_memory_bare_number_is_bytes() -> None:
    spec = load_spec(SMALL, ["quota.memory=8589934592"])  # 8 GiB in bytes, as Kubernetes reads
    assert spec.quota.memory_mib == 8192
    spec = load_spec(SMALL, ['quota.memory="8589934592"'])
    assert spec.quota.memory_mib == 8192


def test_all_malformed_tsv_fails_with_a_reason_and_valid_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("".join(f"x\t{i}\tnot criteo\n" for i in range(500)))
    hist = tmp_path / "h.db"
    rd = tmp_path / "run"
    spec = file_spec(tmp_path, tsv)
    argv = ["train", "--spec", str(spec), "--run-dir", str(rd), "--history", f"sqlite:///{hist}"]
    rc = main([*argv, "--set", "data.eval_rows=50"])
    out = capsys.readouterr()
    assert rc == 1
    assert "no usable record" in out.out + out.err
    text = (rd / "report.json").read_text()
    report = json.loads(text)  # valid JSON: no NaN
    assert "NaN" not in text
    assert report["state"] == "failed" and "no usable record" in report["failure"]
    assert report["data"]["malformed"] == 500
    (f,) = report["data"]["files"]
    assert f["malformed"] == 450 and f["held_out_malformed"] == 50 and f["first_malformed"] == 1
    if hist.exists():  # nothing recorded as a success
        con = sqlite3.connect(hist)
        try:
            n = con.execute("SELECT COUNT(*) FROM runs WHERE succeeded").fetchone()[0]
        except sqlite3.OperationalError:
            n = 0
        finally:
            con.close()
        assert n == 0


def test_partly_malformed_tsv_counts_reach_the_report(tmp_path: Path) -> None:
    """The data scan before the job: good and bad lines per file, in the report."""
    from dlrover_core.runtime.job import check_data

    tsv = tmp_path / "d.tsv"
    write_criteo_tsv(tsv, SyntheticCriteo(num_dense=13, num_sparse=8).rows(0, 300))
    with tsv.open("a") as f:
        f.write("garbage\n" * 7)
    write_criteo_tsv(tsv, SyntheticCriteo(num_dense=13, num_sparse=8).rows(300, 400), append=True)
    spec = load_spec(file_spec(tmp_path, tsv), ["data.eval_rows=50"])
    data, problem = check_data(spec)
    assert problem is None and data is not None
    assert data["malformed"] == 7 and data["records"] == 350 and data["held_out_records"] == 50
    assert data["files"][0]["first_malformed"] == 301


def test_no_traceback_in_a_real_process(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "dlrover_core.cli", "simulate", "--policies", ","],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().startswith("error: --policies")
