"""All-reduce rendezvous at scale (issue 34, item 4): a group of N ranks formed, a rank killed,
(optionally) a rank hung, a resize, through the real job master, with load ranks.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/allreduce_rendezvous_scale.py --ranks 64 \\
        --resize-to 16 --hang --min-free-mib 2500 \\
        --json benchmarks/results/allreduce_rendezvous_64.json
    PYTHONPATH=$PWD .venv/bin/python benchmarks/allreduce_rendezvous_scale.py --ranks 48 \\
        --min-free-mib 2500 --json benchmarks/results/allreduce_rendezvous_48_to_36.json

What runs: a real :class:`~dlrover_core.runtime.controller.JobMaster` holding the
:class:`~dlrover_core.runtime.strategies.allreduce.strategy.AllReduceStrategy` on the
:class:`~dlrover_core.runtime.backends.local.LocalBackend` (one process group per rank), its
rendezvous TCPStore, shard queue and write-ahead state; a fixed first plan of N ranks,
``replan=False``. Each rank is ``benchmarks/allreduce_load_rank.py``: the production rank agent
(registration, heartbeats, gloo group through the master's store, rounds, DCP checkpoints,
stop, exit codes) with the torchrec model replaced by a stand-in that sleeps ``rows / rate``
per round (see that file). The scenarios, in this order, are driven from ``on_tick``:

a. **first rendezvous**: launch (the backend starting the first rank's process) -> every rank
   imported (``warm``), registered with the master, in the process group (``joined``:
   ``init_process_group`` returned), ``ready``, and through its first round. The rendezvous
   proper is last ``registered`` -> last ``joined``.
b. **rank failure**: one rank (rank N/2) SIGKILLed a second after a checkpoint, mid-round.
   Measured from the kill: the master's fault record (it aborts the group and launches the next
   in that pass), every survivor exited, the new group of N imported, joined, ``ready`` and
   through its first round. Compared with the collective timeout ``pacing.dead_after_s``: a
   recovery that waited for it would take at least that long.
c. ``--hang``: one rank SIGSTOPped. Nothing fails, so only the master's heartbeat timeout
   (``dead_after_s``) or the survivors' collective timeout (the same value) can see it: this one
   is expected to take about ``dead_after_s`` plus a relaunch, and is reported as such.
d. **resize** N -> ``--resize-to`` (default 3N/4) through ``JobMaster.apply``: the new group
   is pre-warmed, the old one asked to stop once the new ranks are warm, it leaves at a final
   checkpoint, the new one loads it. Measured: request -> new group ready, and the downtime:
   the old group's last round (``stop_seen`` on its rank 0, the round after which it stopped)
   -> the new group's rank 0 ``ready`` (and -> its first round done); the master's own figure
   (stop requested -> the new rank 0's first step, ``resize_downtimes_s``) beside it. For each
   new group: how many shard records the checkpoint it loaded holds, and how long its rank 0
   took to report them done again (one RPC each) before ``ready``.

Then the job finishes its shards (the load rate is lifted) and ends ``succeeded``; checked:
exactly once in the shard queue (every shard done, none twice, none lost) and in the final DCP
checkpoint (its ``rows_seen`` tensor holds ``data.rows``), and no rank process left.

Pacing (generous: 64 processes importing torch on 2 cores is not a fault): heartbeat every
``--heartbeat-s`` (2), ``dead_after_s`` 120 (the collective, rendezvous and release timeout),
``pending_timeout_s`` 900 (a pre-warmed rank waits at its gate unregistered), the pre-warm wait
of a resize 600 s (a resize waits until every new rank is warm). A memory guard stops the job
(``stop_reason``) when the machine's available memory falls under ``--min-free-mib``.

Memory bounds the sizes: a load rank is ~210 MiB resident (torch + DCP + gloo; PSS measured
with 64 running), and a resize runs the old and the pre-warmed group side by side, so 64 -> 48
(112 processes, ~23 GiB) does not fit a 23 GiB machine; 64 -> 16 (80) and 48 -> 36 (84) do.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from allreduce_common import table, write_json  # noqa: E402
from allreduce_load_rank import RATE_FILE  # noqa: E402

from dlrover_core.runtime.backends.base import NodeHandle, NodeSpec  # noqa: E402
from dlrover_core.runtime.backends.local import LocalBackend  # noqa: E402
from dlrover_core.runtime.controller import JobMaster  # noqa: E402
from dlrover_core.runtime.strategies.allreduce.agent import CKPT_DIR, EVENT_PREFIX  # noqa: E402
from dlrover_core.runtime.strategies.allreduce.strategy import AllReduceStrategy  # noqa: E402
from dlrover_core.spec import JobSpec, load_spec  # noqa: E402
from dlrover_core.types import NodeResources, ResourcePlan, Role, RolePlan, Stage  # noqa: E402

SPEC = ROOT / "pipelines" / "specs" / "small-allreduce.yaml"
LOAD_RANK = ROOT / "benchmarks" / "allreduce_load_rank.py"
BATCH = 256
SHARD_BATCHES = 10
SHARD_ROWS = BATCH * SHARD_BATCHES
RANK_RES = NodeResources(1000, 1024)  # LocalBackend kills a rank whose RSS passes 1 GiB


def make_spec(
    ranks: int,
    shards: int,
    *,
    heartbeat_s: float = 2.0,
    dead_after_s: float = 120.0,
    pending_timeout_s: float = 900.0,
    checkpoint_s: float = 10.0,
) -> JobSpec:
    return load_spec(
        SPEC,
        [
            f"data.rows={shards * SHARD_ROWS}",
            "data.eval_rows=0",  # the stand-in's checkpoint is no DLRM: nothing to evaluate
            f"data.shard_batches={SHARD_BATCHES}",
            f"training.batch_size={BATCH}",
            "constraints.workers.min=1",
            f"constraints.workers.max={ranks}",
            f"quota.cpu={2 * ranks}",
            f"quota.memory={2 * ranks}Gi",
            f"pacing.heartbeat_interval_s={heartbeat_s}",
            f"pacing.dead_after_s={dead_after_s}",
            f"pacing.pending_timeout_s={pending_timeout_s}",
            "pacing.replan_interval_s=100000",
            f"allreduce.checkpoint_interval_s={checkpoint_s}",
        ],
    )


def plan(ranks: int, why: str) -> ResourcePlan:
    return ResourcePlan(RolePlan(ranks, RANK_RES), RolePlan(0, NodeResources(0, 0)),
                        Stage.SCALING, (f"benchmark: {why}",))  # fmt: skip


class TimedBackend(LocalBackend):
    """The local backend, noting when it started each node's process (node id -> wall time)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: dict[int, float] = {}

    def launch(self, spec: NodeSpec) -> NodeHandle:
        t = time.time()
        h = super().launch(spec)
        self.started[spec.node_id] = t
        return h


