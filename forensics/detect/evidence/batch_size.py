"""A spike on an unusually small batch is judged for its size and says so (docs/concepts.md, "batch size").

An epoch's last, partial batch (2 samples where the others hold 8) averages its loss and its gradient over few
samples: both are noisier, and the gradient norm is larger by about ``sqrt(median / n)`` (the noise part of the
mean gradient's norm shrinks with the square root of the samples). A spike on such a batch is therefore judged
against batches of its size: its jump and its score are divided by that factor; when they then fall below the
spike thresholds, its size explains it (``support["explained"] = "batch_size"``: info). Either way the finding says
how small the batch was and whether it was an epoch's last one (``details["batch_size"]``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from forensics.detect.causes.severity import support_of
from forensics.detect.findings import Finding
from forensics.detect.tags import StepLookup
from forensics.schema import EPOCH, STEP

#: A batch with fewer samples than this share of the run's median is unusually small.
SMALL_SHARE = 0.5
N_SAMPLES = "n_samples"


def judge_batch_size(findings: list[Finding], tags: pd.DataFrame | None) -> None:
    """Set ``details["batch_size"]`` (and the support line when its size explains it) on every spike of a small
    batch, in place."""
    if tags is None or N_SAMPLES not in tags.columns or not len(tags):
        return
    sizes = tags[N_SAMPLES].to_numpy(np.float64)
    median = float(np.nanmedian(sizes)) if np.isfinite(sizes).any() else 0.0
    if median <= 1:
        return
    lookup = StepLookup(tags)
    last_of_epoch = set()
    if EPOCH in tags.columns:
        last_of_epoch = set(tags.groupby(EPOCH)[STEP].max().astype(np.int64).tolist())
    for f in findings:
        if f.kind != "spike":
            continue
        peak = int(f.peak_step if f.peak_step is not None else f.step)
        row = lookup.rows(np.array([peak], np.int64))[0]
        if row < 0:
            continue
        n = float(sizes[row])
        if not np.isfinite(n) or n >= SMALL_SHARE * median:
            continue
        factor = math.sqrt(median / max(n, 1.0))
        th = f.details.get("thresholds") or {}
        ratio = f.details.get("ratio")
        ratio_adj = 1.0 + (float(ratio) - 1.0) / factor if isinstance(ratio, (int, float)) and ratio == ratio else None
        score_adj = float(f.score) / factor if f.score is not None else None
        explained = (ratio_adj is not None and ratio_adj < float(th.get("ratio", 1.5))) or (
            score_adj is not None and score_adj < float(th.get("z", 6.0))
        )
        epoch = f.tags.get(EPOCH)
        last = peak in last_of_epoch
        where = (
            f"the last batch of epoch {epoch}"
            if last and epoch is not None
            else ("an epoch's last batch" if last else "a small batch")
        )
        words = f"{int(n)} samples against a median of {median:g}: {where}"
        f.details["batch_size"] = {
            "n_samples": int(n),
            "median": median,
            "last_of_epoch": last,
            "factor": factor,
            "ratio_for_its_size": ratio_adj,
            "score_for_its_size": score_adj,
            "explained": explained,
            "words": words,
        }
        f.evidence.append(
            f"The batch held {words}; judged against batches of its size (jump and score divided by "
            f"{factor:.2f}) it is "
            + ("within the thresholds: its size explains it." if explained else "still beyond the thresholds.")
        )
        if explained:
            support_of(f)["explained"] = "batch_size"
