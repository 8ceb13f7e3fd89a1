"""The strategy seam: what the controller asks of a training strategy.

The controller (:class:`~dlrover_core.runtime.controller.JobMaster`) owns what every job has:
the lease, the master service, the shard queue, launching and killing nodes through the
backend, liveness, observations, the planner's calls, signals and the report. It *holds* a
strategy (``ps`` or ``allreduce``, picked in :mod:`dlrover_core.runtime.strategies`) and asks
it what differs between them:

- the nodes: which roles, each node's command (the same on every backend: ``dlrover-rm node
  <role> ...``) and environment;
- the desired nodes for a plan: :meth:`Strategy.start`, :meth:`Strategy.apply` (a PS-set
  generation, a group of ranks), and :meth:`Strategy.resume` after a master restart;
- what an exit means (:meth:`Strategy.on_exit`), the per-tick work (:meth:`Strategy.tick`: PS
  restores and PS-set changes, a resize's progress), whether a change is under way;
- when the job is finished, how a clean stop keeps what a resume needs, what it adds to the
  report, how its trained model is evaluated and read for export (:meth:`Strategy.read_model`;
  its run-directory layout is its own);
- how it re-plans (:meth:`Strategy.replan`: the decision; the controller applies it).

A strategy gets the controller in :meth:`Strategy.bind` and calls its public helpers
(``launch``, ``launch_successor``, ``adopt_plan``, ``event``, ``call_planner``...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dlrover_core.faults import ExitClass
from dlrover_core.runtime.backends.base import NodeExit
from dlrover_core.runtime.nodes import Node
from dlrover_core.spec import JobSpec
from dlrover_core.types import ResourcePlan, Role

if TYPE_CHECKING:
    from dlrover_core.runtime.controller import JobMaster

TrainedModel = tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]
"""A run's trained model for export: tensors by key, the tables' layout, its checkpoints."""


@dataclass(frozen=True)
class NodeCommand:
    """Everything a node needs to know, as the arguments of ``dlrover-rm node``."""

    role: Role
    node_id: int
    incarnation: int
    master: str  # HOST:PORT of the master's service
    run_dir: str
    cores: int
    generation: int = 0  # a PS: its set's generation
    num_ps: int = 0  # a PS: the size of its set
    ckpt_dir: str = ""  # a PS: its own checkpoint directory
    restore_from: Sequence[str] = ()  # a PS: the checkpoint directories to re-shard from
    restore_seq: int = 0  # the done_seq tag of those sources
    rank: int = 0  # an all-reduce rank: its rank in its group
    world_size: int = 0  # ... the group's size
    rdzv: str = ""  # ... HOST:PORT of the rendezvous store (the master's)
    rdzv_prefix: str = ""  # ... the group's keys in it
    after_generation: int | None = None  # ... pre-warmed: join once this group left


class Strategy(Protocol):
    """A training strategy, as the job master holds it."""

    name: str
    hold_workers_at_the_end: bool
    """Workers wait at the end until the job may end (PS: the model is evaluated on the PS
    first); ranks leave at their final checkpoint by themselves."""

    # --- the nodes ---------------------------------------------------------------------------
    def roles(self) -> tuple[Role, ...]:
        """The roles this strategy's nodes have."""
        ...

    def argv(self, spec: JobSpec, cmd: NodeCommand) -> list[str]:
        """The node's command (after the interpreter / console script)."""
        ...

    def node_command(self, n: Node, cmd: NodeCommand) -> NodeCommand:
        """``cmd`` (the controller's part) with this strategy's fields for ``n``."""
        ...

    def node_env(self, cores: int) -> dict[str, str]:
        """Environment variables a node of this strategy needs besides the controller's."""
        ...

    # --- the master side ---------------------------------------------------------------------
    def bind(self, job: JobMaster) -> None:
        """Called once, before the job starts: the controller this strategy acts through."""
        ...

    def prepare(self) -> None:
        """After the controller's set-up (state, service), before the first node starts."""
        ...

    def start(self, plan: ResourcePlan) -> None:
        """A new job: adopt ``plan`` (adjusted to the strategy) and start its nodes."""
        ...

    def resume(self, last: ResourcePlan) -> None:
        """A master restarted on the run: adopt the nodes of the record, relaunch the lost."""
        ...

    def apply(self, new: ResourcePlan) -> None:
        """Execute the difference between the current plan and ``new``."""
        ...

    def on_exit(self, n: Node, e: NodeExit, cls: ExitClass) -> None:
        """A current node exited (its handle already cleared): what it means, what to do."""
        ...

    def tick(self) -> None:
        """The strategy's part of a reconcile pass."""
        ...

    def changing(self) -> bool:
        """A change of the node set is under way (the job cannot end, nor re-plan)."""
        ...

    def finished(self) -> bool:
        """Every shard is done: may the job end now?"""
        ...

    def replan(self) -> ResourcePlan | None:
        """A new plan, or None; the controller applies it when it differs and fits."""
        ...

    def flush_for_stop(self) -> str:
        """A clean stop: keep what a resume needs so that it replays nothing; says what."""
        ...

    def report(self) -> dict[str, Any]:
        """What this strategy adds to ``report.json`` (e.g. its change downtimes)."""
        ...

    def close(self) -> None:
        """The job is over (every node stopped): release what :meth:`prepare` took."""
        ...

    def read_model(self, spec: JobSpec, run_dir: Path) -> TrainedModel:
        """The model the run in ``run_dir`` trained, for export: its tensors in the export
        layout (:mod:`dlrover_core.training.export`), the tables' layout, the checkpoints it
        came from. Raises ``ExportError`` when there is none to read."""
        ...

    def evaluate(self, spec: JobSpec, ps_addresses: Sequence[str], token: str) -> float | None:
        """Held-out AUC of the trained model (``None`` when there is nothing to evaluate on).
        Raises :class:`DLRoverError` when a node it needs cannot be reached: the controller
        then waits for that node's relaunch instead of ending on a model that lost updates."""
        ...
