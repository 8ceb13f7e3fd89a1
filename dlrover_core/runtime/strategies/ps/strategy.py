"""The PS strategy as the controller sees it: node commands and evaluation."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dlrover_core.runtime.strategies.base import NodeCommand
from dlrover_core.spec import JobSpec
from dlrover_core.types import Role

log = logging.getLogger(__name__)


class PSStrategy:
    name = "ps"

    def roles(self) -> tuple[Role, ...]:
        return (Role.PS, Role.WORKER)

    def argv(self, spec: JobSpec, cmd: NodeCommand) -> list[str]:
        p = spec.pacing
        common = [
            "--run-dir",
            cmd.run_dir,
            "--master",
            cmd.master,
            "--incarnation",
            str(cmd.incarnation),
        ]
        if cmd.role is Role.PS:
            argv = [
                "ps",
                *common,
                "--index",
                str(cmd.node_id),
                "--num-ps",
                str(cmd.num_ps),
                "--generation",
                str(cmd.generation),
                "--ckpt-dir",
                cmd.ckpt_dir,
                "--lr",
                repr(spec.training.optimizer.lr),
                "--checkpoint-every-s",
                repr(max(2.0, 4 * p.heartbeat_interval_s)),
                "--heartbeat-s",
                repr(p.heartbeat_interval_s),
                "--dead-after-s",
                repr(p.dead_after_s),
            ]
            if cmd.restore_from:
                argv += [
                    "--restore-from",
                    ",".join(cmd.restore_from),
                    "--restore-seq",
                    str(cmd.restore_seq),
                ]
            return argv
        return ["worker", *common, "--node-id", str(cmd.node_id), "--threads", str(cmd.cores)]

    def evaluate(self, spec: JobSpec, ps_addresses: Sequence[str], token: str) -> float | None:
        from dlrover_core.runtime.strategies.ps.client import PSClient
        from dlrover_core.runtime.strategies.ps.worker import evaluate_on_ps

        tables = {t.name: spec.model.table_dim(t) for t in spec.model.embedding_tables}
        # a PS that cannot be reached raises (DLRoverError): the controller waits for its
        # relaunch rather than end the job on a model that lost updates
        with PSClient(list(ps_addresses), token, tables) as client:
            auc, _ = evaluate_on_ps(spec, client)
        return float(auc)
