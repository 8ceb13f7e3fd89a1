"""Data in: Parquet files and folders, fsspec URLs, per-file data quality."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from dlrover_core.errors import InputError  # noqa: E402
from dlrover_core.training.data import (  # noqa: E402
    CriteoTSV,
    ParquetCriteo,
    SyntheticCriteo,
    source_for_path,
    write_criteo_tsv,
)
from dlrover_core.training.paths import resolve_path  # noqa: E402

SRC = SyntheticCriteo(num_dense=13, num_sparse=4, num_rows=1000)


def table(start: int, end: int, *, hex_ids: bool = False):  # type: ignore[no-untyped-def]
    b = SRC.rows(start, end)
    ints = np.rint(np.expm1(b.dense.astype(np.float64))).astype(np.int64)
    cols: dict = {"label": b.labels.astype(np.int64), "extra": np.zeros(len(b))}
    cols |= {f"I{i + 1}": ints[:, i] for i in range(13)}
    cols |= {
        f"C{i + 1}": [format(int(x), "x") for x in b.sparse[:, i]] if hex_ids else b.sparse[:, i]
        for i in range(4)
    }
    return pa.table(cols), b


@pytest.mark.parametrize("hex_ids", [False, True], ids=["int-ids", "hex-ids"])
def test_parquet_folder_reads_rows_across_files(tmp_path: Path, hex_ids: bool) -> None:
    t, b = table(0, 500, hex_ids=hex_ids)
    pq.write_table(t.slice(0, 320), tmp_path / "part-0.parquet", row_group_size=64)
    pq.write_table(t.slice(320), tmp_path / "part-1.parquet", row_group_size=64)
    src = ParquetCriteo(tmp_path, 13, 4, holdout=50)
    assert (src.num_rows, src.num_lines) == (450, 500)
    got = src.rows(300, 340)  # spans both files and several row groups
    assert np.array_equal(got.sparse, b.sparse[300:340])
    assert np.allclose(got.dense, b.dense[300:340]) and np.array_equal(
        got.labels, b.labels[300:340]
    )
    assert np.array_equal(src.eval_rows(50).sparse, b.sparse[450:500])
    assert (
        source_for_path(tmp_path) == "parquet" and source_for_path("s3://b/x.parquet") == "parquet"
    )


def test_parquet_malformed_rows_are_counted_per_file(tmp_path: Path) -> None:
    t, _ = table(0, 100)
    bad = t.to_pydict()
    bad["label"][3] = 2  # not 0/1
    bad["label"][5] = None
    bad["C2"][7] = -1  # not an id
    pq.write_table(pa.table(bad), tmp_path / "a.parquet")
    pq.write_table(t, tmp_path / "b.parquet")
    src = ParquetCriteo(tmp_path, 13, 4, holdout=10)
    q = src.quality().to_dict()
    a, b = q["files"]
    assert (a["malformed"], a["records"], a["first_malformed"]) == (3, 97, 4)
    assert (b["malformed"], b["records"], b["held_out_records"]) == (0, 90, 10)
    assert q["malformed"] == 3 and src.malformed_total == 3


def test_parquet_missing_columns_is_one_clear_line(tmp_path: Path) -> None:
    pq.write_table(pa.table({"label": [0, 1], "I1": [1, 2]}), tmp_path / "x.parquet")
    with pytest.raises(InputError, match="lacks column"):
        ParquetCriteo(tmp_path / "x.parquet", 13, 4)
    with pytest.raises(InputError, match=r"no \.parquet file"):
        ParquetCriteo(_empty(tmp_path), 13, 4)


def _empty(tmp: Path) -> Path:
    d = tmp / "empty"
    d.mkdir()
    return d


def test_tsv_and_parquet_from_an_fsspec_url(tmp_path: Path) -> None:
    import fsspec

    b = SRC.rows(0, 200)
    write_criteo_tsv(tmp_path / "d.tsv", b)
    with fsspec.open("memory://bucket/d.tsv", "wb") as f:
        f.write((tmp_path / "d.tsv").read_bytes())
    tsv = CriteoTSV("memory://bucket/d.tsv", 13, 4, holdout=20)
    assert np.array_equal(tsv.rows(10, 30).sparse, b.sparse[10:30])
    t, _ = table(0, 200)
    with fsspec.open("memory://bucket/p/x.parquet", "wb") as f:
        pq.write_table(t, f)
    par = ParquetCriteo("memory://bucket/p", 13, 4, holdout=20)
    assert np.array_equal(par.rows(10, 30).sparse, b.sparse[10:30])
    assert par.files == ["memory:///bucket/p/x.parquet"] or par.files[0].endswith("x.parquet")


def test_an_unknown_url_protocol_is_one_line() -> None:
    with pytest.raises(InputError, match="cannot open this URL"):
        resolve_path("nope://bucket/x.tsv")


def test_data_rows_caps_a_file_and_round_trips(tmp_path: Path) -> None:
    from dlrover_core.spec import load_spec, spec_to_dict
    from dlrover_core.training.data import from_spec
    from tests.factories import make_spec_dict

    b = SRC.rows(0, 300)
    write_criteo_tsv(tmp_path / "d.tsv", b)
    base = make_spec_dict(data={"source": "criteo_tsv", "path": str(tmp_path / "d.tsv")})
    base["data"]["eval_rows"] = 50
    full = load_spec(base)
    assert from_spec(full).num_rows == 250  # every line before the held-out tail
    assert "rows" not in spec_to_dict(full)["data"]
    capped = load_spec(base, ["data.rows=100"])
    src = from_spec(capped)
    assert src.num_rows == 100
    assert np.array_equal(src.eval_rows(50).sparse, b.sparse[250:300, :2])  # still the tail
    again = load_spec(spec_to_dict(capped))
    assert again == capped and from_spec(again).num_rows == 100


def test_the_scan_before_a_job_is_bounded(tmp_path: Path) -> None:
    b = SRC.rows(0, 400)
    write_criteo_tsv(tmp_path / "d.tsv", b)
    with (tmp_path / "d.tsv").open("a") as f:
        f.write("bad\n" * 3)  # in the held-out tail
    tsv = CriteoTSV(tmp_path / "d.tsv", 13, 4, holdout=53)
    full = tsv.quality()
    assert full.complete and (full.records, full.held_out_records, full.malformed) == (350, 50, 3)
    part = tsv.quality(limit=100)
    assert not part.complete and part.records == 100 and part.to_dict()["complete"] is False
    t, _ = table(0, 300)
    pq.write_table(t.slice(0, 150), tmp_path / "a.parquet")
    pq.write_table(t.slice(150), tmp_path / "b.parquet")
    (tmp_path / "d.tsv").unlink()
    par = ParquetCriteo(tmp_path, 13, 4, holdout=30)
    q = par.quality(limit=200)
    assert not q.complete and q.records == 200 and q.held_out_records == 30
    assert [f.records for f in q.files] == [150, 50]
