r"""Content clusters per sample: from the text (TF-IDF, LSA, k-means) or from a label column.

Why this recipe: TF-IDF with sublinear term frequency and English stop words removed, reduced by LSA (truncated SVD)
and normalised, is the standard scikit-learn recipe for k-means on documents (cosine geometry, dense and small
vectors). The vocabulary, the SVD and k-means are fitted on at most ``max_fit`` texts drawn with ``seed`` and then
applied to every text in chunks, so that clustering a million samples costs one pass of tokenisation. Cluster ids
are renumbered by size (0 = the largest in the fitted sample), and each is named by the top terms of its centroid.
The same inputs and seed always give the same clusters.

k-means puts every text in some cluster, even one unlike all of them (rows of noise words, a broken encoding, a
template gone wrong): such a text lands in whichever cluster is least far, and a step's composition would then call
it that cluster's content, whose loss it does not share. So a text whose cosine similarity to its cluster's centre
is both a far outlier among all fitted texts (below the lower Tukey fence, Q1 - 1.5 IQR) and under half its
cluster's median similarity goes to one more cluster, :data:`ATYPICAL_NAME`, numbered after the others (only when
some text is in it). On the family of real runs in fixtures/ this takes every noise row and at most 0.5% of the
clean texts; on the demo's 20,000 texts none.

Applying the vocabulary is the cost at scale (scikit-learn tokenises and counts one document at a time in Python), so
:func:`term_counts` counts ASCII texts with array operations on their bytes instead (pyarrow, numpy): for ASCII,
lowercasing and the token pattern ``\b\w\w+\b`` are byte rules, and the counts are the very matrix scikit-learn
builds, entry for entry. Texts with other characters go through scikit-learn's own analyser, whose Unicode rules
(lowercasing, what a word character is) a byte rule would only approximate.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.schema import ATYPICAL_CLUSTER, CLUSTER, SOURCE, TEXT
from forensics.tagging.cluster_cache import cluster_key, load_clusters, store_clusters

if TYPE_CHECKING:
    import pyarrow as pa
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import TfidfVectorizer

CLUSTER_NAME = "cluster_name"
NO_CLUSTER = -1  # samples without text (or a table without text at all) carry this id
#: The name of the cluster of texts unlike every cluster (module docstring).
ATYPICAL_NAME = ATYPICAL_CLUSTER
#: Fitted texts needed before any text is called unlike every cluster (quartiles of fewer say little).
ATYPICAL_MIN_FIT = 50


@dataclass
class ClusterInfo:
    """How the clusters were made: ``method`` is ``text``, ``label:<column>`` or ``given``; ``k`` clusters with
    ``names``; for text, the silhouette of each k tried when k was chosen automatically."""

    method: str
    k: int
    names: dict[int, str]
    silhouettes: dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> ClusterInfo:
        """The inverse of :meth:`as_dict` (JSON keys back to ints)."""
        return cls(
            method=str(d["method"]),
            k=int(d["k"]),
            names={int(c): str(n) for c, n in d["names"].items()},
            silhouettes={int(k): float(s) for k, s in d.get("silhouettes", {}).items()},
        )

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "k": self.k,
            "names": {str(c): n for c, n in self.names.items()},
            "silhouettes": {str(k): s for k, s in self.silhouettes.items()},
        }


#: k-means restarts for each k tried while choosing k (the final fit keeps ``n_init``): the silhouette ranks the k
#: the same with 3 as with 10 on the demo (every score within 0.015, the same k), for a third of the time.
CHOOSE_N_INIT = 3


class TextClusterer:
    """k-means on TF-IDF + LSA features; ``fit`` on a sample of texts, ``predict`` on any number.

    Parameters
    ----------
    k: number of clusters; ``None`` chooses it in ``k_range`` by the silhouette on a subsample (the best-separated
        partition; ties go to the smaller k).
    k_range: the (lowest, highest) k tried when ``k`` is ``None``.
    max_fit: at most this many texts (drawn with ``seed``) fit the vocabulary, the SVD and k-means.
    seed: seeds the draw, the SVD and k-means.
    n_components: LSA dimensions (capped by the vocabulary and the sample size).
    max_features: vocabulary size (most frequent terms of the fitted sample).
    silhouette_sample: texts k is chosen on (k-means per k and the silhouette).
    chunk: texts transformed at a time by ``predict`` (bounds memory).
    n_terms: top terms in a cluster's name.
    n_init: k-means restarts of the final fit (the best inertia wins); each k tried gets :data:`CHOOSE_N_INIT`.
    """

    def __init__(
        self,
        k: int | None = None,
        *,
        k_range: tuple[int, int] = (2, 10),
        max_fit: int = 20_000,
        seed: int = 0,
        n_components: int = 50,
        max_features: int = 50_000,
        silhouette_sample: int = 2_000,
        chunk: int = 50_000,
        n_terms: int = 3,
        n_init: int = 10,
    ) -> None:
        self.k = k
        self.k_range = k_range
        self.max_fit = max_fit
        self.seed = seed
        self.n_components = n_components
        self.max_features = max_features
        self.silhouette_sample = silhouette_sample
        self.chunk = chunk
        self.n_terms = n_terms
        self.n_init = n_init

    # --- fit ----------------------------------------------------------------------------------------------------------
    def fit(self, texts: Sequence[str] | np.ndarray) -> TextClusterer:
        from threadpoolctl import threadpool_limits

        # One thread: the fitted sample is small (max_fit), a single thread gives the same floating-point sums
        # on every machine, and on a busy machine it is several times faster than oversubscribed OpenMP threads.
        with threadpool_limits(limits=1):
            return self._fit(texts)

    def _fit(self, texts: Sequence[str] | np.ndarray) -> TextClusterer:
        import pyarrow as pa
        from sklearn.cluster import KMeans
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        texts = np.asarray(texts, dtype=object)
        if self.k is not None and self.k < 1:
            raise ForensicsError(f"--clusters must be >= 1; got {self.k}")
        rng = np.random.default_rng(self.seed)
        n_fit = min(len(texts), self.max_fit)
        idx = np.sort(rng.choice(len(texts), n_fit, replace=False)) if n_fit < len(texts) else np.arange(n_fit)
        fit_texts = texts[idx]
        self.vectorizer_ = TfidfVectorizer(
            max_features=self.max_features,
            sublinear_tf=True,
            stop_words="english",
            min_df=2 if n_fit >= 1000 else 1,
            dtype=np.float32,
        )
        try:
            x = self.vectorizer_.fit_transform(fit_texts)
        except ValueError as exc:  # an empty vocabulary: no words at all
            raise ForensicsError(f"the sample texts hold no words to cluster ({exc})") from exc
        # the terms by column, for term_counts' lookup
        self.vocabulary_array_ = pa.array(self.vectorizer_.get_feature_names_out().tolist(), pa.large_string())
        n_comp = min(self.n_components, x.shape[1] - 1, n_fit - 1)
        self.svd_ = TruncatedSVD(n_comp, random_state=self.seed) if n_comp >= 2 else None
        feats = self._reduce(x, fit=True)
        n_distinct = len(np.unique(feats.round(6), axis=0))
        self.silhouettes_: dict[int, float] = {}
        if self.k is not None:
            k = min(self.k, n_distinct)
        else:
            k = self._choose_k(feats, n_distinct)
        self.kmeans_ = KMeans(n_clusters=k, random_state=self.seed, n_init=self.n_init).fit(feats)
        self._order_by_size(self.kmeans_.labels_)
        self.k_ = k
        self.names_ = self._names()
        self._fit_typical(feats)
        return self

    def _similarity(self, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's k-means label and its cosine similarity to that label's centre."""
        labels = self.kmeans_.predict(feats)
        centres = self.kmeans_.cluster_centers_
        norms = np.linalg.norm(centres, axis=1)
        unit = centres / np.where(norms > 0, norms, 1.0)[:, None]
        return labels, np.einsum("ij,ij->i", feats, unit[labels])

    def _fit_typical(self, feats: np.ndarray) -> None:
        """The fence and each cluster's half-median similarity a text must fall under both to be atypical."""
        labels, sim = self._similarity(feats)
        self.atypical_fence_, self.half_median_ = typical_bounds(sim, labels, self.k_)

    def _reduce(self, x, fit: bool = False) -> np.ndarray:
        from sklearn.preprocessing import normalize

        if self.svd_ is None:
            return normalize(x).toarray()
        y = self.svd_.fit_transform(x) if fit else self.svd_.transform(x)
        return normalize(y).astype(np.float32, copy=False)

    def _choose_k(self, feats: np.ndarray, n_distinct: int) -> int:
        from sklearn.cluster import KMeans
        from sklearn.metrics import silhouette_score

        lo, hi = self.k_range
        hi = min(hi, n_distinct - 1, len(feats) - 1)
        if hi < max(lo, 2):
            return max(1, min(lo, n_distinct))
        # k is chosen on a subsample: the silhouette is quadratic in its points, and k-means per k need not see all
        rng = np.random.default_rng([self.seed, 1])
        if len(feats) > self.silhouette_sample:
            feats = feats[np.sort(rng.choice(len(feats), self.silhouette_sample, replace=False))]
        best_k, best = lo, -np.inf
        for k in range(max(lo, 2), hi + 1):
            labels = KMeans(n_clusters=k, random_state=self.seed, n_init=CHOOSE_N_INIT).fit_predict(feats)
            if len(np.unique(labels)) < 2:
                continue
            score = float(silhouette_score(feats, labels))
            self.silhouettes_[k] = round(score, 6)
            if score > best + 1e-9:
                best_k, best = k, score
        return best_k

    def _order_by_size(self, labels: np.ndarray) -> None:
        sizes = np.bincount(labels, minlength=self.kmeans_.n_clusters)
        order = np.lexsort((np.arange(len(sizes)), -sizes))  # largest first, ties by old id
        self.relabel_ = np.empty_like(order)
        self.relabel_[order] = np.arange(len(order))

    def _names(self) -> dict[int, str]:
        """Each cluster's most distinctive real words: its centroid's weight less the other clusters' mean, over
        the terms that are words (letters only, three or more, not stop words); None where fewer than two
        qualify (:func:`cluster_samples` then names it by an excerpt of its most central text)."""
        centers = self.kmeans_.cluster_centers_
        weights = self.svd_.inverse_transform(centers) if self.svd_ is not None else centers
        terms = self.vectorizer_.get_feature_names_out()
        readable = np.array([is_name_word(str(t)) for t in terms], dtype=bool)
        k = len(weights)
        names = {}
        for old, new in enumerate(self.relabel_):
            others = (weights.sum(axis=0) - weights[old]) / max(k - 1, 1)
            contrast = np.where(readable, weights[old] - others, -np.inf)
            top = [t for t in np.argsort(-contrast, kind="stable")[: self.n_terms] if contrast[t] > 0]
            names[int(new)] = " ".join(str(terms[t]) for t in top) if len(top) >= 2 else None
        return dict(sorted(names.items()))

    # --- predict ------------------------------------------------------------------------------------------------------
    def _tfidf(self, texts: np.ndarray) -> sp.csr_matrix:
        """``vectorizer_.transform(texts)``, the same matrix, with the counting done by :func:`term_counts`."""
        from sklearn.preprocessing import normalize

        x = term_counts(texts, self.vocabulary_array_, self.vectorizer_)
        # TfidfTransformer.transform, step for step (sublinear tf, idf, l2), so the values are the same floats
        np.log(x.data, out=x.data)
        x.data += 1.0
        x.data *= self.vectorizer_.idf_[x.indices]
        return normalize(x, copy=False)

    def predict(self, texts: Sequence[str] | np.ndarray, progress: Callable[[int], None] | None = None) -> np.ndarray:
        """The cluster of each text (``k_`` for a text unlike every cluster), transformed ``chunk`` texts at a time;
        ``progress(n_done)`` after each chunk."""
        texts = np.asarray(texts, dtype=object)
        out = np.empty(len(texts), dtype=np.int64)
        for start in range(0, len(texts), self.chunk):
            part = texts[start : start + self.chunk]
            labels, sim = self._similarity(self._reduce(self._tfidf(part)))
            codes = self.relabel_[labels]
            codes[unlike_their_cluster(sim, labels, self.atypical_fence_, self.half_median_)] = self.k_
            out[start : start + len(part)] = codes
            if progress is not None:
                progress(start + len(part))
        return out


