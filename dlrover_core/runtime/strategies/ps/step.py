"""The PS worker's training step, and evaluation against a PS set (both also used by the
benchmarks).

:func:`compute_step` routes a batch's ids (:class:`~.client.StepPlan`), reads its unique rows
(and, when due, the dense parameters) in one ``Step`` round trip per PS, and runs forward and
backward; :class:`StepGrads` is what a step pushes back. :func:`train_step` is one step not
overlapped; :class:`~.worker.Worker` overlaps a step's push with a later batch's read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dlrover_core.errors import DLRoverError
from dlrover_core.runtime.strategies.ps.client import Exchange, PSClient, StepPlan
from dlrover_core.spec import JobSpec
from dlrover_core.training.data import Batch, DataSource, from_spec
from dlrover_core.training.model import DenseTower, LookupFn, evaluate, feature_keys


def table_rows(spec: JobSpec) -> list[int | None]:
    """Rows of each table in feature order (None: dynamic). A raw id of a static table maps to
    row ``id % rows``, as in :class:`~dlrover_core.training.model.LocalDLRM`."""
    return [
        t.num_embeddings if isinstance(t.num_embeddings, int) else None
        for t in spec.model.embedding_tables
    ]


def embedding_ids(sparse: np.ndarray, rows: Sequence[int | None]) -> list[np.ndarray]:
    """Per feature, the PS ids of a batch's raw ids ``int64 [n, F]`` (static tables wrap)."""
    cols = []
    for f, r in enumerate(rows):
        col = np.ascontiguousarray(sparse[:, f], dtype=np.int64)
        cols.append(np.remainder(col, r) if r is not None else col)
    return cols


def pull_embeddings(ps: PSClient, names: Sequence[str], ids: Sequence[np.ndarray]) -> np.ndarray:
    """Embedding rows ``float32 [n, F, D]`` of per-feature ids (one PS call per PS)."""
    got = ps.pull_many(dict(zip(names, ids, strict=True)))
    return np.stack([got[name] for name in names], axis=1)


def load_dense(tower: torch.nn.Module, values: dict[str, np.ndarray]) -> None:
    """Copy dense parameters pulled from the PS into ``tower`` (in place, no autograd)."""
    params = dict(tower.named_parameters())
    missing = sorted(set(params) - set(values))
    if missing:
        raise DLRoverError(
            f"the PS set holds no value for dense parameter(s) {missing[:3]}...; every worker "
            "must run the same model spec (re-create the PS set or fix the spec)"
        )
    with torch.no_grad():
        for name, p in params.items():
            np.copyto(p.detach().numpy(), np.asarray(values[name]).reshape(p.shape))


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a if a.flags.writeable else a.copy())


@dataclass
class DenseSync:
    """When :func:`train_step` pulls the dense parameters: every ``every`` steps (1: always)."""

    every: int = 1
    steps_since: int = field(default=0, init=False)
    stale: bool = field(default=True, init=False)

    def due(self) -> bool:
        return self.stale or self.steps_since >= self.every

    def done(self) -> None:
        self.stale = False
        self.steps_since = 0

    def invalidate(self) -> None:
        self.stale = True


