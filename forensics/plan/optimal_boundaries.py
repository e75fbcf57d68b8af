"""Length-bucket boundaries that minimise padding, and what padding a set of boundaries really costs.

Two measures, because they answer different questions:

- **boundary efficiency** (real / to-boundary padded tokens): every sample padded to its bucket's upper boundary.
  It is what :func:`optimal_boundaries` minimises exactly, and an upper bound on the padding a bucketed plan can
  suffer (a batch pads to its longest sample, which is at most the boundary).
- **packing efficiency** (real / padded tokens of the batches; the ``buckets`` JSON's ``padding_efficiency``): what
  greedy packing under the token budget reaches with those boundaries, measured by running the reference builder
  :func:`~forensics.plan.builders.bucketed_shuffle` over a few seeds. A batch pads to ``batch size x longest``
  (:mod:`forensics.plan.padding`). It is a simulation of boundaries, not a measure of a given plan: the gate's
  per-epoch figure of a real plan is :func:`~forensics.plan.composition.epoch_padding_efficiency`.

Buckets follow docs/concepts.md: boundaries ``[0, b1, ..., max_len]``, bucket ``k`` holds lengths in ``(b_k, b_{k+1}]``
after capping at ``max_len``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_index
from forensics.plan.builders import bucketed_shuffle
from forensics.plan.padding import batch_shapes
from forensics.schema import (
    DEFAULT_BOUNDARIES,
    MAX_BATCH_SIZE,
    MAX_LEN,
    N_TOKENS,
    OPTIMAL,
    SAMPLE_ID,
    TOKEN_BUDGET,
    RunConfig,
    check_boundaries,
)
from forensics.schema.config import DEFAULT_N_BUCKETS

#: Seeds over which greedy packing is simulated; each is one epoch of the bucketed shuffle.
DEFAULT_SEEDS: tuple[int, ...] = (0, 1, 2)


def _capped(lengths: np.ndarray | Sequence[int], max_len: int) -> np.ndarray:
    return np.minimum(np.asarray(lengths, dtype=np.int64).ravel(), int(max_len))


def _check_k(k: int, max_len: int) -> None:
    if int(k) < 1:
        raise ForensicsError(f"the number of buckets k must be >= 1; got {k}")
    if int(max_len) < 1:
        raise ForensicsError(f"max_len must be >= 1; got {max_len}")
    if int(k) > int(max_len):
        raise ForensicsError(f"k = {k} buckets cannot have strictly increasing boundaries below max_len = {max_len}")


def optimal_boundaries(lengths: np.ndarray, k: int, max_len: int = MAX_LEN) -> list[int]:
    """The ``k`` buckets ``[0, b1, ..., max_len]`` that pad the fewest tokens when every sample is padded to its
    bucket's upper boundary (exact; ties between equally good answers are broken deterministically).

    Why it is exact and fast: an intermediate upper boundary can always be lowered to the longest length in its
    bucket without moving any sample and without padding more, so the boundaries are searched among the ``D``
    distinct lengths only. With prefix sums ``C`` (counts) and ``S`` (token sums) over the sorted distinct lengths
    ``v``, a bucket holding ``v[j..i-1]`` pads ``(C[i] - C[j]) * v[i-1] - (S[i] - S[j])`` tokens, so one DP layer is

        ``f_k[i] = C[i] * x - S[i] + min_j (f_{k-1}[j] + S[j] - C[j] * x)``  at ``x = v[i-1]``,

    a minimum over lines ``-C[j] * x + (f_{k-1}[j] + S[j])`` whose slopes fall as ``j`` grows, queried at rising
    ``x``: the monotone convex-hull trick answers each layer in ``O(D)``, exactly (integer arithmetic). The last
    bucket always ends at ``max_len``. A 1M-sample set with ``max_len`` 8192 takes well under a second.

    Empty samples (length 0) sit in bucket 0 under any boundaries, padded to ``b1`` just like a length-1 sample, so
    they are counted as length 1: the padded tokens, hence the optimum, do not change.
    """
    _check_k(k, max_len)
    k, max_len = int(k), int(max_len)
    capped = np.maximum(_capped(lengths, max_len), 1)
    if capped.size == 0:
        raise ForensicsError("optimal_boundaries: no sample lengths given")
    if k == 1:
        return [0, max_len]
    values, counts = np.unique(capped, return_counts=True)
    inner_candidates = values[values < max_len]
    if len(inner_candidates) <= k - 1:
        # every distinct length can be a boundary of its own: nothing is padded beyond the last bucket
        return _fill_boundaries(inner_candidates.tolist(), k, max_len)
    counts_prefix = np.concatenate([[0], np.cumsum(counts)]).tolist()
    sums_prefix = np.concatenate([[0], np.cumsum(values * counts)]).tolist()
    vals = values.tolist()
    n_values = len(vals)
    n_inner = len(inner_candidates)  # a bucket other than the last may end at v[i-1] only for i <= n_inner

    # layer 1: one bucket covering v[0..i-1], ending at v[i-1]
    cost = [None] + [counts_prefix[i] * vals[i - 1] - sums_prefix[i] for i in range(1, n_inner + 1)]
    choice: list[list[int]] = []  # choice[layer][i] = j, the end of the previous bucket
    for layer in range(2, k):
        cost, back = _dp_layer(cost, layer, n_inner, vals, counts_prefix, sums_prefix)
        choice.append(back)
    # the last bucket ends at max_len and holds v[j..n_values-1]
    total_c, total_s = counts_prefix[n_values], sums_prefix[n_values]
    best_j, best = -1, None
    for j in range(k - 1, n_inner + 1):
        c = cost[j] + (total_c - counts_prefix[j]) * max_len - (total_s - sums_prefix[j])
        if best is None or c < best:
            best, best_j = c, j
    ends = [best_j]
    for back in reversed(choice):
        ends.append(back[ends[-1]])
    return [0] + [vals[i - 1] for i in reversed(ends)] + [max_len]


def _dp_layer(
    prev: list, layer: int, n_inner: int, vals: list[int], counts_prefix: list[int], sums_prefix: list[int]
) -> tuple[list, list[int]]:
    """One DP layer by the monotone convex-hull trick: ``layer`` buckets covering ``v[0..i-1]``, for every ``i``."""
    cost: list = [None] * (n_inner + 1)
    back = [0] * (n_inner + 1)
    slopes: list[int] = []  # -C[j], strictly falling
    inters: list[int] = []  # f_{layer-1}[j] + S[j]
    owners: list[int] = []  # j
    head = 0
    for i in range(layer, n_inner + 1):
        j = i - 1  # the line of j = i - 1 becomes usable for i (the previous bucket ends before v[i-1])
        m, b = -counts_prefix[j], prev[j] + sums_prefix[j]
        # drop lines that the new one makes useless (it has the smallest slope, so it wins for large x)
        while len(slopes) - head >= 2 and _useless(slopes[-2], inters[-2], slopes[-1], inters[-1], m, b):
            slopes.pop()
            inters.pop()
            owners.pop()
        slopes.append(m)
        inters.append(b)
        owners.append(j)
        head = min(head, len(slopes) - 1)
        x = vals[i - 1]
        while head + 1 < len(slopes) and slopes[head + 1] * x + inters[head + 1] <= slopes[head] * x + inters[head]:
            head += 1
        cost[i] = counts_prefix[i] * x - sums_prefix[i] + slopes[head] * x + inters[head]
        back[i] = owners[head]
    return cost, back


def _useless(m1: int, b1: int, m2: int, b2: int, m3: int, b3: int) -> bool:
    """Line 2 never is the strict minimum once line 3 (smaller slope) exists: m1 > m2 > m3."""
    # line 2 is useless when line 3 overtakes line 1 no later than line 2 does: (b3-b1)/(m1-m3) <= (b2-b1)/(m1-m2)
    return (b3 - b1) * (m1 - m2) <= (b2 - b1) * (m1 - m3)


def _fill_boundaries(inner: list[int], k: int, max_len: int) -> list[int]:
    """Boundaries from fewer than ``k - 1`` useful inner values: the rest are the smallest free integers.

    Every distinct length is already a boundary, so each bucket holds one length only and an extra boundary just
    makes an empty bucket: the padding does not change.
    """
    used = set(inner)
    free = (x for x in range(1, max_len) if x not in used)
    extra = [next(free) for _ in range(k - 1 - len(inner))]
    return [0] + sorted(inner + extra) + [max_len]


def quantile_boundaries(lengths: np.ndarray, k: int, max_len: int = MAX_LEN) -> list[int]:
    """Equal-count boundaries: ``b_i`` is the length at the ``i/k`` quantile (a real length), the usual baseline.

    Ties (many samples of one length) could repeat a boundary; repeated values are pushed up by one token (and down
    again below ``max_len``) so the boundaries stay strictly increasing.
    """
    _check_k(k, max_len)
    capped = _capped(lengths, max_len)
    if capped.size == 0:
        raise ForensicsError("quantile_boundaries: no sample lengths given")
    inner = np.quantile(capped, np.arange(1, k) / k, method="inverted_cdf").astype(np.int64).tolist()
    return _strictly_increasing(inner, max_len)


def _strictly_increasing(inner: list[int], max_len: int) -> list[int]:
    out = [max(1, int(x)) for x in inner]
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1] + 1)
    upper = max_len
    for i in range(len(out) - 1, -1, -1):
        upper = min(out[i], upper - 1)
        out[i] = upper
    return [0] + out + [max_len]


def conform_boundaries(boundaries: Sequence[int], max_len: int = MAX_LEN) -> list[int]:
    """Boundaries fitted to ``max_len``: inner values at or above it are dropped and the last one is ``max_len``.

    Lengths are capped at ``max_len`` and ``bucket_index`` puts everything above the last boundary in the last
    bucket, so this keeps every sample in the bucket it already had; only the padding target of the last bucket
    becomes ``max_len``. The story's boundaries with ``max_len`` 4096 become ``[0, 770, ..., 3296, 4096]``.
    """
    inner = [int(b) for b in boundaries[1:-1] if 0 < int(b) < max_len]
    return [0] + inner + [int(max_len)]


# --- measures -------------------------------------------------------------------------------------------------------
def padded_to_boundary(lengths: np.ndarray, boundaries: Sequence[int], max_len: int = MAX_LEN) -> int:
    """Tokens after padding every sample (capped at ``max_len``) to its bucket's upper boundary."""
    b = conform_boundaries(boundaries, max_len)
    capped = _capped(lengths, max_len)
    upper = np.asarray(b, dtype=np.int64)[bucket_index(capped, b) + 1]
    return int(upper.sum())


