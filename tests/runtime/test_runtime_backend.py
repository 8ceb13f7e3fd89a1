"""LocalBackend with real processes: stop, kill, the enforced memory limit (OOM), group kills,
CPU threads and affinity, exit codes, and adopting a node after its master died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dlrover_core.faults.classify import ExitClass, classify_exit
from dlrover_core.runtime.backends.base import (
    ENV_NODE_ID,
    LOST_REASON,
    OOM_REASON,
    Backend,
    NodeExit,
    NodeHandle,
    NodeSpec,
)
from dlrover_core.runtime.backends.local import LocalBackend, UnknownNodeError
from dlrover_core.types import NodeResources, Role

ROOT = Path(__file__).resolve().parents[2]
SLEEP = "import time; time.sleep(60)"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")


@pytest.fixture
def backend() -> Iterator[LocalBackend]:
    b = LocalBackend(poll_interval_s=0.05)
    yield b
    b.shutdown(grace_s=1.0)


def _spec(
    code: str,
    *,
    node_id: int = 0,
    incarnation: int = 0,
    role: Role = Role.WORKER,
    cpu_millicores: int = 1000,
    memory_mib: int = 0,
    log: Path | None = None,
) -> NodeSpec:
    return NodeSpec(
        role=role,
        node_id=node_id,
        incarnation=incarnation,
        resources=NodeResources(cpu_millicores, memory_mib),
        argv=[sys.executable, "-c", code],
        env={"PYTHONPATH": str(ROOT)},
        log_path=str(log) if log else None,
    )


def _wait_exits(b: LocalBackend, n: int, timeout_s: float = 5.0) -> list[NodeExit]:
    deadline = time.monotonic() + timeout_s
    exits: list[NodeExit] = []
    while time.monotonic() < deadline and len(exits) < n:
        exits += b.poll()
        time.sleep(0.02)
    assert len(exits) == n, f"expected {n} exits within {timeout_s} s, got {exits}"
    return exits


def _wait_exit(b: LocalBackend, timeout_s: float = 5.0) -> NodeExit:
    return _wait_exits(b, 1, timeout_s)[0]


def _wait_file(path: Path, timeout_s: float = 5.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} not written within {timeout_s} s")


def _gone(pid: int, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_protocol_conformance() -> None:
    assert isinstance(LocalBackend(), Backend)
    assert NodeResources(1500, 0).threads == 1  # rounded down: no throttled second thread
    assert NodeResources(2000, 0).threads == 2
    assert NodeResources(200, 0).threads == 1


def test_stop_reports_sigterm_once_and_usage(backend: LocalBackend) -> None:
    h = backend.launch(_spec(SLEEP))
    assert h.ref == str(int(h.ref)) and backend.alive(h)
    time.sleep(0.3)
    use = backend.usage(h)
    assert use is not None and use.rss_mib > 1 and use.cpu_percent >= 0
    backend.stop(h, grace_s=2.0)
    assert not backend.alive(h)
    ex = _wait_exit(backend)
    assert (ex.exit_code, ex.signal, ex.reason, ex.requested) == (-15, 15, None, True)
    assert ex.exit_class is ExitClass.KILLED and ex.max_rss_mib and ex.max_rss_mib > 1
    assert backend.poll() == [] and backend.usage(h) is None


def test_stop_escalates_to_sigkill_after_grace(backend: LocalBackend) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    h = backend.launch(_spec(code))
    time.sleep(0.3)  # let it install the handler
    t0 = time.monotonic()
    backend.stop(h, grace_s=0.3)
    assert 0.25 <= time.monotonic() - t0 < 3.0
    ex = _wait_exit(backend)
    assert ex.exit_code == -9 and ex.exit_class is ExitClass.KILLED


def test_kill_takes_the_group_with_it(backend: LocalBackend, tmp_path: Path) -> None:
    out = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time; "
        f"c = subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); "
        f"open({str(out)!r}, 'w').write(f'{{c.pid}}\\n'); time.sleep(60)"
    )
    h = backend.launch(_spec(code))
    child = int(_wait_file(out))
    backend.kill(h)
    ex = _wait_exit(backend)
    assert (ex.exit_code, ex.signal) == (-9, 9)
    assert classify_exit(ex.exit_code, ex.reason, ex.signal) is ExitClass.KILLED
    assert _gone(child)
    with pytest.raises(UnknownNodeError):
        backend.kill(NodeHandle(Role.PS, 9, 0, "1", 0.0))


def test_exit_code_one_is_fatal_and_orphans_are_cleaned(
    backend: LocalBackend, tmp_path: Path
) -> None:
    out = tmp_path / "child.pid"
    code = (
        "import subprocess, sys; "
        f"c = subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); "
        f"open({str(out)!r}, 'w').write(f'{{c.pid}}\\n'); sys.exit(1)"
    )
    backend.launch(_spec(code))
    ex = _wait_exit(backend)
    assert (ex.exit_code, ex.signal, ex.reason, ex.requested) == (1, None, None, False)
    assert ex.exit_class is ExitClass.FATAL
    assert _gone(int(_wait_file(out)))


def test_memory_limit_is_enforced_as_oom(backend: LocalBackend) -> None:
    code = (
        "import time\nheld = []\n"
        "for _ in range(12):\n    held.append(bytearray(40 << 20)); time.sleep(0.05)\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    backend.launch(_spec(code, memory_mib=200))
    ex = _wait_exit(backend, timeout_s=5.0)
    assert time.monotonic() - t0 < 3.0
    assert (ex.exit_code, ex.reason, ex.requested) == (-9, OOM_REASON, False)
    assert classify_exit(ex.exit_code, ex.reason, ex.signal) is ExitClass.OOM
    assert ex.max_rss_mib is not None and 200 < ex.max_rss_mib < 480


def test_threads_and_affinity_follow_cores(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    b = LocalBackend(poll_interval_s=0.05, cpu_count=len(allowed))
    code = (
        "import json, os; print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), "
        "'omp': os.environ['OMP_NUM_THREADS'], 'mkl': os.environ['MKL_NUM_THREADS'], "
        f"'id': os.environ[{ENV_NODE_ID!r}]}}), flush=True)"
    )
    try:
        logs = [tmp_path / f"n{i}.log" for i in range(3)]
        specs = [
            _spec(code, node_id=0, cpu_millicores=1000, log=logs[0]),
            _spec(code, node_id=1, cpu_millicores=600, log=logs[1]),
            _spec(code, node_id=2, cpu_millicores=64000, log=logs[2]),
        ]
        handles = [b.launch(s) for s in specs]
        assert [e.exit_code for e in _wait_exits(b, len(handles))] == [0, 0, 0]
        assert b.poll() == []
        seen = [json.loads(p.read_text().splitlines()[-1]) for p in logs]
    finally:
        b.shutdown(grace_s=1.0)
    assert [s["omp"] for s in seen] == ["1", "1", "64"] and seen[2]["mkl"] == "64"
    assert [s["id"] for s in seen] == ["0", "1", "2"]
    assert seen[2]["cpus"] == allowed  # more cores than the machine: all of them
    if len(allowed) > 1:
        assert len(seen[0]["cpus"]) == 1 and len(seen[1]["cpus"]) == 1
        assert seen[0]["cpus"] != seen[1]["cpus"]  # round-robin
        assert b.cpus_of(handles[0]) == tuple(seen[0]["cpus"])


OLD_MASTER = """
import sys, time
from dlrover_core.runtime.backends.base import NodeSpec
from dlrover_core.runtime.backends.local import LocalBackend
from dlrover_core.types import NodeResources, Role
b = LocalBackend()
flag = sys.argv[1]
long = [sys.executable, "-c", "import time; time.sleep(60)"]
short = [sys.executable, "-c",
         "import os, time\\nwhile not os.path.exists(%r): time.sleep(0.02)" % flag]
