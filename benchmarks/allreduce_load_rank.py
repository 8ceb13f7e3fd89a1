"""A *load rank*: the real all-reduce rank agent with a tiny stand-in for the torchrec trainer.

    python benchmarks/allreduce_load_rank.py [--rows-per-s R] [--teardown] rank --run-dir DIR ...

Everything but the model is the production rank (:mod:`dlrover_core.runtime.strategies.
allreduce.agent`, started through :func:`dlrover_core.runtime.node.main` exactly as
``dlrover-rm node rank`` is): registration and heartbeats with the job master, the gloo process
group joined through the master-hosted TCPStore under the group's key prefix, the rounds (rank 0
takes the shards and broadcasts them), DCP checkpoints (``save_collective``: real files, a
commit, a final checkpoint on stop), stop/resize/abort handling and its exit codes. What is
replaced: ``RankTrainer`` by :class:`LoadTrainer`, which trains nothing. A round sleeps
``rows / rate`` for the rows this rank would train (so a round lasts as long as training
would, without using the CPU) and its state is a few small replicated tensors (so a DCP
checkpoint is real but cheap), one of them the number of rows the group trained: the final
checkpoint must hold ``data.rows`` of them when every shard was trained exactly once.

Why the trainer module is replaced in ``sys.modules`` instead of patched: the agent imports
``dlrover_core.runtime.strategies.allreduce.trainer`` in ``_configure`` (so a pre-warmed rank
has torchrec loaded before its gate), and that module imports torchrec at its top: ~+90 MB
RSS and ~+1.5 s CPU per process over torch + DCP (measured here: 360 vs 275 MB RSS, 4.8 vs
3.2 s CPU). At 64 ranks on a 2-core, 23 GiB machine, with a pre-warmed group beside them
during a resize, memory is what bounds the sizes already (~210 MiB a rank as it is). So this module
registers a stand-in module under that name (``RankTrainer = LoadTrainer``; it imports
``torch.distributed.checkpoint`` at its top as the real one does, so pre-warming loads DCP
exactly as in production) and a stand-in for ``torchrec.distributed.planner.types`` (the
agent imports ``PlannerError`` from it). No production file is changed.

The process ends as a production rank does (:func:`dlrover_core.runtime.node.exit_process`:
flush, ``os._exit``, no interpreter teardown, since 98824ba). ``--teardown`` ends it the old
way, returning through Python's finalisation (~0.5 s of CPU per process with torch loaded),
to measure what that cost when a large group leaves at once.

``--rows-per-s`` is each rank's training speed; the file ``RUN_DIR/load-rate`` (a number),
when present, overrides it on every round, so a benchmark can slow the job down or let it
finish quickly (``0`` or ``inf``: no sleep). Torch runs one thread (``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import math
import os
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

for _k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_k] = "1"

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TRAINER_MODULE = "dlrover_core.runtime.strategies.allreduce.trainer"
PLANNER_TYPES_MODULE = "torchrec.distributed.planner.types"
RATE_FILE = "load-rate"
DEFAULT_ROWS_PER_S = 5000.0

RowRange = tuple[int, int]

_rate = DEFAULT_ROWS_PER_S
_rate_file: Path | None = None


def round_steps(total_rows: int, world_size: int, batch_size: int) -> int:
    """The real trainer's split (``trainer.round_steps``; that module imports torchrec)."""
    return math.ceil(max(total_rows, 0) / (world_size * batch_size))


def rank_rows(ranges: Sequence[RowRange], rank: int, world_size: int, batch_size: int) -> int:
    """Rows rank ``rank`` trains in a round over ``ranges``: the real trainer's
    ``rank_slices`` summed over the round's steps (the round's rows, concatenated, cut into
    global batches of ``world_size x batch_size``; rank r takes ``[r*b, (r+1)*b)`` of each)."""
    total = sum(e - s for s, e in ranges)
    full, rest = divmod(total, world_size * batch_size)
    return full * batch_size + min(batch_size, max(0, rest - rank * batch_size))


