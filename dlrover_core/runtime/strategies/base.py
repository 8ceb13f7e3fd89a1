"""The strategy seam: what the controller asks of a training strategy.

A strategy says which nodes a plan needs, what command starts each one (the same command on
every backend: ``dlrover-rm node <role> ...``), and how to evaluate the trained model at the
end. The controller owns everything else (launching, liveness, relaunches, the shard queue).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dlrover_core.spec import JobSpec
from dlrover_core.types import Role


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
    """A training strategy (``ps`` or ``allreduce``)."""

    name: str

    def roles(self) -> tuple[Role, ...]:
        """The roles this strategy's nodes have."""
        ...

    def argv(self, spec: JobSpec, cmd: NodeCommand) -> list[str]:
        """The node's command (after the interpreter / console script)."""
        ...

    def evaluate(self, spec: JobSpec, ps_addresses: Sequence[str], token: str) -> float | None:
        """Held-out AUC of the trained model (``None`` when there is nothing to evaluate on).
        Raises :class:`DLRoverError` when a node it needs cannot be reached: the controller
        then waits for that node's relaunch instead of ending on a model that lost updates."""
        ...
