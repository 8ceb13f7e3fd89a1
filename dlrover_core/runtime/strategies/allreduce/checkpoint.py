"""Atomic torch.distributed.checkpoint (DCP) checkpoints of the all-reduce group, with the
shard bookkeeping that makes exactly once work.

Layout under the checkpoint root (a directory every rank can reach: a volume on Kubernetes)::

    ckpt-00000007/            complete: DCP files + meta.json (renamed from the tmp dir)
    .tmp-ckpt-00000008-g3/    being written by generation 3 (ignored by readers)

A checkpoint is **valid only once complete**: every rank writes its DCP shards into the tmp
directory (``dcp.save``, a collective), the group meets at a barrier, then rank 0 writes
``meta.json`` (tmp file, fsync, rename) and renames the directory (an atomic rename on a POSIX
filesystem). A reader takes the highest-numbered ``ckpt-*`` directory that has ``meta.json``;
a crash at any point leaves the previous complete checkpoint as the latest.

Shard bookkeeping (``meta.json``): ``shards`` lists the data shards whose updates are in this
checkpoint and were not in the previous one, each with the node that took it and the take's
``attempt``. Rank 0 reports them done to the master only after the rename; a group that starts
from this checkpoint reports them again, as that node and attempt, before taking any shard:
the master's queue counts a repeated report of the same take once (no duplicate), marks a
shard that was given back after a crash done (its updates are in the model), and the shards
trained after this checkpoint, whose updates were lost with the crash, are still doing or
todo, so they are trained again: exactly once across failures and resizes.

Loading at another world size works because DCP stores every tensor with its global shape
and shard offsets: :func:`load_into` fills whatever sharding the new plan gave the model
(resharding), and :func:`load_local_model` loads the same files into the one-process
:class:`~dlrover_core.training.model.LocalDLRM` (evaluation, export).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrover_core.errors import InputError
from dlrover_core.runtime.files import atomic_write_json

if TYPE_CHECKING:
    import torch.distributed as dist

    from dlrover_core.spec import JobSpec
    from dlrover_core.training.model import LocalDLRM

__all__ = [
    "META_FILE",
    "Checkpoint",
    "CheckpointMeta",
    "CheckpointStore",
    "ShardRecord",
    "evaluate_checkpoint",
    "load_into",
    "load_local_model",
    "save_collective",
]

META_FILE = "meta.json"
_NAME = re.compile(r"^ckpt-(\d{8})$")
_TMP = re.compile(r"^\.tmp-ckpt-(\d{8})-g(\d+)$")


@dataclass(frozen=True)
class ShardRecord:
    """A data shard whose updates a checkpoint holds: who took it, which take."""

    shard_id: int
    worker_id: int
    attempt: int
    rows: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardRecord:
        return cls(int(d["shard_id"]), int(d["worker_id"]), int(d["attempt"]), int(d["rows"]))


@dataclass(frozen=True)
class CheckpointMeta:
    """What ``meta.json`` says. ``final``: the generation that wrote it left after it (a
    planned stop or the job's end); ``job_done``: every shard is trained."""

    seq: int
    generation: int
    world_size: int
    global_step: int
    samples: int
    shards: tuple[ShardRecord, ...] = ()
    shards_total: int = 0
    final: bool = False
    job_done: bool = False
    time_s: float = 0.0
    plan: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shards"] = [s.to_dict() for s in self.shards]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckpointMeta:
        return cls(
            seq=int(d["seq"]),
            generation=int(d["generation"]),
            world_size=int(d["world_size"]),
            global_step=int(d["global_step"]),
            samples=int(d["samples"]),
            shards=tuple(ShardRecord.from_dict(s) for s in d.get("shards", [])),
            shards_total=int(d.get("shards_total", 0)),
            final=bool(d.get("final", False)),
            job_done=bool(d.get("job_done", False)),
            time_s=float(d.get("time_s", 0.0)),
            plan=dict(d.get("plan", {})),
        )


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    meta: CheckpointMeta


class CheckpointStore:
    """The checkpoint root: naming, atomic commit, the latest complete checkpoint, pruning."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def tmp_path(self, seq: int, generation: int) -> Path:
        return self.root / f".tmp-ckpt-{seq:08d}-g{generation}"

    def final_path(self, seq: int) -> Path:
        return self.root / f"ckpt-{seq:08d}"

    def complete(self) -> list[Checkpoint]:
        """Every complete checkpoint, oldest first (a directory without a readable
        ``meta.json`` is not one)."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _NAME.match(p.name)
            if not m or not (p / META_FILE).is_file():
                continue
            try:
                meta = CheckpointMeta.from_dict(json.loads((p / META_FILE).read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            out.append(Checkpoint(p, meta))
        return sorted(out, key=lambda c: c.meta.seq)

    def latest(self) -> Checkpoint | None:
        done = self.complete()
        return done[-1] if done else None

    def commit(self, tmp: Path, meta: CheckpointMeta) -> Checkpoint:
        """Make the DCP files in ``tmp`` a complete checkpoint (rank 0, after the group's
        barrier): meta.json first, then the directory's rename."""
        if not (tmp / ".metadata").is_file():
            raise InputError(
                f"{tmp} has no DCP .metadata: dcp.save did not finish there; do not commit it"
            )
        atomic_write_json(tmp / META_FILE, meta.to_dict())
        final = self.final_path(meta.seq)
        if final.exists():  # a leftover of a run that crashed after the rename? never ours
            raise InputError(
                f"checkpoint {final} already exists: two groups write to {self.root}; give each "
                "job its own checkpoint directory"
            )
        os.replace(tmp, final)
        _fsync_dir(self.root)
        return Checkpoint(final, meta)

    def prune(self, keep: int) -> list[Path]:
        """Delete all but the newest ``keep`` complete checkpoints."""
        done = self.complete()
        gone = [c.path for c in done[: max(0, len(done) - keep)]]
        for p in gone:
            shutil.rmtree(p, ignore_errors=True)
        return gone

    def clean_tmp(self, before_generation: int) -> list[Path]:
        """Delete tmp directories that generations older than ``before_generation`` left."""
        if not self.root.is_dir():
            return []
        gone = []
        for p in self.root.iterdir():
            m = _TMP.match(p.name)
            if m and int(m.group(2)) < before_generation:
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
        return gone


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- torch side (imported lazily: the controller reads checkpoints without torch) -----------


def save_collective(state: dict[str, Any], path: Path, group: dist.ProcessGroup | None) -> None:
    """Every rank: write this rank's part of ``state`` into ``path`` (DCP), then meet the
    others at a barrier, so that rank 0 may commit once this returns."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(path), process_group=group)
    dist.barrier(group=group)


def load_into(state: dict[str, Any], path: Path, group: dist.ProcessGroup | None = None) -> None:
    """Fill ``state`` (tensors of whatever sharding the current plan has) from the DCP files
    in ``path`` (resharding as needed), in place."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=str(path), process_group=group)


def load_local_model(spec: JobSpec, path: Path) -> LocalDLRM:
    """The checkpointed model in one process (no process group): evaluation and export."""
    import torch.distributed.checkpoint as dcp

    from dlrover_core.training.model import LocalDLRM

    model = LocalDLRM(spec.model)
    sd = {"model": model.state_dict()}
    dcp.load(sd, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(sd["model"])
    return model


def evaluate_checkpoint(
    spec: JobSpec, root: str | os.PathLike[str], n: int | None = None
) -> tuple[float, float]:
    """``(auc, logloss)`` on the held-out rows (``data.eval_rows`` by default) of the latest
    complete checkpoint under ``root``, in one process: what the controller reports at the
    end of an all-reduce job."""
    from dlrover_core.training.data import from_spec
    from dlrover_core.training.model import evaluate

    latest = CheckpointStore(root).latest()
    if latest is None:
        raise InputError(
            f"no complete checkpoint under {root}: the group never finished a checkpoint"
        )
    model = load_local_model(spec, latest.path)
    rows = spec.data.eval_rows if n is None else n
    return evaluate(model.tower, model.lookup, from_spec(spec).eval_rows(rows))