def boundary_efficiency(lengths: np.ndarray, boundaries: Sequence[int], max_len: int = MAX_LEN) -> float:
    """Real / to-boundary padded tokens (0-1): 1 means no sample is shorter than its bucket's upper boundary."""
    capped = _capped(lengths, max_len)
    padded = padded_to_boundary(capped, boundaries, max_len)
    return float(capped.sum() / padded) if padded else 1.0


def bucket_boundary_efficiency(
    lengths: np.ndarray, boundaries: Sequence[int], max_len: int = MAX_LEN
) -> list[float | None]:
    """Per bucket, real / to-boundary padded tokens; ``None`` for an empty bucket."""
    b = conform_boundaries(boundaries, max_len)
    capped = _capped(lengths, max_len)
    idx = bucket_index(capped, b)
    out: list[float | None] = []
    for k in range(len(b) - 1):
        members = capped[idx == k]
        out.append(float(members.sum() / (len(members) * b[k + 1])) if len(members) else None)
    return out


@dataclass
class PackingEfficiency:
    """What greedy packing under the budget reached with some boundaries, summed over the simulated seeds."""

    overall: float
    per_bucket: list[float | None]
    real_tokens: int
    padded_tokens: int
    batches: int
    seeds: list[int] = field(default_factory=list)


