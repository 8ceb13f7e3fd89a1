"""Resource numbers a PS worker heartbeats: CPU and RSS of its process tree, samples/s."""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

from dlrover_core.units import mib_from_bytes


class Usage:
    """CPU (percent of one core, like ``top``) and RSS of this process and its children."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        self._last: dict[int, float] = {}
        self._last_t = time.monotonic()
        self._cpu_times()  # prime

    def _procs(self) -> list[Any]:
        try:
            return [self._proc, *self._proc.children(recursive=True)]
        except self._psutil.Error:
            return [self._proc]

    def _cpu_times(self) -> dict[int, float]:
        out = {}
        for p in self._procs():
            try:
                t = p.cpu_times()
                out[p.pid] = float(t.user + t.system)
            except self._psutil.Error:
                continue
        return out

    def sample(self) -> tuple[float, float]:
        now = time.monotonic()
        times = self._cpu_times()
        # a process first seen now brings its whole past CPU time: count only known ones
        used = sum(t - self._last[pid] for pid, t in times.items() if pid in self._last)
        dt = max(now - self._last_t, 1e-6)
        self._last, self._last_t = times, now
        rss = 0
        for p in self._procs():
            try:
                rss += int(p.memory_info().rss)
            except self._psutil.Error:
                continue
        cap = 100.0 * (os.cpu_count() or 1)
        return min(cap, max(0.0, 100.0 * used / dt)), mib_from_bytes(rss)


class Rate:
    """Samples/s over a sliding window of ``window_s``."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._points: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, t: float, total: int) -> None:
        with self._lock:
            self._points.append((t, total))
            # keep one point at or before the window's start
            while len(self._points) > 2 and self._points[1][0] <= t - self.window_s:
                self._points.popleft()

    def rate(self, now: float, total: int) -> tuple[float, float]:
        """(samples/s, window seconds) up to ``now`` with ``total`` samples so far."""
        with self._lock:
            if not self._points:
                return 0.0, 0.0
            t0, n0 = self._points[0]
        span = now - t0
        if span <= 0:
            return 0.0, 0.0
        return (total - n0) / span, span
