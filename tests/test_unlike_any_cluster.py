"""Texts unlike every content cluster: the clustering gives them a cluster of their own, a step's composition
expects it from the samples the fit knows, and a listed harmful sample whose text is unlike every cluster ranks
before clean batch-mates the run cannot tell apart from it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from forensics.detect.evidence.content import atypical_ids
from forensics.detect.evidence.expected_loss import CompositionExpectation, composition_features, fit_composition
from forensics.detect.evidence.sample_effects import _pursuit
from forensics.schema import ATYPICAL_CLUSTER
from forensics.tagging import cluster_samples
from forensics.tagging.clusters import ATYPICAL_MIN_FIT, typical_bounds, unlike_their_cluster


@pytest.mark.parametrize(
    ("sim", "label", "atypical"),
    [
        (0.10, 0, True),  # under the fence (0.2) and under cluster 0's half-median (0.4)
        (0.20, 0, False),  # at the fence: typical
        (0.19, 0, True),
        (0.15, 1, False),  # under the fence, but cluster 1's half-median is 0.15: at it, typical
        (0.14, 1, True),
        (0.30, 0, False),  # under the half-median only
    ],
)
def test_a_text_is_atypical_only_under_both_the_fence_and_its_clusters_half_median(sim, label, atypical):
    out = unlike_their_cluster(np.array([sim]), np.array([label]), 0.2, np.array([0.4, 0.15]))
    assert bool(out[0]) is atypical


@pytest.mark.parametrize(("n", "judged"), [(ATYPICAL_MIN_FIT - 1, False), (ATYPICAL_MIN_FIT, True)])
def test_the_bounds_need_enough_fitted_texts(n, judged):
    sim = np.linspace(0.5, 1.0, n)
    sim[0] = 0.0
    fence, half = typical_bounds(sim, np.zeros(n, np.int64), 2)
    assert bool(np.isfinite(fence)) is judged
    assert half[1] == -np.inf  # a cluster without fitted texts judges nothing
    if judged:
        q1, q3 = np.quantile(sim, [0.25, 0.75])
        assert fence == pytest.approx(q1 - 1.5 * (q3 - q1)) and half[0] == pytest.approx(0.5 * np.median(sim))


def _texts(rng: np.random.Generator, n_noise: int) -> tuple[list[str], list[int]]:
    """Two content types of 200 texts each (their own words) and ``n_noise`` rows of words neither uses."""
    a = [f"alpha{i}" for i in range(12)]
    b = [f"beta{i}" for i in range(12)]
    noise = [f"zz{i}q" for i in range(400)]
    texts = [" ".join(rng.choice(a, 20)) for _ in range(200)] + [" ".join(rng.choice(b, 20)) for _ in range(200)]
    texts += [" ".join(rng.choice(noise, 25)) for _ in range(n_noise)]
    order = rng.permutation(len(texts))
    texts = [texts[i] for i in order]
    return texts, sorted(int(np.flatnonzero(order == 400 + k)[0]) for k in range(n_noise))


@pytest.mark.parametrize("n_noise", [0, 6])
def test_rows_of_noise_words_get_the_cluster_of_texts_unlike_any_other(n_noise, monkeypatch):
    monkeypatch.setenv("FORENSICS_NO_CACHE", "1")
    texts, noise = _texts(np.random.default_rng(0), n_noise)
    samples = pd.DataFrame({"sample_id": np.arange(len(texts)), "n_tokens": 20, "text": texts})
    out, info = cluster_samples(samples, k=2)
    if not n_noise:
        assert info.k == 2 and ATYPICAL_CLUSTER not in info.names.values() and not atypical_ids(out)
        return
    assert info.k == 3 and info.names[2] == ATYPICAL_CLUSTER
    assert sorted(out.loc[out["cluster"] == 2, "sample_id"]) == noise
    assert atypical_ids(out) == set(noise)


def _two_types(n: int, rng: np.random.Generator) -> tuple[pd.DataFrame, np.ndarray]:
    """Steps of 2 samples of type 0 or 1 (type 1's loss 2x); every 25th step holds one type-0 sample and one of a
    rare third cluster (4% of the steps), whose loss is 2.5x."""
    kind = rng.integers(0, 2, n)
    odd = np.arange(n) % 25 == 24
    kind[odd] = 0
    share = np.zeros((n, 3))
    share[np.arange(n), kind] = 1.0
    share[odd] = [0.5, 0.0, 0.5]
    tags = pd.DataFrame({"step": np.arange(n), "n_samples": 2})
    for c in range(3):
        tags[f"cluster_share_{c}"] = share[:, c]
    loss = np.where(kind == 1, 2.0, 1.0) * np.where(odd, (1.0 + 2.5) / 2, 1.0)
    return tags, loss * np.exp(0.01 * rng.standard_normal(n))


def test_a_step_is_expected_from_the_clusters_the_fit_knows():
    """The rare cluster predicts nothing (under 5% of the steps): its step is expected as its known type-0 half,
    not as "less of every known type" (which would lift it towards the run's average)."""
    tags, loss = _two_types(600, np.random.default_rng(0))
    factors = CompositionExpectation(tags).factors(tags["step"].to_numpy(), loss)
    late = np.arange(600) >= 300
    pure0 = late & (tags["cluster_share_0"] == 1.0).to_numpy()
    odd = late & (tags["cluster_share_2"] > 0).to_numpy()
    assert np.median(factors[odd]) == pytest.approx(np.median(factors[pure0]), rel=0.02)


def test_the_fit_keeps_the_supported_clusters_and_rescales_their_shares():
    tags, loss = _two_types(600, np.random.default_rng(1))
    x, owner = composition_features(tags)
    assert list(x.columns) == ["cluster_share_0", "cluster_share_1", "cluster_share_2", "log_samples"]
    fit = fit_composition(x.to_numpy(), np.log(loss), owner)
    assert [x.columns[j] for j in fit.columns] == ["cluster_share_0", "cluster_share_1"]
    half = np.array([[0.5, 0.0, 0.5, np.log(2)]])
    whole = np.array([[1.0, 0.0, 0.0, np.log(2)]])
    assert fit.predict(half)[0] == pytest.approx(fit.predict(whole)[0])
    assert fit.predict(np.array([[0.0, 0.0, 1.0, np.log(2)]]))[0] == 0.0  # nothing known: the trend alone


@pytest.mark.parametrize(("excess", "taken"), [(2.9, True), (2.0, False)])
def test_a_sample_with_content_evidence_is_judged_among_its_own_family(excess, taken):
    """The stopping score of the content family is a chance score over its own size (4 samples: 2.24), not over all
    samples of the plan (400: 3.48): a flagged sample scoring 2.9 is taken, one at 2.0 is not."""
    n = 400  # steps, one sample each
    w = sp.identity(n, format="csr")
    r = np.tile([-1.0, 1.0], n // 2)  # residuals of median 0 and MAD 1: a robust SD of 1.4826
    sigma = 1.4826
    r[7] = excess * sigma
    first = np.zeros(n, bool)
    first[[3, 7, 11, 19]] = True
    beta = _pursuit(w, r, max_pursuit=10, first=first)
    assert bool(beta[7] > 0) is taken
