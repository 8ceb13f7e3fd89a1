"""Export a run's model: its strategy reads what it trained (``Strategy.read_model``), the
training side writes the strategy-free files (:mod:`dlrover_core.training.export`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlrover_core.runtime.strategies import strategy_for
from dlrover_core.training.export import read_run_spec, write_export


def export_run(
    run_dir: str | os.PathLike[str], out: str | os.PathLike[str], *, evaluate: bool = True
) -> dict[str, Any]:
    """Export the model the run in ``run_dir`` trained into ``out``; returns the model card."""
    rd = Path(run_dir)
    spec, _ = read_run_spec(rd)
    trained = strategy_for(spec, rd).read_model(spec, rd)
    return write_export(rd, out, trained, evaluate=evaluate)
