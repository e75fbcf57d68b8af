"""The robust SD, whole-run and per group: one formula (``forensics.stats``), the same edges both ways."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.stats import MAD_TO_SD, grouped_robust_sd, robust_sd

NAN = float("nan")

# (values, groups, floor, expected scale per group label): each row one edge of the rule.
CASES = [
    # MAD of [1, 2, 3, 10] about its median 2.5 is 1.0: the scale is the constant itself, above a smaller floor
    ([1.0, 2.0, 3.0, 10.0], [0, 0, 0, 0], 0.5, {0: MAD_TO_SD}),
    # the floor exactly at the scale: the scale
    ([1.0, 2.0, 3.0, 10.0], [0, 0, 0, 0], MAD_TO_SD, {0: MAD_TO_SD}),
    # the floor just above the scale: the floor
    ([1.0, 2.0, 3.0, 10.0], [0, 0, 0, 0], MAD_TO_SD + 1e-9, {0: MAD_TO_SD + 1e-9}),
    # a single-value group has MAD 0: the floor, and 0 without one
    ([5.0], [7], 0.25, {7: 0.25}),
    ([5.0], [7], 0.0, {7: 0.0}),
    # constant group: MAD 0, the floor
    ([2.0, 2.0, 2.0], [1, 1, 1], 0.1, {1: 0.1}),
    # a NaN makes its group NaN whatever the floor (robust_sd does the same); other groups are untouched
    ([NAN, 4.0, 1.0, 3.0], [2, 2, 3, 3], 0.5, {2: NAN, 3: MAD_TO_SD}),
    ([NAN], [0], 10.0, {0: NAN}),
    # groups are judged apart: one spike in group 0 does not widen group 1's scale
    ([0.0, 1.0, 2.0, 100.0, 10.0, 10.5, 11.0], [0, 0, 0, 0, 1, 1, 1], 0.0, {0: 1.0 * MAD_TO_SD, 1: 0.5 * MAD_TO_SD}),
    # labels come back sorted, negative labels included
    ([3.0, 1.0, 1.0, 3.0], [5, -1, -1, 5], 0.0, {-1: 0.0, 5: 0.0}),
]


@pytest.mark.parametrize("values, groups, floor, expected", CASES)
def test_grouped_robust_sd_at_its_edges(values, groups, floor, expected):
    got = grouped_robust_sd(np.array(values), np.array(groups), floor)
    assert got.index.tolist() == sorted(expected)
    np.testing.assert_array_equal(got.to_numpy(), np.array([expected[k] for k in sorted(expected)]))


@pytest.mark.parametrize("values, groups, floor, expected", CASES)
def test_each_group_is_the_robust_sd_of_its_values(values, groups, floor, expected):
    """The per-group helper and the whole-run helper are one formula: same numbers, same NaN, same floor."""
    values, groups = np.array(values), np.array(groups)
    got = grouped_robust_sd(values, groups, floor)
    for label in got.index:
        np.testing.assert_array_equal(got[label], robust_sd(values[groups == label], floor))


def test_no_values_no_groups():
    got = grouped_robust_sd(np.array([]), np.array([], dtype=np.int64), 1.0)
    assert len(got) == 0
    assert got.dtype == np.float64


def test_a_series_of_groups_names_the_index():
    got = grouped_robust_sd(pd.Series([1.0, 2.0, 4.0]), pd.Series([3, 3, 3], name="bucket"))
    assert got.index.name == "bucket"
    assert got.to_dict() == {3: 1.0 * MAD_TO_SD}


def test_many_groups_match_the_whole_run_helper_group_by_group():
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 40, 5000)
    values = rng.standard_t(3, 5000) * (1 + groups)
    got = grouped_robust_sd(values, groups, 0.05)
    assert len(got) == 40
    expected = [robust_sd(values[groups == g], 0.05) for g in range(40)]
    np.testing.assert_array_equal(got.to_numpy(), np.array(expected))
