"""Training data: a deterministic Criteo-like generator and a Criteo-format TSV reader.

Both are addressed by **row index**: ``rows(start, end)`` returns the same records for the same
range however the ranges are split, so a data shard ``[start, end)`` can be read by whichever
worker takes it, retried after a fault, and still be trained exactly once; a held-out set comes
from ``eval_rows(n)`` and never overlaps the training rows.

Synthetic data (:class:`SyntheticCriteo`) uses counter-based randomness: every random number is
a SplitMix64 hash of ``(seed, row, slot)``, so generation is vectorised, needs no state and
costs about the same for any range. Its labels come from a *planted* model, so held-out AUC
measures how much a model has learned (a model that recovers the planted logit reaches about
0.8, one that only learns the dense part about 0.72; ``oracle_logits`` gives the planted
logit).

Criteo TSV (:class:`CriteoTSV`): ``label \\t 13 ints \\t 26 hex categories`` per line, empty
fields allowed. Malformed lines are counted and skipped, never raised.

No torch import here: the job master and the profiler read data without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from dlrover_core.errors import InputError
from dlrover_core.history.redact import redact_url
from dlrover_core.training.paths import is_local, is_url, resolve_path
from dlrover_core.training.pin import Pins, attach

if TYPE_CHECKING:
    from dlrover_core.spec import JobSpec

CRITEO_DENSE = 13
CRITEO_SPARSE = 26
EVAL_ROW_START = 2**40
"""First row of the synthetic held-out set: far beyond any training range."""

# --- Batch --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Batch:
    """Records of rows ``[row_start, row_end)``; ``skipped`` of them were malformed.

    ``dense`` float32 ``[n, num_dense]`` (already transformed: log(1 + max(x, 0))),
    ``sparse`` int64 ``[n, num_sparse]`` (one raw id per categorical feature, not yet hashed
    into a table), ``labels`` float32 ``[n]`` in {0, 1}. ``n == row_end - row_start - skipped``.
    """

    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray
    row_start: int
    row_end: int
    skipped: int = 0

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_dense(self) -> int:
        return int(self.dense.shape[1])

    @property
    def num_sparse(self) -> int:
        return int(self.sparse.shape[1])

    def take(self, start: int, end: int) -> Batch:
        """Records ``[start, end)`` by position in this batch (not by row index).

        The result keeps this batch's row range and carries no skipped count, so summing
        ``skipped`` over the pieces of one batch does not count a malformed line twice."""
        return Batch(
            self.dense[start:end],
            self.sparse[start:end],
            self.labels[start:end],
            self.row_start,
            self.row_end,
            0,
        )

    def split(self, batch_size: int) -> Iterator[Batch]:
        """Consecutive mini-batches of at most ``batch_size`` records (the last may be short)."""
        if batch_size <= 0:
            raise InputError(f"batch_size must be positive, got {batch_size}")
        for i in range(0, len(self), batch_size):
            yield self.take(i, i + batch_size)

    @staticmethod
    def empty(num_dense: int, num_sparse: int, row_start: int, row_end: int, skipped: int) -> Batch:
        return Batch(
            np.zeros((0, num_dense), np.float32),
            np.zeros((0, num_sparse), np.int64),
            np.zeros((0,), np.float32),
            row_start,
            row_end,
            skipped,
        )


class DataSource(Protocol):
    """What a worker, the profiler and the evaluation read records through."""

    @property
    def num_dense(self) -> int: ...

    @property
    def num_sparse(self) -> int: ...

    @property
    def num_rows(self) -> int:
        """Training rows addressable as ``[0, num_rows)``."""
        ...

    @property
    def malformed_total(self) -> int:
        """Distinct malformed records met so far (always 0 for synthetic data)."""
        ...

    def rows(self, start: int, end: int) -> Batch: ...

    def eval_rows(self, n: int) -> Batch: ...


def _check_range(start: int, end: int) -> None:
    if start < 0 or end < start:
        raise InputError(f"row range [{start}, {end}) is invalid; need 0 <= start <= end")


# --- where data lives, and how good it is ---------------------------------------------------


def source_for_path(path: str | os.PathLike[str]) -> str:
    """The ``data.source`` a file name suggests: ``parquet`` for ``*.parquet``/``*.pq`` or a
    folder, else ``criteo_tsv``."""
    text = str(path).rstrip("/")
    if text.endswith((".parquet", ".pq")):
        return "parquet"
    if not is_url(text) and Path(os.path.expanduser(text)).is_dir():
        return "parquet"
    return "criteo_tsv"


@dataclass
class FileQuality:
    """Records read from one file and the malformed ones skipped, training part and held-out
    part apart; ``first_malformed`` is the 1-based line (row) number of the first bad one."""

    path: str
    records: int = 0
    malformed: int = 0
    held_out_records: int = 0
    held_out_malformed: int = 0
    first_malformed: int | None = None

    def add(self, good: int, bad: int, *, held_out: bool, first_bad: int | None) -> None:
        if held_out:
            self.held_out_records += good
            self.held_out_malformed += bad
        else:
            self.records += good
            self.malformed += bad
        if first_bad is not None and self.first_malformed is None:
            self.first_malformed = first_bad


@dataclass
class DataQuality:
    """Per file and in total: what a scan of the data found (the report's ``data`` section)."""

    files: list[FileQuality]
    complete: bool = True  # False: only the first rows of each part were scanned (a sample)

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)

    @property
    def malformed(self) -> int:
        return sum(f.malformed + f.held_out_malformed for f in self.files)

    @property
    def held_out_records(self) -> int:
        return sum(f.held_out_records for f in self.files)

    def problem(self, eval_rows: int) -> str | None:
        """Why this data cannot train a model (None when it can)."""
        if self.records == 0:
            bad = [f for f in self.files if f.malformed]
            where = f"; the first in {bad[0].path} at line {bad[0].first_malformed}" if bad else ""
            scanned = "" if self.complete else " in the first rows scanned"
            return (
                f"the training data has no usable record{scanned}: {self.malformed:,} "
                "malformed line(s)"
                f"{where}. Fix the file(s) (Criteo format: label, 13 integers, 26 hex ids, "
                "tab-separated) or point data.path at good data"
            )
        if eval_rows > 0 and self.held_out_records == 0:
            return (
                f"the held-out part of the data (data.eval_rows={eval_rows}) has no usable "
                "record, so the model cannot be scored; fix the file(s) or set data.eval_rows=0"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "malformed": self.malformed,
            "held_out_records": self.held_out_records,
            "complete": self.complete,
            "files": [dataclasses.asdict(f) for f in self.files],
        }


