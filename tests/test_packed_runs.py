"""Packed runs (nanoGPT, Megatron): documents packed into fixed-length sequences without padding. The plan names the
documents of each step; with ``packed = true`` nothing is padded and the tags speak of sources and clusters."""

from __future__ import annotations

import numpy as np
import pandas as pd

from forensics.tagging import tag_case


def _packed_run(n_steps: int = 60, seq_len: int = 1024, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    rows, samples, sid = [], [], 0
    for step in range(n_steps):
        source = "code" if step % 3 == 0 else "web"
        left = seq_len
        while left > 0:  # cut documents to fill the sequence exactly: each one's share of the step
            n = int(min(left, rng.integers(50, 400)))
            samples.append({"sample_id": sid, "n_tokens": n, "source": source})
            rows.append({"step": step, "sample_id": sid})
            sid, left = sid + 1, left - n
    return pd.DataFrame(rows), pd.DataFrame(samples)


def test_packed_plan_is_tagged_without_padding_by_source():
    plan, samples = _packed_run()
    tags = tag_case(plan, samples, packed=True, cluster_by="source").tags
    assert (tags["padding_ratio"] == 0).all() and (tags["real_tokens"] == 1024).all()
    assert (tags["padded_tokens"] == tags["real_tokens"]).all()
    names = tags.set_index("step")["cluster_name"]
    assert set(names[names.index % 3 == 0]) == {"code"} and set(names[names.index % 3 != 0]) == {"web"}
    # the same plan read as padded batches would report padding that never was
    padded = tag_case(plan, samples, cluster_by="source").tags
    assert (padded["padding_ratio"] > 0).mean() > 0.9