refs = [b.launch(NodeSpec(Role.PS, i, 2, NodeResources(500, 300), argv)).ref
        for i, argv in enumerate([long, short])]
print(" ".join(refs), flush=True)
time.sleep(60)
"""


def test_adopt_after_master_death(backend: LocalBackend, tmp_path: Path) -> None:
    flag = tmp_path / "finish"
    old = subprocess.Popen(
        [sys.executable, "-c", OLD_MASTER, str(flag)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    )
    try:
        assert old.stdout is not None
        long_ref, short_ref = old.stdout.readline().split()
    finally:
        old.kill()  # the master dies; its nodes live on in their own sessions
        old.wait()
        if old.stdout is not None:
            old.stdout.close()
    assert backend.adopt(Role.PS, 0, 1, long_ref) is None  # wrong incarnation
    assert backend.adopt(Role.WORKER, 0, 2, long_ref) is None  # wrong role
    assert backend.adopt(Role.PS, 0, 2, str(os.getpid())) is None  # not that node
    assert backend.adopt(Role.PS, 0, 2, "999999999") is None  # no such pid
    assert backend.adopt(Role.PS, 0, 2, long_ref, argv=["python", "other"]) is None
    long_h = backend.adopt(Role.PS, 0, 2, long_ref)
    short_h = backend.adopt(Role.PS, 1, 2, short_ref)
    assert long_h is not None and short_h is not None
    assert backend.alive(long_h) and backend.alive(short_h)
    assert long_h.started_at_s <= time.time()
    use = backend.usage(long_h)
    assert use is not None and use.rss_mib > 1

    flag.write_text("done\n")  # the short node ends by itself: its status is unknown to us
    ex = _wait_exit(backend)
    assert (ex.node_id, ex.exit_code, ex.reason, ex.requested) == (1, None, LOST_REASON, False)
    assert ex.exit_class is ExitClass.UNKNOWN

    backend.kill(long_h)
    ex = _wait_exit(backend)
    assert (ex.node_id, ex.exit_code, ex.signal, ex.requested) == (0, None, 9, True)
    assert ex.exit_class is ExitClass.KILLED
    assert _gone(int(long_ref))


def test_shutdown_stops_everything_and_launch_is_refused(tmp_path: Path) -> None:
    b = LocalBackend(poll_interval_s=0.05)
    hs = [b.launch(_spec(SLEEP, node_id=i, cpu_millicores=0)) for i in range(2)]
    with pytest.raises(Exception, match="already running"):
        b.launch(_spec(SLEEP, node_id=0, cpu_millicores=0))
    b.shutdown(grace_s=1.0)
    assert not any(b.alive(h) for h in hs)
    exits = b.poll()
    assert sorted(e.node_id for e in exits) == [0, 1]
    assert all(e.signal == signal.SIGTERM and e.requested for e in exits)
    with pytest.raises(Exception, match="shut down"):
        b.launch(_spec(SLEEP, node_id=5))


def test_cpu_quota_limits_a_node_to_its_fraction_of_a_core_and_resizes_in_place() -> None:
    """``cpu_limit="quota"``: a node asking 0.3 CPU burns about 0.3 of a core (a CFS quota,
    as a pod's CPU limit), not the whole CPU it would be pinned to; a resize rewrites the
    quota in place; its cgroup is gone after its exit. Needs a writable cgroup cpu
    controller (root here); skipped where there is none."""
    from dlrover_core.runtime.cgroup import CpuQuotas

    probe = CpuQuotas.open(f"dlrover-rm/probe-{os.getpid()}")
    if probe is None:
        pytest.skip("no writable cgroup cpu controller on this machine")
    probe.close()
    b = LocalBackend(cpu_limit="quota", usage_window_s=1.5)
    burn = "import time\nt = time.time()\nwhile time.time() - t < 6: pass"
    try:
        h = b.launch(_spec(burn, cpu_millicores=300, memory_mib=512))
        time.sleep(2.5)
        u = b.usage(h)
        assert u is not None and 15 <= u.cpu_percent <= 40, u  # 0.3 core, not a full CPU
        assert b.resize(h, NodeResources(800, 512))
        time.sleep(2.0)
        u = b.usage(h)
        assert u is not None and u.cpu_percent >= 50, u
        assert b._quotas is not None
        group = b._quotas.base / "worker-0-0"
        assert group.exists()
        b.kill(h)
        _wait_exits(b, 1)
        assert not group.exists()
    finally:
        b.shutdown()
    assert not b._quotas.base.exists()


def test_cpu_limit_is_checked() -> None:
    from dlrover_core.errors import InputError

    with pytest.raises(InputError, match="cpu_limit must be 'pin' or 'quota'"):
        LocalBackend(cpu_limit="cfs")
