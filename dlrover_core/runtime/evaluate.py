"""Held-out evaluation of a model that lives on parameter servers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dlrover_core.errors import DLRoverError
from dlrover_core.spec import JobSpec


def evaluate_on_ps(
    spec: JobSpec, addresses: Sequence[str], token: str, rows: int | None = None
) -> float:
    """AUC on the spec's held-out rows, with the dense tower and embeddings pulled from the
    PS set at ``addresses``. Dense parameters are named as in ``DenseTower.named_parameters``."""
    import torch

    from dlrover_core.runtime.ps_client import PSClient
    from dlrover_core.training.data import from_spec
    from dlrover_core.training.metrics import auc
    from dlrover_core.training.model import DenseTower, feature_keys

    source = from_spec(spec)
    batch = source.eval_rows(rows or max(1, spec.data.eval_rows))
    tower = DenseTower(spec.model)
    keys = feature_keys(spec.model)
    tables = {t.name: spec.model.table_dim(t) for t in spec.model.embedding_tables}
    with PSClient(list(addresses), token, tables) as client:
        names = [n for n, _ in tower.named_parameters()]
        try:
            client.init_dense({n: p.detach().numpy() for n, p in tower.named_parameters()})
            dense = client.pull_dense()
        except DLRoverError as e:
            raise DLRoverError(f"cannot read the dense parameters from the PS: {e}") from e
        missing = [n for n in names if n not in dense]
        if missing:
            raise DLRoverError(f"the PS set lacks dense parameters {missing[:3]}...")
        with torch.no_grad():
            for n, p in tower.named_parameters():
                p.copy_(torch.from_numpy(np.asarray(dense[n]).reshape(p.shape)))
        scores = []
        step = 4096
        tower.eval()
        for s in range(0, len(batch), step):
            part = batch.take(s, min(len(batch), s + step))
            emb = client.pull_many({k: part.sparse[:, i] for i, k in enumerate(keys)})
            sparse = torch.from_numpy(np.stack([emb[k] for k in keys], axis=1))
            with torch.no_grad():
                logits = tower(torch.from_numpy(part.dense), sparse)
            scores.append(logits.numpy())
    return float(auc(batch.labels, np.concatenate(scores)))