SCAN_LIMIT = 200_000
"""Rows of the training part and of the held-out part that the check before a job parses
(measured ≈ 9–30k TSV lines/s on this 2-core machine: a bounded wait, not an extra epoch)."""


def data_quality(source: DataSource, limit: int | None = SCAN_LIMIT) -> DataQuality | None:
    """Scan a file source (the first ``limit`` rows of each part; None: all of it). None for
    generated data, which has no malformed records."""
    q = getattr(source, "quality", None)
    return q(limit) if callable(q) else None


# --- counter-based randomness ---------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_U_GAMMA = np.uint64(_GAMMA)
_U_M1 = np.uint64(0xBF58476D1CE4E5B9)
_U_M2 = np.uint64(0x94D049BB133111EB)
_LO32 = np.uint64(0xFFFFFFFF)
_INV32 = 1.0 / 2**32


def _mix_int(x: int) -> int:
    """SplitMix64's finaliser on a Python int (for keys and constants)."""
    z = x & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _hash(counter: np.ndarray, key: int) -> np.ndarray:
    """SplitMix64 of ``counter * gamma + key`` for a uint64 array (wraps mod 2**64)."""
    z = counter * _U_GAMMA
    z += np.uint64(key)
    z ^= z >> np.uint64(30)
    z *= _U_M1
    z ^= z >> np.uint64(27)
    z *= _U_M2
    z ^= z >> np.uint64(31)
    return z


