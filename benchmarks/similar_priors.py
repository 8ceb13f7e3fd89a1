"""Similar-job priors, leave-one-signature-out, in the simulator (issue 38).

    PYTHONPATH=$PWD python benchmarks/similar_priors.py --seeds 11-15 \\
        [--families 12] [--singles 6] [--json benchmarks/results/similar_priors.json]

Per seed, a history of varied jobs: ``--families`` model families, each a signature drawn as
the simulator's trace draws one (sim/trace.py) and three variants of it that a user would
submit under a new signature: the same model renamed, one more embedding table (a little
more work per sample on the workers, the PS and the network), and twice the data. Plus
``--singles`` unrelated one-off signatures. Every signature runs once under dlrover-rm in
one simulated cluster; its run is its history record (final plan, peaks, speed samples),
with the features of the spec the simulated job stands for (sim/spec_bridge.py).

Then each signature is hidden in turn and planned as a new job from the rest of the history:

- ``cold``: today's stage 1 for a signature without runs (DLRover's cold start, shaped by the
  bottleneck model's priors: ``cold_start: prior``);
- ``similar``: stage 1 with the similar-job prior (planner/similar.py);
- ``regressor`` (first plan only): a scikit-learn RandomForestRegressor from the features to
  the final configuration of the history's runs (log counts and CPUs), the alternative
  issue 38 names.

Measured: the first plan's true per-core throughput over the oracle's (sim/truth.py), its
speed over the oracle's, whether its PS memory holds the true end-of-training peak; and the
JCT of the hidden job simulated alone from each first plan (same seed, same noise).

The similar prior's numbers (max distance, slack, k, refine) were chosen on seeds 1-3;
report other seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, too

from dlrover_core.planner import Planner, PlannerConfig
from dlrover_core.planner.similar import SimilarConfig, job_features
from dlrover_core.sim.engine import Engine, cluster_capacity, job_view
from dlrover_core.sim.rm_policy import DLRoverRMPolicy
from dlrover_core.sim.spec_bridge import job_view_to_spec
from dlrover_core.sim.trace import TraceJob, _make_signature, _Signature
from dlrover_core.types import HistoryRecord, NodeResources, ResourcePlan, RolePlan
from dlrover_core.units import mib_from_gib

TUNED_ON = (1, 2, 3)
VARIANTS = ("base", "renamed", "plus_table", "double_data")
DAY_S = 86_400.0


# --- the history ---------------------------------------------------------------------------
def _variant(sig: _Signature, kind: str) -> _Signature:
    t = sig.truth
    if kind == "plus_table":
        s = sig.sparse_features
        more = (s + 1) / s
        t = dataclasses.replace(
            t,
            c_w=t.c_w * (1 + 0.5 * (more - 1)),  # lookups are part of a worker's work
            c_p=t.c_p * more,
            net_bytes_per_sample=t.net_bytes_per_sample * more,
            emb_k=t.emb_k * more,
            _shares={},
            _oracle={},
        )
        return dataclasses.replace(sig, truth=t, sparse_features=s + 1)
    if kind == "double_data":
        t = dataclasses.replace(t, samples_total=2 * t.samples_total, _shares={}, _oracle={})
        return dataclasses.replace(sig, truth=t, duration_s=2 * sig.duration_s)
    return sig


def _job(sig: _Signature, name: str, index: int, submit_s: float) -> TraceJob:
    tot = sig.manual.total
    quota = NodeResources(
        max(2 * tot.cpu_millicores, 16_000), max(2 * tot.memory_mib, mib_from_gib(64))
    )
    samples = sig.truth.samples_total
    return TraceJob(
        index=index,
        name=f"job{index:04d}-{name}",
        user=sig.user,
        signature=name,
        recurring=False,
        submit_s=submit_s,
        manual_plan=sig.manual,
        quota=quota,
        batch_size=sig.batch_size,
        samples_total=samples,
        rows=max(1, samples // sig.epochs),
        epochs=sig.epochs,
        embedding_dim=sig.embedding_dim,
        sparse_features=sig.sparse_features,
        dense_features=sig.dense_features,
        size_class=sig.size_class,
        fatal_at_fraction=None,
        manual_duration_s=sig.duration_s,
        truth=dataclasses.replace(sig.truth, _shares={}, _oracle={}),
    )


def make_jobs(seed: int, families: int, singles: int) -> list[TraceJob]:
    rng = np.random.default_rng([seed, 38])
    sigs: list[tuple[str, _Signature]] = []
    for f in range(families):
        base = _make_signature(rng, f, seed)
        sigs.extend((f"fam{f:02d}-{v}", _variant(base, v)) for v in VARIANTS)
    for s in range(singles):
        sigs.append((f"single{s:02d}", _make_signature(rng, 1000 + s, seed)))
    times = np.sort(rng.uniform(0, 2 * DAY_S, len(sigs)))
    order = rng.permutation(len(sigs))
    return [
        _job(sigs[int(k)][1], sigs[int(k)][0], i, float(t))
        for i, (k, t) in enumerate(zip(order, times, strict=True))
    ]


def spec_key(job: TraceJob) -> str:
    return job_view_to_spec(job_view(job)).signature_key


def run_history(jobs: Sequence[TraceJob], seed: int) -> dict[str, HistoryRecord]:
    """Each signature's run under dlrover-rm (one cluster), as its history record with the
    features of its spec; keyed by the spec's signature key."""
    eng = Engine(jobs, DLRoverRMPolicy(), cluster_capacity(jobs), seed)
    eng.run()
    out: dict[str, HistoryRecord] = {}
    for j in jobs:
        for r in eng.history.get(j.signature, []):
            if not r.succeeded:
                continue
            spec = job_view_to_spec(job_view(j))
            out[spec.signature_key] = dataclasses.replace(
                r,
                signature=spec.signature_key,
                extra={**r.extra, "features": job_features(spec).to_dict(), "run_id": j.name},
            )
    return out


