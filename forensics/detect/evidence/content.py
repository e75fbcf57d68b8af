"""Content evidence: what a sample itself says about whether it can hurt, measured against the rest of the dataset.

A suspect sample is ranked by evidence of harm, not by its length (length is the tiebreaker only). What a sample
carries, each against a reference drawn from the dataset (its own cluster where it has one):

- **near-duplicates**: how many other samples of the dataset share most of its token 3-grams (MinHash, 32 hashes;
  a shared signature band of 2 proposes a pair, the share of equal hashes estimates its Jaccard). A scraped boilerplate
  copied with a few tokens changed has many; ordinary text has none.
- **repetition**: the share of its token 3-grams that repeat an earlier one: near 0 for text, near 1 for one phrase
  over and over (flagged from 30%, and well above its cluster).
- **token entropy**: the entropy of its token distribution, low for repetition, high for noise.
- **foreign tokens**: the share of its tokens that its cluster almost never uses (in fewer than 1% of the cluster's
  reference samples): a sample whose words come from nowhere near its neighbours;
- **unlike every cluster**: the clustering put its text in the cluster of texts far from every centre
  (:data:`~forensics.schema.ATYPICAL_CLUSTER`); a flag with a reason, no score (``unlike`` lists them).

Beside the flags, each sample's ``rarity``: the mean over its tokens of how rare the token is in the whole dataset
(minus the log of the share of reference samples that use it). It flags nothing: it orders samples the run cannot
tell apart (always in the same batches), since the tokens a model has met least are those it predicts worst, so of a
noise row and its repetitive batch-mate the noise row carries the batch's loss.

Each signal is a robust z (median and MAD of the reference); a sample is *flagged* by a signal at ``FLAG_Z`` robust
SDs or more (or, for near-duplicates, two or more in the dataset), and its ``content_score`` sums the capped
excesses. A near-duplicate family counts against the families ordinary samples of its cluster have (templated text has
them too). Tokens come from ``input_ids`` (or ``token_ids``), else from the words of ``text``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from forensics.cache import load_array, store_array
from forensics.schema import ATYPICAL_CLUSTER, CLUSTER, SAMPLE_ID, SOURCE, TEXT
from forensics.stats import robust_sd

#: Robust SDs from which a signal flags a sample.
FLAG_Z = 4.0
#: A signal's contribution to the score is capped here (no single one decides alone).
CAP_Z = 12.0
#: Near-duplicates in the dataset from which a sample is flagged (a few look-alikes are a template; a family is not).
NEAR_DUPS = 3
#: Estimated Jaccard of 3-gram sets from which two samples are near-duplicates.
DUP_JACCARD = 0.45
#: A cluster holding less than this share of the samples is judged against the whole dataset (corrupted samples
#: alike enough to be clustered together would otherwise be their own reference).
SMALL_GROUP = 0.05
#: The least scale a signal is judged on, as a share of its reference median (and 0.025 absolute).
SCALE_FLOOR = 0.05
#: Reference samples drawn per cluster (and for the dataset) to judge against.
REFERENCE = 400
#: A token used by fewer than this share of its cluster's reference samples is foreign to it.
FOREIGN_SHARE = 0.05
#: A sample is flagged as repetitive when at least this share of its 3-grams repeat.
REPEAT_FLAG = 0.3
#: A sample is flagged for foreign tokens when at least this share of them are (a few rare names are ordinary).
FOREIGN_FLAG = 0.4
N_HASHES, BAND_ROWS = 32, 2
#: The MinHash family (multiply-add coefficients, odd): one for every call, so near-duplicate counts are one per
#: dataset whatever seed a rule draws its references with.
_HASH_FAMILY = np.random.default_rng(0).integers(1, 1 << 62, size=(N_HASHES, 2), dtype=np.int64).astype(
    np.uint64
) | np.uint64(1)
_WORD = re.compile(r"\S+")
#: The reason of a sample whose text the clustering found unlike every cluster of the dataset's texts.
UNLIKE_ANY_CLUSTER = f"its text is unlike every content cluster of the dataset (cluster {ATYPICAL_CLUSTER!r})"
#: Bump when what a cached near-duplicate count stands for changes (:func:`_minhash`, :func:`_near_duplicates`).
CACHE_VERSION = 1


def atypical_ids(samples: pd.DataFrame | None) -> set[int]:
    """The ids of the samples the clustering found unlike every cluster (their cluster is named
    :data:`~forensics.schema.ATYPICAL_CLUSTER`, perhaps followed by its dominant label); empty without clusters."""
    if samples is None or "cluster_name" not in samples.columns:
        return set()
    names = samples["cluster_name"].astype("string").fillna("")
    return set(samples.loc[names.str.startswith(ATYPICAL_CLUSTER).to_numpy(bool), SAMPLE_ID].astype(int).tolist())


@dataclass
class ContentEvidence:
    """Per sample: the signals, their robust z, the flags and the score (:func:`content_evidence`)."""

    table: pd.DataFrame
    reasons: dict[int, list[str]] = field(default_factory=dict)
    #: The samples whose text is unlike every content cluster (:func:`atypical_ids`).
    unlike: set[int] = field(default_factory=set)

    def score(self, sample_id: int) -> float:
        return float(self.table["content_score"].get(int(sample_id), 0.0)) if len(self.table) else 0.0

    def flagged(self, sample_id: int) -> bool:
        return bool(self.reasons.get(int(sample_id)))

    def foreign(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` was flagged for tokens foreign to its reference (its cluster, or the dataset)."""
        if not len(self.table):
            return np.zeros(len(ids), bool)
        t = self.table.reindex(np.asarray(ids, np.int64))
        return _is_foreign(t["z_foreign"].to_numpy(np.float64), t["foreign_share"].to_numpy(np.float64))

    def rarity(self, sample_id: int) -> float:
        """The sample's mean token rarity (module docstring); 0 when it was not measured."""
        if not len(self.table) or "rarity" not in self.table.columns:
            return 0.0
        value = float(self.table["rarity"].get(int(sample_id), 0.0))
        return value if np.isfinite(value) else 0.0


