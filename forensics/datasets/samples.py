"""Synthetic training samples whose length and content are correlated, as in the story's drafter dataset.

Each sample has a ``source`` (the ground-truth content label), a token count ``n_tokens`` and a short ``text``
snippet. The mix of sources depends on length because each source draws its length from its own log-normal
distribution: short samples are mostly simple QA, the long tail is mostly code (:data:`SOURCES`). Lengths are whole
numbers clipped to ``[MIN_TOKENS, MAX_LEN]``, so equal lengths (ties) are common, as in real tokenised data, and the
samples truncated at ``max_len`` form one large tie at 8192.

The text of a sample is tens of words: a source-specific opening word, then words drawn from the source's own
vocabulary (with probability :data:`OWN_WORD_SHARE`) or from a filler vocabulary shared by every source. That keeps
the sources recoverable from text alone (TF-IDF + k-means finds them) while the snippets still share words, as
real text does.

:func:`corrupt_text` writes the near-duplicate, corrupted code snippets of the demo's bad samples: one scraped file
with a run of ``<|endoftext|>`` tokens and replacement characters, differing only by a few words between copies.

Everything is vectorised with numpy and driven by one ``numpy.random.Generator``, so the same seed gives the same
table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from forensics.schema import MAX_LEN, N_TOKENS, SAMPLE_ID, SOURCE, TEXT

MIN_TOKENS = 16
#: Share of a snippet's words taken from its source's own vocabulary (the rest are shared filler).
OWN_WORD_SHARE = 0.8
WORDS_PER_TEXT = (18, 40)  # inclusive range of words in one snippet


@dataclass(frozen=True)
class Source:
    """One content source: its share of samples, its length distribution and its words."""

    name: str
    weight: float  # share of samples
    median_tokens: float  # median of the log-normal length distribution
    sigma: float  # log-space spread
    opener: str  # first word of every snippet of this source
    vocabulary: tuple[str, ...]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


#: The sources of the demo dataset, shortest first. Weights and medians are chosen so that greedy packing under the
#: 16,384-token budget gives ~45% padding efficiency for a random order against ~100% sorted (the story's ~12K vs
#: ~30K tok/s), and so that no source holds more than ~30% of the samples (k-means on the text finds balanced sources
#: more reliably).
SOURCES: tuple[Source, ...] = (
    Source(
        "qa",
        0.30,
        150.0,
        0.75,
        "Question:",
        _words(
            "capital country river mountain population largest smallest year founded author wrote invented who what "
            "where when which city ocean continent language currency president planet element discovered height "
            "longest oldest famous painter museum border island desert national flag anthem tallest nearest"
        ),
    ),
    Source(
        "chat",
        0.26,
        300.0,
        0.8,
        "User:",
        _words(
            "hello thanks please help feel recommend weekend friend advice trip plan favourite movie music dinner "
            "recipe birthday gift email sorry appreciate suggestion hobby tonight coffee morning weather holiday "
            "restaurant playlist chat mood relax stressed excited"
        ),
    ),
    Source(
        "summarization",
        0.12,
        1450.0,
        0.4,
        "Summarize:",
        _words(
            "article report summary paragraph key points findings study researchers announced according quarterly "
            "revenue policy government meeting committee outlined highlights conclusion overview analysts published "
            "statement document briefly main argument survey participants agency"
        ),
    ),
    Source(
        "math",
        0.12,
        1000.0,
        0.5,
        "Solve:",
        _words(
            "equation integer prime derivative integral triangle angle probability solve prove theorem lemma "
            "polynomial matrix vector sum product fraction remainder modulo factor root inequality sequence series "
            "geometric arithmetic circle radius hypotenuse"
        ),
    ),
    Source(
        "code",
        0.20,
        2600.0,
        0.8,
        "def",
        _words(
            "function return class import self args kwargs list dict tensor loop index array parse config module "
            "exception raise yield async await lambda buffer string bytes iterator decorator compile thread socket "
            "struct pointer null"
        ),
    ),
)

SOURCE_NAMES: tuple[str, ...] = tuple(s.name for s in SOURCES)

#: Words every source uses (articles, verbs, glue): they make snippets overlap, as real text does.
FILLER_WORDS: tuple[str, ...] = _words(
    "the a an of to and in is it that for on with as this be are was by at from or have not can will all we "
    "you they one more also into some use make how each new time like just about first get"
)

#: The distinctive pattern of the corrupted near-duplicates (a scrape gone wrong).
CORRUPT_PATTERN = "<|endoftext|> <|endoftext|> \ufffd\ufffd\ufffd"


#: The scraped file the corrupted near-duplicates copy (each copy changes two of its words).
CORRUPT_FILE: tuple[str, ...] = (
    "def",
    "parse_config",
    "(",
    "self",
    ",",
    "buffer",
    ")",
    ":",
    "return",
    "self",
    ".",
    "module",
    "(",
    "buffer",
    ")",
    CORRUPT_PATTERN,
    "import",
    "struct",
    "bytes",
    "iterator",
    CORRUPT_PATTERN,
    "raise",
    "exception",
    "null",
    "pointer",
)


def sample_lengths_and_sources(
    n: int, rng: np.random.Generator, max_len: int = MAX_LEN
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` whole-number lengths in ``[MIN_TOKENS, max_len]`` and the source index of each (into :data:`SOURCES`)."""
    weights = np.array([s.weight for s in SOURCES])
    source = rng.choice(len(SOURCES), size=n, p=weights / weights.sum())
    mu = np.log(np.array([s.median_tokens for s in SOURCES]))[source]
    sigma = np.array([s.sigma for s in SOURCES])[source]
    lengths = np.rint(np.exp(rng.normal(mu, sigma))).astype(np.int64)
    return np.clip(lengths, MIN_TOKENS, max_len).astype(np.int32), source.astype(np.int64)


