"""A parameter server process: one shard of the embedding tables and of the dense parameters
(:mod:`.store` the rows, :mod:`.shard` the state and its optimizer steps, :mod:`.service` the
``dlrover.PS`` service), its files in the run directory, its restore and its master link.

Run one as a process (normally the controller does, as ``dlrover-rm node ps ...``)::

    python -m dlrover_core.runtime.strategies.ps.server --run-dir DIR --index I --num-ps N
        --master HOST:PORT --incarnation K --generation G [--restore-from DIR1,...]
        [--restore-seq S] [--ckpt-dir D] [--checkpoint-every-s S] [--lr 0.05]

It reads the job token from DIR, restores its state (its own latest checkpoint if one matches
(I, N); else a re-shard of the --restore-from checkpoints, tagged --restore-seq; else empty),
writes a checkpoint of a re-sharded or empty start at once (so a relaunch restores its own),
serves on ``$DLROVER_RM_BIND_HOST`` (default loopback), registers its address
(``$DLROVER_RM_ADVERTISE_HOST``:port) with the master, heartbeats, checkpoints every S seconds
when something changed, and stops (final checkpoint, exit 0) on SIGTERM, when the master says
stop or refuses it as superseded, or when the master has been unreachable for
``--dead-after-s``. Exit 1 means its checkpoints are unusable (a relaunch would not help).
Without ``--master`` (tests, tools) it writes ``--addr-file`` instead of registering.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from dlrover_core.runtime import wire
from dlrover_core.runtime.files import is_disk_full
from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps.service import PSServer
from dlrover_core.runtime.strategies.ps.shard import DEFAULT_LR, PSShard
from dlrover_core.training.carry import ParentTables, parent_path

log = logging.getLogger("dlrover_rm.ps")


def ps_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "ps"


def addr_path(run_dir: str | os.PathLike[str], index: int) -> Path:
    return ps_dir(run_dir) / f"ps-{index}.addr"


def checkpoint_dir(run_dir: str | os.PathLike[str], index: int) -> Path:
    return ps_dir(run_dir) / f"ps-{index}"


def read_addr(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON a PS wrote when it started serving, or None if there is none (yet)."""
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(data), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def restore_shard(
    index: int,
    num_ps: int,
    own_dir: str | os.PathLike[str],
    restore_from: Sequence[str | os.PathLike[str]] = (),
    **shard_kwargs: Any,
) -> tuple[PSShard, ckpt.CheckpointInfo | None, str]:
    """The shard a PS process starts with, and where it came from.

    Its own latest checkpoint wins when it was written by PS (index, num_ps); otherwise the
    state is re-sharded from ``restore_from`` (the old PS set's checkpoint directories);
    otherwise it starts empty. Returns (shard, checkpoint it equals or None, source)."""
    shard, info, source, _ = restore_tagged(index, num_ps, own_dir, restore_from, **shard_kwargs)
    return shard, info, source


def restore_tagged(
    index: int,
    num_ps: int,
    own_dir: str | os.PathLike[str],
    restore_from: Sequence[str | os.PathLike[str]] = (),
    restore_seq: int = 0,
    **shard_kwargs: Any,
) -> tuple[PSShard, ckpt.CheckpointInfo | None, str, int]:
    """:func:`restore_shard` plus the tag of what was restored: the shard ``done_seq`` the
    state includes (own checkpoint: its tag; a re-shard: the smallest tag of its sources, or
    ``restore_seq`` when they carry none; empty: 0, i.e. no shard's updates)."""
    shard = PSShard(index=index, num_ps=num_ps, **shard_kwargs)
    own = ckpt.load_latest(own_dir)
    if own is not None and (own.info.index, own.info.num_ps) == (index, num_ps):
        shard.restore(own.state)
        for mp in ckpt.quarantine(own.rejected_paths):
            log.warning("set %s aside as %s.corrupt (never read again)", mp.name, mp.name)
        return shard, own.info, f"own:{own.info.path}", max(0, own.info.tag)
    if own is not None:
        log.warning(
            "ignoring %s: written by PS %d of %d, this is PS %d of %d",
            own.info.path,
            own.info.index,
            own.info.num_ps,
            index,
            num_ps,
        )
    if restore_from:
        res = ckpt.load_for(index, num_ps, restore_from)
        shard.restore(res.state)
        tags = [s.tag for s in res.sources if s.tag >= 0]
        tag = min(tags) if len(tags) == len(res.sources) and tags else restore_seq
        return shard, None, "reshard:" + ",".join(str(d) for d in restore_from), max(0, tag)
    if shard.seed_dense_from_parent():
        return shard, None, "parent model", 0
    return shard, None, "empty", 0


