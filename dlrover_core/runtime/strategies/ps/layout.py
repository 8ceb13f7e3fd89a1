"""The PS strategy's part of a run directory, spelled once:

RUN/ps/gen-G/ps-I/   PS I of set generation G: its checkpoints (ckpt-*.npz + manifest)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

PS_ROOT = "ps"
SET_DIR = re.compile(r"^gen-(\d+)$")
PS_DIR = re.compile(r"^ps-(\d+)$")


def ps_root(run_dir: str | os.PathLike[str]) -> Path:
    """Every PS set's checkpoints."""
    return Path(run_dir) / PS_ROOT


def set_dir(run_dir: str | os.PathLike[str], generation: int) -> Path:
    """The checkpoints of PS-set generation ``generation``."""
    return ps_root(run_dir) / f"gen-{generation}"


def ps_dir(run_dir: str | os.PathLike[str], generation: int, index: int) -> Path:
    """PS ``index`` of generation ``generation``: its own checkpoint directory."""
    return set_dir(run_dir, generation) / f"ps-{index}"
