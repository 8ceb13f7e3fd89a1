"""The parameter-server strategy: ``store`` (a PS's embedding rows and their index), ``shard``
(a PS's tables, dense weights and optimizer steps), ``service`` (the ``dlrover.PS`` gRPC
service), ``server`` (the PS process: restore, run-dir files, master link), ``client`` (the
workers' and the master's view of a PS set), ``checkpoint`` (atomic checksummed checkpoints,
re-sharding on load), ``partition`` (id and dense routing), ``worker`` (the torchrec DLRM worker
loop over the master's shard queue)."""
