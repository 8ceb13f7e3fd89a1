"""The fits' direct LAPACK calls give numpy's results (the same routines without numpy's
per-call overhead), rank-deficient and singular inputs included. The rank is exact; a solve
agrees to rounding: numpy's and scipy's wheels bundle their own OpenBLAS, whose kernels
(chosen per CPU at run time) can differ in the last bits."""

from __future__ import annotations

import numpy as np
import pytest

from dlrover_core.model.throughput import _rank, _solve


@pytest.mark.parametrize("seed", range(5))
def test_rank_is_numpys_matrix_rank(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        m, n = int(rng.integers(1, 40)), int(rng.integers(1, 10))
        a = rng.standard_normal((m, n)) * np.exp(rng.normal(0, 3, size=n))
        if n > 1 and rng.random() < 0.5:
            a[:, -1] = a[:, 0] * 2.0 - a[:, -2]  # a dependent column
        if rng.random() < 0.2:
            a[:, 0] = 0.0
        assert _rank(a) == int(np.linalg.matrix_rank(a, tol=1e-9))
        assert _rank(a[:, ::2]) == int(np.linalg.matrix_rank(a[:, ::2], tol=1e-9))


@pytest.mark.parametrize("seed", range(5))
def test_solve_is_numpys_solve_and_reports_a_singular_matrix(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n = int(rng.integers(1, 10))
        j = rng.standard_normal((int(rng.integers(n, 60)), n))
        h = j.T @ j
        h.flat[:: n + 1] += 1e-3 * h.diagonal()
        g = rng.standard_normal(n)
        x, info = _solve(h, g)
        assert info == 0
        ref = np.linalg.solve(h, g)
        np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-12 * float(np.abs(ref).max()))
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.solve(singular, np.ones(2))
    assert _solve(singular, np.ones(2))[1] > 0
