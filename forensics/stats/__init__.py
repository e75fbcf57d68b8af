"""The statistics every stage shares, written once: the run's trend (a rolling median), detrending, the share of
variance a grouping explains, and features of the step sequence.

- :func:`rolling_median`, :func:`detrend`: the trend every rule and the report take out before judging the rest;
- :func:`eta_squared`, :func:`variance_share`: how much of the detrended variance the bucket (or cluster) explains,
  the ``bucket_variance_share`` of findings.json, drawn by the report through the same function;
- :func:`run_lengths`, :func:`steps_since_seen`: how long a composition lasted, and how long since a cluster was
  last seen (a static plan repeats long runs of one kind of batch; a spike follows a cluster unseen for long).
All of it is vectorised over steps (no Python loop per step).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def run_lengths(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For steps in order, the length of the run of consecutive steps sharing all ``keys`` that holds each step,
    and the step's 1-based position in that run.

    >>> run_lengths(np.array([0, 0, 1, 1, 1, 0]))
    (array([2, 2, 3, 3, 3, 1]), array([1, 2, 1, 2, 3, 1]))
    """
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    run_id = np.cumsum(change) - 1
    starts = np.flatnonzero(change)
    lengths = np.diff(np.append(starts, n))
    return lengths[run_id].astype(np.int64), (np.arange(n) - starts[run_id] + 1).astype(np.int64)


def steps_since_seen(pair_step: np.ndarray, pair_label: np.ndarray, step_values: np.ndarray) -> pd.array:
    """For (step, label) presence pairs, the steps since the label was last present in an earlier step.

    ``pair_step`` indexes ``step_values`` (the sorted step numbers); each (step, label) pair appears once. Returns a
    nullable Int64 array aligned with the pairs: ``<NA>`` where the label appears for the first time.
    """
    if len(pair_step) == 0:
        return pd.array([], dtype="Int64")
    order = np.lexsort((pair_step, pair_label))
    steps = step_values[pair_step[order]]
    labels = pair_label[order]
    gap = np.zeros(len(order), dtype=np.int64)
    gap[1:] = steps[1:] - steps[:-1]
    first = np.ones(len(order), dtype=bool)
    first[1:] = labels[1:] != labels[:-1]
    since = np.empty(len(order), dtype=np.int64)
    since[order] = gap
    missing = np.empty(len(order), dtype=bool)
    missing[order] = first
    return pd.arrays.IntegerArray(since, missing)


#: Scales a median absolute deviation to a standard deviation for normal noise (1 / Phi^-1(3/4)).
MAD_TO_SD = 1.4826


def robust_sd(values: np.ndarray, floor: float = 0.0) -> float:
    """The robust standard deviation of ``values``: :data:`MAD_TO_SD` times their median absolute deviation from
    their median (the SD for Gaussian noise, unmoved by a few spikes), at least ``floor``; NaN for an empty array or
    one holding NaN. Every rule's noise scale is this one formula; callers choose the floor their scale needs."""
    x = np.asarray(values, dtype=np.float64)
    med = float(np.median(x))
    return max(float(np.median(np.abs(x - med))) * MAD_TO_SD, floor)


def grouped_robust_sd(values: np.ndarray | pd.Series, groups: np.ndarray | pd.Series, floor: float = 0.0) -> pd.Series:
    """:func:`robust_sd` of each group's ``values`` at once, indexed by the sorted group labels (the index takes the
    name of ``groups`` when it is a Series).

    The same formula and the same edges, so that a per-group scale and a whole-run scale never disagree: each group's
    MAD about its own median times :data:`MAD_TO_SD`, at least ``floor``; NaN for a group holding a NaN (whatever the
    floor, as :func:`robust_sd` gives); a single-value group has MAD 0, so its scale is the floor. Vectorised over
    groups (one groupby, no Python loop per group): a run has one group per bucket or cluster and many steps."""
    x = np.asarray(values, dtype=np.float64)
    labels = np.asarray(groups)
    name = groups.name if isinstance(groups, pd.Series) else None
    frame = pd.DataFrame({"g": labels, "x": x})
    by = frame.groupby("g", sort=True)["x"]
    deviation = (frame["x"] - by.transform("median")).abs()
    mad = deviation.groupby(frame["g"], sort=True).median()
    scale = np.maximum(mad.to_numpy(np.float64) * MAD_TO_SD, floor)
    # pandas' medians skip NaN; robust_sd's do not: a group holding one is NaN here too
    scale[frame["x"].isna().groupby(frame["g"], sort=True).any().to_numpy(bool)] = np.nan
    return pd.Series(scale, index=pd.Index(mad.index.to_numpy(), name=name), dtype=np.float64)


def rolling_median(values: np.ndarray, window: int, center: bool = True, min_periods: int = 1) -> np.ndarray:
    """The rolling median the detect rules share as a run's trend (centred by default; NaN skipped; edges use what
    is there): pandas' ``rolling(...).median()``, compiled (:mod:`forensics.stats.fenwick_median`)."""
    from forensics.stats.fenwick_median import rolling_median as compiled_median  # numba only when a trend is made

    return compiled_median(values, int(window), center=center, min_periods=min_periods)


