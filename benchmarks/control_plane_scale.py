"""The control plane at cluster scale (issue 34): a real job master (``MasterState`` served by
``serve_master``, in its own process) under load nodes that speak its protocol without
training (``dlrover_core.runtime.loadgen``), then failure storms.

Phases, each measured:

1. launch: the master writes ahead every node's launch (two records per node, as the
   controller does); nodes register (PS first).
2. steady: ``--seconds`` of heartbeats every ``--heartbeat-s``, shards of ``--shard-s``,
   metrics every 5 s. The master's CPU (cores) and RSS from psutil on its pid; round trips per
   method at the nodes (p50/p99); the master's own handler times; the largest heartbeat age it
   saw; its dead verdicts (the default policy, and a strict one of 3 intervals).
3. worker storm: ``--kill-workers`` workers SIGKILLed at once (their shards in flight stay
   with them), the master relaunches them (new incarnations): every shard they held is
   re-queued exactly once; time until every replacement is registered.
4. PS storm: ``--kill-ps`` PS killed at once and relaunched; their restore lost the last
   ``--lost-completions`` completions, re-queued (each exactly once); time to re-register.
5. master kill: the master SIGKILLed with every node attached, restarted on the same run
   directory and port: its restore time, and the time until every node re-registered with the
   new master; the nodes keep their shards.
6. end: exactly-once figures of the shard queue (no shard lost, none completed twice).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/control_plane_scale.py --nodes 1000 --ps 64 \
        --seconds 60 --json benchmarks/results/control_plane_scale.json

``--k8s-pods N`` adds the Kubernetes backend's figures (``benchmarks/k8s_scale.py``: N pods
on the kmock stand-in, watch costs, 429s) and ``--ranks N`` the all-reduce rendezvous
(``benchmarks/allreduce_rendezvous_scale.py``: N load ranks, a kill, a hang-free resize) to
the same report; each also runs alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dlrover_core.runtime.loadgen import LoadFleet, MasterProcess, summarize_ms  # noqa: E402
from dlrover_core.types import Role  # noqa: E402


class Sampler(threading.Thread):
    """CPU seconds and RSS of one process, sampled every ``every_s``."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.p = psutil.Process(pid)
        self.every_s = every_s
        self.samples: list[tuple[float, float, int]] = []  # (mono, cpu s, rss bytes)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                t = self.p.cpu_times()
                self.samples.append((time.monotonic(), t.user + t.system, self.p.memory_info().rss))
            except psutil.Error:
                return
            self.done.wait(self.every_s)

    def window(self, start: float, end: float) -> dict[str, float]:
        s = [x for x in self.samples if start <= x[0] <= end]
        if len(s) < 2:
            return {"cpu_cores": math.nan, "rss_mib_max": math.nan}
        return {
            "cpu_cores": (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0]),
            "cpu_cores_peak_1s": max(
                (b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(s, s[2:], strict=False) if b[0] > a[0]
            )
            if len(s) > 2
            else math.nan,
            "rss_mib_max": max(x[2] for x in s) / 2**20,
        }


def _wait(cond: Any, timeout_s: float, every_s: float = 0.05) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():
            return time.monotonic() - t0
        time.sleep(every_s)
    return None