# --- the first plan ------------------------------------------------------------------------
class _Primed(DLRoverRMPolicy):
    """dlrover-rm whose stage 1 also sees the given records of other signatures."""

    def __init__(self, records: Sequence[HistoryRecord], similar: SimilarConfig | None) -> None:
        super().__init__()
        self.records = list(records)
        self.similar = similar
        self.first: ResourcePlan | None = None

    def _job(self, job: Any) -> Any:
        st = self._jobs.get(job.name)
        if st is None:
            st = super()._job(job)
            st.planner.similar = self.similar
        return st

    def initial_plan(
        self, job: Any, history: Sequence[HistoryRecord], now_s: float
    ) -> ResourcePlan:
        st = self._job(job)
        recs = [dataclasses.replace(r, finished_at_s=now_s - 3600.0) for r in self.records]
        plan: ResourcePlan = st.planner.initial_plan(recs, now_s)
        st.prior = []  # no run of this signature: nothing for stage 2 from the history
        st.plans.append(plan)
        self.first = plan
        return plan


def plan_quality(job: TraceJob, plan: ResourcePlan) -> dict[str, Any]:
    t = job.truth
    w, p = plan.workers, plan.ps
    x = t.throughput(w.count, p.count, w.resources.cpu_cores, p.resources.cpu_cores)
    cores = w.count * w.resources.cpu_cores + p.count * p.resources.cpu_cores
    orc = t.oracle_config(job.quota.cpu_cores, job.quota.memory_mib)
    need = float(t.ps_memory_used(p.count, job.samples_total).max()) if p.count else 0.0
    return {
        "config": [w.count, p.count, w.resources.cpu_cores, p.resources.cpu_cores],
        "per_core_vs_oracle": (x / cores) / orc.throughput_per_core if cores else 0.0,
        "speed_vs_oracle": x / orc.throughput_sps,
        "ps_memory_holds": bool(p.resources.memory_mib >= need),
    }


def simulate_alone(
    job: TraceJob, records: Sequence[HistoryRecord], similar: SimilarConfig | None, seed: int
) -> tuple[ResourcePlan | None, dict[str, Any]]:
    j = dataclasses.replace(job, submit_s=0.0, index=0)
    pol = _Primed(records, similar)
    eng = Engine([j], pol, cluster_capacity([j]), seed)
    eng.run()
    run = eng.runs[0]
    return pol.first, {
        "status": run.status,
        "jct_s": run.end_s - j.submit_s if run.status == "completed" else None,
        "ooms": run.oom_count,
        "ops": run.scaling_ops,
    }


