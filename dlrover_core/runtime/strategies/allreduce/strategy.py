"""The all-reduce strategy as the controller sees it: rank commands and evaluation."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from dlrover_core.errors import DLRoverError
from dlrover_core.runtime.strategies.allreduce.agent import CKPT_DIR
from dlrover_core.runtime.strategies.allreduce.config import AllReduceOptions
from dlrover_core.runtime.strategies.base import NodeCommand
from dlrover_core.spec import JobSpec
from dlrover_core.types import Role

log = logging.getLogger(__name__)


class AllReduceStrategy:
    """Ranks only (role worker); the model lives in the group's DCP checkpoints under
    ``ckpt_root`` (default ``RUN_DIR/allreduce-ckpt``)."""

    name = "allreduce"

    def __init__(self, ckpt_root: str | Path, options: AllReduceOptions | None = None) -> None:
        self.ckpt_root = Path(ckpt_root)
        self.options = options or AllReduceOptions()

    @classmethod
    def for_run(
        cls, run_dir: str | Path, options: AllReduceOptions | None = None
    ) -> AllReduceStrategy:
        return cls(Path(run_dir) / CKPT_DIR, options)

    def roles(self) -> tuple[Role, ...]:
        return (Role.WORKER,)

    def argv(self, spec: JobSpec, cmd: NodeCommand) -> list[str]:
        argv = [
            "rank",
            "--run-dir",
            cmd.run_dir,
            "--master",
            cmd.master,
            "--node-id",
            str(cmd.node_id),
            "--rank",
            str(cmd.rank),
            "--world-size",
            str(cmd.world_size),
            "--generation",
            str(cmd.generation),
            "--rdzv",
            cmd.rdzv,
            "--rdzv-prefix",
            cmd.rdzv_prefix,
            "--incarnation",
            str(cmd.incarnation),
            "--ckpt-dir",
            str(self.ckpt_root),
            "--threads",
            str(cmd.cores),
        ]
        if cmd.after_generation is not None:
            argv += ["--after-generation", str(cmd.after_generation)]
        return argv + self.options.to_argv()

    def evaluate(self, spec: JobSpec, ps_addresses: Sequence[str], token: str) -> float | None:
        from dlrover_core.runtime.strategies.allreduce.checkpoint import evaluate_checkpoint

        if spec.data.eval_rows <= 0:
            return None
        try:
            auc, _ = evaluate_checkpoint(spec, self.ckpt_root)
            return float(auc)
        except DLRoverError as e:
            log.warning("evaluation failed: %s", e)
            return None
