"""The KFP train task on Kubernetes with the job's storage at ``backend.state_url`` (no claim):
the model and the report come back from the URL, and an ``Input[Dataset]`` is staged there
for the job's pods. Runs against the test API server, the Job controller and the kubelet
stand-ins (``tests/operators/_k8s.py``); every pod's command is a real process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("kfp")

from kfp.dsl import HTML, Artifact, Dataset, Markdown, Metrics, Model

ROOT = Path(__file__).resolve().parents[2]
_OPS = str(ROOT / "tests" / "operators")
if (
    _OPS not in sys.path
):  # appended: `from conftest import ...` elsewhere must not find its conftest
    sys.path.append(_OPS)

from _k8s import NAMESPACE, SLACK, cluster  # noqa: E402

from dlrover_rm.components.plan.component import dlrover_plan  # noqa: E402
from dlrover_rm.components.train.component import dlrover_train  # noqa: E402

SPEC_YAML = (ROOT / "pipelines" / "specs" / "small.yaml").read_text()


def _art(cls: type, tmp: Path, name: str) -> Artifact:
    return cls(name=name, uri=str(tmp / name))


def _parquet(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dlrover_core.training.data import SyntheticCriteo

    b = SyntheticCriteo(num_dense=13, num_sparse=8, num_rows=rows).rows(0, rows)
    cols: dict = {"label": b.labels.astype(np.int64)}
    ints = np.rint(np.expm1(b.dense.astype(np.float64))).astype(np.int64)
    cols |= {f"I{i + 1}": ints[:, i] for i in range(13)}
    cols |= {f"C{i + 1}": b.sparse[:, i] for i in range(8)}
    pq.write_table(pa.table(cols), path, row_group_size=2000)


class _Downloaded(Dataset):
    """An input as the KFP launcher hands it over: the default store's ``minio://`` URI (no
    fsspec backend reads it) and the launcher's local download at ``path``."""

    def __init__(self, local: Path) -> None:
        super().__init__(name="train", uri="minio://mlpipeline/v2/artifacts/prep/train.parquet")
        self._local = str(local)

    @property
    def path(self) -> str:
        return self._local


def _plan_and_train(tmp: Path, over: list[str], **train: Any) -> tuple[str, Artifact, Artifact]:
    """The plan task, then the train task on its plan (both as KFP runs them, in-process):
    the train task's state, and its ``run`` and ``model`` artifacts."""
    plan = _art(Artifact, tmp, "plan.json")
    dlrover_plan.python_func(
        spec_yaml=SPEC_YAML, plan=plan, reasons=_art(Markdown, tmp, "reasons.md"), overrides=over
    )
    run, model = _art(Artifact, tmp, "run"), _art(Model, tmp, "model")
    out = dlrover_train.python_func(
        spec_yaml=SPEC_YAML, plan=plan, metrics=_art(Metrics, tmp, "metrics"), run=run,
        model=model, summary=_art(Markdown, tmp, "summary"), dashboard=_art(HTML, tmp, "dash"),
        overrides=over, poll_interval=0.5, **train,
    )  # fmt: skip
    return out, run, model