# --- what the ranks say ----------------------------------------------------------------------


class EventTail:
    """The ``ALLREDUCE-EVENT`` lines of every rank's log (``RUN_DIR/logs/worker-ID.log``),
    read incrementally: node id -> event name -> the event (the last of that name)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._pos: dict[Path, int] = {}
        self._rest: dict[Path, bytes] = {}
        self.events: dict[int, dict[str, list[dict[str, Any]]]] = {}

    def poll(self, node_ids: Any) -> None:
        for nid in node_ids:
            p = self.logs / f"worker-{nid}.log"
            try:
                with open(p, "rb") as f:
                    f.seek(self._pos.get(p, 0))
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            self._pos[p] = self._pos.get(p, 0) + len(data)
            data = self._rest.pop(p, b"") + data
            lines = data.split(b"\n")
            if lines[-1]:
                self._rest[p] = lines[-1]
            for raw in lines[:-1]:
                line = raw.decode(errors="replace")
                if not line.startswith(EVENT_PREFIX):
                    continue
                try:
                    e = json.loads(line[len(EVENT_PREFIX) :])
                except ValueError:
                    continue
                self.events.setdefault(nid, {}).setdefault(e["event"], []).append(e)

    def t(self, nid: int, name: str, last: bool = False) -> float | None:
        es = self.events.get(nid, {}).get(name)
        if not es:
            return None
        return float(es[-1 if last else 0]["t"])

    def all_t(self, node_ids: Any, name: str) -> list[float] | None:
        """The time of ``name`` on every node of ``node_ids``, or None until all have it."""
        out = [self.t(n, name) for n in node_ids]
        return None if any(x is None for x in out) else [float(x) for x in out if x is not None]

    def after(self, nid: int, name: str, t0: float) -> dict[str, Any] | None:
        for e in self.events.get(nid, {}).get(name, []):
            if e["t"] > t0:
                return e
        return None


class ProcWatch(threading.Thread):
    """When each watched pid ended (gone or a zombie), polled every ``every_s``."""

    def __init__(self, every_s: float = 0.05) -> None:
        super().__init__(daemon=True, name="proc-watch")
        self.every_s = every_s
        self._lock = threading.Lock()
        self._live: dict[int, psutil.Process] = {}
        self.ended: dict[int, float] = {}
        self._stop = threading.Event()

    def watch(self, pids: list[int]) -> None:
        with self._lock:
            for pid in pids:
                try:
                    self._live[pid] = psutil.Process(pid)
                except psutil.Error:
                    self.ended[pid] = time.time()

    def run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                live = list(self._live.items())
            for pid, p in live:
                try:
                    gone = p.status() == psutil.STATUS_ZOMBIE
                except psutil.Error:
                    gone = True
                if gone:
                    with self._lock:
                        self._live.pop(pid, None)
                        self.ended.setdefault(pid, time.time())

    def end_of(self, pids: list[int]) -> float | None:
        with self._lock:
            if any(p not in self.ended for p in pids):
                return None
            return max((self.ended[p] for p in pids), default=None)

    def close(self) -> None:
        self._stop.set()


class MemWatch(threading.Thread):
    """The machine's available memory and the benchmark's process tree (RSS), every 2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="mem-watch")
        self.min_available_mib = math.inf
        self.max_tree_rss_mib = 0.0
        self.max_ranks = 0
        self._stop = threading.Event()
        self.used0_mib = psutil.virtual_memory().used / 2**20
        self.max_used_mib = self.used0_mib

    def run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(2.0):
            vm = psutil.virtual_memory()
            self.min_available_mib = min(self.min_available_mib, vm.available / 2**20)
            self.max_used_mib = max(self.max_used_mib, vm.used / 2**20)
            rss, n = me.memory_info().rss, 0
            for c in me.children(recursive=True):
                try:
                    rss += c.memory_info().rss
                    n += 1
                except psutil.Error:
                    pass
            self.max_tree_rss_mib = max(self.max_tree_rss_mib, rss / 2**20)
            self.max_ranks = max(self.max_ranks, n)

    def close(self) -> None:
        self._stop.set()


