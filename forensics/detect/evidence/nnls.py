"""Non-negative least squares on the normal equations, for the harmful-samples estimate's small fits.

The estimate refits the effects of the samples it has taken, all of them non-negative, after each one it takes (its
pursuit), then shares the excess of steps among the samples with content evidence (a ridge fit). Each fit has at
most a few hundred unknowns and is posed here by its normal equations (``gram = A'A``, ``moment = A'b``), which the
sparse step-by-sample matrix gives directly. scipy's ``nnls`` and ``lsq_linear`` solve the same problem, but
importing ``scipy.optimize`` cost 0.11 s of the full demo's 3.8 s audit, more than all of its fits together; the
estimate needs nothing else from it. This is Lawson and Hanson's active-set method (Solving Least Squares Problems,
1974, ch. 23), the one scipy's ``nnls`` implements; a test holds the two to the same solutions.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nnls_normal"]


def nnls_normal(gram: np.ndarray, moment: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """``argmin ||A x - b||^2`` over ``x >= 0`` from ``gram = A'A`` (symmetric, positive semi-definite) and
    ``moment = A'b``.

    The passive set (coefficients free to move) grows by the coefficient whose gradient most wants to rise; the
    unconstrained fit on it is taken while it stays positive, else the step is cut where the first coefficient
    reaches 0 and that one leaves the set. A rank-deficient passive set takes the minimum-norm fit."""
    gram = np.asarray(gram, dtype=np.float64)
    moment = np.asarray(moment, dtype=np.float64)
    n = len(moment)
    x = np.zeros(n)
    if n == 0:
        return x
    passive = np.zeros(n, bool)
    tol = 10 * np.finfo(np.float64).eps * max(float(np.abs(gram).sum(axis=0).max()), 1.0) * n
    for _ in range(3 * n if max_iter is None else max_iter):
        grad = moment - gram @ x  # minus half the gradient of the squared residual
        free = ~passive & (grad > tol)
        if not free.any():
            break
        passive[np.flatnonzero(free)[np.argmax(grad[free])]] = True
        while True:
            s = np.zeros(n)
            at = np.flatnonzero(passive)
            s[at] = np.linalg.lstsq(gram[np.ix_(at, at)], moment[at], rcond=None)[0]
            if s[at].min() > 0:
                break
            hit = at[s[at] <= 0]  # step from x towards s until the first of these reaches 0
            gap = x[hit] - s[hit]
            alpha = float(np.min(np.where(gap > 0, x[hit] / np.where(gap > 0, gap, 1.0), 0.0)))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                s = x
                break
        x = s
    return np.maximum(x, 0.0)