def snippet_texts(source: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One snippet per sample: the source's opening word, then own-vocabulary and filler words (vectorised)."""
    n = len(source)
    lo, hi = WORDS_PER_TEXT
    n_words = rng.integers(lo, hi + 1, size=n)
    width = hi
    vocab_sizes = np.array([len(s.vocabulary) for s in SOURCES])
    own = rng.random((n, width)) < OWN_WORD_SHARE
    own_pick = (rng.random((n, width)) * vocab_sizes[source][:, None]).astype(np.int64)
    filler_pick = rng.integers(0, len(FILLER_WORDS), size=(n, width))
    # one flat word table: each source's vocabulary, then the filler words
    offsets = np.concatenate([[0], np.cumsum(vocab_sizes)])
    table = np.array([w for s in SOURCES for w in s.vocabulary] + list(FILLER_WORDS), dtype=object)
    idx = np.where(own, offsets[source][:, None] + own_pick, offsets[-1] + filler_pick)
    words = table[idx]
    openers = np.array([s.opener for s in SOURCES], dtype=object)[source]
    return np.array([op + " " + " ".join(row[:k]) for op, row, k in zip(openers, words, n_words)], dtype=object)


def make_samples(n: int, seed: int, max_len: int = MAX_LEN) -> pd.DataFrame:
    """The samples table (``sample_id``, ``n_tokens``, ``source``, ``text``) of ``n`` samples, ids ``0..n-1``.

    A prefix of a larger table with the same seed is *not* the smaller table; use :func:`samples_from_pool` to take
    prefixes of one draw.
    """
    rng = np.random.default_rng([int(seed), 101])
    lengths, source = sample_lengths_and_sources(n, rng, max_len)
    return samples_from_pool(lengths, source, n, rng)


def samples_from_pool(lengths: np.ndarray, source: np.ndarray, n: int, rng: np.random.Generator) -> pd.DataFrame:
    """The first ``n`` samples of a drawn pool of lengths and sources, with text snippets drawn from ``rng``."""
    source = source[:n]
    return pd.DataFrame(
        {
            SAMPLE_ID: np.arange(n, dtype=np.int64),
            N_TOKENS: lengths[:n].astype(np.int32),
            SOURCE: np.array(SOURCE_NAMES, dtype=object)[source],
            TEXT: snippet_texts(source, rng),
        }
    )


def corrupt_text(count: int, rng: np.random.Generator) -> list[str]:
    """``count`` near-duplicate corrupted code snippets: one file, a few words changed per copy."""
    code = next(s for s in SOURCES if s.name == "code")
    base = list(CORRUPT_FILE)
    out = []
    for _ in range(count):
        words = list(base)
        for pos in rng.choice(np.arange(9, len(words)), size=2, replace=False):
            if words[pos] != CORRUPT_PATTERN:
                words[pos] = code.vocabulary[int(rng.integers(len(code.vocabulary)))]
        out.append(" ".join(words))
    return out
