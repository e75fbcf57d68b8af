"""What each logged step's loss is judged against when a sample's effect is estimated: a robust fit of the log loss
on a linear trend, the step's content-cluster token shares and its mean log sample length, made on the rows around
it.

A run's content types learn at different speeds, so the gap between their losses moves: a fit over the whole run
gives a cluster one coefficient and, against a centred median of raw values (which follows whichever type a
length-grouped sampler is serving), the same batch of an easy type sits 0.3 above or 0.7 below its reference
depending on its neighbours. Refitted on a few hundred rows at a time, each cluster's level follows its own learning
curve, and the length's effect follows the sampler (a length-grouped one moves the length fast). The fit is
Huber-weighted, then trimmed to the rows it fits best, so a few harmful steps do not bend it; a
cluster's coefficient is shrunk towards the window's level (ridge), so a cluster with few rows in a window is judged
at the window's level rather than fitted to its own spikes. Only clusters holding :data:`MIN_CLUSTER_SHARE` of the
samples are columns: a dozen corrupted samples clustered apart predict nothing.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from forensics.stats import robust_sd

#: A cluster below this share of the samples is no column (it would explain its own samples away).
MIN_CLUSTER_SHARE = 0.05
#: The fewest rows either side that the fit needs (10 or more rows per coefficient of a run of a few clusters). A run
#: of under 200 logged values gets fewer (a 60-row run, 15 either side: a line cannot follow its warm-up descent
#: there), and the estimate keeps a centred median.
MIN_HALF_WINDOW = 50
#: Rows judged by one fit, at the least; a longer run judges more rows per fit, so that it makes at most
#: :data:`MAX_FITS` fits (a 100K-row run: 50 rows a fit, about a second).
BLOCK = 16
MAX_FITS = 2000
#: The ridge on a cluster's coefficient, in rows of pure share: a cluster with fewer such rows in the window is pulled
#: towards the window's level.
RIDGE_ROWS = 4.0
#: Huber's constant (robust SDs) and the share of a window's rows the final fit keeps.
HUBER_C = 1.5
KEEP = 0.8


def cluster_token_shares(w: sp.csr_matrix, clusters: np.ndarray) -> np.ndarray:
    """Rows x large clusters: each logged step's token share of each cluster holding :data:`MIN_CLUSTER_SHARE` of
    the samples (``w``: token shares of the samples, ``clusters``: each sample's cluster; negative or missing: none)."""
    ok = np.isfinite(clusters) & (clusters >= 0)
    if not ok.any():
        return np.zeros((w.shape[0], 0))
    values, counts = np.unique(clusters[ok], return_counts=True)
    large = values[counts >= MIN_CLUSTER_SHARE * len(clusters)]
    columns = [w @ (clusters == c).astype(np.float64) for c in large]
    return np.column_stack(columns) if columns else np.zeros((w.shape[0], 0))


def local_residuals(y: np.ndarray, columns: np.ndarray, half_window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(residual, noise)``: ``y`` (log loss per row) less its fit on a linear trend and ``columns`` (the rows'
    cluster token shares, and any other tag whose effect may move: module docstring) made on the ``half_window``
    rows either side of its block, and the robust SD of that fit's residuals; rows in order."""
    n = len(y)
    out = np.full(n, np.nan)
    noise = np.full(n, np.nan)
    penalty = np.r_[0.0, 0.0, np.full(columns.shape[1], RIDGE_ROWS)]
    block = max(BLOCK, -(-n // MAX_FITS))
    for a in range(0, n, block):
        b = min(n, a + block)
        lo, hi = max(0, a - half_window), min(n, b + half_window)
        t = (np.arange(lo, hi) - (a + b) / 2) / max(half_window, 1)
        near = columns[lo:hi]
        x = np.column_stack([np.ones(hi - lo), t, near - near.mean(axis=0)])
        beta = _robust_fit(x, y[lo:hi], penalty)
        r = y[lo:hi] - x @ beta
        out[a:b] = r[a - lo : b - lo]
        r = r[np.isfinite(r)]
        noise[a:b] = robust_sd(r) if len(r) else np.nan
    return out, noise


def relative_noise(noise: np.ndarray, low: float = 0.25, high: float = 4.0) -> np.ndarray:
    """Each row's local noise over the run's median one, clipped to ``[low, high]`` (1 where it is unknown)."""
    ok = np.isfinite(noise) & (noise > 0)
    if not ok.any():
        return np.ones(len(noise))
    mid = float(np.median(noise[ok]))
    return np.clip(np.where(ok, noise, mid) / mid, low, high)


def _robust_fit(x: np.ndarray, y: np.ndarray, penalty: np.ndarray, iterations: int = 10) -> np.ndarray:
    """Huber-weighted ridge least squares, then refitted on the :data:`KEEP` share of rows it fits best until that
    set stops changing."""
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(y) < x.shape[1] + 2:
        return np.r_[np.median(y) if len(y) else 0.0, np.zeros(x.shape[1] - 1)]
    reg = np.diag(penalty)

    def solve(wt: np.ndarray, idx: np.ndarray) -> np.ndarray:
        xs, ys, ws = x[idx], y[idx], wt[idx]
        return np.linalg.solve(xs.T @ (xs * ws[:, None]) + reg + 1e-9 * np.eye(len(reg)), xs.T @ (ys * ws))

    every = np.arange(len(y))
    wt = np.ones(len(y))
    beta = solve(wt, every)
    for _ in range(iterations):
        r = y - x @ beta
        s = robust_sd(r, floor=1e-9)
        a = np.abs(r) / (HUBER_C * s)
        wt = np.where(a <= 1, 1.0, 1.0 / np.maximum(a, 1e-12))
        new = solve(wt, every)
        if np.allclose(new, beta, atol=1e-8):
            beta = new
            break
        beta = new
    h = max(x.shape[1] + 1, int(KEEP * len(y)))
    chosen = None
    for _ in range(10):
        idx = np.sort(np.argpartition(np.abs(y - x @ beta), h - 1)[:h])
        if chosen is not None and np.array_equal(idx, chosen):
            break
        chosen = idx
        beta = solve(np.ones(len(y)), idx)
    return beta
