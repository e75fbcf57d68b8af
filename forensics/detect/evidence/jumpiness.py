"""Bucket-explained jumpiness: how much of the loss's step-to-step wobble the step's length bucket (or cluster)
explains.

A plan whose batches each come from one length bucket makes the loss jump between bucket levels (long sequences have
a lower per-token loss): the curve looks unstable while nothing is wrong. This module measures it:

1. **Detrend** with a centred rolling median over steps (``window``, default 101): the residual is the wobble
   around the run's slow course (warm-up, decay), computed over the finite values only.
2. **Drop outliers within their group** (residual more than ``outlier_mads`` robust SDs from its group's median):
   a spike should not decide how much the buckets explain.
3. **Eta squared** of the residual by group: between-group sum of squares over total sum of squares, 0-1. This is
   ``bucket_variance_share`` (and ``cluster_variance_share`` with a ``cluster`` column): the share of the detrended
   variance that the step's bucket explains. With random labels it is about ``(K - 1) / n``, i.e. near 0.
4. **Per-group offsets**: the median residual of each group, the robust per-bucket baseline "trend + offset".

Judging each spike against its own bucket's baseline happens online in
:class:`~forensics.detect.spikes.SpikeDetector` (causal per-bucket offsets from the accepted history); steps high only
for their bucket are its ``expected_for_bucket`` findings. This module gives the run-level picture.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forensics.detect.findings import INFO, Finding
from forensics.detect.metric_detector import MetricDetector
from forensics.detect.tags import BUCKET, StepLookup
from forensics.errors import ForensicsError
from forensics.schema import CLUSTER, STEP, find_loss_key
from forensics.stats import detrend, grouped_robust_sd, variance_share


def group_offsets(values: np.ndarray, groups: np.ndarray, window: int = 101) -> pd.DataFrame:
    """Per group: ``n_steps``, ``offset`` (median detrended residual: the group's baseline is trend + offset),
    ``spread`` (robust SD of its residual) and ``median_value``."""
    values = np.asarray(values, dtype=np.float64)
    groups = np.asarray(groups, dtype=np.int64)
    r = detrend(values, window)
    ok = np.isfinite(r) & (groups >= 0)
    df = pd.DataFrame({"group": groups[ok], "r": r[ok], "v": values[ok]})
    if df.empty:
        return pd.DataFrame(
            {
                "group": pd.Series([], dtype=np.int64),
                "n_steps": pd.Series([], dtype=np.int64),
                "offset": pd.Series([], dtype=float),
                "spread": pd.Series([], dtype=float),
                "median_value": pd.Series([], dtype=float),
            }
        )
    g = df.groupby("group", sort=True)
    out = pd.DataFrame(
        {
            "n_steps": g.size(),
            "offset": g["r"].median(),
            "spread": grouped_robust_sd(df["r"], df["group"]),
            "median_value": g["v"].median(),
        }
    ).reset_index()
    out["n_steps"] = out["n_steps"].astype(np.int64)
    return out


def bucket_variance_share(
    metrics: pd.DataFrame, tags: pd.DataFrame, metric: str | None = None, group: str = BUCKET, window: int = 101
) -> float:
    """``bucket_variance_share`` of a run: the share of the detrended ``metric`` (default: the loss) variance
    explained by the tags column ``group`` of each step (0-1; NaN without two groups)."""
    metric = metric or find_loss_key(metrics.columns)
    if metric not in metrics.columns:
        raise ForensicsError(f"metrics: missing column '{metric}'")
    steps = metrics[STEP].to_numpy(dtype=np.int64)
    values = metrics[metric].to_numpy(dtype=np.float64, na_value=np.nan)
    return variance_share(values, StepLookup(tags).groups(steps, group), window)


class JumpinessDetector(MetricDetector):
    """The run-level jumpiness summary: one ``jumpiness`` finding with ``bucket_variance_share`` (and
    ``cluster_variance_share``) and the per-bucket offsets.

    Parameters
    ----------
    metric:
        Column to measure; ``None`` takes the loss key.
    window:
        Steps in the centred rolling median that detrends (default 101: long against bucket alternation, short
        against the loss's slow course).
    threshold:
        ``bucket_variance_share`` from which the finding calls the jumpiness bucket-driven (default 0.2).
    group, also_by:
        The tags column measured first (default ``bucket``) and further ones (default ``("cluster",)``; each
        present column adds ``<name>_variance_share``).
    outlier_mads:
        Residuals further than this many robust SDs from their group's median are left out (default 8).

    ``update`` only collects rows (returns nothing); the summary covers every row so far and comes from ``finish``.
    """

    def __init__(
        self,
        metric: str | None = None,
        window: int = 101,
        threshold: float = 0.2,
        group: str = BUCKET,
        also_by: tuple[str, ...] = (CLUSTER,),
        outlier_mads: float = 8.0,
    ):
        self.metric = metric
        self.window = window
        self.threshold = threshold
        self.group = group
        self.also_by = also_by
        self.outlier_mads = outlier_mads

    def reset(self) -> None:
        self.steps_: list[np.ndarray] = []
        self.values_: list[np.ndarray] = []
        self.tags_: pd.DataFrame | None = None
        self.metric_: str | None = self.metric
        self.last_step_: int | None = None

    def update(self, rows: pd.DataFrame, tags: pd.DataFrame | None = None) -> list[Finding]:
        if not hasattr(self, "steps_"):
            self.reset()
        if self.metric_ is None:
            self.metric_ = find_loss_key(rows.columns)
        if self.metric_ not in rows.columns:
            raise ForensicsError(f"metrics: missing column '{self.metric_}'")
        steps = rows[STEP].to_numpy(dtype=np.int64)
        values = rows[self.metric_].to_numpy(dtype=np.float64, na_value=np.nan)
        if self.last_step_ is not None:
            keep = steps > self.last_step_
            steps, values = steps[keep], values[keep]
        if len(steps):
            self.steps_.append(steps)
            self.values_.append(values)
            self.last_step_ = int(steps.max())
        if tags is not None:
            self.tags_ = tags
        return []

    def finish(self) -> list[Finding]:
        if not getattr(self, "steps_", None) or self.tags_ is None:
            return []
        steps = np.concatenate(self.steps_)
        values = np.concatenate(self.values_)
        lookup = StepLookup(self.tags_)
        if self.group not in self.tags_.columns:
            return []
        groups = lookup.groups(steps, self.group)
        shares = {f"{self.group}_variance_share": variance_share(values, groups, self.window, self.outlier_mads)}
        for col in self.also_by:
            if col in self.tags_.columns:
                shares[f"{col}_variance_share"] = variance_share(
                    values, lookup.groups(steps, col), self.window, self.outlier_mads
                )
        offsets = group_offsets(values, groups, self.window)
        share = shares[f"{self.group}_variance_share"]
        return [self._finding(steps, share, shares, offsets)]

    def _finding(self, steps: np.ndarray, share: float, shares: dict, offsets: pd.DataFrame) -> Finding:
        metric, g = self.metric_, self.group
        driven = bool(np.isfinite(share) and share >= self.threshold)
        words = [f"{_pct(v)} by {k.removesuffix('_variance_share')}" for k, v in shares.items()]
        evidence = [
            f"Of the {metric} variance around its rolling median ({self.window} steps), "
            f"{' and '.join(words)} (eta squared over {len(steps)} steps)."
        ]
        if len(offsets):
            top = offsets.reindex(offsets["offset"].abs().sort_values(ascending=False).index).head(3)
            evidence.append(
                "Per-"
                + g
                + " offsets from the trend: "
                + ", ".join(f"{g} {int(r.group)} {r.offset:+.3g} ({int(r.n_steps)} steps)" for r in top.itertuples())
                + "."
            )
        evidence.append(
            f"The jumpiness is {'largely' if driven else 'not mainly'} explained by the {g} (threshold "
            f"{_pct(self.threshold)}): "
            + (
                "steps high only for their " + g + " are expected, not spikes."
                if driven
                else "look elsewhere for its cause."
            )
        )
        return Finding(
            kind="jumpiness",
            step=int(steps.min()),
            end_step=int(steps.max()),
            metric=metric,
            value=share,
            severity=INFO,
            evidence=evidence,
            next_step=(
                f"Nothing to fix if the {g}s are by design; mixing {g}s inside a batch removes the "
                f"jumpiness at a padding cost."
                if driven
                else None
            ),
            details={
                **shares,
                "bucket_driven": driven,
                "threshold": self.threshold,
                "group": g,
                "offsets": offsets.to_dict(orient="records"),
                "window": self.window,
            },
        )


def _pct(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:.0f}%"
