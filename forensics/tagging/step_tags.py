"""One row of tags per optimizer step: tokens, padding, length bucket, content cluster and their sequence.

Definitions the rest of the tool relies on (docs/concepts.md):

- lengths are capped at ``max_len`` first (what the trainer sees);
- a batch (one micro-batch on one rank, :func:`~forensics.schema.batches.batch_keys`) is padded to its longest
  sample (:mod:`forensics.plan.padding`): its padded tokens are ``batch size x longest``; a step's ``padded_tokens``
  sum over its batches, and ``padding_ratio`` = (padded - real) / padded, 0-1;
- a step's composition counts *samples*: ``bucket`` / ``cluster`` is the one most of its samples fall in (ties: the
  lowest id), ``*_share`` is that fraction, ``*_entropy`` the Shannon entropy of the whole mix in bits, and
  ``bucket_share_<k>`` / ``cluster_share_<c>`` the share of every bucket and cluster (no cluster columns when the
  samples have none);
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

from forensics.engine.base import Engine, StepCounts
from forensics.engine.pandas_engine import PandasEngine, count_pairs, dense_steps, sample_positions
from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_index, bucket_range
from forensics.plan.builders import capped_lengths
from forensics.schema import CLUSTER, EPOCH, MAX_LEN, SAMPLE_ID, STEP
from forensics.stats import run_lengths, steps_since_seen
from forensics.tagging.clusters import CLUSTER_NAME, NO_CLUSTER

#: The tag columns every tags table has, in order (``bucket_share_<k>`` follow, one per bucket, then
#: ``cluster_share_<c>``, one per cluster).
TAG_COLUMNS = (
    STEP,
    EPOCH,
    "position_in_epoch",
    "n_batches",
    "n_samples",
    "real_tokens",
    "padded_tokens",
    "padding_ratio",
    "bucket",
    "bucket_range",
    "bucket_share",
    "bucket_entropy",
    CLUSTER,
    CLUSTER_NAME,
    "cluster_share",
    "cluster_entropy",
    "run_length",
    "run_position",
    "steps_since_cluster_seen",
    "steps_since_bucket_seen",
)


@dataclass
class _Pairs:
    """Distinct (step, label) pairs of a plan with their sample counts, sorted by step then label."""

    step: np.ndarray
    label: np.ndarray
    count: np.ndarray

    def dominant(self) -> np.ndarray:
        """Index of each step's most frequent pair (ties: the lowest label); every step has at least one pair."""
        order = np.lexsort((self.label, -self.count, self.step))
        first = np.ones(len(order), dtype=bool)
        first[1:] = self.step[order][1:] != self.step[order][:-1]
        return order[first]

    def entropy_bits(self, n_samples: np.ndarray) -> np.ndarray:
        p = self.count / n_samples[self.step]
        return np.bincount(self.step, weights=-p * np.log2(p), minlength=len(n_samples)) + 0.0


def sample_codes(
    samples: pd.DataFrame,
    boundaries: Sequence[int],
    max_len: int = MAX_LEN,
) -> tuple[pd.DataFrame, np.ndarray, list[str]]:
    """The samples as the engines count them: ``sample_id``, ``length`` (capped at ``max_len``), ``bucket`` and
    ``cluster`` (a dense code into the returned cluster values, sorted; every sample -1 without clusters), with the
    cluster values and their names."""
    capped = capped_lengths(samples, max_len)
    sample_bucket = bucket_index(capped, [int(b) for b in boundaries])
    if CLUSTER in samples.columns:
        cluster_values, sample_cluster = np.unique(samples[CLUSTER].to_numpy(np.int64), return_inverse=True)
    else:
        cluster_values, sample_cluster = np.array([NO_CLUSTER], np.int64), np.zeros(len(samples), np.int64)
    codes = pd.DataFrame(
        {
            SAMPLE_ID: samples[SAMPLE_ID].to_numpy(np.int64),
            "length": np.asarray(capped),
            "bucket": np.asarray(sample_bucket, np.int64),
            CLUSTER: np.asarray(sample_cluster, np.int64).reshape(-1),
        }
    )
    return codes, cluster_values, _cluster_names(samples, cluster_values)


def tag_steps(
    plan: pd.DataFrame,
    samples: pd.DataFrame,
    boundaries: Sequence[int],
    max_len: int = MAX_LEN,
    packed: bool = False,
    engine: Engine | None = None,
) -> pd.DataFrame:
    """The tags table, one row per step of ``plan`` (which must have ``step``; see ``assign_steps``).

    ``packed``: the plan holds documents packed into fixed-length sequences without padding (nanoGPT, Megatron):
    each sample's ``n_tokens`` is its share of the step and nothing is padded (docs/concepts.md).

    ``samples`` needs ``sample_id`` and ``n_tokens``; its ``cluster`` (and ``cluster_name``) columns are used when
    present, else every sample is cluster -1. Every plan sample must be in ``samples``. ``engine``
    (:mod:`forensics.engine`; default pandas) counts; ``plan`` may then be a path the engine reads.
    """
    if isinstance(plan, pd.DataFrame) and STEP not in plan.columns:
        raise ForensicsError("plan: needs a 'step' column to tag steps; map batches to steps first")
    codes, cluster_values, names = sample_codes(samples, boundaries, max_len)
    counts = (engine or PandasEngine()).step_counts(plan, codes, packed=packed)
    return tags_from_counts(counts, cluster_values, names, boundaries)


