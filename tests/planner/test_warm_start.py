"""Stage 1: cold start without history, warm start from similar runs (major-cluster mean)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dlrover_core.errors import SpecError
from dlrover_core.planner import Planner, PlannerConfig, major_cluster_mean
from dlrover_core.planner.warm_start import cold_start, similar_runs, warm_start
from dlrover_core.spec import JobSpec
from dlrover_core.types import HistoryRecord, NodeResources, Sample, Stage
from tests.factories import make_plan, make_spec

DAY = 86400.0


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        ([10, 11, 12, 100], 0.5, 11.5),  # median 11.5; the 2 nearest are 11 and 12
        ([5], 0.5, 5.0),
        # median 2; k = ceil(1.5) = 2: 2, then 1 and 3 tie at distance 1: the smaller wins
        ([1, 2, 3], 0.5, 1.5),
        ([4, 6, 20], 0.5, 5.0),  # median 6; nearest 6 and 4
        ([1, 1, 1, 1000], 0.5, 1.0),
        ([1, 2, 3, 4, 5], 1.0, 3.0),  # fraction 1: the plain mean
        ([0, 10, 20, 30, 1000], 0.6, 20.0),  # median 20; k = 3: 20, 10, 30
    ],
)
def test_major_cluster_mean(values: list[float], fraction: float, expected: float) -> None:
    assert major_cluster_mean(values, fraction) == pytest.approx(expected)


def test_major_cluster_mean_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        major_cluster_mean([])


# --- cold start ------------------------------------------------------------------------------

# A worker with nothing observed: 1024 MiB + 64 batches of B·(13 dense + 4·26 bytes of ids)·4 B
# = 1024 + 64·(512·117·4 / 2^20) = 1024 + 14.6 -> 1038 MiB.
WORKER_FLOOR_MIB = 1038

# Two dynamic tables, 10^9 samples at new_id_rate 0.01: 2·(1000 + 10^7) = 20,002,000 rows of
# 16·4·2 + 48 = 176 B, plus 3281 dense params × 8 B: 3357.3 MiB, + 512 runtime = 3869.3,
# × 1.2 margin = 4643.1 -> 4672 MiB (next multiple of 64).
BIG_PS_MIB = 4672
BIG_TABLES: dict[str, Any] = {
    "model__embedding_tables": [
        {"name": "a", "num_embeddings": "dynamic"},
        {"name": "b", "num_embeddings": "dynamic"},
    ],
    "data__rows": 10**9,
}


def dlrover_cold(spec: JobSpec) -> PlannerConfig:
    """DLRover's cold start (1 worker + min PS), not the default prior-optimal one."""
    return PlannerConfig.from_spec(spec, cold_start="dlrover")


@pytest.mark.parametrize(
    ("overrides", "workers", "ps"),
    [
        # quota/5 = 2 CPU, 8 GiB for each node
        ({}, (1, 2000, 8192), (1, 2000, 8192)),
        ({"quota": {"cpu": 10, "memory": "20Gi"}}, (1, 2000, 4096), (1, 2000, 4096)),
        # caps: 16 CPU and 8 GiB
        ({"quota": {"cpu": 100, "memory": "100Gi"}}, (1, 16000, 8192), (1, 16000, 8192)),
        # tiny quota: CPU floor 500m; memory floors: a worker's base, quota/5 = 819 for the PS
        ({"quota": {"cpu": 2, "memory": "4Gi"}}, (1, 500, WORKER_FLOOR_MIB), (1, 500, 819)),
        # PS memory for the rows the tables will hold, when that exceeds quota/5
        (
            {**BIG_TABLES, "quota": {"cpu": 10, "memory": "20Gi"}},
            (1, 2000, 4096),
            (1, 2000, BIG_PS_MIB),
        ),
        # pins are kept; the rest is the default
        (
            {"constraints__workers": {"count": 3, "cpu": 1, "memory": "2Gi"}},
            (3, 1000, 2048),
            (1, 2000, 8192),
        ),
        ({"constraints__ps": {"min": 2, "cpu": "1500m"}}, (1, 2000, 8192), (2, 1500, 8192)),
        # no PS: the PS role is sized at the smallest node (it allocates nothing)
        ({"strategy": "allreduce"}, (1, 2000, 8192), (0, 2000, 512)),
    ],
)
def test_cold_start(
    overrides: dict[str, Any], workers: tuple[int, int, int], ps: tuple[int, int, int]
) -> None:
    spec = make_spec(**overrides)
    plan = Planner(spec, dlrover_cold(spec)).initial_plan(history=(), now_s=123.0)
    assert plan.stage is Stage.COLD_START
    assert plan.created_at_s == 123.0
    assert (plan.workers.count, *plan.workers.resources.to_dict().values()) == workers
    assert (plan.ps.count, *plan.ps.resources.to_dict().values()) == ps
    assert plan.total.fits_in(spec.quota.resources)
    assert any("cold start" in r for r in plan.reasons)


