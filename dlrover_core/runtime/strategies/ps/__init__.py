"""The parameter-server strategy: ``server`` (the PS process: tables, dense weights, Adagrad,
checkpoints), ``client`` (the workers' and the master's view of a PS set), ``checkpoint``
(atomic checksummed checkpoints, re-sharding on load), ``partition`` (id and dense routing),
``worker`` (the torchrec DLRM worker loop over the master's shard queue)."""