def tags_from_counts(
    counts: StepCounts, cluster_values: np.ndarray, names: Sequence[str], boundaries: Sequence[int]
) -> pd.DataFrame:
    """The tags table from an engine's integer counts: every ratio, entropy and run is computed here, once, so
    that every engine gives the same floats."""
    boundaries = [int(b) for b in boundaries]
    n_buckets = len(boundaries) - 1
    step_values, epoch, n_samples = counts.step, counts.epoch, counts.n_samples
    real, padded, n_steps = counts.real_tokens, counts.padded_tokens, len(counts.step)
    bp, cp = counts.pairs["bucket"], counts.pairs[CLUSTER]
    bpairs, cpairs = _Pairs(bp.step, bp.label, bp.count), _Pairs(cp.step, cp.label, cp.count)
    bdom, cdom = bpairs.dominant(), cpairs.dominant()
    bucket = bpairs.label[bdom]
    cluster_code = cpairs.label[cdom]
    cluster = cluster_values[cluster_code]
    run_len, run_pos = run_lengths(bucket, cluster)
    first_of_epoch = pd.Series(step_values).groupby(epoch).transform("min").to_numpy(np.int64)
    ranges = np.array([bucket_range(k, boundaries) for k in range(n_buckets)], dtype=object)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(padded > 0, (padded - real) / np.maximum(padded, 1), 0.0)
    tags = pd.DataFrame(
        {
            STEP: step_values,
            EPOCH: epoch,
            "position_in_epoch": step_values - first_of_epoch,
            "n_batches": counts.n_batches.astype(np.int64),
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
        }
    )
    shares = np.zeros((n_steps, n_buckets))
    shares[bpairs.step, bpairs.label] = bpairs.count
    shares /= np.maximum(n_samples, 1)[:, None]
    for k in range(n_buckets):
        tags[f"bucket_share_{k}"] = shares[:, k]
    if not (len(cluster_values) == 1 and cluster_values[0] == NO_CLUSTER):
        mix = np.zeros((n_steps, len(cluster_values)))
        mix[cpairs.step, cpairs.label] = cpairs.count
        mix /= np.maximum(n_samples, 1)[:, None]
        for j, c in enumerate(cluster_values.tolist()):
            tags[f"cluster_share_{c}"] = mix[:, j]
    return tags


def _cluster_names(samples: pd.DataFrame, cluster_values: np.ndarray) -> list[str]:
    """The name of each cluster id: the samples' ``cluster_name`` when given, else ``cluster <id>``."""
    fallback = ["(no text)" if c == NO_CLUSTER else f"cluster {c}" for c in cluster_values]
    if CLUSTER not in samples.columns or CLUSTER_NAME not in samples.columns:
        return fallback
    given = (
        samples[[CLUSTER, CLUSTER_NAME]]
        .drop_duplicates(CLUSTER)
        .set_index(CLUSTER)[CLUSTER_NAME]
        .astype("string")
        .fillna("")
    )
    return [str(given.get(c, "")) or fb for c, fb in zip(cluster_values.tolist(), fallback)]


def composition(plan: pd.DataFrame, samples: pd.DataFrame, by: str = CLUSTER) -> pd.DataFrame:
    """The long table of every step's mix: ``step``, ``by`` value, ``n_samples``, ``share`` (for stacked plots).

    ``by`` is a column of ``samples`` (``cluster``, ``bucket``, ``source``...); rows sorted by step then value.
    """
    if by not in samples.columns:
        raise ForensicsError(f"samples: no column '{by}' to compose steps by")
    values, code = np.unique(samples[by].to_numpy(), return_inverse=True)
    pos = sample_positions(samples[SAMPLE_ID].to_numpy(np.int64), plan[SAMPLE_ID].to_numpy(np.int64))
    step_values, step_idx = dense_steps(plan[STEP].to_numpy(np.int64))
    pairs = _Pairs(*count_pairs(step_idx, code[pos], len(step_values), len(values)))
    n = np.bincount(step_idx, minlength=len(step_values))
    return pd.DataFrame(
        {
            STEP: step_values[pairs.step],
            by: values[pairs.label],
            "n_samples": pairs.count,
            "share": pairs.count / n[pairs.step],
        }
    )
