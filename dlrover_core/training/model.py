"""DLRM from torchrec modules, split the way the PS runtime needs it.

- :class:`DenseTower` is everything but the embedding lookups: torchrec's ``DenseArch``,
  ``InteractionArch`` and ``OverArch``. In the PS runtime a worker pulls embedding rows from
  the parameter servers, stacks them into a leaf tensor ``[n, F, D]`` with ``requires_grad``,
  runs the tower, calls ``backward`` and pushes the leaf's ``.grad`` rows back.
- :class:`LocalDLRM` is the whole model in one process (an ``EmbeddingBagCollection`` feeding
  the same tower): the single-process baseline of the throughput benchmark, and a quick way to
  check that the data has something to learn.
- :func:`auc` and :func:`evaluate` score a model on a held-out :class:`Batch`.

A categorical feature's raw id becomes a table row as ``id % num_embeddings``; a dynamic table
gets :data:`DYNAMIC_ROWS` rows here (the PS runtime grows its tables instead).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from dlrover_core.errors import InputError
from dlrover_core.spec import ModelSpec
from dlrover_core.training.data import Batch
from dlrover_core.training.metrics import auc, logloss

__all__ = [
    "DYNAMIC_ROWS",
    "DenseTower",
    "LocalDLRM",
    "LookupFn",
    "auc",
    "evaluate",
    "feature_keys",
    "logloss",
    "predict",
    "stack_pooled",
    "tensors",
    "to_kjt",
]

DYNAMIC_ROWS = 100_003
"""Rows a dynamic table gets in :class:`LocalDLRM` (a prime, so ids spread evenly)."""

LookupFn = Callable[[np.ndarray], torch.Tensor]
"""Raw sparse ids ``int64 [n, F]`` -> pooled embeddings ``float32 [n, F, D]``."""


def feature_keys(spec: ModelSpec) -> list[str]:
    """One sparse feature per embedding table, named after it, in table order."""
    return [t.name for t in spec.embedding_tables]


def _check_dlrm(spec: ModelSpec) -> None:
    problems = []
    if spec.dense_features <= 0:
        problems.append("model.dense_features must be positive (DLRM's bottom MLP needs input)")
    if not spec.dense_arch:
        problems.append(f"model.dense_arch must end in embedding_dim ({spec.embedding_dim})")
    if len(spec.over_arch) < 2 or spec.over_arch[-1] != 1:
        problems.append(
            f"model.over_arch must have at least 2 layers and end in 1; got {list(spec.over_arch)}"
        )
    odd = [t.name for t in spec.embedding_tables if spec.table_dim(t) != spec.embedding_dim]
    if odd:
        problems.append(
            f"DLRM needs every table at embedding_dim {spec.embedding_dim}; "
            f"remove embedding_dim from table(s) {', '.join(odd)}"
        )
    if problems:
        raise InputError("this model spec cannot be built as a DLRM:", problems=problems)


class DenseTower(nn.Module):
    """DLRM without its embedding tables: ``(dense, sparse_emb) -> logits``.

    ``dense`` float32 ``[n, dense_features]``; ``sparse_emb`` float32 ``[n, F, D]`` (the pooled
    embedding of each of the F sparse features, in table order); returns logits ``[n]``.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        _check_dlrm(spec)
        self.num_dense = spec.dense_features
        self.num_sparse = len(spec.embedding_tables)
        self.embedding_dim = spec.embedding_dim
        f, d = self.num_sparse, self.embedding_dim
        self.dense_arch = DenseArch(spec.dense_features, list(spec.dense_arch))
        self.inter_arch = InteractionArch(num_sparse_features=f)
        self.over_arch = OverArch(d + math.comb(f + 1, 2), list(spec.over_arch))

    def forward(self, dense: torch.Tensor, sparse_emb: torch.Tensor) -> torch.Tensor:
        embedded_dense = self.dense_arch(dense)
        concat = self.inter_arch(embedded_dense, sparse_emb)
        logits: torch.Tensor = self.over_arch(concat)
        return logits.squeeze(-1)


def to_kjt(sparse: np.ndarray | torch.Tensor, keys: Sequence[str]) -> KeyedJaggedTensor:
    """A KeyedJaggedTensor of one id per feature per sample from ``int64 [n, F]`` ids."""
    ids = torch.as_tensor(sparse, dtype=torch.int64)
    if ids.dim() != 2 or ids.shape[1] != len(keys):
        raise InputError(f"sparse ids must be [n, {len(keys)}] for keys {list(keys)}")
    n = ids.shape[0]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys),
        values=ids.t().reshape(-1),  # KJT values are key-major: all of key 0, then key 1 ...
        lengths=torch.ones(n * len(keys), dtype=torch.int32),
    )