def test_cold_start_shrinks_into_a_small_quota() -> None:
    # 1 worker + 1 PS of 8 GiB do not fit 10 GiB, but the quota/5 rule keeps them at 2 GiB
    spec = make_spec(quota={"cpu": 2, "memory": "10Gi"}, constraints__ps={"memory": "9Gi"})
    plan = Planner(spec).initial_plan()
    assert plan.ps.resources.memory_mib == 9216  # pinned: kept
    assert plan.total.fits_in(spec.quota.resources)


# --- the prior-optimal start (the default for PS jobs) ----------------------------------------


def test_prior_start_sizes_counts_and_cpu_and_fits_the_quota() -> None:
    """A first run with room: the bottleneck model's priors choose more than DLRover's 1 + 1,
    with the cold start's PS memory and ``prior_start_worker_memory_mib`` per worker (what
    the job uses is not known yet), inside the quota, and the reasons say which rule chose
    it."""
    spec = make_spec(quota={"cpu": 200, "memory": "800Gi"})
    dl = Planner(spec, dlrover_cold(spec)).initial_plan()
    plan = Planner(spec).initial_plan()
    assert plan.stage is Stage.COLD_START
    assert plan.workers.count > 1 and plan.total.cpu_millicores > dl.total.cpu_millicores
    assert dl.workers.resources.memory_mib == 8192
    assert plan.workers.resources.memory_mib == PlannerConfig().prior_start_worker_memory_mib
    assert plan.ps.resources.memory_mib >= dl.ps.resources.memory_mib
    assert plan.total.fits_in(spec.quota.resources)
    assert any(r.startswith("prior-optimal start instead: ") for r in plan.reasons)
    assert any("× 6144 MiB" in r for r in plan.reasons)
    # the same for any rate: the choice does not depend on how fast the job turns out to be
    again = Planner(spec).initial_plan()
    assert (again.workers, again.ps) == (plan.workers, plan.ps)


def test_prior_start_worker_memory_between_the_specs_estimate_and_the_cold_start() -> None:
    """Less worker memory lets the memory quota hold more, thinner workers; it is never
    above the cold start's (a small quota's fifth) nor below the spec's own estimate."""
    spec = make_spec(quota={"cpu": 200, "memory": "800Gi"})
    big = Planner(spec, PlannerConfig.from_spec(spec, prior_start_worker_memory_mib=8192))
    fat = big.initial_plan()
    thin = Planner(spec).initial_plan()
    assert thin.workers.resources.memory_mib < fat.workers.resources.memory_mib
    assert thin.workers.count >= fat.workers.count
    # the spec's estimate is the floor: a setting under it is raised to it
    low = Planner(spec, PlannerConfig.from_spec(spec, prior_start_worker_memory_mib=256))
    floor = low._memory_fits(())[1]
    assert low.initial_plan().workers.resources.memory_mib >= floor > 256
    # a small quota: the cold start's memory (a fifth of it) is the ceiling
    small = make_spec(quota={"cpu": 20, "memory": "20Gi"})
    cold = Planner(small, dlrover_cold(small)).initial_plan()
    assert cold.workers.resources.memory_mib < 6144
    plan = Planner(small).initial_plan()
    assert plan.workers.resources.memory_mib <= cold.workers.resources.memory_mib
    assert plan.total.fits_in(small.quota.resources)


