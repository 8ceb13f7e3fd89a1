"""`dlrover-rm submit` as documented, end to end on the Kubernetes stand-in (the test API
server, the Job controller and kubelet stand-ins; real master and node processes), issue 36
item 3: every way of giving the job its durable state (a named claim, submit's default claim,
a state URL) trains; a master that cannot start (an image that cannot be pulled, a master
that refuses its input) is reported failed with its reason within a minute, by `status --job`
and by `submit --wait`, and the Job is not left retrying."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrover_core import api
from tests.operators._k8s import NAMESPACE, SLACK, SPEC, cluster, until

pytestmark = pytest.mark.slow
BASE = [
    "backend.kind=kubernetes",
    f"backend.namespace={NAMESPACE}",
    "backend.image=registry.example/dlrover-rm:test",
    "data.rows=12000",
    "data.eval_rows=2000",
    *SLACK,
]
BAD_IMAGE = "registry.example/dlrover-rm:missing"


@pytest.mark.timeout(1200)
def test_every_documented_state_variant_trains(tmp_path: Path) -> None:
    variants = {
        "named": ["backend.state_pvc=dlrover-rm-state"],
        "default": [],  # submit creates <job>-state and tells the master
        "url": [f"backend.state_url=file://{tmp_path / 'state'}"],
    }
    (tmp_path / "state").mkdir()
    with cluster(tmp_path / "k8s") as c:
        for v, extra in variants.items():
            job = f"small-{v}"
            res = api.submit(SPEC, overrides=[*BASE, *extra, f"name={job}"])
            if v == "default":
                assert f"PersistentVolumeClaim/{job}-state" in res["created"], res
            ev = api.follow(job, NAMESPACE, poll_interval=0.5, start_timeout=300)
            assert ev["status"] == "succeeded", (v, ev["message"])
            assert ev["report"]["state"] == "succeeded" and ev["report"]["samples_done"] == 12000
        assert c.live_pods() == [], c.live_pods()


@pytest.mark.timeout(600)
def test_a_master_that_cannot_start_is_failed_within_a_minute(tmp_path: Path) -> None:
    with cluster(tmp_path / "k8s") as c:
        assert c.kubelet is not None
        c.kubelet.bad_images = frozenset({BAD_IMAGE})
        # status --job: the image that cannot be pulled, named
        api.submit(SPEC, overrides=[*BASE, f"backend.image={BAD_IMAGE}", "name=bad-image"])
        t0 = time.monotonic()
        st = until(
            lambda: (s := api.job_status("bad-image", NAMESPACE))["state"] == "failed" and s,
            60,
            "status --job to say failed",
        )
        assert "ImagePullBackOff" in st["problem"], st
        print(f"image pull error -> failed status in {time.monotonic() - t0:.1f} s")
        api.cancel("bad-image", NAMESPACE)
        # submit --wait: a master that refuses its input (an unreachable history store: it
        # would refuse again on every retry) ends the command with its reason, and the Job
        # is cancelled rather than left retrying
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "dlrover_core.cli", "submit", "--spec", SPEC, "--wait",
             "--poll-interval", "0.5",
             *[a for o in [*BASE, "name=refuses", "history.url=postgresql://u:p@127.0.0.1:1/x"]
               for a in ("--set", o)]],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        took = time.monotonic() - t0
        print(f"refusing master -> submit --wait exit {r.returncode} in {took:.1f} s")
        assert r.returncode == 1, r.stderr[-3000:]
        out = json.loads(r.stdout)
        assert out["state"] == "failed" and "refused its input" in out["message"], out
        assert "history store" in out["message"], out["message"]
        assert took < 60, took
        # nothing retries it: the Job failed at once (the master's pod failure policy does not
        # retry exit 2), or submit --wait cancelled it when it saw the refusal first
        jobs = c.job_objects()
        if jobs:
            st = api.job_status("refuses", NAMESPACE)
            assert st["state"] == "failed" and st["master"]["failed_pods"] == 1, st
        else:
            assert "job was cancelled" in out["message"], out["message"]
        until(lambda: not c.live_pods(), 30, "no pod left")
