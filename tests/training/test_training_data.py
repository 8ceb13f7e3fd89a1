"""Data sources: row-addressed determinism, id growth, planted labels, Criteo TSV reading."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import pytest

from dlrover_core.errors import InputError
from dlrover_core.training.data import (
    EVAL_ROW_START,
    Batch,
    CriteoTSV,
    SyntheticCriteo,
    from_spec,
    write_criteo_tsv,
)
from dlrover_core.training.metrics import auc
from tests.factories import make_spec


def make_gen(**overrides: object) -> SyntheticCriteo:
    kw: dict[str, object] = {
        "num_dense": 13,
        "num_sparse": 8,
        "alpha": 1.1,
        "new_id_rate": 0.01,
        "seed": 7,
        "cardinalities": [None, None, None, None, 1000, 1000, 100, 100],
    }
    kw.update(overrides)
    return SyntheticCriteo(**kw)  # type: ignore[arg-type]


def same(a: Batch, b: Batch) -> bool:
    return (
        np.array_equal(a.dense, b.dense)
        and np.array_equal(a.sparse, b.sparse)
        and np.array_equal(a.labels, b.labels)
    )


def concat(parts: list[Batch]) -> Batch:
    return Batch(
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.sparse for p in parts]),
        np.concatenate([p.labels for p in parts]),
        parts[0].row_start,
        parts[-1].row_end,
        sum(p.skipped for p in parts),
    )


# --- synthetic ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cuts",
    [[0, 1000], [0, 1, 999, 1000], [0, 256, 512, 768, 1000], [0, 333, 334, 1000]],
)
def test_same_rows_for_any_split_of_the_range(cuts: list[int]) -> None:
    gen = make_gen()
    whole = gen.rows(0, 1000)
    parts = [gen.rows(a, b) for a, b in itertools.pairwise(cuts)]
    assert same(whole, concat(parts))
    # and a second generator with the same settings (another worker process) agrees
    assert same(whole, make_gen().rows(0, 1000))


def test_shapes_dtypes_and_row_range() -> None:
    b = make_gen().rows(5000, 5100)
    assert b.dense.shape == (100, 13) and b.dense.dtype == np.float32
    assert b.sparse.shape == (100, 8) and b.sparse.dtype == np.int64
    assert b.labels.shape == (100,) and b.labels.dtype == np.float32
    assert (b.row_start, b.row_end, b.skipped, len(b)) == (5000, 5100, 0, 100)
    assert set(np.unique(b.labels)) <= {0.0, 1.0}
    assert (b.dense >= 0).all() and (b.sparse >= 0).all()


def test_seed_changes_the_data_and_eval_rows_are_held_out() -> None:
    gen = make_gen()
    assert not same(gen.rows(0, 500), make_gen(seed=8).rows(0, 500))
    ev = gen.eval_rows(500)
    assert (ev.row_start, ev.row_end) == (EVAL_ROW_START, EVAL_ROW_START + 500)
    assert same(ev, gen.rows(EVAL_ROW_START, EVAL_ROW_START + 500))
    assert not np.array_equal(ev.dense, gen.rows(0, 500).dense)


def test_static_tables_stay_in_range_and_dynamic_ones_get_new_ids() -> None:
    gen = make_gen(new_id_rate=0.05)
    b = gen.rows(0, 20_000)
    assert b.sparse[:, 4:6].max() < 1000 and b.sparse[:, 6:].max() < 100
    fresh = b.sparse[:, :4] >= gen.head_size
    # 5% new ids per dynamic feature: 4000 expected of 80000, binomial sd ≈ 62
    assert 3700 < fresh.sum() < 4300
    assert len(np.unique(b.sparse[:, :4][fresh])) == fresh.sum()  # never seen twice


def test_distinct_ids_keep_growing_sublinearly() -> None:
    gen = make_gen()
    n = 20_000
    big = gen.rows(0, 4 * n).sparse[:, 0]  # a dynamic table
    u_n, u_4n = len(np.unique(big[:n])), len(np.unique(big))
    beta = np.log(u_4n / u_n) / np.log(4)
    # Zipf(1.1) alone gives β ≈ 1/1.1 ≈ 0.9 before the head saturates; new ids pull it to 1
    assert u_4n > u_n
    assert 0.5 < beta < 1.0, beta


def test_ids_are_zipf_skewed() -> None:
    ids = make_gen(new_id_rate=0.0).rows(0, 50_000).sparse[:, 0]
    counts = np.sort(np.bincount(ids))[::-1]
    # rank 1 vs rank 10 of Zipf(1.1): 10^1.1 ≈ 12.6 (loose: sampling noise at rank 10)
    assert 8 < counts[0] / counts[9] < 20
    uniform = make_gen(new_id_rate=0.0, kind="uniform").rows(0, 50_000).sparse[:, 6]
    assert np.bincount(uniform, minlength=100).min() > 350  # 500 each expected


def test_labels_follow_the_planted_model() -> None:
    gen = make_gen()
    start, end = EVAL_ROW_START, EVAL_ROW_START + 20_000
    labels, logits = gen.rows(start, end).labels, gen.oracle_logits(start, end)
    # the planted logit (without its noise term) scores about 0.8; random is 0.5
    assert 0.75 < auc(labels, logits) < 0.9
    assert 0.2 < labels.mean() < 0.5  # Criteo-like click rate


def test_a_hundred_thousand_rows_are_fast() -> None:
    gen = make_gen(num_sparse=26, cardinalities=None)
    gen.rows(0, 1000)
    t0 = time.perf_counter()
    gen.rows(0, 100_000)
    # ≈0.4 s on one free core of this machine; generous because tests share the 2 cores
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize(
    "overrides",
    [
        {"alpha": 0.0},
        {"new_id_rate": 1.5},
        {"cardinalities": [None, 10]},
        {"cardinalities": [0] * 8},
        {"num_rows": 0},
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(InputError):
        make_gen(**overrides)


def test_bad_ranges_are_refused() -> None:
    with pytest.raises(InputError):
        make_gen().rows(10, 5)
    assert len(make_gen().rows(10, 10)) == 0


def test_from_spec_builds_the_synthetic_source() -> None:
    spec = make_spec(data__rows=5000, data__seed=3, data__ids__new_id_rate=0.02)
    src = from_spec(spec)
    assert isinstance(src, SyntheticCriteo)
    assert (src.num_rows, src.num_dense, src.num_sparse) == (5000, 13, 2)
    assert src.cardinalities == (1000, 1000)
    assert (src.seed, src.new_id_rate, src.malformed_total) == (3, 0.02, 0)


def test_split_into_mini_batches() -> None:
    b = make_gen().rows(0, 1000)
    parts = list(b.split(300))
    assert [len(p) for p in parts] == [300, 300, 300, 100]
    assert same(b, concat(parts))


# --- Criteo TSV -----------------------------------------------------------------------------


def test_criteo_tsv_round_trip(tmp_path: Path) -> None:
    b = make_gen().rows(0, 200)
    path = tmp_path / "day_0.tsv"
    write_criteo_tsv(path, b)
    line = path.read_text().splitlines()[0].split("\t")
    assert len(line) == 1 + 13 + 26 and line[-1] == ""  # 8 categories written, 18 left empty
    src = CriteoTSV(path, num_dense=13, num_sparse=8)
    assert (src.num_rows, src.num_lines, src.malformed_total) == (200, 200, 0)
    back = concat([src.rows(0, 77), src.rows(77, 200)])
    assert same(b, back)
    assert same(src.rows(150, 1000), b.take(150, 200))  # end clipped to the file


def test_criteo_tsv_counts_and_skips_malformed_lines(tmp_path: Path) -> None:
    good = make_gen().rows(0, 17)
    path = tmp_path / "bad.tsv"
    write_criteo_tsv(path, good.take(0, 5))
    ok = "\t".join(["1", *["3"] * 13, *["a1"] * 26])
    bad = [
        "\t".join(["1", *["3"] * 13, *["a1"] * 25]),  # 39 fields
        "\t".join(["2", *["3"] * 13, *["a1"] * 26]),  # label not 0/1
        "\t".join(["0", "x", *["3"] * 12, "zz", *["a1"] * 25]),  # not an int, not hex
    ]
    with path.open("a") as fh:
        fh.write("\n".join([bad[0], ok, bad[1], bad[2]]) + "\n")
    write_criteo_tsv(path, good.take(5, 16), append=True)
    src = CriteoTSV(path, num_dense=13, num_sparse=8)
    assert src.num_lines == 20
    b = src.rows(0, 20)
    assert (len(b), b.skipped, src.malformed_total) == (17, 3, 3)
    assert b.labels[5] == 1.0 and b.sparse[5, 0] == 0xA1
    assert np.allclose(b.dense[5], np.log1p(3.0))
    src.rows(4, 9)  # reading a line again does not count it twice
    assert src.malformed_total == 3
    assert src.stats()["malformed_total"] == 3


def test_criteo_tsv_empty_fields_read_as_zero(tmp_path: Path) -> None:
    path = tmp_path / "sparse.tsv"
    fields = ["0", "", "-5", *["7"] * 11, "", "ff", *[""] * 24]
    path.write_text("\t".join(fields))  # and no newline at the end
    src = CriteoTSV(path, num_dense=3, num_sparse=3)
    b = src.rows(0, 1)
    assert len(b) == 1 and b.skipped == 0
    assert np.allclose(b.dense[0], [0.0, 0.0, np.log1p(7.0)])
    assert b.sparse[0].tolist() == [0, 255, 0]


def test_criteo_tsv_holdout_and_from_spec(tmp_path: Path) -> None:
    path = tmp_path / "d.tsv"
    b = make_gen(num_sparse=2, cardinalities=None).rows(0, 100)
    write_criteo_tsv(path, b)
    spec = make_spec(data__source="criteo_tsv", data__path=str(path), data__eval_rows=20)
    src = from_spec(spec)
    assert isinstance(src, CriteoTSV)
    assert (src.num_rows, src.num_dense, src.num_sparse) == (80, 13, 2)
    assert same(src.eval_rows(50), b.take(80, 100))
    with pytest.raises(InputError, match="eval_rows"):
        CriteoTSV(path, holdout=100)
    with pytest.raises(InputError):
        CriteoTSV(path, num_sparse=27)
    with pytest.raises(InputError, match="does not exist"):
        CriteoTSV(tmp_path / "missing.tsv")