def test_prior_start_is_more_frugal_than_the_running_objective() -> None:
    """θ for the prior start (0.8 by default) above min_elasticity buys fewer cores."""
    spec = make_spec(quota={"cpu": 1000, "memory": "4000Gi"})
    lean = Planner(spec).initial_plan()
    rich = Planner(spec, PlannerConfig.from_spec(spec, prior_start_elasticity=0.35))
    assert lean.total.cpu_millicores < rich.initial_plan().total.cpu_millicores


@pytest.mark.parametrize(
    "overrides",
    [
        {"strategy": "allreduce"},
        {"planner": {"throughput_form": "linear"}},
        {"planner": {"cold_start": "dlrover"}},
    ],
)
def test_prior_start_only_for_ps_jobs_on_the_bottleneck_form(overrides: dict[str, Any]) -> None:
    spec = make_spec(quota={"cpu": 200, "memory": "800Gi"}, **overrides)
    plan = Planner(spec).initial_plan()
    assert plan.workers.count == 1
    assert not any("prior-optimal" in r for r in plan.reasons)


def test_prior_start_keeps_pins() -> None:
    spec = make_spec(
        quota={"cpu": 200, "memory": "800Gi"},
        constraints__workers={"cpu": 3, "max": 5, "memory": "10Gi"},
        constraints__ps={"count": 2},
    )
    plan = Planner(spec).initial_plan()
    assert plan.workers.resources.cpu_millicores == 3000 and plan.workers.count <= 5
    assert plan.workers.resources.memory_mib == 10240  # a pin, not the prior start's 6 GiB
    assert plan.ps.count == 2


# --- warm start ------------------------------------------------------------------------------


def record(
    spec_key: str,
    final: tuple[int, int],
    peaks: tuple[int | None, int | None, int | None, int | None],
    *,
    finished_at_s: float = 0.0,
    succeeded: bool = True,
    throughput_sps: float | None = None,
) -> HistoryRecord:
    """A finished run: final (workers, ps) at 4 CPU each (4 GiB workers, 8 GiB PS) and the
    peaks per node (worker CPU, worker memory, PS CPU, PS memory)."""
    return HistoryRecord(
        signature=spec_key,
        finished_at_s=finished_at_s,
        final_plan=make_plan((final[0], 4000, 4096), (final[1], 4000, 8192)),
        succeeded=succeeded,
        worker_cpu_used_millicores=peaks[0],
        worker_memory_used_mib=peaks[1],
        ps_cpu_used_millicores=peaks[2],
        ps_memory_used_mib=peaks[3],
        throughput_sps=throughput_sps,
    )


WARM_QUOTA = {"cpu": 64, "memory": "64Gi"}
KEY = "test/dlrm-2t/synthetic"
THREE_RUNS = [
    record(KEY, (4, 2), (3000, 2000, 2500, 5000), throughput_sps=1000),
    record(KEY, (6, 2), (3200, 2200, 3000, 5200), throughput_sps=1100),
    record(KEY, (20, 4), (9000, 8000, 4000, 3000), throughput_sps=5000),  # the outlier
]


def test_warm_start_from_three_runs_by_hand() -> None:
    """k = ceil(3 × 0.5) = 2 values nearest the median, averaged:
    workers [4, 6, 20] -> 6, 4 -> 5;  PS [2, 2, 4] -> 2
    worker CPU peaks [3000, 3200, 9000] -> 3100 × 1.2 = 3720 -> level 4000
    PS CPU totals [2500·2, 3000·2, 4000·4] = [5000, 6000, 16000] -> 5500 × 1.5 / 2 PS = 4125
        -> level 6000
    worker memory [2000, 2200, 8000] -> 2100 × 1.2 = 2520 -> 2560 (multiple of 64)
    PS memory totals [10000, 10400, 12000] -> 10200 × 1.2 / 2 PS = 6120 -> 6144
    throughput [1000, 1100, 5000] -> 1050."""
    spec = make_spec(quota=WARM_QUOTA)
    assert spec.signature_key == KEY
    plan = Planner(spec).initial_plan(THREE_RUNS, now_s=DAY)
    assert plan.stage is Stage.WARM_START
    assert (plan.workers.count, plan.ps.count) == (5, 2)
    assert plan.workers.resources == NodeResources(4000, 2560)
    assert plan.ps.resources == NodeResources(6000, 6144)
    assert plan.predicted_throughput_sps == pytest.approx(1050.0)
    assert plan.total == NodeResources(5 * 4000 + 2 * 6000, 5 * 2560 + 2 * 6144)
    assert "3 similar run(s)" in plan.reasons[0]