# --- the scenarios ---------------------------------------------------------------------------


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class Driver:
    """The scenarios as a state machine run from the master's ``on_tick`` (never blocks)."""

    def __init__(
        self,
        run_dir: Path,
        ranks: int,
        resize_to: int,
        *,
        hang: bool,
        rows_per_s: float,
        phase_timeout_s: float,
        min_free_mib: float,
        log: Callable[[str], None],
    ) -> None:
        self.ranks = ranks
        self.rows_per_s = rows_per_s
        self.slowed: dict[str, Any] | None = None
        self.resize_to = resize_to
        self.steps = ["first", "kill", *(["hang"] if hang else []), "resize", "finish"]
        self.phase_timeout_s = phase_timeout_s
        self.min_free_mib = min_free_mib
        self.log = log
        self.procs = ProcWatch()
        self.procs.start()
        self.tail = EventTail(run_dir / "logs")
        self.results: dict[str, Any] = {}
        self.failure: str | None = None
        self._phase = 0
        self._sub = "start"
        self._since = time.monotonic()
        self._ctx: dict[str, Any] = {}
        self._created: dict[int, tuple[float, float]] = {}

    # helpers
    @property
    def phase(self) -> str:
        return self.steps[self._phase] if self._phase < len(self.steps) else "done"

    def _next(self) -> None:
        self._phase += 1
        self._sub = "start"
        self._since = time.monotonic()
        self._ctx = {}
        self.log(f"[{time.strftime('%H:%M:%S')}] phase {self.phase}")

    @staticmethod
    def _group(m: JobMaster) -> Any:
        ar = m.strategy
        assert isinstance(ar, AllReduceStrategy)
        return ar._current()

    @staticmethod
    def _pids(m: JobMaster, g: Any) -> dict[int, int]:
        out = {}
        for nid in g.node_ids:
            n = m.nodes.get((Role.WORKER, nid))
            if n is not None and n.handle is not None:
                out[nid] = int(n.handle.ref)
        return out

    def _note_created(self, m: JobMaster, g: Any) -> None:
        """When the backend started the first and the last process of ``g`` (the master
        records its launches only after the whole batch)."""
        b = m.backend
        assert isinstance(b, TimedBackend)
        ts = [b.started.get(nid) for nid in g.node_ids]
        if all(t is not None for t in ts):
            got = [float(t) for t in ts if t is not None]
            self._created[g.gid] = (min(got), max(got))

    def _ckpt_shards(self, m: JobMaster, seq: int | None) -> int | None:
        """How many shard records checkpoint ``seq`` holds (None once it was pruned)."""
        from dlrover_core.runtime.strategies.allreduce.checkpoint import CheckpointStore

        for c in CheckpointStore(m.run_dir / CKPT_DIR).complete():
            if c.meta.seq == seq:
                return len(c.meta.shards)
        return None

    @staticmethod
    def _fault_t(m: JobMaster, gid: int) -> float | None:
        """When the master recorded the fault that ended group ``gid`` (it aborts the group
        and launches the next in the same pass)."""
        ts = [f["time_s"] for f in m.st.faults if f.get("group") == gid and "time_s" in f]
        return min(ts) if ts else None

    def _stop(self, m: JobMaster, why: str) -> None:
        self.failure = self.failure or why
        m.stop_reason = m.stop_reason or f"benchmark: {why}"
        self.log(f"stopping the job: {why}")

    # the tick
    def on_tick(self, m: JobMaster) -> None:
        avail = psutil.virtual_memory().available / 2**20
        if avail < self.min_free_mib:
            self._stop(m, f"memory guard: {avail:.0f} MiB available < {self.min_free_mib:.0f}")
            return
        if self.phase not in ("done", "finish") and (
            time.monotonic() - self._since > self.phase_timeout_s
        ):
            self._stop(m, f"phase {self.phase} ({self._sub}) took over {self.phase_timeout_s} s")
            return
        g = self._group(m)
        if g is None:
            return
        if self.phase != "finish" and not self.slowed:
            todo = m.st.shards.counts()["todo"]
            if todo < 12 * g.world_size:  # a dozen rounds left: slow down, keep the scenarios
                self.slowed = {"phase": self.phase, "todo": todo, "t": time.time()}
                (m.run_dir / RATE_FILE).write_text(str(self.rows_per_s / 4))
                self.log(f"only {todo} shards left in phase {self.phase}: load rate / 4")
        if g.gid not in self._created:
            self._note_created(m, g)
        self.tail.poll(g.node_ids)
        for key in ("old_ids",):
            if key in self._ctx:
                self.tail.poll(self._ctx[key])
        getattr(self, f"_{self.phase}")(m, g)

    def _ready_and_checkpointed(self, g: Any) -> bool:
        """Every rank of ``g`` through its first round, and a checkpoint after it."""
        first = self.tail.all_t(g.node_ids, "first_round")
        if first is None:
            return False
        return self.tail.after(g.first_node_id, "checkpoint", max(first)) is not None

    def _group_times(self, g: Any, m: JobMaster) -> dict[str, Any] | None:
        """Launch -> every rank's phase (the last rank's time), or None until all trained."""
        ids = list(g.node_ids)
        ev = {
            k: self.tail.all_t(ids, k)
            for k in ("warm", "released", "registered", "joined", "ready", "first_round")
        }
        if ev["first_round"] is None or any(v is None for v in ev.values()):
            return None
        if g.gid not in self._created:
            return None
        t0, t_last = self._created[g.gid]
        last = {k: max(v) for k, v in ev.items() if v is not None}
        first = {k: min(v) for k, v in ev.items() if v is not None}
        r0 = self.tail.events.get(g.first_node_id, {})
        loads = r0.get("loaded") or []
        loaded = loads[0] if loads else None
        reload: dict[str, Any] = {}
        if loaded is not None:
            # rank 0 reports the shards of the checkpoint it loaded done again (one RPC each):
            # loaded -> ready on rank 0
            reload = {
                "loaded_seq": loaded.get("seq"),
                "loaded_shards": self._ckpt_shards(m, loaded.get("seq")),
                "rank0_rereport_s": _r((ev["ready"] or [0.0])[0] - float(loaded["t"])),
            }
        return {
            "group": g.gid,
            "ranks": g.world_size,
            **reload,
            "launched_t": t0,
            "launch_spread_s": _r(t_last - t0),
            **{f"{k}_s": _r(last[k] - t0) for k in last},
            "first_registered_s": _r(first["registered"] - t0),
            "rendezvous_s": _r(last["joined"] - last["registered"]),
            "join_wait_max_s": _r(
                max(j - r for j, r in zip(ev["joined"] or [], ev["registered"] or [], strict=True))
            ),
            "rank0_first_round_s": _r((ev["first_round"] or [t0])[0] - t0),
        }

    # a. first rendezvous
    def _first(self, m: JobMaster, g: Any) -> None:
        if self._sub == "start":
            times = self._group_times(g, m)
            if times is None:
                return
            self.results["first_rendezvous"] = times
            self.log(f"first rendezvous: {times}")
            self._sub = "ckpt"
        if self._sub == "ckpt" and self._ready_and_checkpointed(g):
            self._next()

    # b. a rank SIGKILLed
    def _signal_middle_rank(self, m: JobMaster, g: Any, sig: signal.Signals, stamp: str) -> None:
        """Once ``g`` is a second into its rounds after a checkpoint (mid-training): ``sig`` to
        its middle rank, the time in ``self._ctx[stamp]``, and on to the "recover" step."""
        c = self._ctx
        ck = self.tail.t(g.first_node_id, "checkpoint", last=True)
        if ck is None or time.time() < ck + 1.0:
            return
        pids = self._pids(m, g)
        victim_rank = g.world_size // 2
        victim = g.first_node_id + victim_rank
        c.update(old=g.gid, old_ids=list(g.node_ids), pids=pids, victim=victim)
        self.procs.watch(list(pids.values()))
        c[stamp] = time.time()
        os.kill(pids[victim], sig)
        self.log(f"{sig.name} rank {victim_rank} (node {victim}, pid {pids[victim]})")
        self._sub = "recover"

    def _kill(self, m: JobMaster, g: Any) -> None:
        c = self._ctx
        if self._sub == "start":
            self._signal_middle_rank(m, g, signal.SIGKILL, "t_kill")
            return
        if self._sub == "recover":
            if g.gid == c["old"]:
                return
            times = self._group_times(g, m)
            survivors = [p for n, p in c["pids"].items() if n != c["victim"]]
            ended = self.procs.end_of(survivors)
            if times is None or ended is None:
                return
            self.tail.poll(c["old_ids"])
            t_kill = c["t_kill"]
            peer_lost = sum(
                1
                for n in c["old_ids"]
                if any(e.get("code") == 3 for e in self.tail.events.get(n, {}).get("exit", []))
            )
            aborted = self._fault_t(m, c["old"])
            started = times["launched_t"]
            self.results["rank_failure"] = {
                "killed_rank": c["victim"] - c["old_ids"][0],
                "aborted_after_s": _r(aborted - t_kill) if aborted else None,
                "new_group_started_after_s": _r(started - t_kill),
                "survivors_exited_after_s": _r(ended - t_kill),
                "survivors_exited_peer_lost": peer_lost,
                "survivors": len(survivors),
                "new_group_imported_after_s": _r(started + times["warm_s"] - t_kill),
                "new_group_joined_after_s": _r(started + times["joined_s"] - t_kill),
                "new_group_ready_after_s": _r(started + times["ready_s"] - t_kill),
                "new_group_first_round_after_s": _r(started + times["first_round_s"] - t_kill),
                "new_group": times,
            }
            self.log(f"rank failure: {self.results['rank_failure']}")
            self._sub = "ckpt"
        if self._sub == "ckpt" and self._ready_and_checkpointed(g):
            self._next()

    # c. resize N -> 3N/4
    def _resize(self, m: JobMaster, g: Any) -> None:
        c = self._ctx
        if self._sub == "start":
            pids = self._pids(m, g)
            c.update(old=g.gid, old_ids=list(g.node_ids), old_first=g.first_node_id, pids=pids)
            self.procs.watch(list(pids.values()))
            c["t_req"] = time.time()
            m.apply(plan(self.resize_to, f"resize to {self.resize_to}"))
            self.log(f"resize {g.world_size} -> {self.resize_to} requested")
            self._sub = "wait"
            return
        if self._sub == "wait":
            if g.gid == c["old"] or m.changing():
                return
            times = self._group_times(g, m)
            ended = self.procs.end_of(list(c["pids"].values()))
            tail = self.tail
            tail.poll(c["old_ids"])
            stop_seen = tail.t(c["old_first"], "stop_seen")
            if times is None or ended is None or stop_seen is None:
                return
            t_req = c["t_req"]
            warm = tail.all_t(g.node_ids, "warm")
            final = tail.after(c["old_first"], "checkpoint", stop_seen)
            ready0 = tail.t(g.first_node_id, "ready")
            first0 = tail.t(g.first_node_id, "first_round")
            ar = m.strategy
            assert isinstance(ar, AllReduceStrategy) and warm and ready0 and first0
            self.results["resize"] = {
                "from": len(c["old_ids"]),
                "to": g.world_size,
                "new_all_warm_after_s": _r(max(warm) - t_req),
                "prewarm_wait_s": _r(ar.resize_prewarm_s[-1]) if ar.resize_prewarm_s else None,
                "old_stop_seen_after_s": _r(stop_seen - t_req),
                "old_final_checkpoint_s": _r(final["t"] - stop_seen) if final else None,
                "old_exited_after_s": _r(ended - t_req),
                "new_joined_after_s": _r(times["launched_t"] + times["joined_s"] - t_req),
                "new_ready_after_s": _r(times["launched_t"] + times["ready_s"] - t_req),
                "new_first_round_after_s": _r(times["launched_t"] + times["first_round_s"] - t_req),
                "downtime_s": _r(ready0 - stop_seen),
                "downtime_to_first_round_s": _r(first0 - stop_seen),
                "master_downtime_s": _r(ar.resize_downtimes_s[-1])
                if ar.resize_downtimes_s
                else None,
                "rendezvous_s": times["rendezvous_s"],
                "new_group": times,
            }
            self.log(f"resize: {self.results['resize']}")
            self._sub = "ckpt"
        if self._sub == "ckpt" and self._ready_and_checkpointed(g):
            self._next()

    # d. a rank SIGSTOPped
    def _hang(self, m: JobMaster, g: Any) -> None:
        c = self._ctx
        if self._sub == "start":
            self._signal_middle_rank(m, g, signal.SIGSTOP, "t_stop")
            return
        if self._sub == "recover":
            if g.gid == c["old"]:
                return
            times = self._group_times(g, m)
            ended = self.procs.end_of(list(c["pids"].values()))
            if times is None or ended is None:
                return
            t0 = c["t_stop"]
            victim_end = self.procs.ended.get(c["pids"][c["victim"]])
            faults = [f for f in m.st.faults if f.get("group") == c["old"]]
            aborted = self._fault_t(m, c["old"])
            self.results["hung_rank"] = {
                "stopped_rank": c["victim"] - c["old_ids"][0],
                "dead_after_s": m.spec.pacing.dead_after_s,
                "victim_killed_after_s": _r(victim_end - t0) if victim_end else None,
                "aborted_after_s": _r(aborted - t0) if aborted else None,
                "new_group_started_after_s": _r(times["launched_t"] - t0),
                "why": faults[0].get("why") if faults else None,
                "all_exited_after_s": _r(ended - t0),
                "new_group_ready_after_s": _r(times["launched_t"] + times["ready_s"] - t0),
                "new_group_first_round_after_s": _r(
                    times["launched_t"] + times["first_round_s"] - t0
                ),
                "new_group": times,
            }
            self.log(f"hung rank: {self.results['hung_rank']}")
            self._sub = "ckpt"
        if self._sub == "ckpt" and self._ready_and_checkpointed(g):
            self._next()

    # the end: lift the load rate, the job finishes its shards
    def _finish(self, m: JobMaster, g: Any) -> None:
        if self._sub == "start":
            (m.run_dir / RATE_FILE).write_text("0")
            self._ctx["t"] = time.time()
            self._sub = "wait"

    def close(self) -> None:
        self.procs.close()