def typical_bounds(sim: np.ndarray, labels: np.ndarray, k: int) -> tuple[float, np.ndarray]:
    """``(fence, half_median)`` from the fitted texts' similarity to their centre (module docstring): the lower Tukey
    fence of all of them (Q1 - 1.5 IQR) and half of each cluster's median; ``-inf`` (nothing is atypical) with fewer
    than :data:`ATYPICAL_MIN_FIT` texts, and for a cluster with none."""
    half_median = np.full(k, -np.inf)
    if len(sim) < ATYPICAL_MIN_FIT:
        return -np.inf, half_median
    q1, q3 = np.quantile(sim, [0.25, 0.75])
    for c in range(k):
        mine = sim[labels == c]
        if len(mine):
            half_median[c] = 0.5 * float(np.median(mine))
    return float(q1 - 1.5 * (q3 - q1)), half_median


def unlike_their_cluster(sim: np.ndarray, labels: np.ndarray, fence: float, half_median: np.ndarray) -> np.ndarray:
    """Whether each text is atypical: its similarity under both the fence and its cluster's half-median (strictly:
    a text at either bound is its cluster's)."""
    return (sim < fence) & (sim < half_median[labels])


def _word_bytes(data: np.ndarray) -> np.ndarray:
    """Which ASCII bytes are ``\\w`` (letters, digits, underscore); uint8 comparisons, faster than a lookup table."""
    word = (data | 32) - 97 < 26  # a-z, A-Z (the wrap-around makes every other byte large)
    word |= data - 48 < 10
    word |= data == 95
    return word


