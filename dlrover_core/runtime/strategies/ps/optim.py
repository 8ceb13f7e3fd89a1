"""The optimizers a PS applies: Adagrad, Adam and SGD, with torch's own update rules.

Embedding rows are updated *sparsely* (only the rows a push touched, duplicates summed first),
the way ``torch.optim.Adagrad`` / ``torch.optim.SGD`` treat a sparse gradient and the way
``torch.optim.SparseAdam`` does Adam (moments of untouched rows are left alone; the bias
correction uses the table's own count of updates). Dense parameters follow ``torch.optim.Adagrad``,
``torch.optim.Adam`` and ``torch.optim.SGD`` (single-tensor code paths, no weight decay, no
momentum). Every update is a handful of vectorised torch index ops on the gathered rows
(``index_select`` / ``index_copy_`` / ``index_add_``); there is no per-row Python loop.

An optimizer travels with each push as ``{"opt": name, "lr": lr}`` (the worker reads
``training.optimizer`` from the job spec), so a PS process needs no optimizer flag; a table
remembers the optimizer its state was built with and refuses a push that asks for another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

NAMES = ("adagrad", "adam", "sgd")
SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2}
DEFAULT_EPS = {"adagrad": 1e-10, "adam": 1e-8, "sgd": 0.0}  # torch's defaults
BETAS = (0.9, 0.999)


@dataclass(frozen=True)
class OptimizerConfig:
    """What a push asks the PS to apply. ``eps`` None: torch's default for ``name``."""

    name: str = "adagrad"
    lr: float = 0.05
    eps: float | None = None
    betas: tuple[float, float] = BETAS

    def __post_init__(self) -> None:
        if self.name not in SLOTS:
            raise ValueError(f"unknown optimizer {self.name!r}; the PS runs one of {list(NAMES)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"optimizer lr must be a positive finite number, got {self.lr}")

    @property
    def slots(self) -> int:
        return SLOTS[self.name]

    @property
    def epsilon(self) -> float:
        return DEFAULT_EPS[self.name] if self.eps is None else float(self.eps)

    def fields(self) -> dict[str, Any]:
        return {"opt": self.name, "lr": self.lr}


def sparse_update(
    cfg: OptimizerConfig,
    weights: torch.Tensor,
    slots: list[torch.Tensor],
    rows: torch.Tensor,
    grads: torch.Tensor,
    step: int | npt.NDArray[np.int64],
) -> None:
    """Update ``weights[rows]`` (and the optimizer ``slots``) in place with the summed
    ``grads`` of the unique ``rows``; ``step`` is the update count of the rows' table, this
    one included (one for all, or per row when the rows come from several tables)."""
    lr = cfg.lr
    if cfg.name == "sgd":
        weights.index_add_(0, rows, grads, alpha=-lr)
        return
    if cfg.name == "adagrad":
        (acc,) = slots
        a = acc.index_select(0, rows).addcmul_(grads, grads)
        acc.index_copy_(0, rows, a)
        weights.index_add_(0, rows, grads / a.sqrt_().add_(cfg.epsilon), alpha=-lr)
        return
    m, v = slots
    b1, b2 = cfg.betas
    m_old = m.index_select(0, rows)
    v_old = v.index_select(0, rows)
    m_upd = (grads - m_old).mul_(1 - b1)
    v_upd = (grads * grads).sub_(v_old).mul_(1 - b2)
    m.index_add_(0, rows, m_upd)
    v.index_add_(0, rows, v_upd)
    numer = m_upd.add_(m_old)
    denom = v_upd.add_(v_old).sqrt_().add_(cfg.epsilon)
    if isinstance(step, np.ndarray):
        t = step.astype(np.float64)
        size = torch.from_numpy((lr * np.sqrt(1 - b2**t) / (1 - b1**t)).astype(np.float32))
        weights.index_add_(0, rows, numer.div_(denom).mul_(size[:, None]), alpha=-1.0)
        return
    step_size = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
    weights.index_add_(0, rows, numer.div_(denom), alpha=-step_size)


def dense_update(
    cfg: OptimizerConfig,
    weight: torch.Tensor,
    slots: list[torch.Tensor],
    grad: torch.Tensor,
    step: int,
) -> None:
    """Update a dense parameter in place as torch's optimizer would at update ``step``."""
    lr = cfg.lr
    if cfg.name == "sgd":
        weight.add_(grad, alpha=-lr)
        return
    if cfg.name == "adagrad":
        (acc,) = slots
        acc.addcmul_(grad, grad, value=1)
        weight.addcdiv_(grad, acc.sqrt().add_(cfg.epsilon), value=-lr)
        return
    m, v = slots
    b1, b2 = cfg.betas
    m.lerp_(grad, 1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2**step)).add_(cfg.epsilon)
    weight.addcdiv_(m, denom, value=-lr / (1 - b1**step))