def _lock_dir(directory: Path, wait_s: float = 10.0) -> TextIO:
    """Hold an exclusive lock on ``directory`` for the life of the process (two live PS must
    not write one checkpoint directory; the kernel drops the lock when the process dies)."""
    directory.mkdir(parents=True, exist_ok=True)
    f = open(directory / ".lock", "a+")  # noqa: SIM115 - held until the process exits
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise ckpt.CheckpointError(
                    f"another live PS holds {directory}; give this PS its own --ckpt-dir "
                    "(each PS set of a migration needs separate directories)"
                ) from None
            time.sleep(0.1)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="dlrover-rm node ps", description="A parameter server of a dlrover-rm job."
    )
    p.add_argument("--run-dir", required=True, help="the job's run directory (holds the token)")
    p.add_argument("--index", type=int, required=True, help="this PS's index, 0-based")
    p.add_argument("--num-ps", type=int, required=True, help="how many PS the set has")
    p.add_argument("--master", default=None, help="the job master's HOST:PORT (register there)")
    p.add_argument("--incarnation", type=int, default=0, help="launches of this node before")
    p.add_argument("--generation", type=int, default=1, help="the PS set's generation")
    p.add_argument("--host", default=None, help="bind address (default $DLROVER_RM_BIND_HOST)")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument(
        "--restore-from",
        default="",
        help="comma-separated checkpoint directories of the old PS set, to re-shard from",
    )
    p.add_argument("--restore-seq", type=int, default=0, help="done_seq tag of those sources")
    p.add_argument("--ckpt-dir", default=None, help="default RUN_DIR/ps/ps-INDEX")
    p.add_argument("--addr-file", default=None, help="without --master: where to write it")
    p.add_argument("--checkpoint-every-s", type=float, default=30.0, help="0 disables")
    p.add_argument("--heartbeat-s", type=float, default=5.0, help="heartbeat interval")
    p.add_argument(
        "--dead-after-s", type=float, default=600.0, help="exit when the master is unreachable"
    )
    p.add_argument("--lr", type=float, default=DEFAULT_LR)
    p.add_argument("--seed", type=int, default=0, help="seed of the initial rows")
    p.add_argument("--threads", type=int, default=8, help="gRPC worker threads")
    args = p.parse_args(argv)
    if not 0 <= args.index < args.num_ps:
        p.error(f"--index {args.index} must be in 0..{args.num_ps - 1}")
    return args


EXIT_OK = 0
EXIT_FATAL = 1


