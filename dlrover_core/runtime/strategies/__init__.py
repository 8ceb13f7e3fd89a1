"""Training strategies, picked here and nowhere else: ``ps`` (parameter servers +
asynchronous workers) and ``allreduce`` (torchrec DistributedModelParallel ranks in groups).
The job master holds one (:class:`~dlrover_core.runtime.strategies.base.Strategy`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dlrover_core.errors import InputError
from dlrover_core.runtime.strategies.base import Strategy
from dlrover_core.spec import JobSpec


def _ps(spec: JobSpec, run_dir: str | os.PathLike[str], **options: Any) -> Strategy:
    from dlrover_core.runtime.strategies.ps.strategy import PSStrategy

    return PSStrategy(**options)


def _allreduce(spec: JobSpec, run_dir: str | os.PathLike[str], **options: Any) -> Strategy:
    from dlrover_core.runtime.strategies.allreduce.strategy import AllReduceStrategy

    return AllReduceStrategy.for_run(os.fspath(run_dir), spec=spec, **options)


STRATEGIES: dict[str, Callable[..., Strategy]] = {"ps": _ps, "allreduce": _allreduce}


def strategy_for(spec: JobSpec, run_dir: str | os.PathLike[str], **options: Any) -> Strategy:
    """The strategy ``spec.strategy`` names, for the job in ``run_dir`` (``options``: the
    strategy's own, e.g. an all-reduce job's ``options`` and ``warm_wait_s``)."""
    make = STRATEGIES.get(spec.strategy)
    if make is None:
        raise InputError(
            f"strategy: {spec.strategy!r} is not one of {', '.join(sorted(STRATEGIES))}"
        )
    return make(spec, run_dir, **options)