def term_counts(texts: Sequence[str] | np.ndarray, vocabulary: pa.Array, vectorizer: TfidfVectorizer) -> sp.csr_matrix:
    """Counts of each ``vocabulary`` term (a pyarrow string array, index = column) in each text, as float32 CSR with
    sorted indices: what ``CountVectorizer.transform`` of ``vectorizer`` returns, for the default token pattern and
    lowercasing (TextClusterer's vectoriser).

    ASCII texts are tokenised on their bytes: a token is a maximal run of word bytes (within one text), runs of one
    byte never match a vocabulary term (all have two or more characters) and stop words are not in the vocabulary, so
    looking every run up in the vocabulary (``pyarrow.compute.index_in``, a hash lookup in C++) counts exactly the
    tokens scikit-learn keeps. Other texts are analysed by ``vectorizer.build_analyzer()``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import scipy.sparse as sp

    arr = pa.array(texts, pa.large_string())
    n = len(arr)
    ascii_rows = pc.string_is_ascii(arr).fill_null(True).to_numpy(zero_copy_only=False)
    other = np.flatnonzero(~ascii_rows)
    if len(other):
        arr = pc.if_else(pa.array(ascii_rows), arr, pa.scalar("", pa.large_string()))  # counted by the analyser
    arr = (arr.fill_null("") if arr.null_count else arr).cast(pa.large_string())  # 64-bit offsets, read below
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + n + 1]
    data = (
        np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
        if arr.buffers()[2] is not None
        else np.empty(0, np.uint8)
    )
    offsets = offsets - offsets[0]
    word = _word_bytes(data)
    # a run starts at a word byte whose predecessor is not one (or at a text's first byte), and ends likewise
    before = np.zeros_like(word)
    before[1:] = word[:-1]
    before[offsets[:-1][offsets[:-1] < len(word)]] = False
    starts = np.flatnonzero(word > before)
    after = before  # reused: one buffer fewer
    after[:-1] = word[1:]
    after[-1:] = False
    after[offsets[1:][offsets[1:] > 0] - 1] = False
    ends = np.flatnonzero(word > after)
    del before, after
    # the runs, lowercased, side by side in one buffer (the word bytes only): a string array without a copy per token
    token_offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(ends - starts + 1, out=token_offsets[1:])
    del ends
    kept = data[word]
    kept += ((kept - 65) < 26).view(np.uint8) << 5  # A-Z -> a-z (uint8 arithmetic wraps: other bytes stay)
    tokens = pa.LargeStringArray.from_buffers(len(starts), pa.py_buffer(token_offsets), pa.py_buffer(kept))
    cols = pc.index_in(tokens, value_set=vocabulary).fill_null(-1).to_numpy()
    known = cols >= 0
    # tokens come in text order, so a text's entries are the known tokens between its first token and the next text's
    known_before = np.zeros(len(known) + 1, dtype=np.int64)
    np.cumsum(known, out=known_before[1:])
    index_dtype = np.int32 if known_before[-1] < np.iinfo(np.int32).max else np.int64
    indptr = known_before[np.searchsorted(starts, offsets)].astype(index_dtype)
    x = sp.csr_matrix(
        (np.ones(int(known_before[-1]), dtype=np.float32), cols[known].astype(index_dtype), indptr),
        shape=(n, len(vocabulary)),
    )
    # duplicates (a term several times in a text) are summed, indices sorted: the canonical CSR scikit-learn builds
    x.sum_duplicates()
    if len(other):
        analyze, index = vectorizer.build_analyzer(), vectorizer.vocabulary_
        pairs = np.array(
            [(r, index[t]) for r in other.tolist() for t in analyze(texts[r]) if t in index], dtype=np.int64
        ).reshape(-1, 2)
        x = x + sp.csr_matrix((np.ones(len(pairs), dtype=np.float32), (pairs[:, 0], pairs[:, 1])), shape=x.shape)
    return x


#: Words a cluster is never named by, beyond scikit-learn's English stop words: function words, fillers, yes/no.
EXTRA_STOP_WORDS = frozenset(
    """
