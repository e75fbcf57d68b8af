"""One row of tags per optimizer step: tokens, padding, length bucket, content cluster and their sequence.

Definitions the rest of the tool relies on (DESIGN.md Conventions):

- lengths are capped at ``max_len`` first (what the trainer sees);
- a batch (one micro-batch on one rank, :func:`~forensics.schema.batches.batch_keys`) is padded to its longest
  sample (:mod:`forensics.plan.padding`): its padded tokens are ``batch size x longest``; a step's ``padded_tokens``
  sum over its batches, and ``padding_ratio`` = (padded - real) / padded, 0-1;
- a step's composition counts *samples*: ``bucket`` / ``cluster`` is the one most of its samples fall in (ties: the
  lowest id), ``*_share`` is that fraction, ``*_entropy`` the Shannon entropy of the whole mix in bits, and
  ``bucket_share_<k>`` the share of every bucket;
- ``position_in_epoch`` = step - the epoch's first step; ``run_length`` / ``run_position``: the run of consecutive
  steps with the same dominant bucket *and* cluster that holds the step, and the step's 1-based place in it;
  ``steps_since_cluster_seen`` / ``steps_since_bucket_seen``: steps since any sample of the step's dominant
  cluster (bucket) was last in a step, ``<NA>`` the first time.

Everything is vectorised with numpy (bincount, one sort of (step, label) codes): no Python loop per step or row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_index, bucket_range
from forensics.plan.builders import capped_lengths
from forensics.plan.padding import batch_shapes
from forensics.schema import CLUSTER, EPOCH, MAX_LEN, SAMPLE_ID, STEP, batch_keys
from forensics.stats import run_lengths, steps_since_seen
from forensics.tagging.clusters import CLUSTER_NAME, NO_CLUSTER

#: The tag columns every tags table has, in order (``bucket_share_<k>`` follow, one per bucket).
TAG_COLUMNS = (
    STEP, EPOCH, "position_in_epoch", "n_batches", "n_samples", "real_tokens", "padded_tokens", "padding_ratio",
    "bucket", "bucket_range", "bucket_share", "bucket_entropy", CLUSTER, CLUSTER_NAME, "cluster_share",
    "cluster_entropy", "run_length", "run_position", "steps_since_cluster_seen", "steps_since_bucket_seen",
)


@dataclass
class _Pairs:
    """Distinct (step, label) pairs of a plan with their sample counts, sorted by step then label."""

    step: np.ndarray
    label: np.ndarray
    count: np.ndarray

    @classmethod
    def count_pairs(cls, step_idx: np.ndarray, code: np.ndarray, n_steps: int, n_codes: int) -> _Pairs:
        n_codes = max(n_codes, 1)
        key = step_idx.astype(np.int64) * n_codes + code
        if n_steps * n_codes <= max(4 * len(key), 1 << 22):  # dense counting is cheaper than a sort
            counts = np.bincount(key, minlength=n_steps * n_codes)
            nz = np.flatnonzero(counts)
            return cls(nz // n_codes, nz % n_codes, counts[nz])
        uniq, counts = np.unique(key, return_counts=True)
        return cls(uniq // n_codes, uniq % n_codes, counts)

    def dominant(self) -> np.ndarray:
        """Index of each step's most frequent pair (ties: the lowest label); every step has at least one pair."""
        order = np.lexsort((self.label, -self.count, self.step))
        first = np.ones(len(order), dtype=bool)
        first[1:] = self.step[order][1:] != self.step[order][:-1]
        return order[first]

    def entropy_bits(self, n_samples: np.ndarray) -> np.ndarray:
        p = self.count / n_samples[self.step]
        return np.bincount(self.step, weights=-p * np.log2(p), minlength=len(n_samples)) + 0.0


