"""The fitted-cluster cache (forensics.tagging.cluster_cache) and the scipy.special tail probabilities in
forensics.stats: a second clustering of the same texts is read back, not fitted, and equals the fit; anything else
(another text, another k, a damaged entry, the cache turned off, a folder that cannot be written) fits afresh."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from forensics.cache import CACHE_ENV, NO_CACHE_ENV
from forensics.stats import binom_sf, hypergeom_sf, t_ppf, t_sf
from forensics.tagging import cluster_samples
from forensics.tagging.clusters import TextClusterer


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    return tmp_path / "cache"


@pytest.fixture()
def samples():
    rng = np.random.default_rng(0)
    words = {
        "math": "integral derivative matrix vector proof lemma",
        "code": "python function class return loop",
        "food": "recipe flour butter oven bake sugar",
    }
    rows = []
    for i in range(600):
        topic = list(words)[i % 3]
        pick = rng.choice(words[topic].split(), 5)
        rows.append({"sample_id": i, "text": " ".join(pick), "source": topic})
    return pd.DataFrame(rows)


def _fits(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = TextClusterer.fit

    def counting(self, texts):
        calls.append(len(texts))
        return real(self, texts)

    monkeypatch.setattr(TextClusterer, "fit", counting)
    return calls


def test_the_same_texts_are_read_back_not_fitted(cache, samples, monkeypatch):
    calls = _fits(monkeypatch)
    first, info = cluster_samples(samples, k=None, seed=0)
    done: list[int] = []
    second, info2 = cluster_samples(samples, k=None, seed=0, progress=done.append)
    assert calls == [600]  # fitted once
    assert second["cluster"].tolist() == first["cluster"].tolist()
    assert second["cluster_name"].tolist() == first["cluster_name"].tolist()
    assert (info2.method, info2.k, info2.names, info2.silhouettes) == (
        info.method,
        info.k,
        info.names,
        info.silhouettes,
    )
    assert info.k == 3 and done == [600]
    assert len(list((cache / "clusters").glob("text-*.npz"))) == 1


def test_another_text_or_setting_is_a_new_fit(cache, samples, monkeypatch):
    calls = _fits(monkeypatch)
    cluster_samples(samples, k=None, seed=0)
    changed = samples.copy()
    changed.loc[5, "text"] = changed.loc[5, "text"] + " oven"
    cluster_samples(changed, k=None, seed=0)
    cluster_samples(samples, k=2, seed=0)
    cluster_samples(samples, k=None, seed=1)
    assert calls == [600] * 4
    assert len(list((cache / "clusters").glob("text-*.npz"))) == 4


def test_a_damaged_entry_is_fitted_again(cache, samples, monkeypatch):
    first, _ = cluster_samples(samples, k=None, seed=0)
    (entry,) = (cache / "clusters").glob("text-*.npz")
    good = entry.read_bytes()
    calls = _fits(monkeypatch)
    third = len(good) // 3
    flipped = good[:third] + bytes([good[third] ^ 1]) + good[third + 1 :]
    for damaged in (b"", b"half a file", good[: len(good) // 2], flipped):
        entry.write_bytes(damaged)  # empty, not an archive, cut short, one bit flipped
        again, _ = cluster_samples(samples, k=None, seed=0)
        assert again["cluster"].tolist() == first["cluster"].tolist()
    assert calls == [600] * 4
    calls.clear()
    calls.append(600)
    bad = dict(np.load(entry, allow_pickle=False))
    np.savez(entry, codes=bad["codes"] + 7, info=bad["info"])  # codes naming no cluster
    third, _ = cluster_samples(samples, k=None, seed=0)
    assert calls == [600, 600] and third["cluster"].tolist() == first["cluster"].tolist()


def test_turned_off_or_unwritable_it_only_costs_the_fit(cache, samples, monkeypatch, tmp_path):
    calls = _fits(monkeypatch)
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    cluster_samples(samples, k=None, seed=0)
    cluster_samples(samples, k=None, seed=0)
    assert calls == [600, 600] and not cache.exists()
    monkeypatch.delenv(NO_CACHE_ENV)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker))
    out, info = cluster_samples(samples, k=None, seed=0)
    assert calls == [600] * 3 and info.k == 3 and os.path.isfile(blocker)


def test_tail_probabilities_equal_scipy_stats():
    rng = np.random.default_rng(1)
    k = rng.integers(-1, 14, 200)
    p = rng.uniform(0.0, 1.0, 200)
    np.testing.assert_allclose(binom_sf(k, 12, p), stats.binom.sf(k - 1, 12, p), rtol=1e-10, atol=1e-15)
    succ = rng.integers(0, 400, 200)
    kk = rng.integers(0, 12, 200)
    np.testing.assert_allclose(
        hypergeom_sf(kk, 5000, succ, 30), stats.hypergeom.sf(kk - 1, 5000, succ, 30), rtol=1e-9, atol=1e-300
    )
    for x, dof in ((0.3, 2), (2.1, 7), (-1.5, 30), (8.0, 4)):
        assert t_sf(x, dof) == pytest.approx(stats.t.sf(x, dof), rel=1e-10)
    for q, dof in ((0.975, 3), (0.5, 9), (0.01, 40)):
        assert t_ppf(q, dof) == pytest.approx(stats.t.ppf(q, dof), rel=1e-10)