def _uniforms(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two independent uniforms from one 64-bit hash: (0, 1] from the high half, [0, 1) low."""
    hi = ((h >> np.uint64(32)).astype(np.float64) + 1.0) * _INV32
    lo = (h & _LO32).astype(np.float64) * _INV32
    return hi, lo


def _normal(h: np.ndarray) -> np.ndarray:
    """A standard normal per hash (Box-Muller on its two halves)."""
    u1, u2 = _uniforms(h)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _unit(values: Sequence[int] | np.ndarray, key: int) -> np.ndarray:
    """Uniforms in [0, 1) from small integer ids (for per-column constants)."""
    h = _hash(np.asarray(values, dtype=np.uint64), key)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


# --- synthetic Criteo ---------------------------------------------------------------------


class SyntheticCriteo:
    """Deterministic Criteo-like records addressed by row index.

    Per row: ``num_dense`` count features (log-normal counts, many zeros, returned as
    log(1 + x)) and ``num_sparse`` categorical ids. A categorical id is, with probability
    ``new_id_rate``, a **new** id never seen before (``head + row * num_sparse + feature``, so
    the number of distinct ids keeps growing, U(n) ≈ K·n^β as in real CTR logs), and otherwise
    an id of rank k in the feature's head drawn from Zipf(``alpha``) (``kind="uniform"``: all
    head ids equally likely); the id of rank k is k - 1. The head is ``head_size`` ids for a
    dynamic table (``cardinalities[f] is None``) and the table's rows for a static one, whose
    ids (new ones too) are taken modulo its cardinality.

    Labels: ``P(label=1) = sigmoid(bias + w·z + Σ_f effect(f, id_f) + noise)`` where ``z`` is
    the standard normal behind each dense feature, ``w`` a fixed vector of norm
    ``dense_scale``, ``effect`` a fixed hash-based value for every head id (0 for new ids, which
    carry nothing to learn) with total standard deviation ``sparse_scale`` across features, and
    ``noise`` normal with std ``noise_std``.
    """

    # slots of one row's counter space: 1 per dense feature, 1 per sparse feature, 1 label
    _LABEL_SLOTS = 1

    def __init__(
        self,
        num_dense: int = CRITEO_DENSE,
        num_sparse: int = CRITEO_SPARSE,
        alpha: float = 1.1,
        new_id_rate: float = 0.01,
        seed: int = 0,
        cardinalities: Sequence[int | None] | None = None,
        *,
        kind: Literal["zipf", "uniform"] = "zipf",
        num_rows: int = 100_000,
        head_size: int = 1_000_000,
        bias: float = -1.2,
        dense_scale: float = 1.0,
        sparse_scale: float = 1.0,
        noise_std: float = 0.5,
    ) -> None:
        problems = []
        if num_dense < 0 or num_sparse < 0:
            problems.append(f"num_dense ({num_dense}) and num_sparse ({num_sparse}) must be >= 0")
        if num_sparse > 1024:
            problems.append(f"num_sparse ({num_sparse}) must be at most 1024")
        if not alpha > 0:
            problems.append(f"alpha must be positive, got {alpha}")
        if not 0.0 <= new_id_rate <= 1.0:
            problems.append(f"new_id_rate must be in [0, 1], got {new_id_rate}")
        if head_size <= 0:
            problems.append(f"head_size must be positive, got {head_size}")
        if num_rows <= 0:
            problems.append(f"num_rows must be positive, got {num_rows}")
        if kind not in ("zipf", "uniform"):
            problems.append(f"kind must be 'zipf' or 'uniform', got {kind!r}")
        cards = list(cardinalities) if cardinalities is not None else [None] * num_sparse
        if len(cards) != num_sparse:
            problems.append(
                f"cardinalities has {len(cards)} entries but num_sparse is {num_sparse}; "
                "give one per categorical feature (None for a dynamic table)"
            )
        if any(c is not None and c <= 0 for c in cards):
            problems.append(f"cardinalities must be positive or None, got {cards}")
        if problems:
            raise InputError("invalid synthetic data settings:", problems=problems)

        self._num_dense = num_dense
        self._num_sparse = num_sparse
        self._num_rows = num_rows
        self.alpha = float(alpha)
        self.new_id_rate = float(new_id_rate)
        self.seed = int(seed)
        self.kind = kind
        self.cardinalities: tuple[int | None, ...] = tuple(cards)
        self.head_size = int(head_size)
        self.bias = float(bias)
        self.noise_std = float(noise_std)

        self._stride = num_dense + num_sparse + self._LABEL_SLOTS
        self._key_rows = _mix_int(self.seed * 4 + 1)
        self._key_effect = _mix_int(self.seed * 4 + 2)
        consts = _mix_int(self.seed * 4 + 3)
        # head per feature, and the id a static table's ids wrap at (0: no wrap)
        self._heads = np.array(
            [min(self.head_size, c) if c is not None else self.head_size for c in cards],
            dtype=np.float64,
        )
        self._mods = np.array([c or 0 for c in cards], dtype=np.int64)
        # dense columns: count = floor(exp(mu + sigma·z)) - 1, so a good share are zeros
        j = np.arange(num_dense)
        self._mu = 0.5 + 3.0 * _unit(j, consts)
        self._sigma = 0.6 + 1.0 * _unit(j + 1000, consts)
        w = 2.0 * _unit(j + 2000, consts) - 1.0
        norm = float(np.linalg.norm(w))
        self._w = w * (dense_scale / norm) if norm > 0 else w
        # effect(f, id) = scale_f · U(-√3, √3): variance sparse_scale² spread over features
        self._effect_scale = sparse_scale / math.sqrt(num_sparse) if num_sparse else 0.0

    # --- DataSource -------------------------------------------------------------------------
    @property
    def num_dense(self) -> int:
        return self._num_dense

    @property
    def num_sparse(self) -> int:
        return self._num_sparse

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def malformed_total(self) -> int:
        return 0

    def rows(self, start: int, end: int) -> Batch:
        return self._generate(start, end)[0]

    def eval_rows(self, n: int) -> Batch:
        """A held-out set: rows from :data:`EVAL_ROW_START`, disjoint from any training range."""
        if n < 0:
            raise InputError(f"eval rows must be >= 0, got {n}")
        return self.rows(EVAL_ROW_START, EVAL_ROW_START + n)

    def oracle_logits(self, start: int, end: int) -> np.ndarray:
        """The planted logit of rows ``[start, end)`` (without the noise term): the best any
        model can score; its AUC bounds what training can reach."""
        return self._generate(start, end)[1]

    def effect(self, feature: int, ids: np.ndarray) -> np.ndarray:
        """The planted label effect of ``ids`` of one categorical feature (0 outside the head)."""
        ids = np.asarray(ids, dtype=np.int64)
        counter = ids.astype(np.uint64) * np.uint64(1024) + np.uint64(feature)
        u = (_hash(counter, self._key_effect) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        eff = self._effect_scale * math.sqrt(3.0) * (2.0 * u - 1.0)
        return np.where(ids < self._heads[feature], eff, 0.0)

    # --- generation ---------------------------------------------------------------------
    def _generate(self, start: int, end: int) -> tuple[Batch, np.ndarray]:
        _check_range(start, end)
        nd, ns = self._num_dense, self._num_sparse
        row = np.arange(start, end, dtype=np.uint64)
        base = row * np.uint64(self._stride)

        # dense: one normal per cell
        z = _normal(_hash(base[:, None] + np.arange(nd, dtype=np.uint64), self._key_rows))
        counts = np.floor(np.exp(self._mu + self._sigma * z)) - 1.0
        dense = np.log1p(np.maximum(counts, 0.0)).astype(np.float32)
        logit = self.bias + z @ self._w

        # sparse: new id with probability new_id_rate, else a head id of Zipf rank
        slots = np.arange(nd, nd + ns, dtype=np.uint64)
        u_rank, u_new = _uniforms(_hash(base[:, None] + slots, self._key_rows))
        rank = self._rank(1.0 - u_rank)  # u_rank in (0, 1] -> [0, 1)
        feat = np.arange(ns, dtype=np.int64)
        new = self.head_size + np.arange(start, end, dtype=np.int64)[:, None] * ns + feat[None, :]
        sparse = np.where(u_new < self.new_id_rate, new, rank - 1)
        static = self._mods > 0
        if static.any():
            sparse[:, static] %= self._mods[static]
        for f in range(ns):
            logit += self.effect(f, sparse[:, f])

        # label: Bernoulli(sigmoid(logit + noise))
        h = _hash(base + np.uint64(nd + ns), self._key_rows)
        u1, u2 = _uniforms(h)
        noise = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        # the label's own uniform: an independent re-hash of the same counter
        u_label = (_hash(h, self._key_rows) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        p = 1.0 / (1.0 + np.exp(-(logit + self.noise_std * noise)))
        labels = (u_label < p).astype(np.float32)
        return Batch(dense, sparse.astype(np.int64, copy=False), labels, start, end), logit

    def _rank(self, u: np.ndarray) -> np.ndarray:
        """Head rank in [1, head] by the inverse CDF of a continuous power law on [1, head+1)."""
        top = self._heads + 1.0  # per feature, broadcast over rows
        if self.kind == "uniform":
            x = 1.0 + u * self._heads
        elif abs(1.0 - self.alpha) < 1e-9:
            x = np.exp(u * np.log(top))
        else:
            a = 1.0 - self.alpha
            x = (1.0 + u * (top**a - 1.0)) ** (1.0 / a)
        return np.minimum(np.floor(x), self._heads).astype(np.int64)


# --- Criteo TSV ---------------------------------------------------------------------------


class CriteoTSV:
    """A Criteo-format TSV file read by line range.

    Each line: ``label \\t I1..I13 \\t C1..C26`` (tab-separated; empty fields allowed: a missing
    integer reads 0, a missing category id 0). Integers become ``log(1 + max(x, 0))``, hex
    categories int64 ids (``int(x, 16)``). Only the first ``num_dense`` integer and
    ``num_sparse`` categorical columns are returned, but every field is validated, so the
    malformed count does not depend on the model. A malformed line (wrong field count,
    non-integer, bad hex, label not 0/1) is skipped and counted in ``Batch.skipped`` and
    :attr:`malformed_total`.

    Rows are line numbers. A line-offset index is built once (one pass over the file in 16 MiB
    chunks), so ``rows(start, end)`` seeks and parses only its range. The last ``holdout``
    lines are the held-out set (:meth:`eval_rows`); ``num_rows`` counts the lines before them.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        num_dense: int = CRITEO_DENSE,
        num_sparse: int = CRITEO_SPARSE,
        *,
        holdout: int = 0,
        file_dense: int = CRITEO_DENSE,
        file_sparse: int = CRITEO_SPARSE,
        max_rows: int | None = None,
    ) -> None:
        self.url = str(path)
        self._fs, self._fpath = resolve_path(self.url)
        self.path = Path(self._fpath) if is_local(self._fs) else Path(self.url)
        if not self._fs.isfile(self._fpath):
            raise InputError(
                f"Criteo TSV {redact_url(self.url)!r} does not exist; give an existing file, "
                "or use the synthetic source"
            )
        if not (0 <= num_dense <= file_dense and 0 <= num_sparse <= file_sparse):
            raise InputError(
                f"a Criteo TSV has {file_dense} integer and {file_sparse} categorical columns; "
                f"asked for {num_dense} and {num_sparse}: lower model.dense_features or use "
                "fewer embedding tables"
            )
        self._num_dense = num_dense
        self._num_sparse = num_sparse
        self._file_dense = file_dense
        self._file_sparse = file_sparse
        self._fields = 1 + file_dense + file_sparse
        self._starts = self._index()
        self.num_lines = int(self._starts.shape[0]) - 1
        if holdout < 0 or (holdout > 0 and holdout >= self.num_lines):
            raise InputError(
                f"holdout ({holdout}) must be smaller than the file's {self.num_lines} lines; "
                "lower data.eval_rows"
            )
        self.holdout = holdout
        self.max_rows = max_rows
        self._malformed: set[int] = set()
        self._first_bad: int | None = None
        self.pins: Pins | None = None  # the job's pinned inputs (pin.attach): checked per read

    def _index(self) -> np.ndarray:
        """Start offset of every line, plus the file size as the end of the last one."""
        size = int(self._fs.size(self._fpath))
        parts = [np.zeros(1, dtype=np.int64)]
        chunk = 16 << 20
        with self._fs.open(self._fpath, "rb") as fh:
            pos = 0
            while True:
                buf = fh.read(chunk)
                if not buf:
                    break
                nl = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)
                parts.append(nl.astype(np.int64) + (pos + 1))
                pos += len(buf)
        starts = np.concatenate(parts)
        if starts[-1] != size:  # the last line has no newline: close it at the file's end
            starts = np.append(starts, size)
        return starts

    # --- DataSource -------------------------------------------------------------------------
    @property
    def num_dense(self) -> int:
        return self._num_dense

    @property
    def num_sparse(self) -> int:
        return self._num_sparse

    @property
    def num_rows(self) -> int:
        """Training rows: those before the held-out tail, at most ``max_rows`` of them."""
        n = self.num_lines - self.holdout
        return n if self.max_rows is None else min(n, self.max_rows)

    @property
    def held_out_start(self) -> int:
        return self.num_lines - self.holdout

    @property
    def malformed_total(self) -> int:
        return len(self._malformed)

    def stats(self) -> dict[str, Any]:
        return {
            "path": redact_url(self.url),
            "lines": self.num_lines,
            "train_rows": self.num_rows,
            "holdout": self.holdout,
            "malformed_total": self.malformed_total,
        }

    @property
    def files(self) -> list[str]:
        return [redact_url(self.url)]

    def quality(self, limit: int | None = None, chunk: int = 65536) -> DataQuality:
        """Parse the lines once (at most ``limit`` of the training part and of the held-out
        tail each): good and malformed lines, and the number of the first malformed one."""
        f = FileQuality(redact_url(self.url))
        complete = True
        for lo, hi, held in (
            (0, self.num_rows, False),
            (self.held_out_start, self.num_lines, True),
        ):
            if limit is not None and hi - lo > limit:
                hi, complete = lo + limit, False
            for a in range(lo, hi, chunk):
                b = self.rows(a, min(a + chunk, hi))
                f.add(len(b), b.skipped, held_out=held, first_bad=self._first_bad)
        return DataQuality([f], complete)

    def eval_rows(self, n: int) -> Batch:
        """The first ``n`` lines of the held-out tail (at most ``holdout``)."""
        if n < 0:
            raise InputError(f"eval rows must be >= 0, got {n}")
        start = self.held_out_start
        return self.rows(start, start + min(n, self.holdout))

    def rows(self, start: int, end: int) -> Batch:
        """Good records of lines ``[start, end)`` (``end`` clipped to the file)."""
        _check_range(start, end)
        if self.pins is not None:
            self.pins.check()
        end = min(end, self.num_lines)
        start = min(start, end)
        if start == end:
            return Batch.empty(self._num_dense, self._num_sparse, start, end, 0)
        lo, hi = int(self._starts[start]), int(self._starts[end])
        with self._fs.open(self._fpath, "rb") as fh:
            fh.seek(lo)
            data = fh.read(hi - lo)
        lines = data.decode("utf-8", errors="replace").split("\n")
        if len(lines) == end - start + 1 and lines[-1] == "":
            lines.pop()  # the newline that ends the last line of the range
        labels: list[int] = []
        ints: list[list[int]] = []
        cats: list[list[int]] = []
        bad = 0
        nd, ns, fd = self._num_dense, self._num_sparse, self._file_dense
        self._first_bad = None
        for i, line in enumerate(lines):
            rec = self._parse(line)
            if rec is None:
                bad += 1
                self._malformed.add(start + i)
                if self._first_bad is None:
                    self._first_bad = start + i + 1  # 1-based line number
                continue
            labels.append(rec[0])
            ints.append(rec[1 : 1 + nd])
            cats.append(rec[1 + fd : 1 + fd + ns])
        if not labels:
            return Batch.empty(nd, ns, start, end, bad)
        raw = np.asarray(ints, dtype=np.float64).reshape(len(labels), nd)
        return Batch(
            np.log1p(np.maximum(raw, 0.0)).astype(np.float32),
            np.asarray(cats, dtype=np.int64).reshape(len(labels), ns),
            np.asarray(labels, dtype=np.float32),
            start,
            end,
            bad,
        )

    def _parse(self, line: str) -> list[int] | None:
        parts = line.rstrip("\r").split("\t")
        if len(parts) != self._fields or parts[0] not in ("0", "1"):
            return None
        fd = self._file_dense
        try:
            out = [int(parts[0])]
            out.extend(int(p) if p else 0 for p in parts[1 : 1 + fd])
            cats = [int(p, 16) if p else 0 for p in parts[1 + fd :]]
        except ValueError:
            return None
        if any(c < 0 or c >= 2**63 for c in cats) or any(abs(x) >= 2**53 for x in out):
            return None
        out.extend(cats)
        return out


