"""Model export: a real run of small.yaml, exported, loaded with plain torch, scored again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrover_core import api
from dlrover_core.cli import main
from dlrover_core.runtime.export import export_run as export_model
from dlrover_core.spec import load_spec
from dlrover_core.training import load_exported
from dlrover_core.training.data import from_spec
from dlrover_core.training.export import ExportError
from dlrover_core.training.metrics import auc, logloss
from dlrover_core.training.model import to_kjt

SMALL = str(Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "small.yaml")
pytestmark = pytest.mark.slow  # one real train for the module (about 7 s here)
OVERRIDES = ["data.rows=12000", "data.eval_rows=2000", "training.batch_size=200"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real train (master, PS and worker processes) of small.yaml at a small row count."""
    rd = tmp_path_factory.mktemp("export") / "run"
    mp = pytest.MonkeyPatch()
    mp.setenv("DLROVER_RM_HISTORY", f"sqlite:///{rd.parent / 'history.db'}")
    try:
        report = api.train(SMALL, overrides=OVERRIDES, run_dir=rd, progress=False)
    finally:
        mp.undo()
    assert report["state"] == "succeeded", report.get("failure")
    return report


def test_train_exports_the_model(trained: dict[str, Any]) -> None:
    md = Path(trained["model_dir"])
    assert md == Path(trained["run_dir"]) / "model"
    assert (md / "model.pt").is_file() and (md / "model_card.json").is_file()
    card = json.loads((md / "model_card.json").read_text())
    assert card["feature_keys"] == [f"c{i}" for i in range(8)]
    assert card["held_out"]["rows"] == 2000
    assert card["data"]["train_rows"] == [0, 12000]
    by = {t["name"]: t for t in card["tables"]}
    assert by["c0"]["layout"] == "indexed" and by["c4"]["layout"] == "full"
    assert by["c4"]["rows"] == 1000
    # a dynamic table holds every id the run trained or scored, plus the zero row
    assert by["c0"]["rows"] == by["c0"]["ids_trained"] + 1 > 100


def test_exported_files_load_with_weights_only(trained: dict[str, Any]) -> None:
    md = Path(trained["model_dir"])
    sd = torch.load(md / "model.pt", weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    card = json.loads((md / "model_card.json").read_text())
    for t in card["tables"]:
        w = sd[f"ebc.embedding_bags.{t['name']}.weight"]
        assert w.shape == (t["rows"], t["dim"]) and w.dtype == torch.float32
        if t["layout"] == "indexed":
            idx = sd[f"index.{t['name']}"]
            assert idx.dtype == torch.int64 and bool((idx[1:] > idx[:-1]).all())
            assert torch.count_nonzero(w[-1]) == 0  # the row for unseen ids
    assert any(k.startswith("tower.over_arch") for k in sd)


def test_loaded_model_reproduces_the_report_auc(trained: dict[str, Any]) -> None:
    model = load_exported(trained["model_dir"])
    assert isinstance(model, torch.nn.Module)
    spec = load_spec(SMALL, OVERRIDES)
    held = from_spec(spec).eval_rows(spec.data.eval_rows)
    with torch.no_grad():
        logits = model(torch.from_numpy(held.dense), to_kjt(held.sparse, model.keys)).numpy()
    got = auc(held.labels, logits)
    assert trained["auc"] > 0.6  # it learned something
    # same weights, same held-out rows: the export must score what the master scored
    assert abs(got - trained["auc"]) < 0.005
    card = json.loads((Path(trained["model_dir"]) / "model_card.json").read_text())
    assert card["held_out"]["auc"] == pytest.approx(got, abs=1e-6)
    assert card["held_out"]["logloss"] == pytest.approx(logloss(held.labels, logits), abs=1e-6)


def test_forward_takes_any_key_order_and_unseen_ids(trained: dict[str, Any]) -> None:
    model = load_exported(trained["model_dir"])
    keys = list(model.keys)
    dense = torch.rand(3, 13)
    ids = np.array([[1, 2, 3, 4, 5, 6, 7, 8]] * 3, dtype=np.int64)
    ids[2, :4] = 10**15  # ids a dynamic table never saw: the zero row
    base = model(dense, to_kjt(ids, keys))
    rev = list(reversed(keys))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=rev,
        values=torch.from_numpy(ids[:, ::-1].T.reshape(-1).copy()),
        lengths=torch.ones(3 * len(keys), dtype=torch.int32),
    )
    assert torch.allclose(model(dense, kjt), base, atol=1e-6)
    assert base.shape == (3,) and bool(torch.isfinite(base).all())
    rows = model.rows_of("c0", torch.tensor([10**15]))
    assert int(rows[0]) == model.ebc.embedding_bags["c0"].weight.shape[0] - 1


def test_cli_export_and_errors(
    trained: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    assert main(["export", "--run-dir", trained["run_dir"], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "held-out: AUC" in printed and (out / "model.pt").exists()
    assert main(["export", "--run-dir", str(tmp_path / "nope"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err


def test_export_rejects_a_corrupt_checkpoint(trained: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    rd = tmp_path / "run"
    shutil.copytree(trained["run_dir"], rd, ignore=shutil.ignore_patterns("model"))
    for npz in (rd / "ps").rglob("ckpt-*.npz"):
        npz.write_bytes(b"garbage")
    with pytest.raises(ExportError, match="cannot export"):
        export_model(rd, tmp_path / "m")


def test_export_of_an_empty_dir_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"spec\.json"):
        export_model(tmp_path, tmp_path / "m")


def test_node_logs_carry_no_third_party_warning(trained: dict[str, Any]) -> None:
    logs = list((Path(trained["run_dir"]) / "logs").glob("*.log"))
    assert logs
    for p in logs:
        assert "pynvml" not in p.read_text(), p
