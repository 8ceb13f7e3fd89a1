"""The all-reduce strategy: torchrec DistributedModelParallel ranks, elastic by generations.

- :mod:`dlrover_core.allreduce_config`: options (sharding types, backend, checkpoint
  interval) and ``validate_allreduce``, the pure check the controller runs before any process
  (pure configuration, below the runtime: the planner reads it too).
- :mod:`.trainer`: one rank's DMP model (torchrec planner for the current world size) and its
  lockstep steps.
- :mod:`.checkpoint`: atomic DCP checkpoints with the shard bookkeeping (exactly once),
  resharded loads, the one-process model for evaluation.
- :mod:`.agent`: the rank process (``python -m dlrover_core.runtime.strategies.allreduce.agent``).
- :mod:`.launch`: what the controller needs to start, resize and read a group.
"""