def drifting_day(
    spec: JobSpec, day: int, rows: int, eval_rows: int, *, drift: float = 0.15, seed: int = 0
) -> Batch:
    """Day ``day`` of a drifting stream for ``spec``'s model (``rows`` to train on, then
    ``eval_rows`` held out): one planted truth (every head id's effect, the dense weights) and
    each day new rows, so new ids, and a click rate shifted by ``drift`` in the logit a day. A
    recurring retrain's test and benchmark data (write it with :func:`write_criteo_tsv`)."""
    tables = spec.model.embedding_tables
    gen = SyntheticCriteo(
        num_dense=spec.model.dense_features,
        num_sparse=len(tables),
        alpha=spec.data.ids.alpha,
        new_id_rate=spec.data.ids.new_id_rate,
        seed=seed,
        cardinalities=[
            t.num_embeddings if isinstance(t.num_embeddings, int) else None for t in tables
        ],
        num_rows=10**12,
        bias=-1.2 + drift * day,
    )
    start = day * (rows + eval_rows)
    return gen.rows(start, start + rows + eval_rows)


def file_spec(
    spec_dict: dict[str, Any], path: str | os.PathLike[str], rows: int, eval_rows: int
) -> dict[str, Any]:
    """``spec_dict`` (a spec as a dict) reading a Criteo TSV file: its first ``rows`` lines
    trained on, its last ``eval_rows`` held out."""
    out = json.loads(json.dumps(spec_dict))
    out["data"] = {
        "source": "criteo_tsv",
        "path": str(path),
        "rows": rows,
        "eval_rows": eval_rows,
        "shard_batches": spec_dict.get("data", {}).get("shard_batches", 10),
    }
    return out


