"""The reference batch builders of the story, each ``builder(samples, epoch, seed) -> list[list[sample_id]]``.

All four pack greedily under the same rule so that only the *order* they feed to the packer differs: a batch is
closed when one more sample would push its padded tokens (``batch_size * longest``: :mod:`forensics.plan.padding`)
over ``token_budget`` or the batch would exceed ``max_batch_size``. Lengths are capped at ``max_len`` first
(truncation).

- :func:`static_sorted` is the story's ``build_batches``: sort by length once, pack once, and each epoch only
  shuffle the order of the batches. The same samples are batch-mates in every epoch: the bug this tool exists for.
- :func:`shuffle_then_sort` shuffles and then applies the same *stable* sort: only ties between equal lengths move.
- :func:`bucketed_shuffle` is the story's fix: rebuild every epoch, shuffling inside length buckets.
- :func:`random_shuffle` shuffles everything: fresh composition, much more padding.
- :func:`length_grouped` is the ``group_by_length`` sampler of common trainers (HF's ``LengthGroupedSampler``):
  each epoch a fresh permutation cut into mega-batches of 50 batches, each sorted by length and packed. It is the
  finest length grouping in common use that rebuilds every epoch, and the gate's reference (:mod:`forensics.plan.gate`).

Every builder is a pure function of (samples, epoch, seed): the random generator is seeded with ``(seed, epoch)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from forensics.plan.buckets import bucket_index
from forensics.schema import DEFAULT_BOUNDARIES, MAX_BATCH_SIZE, MAX_LEN, N_TOKENS, SAMPLE_ID, TOKEN_BUDGET

Builder = Callable[..., list[list[int]]]


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(epoch)])


def capped_lengths(samples: pd.DataFrame, max_len: int = MAX_LEN) -> np.ndarray:
    """Sample lengths as the trainer sees them: truncated at ``max_len``."""
    return np.minimum(samples[N_TOKENS].to_numpy(np.int64), max_len)


def pack_greedy(
    order: np.ndarray,
    lengths: np.ndarray,
    token_budget: int = TOKEN_BUDGET,
    max_batch_size: int = MAX_BATCH_SIZE,
) -> list[np.ndarray]:
    """Split positions ``order`` into consecutive batches under the padded-token budget and the size limit.

    Returns arrays of positions (indices into ``lengths``). A sample longer than the budget gets a batch of its own.
    """
    order = np.asarray(order, dtype=np.int64)
    if not len(order):
        return []
    from forensics.compiled import loop

    cuts = np.empty(len(order), np.int64)
    in_order = np.ascontiguousarray(lengths[order], dtype=np.int64)
    n = loop("greedy_cuts", len(order))(in_order, int(token_budget), int(max_batch_size), cuts)
    return np.split(order, cuts[:n])


def _to_ids(samples: pd.DataFrame, batches: list[np.ndarray]) -> list[list[int]]:
    ids = samples[SAMPLE_ID].to_numpy(np.int64)
    return [ids[b].tolist() for b in batches]


def static_sorted(
    samples: pd.DataFrame,
    epoch: int,
    seed: int = 0,
    *,
    token_budget: int = TOKEN_BUDGET,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
) -> list[list[int]]:
    """The story's ``build_batches``: sort by length, pack once; each epoch only the batch order is shuffled."""
    lengths = capped_lengths(samples, max_len)
    order = np.argsort(lengths, kind="stable")
    batches = pack_greedy(order, lengths, token_budget, max_batch_size)
    perm = _rng(seed, epoch).permutation(len(batches))
    return _to_ids(samples, [batches[i] for i in perm])


def shuffle_then_sort(
    samples: pd.DataFrame,
    epoch: int,
    seed: int = 0,
    *,
    token_budget: int = TOKEN_BUDGET,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
) -> list[list[int]]:
    """The story's Option 3: shuffle samples, then the same stable sort and packing; only ties move."""
    rng = _rng(seed, epoch)
    lengths = capped_lengths(samples, max_len)
    shuffled = rng.permutation(len(lengths))
    order = shuffled[np.argsort(lengths[shuffled], kind="stable")]
    batches = pack_greedy(order, lengths, token_budget, max_batch_size)
    perm = rng.permutation(len(batches))
    return _to_ids(samples, [batches[i] for i in perm])