def tag_steps(
    plan: pd.DataFrame,
    samples: pd.DataFrame,
    boundaries: Sequence[int],
    max_len: int = MAX_LEN,
    packed: bool = False,
) -> pd.DataFrame:
    """The tags table, one row per step of ``plan`` (which must have ``step``; see ``assign_steps``).

    ``packed``: the plan holds documents packed into fixed-length sequences without padding (nanoGPT, Megatron):
    each sample's ``n_tokens`` is its share of the step and nothing is padded (DESIGN.md Conventions).

    ``samples`` needs ``sample_id`` and ``n_tokens``; its ``cluster`` (and ``cluster_name``) columns are used when
    present, else every sample is cluster -1. Every plan sample must be in ``samples``.
    """
    if STEP not in plan.columns:
        raise ForensicsError("plan: needs a 'step' column to tag steps; map batches to steps first")
    boundaries = [int(b) for b in boundaries]
    n_buckets = len(boundaries) - 1
    # --- per sample -----------------------------------------------------------------------------------------------
    capped = capped_lengths(samples, max_len)
    sample_bucket = bucket_index(capped, boundaries)
    if CLUSTER in samples.columns:
        cluster_values, sample_cluster = np.unique(samples[CLUSTER].to_numpy(np.int64), return_inverse=True)
    else:
        cluster_values, sample_cluster = np.array([NO_CLUSTER], np.int64), np.zeros(len(samples), np.int64)
    names = _cluster_names(samples, cluster_values)
    # --- per plan row ---------------------------------------------------------------------------------------------
    pos = _sample_positions(samples[SAMPLE_ID].to_numpy(np.int64), plan[SAMPLE_ID].to_numpy(np.int64))
    lens = capped[pos]
    step_values, step_idx = _dense_steps(plan[STEP].to_numpy(np.int64))
    n_steps = len(step_values)
    n_samples = np.bincount(step_idx, minlength=n_steps)
    real = np.bincount(step_idx, weights=lens, minlength=n_steps).astype(np.int64)
    # --- per batch: padded to its longest sample --------------------------------------------------------------------
    bk = batch_keys(plan) if len(plan) else np.zeros(0, np.int64)
    shapes = batch_shapes(bk, lens)
    batch_step = np.zeros(len(shapes.size), dtype=np.int64)
    batch_step[bk] = step_idx
    padded = real.copy() if packed else \
        np.bincount(batch_step, weights=shapes.padded, minlength=n_steps).astype(np.int64)
    n_batches = np.bincount(batch_step, minlength=n_steps)
    del lens, bk, shapes, batch_step
    # --- composition ----------------------------------------------------------------------------------------------
    bpairs = _Pairs.count_pairs(step_idx, sample_bucket[pos], n_steps, n_buckets)
    cpairs = _Pairs.count_pairs(step_idx, sample_cluster[pos], n_steps, len(cluster_values))
    epoch = _epoch_per_step(plan, step_idx, n_steps)
    del pos, step_idx
    bdom, cdom = bpairs.dominant(), cpairs.dominant()
    bucket = bpairs.label[bdom]
    cluster_code = cpairs.label[cdom]
    cluster = cluster_values[cluster_code]
    run_len, run_pos = run_lengths(bucket, cluster)
    first_of_epoch = pd.Series(step_values).groupby(epoch).transform("min").to_numpy(np.int64)
    ranges = np.array([bucket_range(k, boundaries) for k in range(n_buckets)], dtype=object)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(padded > 0, (padded - real) / np.maximum(padded, 1), 0.0)
    tags = pd.DataFrame({
        STEP: step_values,
        EPOCH: epoch,
        "position_in_epoch": step_values - first_of_epoch,
        "n_batches": n_batches.astype(np.int64),
        "n_samples": n_samples.astype(np.int64),
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_ratio": ratio.astype(np.float64),
        "bucket": bucket.astype(np.int64),
        "bucket_range": pd.array(ranges[bucket], dtype="string"),
        "bucket_share": bpairs.count[bdom] / n_samples,
        "bucket_entropy": bpairs.entropy_bits(n_samples),
        CLUSTER: cluster.astype(np.int64),
        CLUSTER_NAME: pd.array(np.asarray(names, dtype=object)[cluster_code], dtype="string"),
        "cluster_share": cpairs.count[cdom] / n_samples,
        "cluster_entropy": cpairs.entropy_bits(n_samples),
        "run_length": run_len,
        "run_position": run_pos,
        "steps_since_cluster_seen": steps_since_seen(cpairs.step, cpairs.label, step_values)[cdom],
        "steps_since_bucket_seen": steps_since_seen(bpairs.step, bpairs.label, step_values)[bdom],
    })
    shares = np.zeros((n_steps, n_buckets))
    shares[bpairs.step, bpairs.label] = bpairs.count
    shares /= np.maximum(n_samples, 1)[:, None]
    for k in range(n_buckets):
        tags[f"bucket_share_{k}"] = shares[:, k]
    return tags