def write_criteo_tsv(
    path: str | os.PathLike[str],
    batch: Batch,
    *,
    file_dense: int = CRITEO_DENSE,
    file_sparse: int = CRITEO_SPARSE,
    append: bool = False,
) -> None:
    """Write ``batch`` as Criteo-format lines (the inverse of :class:`CriteoTSV`).

    Dense values are written as the integers ``round(exp(x) - 1)`` (exact for values that came
    from integer counts); categories as lower-case hex. Columns beyond the batch's are left
    empty, so a file written from a batch of 8 categorical features still has 26."""
    if batch.num_dense > file_dense or batch.num_sparse > file_sparse:
        raise InputError(
            f"batch has {batch.num_dense} dense / {batch.num_sparse} sparse columns; a Criteo "
            f"file holds at most {file_dense} / {file_sparse}"
        )
    ints = np.rint(np.expm1(batch.dense.astype(np.float64))).astype(np.int64)
    pad_d = [""] * (file_dense - batch.num_dense)
    pad_s = [""] * (file_sparse - batch.num_sparse)
    with open(path, "a" if append else "w") as fh:
        for i in range(len(batch)):
            fields = [str(int(batch.labels[i]))]
            fields += [str(x) for x in ints[i]] + pad_d
            fields += [format(int(x), "x") for x in batch.sparse[i]] + pad_s
            fh.write("\t".join(fields) + "\n")


