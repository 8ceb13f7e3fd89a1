"""Training pieces the runtime builds on.

- ``data``: row-addressed data sources (synthetic Criteo-like generator, Criteo TSV reader)
  and the ``Batch`` they return; torch-free.
- ``metrics``: rank AUC and log loss over numpy arrays; torch-free.
- ``model``: DLRM from torchrec modules (``DenseTower`` for the PS runtime, ``LocalDLRM`` as
  the single-process baseline) and ``evaluate``.

Import the submodules directly; this package imports nothing so that torch stays optional
for the master.
"""
