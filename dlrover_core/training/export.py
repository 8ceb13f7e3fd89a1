"""Model export: a trained run directory -> files a torch/torchrec user loads without this runtime.

The run's strategy reads the model it trained (``Strategy.read_model``: an all-reduce run's
latest complete DCP checkpoint, every table in full, addressed ``raw_id % rows``; a PS run's
final checkpoints of its active set); :func:`write_export` (through
``dlrover_core.runtime.export.export_run``) writes it into ``out``:

``model.pt``
    ``torch.save`` of a flat ``dict[str, Tensor]`` (loadable with ``weights_only=True``):

    - ``ebc.embedding_bags.<table>.weight`` float32 ``[rows, dim]``: the rows of each table, in
      the key layout of a torchrec ``EmbeddingBagCollection``'s ``state_dict``;
    - ``index.<table>`` int64 ``[rows - 1]`` (sorted) for an *indexed* table: row ``i`` holds the
      id ``index[i]``; the last row is all zeros and serves ids the run never saw. Dynamic
      tables are indexed by raw id; static tables by ``raw_id % num_embeddings`` when they are
      too big to write in full (more than :data:`FULL_TABLE_MAX_ROWS` rows);
    - a *full* static table has ``num_embeddings`` rows, addressed as ``raw_id %
      num_embeddings`` (rows the run never touched are zeros);
    - ``tower.<param>``: the dense tower (torchrec ``DenseArch``, ``InteractionArch``,
      ``OverArch``), keys as in :class:`~dlrover_core.training.model.DenseTower`'s
      ``state_dict``.

``model_card.json``
    The spec, feature keys (KJT key order), per-table size and addressing, the held-out AUC and
    log loss of the exported model (and the run report's AUC), the data range it was trained
    on, the checkpoints it came from (path, step, sha256).

:func:`load_exported` rebuilds the model as a ``torch.nn.Module`` made of torchrec modules whose
``forward(dense, kjt)`` takes raw ids as a ``KeyedJaggedTensor`` and returns logits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrover_core.errors import DLRoverError, ErrorKind, InputError
from dlrover_core.spec import JobSpec, ModelSpec, parse_spec
from dlrover_core.training.data import EVAL_ROW_START, from_spec
from dlrover_core.training.metrics import auc, logloss
from dlrover_core.training.model import DenseTower, feature_keys, stack_pooled, to_kjt

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODEL_FILE = "model.pt"
CARD_FILE = "model_card.json"
FULL_TABLE_MAX_ROWS = 1 << 22
"""A static table up to this many rows is written in full; a bigger one is indexed."""


class ExportError(DLRoverError):
    """A run directory cannot be exported (no checkpoint, a corrupt one, a spec mismatch)."""

    kind = ErrorKind.NOT_FOUND


# --- reading the run directory -----------------------------------------------------------------


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(
            f"{str(path.parent)!r} has no {path.name} ({what}); pass the --run-dir of a "
            "finished `dlrover-rm train`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ExportError(f"{path} ({what}) is unreadable: {e}") from None


# --- building the tensors ----------------------------------------------------------------------


def table_layout(spec: ModelSpec) -> list[dict[str, Any]]:
    out = []
    for t in spec.embedding_tables:
        ne = t.num_embeddings
        full = isinstance(ne, int) and ne <= FULL_TABLE_MAX_ROWS
        out.append(
            {
                "name": t.name,
                "dim": spec.table_dim(t),
                "num_embeddings": ne,
                "modulo": ne if isinstance(ne, int) else None,
                "layout": "full" if full else "indexed",
            }
        )
    return out


# --- the exported module -----------------------------------------------------------------------


class ExportedDLRM(nn.Module):
    """DLRM from an export: a torchrec ``EmbeddingBagCollection`` + the dense tower.

    ``forward(dense, kjt)``: ``dense`` float32 ``[n, dense_features]``, ``kjt`` a
    ``KeyedJaggedTensor`` of raw ids under the card's ``feature_keys`` (any key order, bags of
    any length, summed); returns logits ``[n]``. A raw id maps to its row as the card says
    (``id % num_embeddings`` for a static table, then the index for an indexed one; an id the
    index does not hold reads the zero row at the end)."""

    def __init__(self, model: ModelSpec, tables: Sequence[dict[str, Any]]) -> None:
        super().__init__()
        self.keys = feature_keys(model)
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=t["name"],
                    embedding_dim=int(t["dim"]),
                    num_embeddings=int(t["rows"]),
                    feature_names=[t["name"]],
                    pooling=PoolingType.SUM,
                )
                for t in tables
            ]
        )
        self.tower = DenseTower(model)
        self._modulo = {t["name"]: t.get("modulo") for t in tables}
        self._indexed = [t["name"] for t in tables if t["layout"] == "indexed"]
        for t in tables:
            if t["layout"] == "indexed":
                self.register_buffer(
                    f"index_{t['name']}", torch.zeros(int(t["rows"]) - 1, dtype=torch.int64)
                )

    def rows_of(self, key: str, ids: torch.Tensor) -> torch.Tensor:
        """Table rows of raw ids of feature ``key``."""
        ids = ids.to(torch.int64)
        mod = self._modulo[key]
        if mod is not None:
            ids = torch.remainder(ids, int(mod))
        if key not in self._indexed:
            return ids
        index: torch.Tensor = getattr(self, f"index_{key}")
        if index.numel() == 0:
            return torch.zeros_like(ids)
        pos = torch.searchsorted(index, ids).clamp_(max=index.numel() - 1)
        return torch.where(index[pos] == ids, pos, torch.full_like(ids, index.numel()))

    def forward(self, dense: torch.Tensor, kjt: KeyedJaggedTensor) -> torch.Tensor:
        keys = kjt.keys()
        unknown = sorted(set(keys) - set(self.keys))
        if unknown:
            raise InputError(f"the KJT has feature key(s) {unknown} this model has no table for")
        values = list(torch.split(kjt.values(), kjt.length_per_key()))
        mapped = torch.cat([self.rows_of(k, v) for k, v in zip(keys, values, strict=True)])
        pooled = self.ebc(KeyedJaggedTensor(keys=keys, values=mapped, lengths=kjt.lengths()))
        return self.tower(dense, stack_pooled(pooled, self.keys))


def _module(card: dict[str, Any], tensors: dict[str, torch.Tensor]) -> ExportedDLRM:
    spec = parse_spec(card["spec"], source="model card spec")
    m = ExportedDLRM(spec.model, card["tables"])
    sd: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        if k.startswith("index."):
            sd[f"index_{k.removeprefix('index.')}"] = v
        else:
            sd[k] = v
    m.load_state_dict(sd, strict=True)
    m.eval()
    return m


def load_exported(directory: str | os.PathLike[str]) -> ExportedDLRM:
    """The exported model in ``directory`` (``model.pt`` + ``model_card.json``), in eval mode."""
    d = Path(directory)
    card = _read_json(d / CARD_FILE, "the model card")
    if not isinstance(card, dict) or card.get("format") != FORMAT_VERSION:
        raise ExportError(
            f"{d / CARD_FILE} is not a dlrover-rm model card of format {FORMAT_VERSION}; "
            "export the run again with `dlrover-rm export`"
        )
    try:
        tensors = torch.load(d / MODEL_FILE, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ExportError(f"{str(d)!r} has no {MODEL_FILE}; export the run again") from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise ExportError(
            f"{d / MODEL_FILE} cannot be loaded ({e}); export the run again"
        ) from None
    return _module(card, tensors)


# --- evaluation and export ---------------------------------------------------------------------


@torch.no_grad()
def predict_logits(model: nn.Module, keys: Sequence[str], batch: Any, chunk: int = 8192) -> Any:
    """Logits of a :class:`~dlrover_core.training.data.Batch` through ``model(dense, kjt)``."""
    out = [
        model(torch.from_numpy(p.dense), to_kjt(p.sparse, keys)).numpy() for p in batch.split(chunk)
    ]
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _data_range(spec: JobSpec, source: Any, report: dict[str, Any] | None) -> dict[str, Any]:
    d = spec.data
    out: dict[str, Any] = {
        "source": d.source,
        "train_rows": [0, int(source.num_rows)],
        "epochs": spec.training.epochs,
        "steps": spec.training.steps,
        "samples_trained": (report or {}).get("samples_done"),
    }
    if d.source == "synthetic":
        out.update(seed=d.seed, held_out_rows=[EVAL_ROW_START, EVAL_ROW_START + d.eval_rows])
    else:
        from dlrover_core.history.redact import redact_url

        out["path"] = redact_url(str(d.path))
        start = int(getattr(source, "held_out_start", source.num_rows))
        out["held_out_rows"] = [start, start + min(d.eval_rows, int(source.holdout))]
    return out


def _lineage(rd: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Where the model came from: the parent it started from (``training.init_from``), and
    the rows trained over the whole chain of carried-forward runs."""
    from dlrover_core.training.carry import read_lineage

    parent = read_lineage(rd)
    own = int(data.get("samples_trained") or 0)
    if parent is None:
        return {"parent": None, "generation": 0, "rows_trained_total": own}
    return {
        "parent": parent,
        "generation": int(parent.get("generation") or 1),
        "rows_trained_total": int(parent.get("rows_trained_total") or 0) + own,
        "optimizer": parent.get("optimizer"),
    }


