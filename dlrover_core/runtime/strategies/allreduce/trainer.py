"""One rank's model and training steps: torchrec ``DistributedModelParallel`` over the
project's DLRM, sharded by torchrec's planner for the current world size.

- The model is :class:`~dlrover_core.training.model.LocalDLRM` (torchrec
  ``EmbeddingBagCollection`` + the DLRM dense tower), its tables declared on the meta device so
  no rank allocates tables it does not hold. The embedding optimizer is fused into the backward
  pass (``apply_optimizer_in_backward``: torch Adagrad / SGD / Adam become fbgemm's
  EXACT_ADAGRAD / EXACT_SGD / ADAM); the dense tower (and any data-parallel table) is
  data-parallel under DDP with the same optimizer; one ``CombinedOptimizer`` holds both, so one
  ``state_dict`` checkpoints everything.
- The sharding plan: ``EmbeddingShardingPlanner`` with a ``Topology`` of ``world_size`` ranks
  on one host kind (``cpu`` with gloo, ``cuda`` with nccl) and, per table, the sharding types
  the options allow (on CPU only table_wise, column_wise, table_column_wise, data_parallel run;
  see :mod:`.config`). ``collective_plan``: rank 0 plans and broadcasts, so all ranks agree.
- Steps (:meth:`RankTrainer.train_rows`): the group trains a *round* of row ranges in lockstep.
  :func:`round_steps` and :func:`rank_slices` split the round's rows into global batches of
  ``world_size x batch_size``; rank r takes rows ``[r*b, (r+1)*b)`` of each. Every rank runs the
  same number of steps with the same batch shape, so no collective waits for a rank that has
  run out: a short last batch is padded with weight-0 rows (they add nothing to the loss or the
  gradients, and are not counted as samples).

Loss: binary cross-entropy with logits, averaged over the rank's real rows. DDP averages the
dense gradients over ranks; the embedding rows get the sum of the ranks' gradients. Adagrad is
invariant to that constant scale (up to its epsilon), which is why the group reaches the AUC of
one process on the same rows (benchmarks/allreduce_auc.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint
import torch.distributed.optim
import torch.nn.functional as F
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrover_core.allreduce_config import AllReduceOptions, table_sharding_types
from dlrover_core.errors import InputError
from dlrover_core.spec import JobSpec
from dlrover_core.training.data import Batch, DataSource, from_spec
from dlrover_core.training.model import DenseTower, LocalDLRM, to_kjt

# torch.distributed.checkpoint/.optim and torchrec.distributed are imported at the top so a
# pre-warmed rank has them loaded before its gate (torch.distributed.optim's import
# TorchScript-compiles optimizers: ~2 s here, measured; apply_optimizer_in_backward needs it)

__all__ = [
    "RankTrainer",
    "RoundResult",
    "build_plan",
    "rank_slices",
    "round_steps",
]

RowRange = tuple[int, int]


# --- the split of a round (pure) --------------------------------------------------------------


def round_steps(total_rows: int, world_size: int, batch_size: int) -> int:
    """Steps every rank runs for a round of ``total_rows`` rows."""
    if world_size < 1 or batch_size < 1:
        raise InputError(f"world_size ({world_size}) and batch_size ({batch_size}) must be >= 1")
    return math.ceil(max(total_rows, 0) / (world_size * batch_size))


def rank_slices(
    ranges: Sequence[RowRange], step: int, rank: int, world_size: int, batch_size: int
) -> list[RowRange]:
    """Row ranges rank ``rank`` trains at ``step`` of the round over ``ranges`` (in order,
    concatenated): positions ``[step*W*b + rank*b, +b)`` of the concatenation, cut at range
    boundaries. Empty when the rank's part is past the round's end."""
    lo = step * world_size * batch_size + rank * batch_size
    hi = lo + batch_size
    out: list[RowRange] = []
    pos = 0
    for start, end in ranges:
        n = end - start
        a, b = max(lo, pos), min(hi, pos + n)
        if a < b:
            out.append((start + a - pos, start + b - pos))
        pos += n
        if pos >= hi:
            break
    return out


# --- model and plan ---------------------------------------------------------------------------


_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adagrad": torch.optim.Adagrad,
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
}


def _compute_device(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build_plan(
    model: torch.nn.Module,
    spec: JobSpec,
    world_size: int,
    options: AllReduceOptions,
    backend: str,
    group: dist.ProcessGroup | None,
) -> Any:
    """torchrec's sharding plan for ``world_size`` ranks (collective: rank 0 plans)."""
    constraints = {
        t.name: ParameterConstraints(
            sharding_types=list(table_sharding_types(spec, t.name, options))
        )
        for t in spec.model.embedding_tables
    }
    topology = Topology(
        world_size=world_size,
        compute_device="cuda" if backend == "nccl" else "cpu",
        local_world_size=world_size,
    )
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    sharders: list[Any] = [EmbeddingBagCollectionSharder()]
    if group is None:
        return planner.plan(model, sharders)
    return planner.collective_plan(model, sharders, group)


def plan_summary(plan: Any) -> dict[str, str]:
    """``{table: "sharding_type@ranks"}`` of a torchrec plan (for logs and checkpoints)."""
    out: dict[str, str] = {}
    for module_plan in plan.plan.values():
        for name, ps in module_plan.items():
            ranks = sorted(set(ps.ranks or []))
            out[name] = f"{ps.sharding_type}@{','.join(map(str, ranks))}"
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class RoundResult:
    steps: int
    samples: int  # real rows this rank trained
    loss_sum: float  # sum of per-row loss over the real rows


