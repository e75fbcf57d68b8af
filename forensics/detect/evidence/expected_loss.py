"""The expected value of a step from its composition: what the step's batch predicts its loss (or grad norm) to be.

A step's loss moves with what is in its batch: its length bucket, its content clusters (a type of text with a
higher per-token loss), its tokens, its batch size, its padding. Judging a step against its bucket's baseline alone
calls a batch of a harder content type a spike whenever a bucket boundary cuts through that type. The expectation
here is the run's trend times what the step's tags predict (docs/concepts.md, "expected loss"):

    log(value_t) = log(trend_t) + x_t . beta + noise

- **features** (:func:`composition_features`): per tag, columns of the tags table: ``bucket`` (``bucket_share_<k>``),
  ``cluster`` (``cluster_share_<c>``: every cluster's share; the dominant one's with tags written before those
  columns), ``tokens`` (log mean real tokens per sample),
  ``batch_size`` (log samples) and ``padding`` (``padding_ratio``);
- **support**: a bucket or cluster predicts only when it holds at least ``min_share`` of the fitted steps' samples:
  a content type is a large share of a run, a dozen corrupted samples are not, so a corrupted bucket or cluster
  cannot absorb its own spikes into its coefficient; the shares the fit keeps are rescaled to sum to 1, so a step
  is expected from the part of its batch the fit knows (texts unlike every cluster, which the clustering puts in a
  cluster of their own, are no content type's);
- **robust**: Huber M-estimation by iteratively reweighted ridge least squares, and rows past ``trim`` robust SDs of
  the fit get no weight, so spikes do not bend the coefficients;
- **causal**: the rows of a block (``block`` rows, or a 16th of the history when more, counted from the run's first
  finite row) are predicted by a fit on the ``fit_rows`` rows before the block. A step never predicts itself (the
  fit is out of fold by construction) and the live loop, fed any chunking of the same rows, gets the same
  expectation as the audit;
- the **trend** the fit is relative to is the median of the ``trend_window`` values before each row; the spike
  detector's own rolling baseline, run on ``value / factor``, keeps the run's level, so only the factor matters.

The detector then judges ``value / factor`` against its bucket-free baseline (the residual against the
expectation), and a spike's ``baseline`` is the detector's baseline times the factor: the expectation. Without tags
nothing here applies (the bucket-free baseline of a run without a plan).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from forensics.schema import CLUSTER, STEP
from forensics.stats import robust_sd

#: Tag names of the feature groups (``variance_share_by_tag`` keys), in the order columns are built.
TAGS = ("bucket", "cluster", "tokens", "batch_size", "padding")


def robust_scale(x: np.ndarray) -> float:
    """The robust SD of the finite values of ``x`` (:func:`forensics.stats.robust_sd`; 0 when none)."""
    x = x[np.isfinite(x)]
    return robust_sd(x) if len(x) else 0.0


def _is_share(column: object, prefix: str) -> bool:
    name = str(column)
    return name.startswith(prefix) and name[len(prefix) :].lstrip("-").isdigit()


def composition_features(tags: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``(features indexed by step, tag of each column)``: the columns of :data:`TAGS` that the tags table has."""
    cols: dict[str, np.ndarray] = {}
    owner: list[str] = []
    steps = tags[STEP].to_numpy(np.int64)
    shares = sorted(
        (c for c in tags.columns if _is_share(c, "bucket_share_")), key=lambda c: int(str(c).rsplit("_", 1)[1])
    )
    for c in shares:
        cols[str(c)] = tags[c].to_numpy(np.float64, na_value=np.nan)
        owner.append("bucket")
    mix = sorted(
        (c for c in tags.columns if _is_share(c, "cluster_share_")), key=lambda c: int(str(c).rsplit("_", 1)[1])
    )
    if mix:  # every cluster's share of the step
        for c in mix:
            cols[str(c)] = tags[c].to_numpy(np.float64, na_value=np.nan)
            owner.append("cluster")
    elif CLUSTER in tags.columns and "cluster_share" in tags.columns:  # tags written before: the dominant one's
        cl = pd.to_numeric(tags[CLUSTER], errors="coerce").to_numpy(np.float64)
        share = tags["cluster_share"].to_numpy(np.float64, na_value=np.nan)
        for c in np.unique(cl[np.isfinite(cl) & (cl >= 0)]).astype(np.int64):
            cols[f"cluster_share_{c}"] = np.where(cl == c, share, 0.0)
            owner.append("cluster")
    n = tags["n_samples"].to_numpy(np.float64, na_value=np.nan) if "n_samples" in tags.columns else None
    if n is not None and "real_tokens" in tags.columns:
        with np.errstate(divide="ignore", invalid="ignore"):
            cols["log_tokens_per_sample"] = np.log(tags["real_tokens"].to_numpy(np.float64, na_value=np.nan) / n)
        owner.append("tokens")
    if n is not None:
        with np.errstate(divide="ignore"):
            cols["log_samples"] = np.log(n)
        owner.append("batch_size")
    if "padding_ratio" in tags.columns:
        cols["padding_ratio"] = tags["padding_ratio"].to_numpy(np.float64, na_value=np.nan)
        owner.append("padding")
    return pd.DataFrame(cols, index=pd.Index(steps, name=STEP)), owner