@pytest.mark.parametrize(
    ("their_rows", "grows"),
    [
        (10**7, True),  # they trained a tenth of the data: fewer distinct IDs, fewer rows
        (10**8, False),  # the same data: nothing to add
        (10**9, False),  # more data than this run: never less than they used
        (None, False),  # no spec kept with the runs (an old store, a JSON seed)
    ],
)
def test_a_warm_start_adds_the_ps_memory_of_the_rows_its_data_grows(
    their_rows: int | None, grows: bool
) -> None:
    """A recurring retrain whose day holds more data than the days it starts from: the
    dynamic tables end with more rows, so the PS memory those runs used is not enough and
    stage 3 would raise it mid-run (a PS restart). The warm start adds the difference of the
    spec's memory model (one PS holding every row, this spec's rows less theirs), shared by
    the PS, × 1.2. THREE_RUNS' PS memory is 6144 MiB each (see the test above)."""
    from dlrover_core.planner.similar import job_features
    from dlrover_core.spec import spec_to_dict

    tables = BIG_TABLES["model__embedding_tables"]
    spec = make_spec(quota=WARM_QUOTA, data__rows=10**8, model__embedding_tables=tables)
    runs = THREE_RUNS
    if their_rows is not None:
        theirs = make_spec(quota=WARM_QUOTA, data__rows=their_rows, model__embedding_tables=tables)
        extra = {"spec": spec_to_dict(theirs)}
        runs = [dataclasses.replace(r, extra=extra) for r in THREE_RUNS]
        grow = job_features(spec).ps_memory_mib - job_features(theirs).ps_memory_mib
    plan = Planner(spec).initial_plan(runs, now_s=DAY)
    assert plan.stage is Stage.WARM_START and plan.ps.count == 2
    if not grows:
        assert plan.ps.resources.memory_mib == 6144
        assert not any("PS memory +" in r for r in plan.reasons)
        return
    assert grow > 100  # 10^8 samples at new_id_rate 0.01: ~1.8·10^6 more rows a table
    want = 6144 + grow / 2 * 1.2
    assert want <= plan.ps.resources.memory_mib < want + 64  # rounded up to 64 MiB
    assert any("PS memory +" in r and "more embedding rows" in r for r in plan.reasons)


def test_warm_start_sizes_worker_cpu_from_the_final_configurations_samples() -> None:
    """The peaks span every configuration a run held (a 16-CPU cold start uses more than
    the 4-CPU workers it ended with): where a run's samples measured its final
    configuration, the worker CPU used there counts. Its final 4 × 4 CPU workers at 20 /
    25 / 30 % -> 1000 m × 1.2 = 1200 -> level 1500 (its peak, 9000 × 1.2 -> 12000, is not
    used); a run whose samples are all of another configuration keeps its peak: 3000 × 1.2
    = 3600 -> 4000."""
    at_final = tuple(Sample(4, 2, 4.0, 4.0, 1000.0, worker_cpu_util=u) for u in (0.2, 0.25, 0.3))
    elsewhere = (Sample(1, 1, 16.0, 16.0, 300.0, worker_cpu_util=0.6),)
    measured = dataclasses.replace(
        record(KEY, (4, 2), (9000, 2000, 2500, 5000)), extra={"samples": elsewhere + at_final}
    )
    unmeasured = dataclasses.replace(
        record(KEY, (4, 2), (3000, 2000, 2500, 5000)), extra={"samples": elsewhere}
    )
    spec, cfg = make_spec(quota=WARM_QUOTA), PlannerConfig()
    # the rule itself (Planner.initial_plan would refine it with a model of these samples)
    plan = warm_start(spec, [measured], cfg, DAY)
    assert plan.workers.resources.cpu_millicores == 1500
    assert "used in the final configuration" in plan.reasons[1]
    assert warm_start(spec, [unmeasured], cfg, DAY).workers.resources.cpu_millicores == 4000


