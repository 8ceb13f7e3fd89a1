"""The model carried forward: a run that starts from an earlier run's exported model.

``training.init_from`` names an export (a directory, or an fsspec URL of one, holding
``model.pt`` and ``model_card.json``: what ``dlrover-rm export`` and every successful run
write). The export is strategy-free (see :mod:`.export`), so a PS-trained model starts an
all-reduce run and the other way round.

Before the job starts, :func:`prepare_parent` reads the export once, checks that it fits the
spec (embedding dims, the dense tower's shapes: one line naming the file otherwise), and writes
``RUN/init/parent.npz`` in the *PS view*: for every table it can carry, its rows keyed the way
the PS of this job keys them (dynamic tables by raw id, static tables by ``raw % rows``), and
the dense tower's parameters. Tables whose addressing cannot be mapped start fresh and say so.

- **PS**: every PS loads the file (numpy only) and initialises a row the first time it sees
  its id from the parent's row when the parent has one, else as a fresh run would
  (:class:`ParentTables.lookup`); the dense parameters it owns start from the parent's.
- **All-reduce**: rank 0 of the first group fills a fresh model's tables (``raw % rows``; ids
  that collide on one row are averaged) and dense tower from the same file and the group
  starts from it (:func:`fill_local_state`).

The optimizer state is not in an export: it starts afresh, warm where that matters (a
carried row's Adagrad accumulator at :data:`CARRIED_ACCUMULATOR` on the PS, the dense lr
ramped up over ``training.dense_warmup`` steps), as ``model_card.json``'s
``lineage.optimizer`` says. The lineage (parent run, its data range,
rows trained over the whole chain) goes into the child's ``model_card.json``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dlrover_core.errors import InputError

log = logging.getLogger(__name__)

INIT_DIR = "init"
PARENT_FILE = "parent.npz"
LINEAGE_FILE = "lineage.json"
MODEL_FILE = "model.pt"
CARD_FILE = "model_card.json"

CARRIED_ACCUMULATOR = 0.1
"""Adagrad's accumulator of a row the parent trained, when this run first updates it (the
export holds no optimizer state; Keras' Adagrad starts every accumulator here). With 0 the
first update of every carried row is ``lr·sign(g)``. Measured on the drifting-stream
benchmark's day 1 (one seed, parent at AUC 0.7371 on that day): 0.7387 vs 0.7353 after
2,560 rows, 0.7462 vs 0.7432 after 7,680 rows (0.1 vs 0): small, within about 1.5x noise."""

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


@dataclass
class ParentTable:
    """One table of the parent in the PS view. ``keys`` sorted (indexed) or None (full: the
    key is the row); a PS id maps to the key ``id % modulo`` (``modulo`` None: the id)."""

    weights: F32
    keys: I64 | None = None
    modulo: int | None = None

    def lookup(self, ids: I64) -> tuple[npt.NDArray[np.bool_], F32]:
        """``(found, rows)``: which ids the parent holds a trained row for, and those rows."""
        ids = np.asarray(ids, dtype=np.int64)
        k = ids % self.modulo if self.modulo else ids
        if self.keys is None:
            ok = (k >= 0) & (k < self.weights.shape[0])
            idx = np.where(ok, k, 0)
            rows = self.weights[idx]
            ok &= np.any(rows != 0, axis=1)  # an untouched row of a full table is all zeros
            return ok, rows[ok]
        pos = np.searchsorted(self.keys, k)
        pos_c = np.minimum(pos, max(self.keys.size - 1, 0))
        ok = (pos < self.keys.size) & (self.keys[pos_c] == k) if self.keys.size else pos < 0
        return ok, self.weights[pos_c[ok]]


@dataclass
class ParentTables:
    """The parent in the PS view, as :func:`prepare_parent` wrote it."""

    tables: dict[str, ParentTable] = field(default_factory=dict)
    dense: dict[str, F32] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ParentTables:
        out = cls()
        with np.load(path) as z:
            names = {k.split("/")[1] for k in z.files if k.startswith("t/")}
            for n in names:
                mod = int(z[f"t/{n}/modulo"])
                keys = z[f"t/{n}/keys"] if f"t/{n}/keys" in z.files else None
                out.tables[n] = ParentTable(
                    np.ascontiguousarray(z[f"t/{n}/weights"], np.float32),
                    None if keys is None else np.ascontiguousarray(keys, np.int64),
                    mod or None,
                )
            for k in z.files:
                if k.startswith("d/"):
                    out.dense[k[2:]] = np.ascontiguousarray(z[k], np.float32)
        return out

    def save(self, path: Path) -> None:
        arrays: dict[str, Any] = {}
        for n, t in self.tables.items():
            arrays[f"t/{n}/weights"] = t.weights
            arrays[f"t/{n}/modulo"] = np.int64(t.modulo or 0)
            if t.keys is not None:
                arrays[f"t/{n}/keys"] = t.keys
        for k, v in self.dense.items():
            arrays[f"d/{k}"] = v
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)


LAST = "last"
"""``training.init_from: last``: the newest model of the job's signature in the history."""