def main(argv: Sequence[str] | None = None) -> int:
    from dlrover_core import logs
    from dlrover_core.runtime.backends.base import ENV_ADVERTISE_HOST, ENV_BIND_HOST

    logs.setup_node("info")
    args = _parse(argv)
    run_dir = Path(args.run_dir)
    try:
        token = wire.read_token(run_dir)
    except OSError as e:
        print(f"ps {args.index}: cannot read the job token in {run_dir}: {e}", file=sys.stderr)
        return EXIT_FATAL
    own_dir = Path(args.ckpt_dir) if args.ckpt_dir else checkpoint_dir(run_dir, args.index)
    restore_from = [d for d in args.restore_from.split(",") if d]
    bind = args.host or os.environ.get(ENV_BIND_HOST, "127.0.0.1")
    advertise = os.environ.get(ENV_ADVERTISE_HOST, bind if bind != "0.0.0.0" else "127.0.0.1")

    stop = threading.Event()
    why = ["SIGTERM"]

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        # an older incarnation may still hold the directory until it learns it is superseded
        lock = _lock_dir(own_dir, wait_s=max(10.0, args.dead_after_s + 5.0))
        pfile = parent_path(run_dir)
        parent = ParentTables.load(pfile) if pfile.exists() else None
        shard, restored, source, tag = restore_tagged(
            args.index,
            args.num_ps,
            own_dir,
            restore_from,
            args.restore_seq,
            seed=args.seed,
            parent=parent,
        )
    except ckpt.CheckpointError as e:
        print(f"ps {args.index}: cannot restore: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_FATAL
    server = PSServer(shard, token, own_dir, bind, args.port, args.lr, max_workers=args.threads)
    server.tag = tag
    server.mark_checkpointed(restored)
    if restored is None or len(ckpt.list_checkpoints(own_dir)) < ckpt.KEEP:
        # a relaunch restores this, not the sources again; after a fall-back past a corrupt
        # checkpoint (set aside), this restores the redundancy of ``KEEP`` good copies
        server.checkpoint(force=True)
    port = server.start()
    address = f"{advertise}:{port}"
    dense_steps = [d.steps for d in shard._dense.values()]
    log.info(
        "PS %d/%d (incarnation %d, generation %d) serving on %s, %d rows and %d dense "
        "parameters (at update %d) restored (%s, tag %d)",
        args.index,
        args.num_ps,
        args.incarnation,
        args.generation,
        address,
        shard.num_rows,
        len(dense_steps),
        max(dense_steps, default=0),
        source,
        tag,
    )
    code = EXIT_OK
    saver: threading.Thread | None = None
    try:
        if args.master:
            beats = _MasterLink(args, token, address, tag)
            if not beats.register():
                stop.set()
                why[0] = "superseded"
        else:
            write_json_atomic(
                Path(args.addr_file) if args.addr_file else addr_path(run_dir, args.index),
                {
                    "address": address,
                    "pid": os.getpid(),
                    "index": args.index,
                    "num_ps": args.num_ps,
                    "restored_step": shard.step,
                    "restored_rows": shard.num_rows,
                    "restored_from": source,
                    "checkpoint_dir": str(own_dir),
                },
            )

        def periodic() -> None:
            while not stop.wait(args.checkpoint_every_s):
                try:
                    server.checkpoint()
                except OSError as e:  # keep serving; the next period tries again
                    log.error("periodic checkpoint failed: %s", e)
                    if args.master and is_disk_full(e):  # a fact the master acts on
                        said = f"PS {args.index} cannot write its checkpoint: {e}"
                        beats.client.report_event(
                            "ps", args.index, args.incarnation, "disk_full", said
                        )

        if args.checkpoint_every_s > 0 and not stop.is_set():
            saver = threading.Thread(target=periodic, name="ps-checkpoint", daemon=True)
            saver.start()
        period = args.heartbeat_s if args.master else 1.0
        while not stop.wait(period):
            if args.master:
                reason = beats.beat(server)
                if reason:
                    why[0] = reason
                    stop.set()
    finally:
        log.info("PS %d stopping (%s): final checkpoint", args.index, why[0])
        server.stop(grace_s=1.0)
        stop.set()
        if saver is not None:
            saver.join()
        try:
            info = server.checkpoint()
            log.info("PS %d final checkpoint %s (tag %d)", args.index, info.path, info.tag)
        except OSError as e:
            log.error("PS %d: final checkpoint failed: %s", args.index, e)
            code = EXIT_FATAL
        if not args.master:
            addr_file = Path(args.addr_file) if args.addr_file else addr_path(run_dir, args.index)
            current = read_addr(addr_file)
            if current is not None and current.get("pid") == os.getpid():
                addr_file.unlink(missing_ok=True)
        lock.close()
    return code


class _MasterLink:
    """The PS's side of the master: register, heartbeat (rows, step), learn the done_seq
    that tags checkpoints; give up when the master stays unreachable for --dead-after-s."""

    def __init__(self, args: argparse.Namespace, token: str, address: str, tag: int) -> None:
        from dlrover_core.runtime.master_client import MasterClient

        self.args = args
        self.address = address
        self.tag = tag
        self.client = MasterClient(args.master, token, retry_for_s=args.dead_after_s)

    def register(self) -> bool:
        """False when the master refuses this PS as superseded (it must exit)."""
        from dlrover_core.runtime.master_client import MasterRejectedError, MasterUnavailableError

        try:
            reg = self.client.register(
                "ps",
                self.args.index,
                os.getpid(),
                self.args.incarnation,
                address=self.address,
                generation=self.args.generation,
                restored_seq=self.tag,
            )
        except MasterRejectedError as e:
            log.warning("PS %d: %s", self.args.index, e)
            return False
        except MasterUnavailableError as e:
            log.error("PS %d: %s", self.args.index, e)
            return False
        log.info(
            "PS %d registered (master %s, done_seq %s)",
            self.args.index,
            reg.master_id,
            reg.done_seq,
        )
        return True

    def beat(self, server: PSServer) -> str:
        """One heartbeat; a reason to stop, or ""."""
        from dlrover_core.runtime.master_client import MasterRejectedError, MasterUnavailableError

        try:
            reply = self.client.heartbeat(rows=float(server.shard.num_rows), step=server.shard.step)
        except MasterUnavailableError as e:
            log.error("PS %d: %s: exiting", self.args.index, e)
            return "master unreachable"
        except MasterRejectedError as e:
            log.error("PS %d: heartbeat refused: %s: exiting", self.args.index, e)
            return "refused"
        if reply.done_seq is not None:
            server.tag = max(server.tag, reply.done_seq)
        if reply.stop:
            return "the master said stop"
        return ""


if __name__ == "__main__":
    sys.exit(main())