def run_scale(
    run_dir: Path,
    *,
    workers: int = 1000,
    ps: int = 64,
    seconds: float = 60.0,
    heartbeat_s: float = 15.0,
    shard_s: float = 5.0,
    kill_workers: int = 200,
    kill_ps: int = 8,
    lost_completions: int = 100,
    seed: int = 0,
    profile: bool = False,
    storms: bool = True,
    launch_batch: int = 50,
    log: Any = print,
) -> dict[str, Any]:
    """Every phase of the module docstring; returns the figures (JSON-able)."""
    shard_size = 1000
    # enough shards for the whole run: every worker takes one per shard_s
    total_rows = shard_size * max(10_000, int(workers * (seconds + 120) / shard_s * 2))
    out: dict[str, Any] = {
        "config": {
            "workers": workers,
            "ps": ps,
            "seconds": seconds,
            "heartbeat_s": heartbeat_s,
            "shard_s": shard_s,
            "kill_workers": kill_workers,
            "kill_ps": kill_ps,
            "seed": seed,
            "cpus": os.cpu_count(),
            "launch_batch": launch_batch,
        },
        "loadavg_start": os.getloadavg(),
    }
    me = psutil.Process()
    master = MasterProcess(run_dir, total_rows=total_rows, shard_size=shard_size,
                           heartbeat_s=heartbeat_s, profile=profile)  # fmt: skip
    sampler = Sampler(master.pid)
    sampler.start()
    fleet = LoadFleet(master.address, master.token, heartbeat_s=heartbeat_s, shard_s=shard_s,
                      seed=seed)  # fmt: skip
    try:
        # 1. launch
        w_ids, p_ids = list(range(workers)), list(range(ps))
        a = master.ask("launch", role="ps", ids=p_ids, batch=launch_batch)
        b = master.ask("launch", role="worker", ids=w_ids, batch=launch_batch)
        out["launch_write_ahead_s"] = {"ps": a["seconds"], "workers": b["seconds"],
                                       "per_node_ms": 1e3 * (a["seconds"] + b["seconds"])
                                       / max(1, workers + ps)}  # fmt: skip
        t0 = time.monotonic()
        nodes = fleet.start(Role.PS, p_ids) + fleet.start(Role.WORKER, w_ids)
        reg_s = fleet.wait_registered(nodes, 300.0)
        out["register_all_s"] = reg_s
        reg_lat = fleet.lat.window(t0).get("Register", [])
        out["register_rtt"] = summarize_ms(reg_lat)
        log(f"launch: write-ahead {out['launch_write_ahead_s']}; all registered in {reg_s} s")

        # 2. steady
        time.sleep(min(5.0, heartbeat_s))
        master.ask("reset")
        me.cpu_percent()
        s0 = time.monotonic()
        time.sleep(seconds)
        s1 = time.monotonic()
        st = master.ask("stats")
        lat = fleet.lat.window(s0, s1)
        hb_late = [d for n in nodes for t, d in n.hb_late_s if s0 <= t < s1]
        out["steady"] = {
            "window_s": s1 - s0,
            "loadavg": os.getloadavg(),
            "master": sampler.window(s0, s1),
            "load_process_cpu_cores": me.cpu_percent() / 100.0,
            "rtt": {m: summarize_ms(v) for m, v in sorted(lat.items())},
            "rpc_per_s": sum(len(v) for v in lat.values()) / (s1 - s0),
            "handler": st["handlers"],
            "tick": st["monitor"]["tick"],
            "max_heartbeat_age_s": st["monitor"]["max_heartbeat_age_s"],
            "heartbeat_late_at_node": summarize_ms(hb_late),
            "dead_verdicts": len(st["monitor"]["dead"]),
            "dead_verdicts_strict": len(st["monitor"]["dead_strict"]),
            "registered": st["registered"],
            "errors": dict(fleet.lat.errors),
        }
        log(f"steady: {json.dumps(out['steady'])}")
        if profile:
            out["profile"] = master.ask("profile", limit=40)["text"]
        if not storms:
            return out

        # 3. worker storm
        rng = __import__("random").Random(seed)
        victims = sorted(rng.sample(w_ids, min(kill_workers, workers)))
        held = {i: fleet.nodes[(Role.WORKER, i)].holding for i in victims}
        fleet.kill(Role.WORKER, victims)
        time.sleep(0.2)  # the killed nodes' last calls are done
        before = master.ask("stats")
        doing_before = {int(k): v for k, v in before["doing_by_worker"].items()}
        expected = sorted(s for i in victims for s in doing_before.get(i, []))
        fail_before = before["failures_hist"]
        w0 = time.monotonic()
        r = master.ask("relaunch", role="worker", ids=victims, batch=launch_batch)
        new = fleet.start(Role.WORKER, victims, incarnation=1)
        back = fleet.wait_registered(new, 120.0)
        after = master.ask("stats")
        fail_after = after["failures_hist"]
        refail = int(fail_after.get("1", 0)) - int(fail_before.get("1", 0))
        out["worker_storm"] = {
            "killed": len(victims),
            "held_at_kill": sum(h is not None for h in held.values()),
            "doing_at_master": len(expected),
            "requeued": len(r["released"]),
            "requeued_exactly_once": sorted(r["released"]) == expected
            and len(set(r["released"])) == len(r["released"])
            and refail == len(expected),
            "relaunch_write_ahead_s": r["seconds"],
            "all_replacements_registered_s": back,
            "back_at_full_strength_s": None if back is None else time.monotonic() - w0,
            "loadavg": os.getloadavg(),
        }
        log(f"worker storm: {json.dumps(out['worker_storm'])}")

        # 4. PS storm
        p_victims = sorted(rng.sample(p_ids, min(kill_ps, ps)))
        fleet.kill(Role.PS, p_victims)
        seq = int(after["done_seq"])
        p0 = time.monotonic()
        pr = master.ask("relaunch", role="ps", ids=p_victims, batch=launch_batch)
        rq = master.ask("requeue_after", seq=max(0, seq - lost_completions))
        pnew = fleet.start(Role.PS, p_victims, incarnation=1)
        pback = fleet.wait_registered(pnew, 120.0)
        st = master.ask("stats")
        reps = st["replays_per_shard"]
        out["ps_storm"] = {
            "killed": len(p_victims),
            "relaunch_write_ahead_s": pr["seconds"],
            "requeued_after_restore": len(rq["ids"]),
            "requeue_s": rq["seconds"],
            # every shard done after the restored tag (at least the lost completions; more
            # finish while this runs), each re-queued once
            "requeued_exactly_once": len(rq["ids"]) >= lost_completions
            and len(set(rq["ids"])) == len(rq["ids"])
            and all(int(reps[str(s)]) == 1 for s in rq["ids"]),
            "all_replacements_registered_s": pback,
            "back_at_full_strength_s": None if pback is None else time.monotonic() - p0,
            "loadavg": os.getloadavg(),
        }
        log(f"PS storm: {json.dumps(out['ps_storm'])}")

        # 5. master kill with every node attached
        time.sleep(2.0)
        sampler.done.set()
        live = [n for n in fleet.nodes.values() if n.is_alive()]
        fail_before = master.ask("stats")["failures_hist"]
        master.kill()
        k0 = time.monotonic()
        master = MasterProcess(run_dir, total_rows=total_rows, shard_size=shard_size,
                               heartbeat_s=heartbeat_s, port=master.port)  # fmt: skip
        restore_s = time.monotonic() - k0
        sampler = Sampler(master.pid)
        sampler.start()
        new_id = master.master_id
        rereg = _wait(lambda: all(n.client is not None and n.client.master_id == new_id
                                  for n in live if n.is_alive()), 180.0)  # fmt: skip
        alive_after = sum(n.is_alive() for n in live)
        m1 = time.monotonic()
        time.sleep(min(10.0, heartbeat_s))
        st = master.ask("stats")
        lat = fleet.lat.window(k0)
        out["master_kill"] = {
            "nodes_attached": len(live),
            "restored": master.restored,
            "restart_to_serving_s": restore_s,
            "all_reregistered_s": rereg,
            "nodes_alive_after": alive_after,
            # a restart gives no shard back: the failure counts are the same after it
            "shards_kept": st["failures_hist"] == fail_before,
            "rtt_across_restart": {m: summarize_ms(v) for m, v in sorted(lat.items())},
            "master_after": sampler.window(m1, time.monotonic()),
            "errors": dict(fleet.lat.errors),
            "loadavg": os.getloadavg(),
        }
        log(f"master kill: {json.dumps(out['master_kill'])}")

        # 6. end
        fleet.stop_all()
        st = master.ask("stats")
        sh = st["shards"]
        out["exactly_once"] = {
            "lost": sh["lost"],
            "completed_twice": sh["completed_twice"],
            "done": sh["done"],
            "doing_left": sh["doing"],
            "failed": sh["failed"],
            "replayed": sh["replayed"],
        }
        return out
    finally:
        out["loadavg_end"] = os.getloadavg()
        fleet.stop_all(join_s=5.0)
        sampler.done.set()
        master.quit()