def _sample_positions(sample_ids: np.ndarray, plan_ids: np.ndarray) -> np.ndarray:
    """Row of each plan sample in the samples table; a sample missing from it is bad input."""
    n = len(sample_ids)
    if n and sample_ids[0] == 0 and sample_ids[-1] == n - 1 and np.array_equal(sample_ids, np.arange(n)):
        pos = plan_ids.copy()
        bad = (pos < 0) | (pos >= n)
        pos[bad] = -1
    else:
        pos = pd.Index(sample_ids).get_indexer(plan_ids)
    missing = pos < 0
    if missing.any():
        few = ", ".join(str(v) for v in np.unique(plan_ids[missing])[:5])
        raise ForensicsError(f"plan: {int(missing.sum())} rows name samples not in the samples table, e.g. {few}")
    return pos


def _dense_steps(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct steps and each row's index among them (O(n) for the usual compact step range)."""
    if len(steps) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(steps.min()), int(steps.max())
    if hi - lo <= 4 * len(steps) + (1 << 20):
        present = np.bincount(steps - lo, minlength=hi - lo + 1) > 0
        remap = np.cumsum(present) - 1
        return np.flatnonzero(present) + lo, remap[steps - lo]
    values, idx = np.unique(steps, return_inverse=True)
    return values, idx


def _epoch_per_step(plan: pd.DataFrame, step_idx: np.ndarray, n_steps: int) -> np.ndarray:
    """A step's epoch (the lowest epoch of its rows; 0 when the plan has no epoch)."""
    if EPOCH not in plan.columns:
        return np.zeros(n_steps, np.int64)
    epoch = np.full(n_steps, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(epoch, step_idx, plan[EPOCH].to_numpy(np.int64))
    return epoch


def _cluster_names(samples: pd.DataFrame, cluster_values: np.ndarray) -> list[str]:
    """The name of each cluster id: the samples' ``cluster_name`` when given, else ``cluster <id>``."""
    fallback = ["(no text)" if c == NO_CLUSTER else f"cluster {c}" for c in cluster_values]
    if CLUSTER not in samples.columns or CLUSTER_NAME not in samples.columns:
        return fallback
    given = (samples[[CLUSTER, CLUSTER_NAME]].drop_duplicates(CLUSTER).set_index(CLUSTER)[CLUSTER_NAME]
             .astype("string").fillna(""))
    return [str(given.get(c, "")) or fb for c, fb in zip(cluster_values.tolist(), fallback)]


def composition(plan: pd.DataFrame, samples: pd.DataFrame, by: str = CLUSTER) -> pd.DataFrame:
    """The long table of every step's mix: ``step``, ``by`` value, ``n_samples``, ``share`` (for stacked plots).

    ``by`` is a column of ``samples`` (``cluster``, ``bucket``, ``source``...); rows sorted by step then value.
    """
    if by not in samples.columns:
        raise ForensicsError(f"samples: no column '{by}' to compose steps by")
    values, code = np.unique(samples[by].to_numpy(), return_inverse=True)
    pos = _sample_positions(samples[SAMPLE_ID].to_numpy(np.int64), plan[SAMPLE_ID].to_numpy(np.int64))
    step_values, step_idx = _dense_steps(plan[STEP].to_numpy(np.int64))
    pairs = _Pairs.count_pairs(step_idx, code[pos], len(step_values), len(values))
    n = np.bincount(step_idx, minlength=len(step_values))
    return pd.DataFrame({STEP: step_values[pairs.step], by: values[pairs.label], "n_samples": pairs.count,
                         "share": pairs.count / n[pairs.step]})
