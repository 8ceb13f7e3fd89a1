"""Training pieces the runtime builds on.

- ``data``: row-addressed data sources (synthetic Criteo-like generator, Criteo TSV reader)
  and the ``Batch`` they return; torch-free.
- ``metrics``: rank AUC and log loss over numpy arrays; torch-free.
- ``model``: DLRM from torchrec modules (``DenseTower`` for the PS runtime, ``LocalDLRM`` as
  the single-process baseline) and ``evaluate``.
- ``export``: the trained model out of a run directory (``model.pt`` + ``model_card.json``)
  and :func:`load_exported`, which rebuilds it from torch/torchrec modules.

Import the submodules directly; this package imports nothing so that torch stays optional
for the master.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_exported"]


def __getattr__(name: str) -> Any:
    # lazy, so `import dlrover_core.training` stays torch-free
    if name == "load_exported":
        from dlrover_core.training.export import load_exported

        return load_exported
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
