"""The optimizers a PS applies: Adagrad, Adam and SGD, with torch's own update rules.

Embedding rows are updated *sparsely* (only the rows a push touched, duplicates summed first),
the way ``torch.optim.Adagrad`` / ``torch.optim.SGD`` treat a sparse gradient and the way
``torch.optim.SparseAdam`` does Adam (moments of untouched rows are left alone; the bias
correction uses the table's own count of updates). Dense parameters follow ``torch.optim.Adagrad``,
``torch.optim.Adam`` and ``torch.optim.SGD`` (single-tensor code paths, no weight decay, no
momentum). Every update is a handful of vectorised numpy ops on the gathered rows (gather, update,
scatter; the rows of one update are unique, so a scatter never loses an add); there is no
per-row Python loop. numpy rather than torch: the PS process never imports torch, which keeps
its start-up (a relaunch under load) and its resident memory small; the numbers match torch's
optimizers within float32 rounding (tests compare them).

An optimizer travels with each push as ``{"opt": name, "lr": lr, "warmup": n}`` (the worker
reads ``training.optimizer`` and ``training.dense_warmup`` from the job spec), so a PS process
needs no optimizer flag; a table remembers the optimizer its state was built with and refuses a
push that asks for another.

``warmup`` (dense parameters, Adagrad and Adam): update k of a dense parameter (its own count,
kept in checkpoints) uses ``lr · min(1, k / warmup)``. Why: with a zero accumulator Adagrad's (and
Adam's) first updates are ``lr · sign(g)`` on *every* weight whatever the gradient's size, the
largest steps of the run, taken on the least information; DLRM's bottom MLP ends in a ReLU and
those steps switch most of its 16 output units off within the first 1-3 updates
(15 -> 6 alive in the single-process model). When all of them die the model never sees the dense
features again: held-out AUC ~0.67 instead of ~0.78 on small.yaml, the "collapse" of a few runs
in a hundred (more with stale gradients, which repeat those blind steps). A linear warm-up of
the dense lr over the first updates keeps 8-16 of them alive (docs/decisions.md, "PS data plane").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

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
    warmup: int = 0  # dense updates over which a dense parameter's lr ramps up (0: none)

    def __post_init__(self) -> None:
        if self.name not in SLOTS:
            raise ValueError(f"unknown optimizer {self.name!r}; the PS runs one of {list(NAMES)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"optimizer lr must be a positive finite number, got {self.lr}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"dense warmup must be a whole number >= 0, got {self.warmup!r}")

    @property
    def slots(self) -> int:
        return SLOTS[self.name]

    @property
    def epsilon(self) -> float:
        return DEFAULT_EPS[self.name] if self.eps is None else float(self.eps)

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"opt": self.name, "lr": self.lr}
        if self.warmup:
            out["warmup"] = self.warmup
        return out

    def dense_lr(self, step: int) -> float:
        """The lr of a dense parameter's update number ``step`` (1 = its first). SGD is not
        warmed up: its steps are proportional to the gradient from the first one."""
        if self.warmup and self.name != "sgd" and step < self.warmup:
            return self.lr * max(step, 1) / self.warmup
        return self.lr


F32 = npt.NDArray[np.float32]


def sparse_update(
    cfg: OptimizerConfig,
    weights: F32,
    slots: list[F32],
    rows: npt.NDArray[np.int64],
    grads: F32,
    step: int | npt.NDArray[np.int64],
) -> None:
    """Update ``weights[rows]`` (and the optimizer ``slots``) in place with the summed
    ``grads`` of the *unique* ``rows``; ``step`` is the update count of the rows' table, this
    one included (one for all, or per row when the rows come from several tables)."""
    lr = np.float32(cfg.lr)
    if cfg.name == "sgd":
        weights[rows] -= lr * grads
        return
    eps = np.float32(cfg.epsilon)
    if cfg.name == "adagrad":
        (acc,) = slots
        a = acc[rows]
        a += grads * grads
        acc[rows] = a
        np.sqrt(a, out=a)
        a += eps
        weights[rows] -= lr * (grads / a)
        return
    m, v = slots
    b1, b2 = cfg.betas
    m_old = m[rows]
    v_old = v[rows]
    m_new = m_old + (grads - m_old) * np.float32(1 - b1)
    v_new = v_old + (grads * grads - v_old) * np.float32(1 - b2)
    m[rows] = m_new
    v[rows] = v_new
    denom = np.sqrt(v_new)
    denom += eps
    t = np.asarray(step, dtype=np.float64)
    size = (cfg.lr * np.sqrt(1 - b2**t) / (1 - b1**t)).astype(np.float32)
    if size.ndim:
        size = size[:, None]
    weights[rows] -= size * (m_new / denom)


def dense_update(cfg: OptimizerConfig, weight: F32, slots: list[F32], grad: F32, step: int) -> None:
    """Update a dense parameter in place as torch's optimizer would at update ``step``."""
    lr = np.float32(cfg.lr)
    if cfg.name == "sgd":
        weight -= lr * grad
        return
    eps = np.float32(cfg.epsilon)
    if cfg.name == "adagrad":
        (acc,) = slots
        acc += grad * grad
        weight -= lr * (grad / (np.sqrt(acc) + eps))
        return
    m, v = slots
    b1, b2 = cfg.betas
    m += (grad - m) * np.float32(1 - b1)
    v *= np.float32(b2)
    v += np.float32(1 - b2) * grad * grad
    denom = np.sqrt(v) / np.float32(math.sqrt(1 - b2**step)) + eps
    weight -= np.float32(lr / (1 - b1**step)) * (m / denom)
