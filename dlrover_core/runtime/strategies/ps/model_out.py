"""The model a PS run trained, read for export: the final checkpoints of its active PS set
(``RUN/ps/gen-N/ps-I``, ``N`` the active generation in ``master.json``), merged into the
export layout of :mod:`dlrover_core.training.export`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlrover_core.runtime.strategies.ps import checkpoint as ckpt
from dlrover_core.runtime.strategies.ps.layout import PS_DIR, SET_DIR, ps_root
from dlrover_core.spec import JobSpec
from dlrover_core.training.export import ExportError, table_layout
from dlrover_core.training.model import DenseTower


def read_model(
    spec: JobSpec, run_dir: Path
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]], list[dict[str, Any]]]:
    """The tensors, the tables' layout and the checkpoints they came from."""
    states, sources = _load_shards(_final_set_dir(run_dir))
    tensors, layout = _model_tensors(spec, states)
    return tensors, layout, sources


def _final_set_dir(run_dir: Path) -> Path:
    """The directory of the PS set the run ended with."""
    root = ps_root(run_dir)
    sets = sorted(
        (int(m.group(1)), p)
        for p in (root.iterdir() if root.is_dir() else [])
        if p.is_dir() and (m := SET_DIR.match(p.name))
    )
    if not sets:
        raise ExportError(
            f"{str(run_dir)!r} holds no PS checkpoints (no ps/gen-N directory); export a run "
            "that trained with the ps strategy"
        )
    try:
        snap = json.loads((run_dir / "master.json").read_text(encoding="utf-8"))
        active = [g for g in snap.get("generations", []) if g.get("state") == "active"]
        current = int(active[-1]["id"]) if active else 0
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError):
        current = 0
    by_id = dict(sets)
    return by_id.get(current, sets[-1][1])


def _load_shards(set_dir: Path) -> tuple[list[Any], list[dict[str, Any]]]:
    dirs = sorted(
        (int(m.group(1)), p)
        for p in set_dir.iterdir()
        if p.is_dir() and (m := PS_DIR.match(p.name))
    )
    if not dirs:
        raise ExportError(f"{set_dir} holds no ps-I checkpoint directory; nothing to export")
    states, sources = [], []
    for _, d in dirs:
        try:
            lc = ckpt.load_latest(d)
        except ckpt.CheckpointError as e:
            raise ExportError(f"cannot export: {e.message}", problems=e.problems) from None
        if lc is None:
            raise ExportError(f"{d} holds no checkpoint; the PS never saved its state")
        states.append(lc.state)
        sources.append(
            {
                "path": str(lc.info.path),
                "step": lc.info.step,
                "index": lc.info.index,
                "num_ps": lc.info.num_ps,
                "sha256": lc.info.sha256,
            }
        )
    nums = {s.num_ps for s in states}
    idx = sorted(s.index for s in states)
    if len(nums) != 1 or idx != list(range(len(states))) or nums != {len(states)}:
        raise ExportError(
            f"the checkpoints in {set_dir} do not form one PS set (indexes {idx}, num_ps "
            f"{sorted(nums)}); export needs the latest checkpoint of every PS of the set"
        )
    return states, sources


def _model_tensors(spec: JobSpec, states: Sequence[Any]) -> tuple[dict[str, torch.Tensor], list]:
    layout = table_layout(spec.model)
    tensors: dict[str, torch.Tensor] = {}
    for t in layout:
        name, dim = t["name"], t["dim"]
        parts = [s.tables[name] for s in states if name in s.tables]
        ids = np.concatenate([p.ids for p in parts]) if parts else np.empty(0, np.int64)
        w = np.concatenate([p.weights for p in parts]) if parts else np.empty((0, dim), np.float32)
        if w.shape[1:] != (dim,):
            raise ExportError(
                f"table {name!r} has dim {w.shape[1] if w.ndim == 2 else '?'} in the checkpoints "
                f"but {dim} in the spec; export the run with the spec it trained with"
            )
        uniq, first = np.unique(ids, return_index=True)
        ids, w = uniq, w[first]  # the PS partition is disjoint; guard anyway
        if t["layout"] == "full":
            rows = int(t["num_embeddings"])
            if ids.size and (ids[0] < 0 or ids[-1] >= rows):
                raise ExportError(
                    f"table {name!r} holds ids outside 0..{rows - 1}; the run's spec and "
                    "checkpoints disagree"
                )
            full = np.zeros((rows, dim), np.float32)
            full[ids] = w
            weight = full
        else:
            weight = np.concatenate([w, np.zeros((1, dim), np.float32)])
            tensors[f"index.{name}"] = torch.from_numpy(np.ascontiguousarray(ids, np.int64))
        tensors[f"ebc.embedding_bags.{name}.weight"] = torch.from_numpy(
            np.ascontiguousarray(weight, np.float32)
        )
        t["rows"] = int(weight.shape[0])
        t["ids_trained"] = int(ids.size)
    tower = DenseTower(spec.model)
    dense: dict[str, Any] = {}
    for s in states:
        for k, d in s.dense.items():
            dense.setdefault(k, d.weight)
    sd = tower.state_dict()
    missing = sorted(set(sd) - set(dense))
    if missing:
        raise ExportError(
            f"the checkpoints hold no value for dense parameter(s) {missing[:3]}; export needs "
            "the final checkpoint of every PS"
        )
    for k, v in sd.items():
        tensors[f"tower.{k}"] = torch.from_numpy(
            np.ascontiguousarray(np.asarray(dense[k], np.float32).reshape(tuple(v.shape)))
        )
    return tensors, layout
