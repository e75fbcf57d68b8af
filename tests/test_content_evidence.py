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
                key = (band, *sig[band * content.BAND_ROWS:(band + 1) * content.BAND_ROWS].tolist())
                buckets.setdefault(key, []).append(i)
    pairs = {(m[x], m[y]) for m in buckets.values() if 1 < len(m) <= 200
             for x in range(len(m)) for y in range(x + 1, len(m))}
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
