"""Where the demo's corrupted near-duplicates sit: in the static plan's batches at the story's spike steps.

The story's spikes at steps 254 and 258 must come from the batch plan, not be painted on. The static builder
(:func:`forensics.plan.builders.static_sorted`) sorts by length, packs once, and each epoch only shuffles the order
of the batches; so a batch of long samples of nearly the same length is a fixed group that recurs every epoch.

The demo makes the samples of two such batches corrupted near-duplicates (one scraped code file, copied with small
edits, with a run of ``<|endoftext|>`` tokens: :func:`forensics.datasets.samples.corrupt_text`). Their lengths are left
as drawn, so they are adjacent after the sort because their lengths are; the corruption changes only their text and
source label. Which batch lands at which step is decided by the builder's own seeded shuffle, so rather than move
batches, :func:`place_corrupt_group` nudges the sample count (taking a longer prefix of one drawn pool, in strides
large enough to change the number of batches and so the shuffle) until the epoch-0 batches at the spike steps are *long*
batches (every sample of at least :data:`MIN_CORRUPT_TOKENS` tokens,
3-6 samples in the batch: a duplicate group large enough to matter). The plan itself is the unmodified reference
builder's output for the demo seed.

The bucketed shuffle puts the same samples in the same length bucket but shuffles inside it every epoch, so the
group is scattered: at most one or two of them share a batch, and the loss model's collective term (superlinear in
the count per batch) stays negligible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.builders import static_sorted
from forensics.schema import MAX_BATCH_SIZE, MAX_LEN, N_TOKENS, SAMPLE_ID, TOKEN_BUDGET

#: A corrupted batch holds only samples at least this long (the story: the bad samples are long code).
MIN_CORRUPT_TOKENS = 2433
#: ... and this many samples: enough near-duplicates for the collective effect, as long batches hold.
CORRUPT_BATCH_SIZES = (3, 6)


@dataclass(frozen=True)
class Placement:
    """The sample count that puts long batches at the spike steps, and the ids of those batches' samples."""

    n_samples: int
    spike_steps: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]  # sample ids of the epoch-0 batch at each spike step

    @property
    def corrupt_ids(self) -> list[int]:
        return sorted(i for g in self.groups for i in g)


def _is_long_batch(ids: Sequence[int], lengths: np.ndarray) -> bool:
    lo, hi = CORRUPT_BATCH_SIZES
    return lo <= len(ids) <= hi and int(lengths[list(ids)].min()) >= MIN_CORRUPT_TOKENS


def place_corrupt_group(
    pool_lengths: np.ndarray,
    candidates: Sequence[int],
    spike_steps: Sequence[int],
    seed: int,
    *,
    token_budget: int = TOKEN_BUDGET,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
) -> Placement:
    """The first sample count of ``candidates`` whose static plan (epoch 0, ``seed``) has long batches at
    ``spike_steps``.

    A candidate ``n`` takes the first ``n`` of ``pool_lengths``; sample ids are positions in the pool. One batch is one
    step (world size 1, grad accumulation 1).
    """
    lengths = np.minimum(np.asarray(pool_lengths, dtype=np.int64), max_len)
    if max(candidates) > len(lengths):
        raise ValueError("a candidate sample count exceeds the pool")
    for n in candidates:
        samples = pd.DataFrame({SAMPLE_ID: np.arange(n, dtype=np.int64), N_TOKENS: lengths[:n]})
        batches = static_sorted(
            samples, 0, seed, token_budget=token_budget, max_len=max_len, max_batch_size=max_batch_size
        )
        if max(spike_steps) >= len(batches):
            raise ForensicsError(
                f"the demo needs more than {max(spike_steps)} batches in epoch 0; {n} samples give {len(batches)}"
            )
        if all(_is_long_batch(batches[s], lengths) for s in spike_steps):
            groups = tuple(tuple(int(i) for i in batches[s]) for s in spike_steps)
            return Placement(n_samples=int(n), spike_steps=tuple(int(s) for s in spike_steps), groups=groups)
    raise ForensicsError(
        f"no sample count among {len(candidates)} candidates from {min(candidates)} puts long "
        f"batches at steps {list(spike_steps)} for seed {seed}"
    )
