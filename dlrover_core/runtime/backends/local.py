"""Local backend: every node is a process group on this machine.

How it maps a ``NodeSpec`` onto a process (choices recorded here, see ``backend.py`` for the
protocol):

- **Process group.** ``start_new_session=True``: the node is the leader of its own session and
  process group, so its children (data loaders, torchrun's workers) go with it when the group is
  signalled, and the node survives the master's death (master fault tolerance: a new master
  ``adopt``s it by pid). When the leader ends, whatever is left of its group is SIGKILLed: a
  node's end is its leader's end.
- **CPU.** ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` = ``NodeResources.threads`` (whole
  cores, rounded down, at least 1; ``spec.env`` may override them), ``OMP_WAIT_POLICY`` =
  ``PASSIVE`` unless this process's environment sets it, and the process is pinned to
  ``ceil(cores)`` CPUs chosen round-robin over the CPUs this process may use (all of them
  when ``cores`` covers the machine or is 0).
  The pinning is race-free: the launching thread pins *itself*, forks the child (which inherits
  the mask before it runs a single instruction of its own) and restores its mask. With
  ``cpu_limit="quota"`` (``backend.cpu_limit``) a node gets a CFS quota of ``cores`` instead
  (its own cgroup, :class:`~dlrover_core.runtime.cgroup.CpuQuotas`): 0.5 CPU is half a core's
  time, as a pod's CPU limit; an in-place resize rewrites the quota.
- **Memory (enforced).** A monitor thread samples each node's resident memory (leader plus
  all descendants, via psutil) every ``poll_interval_s``; over ``resources.memory_mib`` (0 = no
  limit) the group is SIGKILLed and the exit reported with reason ``"OOMKilled"``, which
  ``classify_exit`` reads as OOM. A process can overshoot its limit by what it allocates
  within one interval.
- **Exits.** Launched processes are our children: the exit status comes from ``waitid``
  (``exit_code`` as Python reports it, ``-N`` for signal N). The leader is reaped only after the
  rest of its group has been killed, so its pid (= the group id) cannot be reused meanwhile.
  Adopted processes are not our children, so their exit status is lost: their end is seen with
  psutil and reported with ``exit_code=None`` and reason ``"Lost"`` (``classify_exit`` ->
  UNKNOWN), or with the signal this backend sent (``stop``/``kill`` -> KILLED) or ``"OOMKilled"``.
- **Identity.** The node's role, id, incarnation, CPU and memory go into its environment
  (``backend.ENV_*``). ``adopt`` reads them back from ``/proc/<pid>/environ`` to make sure the
  pid still runs that very node (pid reuse) and to keep enforcing its memory limit.
- **Usage.** ``cpu_percent`` is the CPU time of the node's processes over the last
  ``usage_window_s`` (100 = one core); ``rss_mib`` the latest sample.

Thread-safe: one lock guards the node table; psutil sampling runs outside it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from dlrover_core.errors import DLRoverError, ErrorKind, InputError
from dlrover_core.runtime.backends.base import (
    ENV_ADVERTISE_HOST,
    ENV_BIND_HOST,
    ENV_CPU_MILLICORES,
    ENV_INCARNATION,
    ENV_MEMORY_MIB,
    ENV_NODE_ID,
    ENV_ROLE,
    LOST_REASON,
    OMP_WAIT_POLICY,
    OOM_REASON,
    NodeExit,
    NodeHandle,
    NodeSpec,
    NodeUsage,
    launch_each,
)
from dlrover_core.runtime.cgroup import CpuQuotas
from dlrover_core.types import NodeResources, Role
from dlrover_core.units import mib_from_bytes

__all__ = ["LocalBackend", "UnknownNodeError"]

log = logging.getLogger(__name__)
_Key = tuple[Role, int, int]
LOOPBACK = "127.0.0.1"


class UnknownNodeError(DLRoverError):
    """A handle this backend neither launched nor adopted."""

    kind = ErrorKind.NOT_FOUND


@dataclass
class _Node:
    handle: NodeHandle
    resources: NodeResources
    leader: psutil.Process
    popen: subprocess.Popen[bytes] | None  # None when adopted (not our child)
    cpus: tuple[int, ...] | None
    members: dict[int, psutil.Process] = field(default_factory=dict)  # descendants, last sample
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (monotonic, cpu s)
    rss_mib: float | None = None
    max_rss_mib: float = 0.0
    oom: bool = False
    requested: bool = False
    sent_signal: int | None = None
    kill_at: float | None = None  # monotonic deadline of a stop's grace
    exit: NodeExit | None = None

    @property
    def pid(self) -> int:
        return self.leader.pid

    @property
    def key(self) -> _Key:
        h = self.handle
        return (h.role, h.node_id, h.incarnation)


class LocalBackend:
    """Nodes as local process groups. See the module docstring for the mapping."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        poll_interval_s: float = 0.2,
        cpu_count: int | None = os.cpu_count(),
        usage_window_s: float = 2.0,
        cpu_limit: str = "pin",
    ) -> None:
        if poll_interval_s <= 0:
            raise InputError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        if cpu_limit not in ("pin", "quota"):
            raise InputError(f"cpu_limit must be 'pin' or 'quota', got {cpu_limit!r}")
        self._quotas: CpuQuotas | None = None
        if cpu_limit == "quota":
            self._quotas = CpuQuotas.open(f"dlrover-rm/{os.getpid()}-{id(self):x}")
            if self._quotas is None:
                raise InputError(
                    "backend.cpu_limit=quota needs a writable cgroup cpu controller (root, or "
                    "a delegated cgroup); set backend.cpu_limit=pin on this machine"
                )
        self._clock = clock
        self._interval = poll_interval_s
        self._window = usage_window_s
        self._cpus = self._allowed_cpus(cpu_count)
        self._next_cpu = 0
        self._lock = threading.RLock()
        self._nodes: dict[_Key, _Node] = {}
        self._exits: list[NodeExit] = []
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------------ protocol

    def launch_many(self, specs: Sequence[NodeSpec]) -> list[NodeHandle | Exception]:
        """Each spec in turn (a process starts in milliseconds): see ``Backend.launch_many``."""
        return launch_each(self.launch, specs)

    def launch(self, spec: NodeSpec) -> NodeHandle:
        key: _Key = (spec.role, spec.node_id, spec.incarnation)
        with self._lock:
            if self._closed:
                raise InputError("the local backend is shut down; create a new one to launch")
            old = self._nodes.get(key)
            if old is not None and old.exit is None:
                raise InputError(
                    f"{spec.name} is already running (pid {old.pid}); relaunch it with the next "
                    "incarnation or stop it first"
                )
            cpus = self._choose_cpus(spec.resources) if self._quotas is None else None
        env = {
            "OMP_WAIT_POLICY": OMP_WAIT_POLICY,
            **os.environ,
            "OMP_NUM_THREADS": str(spec.resources.threads),
            "MKL_NUM_THREADS": str(spec.resources.threads),
            ENV_BIND_HOST: LOOPBACK,
            ENV_ADVERTISE_HOST: LOOPBACK,
            **spec.identity_env(),
            **spec.env,
        }
        try:
            with self._log(spec.log_path) as out, _pinned(cpus):
                popen = subprocess.Popen(
                    spec.argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            raise InputError(
                f"cannot start {spec.name}: {exc}; check the node's command {spec.argv[:3]}..."
            ) from exc
        if self._quotas is not None:
            # right after the start: the node's interpreter is still starting up, long
            # before it starts a child of its own (children inherit the cgroup)
            self._quotas.place(_group_name(key), popen.pid, spec.resources.cpu_cores)
        leader = psutil.Process(popen.pid)
        handle = NodeHandle(
            spec.role, spec.node_id, spec.incarnation, str(popen.pid), self._clock()
        )
        node = _Node(handle, spec.resources, leader, popen, cpus)
        with self._lock:
            self._nodes[key] = node
            self._ensure_monitor()
        return handle

    def poll(self) -> list[NodeExit]:
        with self._lock:
            for node in list(self._nodes.values()):
                if node.exit is None:
                    self._check_exit(node)
            out, self._exits = self._exits, []
        return out

    def stop(self, handle: NodeHandle, grace_s: float = 5.0, *, wait: bool = True) -> None:
        """SIGTERM the node's group, SIGKILL it ``grace_s`` later (the monitor escalates even
        when ``wait`` is false). With ``wait``, return once the node has ended."""
        with self._lock:
            node = self._node(handle)
            if node.exit is not None or self._check_exit(node):
                return
            node.requested = True
            node.sent_signal = signal.SIGTERM
            node.kill_at = time.monotonic() + max(0.0, grace_s)
            self._signal_group(node, signal.SIGTERM)
        if wait:
            self._wait_end(node, max(0.0, grace_s) + 5.0)

    def kill(self, handle: NodeHandle) -> None:
        """SIGKILL the node's group and wait (briefly) until it has ended."""
        with self._lock:
            node = self._node(handle)
            if node.exit is not None or self._check_exit(node):
                return
            node.requested = True
            node.sent_signal = signal.SIGKILL
            self._signal_group(node, signal.SIGKILL)
        self._wait_end(node, 5.0)

    def usage(self, handle: NodeHandle) -> NodeUsage | None:
        with self._lock:
            node = self._nodes.get(self._key(handle))
            if node is None or node.handle != handle or node.exit is not None:
                return None
            fresh = node.rss_mib is None
        if fresh:
            self._sample(node, None)
        with self._lock:
            if node.exit is not None or node.rss_mib is None:
                return None
            return NodeUsage(self._cpu_percent(node), node.rss_mib)

    def alive(self, handle: NodeHandle) -> bool:
        with self._lock:
            node = self._nodes.get(self._key(handle))
            if node is None or node.handle != handle:
                return False
            return node.exit is None and not self._check_exit(node)

    def adopt(
        self,
        role: Role,
        node_id: int,
        incarnation: int,
        ref: str,
        *,
        argv: Sequence[str] | None = None,
        resources: NodeResources | None = None,
    ) -> NodeHandle | None:
        """Take over node ``role``/``node_id``/``incarnation`` running as pid ``ref`` (launched
        by an earlier backend, typically before a master restart). The pid must still be a
        process-group leader whose environment names that node (``ENV_*``) and, if ``argv`` is
        given, whose command line is ``argv``; otherwise ``None`` (ended, or pid reused).
        Its memory limit is read from its environment unless ``resources`` is given."""
        key: _Key = (role, node_id, incarnation)
        with self._lock:
            if self._closed:
                raise InputError("the local backend is shut down; create a new one to adopt")
            known = self._nodes.get(key)
            if known is not None and known.exit is None and known.handle.ref == ref:
                return known.handle
        try:
            pid = int(ref)
            proc = psutil.Process(pid)
            if pid <= 1 or proc.status() == psutil.STATUS_ZOMBIE or os.getpgid(pid) != pid:
                return None
            env = proc.environ()
            expected = {
                ENV_ROLE: role.value,
                ENV_NODE_ID: str(node_id),
                ENV_INCARNATION: str(incarnation),
            }
            if any(env.get(k) != v for k, v in expected.items()):
                return None
            if argv is not None and proc.cmdline() != list(argv):
                return None
            if resources is None:
                resources = NodeResources(
                    int(env.get(ENV_CPU_MILLICORES, "0") or 0),
                    int(env.get(ENV_MEMORY_MIB, "0") or 0),
                )
            cpus = tuple(sorted(proc.cpu_affinity() or []))
            age_s = max(0.0, time.time() - proc.create_time())
        except (ValueError, psutil.Error, OSError):
            return None
        handle = NodeHandle(role, node_id, incarnation, str(pid), self._clock() - age_s)
        node = _Node(handle, resources, proc, None, cpus or None)
        with self._lock:
            if self._closed:
                raise InputError("the local backend is shut down; create a new one to adopt")
            self._nodes[key] = node
            self._ensure_monitor()
        return handle

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop every node still running (SIGTERM, SIGKILL after ``grace_s``), end the
        monitor. Their exits remain available to one last ``poll``."""
        with self._lock:
            self._closed = True
            live = [n for n in self._nodes.values() if n.exit is None and not self._check_exit(n)]
            deadline = time.monotonic() + max(0.0, grace_s)
            for node in live:
                node.requested = True
                node.sent_signal = signal.SIGTERM
                node.kill_at = deadline
                self._signal_group(node, signal.SIGTERM)
        for node in live:
            self._wait_end(node, max(0.0, deadline - time.monotonic()) + 5.0)
        self._stopping.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=5.0)
        if self._quotas is not None:
            self._quotas.close()

    def endpoint(self) -> tuple[str, str]:
        """Everything runs on this machine: bind and advertise loopback."""
        return LOOPBACK, LOOPBACK

    def resize_state(self, handle: NodeHandle) -> str | None:
        """A local re-pin is done when :meth:`resize` returns."""
        return None

    def pending_since(self, handle: NodeHandle) -> float | None:
        """A local process starts at once: never left unplaced."""
        return None

    def event(
        self, handle: NodeHandle | None, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """No event channel for local processes: the master's log and report.json say it."""

    def resize(self, handle: NodeHandle, resources: NodeResources) -> bool:
        """Re-pin every process of the node to a CPU set of the new size (memory unchanged:
        a different memory limit needs a relaunch). ``False`` when it cannot (not pinned,
        ended, or the memory differs)."""
        with self._lock:
            node = self._nodes.get(self._key(handle))
            if node is None or node.handle != handle or node.exit is not None:
                return False
            if self._quotas is not None and resources.memory_mib == node.resources.memory_mib:
                try:  # a CPU quota changes in place, as a pod's resize does
                    self._quotas.set(_group_name(node.key), resources.cpu_cores)
                except OSError:
                    return False
                node.resources = resources
                return True
            if node.cpus is None or resources.memory_mib != node.resources.memory_mib:
                return False
            cpus = self._choose_cpus(resources)
            if cpus is None:
                return False
            procs = [node.leader, *node.members.values()]
            try:
                for proc in procs:
                    proc.cpu_affinity(list(cpus))
            except (psutil.Error, OSError):
                return False
            node.cpus = cpus
            node.resources = resources
            return True

    # ------------------------------------------------------------------ extras

    def cpus_of(self, handle: NodeHandle) -> tuple[int, ...] | None:
        """The CPUs the node was pinned to (``None``: not pinned, or unknown handle)."""
        with self._lock:
            node = self._nodes.get(self._key(handle))
            return node.cpus if node is not None and node.handle == handle else None

    def max_rss_mib(self, handle: NodeHandle) -> float | None:
        """The highest resident memory seen for the node so far."""
        with self._lock:
            node = self._nodes.get(self._key(handle))
            if node is None or node.handle != handle:
                return None
            return node.max_rss_mib

    def handles(self) -> list[NodeHandle]:
        """Handles of the nodes still running."""
        with self._lock:
            return [n.handle for n in self._nodes.values() if n.exit is None]

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _allowed_cpus(cpu_count: int | None) -> tuple[int, ...] | None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux: no pinning
            return None
        if cpu_count is not None and cpu_count > 0:
            cpus = cpus[:cpu_count]
        return tuple(cpus) or None

    def _choose_cpus(self, resources: NodeResources) -> tuple[int, ...] | None:
        """``ceil(cores)`` CPUs round-robin; ``None`` (no pinning) for 0 or the whole machine."""
        if self._cpus is None or resources.cpu_millicores <= 0:
            return None
        n = math.ceil(resources.cpu_cores)
        if n >= len(self._cpus):
            return None
        start = self._next_cpu
        self._next_cpu = (start + n) % len(self._cpus)
        return tuple(sorted(self._cpus[(start + i) % len(self._cpus)] for i in range(n)))

    @staticmethod
    @contextlib.contextmanager
    def _log(path: str | None) -> Iterator[IO[bytes] | int]:
        if path is None:
            yield subprocess.DEVNULL
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:  # the child keeps its own copy of the descriptor
            yield f

    @staticmethod
    def _key(handle: NodeHandle) -> _Key:
        return (handle.role, handle.node_id, handle.incarnation)

    def _node(self, handle: NodeHandle) -> _Node:
        node = self._nodes.get(self._key(handle))
        if node is None or node.handle != handle:
            raise UnknownNodeError(
                f"{handle.name} (ref {handle.ref}) is not managed by this backend; "
                "adopt it first (after a master restart) or launch it"
            )
        return node

    def _ensure_monitor(self) -> None:
        if self._monitor is None or not self._monitor.is_alive():
            self._stopping.clear()
            self._monitor = threading.Thread(
                target=self._run_monitor, name="local-backend-monitor", daemon=True
            )
            self._monitor.start()

    def _run_monitor(self) -> None:
        while not self._stopping.wait(self._interval):
            try:
                self._tick()
            except Exception:  # never let the monitor die: the memory limit depends on it
                log.exception("local backend monitor: sampling failed; retrying")
                time.sleep(self._interval)

    def _tick(self) -> None:
        with self._lock:
            live = [n for n in self._nodes.values() if n.exit is None and not self._check_exit(n)]
        if not live:
            return
        tree = _children_map()
        now = time.monotonic()
        for node in live:
            self._sample(node, tree)
            with self._lock:
                if node.exit is not None:
                    continue
                limit = node.resources.memory_mib
                if limit > 0 and node.rss_mib is not None and node.rss_mib > limit and not node.oom:
                    node.oom = True
                    self._signal_group(node, signal.SIGKILL)
                elif node.kill_at is not None and now >= node.kill_at:
                    node.kill_at = None
                    node.sent_signal = signal.SIGKILL
                    self._signal_group(node, signal.SIGKILL)
                self._check_exit(node)

    def _sample(self, node: _Node, tree: dict[int, list[int]] | None) -> None:
        """One memory/CPU sample of the node's process tree (outside the lock). ``tree``:
        parent pid -> child pids of the whole machine (``None``: ask psutil for this node)."""
        kids: list[psutil.Process] = []
        if tree is None:
            with contextlib.suppress(psutil.Error):
                kids = node.leader.children(recursive=True)
        else:
            for pid in _descendants(node.pid, tree):
                with contextlib.suppress(psutil.Error):
                    kids.append(node.members.get(pid) or psutil.Process(pid))
        rss = 0
        cpu_s = 0.0
        alive: dict[int, psutil.Process] = {}
        for proc in [node.leader, *kids]:
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    t = proc.cpu_times()
                    cpu_s += t.user + t.system
                    if proc is node.leader:
                        cpu_s += t.children_user + t.children_system
            except psutil.Error:
                continue
            if proc is not node.leader:
                alive[proc.pid] = proc
        t_now = time.monotonic()
        with self._lock:
            if node.exit is not None:
                return
            node.members = alive
            node.rss_mib = mib_from_bytes(rss)
            node.max_rss_mib = max(node.max_rss_mib, node.rss_mib)
            if not node.samples or t_now > node.samples[-1][0]:
                node.samples.append((t_now, cpu_s))
            while len(node.samples) > 2 and t_now - node.samples[1][0] >= self._window:
                node.samples.popleft()

    @staticmethod
    def _cpu_percent(node: _Node) -> float:
        if len(node.samples) < 2:
            return 0.0
        (t0, c0), (t1, c1) = node.samples[0], node.samples[-1]
        if t1 - t0 < 0.2:  # too short a window to mean anything
            return 0.0
        # a member process first seen brings its past CPU time: never report more than the
        # machine has
        return min(100.0 * (os.cpu_count() or 1), max(0.0, (c1 - c0) / (t1 - t0) * 100.0))

    def _group_exists(self, node: _Node) -> bool:
        """Whether signalling the group id is safe: the leader is unreaped (our child) or
        verifiably alive, or a member is (a live group keeps its id from being reused)."""
        if node.popen is not None and node.popen.returncode is None:
            return True
        for proc in [node.leader, *node.members.values()]:
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
        return False

    def _signal_group(self, node: _Node, sig: int) -> None:
        """Signal the node's whole process group (under the lock)."""
        if not self._group_exists(node):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(node.pid, sig)

    def _kill_leftovers(self, node: _Node) -> None:
        """After the leader ended: SIGKILL what remains of its group and of its tree."""
        self._signal_group(node, signal.SIGKILL)
        for proc in node.members.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    proc.kill()

    def _check_exit(self, node: _Node) -> bool:
        """Record the node's exit if its leader has ended (under the lock)."""
        if node.exit is not None:
            return True
        exit_code: int | None
        sig: int | None
        reason: str | None
        if node.popen is not None:
            try:
                if os.waitid(os.P_PID, node.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    return False
                self._kill_leftovers(node)  # leader still unreaped: its pid is the group's
                # (no rusage: ru_maxrss counts the parent's memory the child had before exec)
                _, status = os.waitpid(node.pid, 0)
            except ChildProcessError:  # someone else reaped our child: its status is lost
                node.popen.returncode = -1
                self._kill_leftovers(node)
                self._record(node, None, None, LOST_REASON)
                return True
            exit_code = os.waitstatus_to_exitcode(status)
            node.popen.returncode = exit_code
            sig = -exit_code if exit_code < 0 else None
            reason = OOM_REASON if node.oom else None
        else:
            try:
                gone = not node.leader.is_running() or (
                    node.leader.status() == psutil.STATUS_ZOMBIE
                )
            except psutil.Error:
                gone = True
            if not gone:
                return False
            self._kill_leftovers(node)
            exit_code = None
            if node.oom:
                sig, reason = signal.SIGKILL, OOM_REASON
            elif node.requested:
                sig, reason = node.sent_signal, None
            else:
                sig, reason = None, LOST_REASON
        self._record(node, exit_code, sig, reason)
        return True

    def _record(self, node: _Node, code: int | None, sig: int | None, reason: str | None) -> None:
        h = node.handle
        node.exit = NodeExit(
            role=h.role,
            node_id=h.node_id,
            incarnation=h.incarnation,
            exit_code=code,
            signal=int(sig) if sig is not None else None,
            reason=reason,
            at_s=self._clock(),
            max_rss_mib=round(node.max_rss_mib, 1) if node.max_rss_mib > 0 else None,
            ref=h.ref,
            requested=node.requested,
        )
        node.rss_mib = None
        self._exits.append(node.exit)
        if self._quotas is not None:
            self._quotas.remove(_group_name(node.key))

    def _wait_end(self, node: _Node, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if node.exit is not None or self._check_exit(node):
                    return
                if node.kill_at is not None and time.monotonic() >= node.kill_at:
                    node.kill_at = None
                    node.sent_signal = signal.SIGKILL
                    self._signal_group(node, signal.SIGKILL)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)


def _group_name(key: _Key) -> str:
    role, node_id, incarnation = key
    return f"{role.value}-{node_id}-{incarnation}"


@contextlib.contextmanager
def _pinned(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """Pin the calling thread to ``cpus`` for the block, so a child forked in it starts pinned."""
    if cpus is None:
        yield
        return
    try:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
    except OSError:  # the machine does not let us: run unpinned
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _children_map() -> dict[int, list[int]]:
    """parent pid -> child pids for every process (one pass over /proc per monitor tick)."""
    out: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            out.setdefault(int(ppid), []).append(proc.pid)
    return out


def _descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out
