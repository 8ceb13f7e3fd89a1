"""What a first run's start leaves on the table, and whether measured CPU utilisation would
tell the model more (a diagnostic on the simulator; issue 10, session 18).

    python benchmarks/sim_first_runs.py [--seed 0] [--jobs 300] [--sigma-u 0.1] [--two-sided]
        [--json OUT]

dlrover-rm runs the trace once. For every first run (``-r0``) its first measured
configuration c0 is taken, and one sample of it is drawn from the truth (3 % noise). Each
row below is a configuration, judged on the truth by the oracle's per-core rate and speed
(medians, p25):

* ``c0``: the start itself;
* ``prior`` / ``prior@0.8``: the best point of the oracle's grid (true memory per node)
  under the bottleneck model at its prior centres, θ = min_elasticity / 0.8;
* ``fit-x``: the same, the model fitted to the one sample;
* ``fit-x+u``: the sample plus the CPU utilisation the simulator reports for c0 (workers'
  mean, the busiest PS) as evidence on the worker and PS stage rates: one-sided by default
  (a stage is at least X / utilisation fast; ``--two-sided``: equal), width ``--sigma-u``;
* ``fit-x+u_true``: the same with the true busy shares X/Xw and X/Xps.

Session 18, seed 0 (the start at DLRover's 8 GiB workers): c0 0.854 / 0.813 (per-core /
speed), prior 0.914 / 0.950, fit-x 0.914 / 0.950, fit-x+u 0.907 / 0.953, fit-x+u_true
0.923 / 0.964. The start lost to its own model's best point on a grid that prices memory at
what the job uses: the fix was the first run's worker memory (``prior_start_worker_memory_mib``).
The utilisation the simulator reports adds nothing (its idle base hides the busy share);
the true busy shares add about a point.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_core.model.throughput import PSBottleneckThroughputModel, effective_cores
from dlrover_core.planner.config import PlannerConfig
from dlrover_core.sim import engine as E
from dlrover_core.sim import truth as T
from dlrover_core.sim.runner import POLICIES, _oracle_of_job, cluster_capacity, policy_factories
from dlrover_core.sim.trace import generate_trace
from dlrover_core.types import Sample

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sim_bounds", ROOT / "benchmarks" / "sim_bounds.py")
assert _spec is not None and _spec.loader is not None
bounds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bounds)


class WithUtilisation(PSBottleneckThroughputModel):
    """The bottleneck form's MAP fit to one sample, with utilisation evidence on two of its
    stage rates (a diagnostic: not used by the planner)."""

    def fit_with(
        self, s: Sample, uw: float, up: float, sigma: float, one_sided: bool
    ) -> WithUtilisation:
        self.fit([s])
        th0 = self.coef_array_.copy()
        w, p, lw, lp = (np.array([float(v)]) for v in s.config)
        y = math.log(s.throughput_sps)
        pm, ps = self._prior()
        has = ps > 0

        def stages(th: Any) -> tuple[Any, Any]:
            lr, lrp, _, lkw, lkp, beta, _ = th
            xw = w * effective_cores(lw, math.exp(lkw), self.worker_overhead_cores)
            xp = effective_cores(lp, math.exp(lkp), self.ps_overhead_cores) * math.exp(lrp)
            return lr + np.log(xw), lr + np.log(xp * p**beta)

        def residuals(th: Any) -> Any:
            lxw, lxp = stages(th)
            gaps = [lxw - (y - math.log(uw)), lxp - (y - math.log(up))]
            if one_sided:
                gaps = [np.minimum(0.0, g) for g in gaps]
            return np.concatenate(
                [(self._log_x(th, w, p, lw, lp) - y) / 0.05, (th[has] - pm[has]) / ps[has]]
                + [g / sigma for g in gaps]
            )

        self.coef_array_ = least_squares(residuals, th0, method="trf", max_nfev=300).x
        self._cache()
        return self


def main() -> None:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--seed", type=int, default=0, help="trace seed")
    ap.add_argument("--jobs", type=int, default=300, help="jobs in the generated trace")
    ap.add_argument("--sigma-u", type=float, default=0.1, help="width of the utilisation evidence")
    ap.add_argument("--two-sided", action="store_true", help="utilisation evidence as equality")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the figures as JSON")
    a = ap.parse_args()
    jobs = generate_trace(a.jobs, seed=a.seed)
    engine = E.Engine(
        jobs, policy_factories(POLICIES)["dlrover-rm"](), cluster_capacity(jobs), a.seed, None
    )
    engine.run()
    rng = np.random.default_rng(1)
    names = ("c0", "prior", "prior@0.8", "fit-x", "fit-x+u", "fit-x+u_true")
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    axes = (T._ORACLE_W, T._ORACLE_P, T._ORACLE_CPU, T._ORACLE_CPU)
    price = PlannerConfig().memory_gib_per_core
    for r in engine.runs:
        if not r.job.name.endswith("-r0") or not r.samples:
            continue
        t, o = r.job.truth, _oracle_of_job(r.job)
        w, p, lw, lp = r.samples[0].config
        x, xw, xps, _ = t.rates([lw] * w, [lp] * p)
        wu, pu = t.cpu_used(np.full(w, lw), np.full(p, lp), x, xw)
        uw, up = float(np.mean(wu)) / lw, float(np.max(pu)) / lp
        x0 = t.throughput(w, p, lw, lp)
        s = Sample(w, p, lw, lp, x0 * math.exp(rng.normal(0, 0.03)), batch_size=512)
        gx, cores, mem, ok = bounds._truth_grid(r.job)

        def judge(
            m: PSBottleneckThroughputModel,
            theta: float | None = None,
            gx: Any = gx, cores: Any = cores, mem: Any = mem, ok: Any = ok, o: Any = o,
        ) -> tuple[float, float]:  # fmt: skip
            xp = np.transpose(m.predict_grid(*axes), (0, 2, 1, 3))
            j = bounds._objective(xp, cores, mem, ok)
            if theta is not None:
                j = np.log(np.maximum(xp, 1e-12)) - theta * np.log(cores + mem / 1024 / price)
                j[~ok] = -np.inf
            i = int(np.argmax(j))
            return gx.flat[i] / cores.flat[i] / o.throughput_per_core, gx.flat[i] / o.throughput_sps

        one = not a.two_sided
        rows["c0"].append((x0 / (w * lw + p * lp) / o.throughput_per_core, x0 / o.throughput_sps))
        rows["prior"].append(judge(PSBottleneckThroughputModel.from_priors((w, p, lw, lp))))
        rows["prior@0.8"].append(
            judge(PSBottleneckThroughputModel.from_priors((w, p, lw, lp)), 0.8)
        )
        rows["fit-x"].append(judge(PSBottleneckThroughputModel(batch_size=512).fit([s])))
        rows["fit-x+u"].append(
            judge(WithUtilisation(batch_size=512).fit_with(s, uw, up, a.sigma_u, one))
        )
        rows["fit-x+u_true"].append(
            judge(WithUtilisation(batch_size=512).fit_with(s, x / xw, x / xps, a.sigma_u, one))
        )
    print(f"dlrover-rm first runs, {a.jobs} jobs, seed {a.seed}: per-core / speed vs the oracle")
    doc: dict[str, Any] = {"jobs": a.jobs, "seed": a.seed, "rows": {}}
    for k, v in rows.items():
        m = np.array(v)
        print(
            f"  {k:<13} n={len(m)}  per-core {np.median(m[:, 0]):.3f} "
            f"(p25 {np.percentile(m[:, 0], 25):.3f})  speed {np.median(m[:, 1]):.3f} "
            f"(p25 {np.percentile(m[:, 1], 25):.3f})"
        )
        doc["rows"][k] = {
            "n": len(m),
            "per_core_median": float(np.median(m[:, 0])),
            "per_core_p25": float(np.percentile(m[:, 0], 25)),
            "speed_median": float(np.median(m[:, 1])),
            "speed_p25": float(np.percentile(m[:, 1], 25)),
        }
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