def _final_rows_seen(run_dir: Path) -> tuple[int | None, dict[str, Any] | None]:
    """``rows_seen`` of the latest complete checkpoint (one process, DCP) and its meta."""
    import torch
    import torch.distributed.checkpoint as dcp

    from dlrover_core.runtime.strategies.allreduce.checkpoint import CheckpointStore

    latest = CheckpointStore(run_dir / CKPT_DIR).latest()
    if latest is None:
        return None, None
    sd = {"model": {"rows_seen": torch.zeros(1, dtype=torch.int64)}}
    dcp.load(sd, checkpoint_id=str(latest.path), no_dist=True)
    meta = {
        "seq": latest.meta.seq,
        "generation": latest.meta.generation,
        "world_size": latest.meta.world_size,
        "samples": latest.meta.samples,
        "final": latest.meta.final,
        "job_done": latest.meta.job_done,
    }
    return int(sd["model"]["rows_seen"].item()), meta


def _children() -> set[int]:
    """Live child processes of this one (all generations)."""
    out = set()
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() != psutil.STATUS_ZOMBIE:
                out.add(c.pid)
        except psutil.Error:
            continue
    return out


def _left_processes(
    run_dir: Path, within_s: float = 15.0, before: frozenset[int] = frozenset()
) -> list[int]:
    """Live children of this process, and any process naming ``run_dir`` (ranks), waited for
    up to ``within_s``. ``before``: children that lived before the job started (in a test
    run, e.g. multiprocessing's resource tracker from an earlier test): not the job's."""
    key = str(run_dir)
    me = psutil.Process()
    mine = {me.pid, *(a.pid for a in me.parents()), *before}  # not started by the job
    deadline = time.monotonic() + within_s
    while True:
        left = set()
        left = _children() - mine
        for p in psutil.process_iter(["cmdline", "status"]):
            try:
                if (
                    p.pid not in mine
                    and p.info["status"] != psutil.STATUS_ZOMBIE
                    and any(key in a for a in (p.info["cmdline"] or []))
                ):
                    left.add(p.pid)
            except psutil.Error:
                continue
        if not left or time.monotonic() > deadline:
            return sorted(left)
        time.sleep(0.2)