@dataclass
class CompositionFit:
    """One fit: the columns kept, their centring and scaling, the coefficients and the residual scale."""

    columns: np.ndarray  # indices into the feature matrix
    centre: np.ndarray
    scale: np.ndarray
    beta: np.ndarray
    noise: float
    owner: list[str] = field(default_factory=list)
    #: The range of the log factors the fit gave its own inlier rows: a composition unlike any it saw is not
    #: extrapolated past what the run has shown.
    low: float = -np.inf
    high: float = np.inf

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The log factor of each row of ``x`` (0 where a feature is missing), within ``[low, high]``."""
        z = (_known_shares(x[:, self.columns], self.owner) - self.centre) / self.scale
        out = np.clip(z @ self.beta, self.low, self.high)
        return np.where(np.isfinite(out), out, 0.0)


def _known_shares(x: np.ndarray, owner: list[str]) -> np.ndarray:
    """``x`` with each group's kept shares (bucket, cluster) rescaled to sum to 1 per row: a step is expected from
    the part of its batch the fit knows. A dozen samples of a rare bucket or of no cluster (their share column was
    dropped for want of support) then leave the step expected as its other samples; counted as "less of everything
    known" they would pull the expectation towards the run's average composition. A row with no known share is NaN
    (no expectation: the trend alone)."""
    out = np.array(x, dtype=np.float64, copy=True)
    for tag in ("bucket", "cluster"):
        idx = [j for j, t in enumerate(owner) if t == tag]
        if idx:
            total = out[:, idx].sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[:, idx] = np.where(total[:, None] > 0, out[:, idx] / total[:, None], np.nan)
    return out


def fit_composition(
    x: np.ndarray,
    y: np.ndarray,
    owner: list[str],
    min_share: float = 0.05,
    ridge: float = 16.0,
    huber: float = 1.345,
    trim: float = 4.0,
    iterations: int = 8,
) -> CompositionFit | None:
    """A robust fit of ``y`` (log value over trend) on the features ``x`` (rows with a finite ``y`` and features);
    None when too few rows or no column qualifies."""
    ok = np.isfinite(y) & np.isfinite(x).all(axis=1)
    x, y = x[ok], y[ok]
    if len(y) < 16:
        return None
    keep = []
    for j, tag in enumerate(owner):
        col = x[:, j]
        if tag in ("bucket", "cluster"):
            if col.mean() >= min_share:  # support: a rare group (a dozen corrupted samples) predicts nothing
                keep.append(j)
        elif robust_scale(col) > 0 or col.std() > 0:
            keep.append(j)
    if not keep:
        return None
    cols = np.asarray(keep)
    xs = _known_shares(x[:, cols], [owner[j] for j in cols])
    known = np.isfinite(xs).all(axis=1)
    xs, y = xs[known], y[known]
    if len(y) < 16:
        return None
    centre = xs.mean(axis=0)
    scale = xs.std(axis=0)
    scale[scale <= 0] = 1.0
    z = (xs - centre) / scale
    z1 = np.column_stack([np.ones(len(y)), z])
    pen = np.full(z1.shape[1], float(ridge))
    pen[0] = 0.0  # the intercept is not shrunk
    w = np.ones(len(y))
    beta = np.zeros(z1.shape[1])
    noise = robust_scale(y - np.median(y)) or 1e-12
    for _ in range(iterations):
        a = z1.T @ (z1 * w[:, None]) + np.diag(pen)
        try:
            beta = np.linalg.solve(a, z1.T @ (w * y))
        except np.linalg.LinAlgError:
            beta = np.linalg.lstsq(a, z1.T @ (w * y), rcond=None)[0]
        r = y - z1 @ beta
        noise = robust_scale(r) or noise
        u = np.abs(r) / noise
        w = np.where(u <= huber, 1.0, huber / np.maximum(u, 1e-12))
        w[u > trim] = 0.0  # a spike row does not bend the fit at all
    fitted = z[w > 0] @ beta[1:]
    low, high = (float(fitted.min()), float(fitted.max())) if len(fitted) else (0.0, 0.0)
    return CompositionFit(cols, centre, scale, beta[1:], float(noise), [owner[j] for j in cols], low, high)


class CompositionExpectation:
    """The causal expectation factor of each row of one metric (module docstring); the same for any chunking.

    Parameters
    ----------
    block:
        Rows predicted by one fit (default 32), or a 16th of the rows before it when that is more: refits stay
        frequent early and cost little on long runs (about 90 fits for 50,000 rows).
    min_rows:
        Rows of history before any fit (default 48); earlier rows get factor 1 (the bucket-free baseline: the
        warm-up of a run with tags is judged as one without them).
    fit_rows:
        The most recent rows each fit uses (default 2048: bounds the cost on long runs, follows a changing run).
    trend_window:
        Values before a row whose median is its trend in the fit's target (default 32).
    min_share:
        A bucket's or cluster's mean share of the fitted steps before it predicts anything (default 0.05).
    """

    def __init__(
        self,
        tags: pd.DataFrame,
        block: int = 32,
        min_rows: int = 48,
        fit_rows: int = 2048,
        trend_window: int = 32,
        min_share: float = 0.05,
    ) -> None:
        self.block = block
        self.min_rows = min_rows
        self.fit_rows = fit_rows
        self.trend_window = trend_window
        self.min_share = min_share
        self.set_tags(tags)
        self.logs_ = np.empty(0)  # log value of every finite row seen
        self.y_ = np.empty(0)  # its log over the median of the trend_window values before it
        self.x_ = np.empty((0, len(self.owner_)))  # its features
        self.fit_: CompositionFit | None = None
        self.fit_block_ = -1
        self.bounds_ = [min_rows]  # the first row of each block (a fixed sequence: the same for any chunking)

    def set_tags(self, tags: pd.DataFrame) -> None:
        """The run's current tags (the live loop's grow): features of rows not seen yet come from them; the columns
        stay those of the first tags (a cluster that appears later is not a column: every fit has the same ones)."""
        features, owner = composition_features(tags)
        if not hasattr(self, "columns_"):
            self.columns_, self.owner_ = list(features.columns), owner
        self.features_ = features.reindex(columns=self.columns_, fill_value=0.0)

    def _features(self, steps: np.ndarray) -> np.ndarray:
        return self.features_.reindex(steps).to_numpy(np.float64)

    def factors(self, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The expectation factor (over the trend) of each new row, in order; non-finite rows get 1 and are not
        part of any fit."""
        out = np.ones(len(steps))
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(np.asarray(values, np.float64))
        ok = np.flatnonzero(np.isfinite(logs))
        if not len(ok):
            return out
        x = self._features(np.asarray(steps)[ok])
        w = self.trend_window
        n0 = len(self.logs_)
        prev = self.logs_[-w:]
        padded = np.concatenate([np.full(w, np.nan), prev, logs[ok]])
        windows = np.lib.stride_tricks.sliding_window_view(padded, w)[len(prev) : len(prev) + len(ok)]
        enough = np.isfinite(windows).sum(axis=1) >= 8
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the all-NaN windows of the first rows
            trend = np.nanmedian(windows, axis=1)
        self.logs_ = np.concatenate([self.logs_, logs[ok]])
        self.y_ = np.concatenate([self.y_, np.where(enough, logs[ok] - trend, np.nan)])
        self.x_ = np.concatenate([self.x_, x]) if len(self.x_) else x
        index = n0 + np.arange(len(ok))  # each row's place among the finite rows
        factor = np.ones(len(ok))
        judged = index >= self.min_rows
        if judged.any():
            while self.bounds_[-1] <= index[-1]:  # each block a 16th of the history, at least `block` rows
                self.bounds_.append(self.bounds_[-1] + max(self.block, self.bounds_[-1] // 16))
            bounds = np.asarray(self.bounds_)
            start = bounds[np.searchsorted(bounds, index, side="right") - 1]
            for b in np.unique(start[judged]):
                if b != self.fit_block_:
                    self.fit_ = self._fit(int(b))  # rows before the block only: causal
                    self.fit_block_ = int(b)
                sel = judged & (start == b)
                if self.fit_ is not None:
                    factor[sel] = np.exp(self.fit_.predict(x[sel]))
        out[ok] = factor
        return out

    def _fit(self, upto: int) -> CompositionFit | None:
        lo = max(0, upto - self.fit_rows)
        return fit_composition(self.x_[lo:upto], self.y_[lo:upto], self.owner_, self.min_share)


def variance_shares(
    values: np.ndarray, steps: np.ndarray, tags: pd.DataFrame, window: int = 101
) -> tuple[float, dict[str, float]]:
    """``(composition_variance_share, {tag: share})`` of a whole run: the share of the detrended log value variance
    that a robust fit on all its tags (and on each tag alone) explains, 0-1 (NaN without a fit)."""
    values = np.asarray(values, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(values)
    s = pd.Series(logs)
    trend = s.rolling(window, center=True, min_periods=max(3, window // 4)).median().to_numpy()
    y = logs - trend
    feats, owner = composition_features(tags)
    x = feats.reindex(steps).to_numpy(np.float64)
    ok = np.isfinite(y) & np.isfinite(x).all(axis=1)
    nan = float("nan")
    if ok.sum() < 16:
        return nan, {}

    def share(cols: list[int]) -> float:
        if not cols:
            return nan
        fit = fit_composition(x[ok][:, cols], y[ok], [owner[j] for j in cols])
        if fit is None:
            return nan
        pred = fit.predict(x[ok][:, cols])
        r = y[ok] - pred
        # the variance of the inliers (rows within 4 robust SDs), so spikes do not decide the share
        inl = np.abs(r - np.median(r)) <= 4.0 * max(robust_scale(r), 1e-12)
        total = float(np.var(y[ok][inl]))
        return float(np.clip(1.0 - np.var(r[inl]) / total, 0.0, 1.0)) if total > 0 else nan

    by_tag = {}
    for tag in TAGS:
        cols = [j for j, t in enumerate(owner) if t == tag]
        if cols:
            v = share(cols)
            if np.isfinite(v):
                by_tag[tag] = v
    return share(list(range(len(owner)))), by_tag