def batch_tokens(batches: Sequence[Sequence[int]], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per batch: real tokens and padded tokens (:mod:`forensics.plan.padding`), for batches of positions."""
    sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    if not len(sizes):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    flat = np.fromiter((s for b in batches for s in b), dtype=np.int64, count=int(sizes.sum()))
    lens = np.asarray(lengths, dtype=np.int64)[flat]
    batch = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    real = np.bincount(batch, weights=lens, minlength=len(sizes)).astype(np.int64)
    return real, batch_shapes(batch, lens, len(sizes)).padded


def packing_efficiency(
    lengths: np.ndarray,
    boundaries: Sequence[int],
    *,
    token_budget: int = TOKEN_BUDGET,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
    seeds: Sequence[int] = DEFAULT_SEEDS,
) -> PackingEfficiency:
    """Real / padded tokens of the batches that :func:`bucketed_shuffle` builds with these boundaries.

    One epoch per seed (epoch 0, seed s) is built for real; the figures sum over all of them. Per bucket, the
    batches of that bucket (each batch holds one bucket) are summed the same way; ``None`` for an empty bucket.
    """
    b = conform_boundaries(boundaries, max_len)
    capped = _capped(lengths, max_len)
    # positions as sample ids, so the builder's batches index ``capped`` directly
    frame = pd.DataFrame({SAMPLE_ID: np.arange(len(capped), dtype=np.int64), N_TOKENS: capped})
    k = len(b) - 1
    real_by_bucket = np.zeros(k, dtype=np.int64)
    padded_by_bucket = np.zeros(k, dtype=np.int64)
    n_batches = 0
    for seed in seeds:
        batches = bucketed_shuffle(
            frame, 0, int(seed), boundaries=b, token_budget=token_budget, max_len=max_len, max_batch_size=max_batch_size
        )
        real, padded = batch_tokens(batches, capped)
        first = np.fromiter((bt[0] for bt in batches), dtype=np.int64, count=len(batches))
        bucket_of_batch = bucket_index(capped[first], b) if len(first) else np.zeros(0, np.int64)
        real_by_bucket += np.bincount(bucket_of_batch, weights=real, minlength=k).astype(np.int64)
        padded_by_bucket += np.bincount(bucket_of_batch, weights=padded, minlength=k).astype(np.int64)
        n_batches += len(batches)
    per_bucket = [float(r / p) if p else None for r, p in zip(real_by_bucket, padded_by_bucket)]
    total_real, total_padded = int(real_by_bucket.sum()), int(padded_by_bucket.sum())
    return PackingEfficiency(
        overall=float(total_real / total_padded) if total_padded else 1.0,
        per_bucket=per_bucket,
        real_tokens=total_real,
        padded_tokens=total_padded,
        batches=n_batches,
        seeds=[int(s) for s in seeds],
    )


def describe_boundaries(
    lengths: np.ndarray,
    boundaries: Sequence[int],
    *,
    token_budget: int = TOKEN_BUDGET,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
    seeds: Sequence[int] = DEFAULT_SEEDS,
) -> dict:
    """Every figure of one set of boundaries, as the ``buckets`` JSON carries them (plain Python values)."""
    b = conform_boundaries(boundaries, max_len)
    capped = _capped(lengths, max_len)
    packing = packing_efficiency(
        capped, b, token_budget=token_budget, max_len=max_len, max_batch_size=max_batch_size, seeds=seeds
    )
    counts = np.bincount(bucket_index(capped, b), minlength=len(b) - 1)
    return {
        "boundaries": b,
        "boundary_efficiency": boundary_efficiency(capped, b, max_len),
        "padding_efficiency": packing.overall,
        "bucket_efficiency": packing.per_bucket,
        "bucket_boundary_efficiency": bucket_boundary_efficiency(capped, b, max_len),
        "bucket_samples": counts.tolist(),
    }


def resolve_boundaries(
    boundaries: Sequence[int] | str | None,
    samples: pd.DataFrame,
    max_len: int = MAX_LEN,
    n_buckets: int | None = None,
) -> list[int]:
    """``None`` or ``"optimal"`` -> the optimal-boundary finder with ``n_buckets`` buckets (default 6: docs/concepts.md
    Conventions, ``buckets``); a list -> checked, and made to end at ``max_len`` (a last boundary below it gains a
    bucket up to ``max_len``; boundaries above it are dropped, since lengths are capped there)."""
    if boundaries is None or isinstance(boundaries, str):
        if boundaries not in (None, OPTIMAL):
            raise ForensicsError(f"boundaries: expected b0,b1,... or 'optimal'; got {boundaries!r}")
        k = n_buckets or DEFAULT_N_BUCKETS
        lengths = np.minimum(samples[N_TOKENS].to_numpy(np.int64), max_len)
        return check_boundaries(optimal_boundaries(lengths, k, max_len=max_len), "optimal boundaries")
    bounds = check_boundaries(boundaries, "boundaries")
    if bounds[-1] < max_len:  # lengths above the last boundary get a bucket of their own up to max_len
        bounds.append(int(max_len))
    elif bounds[-1] > max_len:  # lengths are capped at max_len: the last bucket ends there
        bounds = [b for b in bounds[:-1] if b < max_len] + [int(max_len)]
    return bounds


@dataclass
class BucketsReport:
    """``forensics buckets``: the optimal boundaries' figures, and the same for the other sets compared."""

    figures: dict[str, dict]
    settings: dict

    def to_json(self) -> dict:
        """The JSON contract: the optimum's figures at the top level, ``compared`` and ``settings``."""
        out = dict(self.figures["optimal"])
        out["compared"] = {name: f for name, f in self.figures.items() if name != "optimal"}
        out["settings"] = dict(self.settings)
        return out


def buckets_report(
    samples: pd.DataFrame,
    k: int,
    cfg: RunConfig,
    *,
    compare: Sequence[int] | None = None,
    seeds: int = len(DEFAULT_SEEDS),
    on_set: Callable[[str, int, int], None] | None = None,
) -> BucketsReport:
    """The optimal ``k`` buckets of these samples against quantile boundaries, the story's and ``compare`` (the
    case's named boundaries by default), each packed greedily under the run's token budget over ``seeds`` epochs.
    ``on_set(name, done, total)`` is called as each set is packed (for a progress bar)."""
    if samples.empty:
        raise ForensicsError("buckets: the samples table has no rows")
    if seeds < 1:
        raise ForensicsError(f"buckets: seeds must be >= 1; got {seeds}")
    _check_k(k, cfg.max_len)
    lengths = samples[N_TOKENS].to_numpy()
    sets = {
        "optimal": optimal_boundaries(lengths, k, cfg.max_len),
        "quantile": quantile_boundaries(lengths, k, cfg.max_len),
        "story": conform_boundaries(DEFAULT_BOUNDARIES, cfg.max_len),
    }
    given = compare if compare is not None else (list(cfg.boundaries) if cfg.boundaries else None)
    if given is not None:
        sets["given"] = conform_boundaries(given, cfg.max_len)
    figures = {}
    for i, (name, b) in enumerate(sets.items()):
        if on_set:
            on_set(name, i, len(sets))
        figures[name] = describe_boundaries(
            lengths,
            b,
            token_budget=cfg.token_budget,
            max_len=cfg.max_len,
            max_batch_size=cfg.max_batch_size,
            seeds=range(seeds),
        )
    settings = {
        "k": int(k),
        "max_len": cfg.max_len,
        "token_budget": cfg.token_budget,
        "max_batch_size": cfg.max_batch_size,
        "seeds": list(range(seeds)),
        "samples": int(len(lengths)),
    }
    return BucketsReport(figures, settings)