def stack_pooled(pooled: KeyedTensor, keys: Sequence[str]) -> torch.Tensor:
    """Pooled embeddings ``KeyedTensor`` -> ``[n, F, D]`` in ``keys`` order (as SparseArch)."""
    by_key = pooled.to_dict()
    return torch.stack([by_key[k] for k in keys], dim=1)


class LocalDLRM(nn.Module):
    """The whole DLRM in one process: torchrec ``EmbeddingBagCollection`` + :class:`DenseTower`.

    ``cardinality_per_table`` gives each table's rows (None: dynamic, :data:`DYNAMIC_ROWS`);
    by default the spec's ``num_embeddings``. ``forward(dense, kjt)`` takes raw ids and maps
    each to row ``id % rows`` of its table.

    ``sparse_grad`` (default) makes the tables produce sparse gradients, so an optimizer that
    takes them (``torch.optim.Adagrad``, ``SGD``, ``SparseAdam``) updates only the rows a batch
    touched, as a PS does; dense gradients would rewrite every row of every table each step.
    """

    _rows: torch.Tensor  # per-table row counts (a non-persistent buffer)

    def __init__(
        self,
        spec: ModelSpec,
        cardinality_per_table: Sequence[int | None] | None = None,
        *,
        sparse_grad: bool = True,
    ) -> None:
        super().__init__()
        _check_dlrm(spec)
        tables = spec.embedding_tables
        if cardinality_per_table is None:
            cardinality_per_table = [
                t.num_embeddings if isinstance(t.num_embeddings, int) else None for t in tables
            ]
        cards = list(cardinality_per_table)
        if len(cards) != len(tables) or any(c is not None and c <= 0 for c in cards):
            raise InputError(
                f"cardinality_per_table needs {len(tables)} positive entries (None for a dynamic "
                f"table); got {cards}"
            )
        self.keys = feature_keys(spec)
        self.rows = [c if c is not None else DYNAMIC_ROWS for c in cards]
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=t.name,
                    embedding_dim=spec.embedding_dim,
                    num_embeddings=rows,
                    feature_names=[t.name],
                    pooling=PoolingType.SUM,
                )
                for t, rows in zip(tables, self.rows, strict=True)
            ]
        )
        for bag in self.ebc.embedding_bags.values():
            bag.sparse = sparse_grad
        self.tower = DenseTower(spec)
        self.register_buffer("_rows", torch.tensor(self.rows, dtype=torch.int64), persistent=False)

    def _hashed(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        keys = kjt.keys()
        order = [self.keys.index(k) for k in keys]
        per_value = torch.repeat_interleave(
            self._rows[order], torch.tensor(kjt.length_per_key(), dtype=torch.int64)
        )
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.remainder(kjt.values(), per_value),
            lengths=kjt.lengths(),
        )

    def embed(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """Pooled embeddings ``[n, F, D]`` of raw ids."""
        return stack_pooled(self.ebc(self._hashed(kjt)), self.keys)

    def lookup(self, sparse: np.ndarray) -> torch.Tensor:
        """:data:`LookupFn` over this model's tables (for :func:`evaluate`)."""
        return self.embed(to_kjt(sparse, self.keys))

    def forward(self, dense: torch.Tensor, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.tower(dense, self.embed(kjt))


# --- evaluation -----------------------------------------------------------------------------


def tensors(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dense, labels)`` of a batch as torch tensors (sharing memory)."""
    return torch.from_numpy(batch.dense), torch.from_numpy(batch.labels)


@torch.no_grad()
def predict(tower: DenseTower, lookup_fn: LookupFn, batch: Batch, chunk: int = 8192) -> np.ndarray:
    """Logits of every record of ``batch``, in chunks, in eval mode."""
    was_training = tower.training
    tower.eval()
    try:
        out = [
            tower(torch.from_numpy(part.dense), lookup_fn(part.sparse)).numpy()
            for part in batch.split(chunk)
        ]
    finally:
        tower.train(was_training)
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def evaluate(
    tower: DenseTower, lookup_fn: LookupFn, batch: Batch, chunk: int = 8192
) -> tuple[float, float]:
    """``(auc, logloss)`` of the model ``tower ∘ lookup_fn`` on ``batch``."""
    logits = predict(tower, lookup_fn, batch, chunk)
    return auc(batch.labels, logits), logloss(batch.labels, logits)
