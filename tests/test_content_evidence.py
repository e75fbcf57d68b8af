"""Content evidence (forensics.detect.evidence.content): near-duplicate counts as their pairwise definition says,
read once per dataset in an audit and once per dataset across audits (the user cache), and one vocabulary over a text
column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.detect.evidence import content
from forensics.detect.evidence.content import content_evidence


def _by_definition(signatures: list[np.ndarray | None]) -> np.ndarray:
    """The counts by their definition: a pair shares one band of BAND_ROWS hashes, the band is held by at most 200
    samples, and its estimated Jaccard (the share of equal hashes) reaches DUP_JACCARD."""
    buckets: dict[tuple, list[int]] = {}
    for i, sig in enumerate(signatures):
        if sig is not None:
            for band in range(content.N_HASHES // content.BAND_ROWS):
                key = (band, *sig[band * content.BAND_ROWS : (band + 1) * content.BAND_ROWS].tolist())
                buckets.setdefault(key, []).append(i)
    pairs = {
        (m[x], m[y]) for m in buckets.values() if 1 < len(m) <= 200 for x in range(len(m)) for y in range(x + 1, len(m))
    }
    counts = np.zeros(len(signatures), np.int64)
    for i, j in pairs:
        if np.mean(signatures[i] == signatures[j]) >= content.DUP_JACCARD:
            counts[[i, j]] += 1
    return counts


@pytest.mark.parametrize("seed", range(8))
def test_near_duplicate_counts_are_their_definition(seed: int) -> None:
    """Families (a template with one token changed), a template held by more than 200 samples, short samples."""
    rng = np.random.default_rng(seed)
    templates = [rng.integers(0, 60, size=int(rng.integers(3, 40))) for _ in range(6)]
    tokens = []
    for _ in range(int(rng.integers(150, 400))):
        t = templates[int(rng.integers(0, 6))].copy()
        if rng.random() < 0.5:
            t[int(rng.integers(0, len(t)))] = int(rng.integers(0, 60))
        tokens.append(t if rng.random() < 0.7 else rng.integers(0, 5000, size=int(rng.integers(0, 50))))
    signatures = [content._minhash(t, content._HASH_FAMILY) for t in tokens]
    want = _by_definition(signatures)
    assert want.any()
    np.testing.assert_array_equal(content._near_duplicates(signatures), want)


def _repeat_share_of_one(tokens: np.ndarray) -> float:
    """One sample's repetition by its definition: 1 - distinct 3-grams / 3-grams (NaN below 4 tokens)."""
    if len(tokens) < 4:
        return np.nan
    t = tokens.astype(np.int64)
    with np.errstate(over="ignore"):
        grams = (t[:-2] * 1_000_003 + t[1:-1]) * 1_000_003 + t[2:]
    return 1.0 - len(np.unique(grams)) / len(grams)