def regressor_plans(
    jobs: Sequence[TraceJob], records: dict[str, HistoryRecord], seed: int
) -> dict[str, ResourcePlan]:
    """Leave-one-signature-out first plans from a RandomForestRegressor (features → log
    workers, log PS, log worker CPU, log PS CPU of the final configurations); memory as the
    cold start sizes it."""
    from sklearn.ensemble import RandomForestRegressor

    keys = [spec_key(j) for j in jobs]
    feats = {
        k: job_features(job_view_to_spec(job_view(j))) for k, j in zip(keys, jobs, strict=True)
    }
    levels = PlannerConfig().cpu_levels_millicores

    def lvl(c: float) -> int:
        return min(levels, key=lambda v: abs(v - c * 1000))

    out: dict[str, ResourcePlan] = {}
    for k, j in zip(keys, jobs, strict=True):
        train = [kk for kk in keys if kk != k and kk in records]
        x = np.array([feats[kk].vector() for kk in train])
        y = np.array(
            [
                [
                    math.log(records[kk].final_plan.workers.count),
                    math.log(max(1, records[kk].final_plan.ps.count)),
                    math.log(records[kk].final_plan.workers.resources.cpu_cores),
                    math.log(max(0.5, records[kk].final_plan.ps.resources.cpu_cores)),
                ]
                for kk in train
            ]
        )
        m = RandomForestRegressor(n_estimators=100, min_samples_leaf=2, random_state=seed)
        m.fit(x, y)
        w, p, wc, pc = np.exp(m.predict(np.array([feats[k].vector()]))[0])
        spec = job_view_to_spec(job_view(j))
        cold = Planner(spec, PlannerConfig.from_spec(spec), similar=None).initial_plan((), 0.0)
        bounds = Planner(spec).bounds
        workers, ps, _ = bounds.fit(
            RolePlan(max(1, round(w)), NodeResources(lvl(wc), cold.workers.resources.memory_mib)),
            RolePlan(max(1, round(p)), NodeResources(lvl(pc), cold.ps.resources.memory_mib)),
        )
        out[k] = cold.replace(workers=workers, ps=ps)
    return out