def run_bench(
    run_dir: Path,
    ranks: int,
    *,
    resize_to: int | None = None,
    shards_per_rank: int = 60,
    rows_per_s: float = 1280.0,
    heartbeat_s: float = 2.0,
    dead_after_s: float = 120.0,
    pending_timeout_s: float = 900.0,
    checkpoint_s: float = 10.0,
    hang: bool = False,
    phase_timeout_s: float = 900.0,
    min_free_mib: float = 1500.0,
    rank_teardown: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the scenarios once (module docstring); returns the figures and the checks."""
    resize_to = resize_to if resize_to is not None else max(1, (3 * ranks) // 4)
    shards = shards_per_rank * ranks
    before = frozenset(_children())  # not the job's (e.g. an earlier test's helpers)
    spec = make_spec(
        ranks,
        shards,
        heartbeat_s=heartbeat_s,
        dead_after_s=dead_after_s,
        pending_timeout_s=pending_timeout_s,
        checkpoint_s=checkpoint_s,
    )
    drv = Driver(
        run_dir,
        ranks,
        resize_to,
        hang=hang,
        rows_per_s=rows_per_s,
        phase_timeout_s=phase_timeout_s,
        min_free_mib=min_free_mib,
        log=log,
    )
    mem = MemWatch()
    mem.start()
    strategy = AllReduceStrategy.for_run(run_dir, spec=spec, warm_wait_s=600.0)
    m = JobMaster(
        spec,
        run_dir,
        TimedBackend(),
        plan=plan(ranks, f"{ranks} ranks"),
        strategy=strategy,
        node_command=lambda: [
            sys.executable,
            str(LOAD_RANK),
            "--rows-per-s",
            str(rows_per_s),
            *(["--teardown"] if rank_teardown else []),
        ],
        on_tick=drv.on_tick,
        replan=False,
    )
    load0 = os.getloadavg()
    t0 = time.monotonic()
    log(f"[{time.strftime('%H:%M:%S')}] {ranks} ranks, {shards} shards of {SHARD_ROWS} rows")
    try:
        report = m.run()
    finally:
        drv.close()
        mem.close()
    wall = time.monotonic() - t0
    left = _left_processes(run_dir, before=before)
    rows_seen, final = _final_rows_seen(run_dir)
    r = report
    exactly_once = bool(
        r.get("state") == "succeeded"
        and r["shards_done"] == r["shards_total"]
        and r["shards_completed_twice"] == 0
        and r["shards_lost"] == 0
        and r["samples_done"] == r["samples_total"]
    )
    rows = spec.data.rows
    out: dict[str, Any] = {
        "ranks": ranks,
        "resize_to": resize_to,
        "pacing": {
            "heartbeat_interval_s": heartbeat_s,
            "dead_after_s": dead_after_s,
            "pending_timeout_s": pending_timeout_s,
            "checkpoint_interval_s": checkpoint_s,
            "resize_warm_wait_s": 600.0,
        },
        "load": {
            "rows_per_s_per_rank": rows_per_s,
            "shards": shards,
            "shard_rows": SHARD_ROWS,
            "rank_teardown": rank_teardown,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "loadavg_before": list(load0),
            "loadavg_after": list(os.getloadavg()),
        },
        "scenarios": drv.results,
        "failure": drv.failure,
        "slowed": drv.slowed,
        "report": {
            k: r.get(k)
            for k in (
                "state",
                "failure",
                "shards_total",
                "shards_done",
                "shards_completed_twice",
                "shards_lost",
                "shards_replayed",
                "samples_done",
                "samples_total",
                "resize_downtimes_s",
                "resize_prewarm_s",
            )
        },
        "faults": [
            {k: f.get(k) for k in ("node", "group", "exit_code", "signal", "action", "why")}
            for f in r.get("faults", [])
        ],
        "exactly_once": exactly_once,
        "final_checkpoint": final,
        "final_rows_seen": rows_seen,
        "rows": rows,
        "checkpoint_holds_every_row_once": rows_seen == rows,
        "left_processes": left,
        "memory": {
            "min_available_mib": round(mem.min_available_mib),
            "max_used_over_start_mib": round(mem.max_used_mib - mem.used0_mib),
            "max_tree_rss_mib": round(mem.max_tree_rss_mib),
            "max_processes": mem.max_ranks,
        },
        "wall_s": round(wall, 1),
    }
    f = out["scenarios"].get("rank_failure")
    if f:
        for k in ("new_group_ready_after_s", "new_group_first_round_after_s"):
            f[k.replace("_after_s", "_over_dead_after")] = round(f[k] / dead_after_s, 3)
    return out


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def summary(out: dict[str, Any]) -> str:
    sc = out["scenarios"]
    rows: list[list[Any]] = []
    a = sc.get("first_rendezvous")
    if a:
        note = (
            f"imports done {_f(a['warm_s'], 1)} s, last registered {_f(a['registered_s'], 1)} s, "
            f"rendezvous {_f(a['rendezvous_s'])} s"
        )
        rows.append(["first rendezvous", "launch", a["joined_s"], a["ready_s"],
                     a["first_round_s"], note])  # fmt: skip
    b = sc.get("rank_failure")
    if b:
        note = (
            f"aborted {_f(b['aborted_after_s'])} s, survivors gone "
            f"{_f(b['survivors_exited_after_s'])} s, new ranks imported "
            f"{_f(b['new_group_imported_after_s'], 1)} s; ready = "
            f"{_f(b['new_group_ready_over_dead_after'])} x dead_after_s"
        )
        rows.append(["rank SIGKILLed", "kill", b["new_group_joined_after_s"],
                     b["new_group_ready_after_s"], b["new_group_first_round_after_s"],
                     note])  # fmt: skip
    d = sc.get("hung_rank")
    if d:
        note = (
            f"killed by the master after {_f(d['victim_killed_after_s'], 1)} s "
            f"(dead_after_s {d['dead_after_s']:g}): {d['why']}"
        )
        rows.append(["rank SIGSTOPped", "stop", None, d["new_group_ready_after_s"],
                     d["new_group_first_round_after_s"], note])  # fmt: skip
    c = sc.get("resize")
    if c:
        note = (
            f"downtime {_f(c['downtime_s'])} s (to first round "
            f"{_f(c['downtime_to_first_round_s'])}, master's {_f(c['master_downtime_s'])}), "
            f"pre-warm {_f(c['prewarm_wait_s'], 1)} s"
        )
        rows.append([f"resize {c['from']} -> {c['to']}", "request", c["new_joined_after_s"],
                     c["new_ready_after_s"], c["new_first_round_after_s"], note])  # fmt: skip
    t = table(
        [[x if x is not None else "-" for x in r] for r in rows],
        ["scenario", "from", "all joined s", "all ready s", "first round s", "notes"],
    )
    mem, rep = out["memory"], out["report"]
    return (
        f"{t}\n{out['ranks']} ranks, dead_after_s {out['pacing']['dead_after_s']:g}; job "
        f"{rep['state']}; exactly once: {out['exactly_once']} (shards {rep['shards_done']}/"
        f"{rep['shards_total']}, twice {rep['shards_completed_twice']}, lost "
        f"{rep['shards_lost']}); final checkpoint rows {out['final_rows_seen']}/{out['rows']}; "
        f"processes left: {out['left_processes'] or 'none'}; peak {mem['max_processes']} rank "
        f"processes, {mem['max_used_over_start_mib']} MiB used over the start, min available "
        f"{mem['min_available_mib']} MiB; wall {out['wall_s']:.0f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--resize-to", type=int, default=None, help="default 3/4 of --ranks")
    ap.add_argument("--shards-per-rank", type=int, default=60)
    ap.add_argument("--rows-per-s", type=float, default=1280.0, help="per rank, while measuring")
    ap.add_argument("--heartbeat-s", type=float, default=2.0)
    ap.add_argument("--dead-after-s", type=float, default=120.0)
    ap.add_argument("--hang", action="store_true", help="also SIGSTOP a rank")
    ap.add_argument("--min-free-mib", type=float, default=1500.0)
    ap.add_argument(
        "--rank-teardown",
        action="store_true",
        help="ranks end through the interpreter's teardown, as before 98824ba (production "
        "ranks now os._exit once their work is written: node.exit_process)",
    )
    ap.add_argument("--run-dir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument(
        "--json", default=None, help="e.g. benchmarks/results/allreduce_rendezvous_64.json"
    )
    a = ap.parse_args()
    from dlrover_core.logs import quiet_third_party

    quiet_third_party()
    with tempfile.TemporaryDirectory() as tmp:
        out = run_bench(
            a.run_dir or Path(tmp) / "run",
            a.ranks,
            resize_to=a.resize_to,
            shards_per_rank=a.shards_per_rank,
            rows_per_s=a.rows_per_s,
            heartbeat_s=a.heartbeat_s,
            dead_after_s=a.dead_after_s,
            hang=a.hang,
            min_free_mib=a.min_free_mib,
            rank_teardown=a.rank_teardown,
        )
    out["command"] = " ".join(sys.argv)
    print(summary(out))
    write_json(a.json, out)


if __name__ == "__main__":
    main()