@pytest.mark.slow
def test_train_task_with_a_state_url_gets_the_model_and_stages_the_dataset(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    over = [
        "backend.kind=kubernetes",
        f"backend.namespace={NAMESPACE}",
        "backend.image=registry.example/dlrover-rm:test",
        f"backend.state_url=file://{state}",
        *SLACK,
        "data.eval_rows=1000",
    ]
    # the upstream step's Dataset: the launcher's local copy (its URI would be minio://...)
    _parquet(tmp_path / "train.parquet", 9000)
    data = _Downloaded(tmp_path / "train.parquet")
    with cluster(tmp_path / "k8s") as c:
        assert c.kubelet is not None
        out, run, model = _plan_and_train(tmp_path, over, dataset=data, run_id="run-1")
        live, procs = c.live_pods(), dict(c.kubelet.procs)
        pods = {p["metadata"]["name"]: p for p in c.pods()}
        root = c.kubelet.root
    assert out == "succeeded"
    report = json.loads((Path(run.path) / "report.json").read_text())
    job = report["job"]
    assert job.startswith("small-") and report["state"] == "succeeded"
    assert report["run_url"] == f"file://{state}/runs/{job}"
    assert report["model_url"] == f"file://{state}/runs/{job}/model"
    # the model came back from the URL, and it is the model that was scored
    card = json.loads((Path(model.path) / "model_card.json").read_text())
    assert abs(card["held_out"]["auc"] - report["auc"]) < 0.005
    assert model.metadata["held_out_auc"] == card["held_out"]["auc"]
    assert (Path(run.path) / "report.png").stat().st_size > 1000
    # what the URL holds: model, report, and each PS's final checkpoint (pushed on exit)
    at = state / "runs" / job
    assert (at / "model" / "model.pt").is_file() and (at / "report.png").is_file()
    assert json.loads((at / "report.json").read_text())["model_url"] == report["model_url"]
    manifests = sorted(at.glob("ps/gen-*/ps-*/ckpt-*.json"))
    assert manifests, sorted(str(p) for p in at.rglob("*"))
    # the dataset was staged at the URL and read from there, all of it
    staged = state / "datasets" / job / "train.parquet"
    assert staged.is_file()
    spec = yaml.safe_load((at / "spec.json").read_text())
    assert spec["data"]["path"] == f"file://{staged}" and spec["data"]["source"] == "parquet"
    assert report["data"]["records"] == 8000 and report["samples_done"] == 8000
    # nothing went through a shared folder: each PS wrote its own scratch run directory
    ps_dirs = sorted((root / "pods").glob(f"{job}-ps-*"))
    assert ps_dirs, sorted(p.name for p in (root / "pods").iterdir())
    for d in ps_dirs:
        assert list((d / "state" / "runs" / job / "ps").glob("gen-*/ps-*/ckpt-*.json")), d
    (master,) = [
        n for n, p in pods.items() if p["metadata"]["labels"].get("dlrover-rm/role") == "master"
    ]
    assert not list((root / "pods" / master / "state").glob(f"runs/{job}/ps/gen-*/ps-*/.lock"))
    assert live == [] and procs == {}, (live, procs)


@pytest.mark.slow
def test_train_task_stages_the_dataset_on_the_claim_it_mounts(tmp_path: Path) -> None:
    """With the state claim mounted in the task (as the k8s pipeline does), the dataset is
    staged on it and every pod reads it there. Here the claim's mount path is the stand-in
    kubelet's folder for that claim, so the task and the pods see one path, as on a cluster."""
    claim = tmp_path / "k8s" / "node" / "pvc" / "dlrover-rm-state"
    claim.mkdir(parents=True)  # the task's mount of the claim
    over = [
        "backend.kind=kubernetes",
        f"backend.namespace={NAMESPACE}",
        "backend.image=registry.example/dlrover-rm:test",
        f"backend.state_mount_path={claim}",
        *SLACK,
        "data.eval_rows=1000",
    ]
    _parquet(tmp_path / "train.parquet", 9000)
    with cluster(tmp_path / "k8s") as c:
        assert c.kubelet is not None and c.kubelet.root == tmp_path / "k8s" / "node"
        out, run, model = _plan_and_train(
            tmp_path,
            over,
            dataset=_Downloaded(tmp_path / "train.parquet"),
            state_pvc="dlrover-rm-state",
            run_id="run-2",
        )
        live = c.live_pods()
    assert out == "succeeded"
    report = json.loads((Path(run.path) / "report.json").read_text())
    job = report["job"]
    staged = claim / "datasets" / job / "train.parquet"
    assert staged.is_file()
    spec = yaml.safe_load((claim / "runs" / job / "spec.json").read_text())
    assert spec["data"]["path"] == str(staged)
    assert report["data"]["records"] == 8000 and report["samples_done"] == 8000
    assert "run_url" not in report  # the claim holds the run: nothing went to a URL
    card = json.loads((Path(model.path) / "model_card.json").read_text())
    assert abs(card["held_out"]["auc"] - report["auc"]) < 0.005
    assert live == []


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill", "oom"])
def test_a_killed_ps_is_relaunched_from_its_checkpoint_at_the_url(
    tmp_path: Path, fault: str
) -> None:
    """No claim: the PS pushes its checkpoints to the URL while it runs. SIGKILLed (a lost
    node: no final checkpoint), its next incarnation, in a fresh pod with an empty scratch
    folder, restores its own checkpoint pulled from the URL. OOM-killed (the only PS, its
    load balanced: the PS-OOM rule wants more PS), the set grows without asking the dead PS
    anything: the new PS re-shard its latest checkpoint from the URL and the shards done
    after its tag are trained again (this once hung: the master kept asking the dead PS to
    freeze). Either way the job succeeds exactly once, the model at the URL."""
    import os
    import signal
    import threading
    import time

    from dlrover_core import api

    state = tmp_path / "state"
    state.mkdir()
    over = [
        "backend.kind=kubernetes",
        f"backend.namespace={NAMESPACE}",
        "backend.image=registry.example/dlrover-rm:test",
        f"backend.state_url=file://{state}",
        "pacing.heartbeat_interval_s=1",  # the PS checkpoints (and pushes) every 4 s
        *SLACK,
        "data.rows=400000",
        "data.eval_rows=1000",
        # DLRover's 1 + 1 at quota/5 leaves the quota room for a second PS, which the
        # PS-OOM rule then adds (the prior-optimal start takes the 2 CPU at once)
        "planner.cold_start=dlrover",
    ]
    spec = yaml.safe_load(SPEC_YAML)
    with cluster(tmp_path / "k8s") as c:
        assert c.kubelet is not None
        kl = c.kubelet
        killed: list[str] = []

        def killer() -> None:
            remote = state / "runs" / "small" / "ps"
            deadline = time.monotonic() + 400
            while time.monotonic() < deadline and not killed:
                # a periodic push after the first shards: a second checkpoint at the URL
                if len(list(remote.glob("gen-*/ps-0/ckpt-*.json"))) >= 2:
                    for p in c.pods():
                        n = p["metadata"]["name"]
                        if not n.startswith("small-ps-0-0"):
                            continue
                        if fault == "oom" and kl.oom_kill(n):  # the pod ends OOMKilled
                            killed.append(n)
                            return
                        pid = kl.pid_of(n) if fault == "kill" else None
                        if pid is not None:  # a node lost (SIGKILL), not an OOM
                            os.killpg(pid, signal.SIGKILL)
                            killed.append(n)
                            return
                time.sleep(0.2)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        report = api.submit_and_follow(spec, overrides=over, poll_interval=0.5)
        t.join(timeout=5)
        logs = {p.stem: p.read_text() for p in (kl.root / "logs").glob("small-ps-0-*.log")}
        live = c.live_pods()
    assert killed, "the PS was never killed (no periodic checkpoint reached the URL)"
    assert report["state"] == "succeeded", report.get("failure")
    assert report["model_url"] == f"file://{state}/runs/small/model"
    assert (state / "runs" / "small" / "model" / "model_card.json").is_file()
    assert report["shards_completed_twice"] == 0 and report["shards_lost"] == 0
    relaunched = [text for name, text in logs.items() if name.startswith("small-ps-0-1")]
    assert relaunched, sorted(logs)
    assert "restored (empty" not in relaunched[0]
    pod = tmp_path / "k8s" / "node" / "pods" / "small-ps-0-1"
    if fault == "kill":  # its own checkpoint, in its own (fresh) scratch folder: from the URL
        assert f"restored (own:{pod}/" in relaunched[0], relaunched[0][-2000:]
    else:  # a new generation of 2, re-sharded from the dead PS's checkpoint (from the URL)
        assert f"restored (reshard:{pod}/" in relaunched[0], relaunched[0][-2000:]
        assert "PS 0/2" in relaunched[0]
    assert live == []
