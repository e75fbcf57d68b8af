"""The compiled rolling median (forensics.stats.fenwick_median) is pandas' ``rolling(...).median()``, bit for bit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.stats.fenwick_median import rolling_median

VALUES = st.lists(
    st.one_of(
        st.floats(-1e6, 1e6, allow_nan=False),
        st.just(np.nan),
        st.just(np.inf),
        st.just(-np.inf),
        st.sampled_from([0.0, 1.0, 1.5]),
    ),
    max_size=80,
)


def _pandas(x: np.ndarray, window: int, center: bool, min_periods: int | None) -> np.ndarray:
    return pd.Series(x, dtype=np.float64).rolling(window, center=center, min_periods=min_periods).median().to_numpy()


@settings(max_examples=400, deadline=None)
@given(values=VALUES, window=st.integers(1, 30), center=st.booleans(), data=st.data())
def test_it_is_pandas_rolling_median(values, window, center, data) -> None:
    """Ties, NaN, infinities (pandas skips both), odd and even windows, centred or trailing, any ``min_periods``."""
    min_periods = data.draw(st.one_of(st.none(), st.integers(0, window)))
    x = np.asarray(values, dtype=np.float64)
    np.testing.assert_array_equal(
        rolling_median(x, window, center, min_periods), _pandas(x, window, center, min_periods)
    )


@pytest.mark.parametrize(
    ("values", "window", "center", "min_periods", "expected"),
    [
        ([], 5, True, 1, []),
        ([3.0], 1, False, None, [3.0]),
        ([1.0, 2.0, 3.0, 4.0], 10, True, 1, [2.5, 2.5, 2.5, 2.5]),  # a window past both ends: the whole series
        ([1.0, 2.0, 3.0, 4.0, 5.0], 3, True, 1, [1.5, 2.0, 3.0, 4.0, 4.5]),  # the edges: what is there
        ([1.0, 2.0, 3.0, 4.0], 2, False, None, [np.nan, 1.5, 2.5, 3.5]),  # an even count: the two middles' mean
        ([1.0, np.nan, 3.0], 3, True, 2, [np.nan, 2.0, np.nan]),  # fewer finite values than min_periods: NaN
        ([np.nan, np.inf, -np.inf], 3, True, 0, [np.nan, np.nan, np.nan]),  # nothing finite
    ],
)
def test_its_edges(values, window, center, min_periods, expected) -> None:
    got = rolling_median(np.asarray(values, dtype=np.float64), window, center, min_periods)
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.float64))
    np.testing.assert_array_equal(got, _pandas(np.asarray(values, dtype=np.float64), window, center, min_periods))


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="window must be >= 1"):
        rolling_median(np.ones(3), 0)