class RankTrainer:
    """One rank of the group: the DMP model, its optimizer, the data, and lockstep rounds.

    Needs an initialised default process group (``rank``/``world_size`` are read from it)."""

    def __init__(
        self,
        spec: JobSpec,
        options: AllReduceOptions | None = None,
        *,
        backend: str = "gloo",
        data: DataSource | None = None,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.spec = spec
        self.options = options or AllReduceOptions()
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.batch_size = spec.training.batch_size
        self.data = data if data is not None else from_spec(spec)
        self.device = _compute_device(backend)

        # the tables on the meta device (DMP materialises only this rank's shards; the full
        # tables' init alone took ~0.45 s here); the tower and the row counts real
        with torch.device("meta"):
            model = LocalDLRM(spec.model)
        if spec.training.seed is not None:
            torch.manual_seed(spec.training.seed)  # every rank the same dense start
        model.tower = DenseTower(spec.model)
        model._rows = torch.tensor(model.rows, dtype=torch.int64)
        self.keys = list(model.keys)
        opt_cls = _OPTIMIZERS[spec.training.optimizer.name]
        lr = spec.training.optimizer.lr
        apply_optimizer_in_backward(opt_cls, model.ebc.parameters(), {"lr": lr})
        self.plan = build_plan(model, spec, self.world_size, self.options, backend, group)
        self.plan_summary = plan_summary(self.plan)
        self.model = DistributedModelParallel(model, device=self.device, plan=self.plan)
        dense = KeyedOptimizerWrapper(
            dict(in_backward_optimizer_filter(self.model.named_parameters())),
            lambda params: opt_cls(params, lr=lr),  # type: ignore[call-arg]
        )
        self.optimizer = CombinedOptimizer([self.model.fused_optimizer, dense])
        self._dense_opt = dense
        self._lr = lr
        self.dense_warmup = 0  # steps over which the dense lr ramps up (set for a fresh group)
        self.steps = 0
        self.samples = 0

    def warm_up_dense(self, steps: int) -> None:
        """Ramp the dense lr up linearly over the next ``steps`` steps (as the PS does with
        ``training.dense_warmup``): a fresh group, new or carried forward, meets a fresh
        Adagrad, whose first update is ``lr·sign(g)`` on every dense weight."""
        self.dense_warmup = max(0, int(steps))
        self._warmup_from = self.steps

    # --- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: the model (sharded tables as ShardedTensors) and both
        optimizers' state."""
        return {"model": self.model.state_dict(), "optim": self.optimizer.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])

    # --- training ------------------------------------------------------------------------------

    def _read(self, slices: Sequence[RowRange], pad_from: RowRange) -> tuple[Batch, int]:
        parts = [self.data.rows(a, b) for a, b in slices]
        n = sum(len(p) for p in parts)
        if n < self.batch_size:  # pad with weight-0 copies of real rows
            filler = parts[0] if n else self.data.rows(pad_from[0], pad_from[1])
            if len(filler) == 0:
                raise InputError(
                    f"rows {pad_from} hold no readable record to pad a batch with; check "
                    "data.path for a file with malformed lines only"
                )
            reps = math.ceil((self.batch_size - n) / len(filler))
            parts += [filler] * reps
        dense = np.concatenate([p.dense for p in parts])[: self.batch_size]
        sparse = np.concatenate([p.sparse for p in parts])[: self.batch_size]
        labels = np.concatenate([p.labels for p in parts])[: self.batch_size]
        return Batch(dense, sparse, labels, 0, 0), n

    def step(self, batch: Batch, real: int) -> float:
        """One synchronous step on a full-size batch whose first ``real`` rows count.
        Returns the summed loss of the real rows."""
        dense = torch.from_numpy(batch.dense).to(self.device)
        labels = torch.from_numpy(batch.labels).to(self.device)
        weight = torch.zeros(self.batch_size, device=self.device)
        weight[:real] = 1.0
        kjt = to_kjt(batch.sparse, self.keys).to(self.device)
        logits = self.model(dense, kjt)
        per_row = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
        loss_sum = (per_row * weight).sum()
        (loss_sum / max(real, 1)).backward()
        if self.dense_warmup:
            k = self.steps - self._warmup_from + 1
            scale = min(1.0, k / self.dense_warmup)
            for g in self._dense_opt.param_groups:
                g["lr"] = self._lr * scale
            if scale >= 1.0:
                self.dense_warmup = 0
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps += 1
        self.samples += real
        return float(loss_sum.detach())

    def train_rows(self, ranges: Sequence[RowRange]) -> RoundResult:
        """Train this rank's part of a round over ``ranges`` (every rank calls this with the
        same ranges; every rank runs :func:`round_steps` steps)."""
        total = sum(e - s for s, e in ranges)
        n_steps = round_steps(total, self.world_size, self.batch_size)
        samples, loss = 0, 0.0
        for s in range(n_steps):
            slices = rank_slices(ranges, s, self.rank, self.world_size, self.batch_size)
            batch, real = self._read(slices, ranges[0])
            loss += self.step(batch, real)
            samples += real
        return RoundResult(n_steps, samples, loss)