# --- one seed ------------------------------------------------------------------------------
def run_seed(
    seed: int, families: int, singles: int, similar: SimilarConfig, jct: bool = True
) -> dict[str, Any]:
    jobs = make_jobs(seed, families, singles)
    records = run_history(jobs, seed)
    try:
        reg = regressor_plans(jobs, records, seed)
    except ImportError:
        reg = {}
    rows: list[dict[str, Any]] = []
    for j in jobs:
        key = spec_key(j)
        rest = [r for k, r in records.items() if k != key]
        row: dict[str, Any] = {"signature": j.signature}
        for name, cfg in (("cold", None), ("similar", similar)):
            if jct:
                first, outcome = simulate_alone(j, rest, cfg, seed)
            else:
                spec = job_view_to_spec(job_view(j))
                pl = Planner(spec, PlannerConfig.from_spec(spec), similar=cfg)
                first = pl.initial_plan(
                    [dataclasses.replace(r, finished_at_s=-1.0) for r in rest], 0.0
                )
                outcome = {}
            assert first is not None
            row[name] = {**plan_quality(j, first), **outcome}
            if name == "similar":
                row["learnt_from"] = (first.reasons[0] if first.reasons else "")[:240]
                row["used_similar"] = first.reasons[0].startswith("similar-job prior")
        if key in reg:
            row["regressor"] = plan_quality(j, reg[key])
        rows.append(row)
    return {"seed": seed, "jobs": rows}


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def med(vals: Sequence[float]) -> float | None:
        return float(np.median(vals)) if vals else None

    out: dict[str, Any] = {"signatures": len(rows)}
    groups = {
        "all": rows,
        "with_family": [r for r in rows if r["signature"].startswith("fam")],
        "singles": [r for r in rows if r["signature"].startswith("single")],
    }
    for g, rs in groups.items():
        d: dict[str, Any] = {"n": len(rs), "used_similar": sum(r["used_similar"] for r in rs)}
        for pol in ("cold", "similar", "regressor"):
            have = [r[pol] for r in rs if pol in r]
            if not have:
                continue
            d[pol] = {
                "per_core_vs_oracle_median": med([h["per_core_vs_oracle"] for h in have]),
                "per_core_vs_oracle_mean": float(np.mean([h["per_core_vs_oracle"] for h in have])),
                "speed_vs_oracle_median": med([h["speed_vs_oracle"] for h in have]),
                "ps_memory_holds": sum(h["ps_memory_holds"] for h in have),
            }
            jcts = [h["jct_s"] for h in have if h.get("jct_s")]
            if jcts:
                d[pol]["jct_median_s"] = med(jcts)
                d[pol]["jct_mean_s"] = float(np.mean(jcts))
                d[pol]["completed"] = len(jcts)
                d[pol]["ooms"] = sum(h.get("ooms", 0) for h in have)
                d[pol]["ops"] = sum(h.get("ops", 0) for h in have)
        both = [
            r["similar"]["jct_s"] / r["cold"]["jct_s"]
            for r in rs
            if r["similar"].get("jct_s") and r["cold"].get("jct_s")
        ]
        if both:
            d["jct_ratio_similar_to_cold_median"] = med(both)
            d["jct_ratio_similar_to_cold_geomean"] = float(np.exp(np.mean(np.log(both))))
        out[g] = d
    return out


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="11-15")
    ap.add_argument("--families", type=int, default=12)
    ap.add_argument("--singles", type=int, default=6)
    ap.add_argument("--max-distance", type=float, default=SimilarConfig.max_distance)
    ap.add_argument("--slack", type=float, default=SimilarConfig.slack)
    ap.add_argument("--k", type=int, default=SimilarConfig.k)
    ap.add_argument("--no-refine", action="store_true")
    ap.add_argument("--scaling", default=SimilarConfig.scaling)
    ap.add_argument("--no-jct", action="store_true", help="first plans only (fast)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    cfg = SimilarConfig(
        k=a.k,
        max_distance=a.max_distance,
        slack=a.slack,
        refine=not a.no_refine,
        scaling=a.scaling,
    )
    seeds = _seeds(a.seeds)
    tuned = [s for s in seeds if s in TUNED_ON]
    t0 = time.perf_counter()
    per_seed = []
    for s in seeds:
        r = run_seed(s, a.families, a.singles, cfg, jct=not a.no_jct)
        r["summary"] = summarise(r["jobs"])
        per_seed.append(r)
        sm = r["summary"]["all"]
        line = f"seed {s}: used similar {sm['used_similar']}/{sm['n']}"
        for pol in ("cold", "similar", "regressor"):
            if pol in sm:
                line += f"  {pol} per-core/oracle {sm[pol]['per_core_vs_oracle_median']:.3f}"
        if "jct_ratio_similar_to_cold_median" in sm:
            fam = r["summary"]["with_family"]
            line += (
                f"  JCT similar/cold median {sm['jct_ratio_similar_to_cold_median']:.3f}"
                f" (family {fam.get('jct_ratio_similar_to_cold_median', float('nan')):.3f})"
            )
        print(line, flush=True)
    pooled = summarise([row for r in per_seed for row in r["jobs"]])
    print(json.dumps(pooled, indent=1))
    if tuned:
        print(f"note: seeds {tuned} were used to choose the similar prior's numbers")
    out = {
        "command": " ".join(sys.argv),
        "config": dataclasses.asdict(cfg),
        "seeds": seeds,
        "tuned_on": list(TUNED_ON),
        "families": a.families,
        "singles": a.singles,
        "wall_s": round(time.perf_counter() - t0, 1),
        "pooled": pooled,
        "per_seed": [
            {"seed": r["seed"], "summary": r["summary"], "jobs": r["jobs"]} for r in per_seed
        ],
    }
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(_rounded(out), indent=None) + "\n")


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v


if __name__ == "__main__":
    main()