# --- Parquet ------------------------------------------------------------------------------


class ParquetCriteo:
    """Criteo-like records from Parquet: one file, a folder of ``*.parquet`` files (sorted by
    name) or an fsspec URL of either, read by row range through pyarrow.

    Columns: ``label`` (0/1), ``I1``.. ``I{num_dense}`` (integers or floats; null reads 0) and
    ``C1``.. ``C{num_sparse}`` (integer ids, or hex strings as in Criteo's TSV; null reads 0).
    Other columns are ignored. A row is malformed (skipped and counted, per file) when its
    label is null or not 0/1, a dense value is not finite, or a categorical value is not a
    non-negative id (or not hex). Rows are numbered across the files in order; the last
    ``holdout`` rows are the held-out set."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        num_dense: int = CRITEO_DENSE,
        num_sparse: int = CRITEO_SPARSE,
        *,
        holdout: int = 0,
        max_rows: int | None = None,
    ) -> None:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError(
                "data.source 'parquet' needs pyarrow; install dlrover-rm[data]"
            ) from None
        self._pq = pq
        self.url = str(path)
        self._fs, root = resolve_path(self.url)
        if not self._fs.exists(root):
            raise InputError(
                f"Parquet data {redact_url(self.url)!r} does not exist; give an existing file "
                "or folder of .parquet files"
            )
        if self._fs.isdir(root):
            found = sorted(p for p in self._fs.find(root) if str(p).endswith((".parquet", ".pq")))
            if not found:
                raise InputError(
                    f"folder {redact_url(self.url)!r} holds no .parquet file; point data.path "
                    "at a Parquet file or a folder of them"
                )
            self._paths = [str(p) for p in found]
        else:
            self._paths = [root]
        self._num_dense, self._num_sparse = num_dense, num_sparse
        self._dense_cols = [f"I{i + 1}" for i in range(num_dense)]
        self._sparse_cols = [f"C{i + 1}" for i in range(num_sparse)]
        self._files: list[Any] = []
        counts = []
        for p in self._paths:
            try:
                pf = pq.ParquetFile(self._fs.open(p, "rb"))
            except Exception as e:  # pyarrow raises its own ArrowInvalid/OSError family
                raise InputError(f"{self._show(p)} is not a readable Parquet file: {e}") from None
            names = set(pf.schema_arrow.names)
            missing = [
                c for c in ["label", *self._dense_cols, *self._sparse_cols] if c not in names
            ]
            if missing:
                raise InputError(
                    f"{self._show(p)} lacks column(s) {', '.join(missing[:5])}"
                    f"{' ...' if len(missing) > 5 else ''}; a Parquet training file needs "
                    f"label, I1..I{num_dense} and C1..C{num_sparse}"
                )
            schema = pf.schema_arrow
            wrong = [c for c in ["label", *self._dense_cols] if not _numeric(schema.field(c).type)]
            if wrong:
                raise InputError(
                    f"{self._show(p)}: column(s) {', '.join(wrong[:5])} are not numbers; label "
                    "and the dense columns I1.. must be integer, float or boolean"
                )
            self._files.append(pf)
            counts.append(pf.metadata.num_rows)
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_lines = int(self._offsets[-1])
        if holdout < 0 or (holdout > 0 and holdout >= self.num_lines):
            raise InputError(
                f"holdout ({holdout}) must be smaller than the data's {self.num_lines} rows; "
                "lower data.eval_rows"
            )
        self.holdout = holdout
        self.max_rows = max_rows
        self._malformed_by_file = [0] * len(self._paths)
        self._seen_bad: set[int] = set()
        self._first_bad: int | None = None
        self.pins: Pins | None = None  # the job's pinned inputs (pin.attach): checked per read

    def _show(self, p: str) -> str:
        return redact_url(p if not is_url(self.url) else f"{self.url.split('://')[0]}://{p}")

    @property
    def files(self) -> list[str]:
        return [self._show(p) for p in self._paths]

    @property
    def num_dense(self) -> int:
        return self._num_dense

    @property
    def num_sparse(self) -> int:
        return self._num_sparse

    @property
    def num_rows(self) -> int:
        """Training rows: those before the held-out tail, at most ``max_rows`` of them."""
        n = self.num_lines - self.holdout
        return n if self.max_rows is None else min(n, self.max_rows)

    @property
    def held_out_start(self) -> int:
        return self.num_lines - self.holdout

    @property
    def malformed_total(self) -> int:
        return len(self._seen_bad)

    def eval_rows(self, n: int) -> Batch:
        if n < 0:
            raise InputError(f"eval rows must be >= 0, got {n}")
        start = self.held_out_start
        return self.rows(start, start + min(n, self.holdout))

    def _read(self, k: int, lo: int, hi: int) -> Any:
        """Rows ``[lo, hi)`` of file ``k`` as a pyarrow Table (only the row groups needed)."""
        if self.pins is not None:
            self.pins.check()
        pf = self._files[k]
        md = pf.metadata
        groups, first, pos = [], None, 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            if pos + n > lo and pos < hi:
                groups.append(g)
                first = pos if first is None else first
            pos += n
        cols = ["label", *self._dense_cols, *self._sparse_cols]
        table = pf.read_row_groups(groups, columns=cols)
        return table.slice(lo - (first or 0), hi - lo)

    def rows(self, start: int, end: int) -> Batch:
        _check_range(start, end)
        end = min(end, self.num_lines)
        start = min(start, end)
        nd, ns = self._num_dense, self._num_sparse
        parts: list[Batch] = []
        bad_total = 0
        self._first_bad = None
        for k in range(len(self._paths)):
            f0, f1 = int(self._offsets[k]), int(self._offsets[k + 1])
            lo, hi = max(start, f0), min(end, f1)
            if lo >= hi:
                continue
            b, bad_rows = self._convert(self._read(k, lo - f0, hi - f0), lo, hi)
            fresh = [r for r in bad_rows if r not in self._seen_bad]
            self._seen_bad.update(fresh)
            self._malformed_by_file[k] += len(fresh)
            if bad_rows and self._first_bad is None:
                self._first_bad = bad_rows[0] - f0 + 1
            bad_total += len(bad_rows)
            parts.append(b)
        if not parts or sum(len(p) for p in parts) == 0:
            return Batch.empty(nd, ns, start, end, bad_total)
        return Batch(
            np.concatenate([p.dense for p in parts]),
            np.concatenate([p.sparse for p in parts]),
            np.concatenate([p.labels for p in parts]),
            start,
            end,
            bad_total,
        )

    def _convert(self, table: Any, lo: int, hi: int) -> tuple[Batch, list[int]]:
        import pyarrow as pa

        n = table.num_rows
        lab = _floats(table.column("label"), np.nan)
        ok = np.isin(lab, (0.0, 1.0))
        dense = np.zeros((n, self._num_dense), np.float64)
        for j, c in enumerate(self._dense_cols):
            v = _floats(table.column(c), 0.0)
            ok &= np.isfinite(v)
            dense[:, j] = np.where(np.isfinite(v), v, 0.0)
        sparse = np.zeros((n, self._num_sparse), np.int64)
        for j, c in enumerate(self._sparse_cols):
            col = table.column(c)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                ids, good = _hex_ids(col.to_pylist())
            elif pa.types.is_integer(col.type):
                raw = col.fill_null(0).to_numpy()
                good = raw >= 0 if raw.dtype.kind == "i" else raw < 2**63
                ids = np.where(good, raw, 0).astype(np.int64)
            else:
                f = _floats(col, 0.0)
                good = np.isfinite(f) & (f >= 0) & (f < 2.0**63) & (np.floor(f) == f)
                ids = np.where(good, f, 0).astype(np.int64)
            ok &= good
            sparse[:, j] = ids
        bad_rows = [lo + int(i) for i in np.flatnonzero(~ok)]
        batch = Batch(
            np.log1p(np.maximum(dense[ok], 0.0)).astype(np.float32),
            sparse[ok],
            lab[ok].astype(np.float32),
            lo,
            hi,
            len(bad_rows),
        )
        return batch, bad_rows

    def quality(self, limit: int | None = None, chunk: int = 65536) -> DataQuality:
        """Read the rows once (at most ``limit`` of the training part and of the held-out part
        each): good and malformed rows per file, training and held-out apart."""
        out = []
        budget = {False: limit, True: limit}
        for k in range(len(self._paths)):
            f = FileQuality(self._show(self._paths[k]))
            f0, f1 = int(self._offsets[k]), int(self._offsets[k + 1])
            train_end = min(max(self.num_rows, f0), f1)
            cut = min(max(self.held_out_start, f0), f1)
            for lo, hi, held in ((f0, train_end, False), (cut, f1, True)):
                left = budget[held]
                if left is not None:
                    hi = min(hi, lo + left)
                    budget[held] = left - max(0, hi - lo)
                for a in range(lo, hi, chunk):
                    b = self.rows(a, min(a + chunk, hi))
                    f.add(len(b), b.skipped, held_out=held, first_bad=self._first_bad)
            out.append(f)
        complete = limit is None or (
            self.num_rows <= limit and self.num_lines - self.held_out_start <= limit
        )
        return DataQuality(out, complete)


def _floats(col: Any, null: float) -> np.ndarray:
    """A numeric (or boolean) pyarrow column as float64, nulls as ``null``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return np.asarray(
        pc.cast(col, pa.float64()).fill_null(null).to_numpy(zero_copy_only=False), np.float64
    )