def test_warm_start_without_peaks_uses_the_final_plans() -> None:
    runs = [record(KEY, (n, 1), (None, None, None, None)) for n in (2, 4, 30)]
    plan = Planner(make_spec(quota=WARM_QUOTA)).initial_plan(runs, now_s=1.0)
    assert plan.workers.count == 3  # median 4; nearest 4 and 2 -> 3
    assert plan.workers.resources == NodeResources(4000, 4096)
    assert plan.ps.resources == NodeResources(4000, 8192)


@pytest.mark.parametrize(
    ("overrides", "workers", "ps"),
    [
        ({"constraints__workers__count": 3}, (3, 4000, 2560), (2, 6000, 6144)),
        ({"constraints__workers__cpu": "1500m"}, (5, 1500, 2560), (2, 6000, 6144)),
        ({"constraints__ps__memory": "5Gi"}, (5, 4000, 2560), (2, 6000, 5120)),
        ({"constraints__ps": {"count": 4, "cpu": 2}}, (5, 4000, 2560), (4, 2000, 3072)),
        # the PS totals are shared by the PS count the plan will have:
        # CPU 5500 × 1.5 / 4 = 2062.5 -> 3000, memory 10200 × 1.2 / 4 = 3060 -> 3072
        ({"constraints__ps__count": 4}, (5, 4000, 2560), (4, 3000, 3072)),
        # CPU 5500 × 1.5 / 1 = 8250 -> 12000, memory 10200 × 1.2 = 12240 -> 12288
        ({"constraints__ps__max": 1}, (5, 4000, 2560), (1, 12000, 12288)),
        ({"constraints__workers__max": 4}, (4, 4000, 2560), (2, 6000, 6144)),
        ({"constraints__ps__max_cpu": 5}, (5, 4000, 2560), (2, 5000, 6144)),
    ],
)
def test_warm_start_keeps_pins_and_bounds(
    overrides: dict[str, Any], workers: tuple[int, int, int], ps: tuple[int, int, int]
) -> None:
    spec = make_spec(quota=WARM_QUOTA, **overrides)
    plan = Planner(spec).initial_plan(THREE_RUNS, now_s=DAY)
    assert (plan.workers.count, *plan.workers.resources.to_dict().values()) == workers
    assert (plan.ps.count, *plan.ps.resources.to_dict().values()) == ps


def test_warm_start_caps_ps_count_at_15() -> None:
    runs = [record(KEY, (10, 30), (None, None, None, None)) for _ in range(3)]
    spec = make_spec(quota={"cpu": 200, "memory": "400Gi"}, constraints__ps__max=40)
    assert Planner(spec).initial_plan(runs, now_s=1.0).ps.count == 15


def test_warm_start_is_shrunk_into_the_quota() -> None:
    spec = make_spec(quota={"cpu": 20, "memory": "64Gi"})
    plan = Planner(spec).initial_plan(THREE_RUNS, now_s=DAY)
    assert plan.total.fits_in(spec.quota.resources)
    assert plan.ps.count == 2
    assert plan.workers.count < 5
    assert any("shrunk to fit the quota" in r for r in plan.reasons)


def test_huge_history_on_a_tiny_quota_falls_back_to_the_smallest_nodes() -> None:
    # 100 GB peaks × 1.2, clamped to 64 GiB, shrunk 40 × 0.9 is still 1773 MiB a node: the
    # plan must end at the minimum job (1 worker + 1 PS of 500m / 512 Mi), not above quota
    big = make_plan((1, 32000, 64000), (1, 32000, 64000))
    runs = [HistoryRecord(KEY, 0.0, big, True, 64000, 100_000, 64000, 100_000)]
    spec = make_spec(quota={"cpu": 1, "memory": "1Gi"})
    plan = Planner(spec).initial_plan(runs)
    assert plan.total == NodeResources(1000, 1024)
    assert plan.total.fits_in(spec.quota.resources)