def targets(r: dict[str, Any]) -> dict[str, bool]:
    """Issue 34's targets, each True when met."""
    s = r["steady"]
    t = {
        "master_cpu_under_1_core": s["master"]["cpu_cores"] < 1.0,
        "master_rss_under_1_gib": s["master"]["rss_mib_max"] < 1024,
        "get_shard_p99_under_50ms": s["rtt"]["GetShard"]["p99_ms"] < 50,
        "no_false_dead": s["dead_verdicts"] == 0,
    }
    if "worker_storm" in r:
        t["worker_storm_exactly_once"] = bool(r["worker_storm"]["requeued_exactly_once"])
        back = r["worker_storm"]["back_at_full_strength_s"]
        t["worker_storm_back_within_60s"] = back is not None and back < 60
        t["ps_storm_exactly_once"] = bool(r["ps_storm"]["requeued_exactly_once"])
        rr = r["master_kill"]["all_reregistered_s"]
        t["master_kill_reregistered_within_60s"] = rr is not None and rr < 60
        e = r["exactly_once"]
        t["nothing_lost_or_twice"] = e["lost"] == 0 and e["completed_twice"] == 0
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--nodes", type=int, default=1000, help="workers")
    ap.add_argument("--ps", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0, help="the steady window")
    ap.add_argument("--heartbeat-s", type=float, default=15.0)
    ap.add_argument("--shard-s", type=float, default=5.0, help="simulated time per shard")
    ap.add_argument("--kill-workers", type=int, default=None, help="default: a fifth")
    ap.add_argument("--kill-ps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="cProfile the master's handlers")
    ap.add_argument("--no-storms", action="store_true")
    ap.add_argument("--launch-batch", type=int, default=50,
                    help="launches written ahead per master.json write (0: one per write, as "
                    "the controller does today)")  # fmt: skip
    ap.add_argument("--k8s-pods", type=int, default=0,
                    help="also the Kubernetes backend at this many pods on the kmock stand-in "
                    "(benchmarks/k8s_scale.py; 0: not run)")  # fmt: skip
    ap.add_argument("--ranks", type=int, default=0,
                    help="also the all-reduce rendezvous at this many load ranks "
                    "(benchmarks/allreduce_rendezvous_scale.py; 0: not run)")  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = run_scale(
            Path(tmp) / "run",
            workers=args.nodes,
            ps=args.ps,
            seconds=args.seconds,
            heartbeat_s=args.heartbeat_s,
            shard_s=args.shard_s,
            kill_workers=args.kill_workers if args.kill_workers is not None else args.nodes // 5,
            kill_ps=min(args.kill_ps, args.ps),
            seed=args.seed,
            profile=args.profile,
            storms=not args.no_storms,
            launch_batch=args.launch_batch,
            log=lambda s: print(s, file=sys.stderr, flush=True),
        )
    r["targets"] = targets(r)
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    if args.k8s_pods:  # issue 34 item 3: the same issue's Kubernetes figures, in this report
        from k8s_scale import run_k8s_scale

        exits = max(1, min(100, args.k8s_pods // 4))  # pods per event phase
        r["kubernetes"] = run_k8s_scale(pods=args.k8s_pods, exits=exits, loop_baseline=False)
    if args.ranks:  # issue 34 item 4: the all-reduce rendezvous, kill, hang-free resize
        from allreduce_rendezvous_scale import run_bench

        with tempfile.TemporaryDirectory() as tmp:
            r["rendezvous"] = run_bench(
                Path(tmp) / "run", args.ranks, log=lambda s: print(s, file=sys.stderr)
            )
    if "profile" in r:
        print(r["profile"], file=sys.stderr)
    print(json.dumps({k: v for k, v in r.items() if k != "profile"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
