"""The model carried forward (``training.init_from``), without running a job: reading an
export into the PS view, the PS rows it initialises, the all-reduce state it fills, the
errors a model that does not fit gets, and ``init_from: last``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dlrover_core import api
from dlrover_core.errors import InputError
from dlrover_core.runtime.strategies.ps.shard import PSShard
from dlrover_core.training.carry import (
    CARRIED_ACCUMULATOR,
    ParentTables,
    last_model,
    parent_path,
    prepare_parent,
)
from dlrover_core.training.model import DenseTower, LocalDLRM
from dlrover_core.types import HistoryRecord
from tests.factories import make_plan, make_spec

DYNAMIC = {
    "model__embedding_tables": [
        {"name": "a", "num_embeddings": 1000},
        {"name": "d", "num_embeddings": "dynamic"},
    ]
}


def export(tmp: Path, spec: Any, *, dim: int = 16, tower: Any = None) -> Path:
    """A model directory in the export layout: table ``a`` full (1000 rows, rows 0..9 trained,
    the rest zeros), table ``d`` indexed by raw id (ids 5, 70, 10**9), the dense tower."""
    out = tmp / "parent"
    out.mkdir(parents=True, exist_ok=True)
    a = np.zeros((1000, dim), np.float32)
    a[:10] = np.arange(10, dtype=np.float32)[:, None] + 1
    ids = np.array([5, 70, 10**9], np.int64)
    d = np.concatenate([np.full((3, dim), 7.0, np.float32), np.zeros((1, dim), np.float32)])
    t = {
        "ebc.embedding_bags.a.weight": torch.from_numpy(a),
        "ebc.embedding_bags.d.weight": torch.from_numpy(d),
        "index.d": torch.from_numpy(ids),
    }
    tw = tower or DenseTower(spec.model)
    for k, v in tw.state_dict().items():
        t[f"tower.{k}"] = v.detach().clone() + 0.5
    torch.save(t, out / "model.pt")
    card = {
        "format": 1,
        "job": "yesterday",
        "run_dir": "/runs/yesterday",
        "signature": spec.signature_key,
        "spec": {"strategy": "ps"},
        "tables": [
            {"name": "a", "layout": "full", "modulo": 1000, "rows": 1000},
            {"name": "d", "layout": "indexed", "modulo": None, "rows": 4},
        ],
        "data": {"samples_trained": 5000},
        "held_out": {"auc": 0.75},
        "files": {"model_sha256": "x"},
        "lineage": {"generation": 2, "rows_trained_total": 15000},
    }
    (out / "model_card.json").write_text(json.dumps(card))
    return out


def test_parent_rows_and_dense_reach_the_ps_and_new_ids_start_fresh(tmp_path: Path) -> None:
    spec = make_spec(**DYNAMIC)
    src = export(tmp_path, spec)
    spec = make_spec(**DYNAMIC, training__init_from=str(src))
    note = prepare_parent(spec, tmp_path / "run")
    assert note is not None and note["generation"] == 3 and note["rows_trained_total"] == 15000
    assert note["tables"] == {"a": "10 trained rows", "d": "3 trained rows"}
    parent = ParentTables.load(parent_path(tmp_path / "run"))
    shard = PSShard(parent=parent)
    fresh = PSShard()
    # a static table: trained rows from the parent, untouched (all-zero) rows start fresh
    got = shard.pull("a", np.array([3, 500]), 16)
    assert np.all(got[0] == 4.0)
    np.testing.assert_array_equal(got[1], fresh.pull("a", np.array([500]), 16)[0])
    # a dynamic table: ids the parent trained, and one it never saw
    got = shard.pull("d", np.array([70, 10**9, 71]), 16)
    assert np.all(got[:2] == 7.0)
    np.testing.assert_array_equal(got[2], fresh.pull("d", np.array([71]), 16)[0])
    # a carried row's Adagrad accumulator starts warm, a new row's at zero
    t = shard._tables["d"]
    rows = t.lookup(np.array([70, 71]))[0]
    assert t.arena.slots[0][rows[0]][0] == pytest.approx(CARRIED_ACCUMULATOR)
    assert t.arena.slots[0][rows[1]][0] == 0.0
    # the training step's own init path (several tables at once) carries rows too
    step = PSShard(parent=parent)
    pulled = step.step_many([], None, [("d", np.array([5, 6]), 16)], step.config())[0]
    assert pulled is not None and np.all(pulled[0] == 7.0) and not np.all(pulled[1] == 7.0)
    # the dense tower starts from the parent's, first writer wins over the workers' init
    assert shard.seed_dense_from_parent()
    mine = {k: v + 99 for k, v in parent.dense.items()}
    assert shard.init_dense(mine) == []
    for k, v in shard.pull_dense().items():
        np.testing.assert_array_equal(v, parent.dense[k])


def test_an_allreduce_model_is_filled_from_the_parent(tmp_path: Path) -> None:
    spec = make_spec(**DYNAMIC)
    src = export(tmp_path, spec)
    spec = make_spec(**DYNAMIC, training__init_from=str(src))
    prepare_parent(spec, tmp_path / "run")
    from dlrover_core.training.carry import fill_local_state

    model = LocalDLRM(spec.model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sd = model.state_dict()
    with torch.no_grad():
        filled = fill_local_state(sd, ParentTables.load(parent_path(tmp_path / "run")))
    assert sorted(filled) == ["a", "d"]
    a = sd["ebc.embedding_bags.a.weight"]
    assert torch.all(a[3] == 4.0) and torch.equal(
        a[500], before["ebc.embedding_bags.a.weight"][500]
    )
    rows = int(sd["ebc.embedding_bags.d.weight"].shape[0])
    d = sd["ebc.embedding_bags.d.weight"]
    assert torch.all(d[70 % rows] == 7.0) and torch.all(d[10**9 % rows] == 7.0)
    for k in DenseTower(spec.model).state_dict():
        assert not torch.equal(sd[f"tower.{k}"], before[f"tower.{k}"])


def test_a_model_that_does_not_fit_is_one_clear_line(tmp_path: Path) -> None:
    spec = make_spec(**DYNAMIC)
    src = export(tmp_path, spec, dim=8)
    with pytest.raises(InputError, match="table 'a' has dim 8 there but 16"):
        prepare_parent(make_spec(**DYNAMIC, training__init_from=str(src)), tmp_path / "r1")
    other = make_spec(**DYNAMIC, model__dense_arch=[32, 16])
    src = export(tmp_path / "o", spec, tower=DenseTower(spec.model))
    with pytest.raises(InputError, match="dense tower"):
        prepare_parent(other.model_copy(update={"training": other.training.model_copy(
            update={"init_from": str(src)})}), tmp_path / "r2")  # fmt: skip
    with pytest.raises(InputError, match="not a directory"):
        prepare_parent(make_spec(training__init_from=str(tmp_path / "nope")), tmp_path / "r3")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"no model_card\.json"):
        prepare_parent(make_spec(training__init_from=str(tmp_path / "empty")), tmp_path / "r4")


def test_a_static_table_of_another_size_starts_fresh_and_says_so(tmp_path: Path) -> None:
    spec = make_spec(**DYNAMIC)
    src = export(tmp_path, spec)
    tables = [{"name": "a", "num_embeddings": 2000}, {"name": "d", "num_embeddings": "dynamic"}]
    bigger = make_spec(model__embedding_tables=tables, training__init_from=str(src))
    note = prepare_parent(bigger, tmp_path / "run")
    assert note is not None and note["tables"]["a"].startswith("fresh: the parent addressed")
    assert "a" not in ParentTables.load(parent_path(tmp_path / "run")).tables


def test_init_from_last_picks_the_newest_model_or_starts_fresh(tmp_path: Path) -> None:
    spec = make_spec(training__init_from="last")
    src = export(tmp_path, spec)

    def rec(t: float, model: str | None, strategy: str = "ps") -> HistoryRecord:
        extra = {"run_id": int(t), "job": "j", **({"model": model} if model else {})}
        return HistoryRecord("s", t, make_plan(), extra=extra, strategy=strategy)

    js, note = api.resolve_init_from(spec, [])
    assert js.training.init_from is None and note is not None and "fresh start" in note["note"]
    gone = str(tmp_path / "gone")
    history = [rec(1, str(src)), rec(2, gone, "allreduce")]
    js, note = api.resolve_init_from(spec, history)
    assert js.training.init_from == str(src) and note is not None and note["model"] == str(src)
    assert last_model([rec(2, gone)])[1].startswith("the models of 1 earlier run(s) are gone")
    # a URL is taken as given (its store is not listed here); the newest wins
    url = "s3://bucket/runs/j/model"
    assert last_model([*history, dataclasses.replace(rec(3, url))])[0] == url
    # a template that rendered to nothing: a fresh start
    js, note = api.resolve_init_from(make_spec(training__init_from="None"), history)
    assert js.training.init_from is None and note is not None
