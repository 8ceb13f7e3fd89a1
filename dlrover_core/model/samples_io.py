"""The samples CSV (DESIGN.md) and the configs CSV of ``dlrover-rm model predict``.

Samples CSV: one row per steady window; required ``workers,ps,worker_cpu,ps_cpu,throughput``
(cores, samples/s), optional ``batch_size,worker_memory_mib,ps_memory_mib,ps_cpu_util,
worker_cpu_util,timestamp``. Unknown columns are ignored; header names are matched without
surrounding spaces and case. Blank optional cells read as "not measured" (None).

Readers collect every problem (one line each, with file, line number and column) before
raising a single :class:`InputError`, so a user fixes a file in one pass.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from dlrover_core.errors import InputError
from dlrover_core.types import Sample

FloatArray = npt.NDArray[np.float64]
PathLike = str | os.PathLike[str]

CONFIG_COLUMNS: tuple[str, ...] = ("workers", "ps", "worker_cpu", "ps_cpu")
REQUIRED_COLUMNS: tuple[str, ...] = (*CONFIG_COLUMNS, "throughput")
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "batch_size",
    "worker_memory_mib",
    "ps_memory_mib",
    "ps_cpu_util",
    "worker_cpu_util",
    "timestamp",
)
PREDICTION_COLUMN = "predicted_throughput"

# CSV column -> Sample field
_FIELD: dict[str, str] = {
    "workers": "workers",
    "ps": "ps",
    "worker_cpu": "worker_cpu_cores",
    "ps_cpu": "ps_cpu_cores",
    "throughput": "throughput_sps",
    "batch_size": "batch_size",
    "worker_memory_mib": "worker_memory_mib",
    "ps_memory_mib": "ps_memory_mib",
    "ps_cpu_util": "ps_cpu_util",
    "worker_cpu_util": "worker_cpu_util",
    "timestamp": "timestamp_s",
}
_INT_COLUMNS = frozenset({"workers", "ps", "batch_size"})
_FIX = "fix the file (one row per steady window, numbers only) and run again"


def _parse(col: str, text: str) -> tuple[float | int | None, str | None]:
    """Parse one cell: (value, problem). Blank -> (None, None)."""
    text = text.strip()
    if text == "":
        return None, None
    try:
        val = float(text)
    except ValueError:
        want = "a whole number" if col in _INT_COLUMNS else "a number"
        return None, f"{text!r} is not {want}"
    if not math.isfinite(val):
        return None, f"{text!r} is not a finite number"
    if val < 0:
        return None, f"{text!r} is negative"
    if col in _INT_COLUMNS:
        if not val.is_integer():
            return None, f"{text!r} is not a whole number"
        return int(val), None
    return val, None


def _open_rows(path: PathLike, what: str) -> tuple[list[str], list[list[str]]]:
    """Read a CSV file: (normalised header, data rows). Missing/empty file -> InputError."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except FileNotFoundError:
        raise InputError(
            f"{what} file {os.fspath(path)!r} does not exist; check the path "
            "(a samples CSV is written by `dlrover-rm profile --out SAMPLES.csv`)"
        ) from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(
            f"cannot read {what} file {os.fspath(path)!r}: {exc}; give a readable UTF-8 CSV file"
        ) from exc
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise InputError(
            f"{what} file {os.fspath(path)!r} is empty; it needs a header line "
            f"({','.join(REQUIRED_COLUMNS)}) and one row per measurement"
        )
    return [h.strip().lower() for h in rows[0]], rows[1:]


def _missing(header: Sequence[str], required: Sequence[str], path: PathLike) -> None:
    missing = [c for c in required if c not in header]
    if missing:
        raise InputError(
            f"{os.fspath(path)!r}: missing required column(s) {', '.join(missing)}; the header "
            f"must contain {','.join(required)} (found: {','.join(header) or 'nothing'})",
            problems=[f"line 1: no column {c!r}" for c in missing],
        )


def _line_numbers(path: PathLike) -> list[int]:
    """1-based physical line numbers of the non-blank data records (after the header)."""
    out: list[int] = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        start = 1
        for rec in reader:
            if any(c.strip() for c in rec):
                out.append(start)
            start = reader.line_num + 1
    return out[1:]


def read_samples_csv(path: PathLike) -> list[Sample]:
    """Read the samples CSV into :class:`Sample` values (see the module docstring)."""
    header, rows = _open_rows(path, "samples")
    _missing(header, REQUIRED_COLUMNS, path)
    lines = _line_numbers(path)
    cols = {c: header.index(c) for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in header}
    name = os.fspath(path)
    problems: list[str] = []
    samples: list[Sample] = []
    for row, line in zip(rows, lines, strict=True):
        kwargs: dict[str, Any] = {}
        ok = True
        for col, j in cols.items():
            cell = row[j] if j < len(row) else ""
            val, err = _parse(col, cell)
            if err is None and val is None and col in REQUIRED_COLUMNS:
                err = "is empty (required)"
            if err is not None:
                problems.append(f"{name}:{line}: column {col!r}: {err}")
                ok = False
                continue
            kwargs[_FIELD[col]] = val
        if ok:
            if kwargs["workers"] < 1:
                problems.append(f"{name}:{line}: column 'workers': must be >= 1")
                continue
            samples.append(Sample(**kwargs))
    if problems:
        raise InputError(
            f"{len(problems)} problem(s) in samples file {name!r}; {_FIX}", problems=problems
        )
    if not samples:
        raise InputError(
            f"samples file {name!r} has a header but no rows; profile first, e.g. "
            "`dlrover-rm profile --spec SPEC --out SAMPLES.csv`"
        )
    return samples


