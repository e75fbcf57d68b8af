"""Non-negative least squares on the normal equations (forensics.detect.evidence.nnls) against scipy's ``nnls`` on
the same problems, and its optimality (KKT) conditions where the problem has no unique solution."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import nnls

from forensics.detect.evidence.nnls import nnls_normal


def _problem(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Tall and wide, sparse like a steps x samples share matrix or dense, with some true effects 0."""
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(1, 80)), int(rng.integers(1, 30))
    a = rng.random((m, n)) * (rng.random((m, n)) < rng.choice([0.2, 1.0]))
    truth = np.where(rng.random(n) < 0.5, rng.random(n) * 3, 0.0)
    return a, a @ truth + rng.normal(0, rng.choice([0.01, 1.0]), m)


@pytest.mark.parametrize("seed", range(40))
def test_the_solution_is_scipys(seed: int) -> None:
    a, b = _problem(seed)
    x = nnls_normal(a.T @ a, a.T @ b)
    assert (x >= 0).all()
    if np.linalg.matrix_rank(a) == a.shape[1]:  # unique solution: the same one
        np.testing.assert_allclose(x, nnls(a, b)[0], atol=1e-7, rtol=1e-7)
    # either way optimal: no coefficient at 0 wants to rise, the free ones are at a stationary point
    grad = a.T @ b - a.T @ a @ x
    scale = max(1.0, float(np.abs(a.T @ b).max()))
    assert (grad <= 1e-8 * scale).all()
    assert np.allclose(grad[x > 0], 0.0, atol=1e-8 * scale)
    assert np.linalg.norm(a @ x - b) <= np.linalg.norm(a @ nnls(a, b)[0] - b) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize(
    ("gram", "moment", "want"),
    [
        ([[1.0]], [2.0], [2.0]),  # one free coefficient
        ([[1.0]], [-2.0], [0.0]),  # held at the bound
        ([[0.0]], [0.0], [0.0]),  # nothing to fit
        ([[2.0, 0.0], [0.0, 1.0]], [2.0, -1.0], [1.0, 0.0]),
        ([[1.0, 1.0], [1.0, 1.0]], [2.0, 2.0], [2.0, 0.0]),  # collinear: the first taken explains it all
        (np.zeros((0, 0)), np.zeros(0), np.zeros(0)),
    ],
)
def test_small_cases_by_hand(gram, moment, want) -> None:
    np.testing.assert_allclose(nnls_normal(np.array(gram), np.array(moment)), want, atol=1e-12)