def last_model(history: Any) -> tuple[str | None, str]:
    """``(model, why)`` for ``init_from: last``: the newest successful run of the signature
    in ``history`` (records of any strategy: an export is strategy-free) whose exported model
    is still there (a local directory with its card, or a URL); None and why when none is."""
    runs = sorted(history, key=lambda r: r.finished_at_s, reverse=True)
    gone = 0
    for r in runs:
        m = (r.extra or {}).get("model")
        if not m:
            continue
        if "://" in m and not m.startswith("file://"):
            return m, f"the model of run {r.extra.get('run_id')} ({r.extra.get('job')})"
        if (Path(m.removeprefix("file://")) / CARD_FILE).is_file():
            return m, f"the model of run {r.extra.get('run_id')} ({r.extra.get('job')})"
        gone += 1
    if not runs:
        return None, "no successful run of this signature in the history: a fresh start"
    if gone:
        return None, f"the models of {gone} earlier run(s) are gone from disk: a fresh start"
    return None, "no earlier run of this signature exported a model: a fresh start"


def parent_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / INIT_DIR / PARENT_FILE


def _fetch(src: str, run_dir: Path) -> Path:
    """A local directory holding the export: ``src`` itself, or a copy of a URL's files."""
    if "://" not in src or src.startswith("file://"):
        d = Path(src.removeprefix("file://")).expanduser()
        if not d.is_dir():
            raise InputError(
                f"training.init_from {src!r} is not a directory; pass a model directory that "
                "a run exported (it holds model.pt and model_card.json)"
            )
        return d
    import fsspec

    local = run_dir / INIT_DIR / "parent"
    local.mkdir(parents=True, exist_ok=True)
    try:
        fs, root = fsspec.core.url_to_fs(src)
        for name in (CARD_FILE, MODEL_FILE):
            fs.get(f"{root.rstrip('/')}/{name}", str(local / name))
    except (OSError, ValueError, ImportError) as e:
        raise InputError(
            f"training.init_from {src!r}: cannot copy the model ({type(e).__name__}: {e}); "
            "check the URL and its credentials, or pass a local model directory"
        ) from None
    return local