@pytest.mark.parametrize(
    ("change", "warm"),
    [
        ({}, True),
        ({"signature": "other/dlrm-2t/synthetic"}, False),
        ({"succeeded": False}, False),
        ({"finished_at_s": -1.0}, False),  # 7 days + 1 s before now
        ({"finished_at_s": 1.0}, True),  # oldest still inside the window
        ({"finished_at_s": 7 * DAY + 1}, False),  # in the future of the clock
    ],
)
def test_only_similar_recent_successful_runs_count(change: dict[str, Any], warm: bool) -> None:
    now = 7 * DAY
    base = {"signature": KEY, "finished_at_s": now - 10, "succeeded": True}
    rec = record(
        str({**base, **change}["signature"]),
        (4, 2),
        (3000, 2000, 2500, 5000),
        finished_at_s=float({**base, **change}["finished_at_s"]),
        succeeded=bool({**base, **change}["succeeded"]),
    )
    spec = make_spec(quota=WARM_QUOTA)
    assert similar_runs(spec, [rec], now, 7 * DAY) == ([rec] if warm else [])
    plan = Planner(spec).initial_plan([rec], now_s=now)
    assert plan.stage is (Stage.WARM_START if warm else Stage.COLD_START)


def test_history_window_comes_from_the_spec() -> None:
    spec = make_spec(quota=WARM_QUOTA, pacing__history_window_s=100)
    assert PlannerConfig.from_spec(spec).history_window_s == 100
    old = record(KEY, (4, 2), (3000, 2000, 2500, 5000), finished_at_s=0.0)
    assert Planner(spec).initial_plan([old], now_s=101).stage is Stage.COLD_START
    assert Planner(spec).initial_plan([old], now_s=100).stage is Stage.WARM_START


# --- property: every stage-1 plan respects the quota, the bounds and the pins ---------------

role = st.fixed_dictionaries(
    {},
    optional={
        "min": st.integers(1, 3),
        "max": st.integers(3, 40),
        "count": st.integers(1, 3),
        "cpu": st.sampled_from(["500m", "1", "2", "8"]),
        "memory": st.sampled_from(["512Mi", "1Gi", "6Gi"]),
        "max_cpu": st.sampled_from([1, 4, 32]),
        "max_memory": st.sampled_from(["1Gi", "16Gi", "64Gi"]),
    },
)
runs = st.lists(
    st.builds(
        lambda w, p, wc, wm, pc, pm, per: HistoryRecord(
            KEY,
            0.0,
            make_plan((w, per, per * 2), (p, per, per * 4)),
            worker_cpu_used_millicores=wc,
            worker_memory_used_mib=wm,
            ps_cpu_used_millicores=pc,
            ps_memory_used_mib=pm,
        ),
        st.integers(1, 100),
        st.integers(1, 30),
        st.one_of(st.none(), st.integers(100, 128_000)),
        st.one_of(st.none(), st.integers(100, 200_000)),
        st.one_of(st.none(), st.integers(100, 128_000)),
        st.one_of(st.none(), st.integers(100, 200_000)),
        st.integers(500, 32_000),
    ),
    max_size=4,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cpu=st.one_of(st.integers(1, 4), st.integers(1, 200)),
    mem_gib=st.one_of(st.integers(1, 4), st.integers(1, 512)),
    workers=role,
    ps=role,
    history=runs,
    big=st.booleans(),
)
def test_initial_plan_respects_quota_bounds_and_pins(
    cpu: int,
    mem_gib: int,
    workers: dict[str, Any],
    ps: dict[str, Any],
    history: list[HistoryRecord],
    big: bool,
) -> None:
    try:
        spec = make_spec(
            quota={"cpu": cpu, "memory": f"{mem_gib}Gi"},
            constraints={"workers": workers, "ps": ps},
            **(BIG_TABLES if big else {}),
        )
    except SpecError:
        assume(False)
        return
    plan = Planner(spec).initial_plan(history, now_s=0.0)
    assert plan.total.fits_in(spec.quota.resources), plan.describe()
    for rp, c in ((plan.workers, spec.constraints.workers), (plan.ps, spec.constraints.ps)):
        assert c.min <= rp.count <= c.max
        if c.count is not None:
            assert rp.count == c.count
        if c.cpu_millicores is not None:
            assert rp.resources.cpu_millicores == c.cpu_millicores
        else:
            assert rp.resources.cpu_millicores <= c.max_cpu_millicores
        if c.memory_mib is not None:
            assert rp.resources.memory_mib == c.memory_mib
        else:
            assert rp.resources.memory_mib <= c.max_memory_mib
    assert math.isfinite(plan.total.cpu_cores)