def rows_per_s() -> float:
    if _rate_file is not None:
        try:
            return float(_rate_file.read_text().strip())
        except (OSError, ValueError):
            pass
    return _rate


@dataclass(frozen=True)
class LoadRound:
    steps: int
    samples: int
    loss_sum: float = 0.0


class LoadTrainer:
    """``RankTrainer``'s interface as the agent uses it, training nothing (module docstring)."""

    def __init__(self, spec: Any, options: Any = None, *, backend: str = "gloo", **_: Any) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.spec = spec
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.batch_size = spec.training.batch_size
        w = self.world_size
        self.plan_summary = {"load": f"replicated@0-{w - 1}"}
        # replicated (the same on every rank: DCP writes them once), so any group size loads
        # any checkpoint; rows_seen counts the group's rows, the others stand in for a model
        self.model_state = {
            "dense": torch.zeros(64, 16),
            "bias": torch.zeros(16),
            "rows_seen": torch.zeros(1, dtype=torch.int64),
        }
        self.optim_state = {"sum": torch.zeros(64, 16)}
        self.model = None  # training.init_from is not supported by the stand-in
        self.steps = 0
        self.samples = 0

    def warm_up_dense(self, steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"model": dict(self.model_state), "optim": dict(self.optim_state)}

    def load_state(self, state: dict[str, Any]) -> None:
        for k, v in state["model"].items():
            self.model_state[k].copy_(v)
        for k, v in state["optim"].items():
            self.optim_state[k].copy_(v)

    def train_rows(self, ranges: Sequence[RowRange]) -> LoadRound:
        total = sum(e - s for s, e in ranges)
        steps = round_steps(total, self.world_size, self.batch_size)
        mine = rank_rows(ranges, self.rank, self.world_size, self.batch_size)
        rate = rows_per_s()
        if 0 < rate < math.inf and mine:
            time.sleep(mine / rate)
        self.model_state["rows_seen"] += total
        self.model_state["dense"].add_(1e-6 * total)
        self.optim_state["sum"].add_(1e-6 * total)
        self.steps += steps
        self.samples += mine
        return LoadRound(steps, mine)


def install() -> None:
    """Register the stand-in trainer (and ``PlannerError``) before the agent imports them."""
    import torch
    import torch.distributed.checkpoint  # as the real trainer module does

    torch.set_num_threads(1)
    mod = types.ModuleType(TRAINER_MODULE)
    mod.RankTrainer = LoadTrainer  # type: ignore[attr-defined]
    mod.round_steps = round_steps  # type: ignore[attr-defined]
    sys.modules[TRAINER_MODULE] = mod
    if PLANNER_TYPES_MODULE not in sys.modules:
        planner = types.ModuleType(PLANNER_TYPES_MODULE)

        class PlannerError(Exception):
            pass

        planner.PlannerError = PlannerError  # type: ignore[attr-defined]
        sys.modules[PLANNER_TYPES_MODULE] = planner


def main(argv: Sequence[str] | None = None) -> int:
    global _rate, _rate_file
    args = list(sys.argv[1:] if argv is None else argv)
    teardown = False
    while args and args[0].startswith("--"):
        opt = args.pop(0)
        if opt == "--rows-per-s":
            _rate = float(args.pop(0))
        elif opt == "--teardown":  # end through the interpreter's teardown (before 98824ba)
            teardown = True
        else:
            print(f"allreduce_load_rank: unknown option {opt}", file=sys.stderr)
            return 2
    if "--run-dir" in args:
        _rate_file = Path(args[args.index("--run-dir") + 1]) / RATE_FILE
    # the agent first: the stand-ins go in after it and before its _configure runs
    import dlrover_core.runtime.strategies.allreduce.agent  # noqa: F401
    from dlrover_core.runtime import node

    install()
    rc = node.main(args)
    if not teardown:
        node.exit_process("rank", rc)  # as a production rank ends (no teardown)
    return rc


if __name__ == "__main__":
    sys.exit(main())