def _read_card(d: Path, src: str) -> dict[str, Any]:
    for name in (CARD_FILE, MODEL_FILE):
        if not (d / name).is_file():
            raise InputError(
                f"training.init_from {src!r} has no {name}; pass a model directory that a run "
                "exported (model.pt and model_card.json)"
            )
    try:
        card = json.loads((d / CARD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"training.init_from {src!r}: {CARD_FILE} is not readable ({e})") from None
    if not isinstance(card, dict) or not isinstance(card.get("tables"), list):
        raise InputError(f"training.init_from {src!r}: {CARD_FILE} is not a model card")
    return card


def prepare_parent(spec: Any, run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Read ``spec.training.init_from`` once, check it fits the spec, write the PS view
    (:func:`parent_path`) and the lineage note (``RUN/init/lineage.json``); returns the note
    (None without ``init_from``). Idempotent: a resumed run keeps what its start prepared."""
    src = spec.training.init_from
    if not src:
        return None
    rd = Path(run_dir)
    note_path = rd / INIT_DIR / LINEAGE_FILE
    if note_path.exists() and parent_path(rd).exists():
        try:
            note: dict[str, Any] = json.loads(note_path.read_text(encoding="utf-8"))
            return note
        except (OSError, ValueError):
            pass
    import torch

    from dlrover_core.training.model import DenseTower

    d = _fetch(str(src), rd)
    card = _read_card(d, str(src))
    try:
        tensors = torch.load(d / MODEL_FILE, weights_only=True, map_location="cpu")
    except Exception as e:
        raise InputError(
            f"training.init_from {src!r}: {MODEL_FILE} cannot be loaded ({type(e).__name__}: "
            f"{e}); pass a model directory that a run exported"
        ) from None
    out = ParentTables()
    carried: dict[str, str] = {}
    layout = {t["name"]: t for t in card["tables"] if isinstance(t, dict) and "name" in t}
    for t in spec.model.embedding_tables:
        dim = spec.model.table_dim(t)
        lt = layout.get(t.name)
        w = tensors.get(f"ebc.embedding_bags.{t.name}.weight")
        if lt is None or w is None:
            carried[t.name] = "fresh: the parent has no such table"
            continue
        w = w.detach().float().numpy()
        if w.shape[1] != dim:
            raise InputError(
                f"training.init_from {src!r}: table {t.name!r} has dim {w.shape[1]} there but "
                f"{dim} in this spec; start from scratch (no init_from) or keep the dims"
            )
        static = isinstance(t.num_embeddings, int)
        pmod = lt.get("modulo")
        if lt.get("layout") == "indexed":
            idx = tensors.get(f"index.{t.name}")
            if idx is None:
                carried[t.name] = "fresh: the parent's index is missing"
                continue
            keys = idx.detach().numpy().astype(np.int64)
            pt = ParentTable(np.ascontiguousarray(w[: keys.size]), keys, pmod or None)
        else:
            pt = ParentTable(np.ascontiguousarray(w), None, int(pmod or w.shape[0]))
        if static and pt.modulo != int(t.num_embeddings):
            # this job's PS keys a static table by raw % rows: other residues cannot be mapped
            carried[t.name] = (
                f"fresh: the parent addressed it mod {pt.modulo}, this job mod {t.num_embeddings}"
            )
            continue
        out.tables[t.name] = pt
        n = int(pt.keys.size) if pt.keys is not None else int(np.any(pt.weights != 0, 1).sum())
        carried[t.name] = f"{n} trained rows"
    want = DenseTower(spec.model).state_dict()
    for k, v in want.items():
        p = tensors.get(f"tower.{k}")
        if p is None or tuple(p.shape) != tuple(v.shape):
            got = "missing" if p is None else f"shape {tuple(p.shape)}"
            raise InputError(
                f"training.init_from {src!r}: the dense tower's {k} is {got} there but "
                f"{tuple(v.shape)} in this spec; start from scratch (no init_from) or keep "
                "model.dense_arch / over_arch / embedding_dim"
            )
        out.dense[k] = np.ascontiguousarray(p.detach().float().numpy())
    out.save(parent_path(rd))
    parent_lineage = card.get("lineage") or {}
    samples = (card.get("data") or {}).get("samples_trained") or 0
    note = {
        "source": str(src),
        "job": card.get("job"),
        "run_dir": card.get("run_dir"),
        "signature": card.get("signature"),
        "strategy": (card.get("spec") or {}).get("strategy", "ps"),
        "data": card.get("data"),
        "held_out_auc": (card.get("held_out") or {}).get("auc"),
        "model_sha256": (card.get("files") or {}).get("model_sha256"),
        "rows_trained_total": int(parent_lineage.get("rows_trained_total") or samples),
        "generation": int(parent_lineage.get("generation") or 0) + 1,
        "tables": carried,
        "dense": "carried",
        "optimizer": "reset (an export holds no optimizer state): carried rows' Adagrad "
        f"accumulators start at {CARRIED_ACCUMULATOR}, the dense lr ramps up",
    }
    note_path.write_text(json.dumps(note, indent=1) + "\n", encoding="utf-8")
    log.info(
        "starting from the model in %s (%s; %s)",
        src,
        ", ".join(f"{k}: {v}" for k, v in carried.items()),
        note["optimizer"],
    )
    return note


def read_lineage(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    p = Path(run_dir) / INIT_DIR / LINEAGE_FILE
    if not p.exists():
        return None
    try:
        d: dict[str, Any] = json.loads(p.read_text(encoding="utf-8"))
        return d
    except (OSError, ValueError):
        return None


def fill_local_state(state: dict[str, Any], parent: ParentTables) -> list[str]:
    """Fill a fresh single-process model's ``state_dict`` (torchrec EBC keys ending in
    ``embedding_bags.<table>.weight``, the tower's keys) from the parent, in place: a table
    of ``R`` rows gets the parent's rows at ``raw % R`` (ids that collide on one row averaged),
    the rest keep their fresh values. Returns the tables filled."""
    import torch

    filled = []
    by_table = {
        k.rsplit(".", 2)[-2]: k for k in state if k.endswith(".weight") and ".embedding_bags." in k
    }
    for name, pt in parent.tables.items():
        key = by_table.get(name)
        if key is None:
            continue
        w = state[key]
        rows = int(w.shape[0])
        if pt.modulo not in (None, rows):  # other residues: the table starts fresh
            continue
        if pt.keys is None:
            n = min(rows, pt.weights.shape[0])
            src = pt.weights[:n]
            mask = np.any(src != 0, axis=1)
            w[torch.from_numpy(np.nonzero(mask)[0])] = torch.from_numpy(src[mask])
        else:
            target = pt.keys % rows
            acc = np.zeros((rows, pt.weights.shape[1]), np.float64)
            cnt = np.zeros(rows, np.int64)
            np.add.at(acc, target, pt.weights)
            np.add.at(cnt, target, 1)
            hit = np.nonzero(cnt)[0]
            w[torch.from_numpy(hit)] = torch.from_numpy(
                (acc[hit] / cnt[hit, None]).astype(np.float32)
            )
        filled.append(name)
    for k, v in parent.dense.items():
        for sk in state:
            if (sk == k or sk.endswith("." + k)) and tuple(state[sk].shape) == v.shape:
                state[sk].copy_(torch.from_numpy(v))
    return filled