def test_cold_start_adds_ps_until_the_expected_rows_fit_a_node() -> None:
    """The production example expects ~67 GiB of parameters per single PS (× margin); with
    64 GiB nodes at most, the cold start takes 2 PS of ~34 GiB each."""
    from pathlib import Path

    from dlrover_core.spec import load_spec

    spec = load_spec(
        Path(__file__).resolve().parents[2] / "pipelines" / "specs" / "ctr-production.yaml"
    )
    plan = cold_start(spec, PlannerConfig.from_spec(spec), 0.0)
    assert plan.ps.count == 2
    assert plan.ps.resources.memory_mib <= 65536
    assert "2 PS so that the expected embedding rows fit" in plan.reasons[1]
    assert plan.total.fits_in(spec.quota.resources)


def test_runs_of_another_strategy_neither_warm_start_nor_feed_the_model() -> None:
    """A PS run's sizes and speed samples do not describe an all-reduce job of the same model
    and data (one signature): the all-reduce job starts cold and says why, and the reverse."""
    samples = tuple(Sample(1, 1, 2.0, 2.0, 1000.0 + i) for i in range(6))
    ps_runs = [
        dataclasses.replace(r, extra={"samples": samples}, finished_at_s=10.0) for r in THREE_RUNS
    ]
    ar = make_spec(
        signature={"pipeline": "test", "model": "dlrm-2t", "dataset": "synthetic"},
        strategy="allreduce",
        quota=WARM_QUOTA,
    )
    assert ar.signature_key == KEY
    planner = Planner(ar)
    assert similar_runs(ar, ps_runs, 100.0, DAY) == []
    assert planner.history_samples(ps_runs, 100.0) == []
    first = planner.initial_plan(ps_runs, 100.0)
    assert first.stage is Stage.COLD_START
    assert any("strategy ps not used" in r for r in first.reasons)
    # the same runs recorded as all-reduce runs warm-start it
    ar_runs = [dataclasses.replace(r, strategy="allreduce") for r in ps_runs]
    assert len(similar_runs(ar, ar_runs, 100.0, DAY)) == 3
    # and a PS job ignores all-reduce runs
    ps = make_spec(
        signature={"pipeline": "test", "model": "dlrm-2t", "dataset": "synthetic"},
        quota=WARM_QUOTA,
    )
    assert similar_runs(ps, ar_runs, 100.0, DAY) == []
    assert len(similar_runs(ps, ps_runs, 100.0, DAY)) == 3


def test_a_record_keeps_its_strategy_through_json_and_the_store(tmp_path: Any) -> None:
    from dlrover_core.history.records import record_from_dict, record_to_dict
    from dlrover_core.history.store import HistoryStore
    from dlrover_core.spec import spec_to_dict

    r = dataclasses.replace(THREE_RUNS[0], strategy="allreduce")
    assert record_from_dict(record_to_dict(r)).strategy == "allreduce"
    assert (
        record_from_dict({k: v for k, v in record_to_dict(r).items() if k != "strategy"}).strategy
        == "ps"
    )
    ar = make_spec(strategy="allreduce")
    with HistoryStore(f"sqlite:///{tmp_path}/h.db") as store:
        store.record_run(
            spec_to_dict(ar),
            ar.signature_key,
            {"state": "succeeded"},
            make_plan(ps=(0, 0, 0)),
            [],
            {},
            finished_at_s=5.0,
        )
        (rec,) = store.similar(ar.signature_key, 10.0, 100.0)
    assert rec.strategy == "allreduce"