def _sample_cells(s: Sample, columns: Sequence[str]) -> list[str]:
    out: list[str] = []
    for col in columns:
        v = getattr(s, _FIELD[col])
        out.append("" if v is None else repr(v) if isinstance(v, float) else str(v))
    return out


def write_samples_csv(path_or_file: PathLike | TextIO, samples: Iterable[Sample]) -> None:
    """Write samples with the required columns plus every optional column any sample has."""
    samples = list(samples)
    optional = [
        c for c in OPTIONAL_COLUMNS if any(getattr(s, _FIELD[c]) is not None for s in samples)
    ]
    columns = [*REQUIRED_COLUMNS, *optional]

    def emit(fh: TextIO) -> None:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(_sample_cells(s, columns) for s in samples)

    _with_text_out(path_or_file, emit)


def samples_to_csv(samples: Iterable[Sample]) -> str:
    buf = io.StringIO()
    write_samples_csv(buf, samples)
    return buf.getvalue()


def _with_text_out(path_or_file: PathLike | TextIO, emit: Callable[[TextIO], None]) -> None:
    if isinstance(path_or_file, (str, os.PathLike)):
        with open(path_or_file, "w", newline="", encoding="utf-8") as fh:
            emit(fh)
    else:
        emit(path_or_file)


def read_configs_csv(path: PathLike) -> tuple[list[str], list[list[str]], FloatArray]:
    """Read candidate configurations for ``model predict``.

    Returns (header as written, data rows as written, configs) where configs has shape
    (n, 4) = [workers, ps, worker_cpu, ps_cpu], or (n, 5) when a ``batch_size`` column is
    present (blank batch size -> NaN, meaning the model's default). ``throughput`` and any
    other columns are carried in ``rows`` untouched, so the output can echo them.
    """
    header_norm, rows = _open_rows(path, "configs")
    _missing(header_norm, CONFIG_COLUMNS, path)
    with open(path, newline="", encoding="utf-8") as fh:
        header_raw = next(csv.reader(fh))
    lines = _line_numbers(path)
    use = list(CONFIG_COLUMNS) + (["batch_size"] if "batch_size" in header_norm else [])
    idx = [header_norm.index(c) for c in use]
    name = os.fspath(path)
    problems: list[str] = []
    out = np.full((len(rows), len(use)), np.nan)
    for i, (row, line) in enumerate(zip(rows, lines, strict=True)):
        for k, (col, j) in enumerate(zip(use, idx, strict=True)):
            val, err = _parse(col, row[j] if j < len(row) else "")
            if err is None and val is None and col != "batch_size":
                err = "is empty (required)"
            if err is not None:
                problems.append(f"{name}:{line}: column {col!r}: {err}")
            elif val is not None:
                out[i, k] = float(val)
    if problems:
        raise InputError(
            f"{len(problems)} problem(s) in configs file {name!r}; {_FIX}", problems=problems
        )
    return header_raw, rows, out


def write_predictions_csv(
    out: PathLike | TextIO,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    predicted: Sequence[float] | FloatArray,
    *,
    lower: Sequence[float] | FloatArray | None = None,
    upper: Sequence[float] | FloatArray | None = None,
) -> None:
    """The input columns plus ``predicted_throughput`` (and ``lower``/``upper`` if given)."""
    if len(rows) != len(predicted):
        raise InputError(f"{len(rows)} rows but {len(predicted)} predictions")
    extra = [PREDICTION_COLUMN]
    if lower is not None and upper is not None:
        extra += ["predicted_throughput_lower", "predicted_throughput_upper"]

    def emit(fh: TextIO) -> None:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow([*header, *extra])
        for i, row in enumerate(rows):
            vals = [predicted[i]]
            if lower is not None and upper is not None:
                vals += [lower[i], upper[i]]
            padded = list(row) + [""] * (len(header) - len(row))
            writer.writerow([*padded, *(f"{float(v):.10g}" for v in vals)])

    _with_text_out(out, emit)


def predictions_to_csv(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    predicted: Sequence[float] | FloatArray,
    *,
    lower: Sequence[float] | FloatArray | None = None,
    upper: Sequence[float] | FloatArray | None = None,
) -> str:
    buf = io.StringIO()
    write_predictions_csv(buf, header, rows, predicted, lower=lower, upper=upper)
    return buf.getvalue()