a about above after again against ain all am an and any are aren as at be because been before being below between
both but by can could couldn did didn do does doesn doing don down during each few for from further had hadn has
hasn have haven having he her here hers herself him himself his how i if in into is isn it its itself just ll me
might mightn more most must mustn my myself needn no nor not now of off on once only or other our ours ourselves out
over own re same shan she should shouldn so some such than that the their theirs them themselves then there these
they this those through to too under until up ve very was wasn we were weren what when where which while who whom
why will with won would wouldn you your yours yourself yourselves yes yeah ok okay also get got gets let lets like
make made many much one two three four five six seven eight nine ten zero
""".split()
)
_NAME_WORD = re.compile(r"[a-z][a-z'-]*[a-z]")


def is_name_word(term: str) -> bool:
    """A term a person reads as a word of the cluster: letters only (``w409`` or ``x_1`` are not), three letters
    or more, with a vowel, and no stop word."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return (
        len(term) >= 3
        and bool(_NAME_WORD.fullmatch(term))
        and any(v in term for v in "aeiouy")
        and term not in ENGLISH_STOP_WORDS
        and term not in EXTRA_STOP_WORDS
    )


def cluster_names(
    texts: np.ndarray, codes: np.ndarray, names: dict[int, str | None], labels: np.ndarray | None = None
) -> dict[int, str]:
    """Names a person can read: the distinctive words (or, where there are too few, the first words of the
    cluster's most typical text: its most common opening), plus the dominant label (``source``) when one holds
    most of the cluster."""
    unnamed = {c for c, name in names.items() if name is None}
    return named_clusters(names, opening_counts(texts, codes, unnamed), codes, labels)