@dataclass
class StepGrads:
    """The gradients of one step, ready to push: the batch's :class:`StepPlan`, the gradient of
    its unique rows ``[plan.size, dim]`` (duplicates already summed by autograd) and the dense
    gradients by name, with the optimizer the PS applies."""

    plan: StepPlan
    grads: np.ndarray
    dense: dict[str, np.ndarray]
    lr: float | None
    optimizer: str | None = None
    transfer: str = "fp32"
    # per PS, the version of the dense values these gradients were computed on (a PS scales
    # the lr of a stale one: see :mod:`.shard`'s docstring)
    dense_read: dict[int, tuple[int, int]] = field(default_factory=dict)
    warmup: int = 0  # the PS ramps a dense parameter's lr over its first `warmup` updates

    @property
    def sparse(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per table (unique ids, summed gradient rows), as the older push API takes them."""
        out: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        p = self.plan
        for ps in range(len(p.starts) - 1):
            o = p.starts[ps]
            for f, name in enumerate(p.names):
                c = int(p.counts[ps, f])
                ids, gs = out.setdefault(name, ([], []))
                ids.append(p.uniq[o : o + c])
                gs.append(self.grads[o : o + c])
                o += c
        return {n: (np.concatenate(i), np.concatenate(g)) for n, (i, g) in out.items()}

    def exchange(self, pull: StepPlan | None = None, want_dense: bool = False) -> Exchange:
        return Exchange(self.plan, self.grads, self.dense, pull, want_dense, self.dense_read)

    def opt_fields(self) -> dict[str, Any]:
        return opt_fields(self.optimizer, self.lr, self.warmup)

    def push(self, ps: PSClient) -> None:
        """Send them: one Step call per PS (the PS applies the optimizer with ``lr``; None:
        the PS's own)."""
        ps.exchange(self.exchange(), self.opt_fields(), self.transfer)


def opt_fields(optimizer: str | None, lr: float | None, warmup: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if optimizer is not None:
        out["opt"] = optimizer
    if lr is not None:
        out["lr"] = lr
    if warmup:
        out["warmup"] = warmup
    return out


def forward_backward(
    tower: DenseTower, batch: Batch, plan: StepPlan, rows: np.ndarray
) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
    """Forward and backward of ``batch`` with its unique embedding rows ``rows``
    ``[plan.size, dim]``: ``(mean loss, gradient of the unique rows, dense gradients)``.

    The rows are one leaf tensor; ``F.embedding(plan.inverse, leaf)`` expands them to
    ``[n, F, D]``, so autograd sums the gradients of duplicate ids itself."""
    leaf = torch.from_numpy(rows).requires_grad_(True)
    emb = F.embedding(torch.from_numpy(plan.inverse), leaf)
    tower.zero_grad(set_to_none=True)  # fresh grad tensors: a push in flight keeps its own
    logits = tower(_tensor(batch.dense), emb)
    loss = F.binary_cross_entropy_with_logits(logits, _tensor(batch.labels))
    loss.backward()
    if leaf.grad is None:
        raise DLRoverError("the DLRM tower produced no gradient for the embedding rows")
    dense = {n: p.grad.numpy() for n, p in tower.named_parameters() if p.grad is not None}
    return float(loss.detach()), leaf.grad.numpy(), dense


def step_plan(
    ps: PSClient, batch: Batch, names: Sequence[str], rows: Sequence[int | None]
) -> StepPlan:
    """The routing of ``batch``'s ids (static tables wrapped into their rows)."""
    ids = np.stack(embedding_ids(batch.sparse, rows), axis=1)
    return ps.plan(ids, names)


def compute_step(
    tower: DenseTower,
    ps: PSClient,
    batch: Batch,
    names: Sequence[str],
    rows: Sequence[int | None],
    lr: float | None,
    *,
    sync: DenseSync | None = None,
    optimizer: str | None = None,
    transfer: str = "fp32",
    warmup: int = 0,
) -> tuple[float, StepGrads]:
    """The pull and compute half of :func:`train_step`: ``(mean loss, gradients to push)``.

    One Step call per PS reads the batch's rows (and the dense parameters when ``sync`` says
    so)."""
    want = sync is None or sync.due()
    plan = step_plan(ps, batch, names, rows)
    ex = Exchange(pull_plan=plan, want_dense=want)
    got, dense = ps.exchange(ex, opt_fields(optimizer, lr, warmup), transfer)
    assert got is not None
    read = ex.dense_versions if want else dict(ps.dense_versions)
    if want:
        load_dense(tower, dense)
        ps.dense_versions = dict(read)
        if sync is not None:
            sync.done()
    loss, grads, dense_grads = forward_backward(tower, batch, plan, got)
    if sync is not None:
        sync.steps_since += 1
    return loss, StepGrads(plan, grads, dense_grads, lr, optimizer, transfer, read, warmup)


def train_step(
    tower: DenseTower,
    ps: PSClient,
    batch: Batch,
    names: Sequence[str],
    rows: Sequence[int | None],
    lr: float | None,
    *,
    sync: DenseSync | None = None,
    optimizer: str | None = None,
    transfer: str = "fp32",
    warmup: int = 0,
) -> float:
    """One asynchronous SGD step on ``batch``, not overlapped; returns its mean BCE loss.

    Reads the batch's embedding rows (unique ids per table) and the dense parameters (each
    step, or as ``sync`` says), runs forward and backward, then pushes the gradients of the
    unique rows and the dense gradients; the PS applies ``optimizer`` (None: its default,
    Adagrad) with ``lr`` (None: the PS's own). Raises :class:`PSUnavailable` when a PS cannot
    be reached (redo the step).

    :class:`Worker` overlaps instead: each step's single round trip per PS carries the previous
    step's gradients and a later batch's ids (see :class:`StepTimes` and the module docstring)."""
    loss, grads = compute_step(
        tower,
        ps,
        batch,
        names,
        rows,
        lr,
        sync=sync,
        optimizer=optimizer,
        transfer=transfer,
        warmup=warmup,
    )
    grads.push(ps)
    return loss


@dataclass
class StepTimes:
    """Where a worker's steps went (seconds, summed): ``plan`` routing the ids, ``wait``
    blocked on a PS reply the step needed, ``compute`` forward + backward (+ loading the
    dense parameters), ``flush`` draining pushes before a shard is reported; ``exchange`` the
    round trips' own time (in the background when overlapped)."""

    steps: int = 0
    plan: float = 0.0
    wait: float = 0.0
    compute: float = 0.0
    flush: float = 0.0
    exchange: float = 0.0
    exchanges: int = 0

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


# --- evaluation against the PS ---------------------------------------------------------------


def ps_lookup(ps: PSClient, spec: JobSpec) -> LookupFn:
    """A :data:`~dlrover_core.training.model.LookupFn` that pulls rows from the PS set.

    Pulling creates rows for ids the PS has not seen (with their deterministic initial value),
    as training would."""
    names = feature_keys(spec.model)
    rows = table_rows(spec)

    def lookup(sparse: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(pull_embeddings(ps, names, embedding_ids(sparse, rows)))

    return lookup


def evaluate_on_ps(
    spec: JobSpec, ps: PSClient, n: int | None = None, data: DataSource | None = None
) -> tuple[float, float]:
    """``(auc, logloss)`` of the model held by the PS set on ``n`` held-out rows (default
    ``data.eval_rows`` of the spec)."""
    tower = DenseTower(spec.model)
    load_dense(tower, ps.pull_dense())
    source = data if data is not None else from_spec(spec)
    batch = source.eval_rows(spec.data.eval_rows if n is None else n)
    return evaluate(tower, ps_lookup(ps, spec), batch)
