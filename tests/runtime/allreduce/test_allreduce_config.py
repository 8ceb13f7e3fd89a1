"""The all-reduce strategy's pure parts: validation before any process starts (one clear line
per problem), options on the command line, the split of a round over ranks, exit reading, and
the checkpoint store's atomicity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlrover_core.allreduce_config import (
    DYNAMIC_ROWS,
    RANK_RUNTIME_MIB,
    AllReduceOptions,
    embedding_mib_per_rank,
    table_mib,
    validate_allreduce,
)
from dlrover_core.errors import InputError
from dlrover_core.runtime.strategies.allreduce.agent import (
    EXIT_FATAL,
    EXIT_PEER_LOST,
    RankArgs,
    _parse,
    agent_argv,
    released,
)
from dlrover_core.runtime.strategies.allreduce.checkpoint import (
    META_FILE,
    CheckpointMeta,
    CheckpointStore,
    ShardRecord,
)
from dlrover_core.runtime.strategies.allreduce.launch import generation_ranks, read_exit
from dlrover_core.runtime.strategies.allreduce.trainer import rank_slices, round_steps
from tests.factories import make_spec


def ar_spec(**overrides: Any) -> Any:
    return make_spec(strategy="allreduce", **overrides)


def problems(spec: Any, world: int, **kw: Any) -> list[str]:
    with pytest.raises(InputError) as e:
        validate_allreduce(spec, world, **kw)
    for p in e.value.problems:
        assert "\n" not in p
    return e.value.problems


def test_a_valid_job_passes() -> None:
    validate_allreduce(ar_spec(), 2)
    validate_allreduce(ar_spec(), 1, AllReduceOptions(sharding=("data_parallel",)))


@pytest.mark.parametrize(
    ("options", "kw", "expect"),
    [
        (AllReduceOptions(sharding=("row_wise",)), {}, "row_wise needs CUDA (nccl)"),
        (AllReduceOptions(sharding=("tablewise",)), {}, "'tablewise' is not a torchrec sharding"),
        (AllReduceOptions(backend="nccl"), {}, "backend nccl needs CUDA"),
        (
            AllReduceOptions(sharding_by_table={"zz": ("table_wise",)}),
            {},
            "table 'zz': the model has no such table",
        ),
        (AllReduceOptions(sharding=()), {}, "is empty"),
    ],
)
def test_bad_options_get_one_line_each(
    options: AllReduceOptions, kw: dict[str, Any], expect: str
) -> None:
    (line,) = problems(ar_spec(), 2, options=options, **kw)
    assert expect in line


def test_cuda_only_types_pass_with_cuda_and_nccl() -> None:
    validate_allreduce(
        ar_spec(), 2, AllReduceOptions(sharding=("row_wise",), backend="nccl"), cuda_available=True
    )


def test_a_dimension_the_fused_kernels_cannot_take() -> None:
    spec = ar_spec(model__embedding_dim=6, model__dense_arch=[64, 6])
    lines = problems(spec, 2, options=AllReduceOptions(sharding=("table_wise",)))
    assert [line.split(":")[0] for line in lines] == ["table 'a'", "table 'b'"]
    assert all(
        "embedding_dim 6 is not a multiple of 4" in ln and "data_parallel" in ln for ln in lines
    )
    validate_allreduce(spec, 2, AllReduceOptions(sharding=("data_parallel",)))


def test_world_sizes_outside_the_bounds_or_below_one() -> None:
    spec = ar_spec(constraints__workers__max=4)
    assert "outside constraints.workers" in problems(spec, 5)[0]
    assert "at least 1 rank" in problems(spec, 0)[0]
    assert "strategy is 'ps'" in problems(make_spec(), 1)[0]


def test_tables_that_do_not_fit_the_ranks_say_how_many_would() -> None:
    # 4 tables of 1M rows x 16 x 4 B x 2 (Adagrad) = 122 MiB each
    tables = [{"name": f"t{i}", "num_embeddings": 1_000_000} for i in range(4)]
    spec = ar_spec(model__embedding_tables=tables)
    per = table_mib(spec)["t0"]
    assert per == pytest.approx(1_000_000 * 16 * 4 * 2 / 2**20)
    tw = AllReduceOptions(sharding=("table_wise",))
    assert embedding_mib_per_rank(spec, 1, tw) == pytest.approx(4 * per)
    assert embedding_mib_per_rank(spec, 3, tw) == pytest.approx(2 * per)  # 2 + 1 + 1
    assert embedding_mib_per_rank(spec, 2, AllReduceOptions(sharding=("data_parallel",))) == (
        pytest.approx(4 * per)
    )
    mem = int(RANK_RUNTIME_MIB + 2.5 * per)
    (line,) = problems(spec, 1, options=tw, rank_memory_mib=mem)
    assert "world size 1" in line and "raise the world size to 2" in line
    validate_allreduce(spec, 2, tw, rank_memory_mib=mem)


def test_dynamic_rows_match_the_model() -> None:
    from dlrover_core.training.model import DYNAMIC_ROWS as MODEL_DYNAMIC_ROWS

    assert DYNAMIC_ROWS == MODEL_DYNAMIC_ROWS


def test_options_round_trip_through_the_agent_command_line(tmp_path: Path) -> None:
    opts = AllReduceOptions(
        sharding=("table_wise", "column_wise"),
        sharding_by_table={"a": ("data_parallel",)},
        backend="gloo",
        checkpoint_interval_s=2.5,
        keep_checkpoints=3,
    )
    (a,) = generation_ranks(
        run_dir=tmp_path,
        master="127.0.0.1:1",
        generation=4,
        world_size=1,
        first_node_id=7,
        rdzv="127.0.0.1:2",
        options=opts,
        after_generation=3,
        threads=2,
    )
    argv = agent_argv(a, "python")
    assert argv[:3] == ["python", "-m", "dlrover_core.runtime.strategies.allreduce.agent"]
    back = _parse(argv[3:])
    assert back == a
    assert isinstance(back, RankArgs) and back.node_id == 7 and back.after_generation == 3
    with pytest.raises(InputError, match="TABLE=type"):
        AllReduceOptions.parse("table_wise", ["oops"])


def test_round_split_runs_the_same_steps_on_every_rank_and_covers_each_row_once() -> None:
    ranges = [(0, 1000), (5000, 5300), (9000, 9001)]  # 1301 rows, one short shard
    world, b = 3, 128
    steps = round_steps(1301, world, b)
    assert steps == 4  # ceil(1301 / 384)
    seen: list[int] = []
    for s in range(steps):
        for r in range(world):
            part = rank_slices(ranges, s, r, world, b)
            assert sum(e - a for a, e in part) <= b
            for a, e in part:
                seen += range(a, e)
    expected = [i for a, e in ranges for i in range(a, e)]
    assert seen == expected  # in order, each row exactly once
    assert rank_slices(ranges, 3, 2, world, b) == []  # past the end: a padded, weight-0 batch


@pytest.mark.parametrize(
    ("code", "kind", "relaunch"),
    [
        (0, "ok", False),
        (EXIT_FATAL, "fatal", False),
        (EXIT_PEER_LOST, "peer_lost", True),
        (-9, "killed", True),
        (137, "killed", True),
        (5, "failed", True),
    ],
)
def test_exit_codes_read_for_the_controller(code: int, kind: str, relaunch: bool) -> None:
    r = read_exit(code)
    assert (r.kind, r.relaunch) == (kind, relaunch)


def _fake_dcp(store: CheckpointStore, seq: int, gen: int) -> Path:
    tmp = store.tmp_path(seq, gen)
    tmp.mkdir(parents=True)
    (tmp / ".metadata").write_bytes(b"x")
    return tmp


def test_a_checkpoint_counts_only_once_committed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.latest() is None
    tmp = _fake_dcp(store, 1, 0)
    assert store.latest() is None  # written, not committed
    meta = CheckpointMeta(1, 0, 2, 10, 5120, (ShardRecord(3, 0, 1, 2560),), 1)
    c = store.commit(tmp, meta)
    assert store.latest() == c and c.meta == meta and not tmp.exists()
    assert json.loads((c.path / META_FILE).read_text())["shards"][0]["shard_id"] == 3
    # a crash between dcp.save and commit: the half-written tmp is ignored, then cleaned
    _fake_dcp(store, 2, 0)
    assert store.latest() == c
    assert [p.name for p in store.clean_tmp(before_generation=1)] == [".tmp-ckpt-00000002-g0"]
    # a directory without meta.json is not a checkpoint
    (tmp_path / "ckpt-00000009").mkdir()
    assert store.latest() == c
    with pytest.raises(InputError, match=r"no DCP \.metadata"):
        store.commit(tmp_path / "nothing", meta)


def test_released_needs_a_final_checkpoint_of_that_generation(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.commit(_fake_dcp(store, 1, 0), CheckpointMeta(1, 0, 1, 1, 1))
    assert not released(store, 0)
    store.commit(_fake_dcp(store, 2, 0), CheckpointMeta(2, 0, 1, 2, 2, final=True))
    assert released(store, 0) and not released(store, 1)
    store.commit(_fake_dcp(store, 3, 2), CheckpointMeta(3, 2, 1, 3, 3))
    assert released(store, 1)  # a later generation checkpointed: 1 is long gone
    assert len(store.prune(keep=2)) == 1 and len(store.complete()) == 2