def opening_counts(texts: np.ndarray, codes: np.ndarray, clusters: set[int]) -> Counter:
    """How often each opening (the first six words) starts a text of each of ``clusters``: ``{(cluster, opening):
    count}``; empty texts have none. Counted chunk by chunk and summed, it is the count over the whole table."""
    counts: Counter = Counter()
    for c in clusters:
        counts.update((c, " ".join(str(t).split()[:6])) for t in texts[codes == c] if str(t).strip())
    return counts


def named_clusters(
    names: dict[int, str | None], openings: Counter, codes: np.ndarray, labels: np.ndarray | None = None
) -> dict[int, str]:
    """:func:`cluster_names` from the counts of :func:`opening_counts`: a cluster without distinctive words is named
    by its most common opening (the first in sorted order among equals)."""
    best: dict[int, tuple[int, str]] = {}
    for (c, opening), n in openings.items():
        if c not in best or (-n, opening) < (-best[c][0], best[c][1]):
            best[c] = (n, opening)
    out = {}
    for c, name in names.items():
        members = np.flatnonzero(codes == c)
        if name is None:
            name = f"\u201c{best[c][1]}\u2026\u201d" if c in best else "(no words)"
        if labels is not None and len(members):
            counts = pd.Series(labels[members]).value_counts()
            if len(counts) and counts.iloc[0] >= 0.6 * len(members) and str(counts.index[0]) not in ("", "nan"):
                name = f"{name} ({counts.index[0]})"
        out[int(c)] = str(name)
    return out