@dataclass(frozen=True)
class _Tokens:
    """Samples' tokens laid end to end (int64), in the order they were asked for, and each sample's count: what every
    signal reads, without an array per sample."""

    flat: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, arrays: Sequence) -> _Tokens:
        lengths = np.fromiter((len(a) for a in arrays), np.int64, count=len(arrays))
        return cls(np.concatenate([np.asarray(a) for a in arrays] or [np.empty(0, np.int64)]).astype(np.int64), lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def take(self, at: np.ndarray) -> _Tokens:
        """The samples at positions ``at`` of this one."""
        starts = np.r_[0, np.cumsum(self.lengths)[:-1]][at]
        lengths = self.lengths[at]
        shift = np.repeat(starts - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
        return _Tokens(self.flat[shift + np.arange(len(shift))], lengths)

    def arrays(self) -> list[np.ndarray]:
        """One array per sample (views)."""
        return np.split(self.flat, np.cumsum(self.lengths)[:-1]) if len(self.lengths) else []


class _Dataset:
    """What content evidence reads of a whole samples table, kept for the table's lifetime in the process: four
    rules ask for the content of their samples in one audit, and the near-duplicate counts of the dataset, the
    tokens and each sample's repetition and entropy are the same every time. Tokens are made as rows are first
    asked for, with one vocabulary over a text column (so a word is one token in every sample: the foreign-token
    signal compares a sample's tokens with its reference's)."""

    def __init__(self, samples: pd.DataFrame):
        self.source, self.columns = samples, tuple(samples.columns)
        self.smp = samples.drop_duplicates(SAMPLE_ID).reset_index(drop=True)
        self.ids = self.smp[SAMPLE_ID].to_numpy(np.int64)
        self.column = next((c for c in ("input_ids", "token_ids", TEXT) if c in self.smp.columns), None)
        self.vocab: dict[str, int] = {}
        self.tokens: dict[int, np.ndarray] = {}
        self.signals = np.full((len(self.smp), 2), np.nan)  # repetition and entropy per row, once measured
        self.measured = np.zeros(len(self.smp), bool)
        self.dups: dict[bytes, pd.Series] = {}

    def holds(self, samples: pd.DataFrame) -> bool:
        return self.source is samples and self.columns == tuple(samples.columns)

    def tokens_of(self, rows: Iterable[int]) -> _Tokens:
        """The tokens of rows ``rows``. Token ids are gathered in one piece each time (a conversion per sample was
        most of the content evidence's cost on the full demo); words are numbered once per row, as first asked for."""
        rows = np.fromiter(rows, np.int64) if not isinstance(rows, np.ndarray) else rows.astype(np.int64, copy=False)
        if self.column is None:
            return _Tokens(np.empty(0, np.int64), np.zeros(len(rows), np.int64))
        values = self.smp[self.column].to_numpy(object)
        if self.column != TEXT:
            picked = values[rows]
            if not any(v is None for v in picked):
                return _Tokens.of(picked)
        for r in [r for r in rows.tolist() if r not in self.tokens]:
            self.tokens[r] = self._tokenize(values[r])
        return _Tokens.of([self.tokens[r] for r in rows.tolist()])

    def _tokenize(self, value) -> np.ndarray:
        if self.column is None or value is None:
            return np.empty(0, np.int64)
        if self.column != TEXT:
            return np.asarray(value, dtype=np.int64)
        vocab = self.vocab
        return np.array([vocab.setdefault(w, len(vocab)) for w in _WORD.findall(str(value or "").lower())], np.int64)

    def repeat_and_entropy(self, rows: np.ndarray, tokens: _Tokens) -> np.ndarray:
        """Each row's repetition and entropy (:func:`repeat_and_entropy`), measured once per row (``tokens``: the
        rows' tokens)."""
        rows = np.asarray(rows, np.int64)
        todo = np.flatnonzero(~self.measured[rows])
        if len(todo):
            at = todo[np.unique(rows[todo], return_index=True)[1]]  # a row asked twice is measured once
            picked = tokens.take(at)
            self.signals[rows[at]] = _signals(picked.flat, picked.lengths)
            self.measured[rows[at]] = True
        return self.signals[rows]


#: The samples table content evidence last read (one at a time: an audit reads one dataset).
_LAST: list[_Dataset] = []


def _dataset(samples: pd.DataFrame) -> _Dataset:
    if not (_LAST and _LAST[0].holds(samples)):
        _LAST[:] = [_Dataset(samples)]
    return _LAST[0]


def repeat_and_entropy(tokens: Sequence[np.ndarray]) -> np.ndarray:
    """Per sample, two columns: the share of its token 3-grams that repeat an earlier one (0 for ordinary text; a loop
    of one phrase approaches 1; NaN below 4 tokens; steadier than a compressor's ratio on short samples, whose header
    weighs) and the entropy in bits of its token distribution (NaN without tokens).

    Measured for all samples at once, on their tokens laid end to end: one sort orders every sample's tokens (and one
    its 3-grams) within the sample, and the runs of equal values are the counts. A sample's entropy terms are summed
    as ``numpy.sum`` sums one sample's (pairwise, for each length of its own), so the values are what a loop over
    samples gives, bit for bit, at a fiftieth of its cost on short samples."""
    t = _Tokens.of(tokens)
    return _signals(t.flat, t.lengths)


def _signals(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """:func:`repeat_and_entropy` of samples laid end to end (``flat``, int64) with ``lengths`` tokens each."""
    n = len(lengths)
    out = np.full((n, 2), np.nan)
    if not lengths.any():
        return out
    sample = np.repeat(np.arange(n), lengths)
    # entropy: the counts of each sample's distinct tokens, in token order
    runs = np.flatnonzero(np.r_[True, _ordered_change(sample, flat)])
    counts = np.diff(np.r_[runs, len(flat)])
    of = sample[runs]
    p = counts / lengths[of]
    terms = p * np.log2(p)
    n_distinct = np.bincount(of, minlength=n)
    first = np.r_[0, np.cumsum(n_distinct)[:-1]]
    for m in np.unique(n_distinct[n_distinct > 0]):  # numpy.sum's pairwise order depends on the length summed
        which = np.flatnonzero(n_distinct == m)
        out[which, 1] = -terms[first[which][:, None] + np.arange(m)].sum(axis=1)
    # repetition: the distinct 3-grams of each sample of 4 tokens or more
    with np.errstate(over="ignore"):
        grams = (flat[:-2] * 1_000_003 + flat[1:-1]) * 1_000_003 + flat[2:]
    inside = sample[:-2] == sample[2:]
    grams, gram_of = grams[inside], sample[:-2][inside]
    if len(grams):
        distinct = np.bincount(gram_of[np.r_[True, _ordered_change(gram_of, grams)]], minlength=n)
        long = np.flatnonzero(lengths >= 4)
        out[long, 0] = 1.0 - distinct[long] / (lengths[long] - 2)
    return out


def _ordered_change(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` sorted within each ``group`` (ascending, contiguous), returned as: position i+1 differs from i
    (a new group or a new value). One sort of ``group * span + rank``, the values' dense ranks when their range is
    too wide to add."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo >= (1 << 62) // (int(group[-1]) + 1):
        values = np.unique(values, return_inverse=True)[1].reshape(-1)
        lo, hi = 0, int(values.max())
    key = group * (hi - lo + 1) + (values - lo)
    key.sort()
    return key[1:] != key[:-1]


def _minhash(tokens: np.ndarray, coeffs: np.ndarray) -> np.ndarray | None:
    """The MinHash signature of a sample's token 3-grams (None below 5 tokens: too short to be judged)."""
    if len(tokens) < 5:
        return None
    t = tokens.astype(np.uint64)
    with np.errstate(over="ignore"):
        shingles = np.unique((t[:-2] * np.uint64(0x9E3779B97F4A7C15) ^ t[1:-1]) * np.uint64(0xBF58476D1CE4E5B9) ^ t[2:])
        hashed = shingles[None, :] * coeffs[:, :1] + coeffs[:, 1:]  # wraps modulo 2**64: a multiply-add hash
        hashed ^= hashed >> np.uint64(29)
    return hashed.min(axis=1)


def _near_duplicates(signatures: list[np.ndarray | None]) -> np.ndarray:
    """For each sample: how many others look like it (estimated 3-gram Jaccard >= ``DUP_JACCARD``). Two samples are
    compared when one band of ``BAND_ROWS`` hashes is equal in both (a band shared by more than 200 samples is a
    common template, not a family); bands are grouped by sorting, not by a dictionary of keys."""
    counts = np.zeros(len(signatures), np.int64)
    at = np.array([i for i, sig in enumerate(signatures) if sig is not None], np.int64)
    if len(at) < 2:
        return counts
    sigs = np.stack([signatures[i] for i in at])
    found = []
    for band in range(N_HASHES // BAND_ROWS):
        cols = sigs[:, band * BAND_ROWS : (band + 1) * BAND_ROWS]
        order = np.lexsort(cols.T[::-1])  # rows with an equal band side by side, in sample order within each
        ordered = cols[order]
        starts = np.flatnonzero(np.r_[True, (ordered[1:] != ordered[:-1]).any(axis=1)])
        sizes = np.diff(np.r_[starts, len(order)])
        for k in np.flatnonzero((sizes > 1) & (sizes <= 200)):
            members = order[starts[k] : starts[k] + sizes[k]]
            a, b = np.triu_indices(len(members), 1)
            found.append(members[a] * len(at) + members[b])
    if not found:
        return counts
    pairs = np.unique(np.concatenate(found))
    i, j = pairs // len(at), pairs % len(at)
    alike = np.mean(sigs[i] == sigs[j], axis=1) >= DUP_JACCARD
    np.add.at(counts, at[i[alike]], 1)
    np.add.at(counts, at[j[alike]], 1)
    return counts


def _is_foreign(z_foreign: np.ndarray, share: np.ndarray) -> np.ndarray:
    """The foreign-token flag: at least :data:`FLAG_Z` robust SDs above the reference and at least
    :data:`FOREIGN_FLAG` of its tokens (False where either is NaN)."""
    return (z_foreign >= FLAG_Z) & (share >= FOREIGN_FLAG)


def _foreign_shares(tokens: _Tokens, vocab: np.ndarray, doc_freq: np.ndarray, floor: float) -> np.ndarray:
    """Each sample's share of tokens its reference's samples use in fewer than ``floor`` of them (``vocab``: the
    reference's sorted tokens, ``doc_freq`` their document counts); NaN for a sample without tokens."""
    return _sample_means(tokens, (_reference_counts(tokens.flat, vocab, doc_freq) < floor).astype(np.float64))


def _rarity(tokens: _Tokens, vocab: np.ndarray, doc_freq: np.ndarray, n_reference: int) -> np.ndarray:
    """Each sample's mean over its tokens of ``log((n + 1) / (d + 0.5))``, ``d`` the number of the ``n`` reference
    samples that use the token (``vocab`` sorted, ``doc_freq`` their counts): near 0 for a token every reference
    sample uses, ``log(2n + 2)`` for one none does; NaN for a sample without tokens."""
    known = _reference_counts(tokens.flat, vocab, doc_freq)
    return _sample_means(tokens, np.log((n_reference + 1) / (known + 0.5)))


def _reference_counts(flat: np.ndarray, vocab: np.ndarray, doc_freq: np.ndarray) -> np.ndarray:
    """For each token of ``flat``: how many reference samples use it (``vocab`` sorted, ``doc_freq`` their counts;
    0 for a token the reference never uses). One search over every token at once."""
    if not len(vocab):
        return np.zeros(len(flat), np.int64)
    at = np.minimum(np.searchsorted(vocab, flat), len(vocab) - 1)
    return np.where(vocab[at] == flat, doc_freq[at], 0)


def _sample_means(tokens: _Tokens, per_token: np.ndarray) -> np.ndarray:
    """Each sample's mean of ``per_token`` (one value per token of ``tokens.flat``); NaN for a sample without tokens."""
    lengths = tokens.lengths
    out = np.full(len(lengths), np.nan)
    filled = lengths > 0
    if filled.any():
        starts = np.concatenate([[0], np.cumsum(lengths[filled])[:-1]])
        out[filled] = np.add.reduceat(per_token, starts) / lengths[filled]
    return out


def _document_frequency(tokens: _Tokens) -> tuple[np.ndarray, np.ndarray]:
    """The distinct tokens of some samples (sorted) and how many of the samples hold each."""
    if not len(tokens.flat):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    sample = np.repeat(np.arange(len(tokens)), tokens.lengths)
    pairs = np.unique(np.stack([sample, tokens.flat], axis=1), axis=0)  # each (sample, token) once
    return np.unique(pairs[:, 1], return_counts=True)


def _tokens_key(tokens: _Tokens) -> str:
    """The user-cache key of a pool's near-duplicate counts: every sample's tokens in order, and what decides the
    counts (the hash family, the bands, the Jaccard threshold, :data:`CACHE_VERSION`)."""
    import hashlib

    h = hashlib.blake2b(digest_size=20)
    h.update(repr((CACHE_VERSION, N_HASHES, BAND_ROWS, DUP_JACCARD, len(tokens))).encode())
    h.update(_HASH_FAMILY.tobytes())
    h.update(tokens.lengths.astype(np.int64).tobytes())
    h.update(tokens.flat.astype(np.int64).tobytes())
    return h.hexdigest()


def _robust_z(values: np.ndarray, ref: np.ndarray) -> np.ndarray:
    ref = ref[np.isfinite(ref)]
    if len(ref) < 5:
        return np.zeros(len(values))
    med = float(np.median(ref))
    # a floor on the scale: a signal that hardly varies in the reference (30 random words compress alike) must move
    # by a real amount, not by a few robust SDs of nothing
    sd = robust_sd(ref, floor=max(SCALE_FLOOR * abs(med), SCALE_FLOOR / 2))
    return np.where(np.isfinite(values), (values - med) / sd, 0.0)


def content_evidence(
    samples: pd.DataFrame, ids: Iterable[int], seed: int = 0, dataset_limit: int = 200_000
) -> ContentEvidence:
    """The content evidence of the samples ``ids`` (module docstring), judged against the dataset ``samples``.

    Near-duplicates are counted over the whole dataset up to ``dataset_limit`` samples (a random subset of that
    many, the suspects always in it, beyond)."""
    ids = sorted({int(i) for i in ids})
    if not ids or not len(samples) or not ({"input_ids", "token_ids", TEXT} & set(samples.columns)):
        return ContentEvidence(pd.DataFrame())  # nothing to read: no tokens, no text
    rng = np.random.default_rng(seed)
    data = _dataset(samples)
    smp, sample_ids = data.smp, data.ids
    pos = pd.Series(np.arange(len(smp)), index=sample_ids)
    wanted = pos.reindex(ids).dropna().astype(np.int64).to_numpy()
    pool = np.arange(len(smp))
    if len(pool) > dataset_limit:
        pool = np.union1d(rng.choice(pool, dataset_limit, replace=False), wanted)
    rng.integers(1, 1 << 62, size=(N_HASHES, 2), dtype=np.int64)  # the draw the hash family once was: kept, so
    # the reference draws below are what they were; the family is one for every seed, so every rule of an audit
    # reads the same near-duplicate counts, from one pass over the dataset
    key = pool.tobytes() if len(pool) < len(smp) else b"all"
    if key not in data.dups:  # and across processes: the user cache, keyed by the pool's tokens
        pool_tokens = data.tokens_of(pool)
        stored = _tokens_key(pool_tokens)
        dups = load_array("near-duplicates", stored, len(pool))
        if dups is None:
            dups = _near_duplicates([_minhash(t, _HASH_FAMILY) for t in pool_tokens.arrays()])
            store_array("near-duplicates", stored, dups)
        data.dups[key] = pd.Series(dups, index=sample_ids[pool])
    dup_of = data.dups[key]
    label = CLUSTER if CLUSTER in smp.columns else (SOURCE if SOURCE in smp.columns else None)
    groups = smp[label].to_numpy() if label else np.zeros(len(smp), np.int64)
    parts: list[pd.DataFrame] = []
    reasons: dict[int, list[str]] = {}
    for g in pd.unique(groups[wanted]):
        members = np.flatnonzero(groups == g)
        against = label or "dataset"
        if len(members) < SMALL_GROUP * len(smp):  # a small cluster may be the odd samples themselves
            members, against = np.arange(len(smp)), "dataset"
        ref_idx = rng.choice(members, min(REFERENCE, len(members)), replace=False)
        ref_idx = np.setdiff1d(ref_idx, wanted) if len(np.setdiff1d(ref_idx, wanted)) >= 5 else ref_idx
        ref_tokens = data.tokens_of(ref_idx)
        # a token's document frequency in the reference: sorted tokens and their counts, looked up by search
        vocab, doc_freq = _document_frequency(ref_tokens)
        floor = FOREIGN_SHARE * max(len(ref_tokens), 1)

        ref = np.column_stack(
            [data.repeat_and_entropy(ref_idx, ref_tokens), _foreign_shares(ref_tokens, vocab, doc_freq, floor)]
        )
        ref_dups = dup_of.reindex(sample_ids[ref_idx]).fillna(0).to_numpy(np.float64)
        dup_med = float(np.median(ref_dups))
        dup_sd = robust_sd(ref_dups, floor=1.0)
        mine = wanted[groups[wanted] == g]
        mine_tokens = data.tokens_of(mine)
        vals = np.column_stack(
            [data.repeat_and_entropy(mine, mine_tokens), _foreign_shares(mine_tokens, vocab, doc_freq, floor)]
        )
        z = np.column_stack([_robust_z(vals[:, k], ref[:, k]) for k in range(3)]) if len(vals) else vals.reshape(-1, 3)
        sids = sample_ids[mine]
        n_dup = dup_of.reindex(sids).fillna(0).to_numpy(np.int64)
        zd = (n_dup - dup_med) / dup_sd
        zc, ze, zf = z[:, 0], z[:, 1], z[:, 2]
        by_dup = (n_dup >= NEAR_DUPS) & (zd >= FLAG_Z)  # templates make families too: judged against its cluster's
        by_repeat = (zc >= FLAG_Z) & (vals[:, 0] >= REPEAT_FLAG)
        by_entropy = np.abs(ze) >= FLAG_Z
        by_foreign = _is_foreign(zf, vals[:, 2])
        score = np.zeros(len(mine))  # the capped excesses added in this order, as one sample's sum is
        score += np.where(by_dup, np.minimum(zd, CAP_Z) / FLAG_Z, 0.0)
        for zz, flagging in ((zc, by_repeat), (ze, by_entropy), (zf, by_foreign)):
            score += np.where(flagging, np.minimum(np.abs(zz), CAP_Z) / FLAG_Z, 0.0)
        for r in np.flatnonzero(by_dup | by_repeat | by_entropy | by_foreign):
            why: list[str] = []
            if by_dup[r]:
                why.append(f"near-duplicate of {n_dup[r]} other samples of the dataset")
            if by_repeat[r]:
                why.append(
                    f"repetitive: {100 * vals[r, 0]:.0f}% of its 3-grams repeat an earlier one ({zc[r]:.0f} "
                    f"robust SDs above its {against})"
                )
            if ze[r] <= -FLAG_Z:
                why.append(f"few distinct tokens (entropy {abs(ze[r]):.0f} robust SDs below its {against})")
            elif ze[r] >= FLAG_Z:
                why.append(f"unusually varied tokens (entropy {ze[r]:.0f} robust SDs above its {against})")
            if by_foreign[r]:
                why.append(f"{100 * vals[r, 2]:.0f}% of its tokens are foreign to its {against}")
            reasons[int(sids[r])] = why
        parts.append(
            pd.DataFrame(
                {
                    SAMPLE_ID: sids,
                    "near_duplicates": n_dup,
                    "repeat_share": vals[:, 0],
                    "entropy": vals[:, 1],
                    "foreign_share": vals[:, 2],
                    "z_repeat": zc,
                    "z_entropy": ze,
                    "z_foreign": zf,
                    "content_score": score,
                }
            )
        )
    table = pd.concat(parts, ignore_index=True).set_index(SAMPLE_ID) if parts else pd.DataFrame()
    if len(table):
        # its own draw, after the others: the reference samples of the flags stay what they were
        whole = np.random.default_rng([seed, 1]).choice(len(smp), min(REFERENCE, len(smp)), replace=False)
        rarity = _rarity(data.tokens_of(wanted), *_document_frequency(data.tokens_of(whole)), len(whole))
        table["rarity"] = pd.Series(rarity, index=sample_ids[wanted]).reindex(table.index).to_numpy()
    unlike = atypical_ids(samples) & set(ids)
    for sid in sorted(unlike):
        reasons.setdefault(sid, []).append(UNLIKE_ANY_CLUSTER)
    return ContentEvidence(table, reasons, unlike)
