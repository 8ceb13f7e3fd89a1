"""Samples / configs CSV: round trips and error messages with file, line and column."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from dlrover_core.errors import InputError
from dlrover_core.model import (
    PSThroughputModel,
    predictions_to_csv,
    read_configs_csv,
    read_samples_csv,
    samples_to_csv,
    write_samples_csv,
)
from dlrover_core.types import Sample


def write(tmp_path: Path, text: str, name: str = "s.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_read_minimal_and_optional_columns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        " Workers ,ps,worker_cpu,ps_cpu,throughput,batch_size,ps_cpu_util,timestamp,note\n"
        "2,1,4,2.5,1000.5,512,0.75,10,first\n"
        "\n"
        "4,2,4,2.5,1800,,,,\n",
    )
    s = read_samples_csv(path)
    assert s[0] == Sample(
        2, 1, 4.0, 2.5, 1000.5, batch_size=512, ps_cpu_util=0.75, timestamp_s=10.0
    )
    assert s[1] == Sample(4, 2, 4.0, 2.5, 1800.0)


def test_round_trip(tmp_path: Path) -> None:
    samples = [
        Sample(2, 1, 4.0, 2.5, 1000.25, batch_size=256, worker_memory_mib=900.5),
        Sample(8, 0, 0.5, 0.0, 1 / 3, timestamp_s=1.7e9),
    ]
    path = tmp_path / "out.csv"
    write_samples_csv(path, samples)
    assert read_samples_csv(path) == samples
    header = samples_to_csv(samples).splitlines()[0]
    assert (
        header == "workers,ps,worker_cpu,ps_cpu,throughput,batch_size,worker_memory_mib,timestamp"
    )


def test_missing_required_column(tmp_path: Path) -> None:
    path = write(tmp_path, "workers,ps,worker_cpu,throughput\n1,1,1,1\n")
    with pytest.raises(InputError) as err:
        read_samples_csv(path)
    msg = str(err.value)
    assert "missing required column(s) ps_cpu" in msg and "s.csv" in msg
    assert err.value.problems == ["line 1: no column 'ps_cpu'"]


def test_bad_cells_are_all_reported_with_line_and_column(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workers,ps,worker_cpu,ps_cpu,throughput\n"
        "1,1,1,1,100\n"
        "2.5,1,1,1,abc\n"  # line 3: two problems
        "\n"
        "1,1,,1,100\n"  # line 5: empty required cell
        "0,1,1,1,100\n",  # line 6: no workers
    )
    with pytest.raises(InputError) as err:
        read_samples_csv(path)
    probs = err.value.problems
    assert len(probs) == 4
    assert probs[0] == f"{path}:3: column 'workers': '2.5' is not a whole number"
    assert probs[1] == f"{path}:3: column 'throughput': 'abc' is not a number"
    assert probs[2] == f"{path}:5: column 'worker_cpu': is empty (required)"
    assert probs[3] == f"{path}:6: column 'workers': must be >= 1"
    assert "4 problem(s)" in str(err.value) and "fix the file" in str(err.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (None, "does not exist"),
        ("", "is empty"),
        ("workers,ps,worker_cpu,ps_cpu,throughput\n", "no rows"),
    ],
)
def test_missing_empty_or_headless_files(tmp_path: Path, text: str | None, fragment: str) -> None:
    path = tmp_path / "s.csv" if text is None else write(tmp_path, text)
    with pytest.raises(InputError, match=fragment):
        read_samples_csv(path)


def test_configs_csv_and_predictions(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workers,ps,worker_cpu,ps_cpu,throughput,batch_size\n4,2,4,2,999,\n8,2,4,2,,256\n",
    )
    header, rows, cfg = read_configs_csv(path)
    assert header == ["workers", "ps", "worker_cpu", "ps_cpu", "throughput", "batch_size"]
    assert cfg.shape == (2, 5) and np.isnan(cfg[0, 4]) and cfg[1, 4] == 256
    out = predictions_to_csv(header, rows, [123.5, 7.0]).splitlines()
    assert out[0].endswith(",batch_size,predicted_throughput")
    assert out[1] == "4,2,4,2,999,,123.5"
    # the configs feed a fitted model directly
    samples = [
        Sample(w, p, float(lw), float(lp), w * 512 / (0.02 + 2 / lw + w / p / lp + 0.01 * p))
        for w in (1, 2, 4)
        for p in (1, 2)
        for lw in (1, 4)
        for lp in (1, 4)
    ]
    assert PSThroughputModel().fit(samples).predict_many(cfg).shape == (2,)


def test_configs_csv_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="missing required column"):
        read_configs_csv(write(tmp_path, "workers,ps\n1,1\n"))
    with pytest.raises(InputError) as err:
        read_configs_csv(write(tmp_path, "workers,ps,worker_cpu,ps_cpu\n1,x,1,1\n"))
    assert err.value.problems == [f"{tmp_path / 's.csv'}:2: column 'ps': 'x' is not a whole number"]


def test_write_to_file_object() -> None:
    buf = io.StringIO()
    write_samples_csv(buf, [Sample(1, 1, 1.0, 1.0, 5.0)])
    assert buf.getvalue() == "workers,ps,worker_cpu,ps_cpu,throughput\n1,1,1.0,1.0,5.0\n"
