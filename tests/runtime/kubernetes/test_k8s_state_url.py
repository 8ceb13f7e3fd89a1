"""``backend.state_url`` without a claim: the key mapping, the copies to and from an fsspec
URL (``file://`` here: ``memory://`` is not shared between processes), the dataset staging of
the KFP train task, and what the pods are given."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlrover_core.errors import InputError
from dlrover_core.runtime import state_url as su
from dlrover_core.runtime.backends import kubernetes_pods as kp
from dlrover_core.runtime.backends.manifests import MasterConfig, master_job


@pytest.mark.parametrize(
    ("path", "mount", "key"),
    [
        ("/var/lib/dlrover-rm/runs/j", "/var/lib/dlrover-rm", "runs/j"),
        (
            "/var/lib/dlrover-rm/runs/j/ps/gen-1/ps-0",
            "/var/lib/dlrover-rm/",
            "runs/j/ps/gen-1/ps-0",
        ),
        ("/var/lib/dlrover-rm", "/var/lib/dlrover-rm", ""),
        ("/var/lib/dlrover-rmx/runs/j", "/var/lib/dlrover-rm", None),
        ("/tmp/runs/j", "/var/lib/dlrover-rm", None),
    ],
)
def test_state_key(path: str, mount: str, key: str | None) -> None:
    assert su.state_key(path, mount) == key


def test_join_and_env() -> None:
    assert su.join("s3://b/p/", "runs/j") == "s3://b/p/runs/j"
    assert su.join("file:///x", "") == "file:///x"
    assert su.url_from_env({su.ENV_STATE_URL: "s3://b"}) == "s3://b"
    assert su.url_from_env({su.ENV_STATE_URL: "s3://b", su.ENV_STATE_DIR: "/s"}) is None
    assert su.url_from_env({}) is None
    # the names the pods are given (kubernetes_pods) are the names read here
    assert (su.ENV_STATE_URL, su.ENV_STATE_DIR, su.ENV_STATE_MOUNT, su.ENV_TOKEN) == (
        kp.ENV_STATE_URL,
        kp.ENV_STATE_DIR,
        kp.ENV_STATE_MOUNT,
        kp.ENV_TOKEN,
    )


def test_push_and_pull_a_tree_through_a_file_url(tmp_path: Path) -> None:
    src = tmp_path / "ps-0"
    (src / "sub").mkdir(parents=True)
    (src / "ckpt-00000001.npz").write_bytes(b"\0" * 100)
    (src / "ckpt-00000001.json").write_text("{}")
    (src / "sub" / "x.bin").write_bytes(b"x")
    (src / ".lock").write_text("")  # a lock and a temporary are not durable
    (src / ".ckpt-00000002.npz.7.tmp").write_bytes(b"partial")
    url = f"file://{tmp_path}/store/runs/j/ps/gen-1/ps-0"
    assert su.push_tree(src, url) == 3
    stored = sorted(
        p.relative_to(tmp_path / "store").as_posix()
        for p in (tmp_path / "store").rglob("*")
        if p.is_file()
    )
    assert stored == [
        "runs/j/ps/gen-1/ps-0/ckpt-00000001.json",
        "runs/j/ps/gen-1/ps-0/ckpt-00000001.npz",
        "runs/j/ps/gen-1/ps-0/sub/x.bin",
    ]
    back = tmp_path / "back"
    assert su.pull_tree(url, back) == 3
    assert (back / "ckpt-00000001.npz").read_bytes() == b"\0" * 100
    assert (back / "sub" / "x.bin").read_bytes() == b"x"
    assert su.pull_tree(f"file://{tmp_path}/nothing", tmp_path / "n") == 0
    assert su.push_tree(tmp_path / "absent", url) == 0
    assert su.pull_file(su.join(url, "ckpt-00000001.json"), tmp_path / "one.json")
    assert not su.pull_file(su.join(url, "nope.json"), tmp_path / "two.json")


def test_a_url_no_backend_reads_is_one_line() -> None:
    with pytest.raises(InputError, match=r"backend.state_url 'nope://x'.*install its fsspec"):
        su.push_files("/", ["x"], "nope://x")


def test_token_from_the_secret_is_written_once_owner_only(tmp_path: Path) -> None:
    su.write_token(tmp_path / "rd", "a" * 64)
    su.write_token(tmp_path / "rd", "b" * 64)  # already there: kept
    p = tmp_path / "rd" / "token"
    assert p.read_text() == "a" * 64 and (p.stat().st_mode & 0o777) == 0o600


def _backend(**kw: object) -> SimpleNamespace:
    base: dict[str, object] = {"state_url": None, "state_pvc": None, "state_mount_path": "/nope"}
    base.update(kw)
    return SimpleNamespace(**base)


def test_stage_a_dataset_file_and_folder(tmp_path: Path) -> None:
    f = tmp_path / "train.parquet"
    f.write_bytes(b"PAR1")
    d = tmp_path / "shards"
    d.mkdir()
    (d / "a.parquet").write_bytes(b"a")
    (d / "b.parquet").write_bytes(b"b")
    store = tmp_path / "store"
    b = _backend(state_url=f"file://{store}")
    assert su.stage_dataset(f, b, "j-1") == f"file://{store}/datasets/j-1/train.parquet"
    assert (store / "datasets/j-1/train.parquet").read_bytes() == b"PAR1"
    assert su.stage_dataset(d, b, "j-1") == f"file://{store}/datasets/j-1/shards"
    assert sorted(p.name for p in (store / "datasets/j-1/shards").iterdir()) == [
        "a.parquet",
        "b.parquet",
    ]
    # the claim mounted in this task at the path the pods mount it
    mount = tmp_path / "claim"
    mount.mkdir()
    c = _backend(state_pvc="dlrover-rm-state", state_mount_path=str(mount))
    assert su.stage_dataset(f, c, "j-2") == str(mount / "datasets/j-2/train.parquet")
    assert su.stage_dataset(d, c, "j-2") == str(mount / "datasets/j-2/shards")
    assert su.stage_dataset(d, c, "j-2") == str(mount / "datasets/j-2/shards")  # a retry
    assert not [p for p in (mount / "datasets/j-2").iterdir() if p.name.startswith(".")]
    # neither: one line saying what to mount
    with pytest.raises(InputError, match=r"mount claim dlrover-rm-state in this task at /nope"):
        su.stage_dataset(f, _backend(state_pvc="dlrover-rm-state"), "j")
    with pytest.raises(InputError, match="does not exist here"):
        su.stage_dataset(tmp_path / "absent", b, "j")


def test_the_master_pod_is_told_its_scratch_mount() -> None:
    cfg = MasterConfig(job_name="j", namespace="ns", image="i", spec_yaml="{}", state_url="s3://b")
    (c,) = master_job(cfg)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[kp.ENV_STATE_URL] == "s3://b" and env[kp.ENV_STATE_MOUNT] == "/var/lib/dlrover-rm"
    assert kp.ENV_STATE_DIR not in env
    with_claim = MasterConfig(
        job_name="j", namespace="ns", image="i", spec_yaml="{}", state_pvc="c", state_url="s3://b"
    )
    (c,) = master_job(with_claim)["spec"]["template"]["spec"]["containers"]
    assert kp.ENV_STATE_MOUNT not in {e["name"] for e in c["env"]}


def test_job_state_url_of(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from dlrover_core.runtime.job import state_url_of
    from dlrover_core.spec import parse_spec

    spec = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "pipelines/specs/small.yaml").read_text()
    )
    spec["backend"] = {"kind": "kubernetes", "namespace": "ns", "state_url": "s3://b/p"}
    js = parse_spec(spec)
    monkeypatch.delenv(su.ENV_STATE_MOUNT, raising=False)
    assert state_url_of(js, Path("/var/lib/dlrover-rm/runs/small")) == "s3://b/p/runs/small"
    assert state_url_of(js, Path("/elsewhere")) == "s3://b/p/runs/small"
    monkeypatch.setenv(su.ENV_STATE_MOUNT, "/scratch")
    assert state_url_of(js, Path("/scratch/runs/x")) == "s3://b/p/runs/x"
    spec["backend"]["state_pvc"] = "c"
    assert state_url_of(parse_spec(spec), Path("/var/lib/dlrover-rm/runs/small")) is None
    del spec["backend"]
    assert state_url_of(parse_spec(spec), Path("/x")) is None
    assert os.environ.get(su.ENV_STATE_MOUNT) == "/scratch"


def test_a_model_that_cannot_reach_the_url_is_reported_not_lost(tmp_path: Path) -> None:
    from dlrover_core.runtime.job import _publish

    rd = tmp_path / "rd"
    (rd / "model").mkdir(parents=True)
    (rd / "model" / "model.pt").write_bytes(b"m")
    (rd / "report.json").write_text('{"state": "succeeded"}')
    blocker = tmp_path / "file"
    blocker.write_text("")  # a URL under a regular file cannot be written
    url = f"file://{blocker}/runs/j"
    report = {"state": "succeeded", "model_url": f"{url}/model"}
    _publish(rd, report, url, rd / "model")
    assert report["model_url"] is None
    assert report["export_error"].startswith(f"the model and report could not be written to {url}")
    import json

    assert json.loads((rd / "report.json").read_text())["model_url"] is None
    ok = {"state": "succeeded", "model_url": f"file://{tmp_path}/s/model"}
    _publish(rd, ok, f"file://{tmp_path}/s", rd / "model")
    assert (tmp_path / "s" / "model" / "model.pt").read_bytes() == b"m"
    assert (tmp_path / "s" / "report.json").is_file() and "export_error" not in ok


def test_a_ps_node_pulls_its_state_runs_pushes_periodically_and_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dlrover-rm node ps`` with a state URL and no volume: the token from the Secret's env,
    spec.json and its own earlier checkpoint from the URL before the PS starts; its directory
    pushed while it runs (every --checkpoint-every-s) and mirrored at exit (pruned ones go)."""
    import time

    from dlrover_core.runtime import node

    mount, store = tmp_path / "scratch", tmp_path / "store"
    remote_rd = store / "runs" / "j"
    (remote_rd / "ps" / "gen-1" / "ps-0").mkdir(parents=True)
    (remote_rd / "spec.json").write_text('{"name": "j"}')
    (remote_rd / "ps" / "gen-1" / "ps-0" / "ckpt-00000001.npz").write_bytes(b"old")
    (remote_rd / "ps" / "gen-1" / "ps-0" / "ckpt-00000001.json").write_text("{}")
    monkeypatch.setenv(su.ENV_STATE_URL, f"file://{store}")
    monkeypatch.setenv(su.ENV_STATE_MOUNT, str(mount))
    monkeypatch.setenv(su.ENV_TOKEN, "t" * 64)
    monkeypatch.delenv(su.ENV_STATE_DIR, raising=False)
    rd = mount / "runs" / "j"
    own = rd / "ps" / "gen-1" / "ps-0"
    seen: dict[str, object] = {}

    def fake_ps(role: str, rest: list[str]) -> int:
        seen["token"] = (rd / "token").read_text()
        seen["spec"] = (rd / "spec.json").read_text()
        seen["restored"] = (own / "ckpt-00000001.npz").read_bytes()
        (own / "ckpt-00000002.npz").write_bytes(b"new")
        (own / "ckpt-00000002.json").write_text("{}")
        remote = remote_rd / "ps" / "gen-1" / "ps-0" / "ckpt-00000002.json"
        deadline = time.monotonic() + 20
        while not remote.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["pushed_while_running"] = remote.exists()
        for f in own.glob("ckpt-00000001.*"):  # pruned (checkpoint.KEEP)
            f.unlink()
        return 0

    monkeypatch.setattr(node, "_run", fake_ps)
    argv = ["ps", "--run-dir", str(rd), "--index", "0", "--num-ps", "1"]
    argv += ["--ckpt-dir", str(own), "--checkpoint-every-s", "0.2"]
    assert node.main(argv) == 0
    assert seen == {
        "token": "t" * 64,
        "spec": '{"name": "j"}',
        "restored": b"old",
        "pushed_while_running": True,
    }
    left = sorted(p.name for p in (remote_rd / "ps" / "gen-1" / "ps-0").iterdir())
    assert left == ["ckpt-00000002.json", "ckpt-00000002.npz"]
    # a run directory outside the scratch mount cannot be found: one line, exit 1
    assert node.main(["worker", "--run-dir", "/elsewhere/runs/j"]) == 1
