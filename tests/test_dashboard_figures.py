"""The run view's curves (the report's loss_figure): a long run downsampled keeps every length bucket's extremes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from forensics.report import loss_figure


def test_long_run_keeps_each_buckets_min_and_max() -> None:
    rng = np.random.default_rng(0)
    n = 200_000
    steps = np.arange(n, dtype=np.int64)
    bucket = rng.integers(0, 6, n)
    loss = 1.0 + 0.3 * bucket + 0.05 * rng.standard_normal(n)
    metrics = pd.DataFrame({"step": steps, "train/loss": loss})
    tags = pd.DataFrame({"step": steps, "bucket": bucket})
    fig = loss_figure(metrics, {"spikes": []}, tags, loss_key="train/loss")
    drawn = np.concatenate([np.asarray(t.x) for t in fig.data if t.name and t.name.startswith("bucket")])
    assert len(drawn) <= 12_000  # a few thousand points per bucket, not 200,000
    for k in range(6):
        sel = np.flatnonzero(bucket == k)
        assert sel[np.argmin(loss[sel])] in drawn and sel[np.argmax(loss[sel])] in drawn, k
