"""Inputs pinned, without a job: a file's fingerprint, each kind of change named, a folder of
Parquet files, a URL, and a data source that checks its pins on every read."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dlrover_core.training.data import CriteoTSV, ParquetCriteo, SyntheticCriteo, write_criteo_tsv
from dlrover_core.training.pin import PIN_ENV, InputChangedError, Pins, attach, what_changed


def tsv(path: Path, rows: int = 300, seed: int = 0) -> Path:
    write_criteo_tsv(path, SyntheticCriteo(num_dense=13, num_sparse=4, seed=seed).rows(0, rows))
    return path


def source(path: str) -> CriteoTSV:
    return CriteoTSV(path, 13, 4, holdout=50)


@pytest.mark.parametrize("url", [False, True])
def test_each_kind_of_change_is_named(tmp_path: Path, url: bool) -> None:
    p = tsv(tmp_path / "a.tsv")
    pins = Pins.of(source(f"file://{p}" if url else str(p)))
    (pin,) = pins.pins
    assert pin.size == p.stat().st_size and what_changed(pin, deep=True) is None
    st = p.stat()
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    assert (what_changed(pin) or "").startswith("truncated:")
    p.write_bytes(data + data[:100])
    assert (what_changed(pin) or "").startswith("grown:")
    other = (tsv(tmp_path / "b.tsv", seed=7).read_bytes() * 2)[: len(data)]
    p.write_bytes(other)  # same size, new content, new time
    assert (what_changed(pin) or "").startswith("rewritten")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old time back: only the bytes tell
    assert what_changed(pin) is None and (what_changed(pin, deep=True) or "").startswith(
        "rewritten: same size and time"
    )
    p.unlink()
    assert what_changed(pin) == "it was deleted"


def test_a_source_checks_its_pins_on_every_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tsv(tmp_path / "a.tsv")
    pins_file = tmp_path / "pins.json"
    Pins.of(source(str(p))).save(pins_file)
    monkeypatch.setenv(PIN_ENV, str(pins_file))
    src = attach(source(str(p)))
    assert src.pins is not None and len(src.rows(0, 10)) == 10
    with open(p, "ab") as f:
        f.write(b"1\t" + b"\t" * 40 + b"\n")
    src.pins._next = 0.0  # the next read checks at once
    with pytest.raises(InputChangedError, match=r"a\.tsv changed since the job started: grown"):
        src.rows(0, 10)
    # another job's pins do not cover this file: nothing attached
    q = tsv(tmp_path / "q.tsv")
    assert attach(source(str(q))).pins is None


def test_every_file_of_a_parquet_folder_is_pinned(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    d = tmp_path / "parts"
    d.mkdir()
    for i in range(2):
        cols = {"label": np.zeros(20, np.int64)}
        cols |= {f"I{j + 1}": np.arange(20) for j in range(13)}
        cols |= {f"C{j + 1}": np.arange(20) for j in range(4)}
        pq.write_table(pa.table(cols), d / f"part-{i}.parquet")
    pins = Pins.of(ParquetCriteo(str(d), 13, 4, holdout=5))
    assert sorted(Path(p.url).name for p in pins.pins) == ["part-0.parquet", "part-1.parquet"]
    pq.write_table(pa.table({"label": np.ones(3, np.int64)}), d / "part-1.parquet")
    (ch,) = pins.changes()
    assert ch["file"].endswith("part-1.parquet")
