"""Everything that runs a job (IO at the edge; decisions come from ``planner/`` and ``faults/``).

- ``controller.py``: the job master as a reconcile loop (desired vs observed nodes, write-ahead
  state, the run lease, every exit path stops the nodes and writes the report).
- ``state.py``: the master's durable state (nodes with incarnations, refs and relaunch budgets;
  PS-set generations; plans; faults) in ``master.json``; ``shards.py``: the shard queue
  (exactly once, SQLite).
- ``service.py``: the ``dlrover.Master`` gRPC service; ``master_client.py``: a node's side of it.
- ``backends/``: ``base.py`` (the protocol: NodeSpec, NodeHandle, NodeExit, Backend, RunLease),
  ``local.py`` (process groups on this machine).
- ``strategies/``: ``base.py`` (the seam), ``ps/`` (parameter servers, workers, checkpoints,
  PS control calls).
- ``node.py``: ``dlrover-rm node ps|worker``, the one command a backend runs for a node.
- ``files.py``: atomic writes, the file lease, the disk reserve; ``wire.py``: the gRPC framing
  and the per-job token; ``report.py``: report.json and report.png; ``job.py``: ``train`` and
  ``status`` for the API; ``profiler.py``: short real trials.
"""