def _numeric(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _hex_ids(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros(len(values), np.int64)
    good = np.ones(len(values), bool)
    for i, x in enumerate(values):
        if x is None or x == "":
            continue
        try:
            v = int(x, 16)
        except ValueError:
            good[i] = False
            continue
        if 0 <= v < 2**63:
            ids[i] = v
        else:
            good[i] = False
    return ids, good


# --- factory --------------------------------------------------------------------------------


def from_spec(spec: JobSpec) -> DataSource:
    """The data source a job spec names: synthetic Criteo-like rows, a Criteo TSV file or
    Parquet (a file or a folder; local or an fsspec URL).

    One categorical feature per embedding table, in table order; a table's cardinality is its
    ``num_embeddings`` (None when dynamic). For a TSV file the last ``data.eval_rows`` lines
    are held out and ``num_rows`` is the number of lines before them (at most ``data.rows``
    when the spec gives it)."""
    m, d = spec.model, spec.data
    tables = m.embedding_tables
    cap = d.rows if "rows" in d.model_fields_set else None  # a file's rows unless capped
    if d.source == "criteo_tsv":
        if d.path is None:
            raise InputError("source 'criteo_tsv' needs data.path (a Criteo-format TSV file)")
        return attach(
            CriteoTSV(d.path, m.dense_features, len(tables), holdout=d.eval_rows, max_rows=cap)
        )
    if d.source == "parquet":
        if d.path is None:
            raise InputError("source 'parquet' needs data.path (a Parquet file or folder)")
        return attach(
            ParquetCriteo(d.path, m.dense_features, len(tables), holdout=d.eval_rows, max_rows=cap)
        )
    cards = [t.num_embeddings if isinstance(t.num_embeddings, int) else None for t in tables]
    return SyntheticCriteo(
        num_dense=m.dense_features,
        num_sparse=len(tables),
        alpha=d.ids.alpha,
        new_id_rate=d.ids.new_id_rate,
        seed=d.seed,
        cardinalities=cards,
        kind=d.ids.kind,
        num_rows=d.rows,
    )
