"""Parameter-server checkpoints: atomic, checksummed, re-shardable.

Layout of one PS's checkpoint directory::

    ckpt-00000007.npz    ids, rows and optimizer slots per table; dense parameters
    ckpt-00000007.json   manifest: sha256 and size of the .npz, step, index, num_ps, tables
                         (each with its optimizer and update count)

A checkpoint exists once its manifest exists. :func:`save` writes the .npz to a temporary
file, fsyncs it, hashes it, renames it into place, then does the same for the manifest (so a
crash at any point leaves either the previous checkpoint or both files), and keeps the newest
``keep`` (2) checkpoints. :func:`load_latest` verifies the checksum and *rejects* a corrupt
checkpoint with a message naming the file, falling back to the previous good one.
:func:`load_for` builds the state of PS ``index`` of a new PS set from the latest checkpoints of
all the old PS: that is how the PS set is scaled or migrated.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from dlrover_core.errors import DLRoverError, ErrorKind
from dlrover_core.runtime.files import fsync_dir
from dlrover_core.runtime.strategies.ps.partition import dense_owners, owner

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
KEEP = 2
_NAME = re.compile(r"^ckpt-(\d{8})\.(npz|json)$")
_ANY_SEQ = re.compile(r"^ckpt-(\d{8})\.")  # quarantined ones included: numbers never reused


class CheckpointError(DLRoverError):
    """A checkpoint is missing, corrupt or does not fit the PS that wants it."""

    kind = ErrorKind.NOT_FOUND


# --- the state a checkpoint holds ------------------------------------------------------------


@dataclass
class TableState:
    """One embedding table's rows held by one PS: ``ids[i]`` owns ``weights[i]``.

    ``accum`` is the optimizer's state, its slots side by side: ``[rows, slots·dim]`` (Adagrad:
    the accumulator; Adam: first then second moments; SGD: no columns); ``steps`` the updates
    the table has had (Adam's bias correction)."""

    dim: int
    ids: npt.NDArray[np.int64]
    weights: npt.NDArray[np.float32]
    accum: npt.NDArray[np.float32]
    optimizer: str = "adagrad"
    steps: int = 0

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])

    @classmethod
    def empty(cls, dim: int) -> TableState:
        return cls(
            dim,
            np.empty(0, np.int64),
            np.empty((0, dim), np.float32),
            np.empty((0, dim), np.float32),
        )


@dataclass
class DenseState:
    """A dense parameter and its optimizer slots (Adagrad: the weight's shape; Adam:
    ``[2, *shape]``; SGD: empty)."""

    weight: npt.NDArray[np.float32]
    accum: npt.NDArray[np.float32]
    optimizer: str = "adagrad"
    steps: int = 0


@dataclass
class ShardState:
    """Everything one PS holds, as plain arrays (a snapshot; no locks, no IO)."""

    index: int = 0
    num_ps: int = 1
    step: int = 0
    tables: dict[str, TableState] = field(default_factory=dict)
    dense: dict[str, DenseState] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return sum(t.rows for t in self.tables.values())


class Snapshottable(Protocol):
    def snapshot(self) -> ShardState: ...


@dataclass(frozen=True)
class CheckpointInfo:
    """Where a checkpoint lies and what its manifest says."""

    directory: Path
    seq: int
    step: int
    index: int
    num_ps: int
    sha256: str
    nbytes: int
    created_unix: float
    tag: int = -1  # the master's shard done_seq the state includes (-1: unknown)

    @property
    def path(self) -> Path:
        return self.directory / f"ckpt-{self.seq:08d}.npz"

    @property
    def manifest_path(self) -> Path:
        return self.directory / f"ckpt-{self.seq:08d}.json"


@dataclass
class LoadedCheckpoint:
    state: ShardState
    info: CheckpointInfo
    rejected: list[str] = field(default_factory=list)  # one line per corrupt newer checkpoint
    rejected_paths: list[Path] = field(default_factory=list)  # their manifests


@dataclass
class ReshardResult:
    state: ShardState
    sources: list[CheckpointInfo]
    rejected: list[str] = field(default_factory=list)
    duplicates: int = 0  # rows found in more than one old checkpoint (first one kept)