def bucketed_shuffle(
    samples: pd.DataFrame,
    epoch: int,
    seed: int = 0,
    *,
    boundaries: Sequence[int] = DEFAULT_BOUNDARIES,
    token_budget: int = TOKEN_BUDGET,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
) -> list[list[int]]:
    """The story's fix: each epoch, shuffle inside each length bucket, pack each bucket, shuffle the batch order."""
    rng = _rng(seed, epoch)
    lengths = capped_lengths(samples, max_len)
    buckets = bucket_index(lengths, boundaries)
    batches: list[np.ndarray] = []
    for k in range(len(boundaries) - 1):
        members = np.flatnonzero(buckets == k)
        if len(members):
            batches.extend(pack_greedy(rng.permutation(members), lengths, token_budget, max_batch_size))
    perm = rng.permutation(len(batches))
    return _to_ids(samples, [batches[i] for i in perm])


def random_shuffle(
    samples: pd.DataFrame,
    epoch: int,
    seed: int = 0,
    *,
    token_budget: int = TOKEN_BUDGET,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
) -> list[list[int]]:
    """A full shuffle packed in that order: composition changes every epoch, padding grows."""
    lengths = capped_lengths(samples, max_len)
    order = _rng(seed, epoch).permutation(len(lengths))
    return _to_ids(samples, pack_greedy(order, lengths, token_budget, max_batch_size))


MEGABATCH_BATCHES = 50
"""Batches per mega-batch in :func:`length_grouped`: HF's ``get_length_grouped_indices`` default."""
MIN_MEGABATCHES = 4
"""HF's rule for small datasets: fewer batches per mega-batch so that the dataset holds at least 4 mega-batches."""


def megabatch_size(
    lengths: np.ndarray,
    *,
    token_budget: int = TOKEN_BUDGET,
    max_batch_size: int = MAX_BATCH_SIZE,
    megabatch_batches: int = MEGABATCH_BATCHES,
) -> int:
    """Samples per mega-batch of :func:`length_grouped`, by HF's rule with a token budget in place of a fixed batch
    size: ``mult x b``, where ``b`` is the batch size a sample sits in when the samples are packed in length order
    (the mean over samples, sum(n_b^2) / n: under a token budget short samples fill batches of ``max_batch_size``
    and long ones batches of a few, and pair retention is counted over pairs, which the big batches dominate), and
    ``mult = min(megabatch_batches, n // (4 b))`` (at least 1), so that the dataset holds at least 4 mega-batches
    whenever it holds 4 batches' worth of samples."""
    n = len(lengths)
    if n == 0:
        return 1
    sizes = np.array(
        [len(b) for b in pack_greedy(np.argsort(lengths, kind="stable"), lengths, token_budget, max_batch_size)],
        dtype=np.int64,
    )
    b = max(1, round(float((sizes * sizes).sum()) / n))
    mult = max(1, min(int(megabatch_batches), n // (MIN_MEGABATCHES * b)))
    return mult * b


def length_grouped(
    samples: pd.DataFrame,
    epoch: int,
    seed: int = 0,
    *,
    token_budget: int = TOKEN_BUDGET,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
    megabatch_batches: int = MEGABATCH_BATCHES,
) -> list[list[int]]:
    """HF's ``group_by_length`` sampler under a token budget: each epoch a fresh permutation, cut into mega-batches
    (:func:`megabatch_size`), each sorted by length, longest first (ties keep the permutation's order, as HF's stable
    ``sorted`` does), and packed; batches never straddle two mega-batches. The batch order is the mega-batches'
    (random) order, as in HF. With a fixed batch size (a token budget no batch reaches) this is HF's algorithm."""
    lengths = capped_lengths(samples, max_len)
    n = len(lengths)
    size = megabatch_size(
        lengths, token_budget=token_budget, max_batch_size=max_batch_size, megabatch_batches=megabatch_batches
    )
    perm = _rng(seed, epoch).permutation(n)
    mega = np.arange(n) // size
    order = perm[np.lexsort((-lengths[perm], mega))]  # lexsort is stable: ties keep the permutation's order
    batches: list[np.ndarray] = []
    for start in range(0, n, size):
        batches.extend(pack_greedy(order[start : start + size], lengths, token_budget, max_batch_size))
    return _to_ids(samples, batches)


REFERENCE_BUILDERS: dict[str, Builder] = {
    "static_sorted": static_sorted,
    "shuffle_then_sort": shuffle_then_sort,
    "bucketed_shuffle": bucketed_shuffle,
    "random_shuffle": random_shuffle,
    "length_grouped": length_grouped,
}