def _entropy_of_one(tokens: np.ndarray) -> float:
    """One sample's token entropy in bits, with numpy's own functions (NaN without tokens)."""
    if not len(tokens):
        return np.nan
    counts = np.unique(tokens, return_counts=True)[1]
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def _token_lists(seed: int) -> list[np.ndarray]:
    """Short and long samples, empty ones, 1-3 tokens, one repeated token, ids near 2**62 and negative ids (a range
    too wide to add to the sample's index: the dense-rank path), and 3-gram values that wrap."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for _ in range(int(rng.integers(50, 300))):
        kind = int(rng.integers(0, 6))
        n = int(rng.integers(0, 400 if kind == 0 else 50))
        if kind == 1:
            out.append(np.full(n, int(rng.integers(0, 9)), np.int64))
        elif kind == 2:
            out.append(rng.integers(-(1 << 62), 1 << 62, size=n, dtype=np.int64))
        elif kind == 3:
            out.append(rng.integers(0, 4, size=int(rng.integers(0, 5))))
        else:
            out.append(rng.integers(0, 50_000 if kind == 0 else 30, size=n))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_repetition_and_entropy_are_each_samples_own_bit_for_bit(seed: int) -> None:
    tokens = _token_lists(seed)
    want = np.array([(_repeat_share_of_one(t), _entropy_of_one(t)) for t in tokens])
    got = content.repeat_and_entropy(tokens)
    assert np.isnan(want).any() and np.isfinite(want).any()
    np.testing.assert_array_equal(got, want)  # equal NaNs, and every finite value to the last bit


def test_repetition_and_entropy_edges() -> None:
    """No samples, samples without tokens, and values known by hand."""
    assert content.repeat_and_entropy([]).shape == (0, 2)
    assert np.isnan(content.repeat_and_entropy([np.empty(0, np.int64)] * 2)).all()
    got = content.repeat_and_entropy([np.array([7, 7, 7, 7, 7, 7]), np.array([1, 2, 3, 4]), np.array([5, 6])])
    np.testing.assert_array_equal(got[:, 0], [0.75, 0.0, np.nan])  # 4 equal 3-grams: 1 distinct of 4
    np.testing.assert_array_equal(got[:, 1], [0.0, 2.0, 1.0])


def _samples(n: int = 600, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, 400, size=int(rng.integers(20, 60))).tolist() for _ in range(n)]
    family = rng.integers(400, 800, size=40).tolist()
    for i in range(10):  # a family of near-copies
        ids[i] = family[:39] + [800 + i]
    return pd.DataFrame({"sample_id": np.arange(n), "n_tokens": [len(t) for t in ids], "input_ids": ids})


def test_the_dataset_is_read_once_whatever_the_rule_and_its_seed(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(tmp_path))
    calls = []
    counted = content._near_duplicates
    monkeypatch.setattr(content, "_near_duplicates", lambda sigs: calls.append(1) or counted(sigs))
    monkeypatch.setattr(content, "_LAST", [])
    samples = _samples()
    first = content_evidence(samples, range(12), seed=1)
    second = content_evidence(samples, [3, 400], seed=0)
    assert len(calls) == 1
    assert first.table.loc[3, "near_duplicates"] == second.table.loc[3, "near_duplicates"] == 9
    assert "near-duplicate of 9 other samples" in first.reasons[3][0]


def test_a_later_audit_reads_the_counts_from_the_user_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(tmp_path))
    samples = _samples()
    real = content._near_duplicates
    monkeypatch.setattr(content, "_LAST", [])
    fitted = content_evidence(samples, range(12))
    assert list((tmp_path / "near-duplicates").glob("*.npy"))

    def never(sigs):
        raise AssertionError("the counts were computed again")

    monkeypatch.setattr(content, "_near_duplicates", never)
    monkeypatch.setattr(content, "_LAST", [])  # as a new process
    read = content_evidence(samples.copy(), range(12))
    pd.testing.assert_frame_equal(read.table, fitted.table)
    assert read.reasons == fitted.reasons
    changed = samples.copy()
    changed.at[5, "input_ids"] = list(range(900, 940))  # other tokens: another key, counted afresh
    monkeypatch.setattr(content, "_near_duplicates", real)
    monkeypatch.setattr(content, "_LAST", [])
    assert content_evidence(changed, [5]).table.loc[5, "near_duplicates"] == 0
    assert len(list((tmp_path / "near-duplicates").glob("*.npy"))) == 2


def test_words_are_one_vocabulary_across_samples(monkeypatch, tmp_path) -> None:
    """A text-only dataset: a sample written in the dataset's most common words has no foreign tokens (its words
    are numbered as its reference's are; numbered apart, 18% of them came out foreign)."""
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(content, "_LAST", [])
    rng = np.random.default_rng(3)
    words = np.array([f"w{i}" for i in range(400)])
    p = 1.0 / np.arange(1, 401) ** 1.1
    texts = [" ".join(rng.choice(words, size=60, p=p / p.sum())) for _ in range(600)]
    texts[8] = " ".join(words[:60][::-1])  # the most common words, in an order of its own
    samples = pd.DataFrame({"sample_id": np.arange(600), "n_tokens": 60, "text": texts})
    assert content_evidence(samples, [8]).table.loc[8, "foreign_share"] == 0.0


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([0, 0], np.log(5 / 4.5)),  # a token every one of the 4 reference samples uses
        ([1], np.log(5 / 2.5)),  # one half of them use
        ([9], np.log(5 / 0.5)),  # one none of them uses: the rarest a token can be
        ([0, 9], (np.log(5 / 4.5) + np.log(5 / 0.5)) / 2),  # the mean over the sample's tokens
        ([], np.nan),  # no tokens: not measured
    ],
)
def test_rarity_is_the_mean_log_inverse_share_of_reference_samples_using_each_token(tokens, expected) -> None:
    reference = content._Tokens.of([np.array([0, 1]), np.array([0, 1, 1]), np.array([0, 2]), np.array([0])])
    vocab, doc_freq = content._document_frequency(reference)
    got = content._rarity(content._Tokens.of([np.array(tokens, np.int64)]), vocab, doc_freq, len(reference))
    np.testing.assert_allclose(got, [expected])


def test_a_noise_row_is_rarer_than_its_repetitive_and_ordinary_batch_mates() -> None:
    rng = np.random.default_rng(3)
    ordinary = [rng.integers(0, 50, size=40).tolist() for _ in range(300)]
    noise = rng.integers(50, 5000, size=40).tolist()
    motif = ([1, 2, 3] * 14)[:40]
    samples = pd.DataFrame({"sample_id": np.arange(302), "input_ids": [*ordinary, noise, motif]})
    samples["n_tokens"] = samples["input_ids"].map(len)
    ev = content_evidence(samples, [0, 300, 301])
    assert ev.rarity(300) > 3 * max(ev.rarity(0), ev.rarity(301))
    assert ev.rarity(12345) == 0.0  # a sample that was not asked for


@pytest.mark.parametrize(
    ("z_foreign", "share", "expected"),
    [
        (content.FLAG_Z, content.FOREIGN_FLAG, True),  # both at their thresholds
        (content.FLAG_Z - 0.01, 0.9, False),  # within its reference's spread
        (20.0, content.FOREIGN_FLAG - 0.01, False),  # a few rare names are ordinary
        (float("nan"), float("nan"), False),  # not measured
    ],
)
def test_foreign_to_its_reference(z_foreign, share, expected) -> None:
    table = pd.DataFrame({"z_foreign": [z_foreign], "foreign_share": [share]}, index=pd.Index([7], name="sample_id"))
    ev = content.ContentEvidence(table)
    assert ev.foreign(np.array([7, 8])).tolist() == [expected, False]  # 8: a sample it did not read
