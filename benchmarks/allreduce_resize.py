"""A resize 1 -> 2 -> 1 ranks during one run of small-allreduce: downtime per resize and
where it goes; exactly once and the AUC at the end.

    python benchmarks/allreduce_resize.py [--rows 300000] [--cold] [--json OUT]

The controller's part is played by LocalGroupHarness (real master service, real rank
processes). A resize: the new generation is started pre-warmed as soon as the old one trains
(``--after-generation``: it imports torch/torchrec and waits), at 10 % (then 40 %) of the
shards done the old one is asked to stop (the master's request_stop),
checkpoints (DCP, final) and exits; the new one joins, plans the sharding for its size and
loads the checkpoint resharded. ``--cold`` starts the new generation only after the old one
exited (what a plain relaunch costs; its "gate" column is then process start + imports).

Downtime = first step of the new generation ("ready" on its rank 0) - last step of the old
one ("stop_seen" on its rank 0: the round after which it stopped). Phases:
checkpoint (old: DCP save + commit + shard reports), exit (old: leave the group and the
process), gate (new: notice the final checkpoint), register (master RPC), join (process group),
build (torchrec planner + DMP), load (DCP load resharded + re-report the checkpoint's shards).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from allreduce_common import event_t, spec_dict, table, write_json

from dlrover_core.allreduce_config import AllReduceOptions
from dlrover_core.runtime.strategies.allreduce.agent import CKPT_DIR
from dlrover_core.runtime.strategies.allreduce.checkpoint import evaluate_checkpoint
from dlrover_core.runtime.strategies.allreduce.launch import LocalGroupHarness, RankProcess


def phases(old: list[RankProcess], new: list[RankProcess]) -> dict[str, float]:
    o, n = old[0], new[0]
    last_exit = max(event_t(rp, "exit") for rp in old)
    last_ckpt = max(e["t"] for e in o.events if e["event"] == "checkpoint")
    p = {
        "checkpoint_s": last_ckpt - event_t(o, "stop_seen"),
        "exit_s": last_exit - last_ckpt,
        "gate_s": max(event_t(rp, "released") for rp in new) - last_exit,
        "register_s": event_t(n, "registered") - event_t(n, "released"),
        "join_s": event_t(n, "joined") - event_t(n, "registered"),
        "build_s": event_t(n, "built") - event_t(n, "joined"),
        "load_s": event_t(n, "ready") - event_t(n, "built"),
    }
    p["downtime_s"] = event_t(n, "ready") - event_t(o, "stop_seen")
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=600_000)
    ap.add_argument("--cold", action="store_true", help="start each new generation after exit")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    d = spec_dict(**{"data.rows": a.rows, "pacing.heartbeat_interval_s": 0.2})
    opts = AllReduceOptions(checkpoint_interval_s=5.0)
    out: dict[str, Any] = {"rows": a.rows, "prewarmed": not a.cold, "resizes": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalGroupHarness(Path(tmp) / "run", d, options=opts) as h,
    ):
        t0 = time.monotonic()
        gens = [h.launch(1)]
        total = h.shards()["total"]
        for size, at in ((2, 0.1), (1, 0.4)):
            if a.cold:
                h.wait_for(lambda at=at: h.shards()["done"] >= at * total, 900, f"{at:.0%} done")
                t_req = time.time()
                h.request_stop(gens[-1])
                h.wait(gens[-1])
                new = h.launch(size)
            else:
                # start the next generation as soon as this one trains: its import overlaps
                # with training, and it joins once this one leaves at its final checkpoint
                old = gens[-1]
                h.wait_for(lambda old=old: old[0].event("ready") is not None, 900, "ready")
                new = h.launch(size, after_previous=True)
                h.wait_for(lambda new=new: all(rp.event("warm") for rp in new), 900, "warm")
                h.wait_for(lambda at=at: h.shards()["done"] >= at * total, 900, f"{at:.0%} done")
                t_req = time.time()
                h.request_stop(old)
                h.wait(old)
            if gens[-1][0].event("stop_seen") is None:
                raise RuntimeError("the job ended before the resize: raise --rows")
            h.wait_for(lambda new=new: new[0].event("ready") is not None, 300, "ready")
            p = phases(gens[-1], new)
            p["from"], p["to"] = len(gens[-1]), size
            p["request_to_stop_s"] = event_t(gens[-1][0], "stop_seen") - t_req
            out["resizes"].append(p)
            gens.append(new)
        codes = h.wait(gens[-1], timeout=900)
        assert codes == [0], codes
        out["wall_s"] = time.monotonic() - t0
        s = h.shards()
        out["shards"] = s
        out["exactly_once"] = bool(
            s["done"] == s["total"] and s["completed_twice"] == 0 and s["todo"] == s["doing"] == 0
        )
        out["auc"], out["logloss"] = evaluate_checkpoint(h.spec, h.run_dir / CKPT_DIR)
    keys = ["checkpoint_s", "exit_s", "gate_s", "register_s", "join_s", "build_s", "load_s"]
    print(
        table(
            [
                [
                    f"{r['from']} -> {r['to']}",
                    r["downtime_s"],
                    *(r[k] for k in keys),
                    r["request_to_stop_s"],
                ]
                for r in out["resizes"]
            ],
            ["resize", "downtime s", *keys, "request->stop s"],
        )
    )
    s = out["shards"]
    print(
        f"exactly once: {out['exactly_once']} (done {s['done']}/{s['total']}, duplicates "
        f"{s['completed_twice']}), AUC {out['auc']:.4f}, wall {out['wall_s']:.1f} s, "
        f"{'pre-warmed' if not a.cold else 'cold'} relaunch"
    )
    write_json(a.json, out)


if __name__ == "__main__":
    main()