def cluster_samples(
    samples: pd.DataFrame,
    k: int | None = None,
    cluster_by: str | None = None,
    max_fit: int = 20_000,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> tuple[pd.DataFrame, ClusterInfo]:
    """Return a copy of ``samples`` with ``cluster`` (int64) and ``cluster_name``, and how they were made.

    ``cluster_by`` names a label column (e.g. ``source``): one cluster per distinct label, numbered in sorted label
    order and named by the label. Otherwise the ``text`` column is clustered (``k`` given, or chosen). Samples with an
    empty text are clustered like any other (their vector is zero) only if some texts have words.
    """
    out = samples.copy()
    if cluster_by is not None:
        if cluster_by not in out.columns:
            raise ForensicsError(
                f"samples: --cluster-by column '{cluster_by}' is not there; it has "
                f"{', '.join(map(str, out.columns[:12]))}"
            )
        labels = out[cluster_by].astype("string").fillna("").astype(object).to_numpy()
        uniques, codes = np.unique(labels, return_inverse=True)
        out[CLUSTER] = codes.astype(np.int64)
        names = {i: (str(u) if u != "" else "(none)") for i, u in enumerate(uniques)}
        out[CLUSTER_NAME] = (
            pd.array([names[c] for c in range(len(uniques))], dtype="string")[codes]
            if len(uniques)
            else pd.array([], dtype="string")
        )
        return out, ClusterInfo(method=f"label:{cluster_by}", k=len(uniques), names=names)
    if TEXT not in out.columns:
        raise ForensicsError("samples: no 'text' column to cluster; pass --cluster-by COLUMN (e.g. source) or add text")
    labels = source_labels(out)
    texts = out[TEXT].astype("string").fillna("").astype(object).to_numpy()
    key = cluster_key(texts, k, max_fit, seed, labels)
    stored = stored_clusters(key, len(texts))
    if stored is not None:  # the same texts and settings were clustered before: the same clusters, read back
        codes, info = stored
        if progress is not None:
            progress(len(texts))
    else:
        model = TextClusterer(k, max_fit=max_fit, seed=seed).fit(texts)
        codes = model.predict(texts, progress=progress)
        names = with_atypical(model.names_, codes)
        info = ClusterInfo(
            method="text",
            k=len(names),
            names=cluster_names(texts, codes, names, labels),
            silhouettes=dict(model.silhouettes_),
        )
        store_clusters(key, codes, info.as_dict())
    return with_clusters(out, codes, info), info


def with_atypical(names: dict[int, str | None], codes: np.ndarray) -> dict[int, str | None]:
    """The fitted clusters' names, and :data:`ATYPICAL_NAME` after them when some text is unlike every cluster."""
    k = len(names)
    return {**names, k: ATYPICAL_NAME} if (np.asarray(codes) == k).any() else dict(names)


def source_labels(samples: pd.DataFrame) -> np.ndarray | None:
    """The samples' ``source`` labels as strings (a cluster's name carries its dominant one), None without them."""
    return samples[SOURCE].astype("string").fillna("").astype(object).to_numpy() if SOURCE in samples.columns else None


def with_clusters(out: pd.DataFrame, codes: np.ndarray, info: ClusterInfo) -> pd.DataFrame:
    """``out`` (changed in place) with each sample's ``cluster`` and ``cluster_name``."""
    out[CLUSTER] = codes
    out[CLUSTER_NAME] = pd.array([info.names[c] for c in range(info.k)], dtype="string")[codes]
    return out


def stored_clusters(key: str, n: int) -> tuple[np.ndarray, ClusterInfo] | None:
    """A cache entry that makes sense (every code names a cluster), else None: the texts are clustered again."""
    stored = load_clusters(key, n)
    if stored is None:
        return None
    try:
        info = ClusterInfo.from_dict(stored[1])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    codes = stored[0]
    if len(codes) and (codes.min() < 0 or codes.max() >= info.k or set(range(info.k)) - set(info.names)):
        return None
    return codes, info
