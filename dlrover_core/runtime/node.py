"""``dlrover-rm node ps|worker|rank ...``: the one command every backend runs for a node.

The arguments (and the backend's environment: identity, bind and advertised host) describe the
node completely; see :mod:`dlrover_core.runtime.strategies.ps.server` and
:mod:`dlrover_core.runtime.strategies.ps.worker` for each role's arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

ROLES = ("ps", "worker", "rank")
USAGE = """usage: dlrover-rm node {ps|worker|rank} ARGS...

Run one node of a job. The job master (local processes or Kubernetes pods) starts these; a
user does not. Roles:
  ps      one parameter server shard of the PS strategy
  worker  one worker of the PS strategy
  rank    one rank of an all-reduce (torchrec DistributedModelParallel) group

`dlrover-rm node ROLE --help` lists a role's arguments."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not args or args[0] not in ROLES:
        print(
            f"usage: dlrover-rm node {{{'|'.join(ROLES)}}} ARGS... (got {args[:1] or 'nothing'})",
            file=sys.stderr,
        )
        return 2
    role, rest = args[0], args[1:]
    from dlrover_core.runtime import state_url

    url = state_url.url_from_env()
    if url is not None:  # no shared volume: the run directory comes from the state URL
        return _with_state_url(role, rest, url)
    return _run(role, rest)


def _run(role: str, rest: list[str]) -> int:
    if role == "ps":
        from dlrover_core.runtime.strategies.ps.server import main as ps_main

        return ps_main(rest)
    if role == "rank":  # one rank of an all-reduce group
        from dlrover_core.runtime.strategies.allreduce.agent import main as rank_main

        return rank_main(rest)
    from dlrover_core.runtime.strategies.ps.worker import main as worker_main

    return worker_main(rest)


def _with_state_url(role: str, rest: list[str], url: str) -> int:
    """A node whose pod shares no volume with the master (``backend.state_url``, no claim):
    its run directory is scratch. Before it starts: the job token from the Secret (env), the
    master's ``spec.json`` from the URL (waited for), and, for a PS, its own checkpoint
    directory (a relaunch) and the old set's (a re-shard). After a PS ends (its final
    checkpoint is written on SIGTERM): its directory back to the URL."""
    import argparse
    import os
    import time

    from dlrover_core.errors import DLRoverError
    from dlrover_core.runtime import state_url as su

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--run-dir", default="")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--restore-from", default="")
    p.add_argument("--checkpoint-every-s", type=float, default=30.0)
    a, _ = p.parse_known_args(rest)
    mount = os.environ.get(su.ENV_STATE_MOUNT, su.DEFAULT_MOUNT)

    def remote(d: str) -> str | None:
        k = su.state_key(d, mount)
        return None if k is None else su.join(url, k)

    def fail(msg: str) -> int:
        print(f"{role}: {msg}", file=sys.stderr)
        return 1

    rd_url = remote(a.run_dir) if a.run_dir else None
    if rd_url is None:
        return fail(f"--run-dir {a.run_dir!r} is not under {mount}; the node cannot find the job")
    try:
        token = os.environ.get(su.ENV_TOKEN)
        if token:
            su.write_token(a.run_dir, token)
        deadline = time.monotonic() + 120.0
        while not su.pull_file(su.join(rd_url, "spec.json"), os.path.join(a.run_dir, "spec.json")):
            if time.monotonic() > deadline:
                return fail(f"no spec.json at {rd_url} after 120 s (is the master writing there?)")
            time.sleep(1.0)
        own = a.ckpt_dir or os.path.join(a.run_dir, "ps", f"ps-{a.index}")
        dirs = [own, *(d for d in a.restore_from.split(",") if d)] if role == "ps" else []
        for d in dirs:
            r = remote(d)
            if r is not None:
                su.pull_tree(r, d)
    except (DLRoverError, OSError) as e:
        return fail(f"cannot read the job's state at {url}: {e}")
    if role != "ps":
        return _run(role, rest)
    r = remote(own)
    if r is None:
        return fail(f"{own} is not under {mount}: its checkpoints stay in this pod")
    pusher = _Pusher(own, r, a.checkpoint_every_s)
    pusher.start()
    try:
        rc = _run(role, rest)
    finally:
        pusher.stop()
    try:
        n = su.push_tree(own, r, mirror=True)
    except (DLRoverError, OSError) as e:
        return fail(f"cannot write the checkpoints to {r}: {e}")
    print(f"ps: {n} checkpoint file(s) written to {r}", file=sys.stderr)
    return rc


class _Pusher:
    """Pushes a PS's checkpoint directory to the state URL every ``every_s`` while it runs,
    so a PS that dies without its final checkpoint (OOM-killed) is relaunched from the last
    periodic one, not from nothing. A failed push is retried on the next round."""

    def __init__(self, local: str, url: str, every_s: float) -> None:
        import threading

        self.local, self.url, self.every_s = local, url, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="state-url-push", daemon=True)
        self.pushes = 0
        self.errors: list[str] = []

    def start(self) -> None:
        if self.every_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        from dlrover_core.errors import DLRoverError
        from dlrover_core.runtime import state_url as su

        while not self._stop.wait(self.every_s):
            try:
                su.push_tree(self.local, self.url, mirror=True)
                self.pushes += 1
            except (DLRoverError, OSError) as e:  # a checkpoint pruned mid-copy, an outage
                if not self.errors:
                    print(
                        f"ps: pushing checkpoints to {self.url} failed ({e}); retrying",
                        file=sys.stderr,
                    )
                self.errors.append(str(e))


def exit_process(role: str, code: int) -> None:
    """End a node's process with ``code``. A rank skips the interpreter's teardown (its
    garbage collection over torch's objects costs ~0.5 s of CPU): a group of many ranks
    sharing few cores paid it all at once, just as the next group started (measured by
    ``benchmarks/allreduce_rendezvous_scale.py``: a 64 -> 16 resize's downtime 37.7 s with
    it, 4.0 s without). Its work is done and written by then (final checkpoint, reports,
    the state URL's upload); output is flushed first."""
    if role == "rank":
        import logging
        import os

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _argv = sys.argv[1:]
    exit_process(_argv[0] if _argv else "", main(_argv))
