"""The simulator's speed shortcuts change no result (issue 10): each is compared with the
plain computation it replaces, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from dlrover_core.sim.engine import Engine
from dlrover_core.sim.policies import _DecayingHistograms
from dlrover_core.sim.runner import run_policy, simulate
from dlrover_core.sim.trace import generate_trace


def _reference_percentiles(values: list[list[float]], ts: list[float]) -> list[list[float]]:
    """One histogram per row, each filled on its own (np.log per row, np.searchsorted)."""
    h = _DecayingHistograms
    out = []
    for r in range(len(values[0])):
        w = np.zeros(h.n_buckets)
        for t, obs in zip(ts, values, strict=True):
            if not obs[r]:
                continue
            v = np.maximum(np.asarray(obs[r], dtype=np.float64), h.first)
            idx = np.minimum((np.log(v / h.first) / np.log(h.ratio)).astype(int), h.n_buckets - 1)
            np.add.at(w, idx, 2.0 ** (t / 86_400.0))
        cw = np.cumsum(w)
        found = np.searchsorted(cw, np.asarray((0.5, 0.9, 0.95)) * cw[-1])
        out.append([h._tops()[min(int(i), h.n_buckets - 1)] for i in found])
    return out


def test_vpa_histogram_rows_equal_one_histogram_per_row() -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        hist = _DecayingHistograms(86_400.0, 4)
        values, ts = [], []
        for k in range(int(rng.integers(1, 30))):
            t = float(k * 300 + rng.uniform(0, 10))
            obs = [
                rng.integers(1, 40_000, size=int(rng.integers(0, 9))).astype(float).tolist()
                for _ in range(4)
            ]
            hist.add_rows(obs, t)
            values.append(obs)
            ts.append(t)
        got = hist.percentiles((0.5, 0.9, 0.95))
        ref = _reference_percentiles(values, ts)
        for r in range(4):
            if hist.count[r]:
                assert got[r] == ref[r]


def test_ps_memory_peak_is_the_largest_ps() -> None:
    rng = np.random.default_rng(2)
    for job in generate_trace(60, 4):
        t = job.truth
        for p in (1, 2, 3, 7, 16, 32):
            for n in [0.0, float(job.samples_total), *rng.uniform(0, job.samples_total, 5)]:
                assert t.ps_memory_peak(p, float(n)) == float(t.ps_memory_used(p, n).max())


@pytest.mark.parametrize("name", ["vpa", "optimus"])
def test_event_refresh_shortcut_changes_nothing(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full refresh at every event (no shortcut, no cached next-up time) gives the same
    outcomes, job by job."""
    jobs = generate_trace(60, 9)
    fast = run_policy(jobs, name, 9)
    monkeypatch.setattr(Engine, "_refresh_event", Engine._refresh)
    orig = Engine._next_event

    def slow_next_event(self: Engine, run: object, t: float) -> float:
        run.next_up_s = -float("inf")  # type: ignore[attr-defined]
        return orig(self, run, t)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "_next_event", slow_next_event)
    slow = run_policy(generate_trace(60, 9), name, 9)
    fast.pop("cpu_s")
    slow.pop("cpu_s")
    assert fast == slow


def test_parallel_simulate_equals_serial() -> None:
    """The pool (the oracle search as its own task, ratios filled in the parent) gives the
    serial run's metrics."""
    names = ["manual", "oracle", "autopilot"]
    par = simulate(40, 3, names, processes=2, keep_jobs=True)
    ser = simulate(40, 3, names, processes=1, keep_jobs=True)
    assert par == ser
