"""Real processes through KubernetesBackend + the test API server + the kubelet stand-in: the
backend creates pods, the stand-in runs their commands as local processes and writes their
status back, and the backend reads the exits from the pods."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from apiserver import ApiServerThread
from conftest import NAMESPACE
from kubelet import KubeletStandIn
from kubernetes import client as k8s

from dlrover_core.faults.classify import ExitClass
from dlrover_core.runtime.backends.base import NodeExit, NodeSpec
from dlrover_core.runtime.backends.kubernetes import KubernetesBackend, OwnerRef
from dlrover_core.types import NodeResources, Role

MakeBackend = Callable[..., KubernetesBackend]
PY = sys.executable


def _py(
    code: str,
    role: Role = Role.WORKER,
    node_id: int = 0,
    incarnation: int = 0,
    resources: NodeResources = NodeResources(500, 512),
) -> NodeSpec:
    return NodeSpec(role, node_id, incarnation, resources, [PY, "-c", code])


def _wait_exits(b: KubernetesBackend, n: int, timeout_s: float = 60.0) -> dict[str, NodeExit]:
    got: dict[str, NodeExit] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        for e in b.poll():
            assert e.ref not in got, f"{e.ref} reported twice"
            got[e.ref] = e
        time.sleep(0.05)
    assert len(got) == n, f"saw {sorted(got)} of {n} exits"
    return got


def _until(pred: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_processes_run_with_the_pod_env_and_share_the_state_volume(
    make_backend: MakeBackend, kubelet: KubeletStandIn
) -> None:
    b = make_backend(state_pvc="ctr-job-state")
    write = _py(
        "import json, os\n"
        "d = os.environ['DLROVER_RM_STATE_DIR']\n"
        "keys = ['DLROVER_RM_ROLE', 'DLROVER_RM_NODE_ID', 'DLROVER_RM_BIND_HOST',\n"
        "        'DLROVER_RM_ADVERTISE_HOST', 'DLROVER_RM_POD_NAME', 'OMP_NUM_THREADS']\n"
        "json.dump({k: os.environ[k] for k in keys}, open(d + '/ckpt.json', 'w'))\n",
        role=Role.PS,
    )
    h = b.launch(write)
    assert _wait_exits(b, 1)[h.ref].exit_class is ExitClass.SUCCEEDED
    # a new pod (another "machine") reads what the first one left on the volume
    read = _py(
        "import json, os, sys\n"
        "c = json.load(open(os.environ['DLROVER_RM_STATE_DIR'] + '/ckpt.json'))\n"
        "sys.exit(0 if c['DLROVER_RM_ROLE'] == 'ps' else 5)\n",
        role=Role.PS,
        incarnation=1,
    )
    h2 = b.launch(read)
    assert _wait_exits(b, 1)[h2.ref].exit_code == 0
    env = json.loads((kubelet.root / "pvc" / "ctr-job-state" / "ckpt.json").read_text())
    assert env == {
        "DLROVER_RM_ROLE": "ps",
        "DLROVER_RM_NODE_ID": "0",
        "DLROVER_RM_BIND_HOST": "0.0.0.0",
        "DLROVER_RM_ADVERTISE_HOST": "127.0.0.1",  # downward API status.podIP
        "DLROVER_RM_POD_NAME": h.ref,
        "OMP_NUM_THREADS": "1",
    }


def test_code_error_oom_and_delete(make_backend: MakeBackend, kubelet: KubeletStandIn) -> None:
    b = make_backend()
    crash = b.launch(_py("raise SystemExit(1)", node_id=0))
    oom = b.launch(
        _py(
            "import time\nx = bytearray(300 << 20)\ntime.sleep(60)",
            role=Role.PS,
            resources=NodeResources(500, 100),
        )
    )
    sleeper = b.launch(_py("import time; time.sleep(120)", node_id=1))
    _until(lambda: kubelet.pid_of(sleeper.ref))
    b.stop(sleeper, grace_s=5, wait=False)
    got = _wait_exits(b, 3)
    assert got[crash.ref].exit_class is ExitClass.FATAL and got[crash.ref].exit_code == 1
    assert got[oom.ref].exit_class is ExitClass.OOM and got[oom.ref].reason == "OOMKilled"
    assert got[oom.ref].exit_code == 137
    e = got[sleeper.ref]
    assert e.requested and e.exit_class is ExitClass.KILLED
    assert e.exit_code == 143 and e.signal == 15  # SIGTERM ended it within the grace


@pytest.mark.slow  # over 3 s here: the full tier (make test-all)
def test_delete_escalates_to_sigkill_after_the_grace(
    make_backend: MakeBackend, kubelet: KubeletStandIn
) -> None:
    b = make_backend()
    stubborn = b.launch(
        _py(
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "open('ready', 'w').close()\ntime.sleep(120)"
        )
    )
    _until(lambda: (kubelet.root / "ready").exists())
    t0 = time.monotonic()
    b.stop(stubborn, grace_s=2)  # waits for the exit
    took = time.monotonic() - t0
    (e,) = b.poll()
    # the stand-in's own record: the process ignored SIGTERM and was SIGKILLed after the grace
    assert kubelet.exits[stubborn.ref] == 137
    assert took >= 2.0  # not before the grace
    assert kubelet.pid_of(stubborn.ref) is None
    assert e.requested
    # the backend saw either the terminal status (137, SIGKILL) or, when the force-delete beat
    # the watch to it, the pod vanish after our own delete (as on a real cluster): both requested
    assert (e.exit_code, e.signal) in ((137, 9), (None, 15))


def test_bad_image_is_fatal_and_unschedulable_is_pending(
    make_backend: MakeBackend, apiserver: ApiServerThread, tmp_path: Path
) -> None:
    with KubeletStandIn(
        apiserver.client(),
        NAMESPACE,
        tmp_path / "small",
        capacity=NodeResources(2000, 4096),
        bad_images=frozenset({"registry.example/typo:1"}),
    ):
        bad = make_backend(image="registry.example/typo:1", job_name="badimg")
        h = bad.launch(_py("print('never')"))
        e = _wait_exits(bad, 1)[h.ref]
        assert e.reason == "ImagePullBackOff" and e.exit_class is ExitClass.FATAL
        b = make_backend()
        big = b.launch(_py("print(1)", resources=NodeResources(8000, 1024)))
        _until(lambda: b.pending_since(big) is not None)
        assert b.alive(big) and b.poll() == []
        b.stop(big, grace_s=1)  # the pending rule's action: relaunch smaller
        small = b.launch(_py("print(1)", incarnation=1, resources=NodeResources(1000, 1024)))
        got = _wait_exits(b, 2)
        assert got[big.ref].requested
        assert got[small.ref].exit_class is ExitClass.SUCCEEDED


def test_resize_in_place_reaches_the_running_process(
    make_backend: MakeBackend, kubelet: KubeletStandIn, apiserver: ApiServerThread
) -> None:
    b = make_backend()
    h = b.launch(_py("import time; time.sleep(120)", resources=NodeResources(1000, 512)))
    pid = _until(lambda: kubelet.pid_of(h.ref))
    assert b.resize(h, NodeResources(2000, 512))

    def applied() -> bool:
        pod = next(p for p in apiserver.api.objects_of("pods") if p["metadata"]["name"] == h.ref)
        cs = (pod.get("status") or {}).get("containerStatuses") or [{}]
        return ((cs[0].get("resources") or {}).get("limits") or {}).get("cpu") == "2"

    _until(applied)
    assert kubelet.pid_of(h.ref) == pid  # same process: no restart
    if len(os.sched_getaffinity(0)) >= 2:
        assert len(psutil.Process(pid).cpu_affinity()) == 2
    b.kill(h)


@pytest.mark.slow  # over 3 s here: the full tier (make test-all)
def test_usage_and_adoption_after_a_master_restart(
    make_backend: MakeBackend, kubelet: KubeletStandIn
) -> None:
    first = make_backend()
    h = first.launch(_py("import time\nx = bytearray(60 << 20)\nwhile True: pass", role=Role.PS))
    _until(lambda: first.usage(h) is not None and first.usage(h).cpu_percent > 20, 30)
    u = first.usage(h)
    assert u is not None and u.rss_mib >= 60
    first._stopping.set()  # the master process dies; its pods run on
    second = make_backend()
    adopted = second.adopt(Role.PS, 0, 0, h.ref)
    assert adopted is not None
    pid = kubelet.pid_of(h.ref)
    assert pid is not None
    os.kill(pid, 9)  # the node crashes under the new master
    e = _wait_exits(second, 1)[h.ref]
    assert e.exit_code == 137 and not e.requested and e.exit_class is ExitClass.KILLED


def test_nothing_outlives_the_master_pod(
    make_backend: MakeBackend, kubelet: KubeletStandIn, apiserver: ApiServerThread
) -> None:
    core = k8s.CoreV1Api(apiserver.client())
    master = core.create_namespaced_pod(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "ctr-job-master-0"},
            "spec": {
                "containers": [
                    {
                        "name": "master",
                        "image": "img",
                        "command": [PY, "-c", "import time; time.sleep(120)"],
                    }
                ]
            },
        },
    )
    b = make_backend(owner=OwnerRef(name=master.metadata.name, uid=master.metadata.uid))
    nodes = [b.launch(_py("import time; time.sleep(120)", node_id=i)) for i in range(2)]
    pids = [_until(lambda n=n: kubelet.pid_of(n.ref)) for n in nodes]
    b._stopping.set()
    core.delete_namespaced_pod("ctr-job-master-0", NAMESPACE, grace_period_seconds=0)
    for pid in pids:
        _until(
            lambda pid=pid: (
                not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            )
        )
    assert not [p for p in apiserver.api.objects_of("pods", NAMESPACE)]


def test_an_infeasible_resize_is_reported_by_the_backend(
    make_backend: MakeBackend, kubelet: KubeletStandIn
) -> None:
    """More CPU than the node has: the API accepts the resize, the kubelet cannot give it
    (``PodResizePending``/``Infeasible``), and the backend says so for the controller."""
    b = make_backend()
    h = b.launch(_py("import time; time.sleep(120)", resources=NodeResources(1000, 512)))
    _until(lambda: kubelet.pid_of(h.ref))
    assert b.resize_state(h) is None
    assert b.resize(h, NodeResources(kubelet.capacity.cpu_millicores + 1000, 512))
    _until(lambda: b.resize_state(h) == "infeasible")
    b.kill(h)