def detrend(values: np.ndarray, window: int = 101) -> np.ndarray:
    """``values`` minus their centred rolling median over the finite values (NaN where a value is not finite)."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    out = np.full(len(values), np.nan)
    if finite.any():
        v = values[finite]
        med = rolling_median(v, window)
        out[finite] = v - med
    return out


def _inliers(residual: np.ndarray, groups: np.ndarray, outlier_mads: float) -> np.ndarray:
    """Mask of (finite, grouped) points within ``outlier_mads`` robust SDs of their group's median."""
    ok = np.isfinite(residual) & (groups >= 0)
    if not ok.any():
        return ok
    df = pd.DataFrame({"g": groups[ok], "r": residual[ok]})
    med = df.groupby("g")["r"].transform("median")
    dev = (df["r"] - med).abs()
    mad = df["g"].map(grouped_robust_sd(df["r"], df["g"]))
    keep = (dev <= outlier_mads * mad) | (mad == 0) & (dev == 0)
    out = np.zeros(len(residual), dtype=bool)
    out[np.flatnonzero(ok)[keep.to_numpy()]] = True
    return out


def eta_squared(residual: np.ndarray, groups: np.ndarray) -> float:
    """Between-group over total sum of squares of ``residual`` (points with ``groups < 0`` or NaN are ignored).

    NaN when fewer than two groups or no variance.
    """
    residual = np.asarray(residual, dtype=np.float64)
    groups = np.asarray(groups, dtype=np.int64)
    ok = np.isfinite(residual) & (groups >= 0)
    r, g = residual[ok], groups[ok]
    if len(r) < 3 or len(np.unique(g)) < 2:
        return float("nan")
    total = float(((r - r.mean()) ** 2).sum())
    if total <= 0:
        return float("nan")
    codes, inv = np.unique(g, return_inverse=True)
    n = np.bincount(inv)
    means = np.bincount(inv, weights=r) / n
    between = float((n * (means - r.mean()) ** 2).sum())
    return min(1.0, between / total)


def variance_share(values: np.ndarray, groups: np.ndarray, window: int = 101, outlier_mads: float = 8.0) -> float:
    """The share (0-1) of the detrended variance of ``values`` explained by ``groups`` (module docstring)."""
    values = np.asarray(values, dtype=np.float64)
    groups = np.asarray(groups, dtype=np.int64)
    if len(values) != len(groups):
        raise ValueError(f"values and groups differ in length: {len(values)} != {len(groups)}")
    return detrended_variance_share(detrend(values, window), groups, outlier_mads)


def detrended_variance_share(residual: np.ndarray, groups: np.ndarray, outlier_mads: float = 8.0) -> float:
    """:func:`variance_share` of values already detrended (one trend for several groupings of the same values)."""
    keep = _inliers(residual, groups, outlier_mads)
    return eta_squared(np.where(keep, residual, np.nan), groups)


# --- tail probabilities ----------------------------------------------------------------------------------------------
# From scipy.special, not scipy.stats: importing scipy.stats costs ~0.45 s (its distributions are built at import),
# more than all the tests here together, and a cached case audit pays nothing else of scipy's.
def binom_sf(k: np.ndarray, n: int, p: np.ndarray) -> np.ndarray:
    """P(X >= k) for X ~ Binomial(n, p), elementwise (``scipy.stats.binom.sf(k - 1, n, p)``)."""
    from scipy.special import betainc

    k = np.asarray(k, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    inside = (k >= 1) & (k <= n)
    safe_k = np.where(inside, k, 1.0)
    out = betainc(safe_k, n - safe_k + 1.0, p) if n > 0 else np.zeros(np.broadcast(k, p).shape)
    return np.where(k <= 0, 1.0, np.where(k > n, 0.0, out))


def hypergeom_sf(k: np.ndarray, total: int, successes: np.ndarray, draws: int) -> np.ndarray:
    """P(X >= k) for X the successes among ``draws`` taken without replacement from ``total`` items of which
    ``successes`` are successes, elementwise over ``k`` and ``successes`` (``scipy.stats.hypergeom.sf(k - 1, total,
    successes, draws)``): the pmf summed over the upper tail in log space, one term at a time (draws are few: the
    spikes of a run), so memory stays one array of the inputs' size."""
    from scipy.special import gammaln

    k = np.atleast_1d(np.asarray(k, dtype=np.float64))
    s = np.atleast_1d(np.asarray(successes, dtype=np.float64))
    k, s = np.broadcast_arrays(k, s)
    out = np.zeros(k.shape)
    base = gammaln(total + 1.0) - gammaln(draws + 1.0) - gammaln(total - draws + 1.0)
    log_s = gammaln(s + 1.0)
    log_rest = gammaln(total - s + 1.0)
    with np.errstate(invalid="ignore"):
        lo = max(0, int(np.ceil(k.min()))) if k.size else 0
        hi = min(int(draws), int(s.max())) if s.size else -1
        for j in range(lo, hi + 1):
            ok = (j <= s) & (draws - j <= total - s) & (j >= k)
            if not ok.any():
                continue
            logp = (
                log_s
                - gammaln(j + 1.0)
                - gammaln(s - j + 1.0)
                + log_rest
                - gammaln(draws - j + 1.0)
                - gammaln(total - s - draws + j + 1.0)
                - base
            )
            out += np.where(ok, np.exp(np.where(ok, logp, -np.inf)), 0.0)
    return np.minimum(1.0, out)


def t_sf(x: float, dof: float) -> float:
    """P(T > x) for Student's t with ``dof`` degrees of freedom (``scipy.stats.t.sf``)."""
    from scipy.special import stdtr

    return float(stdtr(dof, -x))


def t_ppf(q: float, dof: float) -> float:
    """The ``q`` quantile of Student's t with ``dof`` degrees of freedom (``scipy.stats.t.ppf``)."""
    from scipy.special import stdtrit

    return float(stdtrit(dof, q))


class DisjointSets:
    """Union-find over ``0..n-1``: the groups that pairwise links form (events into causes, spikes across runs)."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)