# --- writing ---------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _seqs(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    out = set()
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            out.add(int(m.group(1)))
    return sorted(out)


def save(
    shard: Snapshottable | ShardState,
    directory: str | os.PathLike[str],
    step: int | None = None,
    keep: int = KEEP,
    tag: int = -1,
) -> CheckpointInfo:
    """Write a checkpoint of ``shard`` (a PSShard or a ShardState) into ``directory``.

    ``step`` defaults to the shard's own step (its number of pushes)."""
    state = shard if isinstance(shard, ShardState) else shard.snapshot()
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    used = [int(m.group(1)) for p in d.iterdir() if (m := _ANY_SEQ.match(p.name))]
    seq = max(used, default=0) + 1
    step = state.step if step is None else int(step)
    names = list(state.tables)
    dense_names = list(state.dense)
    arrays: dict[str, npt.NDArray[Any]] = {}
    for i, name in enumerate(names):
        t = state.tables[name]
        arrays[f"t{i}_ids"] = t.ids
        arrays[f"t{i}_w"] = t.weights
        arrays[f"t{i}_acc"] = t.accum
    for j, name in enumerate(dense_names):
        arrays[f"d{j}_w"] = state.dense[name].weight
        arrays[f"d{j}_acc"] = state.dense[name].accum

    final = d / f"ckpt-{seq:08d}.npz"
    tmp = d / f".ckpt-{seq:08d}.npz.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        digest = _sha256(tmp)
        nbytes = tmp.stat().st_size
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise

    created = time.time()
    manifest = {
        "format": FORMAT_VERSION,
        "file": final.name,
        "sha256": digest,
        "bytes": nbytes,
        "seq": seq,
        "step": step,
        "index": state.index,
        "num_ps": state.num_ps,
        "rows": state.num_rows,
        "tables": [
            {
                "name": n,
                "dim": state.tables[n].dim,
                "optimizer": state.tables[n].optimizer,
                "steps": state.tables[n].steps,
            }
            for n in names
        ],
        "dense": [
            {
                "name": n,
                "shape": list(state.dense[n].weight.shape),
                "optimizer": state.dense[n].optimizer,
                "steps": state.dense[n].steps,
            }
            for n in dense_names
        ],
        "created_unix": created,
        "tag": int(tag),
    }
    mtmp = d / f".ckpt-{seq:08d}.json.{os.getpid()}.tmp"
    try:
        with open(mtmp, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(mtmp, d / f"ckpt-{seq:08d}.json")
    except BaseException:
        mtmp.unlink(missing_ok=True)
        final.unlink(missing_ok=True)  # no manifest: the npz is not a checkpoint
        raise
    fsync_dir(d)
    _prune(d, keep)
    return CheckpointInfo(
        d, seq, step, state.index, state.num_ps, digest, nbytes, created, int(tag)
    )


def _prune(directory: Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; drop older ones and stray temp files."""
    complete = [s for s in _seqs(directory) if (directory / f"ckpt-{s:08d}.json").exists()]
    for s in complete[: max(0, len(complete) - keep)]:
        (directory / f"ckpt-{s:08d}.json").unlink(missing_ok=True)  # manifest first
        (directory / f"ckpt-{s:08d}.npz").unlink(missing_ok=True)
    newest = complete[-1] if complete else 0
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m and int(m.group(1)) < newest and not (directory / f"ckpt-{m.group(1)}.json").exists():
            p.unlink(missing_ok=True)  # an .npz whose manifest never got written
        elif p.name.startswith(".ckpt-") and p.name.endswith(".tmp"):
            pid = p.name.rsplit(".", 2)[-2]
            if pid != str(os.getpid()):
                p.unlink(missing_ok=True)


# --- reading ---------------------------------------------------------------------------------


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Manifests in ``directory``, newest first."""
    d = Path(directory)
    return [
        d / f"ckpt-{s:08d}.json" for s in reversed(_seqs(d)) if (d / f"ckpt-{s:08d}.json").exists()
    ]


def verify(manifest_path: str | os.PathLike[str]) -> CheckpointInfo:
    """Read a manifest and check its .npz against the recorded size and sha256.

    Raises :class:`CheckpointError` naming the file when anything does not match."""
    mp = Path(manifest_path)
    try:
        m = json.loads(mp.read_text())
        npz = mp.parent / m["file"]
        want_sha, want_bytes = str(m["sha256"]), int(m["bytes"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"checkpoint manifest {mp} is unreadable ({e}); it is ignored — delete it if it "
            "keeps coming back"
        ) from e
    if not npz.exists():
        raise CheckpointError(f"checkpoint {npz} named by {mp.name} is missing")
    size = npz.stat().st_size
    if size != want_bytes:
        raise CheckpointError(
            f"checkpoint {npz} is corrupt: {size} bytes, the manifest says {want_bytes} "
            "(truncated or overwritten); it is rejected"
        )
    got = _sha256(npz)
    if got != want_sha:
        raise CheckpointError(
            f"checkpoint {npz} is corrupt: sha256 {got[:16]}… does not match the manifest's "
            f"{want_sha[:16]}…; it is rejected"
        )
    return CheckpointInfo(
        mp.parent,
        int(m["seq"]),
        int(m["step"]),
        int(m["index"]),
        int(m["num_ps"]),
        want_sha,
        want_bytes,
        float(m.get("created_unix", 0.0)),
        int(m.get("tag", -1)),
    )


def read(manifest_path: str | os.PathLike[str]) -> LoadedCheckpoint:
    """Verify and load one checkpoint."""
    info = verify(manifest_path)
    m = json.loads(Path(manifest_path).read_text())
    state = ShardState(index=info.index, num_ps=info.num_ps, step=info.step)
    try:
        with np.load(info.path, allow_pickle=False) as z:
            for i, t in enumerate(m["tables"]):
                state.tables[t["name"]] = TableState(
                    int(t["dim"]),
                    z[f"t{i}_ids"].astype(np.int64, copy=False),
                    z[f"t{i}_w"].astype(np.float32, copy=False),
                    z[f"t{i}_acc"].astype(np.float32, copy=False),
                    optimizer=str(t.get("optimizer", "adagrad")),
                    steps=int(t.get("steps", 0)),
                )
            for j, dn in enumerate(m["dense"]):
                state.dense[dn["name"]] = DenseState(
                    z[f"d{j}_w"].astype(np.float32, copy=False),
                    z[f"d{j}_acc"].astype(np.float32, copy=False),
                    optimizer=str(dn.get("optimizer", "adagrad")),
                    steps=int(dn.get("steps", 0)),
                )
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {info.path} cannot be read ({e}); it is rejected") from e
    return LoadedCheckpoint(state, info)


def load_latest(directory: str | os.PathLike[str]) -> LoadedCheckpoint | None:
    """The newest checkpoint in ``directory`` that passes its checksum, or None if there is none.

    Corrupt newer checkpoints are skipped (logged, and listed in ``rejected``); if every
    checkpoint there is corrupt, raises :class:`CheckpointError` listing each one."""
    manifests = list_checkpoints(directory)
    rejected: list[str] = []
    rejected_paths: list[Path] = []
    for mp in manifests:
        try:
            loaded = read(mp)
        except CheckpointError as e:
            log.warning("%s", e.message)
            rejected.append(e.message)
            rejected_paths.append(mp)
            continue
        loaded.rejected = rejected
        loaded.rejected_paths = rejected_paths
        if rejected:
            log.warning("fell back to checkpoint %s", loaded.info.path)
        return loaded
    if rejected:
        raise CheckpointError(
            f"no usable checkpoint in {directory}: every one failed its checksum. Restore the "
            "directory from a backup, or start this PS empty by moving the directory away",
            problems=rejected,
        )
    return None


def quarantine(manifests: Sequence[Path]) -> list[Path]:
    """Set rejected checkpoints aside (``ckpt-N.json.corrupt``, ``ckpt-N.npz.corrupt``) so that
    pruning no longer counts them among the ``keep`` newest and deletes the good one instead;
    kept for inspection, never read again. Only the PS that owns the directory calls this.
    Returns the manifests moved."""
    moved = []
    for mp in manifests:
        for p in (mp.with_suffix(".npz"), mp):  # the npz first: a manifest marks a checkpoint
            with contextlib.suppress(FileNotFoundError):
                p.replace(p.with_name(p.name + ".corrupt"))
        moved.append(mp)
    if moved:
        fsync_dir(moved[0].parent)
    return moved


def load_for(
    index: int,
    num_ps: int,
    checkpoint_dirs: Sequence[str | os.PathLike[str]],
    allow_missing: bool = False,
) -> ReshardResult:
    """The state of PS ``index`` in a set of ``num_ps`` PS, re-sharded from the latest good
    checkpoints of *all* the old PS (one directory each).

    Keeps the rows that :func:`.partition.owner` gives to ``index`` under
    ``num_ps``, and the dense parameters that ``dense_owner`` gives to it (round-robin over the
    sorted union of dense names). A directory without any checkpoint is an error (rows would be
    lost) unless ``allow_missing``."""
    if not 0 <= index < num_ps:
        raise CheckpointError(f"PS index {index} is outside 0..{num_ps - 1}")
    loaded: list[LoadedCheckpoint] = []
    rejected: list[str] = []
    for d in checkpoint_dirs:
        lc = load_latest(d)
        if lc is None:
            if allow_missing:
                continue
            raise CheckpointError(
                f"no checkpoint in {d} to re-shard from; checkpoint the old PS first "
                "(the Checkpoint call) or pass allow_missing=True to start its rows afresh"
            )
        loaded.append(lc)
        rejected.extend(lc.rejected)

    out = ShardState(
        index=index, num_ps=num_ps, step=max((lc.info.step for lc in loaded), default=0)
    )
    dims: dict[str, int] = {}
    for lc in loaded:
        for name, t in lc.state.tables.items():
            if dims.setdefault(name, t.dim) != t.dim:
                raise CheckpointError(
                    f"table {name!r} has dim {t.dim} in {lc.info.path} but {dims[name]} elsewhere"
                )
    duplicates = 0
    for name, dim in dims.items():
        parts = [lc.state.tables[name] for lc in loaded if name in lc.state.tables]
        opts = {t.optimizer for t in parts if t.steps > 0} or {parts[0].optimizer}
        if len(opts) > 1:
            raise CheckpointError(
                f"table {name!r} was trained with different optimizers {sorted(opts)} on the "
                "old PS set; it cannot be merged"
            )
        opt = opts.pop()
        parts = [t for t in parts if t.optimizer == opt or t.rows == 0]
        width = max((t.accum.shape[1] for t in parts if t.optimizer == opt), default=dim)
        keep_ids, keep_w, keep_a = [], [], []
        for t in parts:
            mine = owner(name, t.ids, num_ps) == index
            keep_ids.append(t.ids[mine])
            keep_w.append(t.weights[mine])
            keep_a.append(t.accum[mine].reshape(-1, width))
        ids = np.concatenate(keep_ids) if keep_ids else np.empty(0, np.int64)
        w = np.concatenate(keep_w) if keep_w else np.empty((0, dim), np.float32)
        a = np.concatenate(keep_a) if keep_a else np.empty((0, width), np.float32)
        uniq, first = np.unique(ids, return_index=True)
        if uniq.size != ids.size:
            duplicates += int(ids.size - uniq.size)
            first.sort()
            ids, w, a = ids[first], w[first], a[first]
        out.tables[name] = TableState(
            dim,
            ids,
            np.ascontiguousarray(w),
            np.ascontiguousarray(a),
            optimizer=opt,
            steps=max(t.steps for t in parts) if parts else 0,
        )

    all_dense: dict[str, DenseState] = {}
    for lc in loaded:
        for name, ds in lc.state.dense.items():
            all_dense.setdefault(name, ds)
    for name, p in dense_owners(all_dense, num_ps).items():
        if p == index:
            out.dense[name] = all_dense[name]
    return ReshardResult(out, [lc.info for lc in loaded], rejected, duplicates)
