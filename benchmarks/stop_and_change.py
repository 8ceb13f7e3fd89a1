"""How fast a job stops cleanly, and how fast a changed input fails it (issues 35 and 36).

For each repetition, real `dlrover-rm train` processes on this machine:
- **clean stop**: a PS job (and an all-reduce job) gets SIGTERM a third of the way in; the
  time from the signal to the master's exit, what the stop kept (``stop_flush``), and whether
  the resume replayed anything or reported a fault;
- **changed input**: a Criteo TSV is replaced, mid-run, by another export; the time from the
  replacement to the master's exit (failed, ``data.changed``).

    .venv/bin/python benchmarks/stop_and_change.py --reps 3 \
        --json benchmarks/results/stop_and_change.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dlrover_core.spec import load_spec, read_spec_file  # noqa: E402
from dlrover_core.training.data import drifting_day, file_spec, write_criteo_tsv  # noqa: E402

SPECS = {
    "ps": ROOT / "pipelines/specs/small.yaml",
    "allreduce": ROOT / "pipelines/specs/small-allreduce.yaml",
}


def samples_done(run: Path) -> int:
    try:
        lines = (run / "timeline.jsonl").read_text().splitlines()
    except OSError:
        return 0
    for ln in reversed(lines):
        try:
            return int(json.loads(ln)["samples_done"])
        except (ValueError, KeyError):
            continue
    return 0


def start(spec: Path | dict[str, Any], run: Path, tmp: Path, *sets: str) -> subprocess.Popen[bytes]:
    if isinstance(spec, dict):
        p = tmp / f"spec-{run.name}.json"
        p.write_text(json.dumps(spec))
        spec = p
    cmd = [sys.executable, "-m", "dlrover_core.cli", "train", "--spec", str(spec)]
    cmd += ["--run-dir", str(run), "--history", "none"]
    for s in ("pacing.heartbeat_interval_s=0.5", *sets):
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def wait_samples(p: subprocess.Popen[bytes], run: Path, n: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while samples_done(run) < n:
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{run}: the job ended or stalled before {n:,} samples")
        time.sleep(0.1)


def clean_stop(kind: str, tmp: Path, rows: int) -> dict[str, Any]:
    run = tmp / f"stop-{kind}-{time.monotonic_ns()}"
    p = start(SPECS[kind], run, tmp, f"data.rows={rows}")
    wait_samples(p, run, rows // 3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    stop_s = time.monotonic() - t0
    r = json.loads((run / "report.json").read_text())
    q = start(SPECS[kind], run, tmp, f"data.rows={rows}")
    rc = q.wait(timeout=600)
    r2 = json.loads((run / "report.json").read_text())
    return {
        "strategy": kind,
        "stop_s": round(stop_s, 2),
        "flush_s": (r.get("stop_flush") or {}).get("s"),
        "flush": (r.get("stop_flush") or {}).get("result"),
        "resume_rc": rc,
        "replayed": r2.get("shards_replayed"),
        "faults": len(r2.get("faults") or []),
        "twice": r2.get("shards_completed_twice"),
    }


def changed_input(tmp: Path, rows: int) -> dict[str, Any]:
    spec = load_spec(SPECS["ps"])
    a, b = tmp / "a.tsv", tmp / "b.tsv"
    if not a.exists():
        write_criteo_tsv(a, drifting_day(spec, 0, rows, 2000))
        write_criteo_tsv(b, drifting_day(spec, 5, rows * 3 // 4, 2000))
    data = tmp / f"input-{time.monotonic_ns()}.tsv"
    data.write_bytes(a.read_bytes())
    run = tmp / f"change-{data.stem}"
    p = start(file_spec(read_spec_file(SPECS["ps"]), data, rows - 10_000, 2000), run, tmp)
    wait_samples(p, run, 20_000)
    new = data.with_name(data.name + ".new")
    new.write_bytes(b.read_bytes())
    t0 = time.monotonic()
    os.replace(new, data)
    rc = p.wait(timeout=300)
    took = time.monotonic() - t0
    r = json.loads((run / "report.json").read_text())
    return {"rc": rc, "change_to_exit_s": round(took, 2), "state": r["state"],
            "changed": (r.get("data") or {}).get("changed")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each case (default 3)")
    ap.add_argument("--rows", type=int, default=300_000, help="rows of each job (default 300000)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    if a.reps < 1 or a.rows < 60_000:
        ap.error("--reps >= 1 and --rows >= 60000")
    out: dict[str, Any] = {"args": vars(a), "stops": [], "changes": []}
    with tempfile.TemporaryDirectory(prefix="dlrover-rm-stop-") as t:
        tmp = Path(t)
        for _ in range(a.reps):
            for kind in SPECS:
                out["stops"].append(clean_stop(kind, tmp, a.rows))
                print(json.dumps(out["stops"][-1]))
            out["changes"].append(changed_input(tmp, a.rows))
            print(json.dumps(out["changes"][-1]))
    for kind in SPECS:
        s = [x["stop_s"] for x in out["stops"] if x["strategy"] == kind]
        replayed = sum(x["replayed"] or 0 for x in out["stops"] if x["strategy"] == kind)
        print(
            f"clean stop ({kind}): median {statistics.median(s):.1f} s, max {max(s):.1f} s "
            f"(target 30 s); shards replayed after the resumes: {replayed}"
        )
    c = [x["change_to_exit_s"] for x in out["changes"]]
    print(f"input replaced -> job failed: median {statistics.median(c):.1f} s, max {max(c):.1f} s")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
