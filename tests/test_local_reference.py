"""The reference a sample's effect is estimated against: each content cluster's level refitted on the rows around
each step, so the gap between two types' learning curves may move over the run."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from forensics.detect.evidence.local_reference import (
    MIN_CLUSTER_SHARE,
    cluster_token_shares,
    local_residuals,
    relative_noise,
)
from forensics.stats import rolling_median


def _parting_run(n: int = 900, run_length: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Log loss of a length-grouped run serving runs of one content type at a time: type A's loss falls from 3.0 to
    1.0, type B's from 3.0 to 2.4 (their learning curves part), 2% noise; the token shares of the two types."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / n
    kind = (np.arange(n) // run_length + rng.integers(0, 2)) % 2
    a, b = 3.0 - 2.0 * t, 3.0 - 0.6 * t
    y = np.log(np.where(kind == 0, a, b)) + 0.02 * rng.standard_normal(n)
    return y, np.column_stack([kind == 0, kind == 1]).astype(np.float64)


@pytest.mark.parametrize("seed", range(4))
def test_each_types_level_follows_its_own_learning_curve(seed):
    """A whole-run median leaves the types' parting gap in the residuals (0.3 or more); the local fit leaves noise."""
    y, shares = _parting_run(seed=seed)
    r, _ = local_residuals(y, shares, half_window=100)
    central = slice(100, -100)
    assert np.median(np.abs((y - rolling_median(y, 101))[central])) > 0.2
    assert np.quantile(np.abs(r[central]), 0.95) < 0.06


@pytest.mark.parametrize(("factor", "at"), [(2.5, 450), (1.5, 451), (3.0, 120)])
def test_a_spiked_step_keeps_its_excess(factor, at):
    y, shares = _parting_run(seed=1)
    spiked = y.copy()
    spiked[at] += np.log(factor)
    r, _ = local_residuals(spiked, shares, half_window=100)
    assert r[at] == pytest.approx(np.log(factor), abs=0.06)


def test_a_cluster_with_one_row_in_the_window_does_not_fit_its_own_spike():
    """One step of type B among type A, 3x higher: the ridge pulls B's level to the window's, so the step's excess
    stays in its residual instead of B's coefficient."""
    n = 400
    y = np.log(np.full(n, 2.0))
    shares = np.column_stack([np.ones(n), np.zeros(n)])
    shares[200] = [0.0, 1.0]
    y[200] += np.log(3.0)
    r, _ = local_residuals(y, shares, half_window=100)
    assert r[200] > 0.9 * np.log(3.0)


@pytest.mark.parametrize(
    ("share", "is_column"),
    [(MIN_CLUSTER_SHARE, True), (MIN_CLUSTER_SHARE - 0.01, False), (0.5, True)],
)
def test_a_cluster_is_a_column_only_at_its_least_share_of_the_samples(share, is_column):
    n = 1000
    small = int(round(share * n))
    clusters = np.r_[np.zeros(n - small), np.ones(small)]
    w = sp.csr_matrix(np.eye(n))
    got = cluster_token_shares(w, clusters)
    assert got.shape[1] == (2 if is_column else 1)


def test_samples_without_a_cluster_give_no_column():
    w = sp.csr_matrix(np.eye(3))
    assert cluster_token_shares(w, np.array([np.nan, -1.0, np.nan])).shape == (3, 0)


@pytest.mark.parametrize(
    ("noise", "want"),
    [
        ([1.0, 2.0, 4.0], [0.5, 1.0, 2.0]),
        ([1.0, 1.0, 100.0], [1.0, 1.0, 4.0]),  # clipped above
        ([1.0, 1.0, 0.01], [1.0, 1.0, 0.25]),  # and below
        ([np.nan, 2.0, 2.0], [1.0, 1.0, 1.0]),  # unknown: the median
        ([np.nan, np.nan, 0.0], [1.0, 1.0, 1.0]),  # none known
    ],
)
def test_relative_noise(noise, want):
    assert relative_noise(np.array(noise)) == pytest.approx(want)