def read_run_spec(run_dir: str | os.PathLike[str]) -> tuple[JobSpec, dict[str, Any]]:
    """The spec a run trained with (``RUN/spec.json``), parsed, and as stored."""
    rd = Path(run_dir)
    if not rd.is_dir():
        raise InputError(f"run directory {str(rd)!r} does not exist; pass the --run-dir of a train")
    spec_data = _read_json(rd / "spec.json", "the job spec")
    return parse_spec(spec_data, source=str(rd / "spec.json")), spec_data


def write_export(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    trained: tuple[dict[str, torch.Tensor], list[dict[str, Any]], list[dict[str, Any]]],
    *,
    evaluate: bool = True,
) -> dict[str, Any]:
    """Write the model a run trained (``trained``: its tensors in the export layout, the
    tables' layout and the checkpoints they came from, as its strategy reads them:
    ``Strategy.read_model``) into ``out``; returns the model card (also written)."""
    rd = Path(run_dir)
    spec, spec_data = read_run_spec(rd)
    report_path = rd / "report.json"
    report = _read_json(report_path, "the run report") if report_path.exists() else None
    tensors, layout, sources = trained

    card: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "kind": "dlrm",
        "created_unix": time.time(),
        "job": spec.name,
        "signature": spec.signature_key,
        "spec": spec_data,
        "feature_keys": feature_keys(spec.model),
        "dense_features": spec.model.dense_features,
        "dense_transform": "log(1 + max(x, 0))",
        "tables": layout,
        "files": {"model": MODEL_FILE},
        "checkpoints": sources,
        "run_dir": str(rd),
        "report_auc": (report or {}).get("auc"),
        "torch": torch.__version__,
        "load": "dlrover_core.training.load_exported(DIR), or torch.load(DIR/model.pt, "
        "weights_only=True) and the layout in this card",
    }
    source = from_spec(spec)
    card["data"] = _data_range(spec, source, report)
    card["lineage"] = _lineage(rd, card["data"])
    card["held_out"] = {"rows": 0, "auc": None, "logloss": None}
    if evaluate and spec.data.eval_rows > 0:
        model = _module(card, tensors)
        batch = source.eval_rows(spec.data.eval_rows)
        logits = predict_logits(model, card["feature_keys"], batch)
        card["held_out"] = {
            "rows": len(batch),
            "auc": _finite(auc(batch.labels, logits)),
            "logloss": _finite(logloss(batch.labels, logits)),
        }
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    tmp = o / f".{MODEL_FILE}.{os.getpid()}.tmp"
    torch.save(tensors, tmp)
    os.replace(tmp, o / MODEL_FILE)
    h = hashlib.sha256((o / MODEL_FILE).read_bytes()).hexdigest()
    card["files"]["model_sha256"] = h
    ctmp = o / f".{CARD_FILE}.{os.getpid()}.tmp"
    ctmp.write_text(json.dumps(card, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(ctmp, o / CARD_FILE)
    log.info(
        "exported %s to %s (held-out AUC %s on %d rows)",
        spec.name,
        o,
        card["held_out"]["auc"],
        card["held_out"]["rows"],
    )
    return card
