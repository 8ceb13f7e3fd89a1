"""What a person watching a training job sees: a tqdm bar on a terminal (shards done/total,
samples, samples/s, nodes, the plan's stage), periodic log records elsewhere (a KFP pod log,
an Airflow task log, a file), and a note saying *why* when the job is not moving: a PS-set
change in progress (workers wait for the new set), workers (re)starting after a resize or a
relaunch, nodes not started yet.

:func:`progress_view` is pure (a ``MasterState.status()`` dict in, a :class:`ProgressView`
out); :class:`Progress` is the controller's ``on_tick`` hook that shows it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from dlrover_core.runtime.state import GEN_ACTIVE, GEN_FREEZING, GEN_RETIRED, GEN_STARTING

log = logging.getLogger("dlrover_rm.progress")
RANKS_KIND = "ranks"  # the ``kind`` of an all-reduce worker group's generation record


@dataclass(frozen=True)
class ProgressView:
    shards_done: int
    shards_total: int
    samples_done: int
    samples_total: int
    rate_sps: float  # samples of shards counted done, per second, over the master's window
    workers: int  # running
    ps: int  # running
    stage: str
    note: str = ""  # why the job is not moving, when it is not

    def line(self) -> str:
        """One plain line (the log record, and the bar's text after the counts)."""
        text = (
            f"{self.samples_done:,}/{self.samples_total:,} samples, {self.rate_sps:,.0f} "
            f"samples/s, workers {self.workers} ps {self.ps}, plan {self.stage}"
        )
        return f"{text}; {self.note}" if self.note else text

    def short(self) -> str:
        """The bar's text after the shard counts (a terminal line is narrow)."""
        text = (
            f"{self.samples_done:,}/{self.samples_total:,} samples, {self.rate_sps:,.0f}/s, "
            f"{self.workers}w {self.ps}ps, {self.stage}"
        )
        return f"{text} | {self.note}" if self.note else text


def progress_note(status: Mapping[str, Any]) -> str:
    """Why throughput is (or is about to be) 0, from the master's live status; "" when the
    job is simply training."""
    gens = [g for g in status.get("ps", {}).get("generations", []) if isinstance(g, Mapping)]
    changing = [g for g in gens if g.get("state") in (GEN_FREEZING, GEN_STARTING)]
    served = any(g.get("state") in (GEN_ACTIVE, GEN_RETIRED) for g in gens)
    if changing and served:  # the job's first PS set starting is no switch
        g = changing[-1]
        if g.get("kind") == RANKS_KIND:  # an all-reduce job's generations are worker groups
            return (
                f"worker group changing to {int(g.get('count', 0))} ranks (re-forming the "
                "ring): 0 samples/s until the new group trains"
            )
        what = "checkpointing the old set" if g["state"] == GEN_FREEZING else "starting it"
        return (
            f"PS set changing to {int(g.get('count', 0))} PS ({what}): workers wait, so 0 "
            "samples/s until the new set serves"
        )
    nodes = [n for n in status.get("nodes", []) if isinstance(n, Mapping)]
    pending = [n for n in nodes if n.get("state") == "pending"]
    running = [n for n in nodes if n.get("state") == "running"]
    shards = status.get("shards", {})
    if not running:
        if int(shards.get("done", 0)) == 0:
            return "starting the nodes (torch and the first registration take a few seconds)"
        return "no node running: waiting for relaunched nodes"
    restarting = sorted(str(n.get("name")) for n in pending if int(n.get("incarnation", 0)) > 0)
    if restarting:
        return (
            f"{', '.join(restarting)} restarting (a resize or a relaunch): "
            "throughput drops until they register"
        )
    workers_up = any(n.get("role") == "worker" for n in running)
    if pending:
        names = ", ".join(sorted(str(n.get("name")) for n in pending))
        return f"{names} starting (scaling out)" if workers_up else f"{names} starting"
    if not workers_up:
        return "waiting for a worker to start"
    if int(shards.get("done", 0)) == 0:
        return "waiting for the first shard to finish"
    return ""


def progress_view(status: Mapping[str, Any], stage: str | None = None) -> ProgressView:
    shards = status.get("shards", {})
    nodes = [n for n in status.get("nodes", []) if isinstance(n, Mapping)]

    def running(role: str) -> int:
        return sum(1 for n in nodes if n.get("role") == role and n.get("state") == "running")

    return ProgressView(
        shards_done=int(shards.get("done", 0)),
        shards_total=int(shards.get("total", 0)),
        samples_done=int(shards.get("samples_done", 0)),
        samples_total=int(shards.get("samples_total", 0)),
        rate_sps=float(status.get("window_throughput_sps", 0.0) or 0.0),
        workers=running("worker"),
        ps=running("ps"),
        stage=stage or "-",
        note=progress_note(status),
    )


def _width(stream: Any) -> dict[str, Any]:
    """Follow the terminal's size; a terminal that reports none (a pty with no size, some CI
    runners) gets 120 x 24: tqdm would otherwise draw nothing there (it reads 0 columns and
    -1 rows)."""
    import os

    try:
        size = os.get_terminal_size(stream.fileno())
        if size.columns > 0 and size.lines > 0:
            return {"dynamic_ncols": True}
    except (AttributeError, OSError, ValueError):
        pass
    return {"ncols": 120, "nrows": 24}


class Progress:
    """The controller's ``on_tick``: a tqdm bar when ``stream`` is a terminal, else one log
    record (logger ``dlrover_rm.progress``, INFO) every ``log_every_s``, or one plain line on
    ``stream`` when logging would drop INFO records (the CLI's default level). Call
    :meth:`close` when the job is over."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        every_s: float = 0.5,
        log_every_s: float = 15.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.every_s = every_s if self.tty else log_every_s
        self._clock = clock
        self._last = -float("inf")
        self._bar: Any = None
        self.last_view: ProgressView | None = None

    def __call__(self, master: Any) -> None:
        now = self._clock()
        if now - self._last < self.every_s or master.state is None:
            return
        self._last = now
        plan = master.plan
        view = progress_view(master.state.status(), plan.stage.value if plan else None)
        self.show(view)

    def show(self, view: ProgressView) -> None:
        self.last_view = view
        if self.tty:
            self._show_bar(view)
        elif log.isEnabledFor(logging.INFO) and logging.getLogger().handlers:
            log.info("progress: %d/%d shards, %s", view.shards_done, view.shards_total, view.line())
        else:
            self.stream.write(
                f"progress: {view.shards_done}/{view.shards_total} shards, {view.line()}\n"
            )
            self.stream.flush()

    def _show_bar(self, view: ProgressView) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(
                total=max(1, view.shards_total),
                unit="shard",
                file=self.stream,
                **_width(self.stream),
                leave=True,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} shards [{elapsed}]{postfix}",
            )
        bar = self._bar
        if view.shards_total and bar.total != view.shards_total:
            bar.total = view.shards_total
        bar.n = view.shards_done  # may go back: a PS restore replays shards
        bar.set_postfix_str(view.short(), refresh=False)
        bar.refresh()

    def close(self, report: Mapping[str, Any] | None = None) -> None:
        """End the bar; with the job's ``report``, at its final counts (the control loop's
        last tick comes before the last shards are counted)."""
        if self._bar is not None and report is not None and self.last_view is not None:
            v = self.last_view
            self._show_bar(
                ProgressView(
                    int(report.get("shards_done") or 0),
                    int(report.get("shards_total") or v.shards_total),
                    int(report.get("samples_done") or 0),
                    int(report.get("samples_total") or v.samples_total),
                    v.rate_sps,
                    v.workers,
                    v.ps,
                    v.stage,
                    str(report.get("state", "")),
                )
            )
        if self._bar is not None:
            self._bar.close()
            self._bar = None
