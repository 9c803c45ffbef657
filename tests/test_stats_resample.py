"""crslib._resample: the bootstrap index drawing behind crslib.stats, checked draw by draw.

A draw is reproduced by hand from the same generator: rows, whole groups in
row order, and groups drawn within their stratum.
"""

from __future__ import annotations

import numpy as np
import pytest

from crslib import _resample
from crslib.errors import InputError


def test_rows_are_drawn_with_replacement_from_the_generator():
    sampler = _resample.Resampler(6)
    drawn = sampler.draw(np.random.default_rng(4))
    np.testing.assert_array_equal(drawn, np.random.default_rng(4).integers(0, 6, 6))


def test_a_group_is_drawn_whole_with_its_rows_in_row_order():
    groups = np.array(["b", "a", "b", "c", "a", "b"])  # a: rows 1, 4; b: 0, 2, 5; c: 3
    sampler = _resample.Resampler(6, groups=groups)
    rows_of = {0: [1, 4], 1: [0, 2, 5], 2: [3]}  # codes follow the sorted labels
    for seed in range(5):
        picked = np.random.default_rng(seed).integers(0, 3, 3)
        expected = np.concatenate([rows_of[g] for g in picked])
        np.testing.assert_array_equal(sampler.draw(np.random.default_rng(seed)), expected)


def test_groups_are_drawn_within_their_stratum_in_stratum_order():
    groups = np.array([10, 10, 11, 12, 13, 13, 14])
    strata = np.array(["y", "y", "x", "y", "x", "x", "x"])  # x: groups 11, 13, 14; y: groups 10, 12
    sampler = _resample.Resampler(7, groups=groups, strata=strata)
    rows_of = {0: [0, 1], 1: [2], 2: [3], 3: [4, 5], 4: [6]}
    x_groups, y_groups = np.array([1, 3, 4]), np.array([0, 2])
    for seed in range(5):
        rng = np.random.default_rng(seed)
        picked = np.concatenate([x_groups[rng.integers(0, 3, 3)], y_groups[rng.integers(0, 2, 2)]])
        expected = np.concatenate([rows_of[g] for g in picked])
        np.testing.assert_array_equal(sampler.draw(np.random.default_rng(seed)), expected)


def test_strata_without_groups_keep_each_strata_size():
    strata = np.array([1, 0, 1, 1, 0, 1])
    sampler = _resample.Resampler(6, strata=strata)
    for seed in range(10):
        drawn = sampler.draw(np.random.default_rng(seed))
        np.testing.assert_array_equal(drawn[:2], np.array([1, 4])[np.random.default_rng(seed).integers(0, 2, 2)])
        assert (strata[drawn] == np.array([0, 0, 1, 1, 1, 1])).all()


def test_a_group_in_two_strata_is_refused():
    groups = np.array(["p1", "p1", "p2", "p2", "p3", "p3"])
    strata = np.array([0, 1, 0, 1, 0, 0])
    with pytest.raises(InputError) as info:
        _resample.Resampler(6, groups=groups, strata=strata)
    assert str(info.value) == ("2 group(s) span several strata; each group (e.g. patient) must belong to one "
                               "stratum, or resample without strata")


def test_codes_follow_the_sorted_labels():
    out = _resample.codes(np.array(["b", "a", "c", "a"]), 4, "groups")
    assert out.tolist() == [1, 0, 2, 0] and out.dtype == np.int64
    assert _resample.codes([10, 2, 10], 3, "strata").tolist() == [1, 0, 1]


@pytest.mark.parametrize("labels, message", [
    (np.zeros((3, 1)), "groups must be a 1-D array with one label per row (3), got shape (3, 1)"),
    ([1, 2], "groups must be a 1-D array with one label per row (3), got shape (2,)"),
    ([1.0, np.nan, np.nan], "groups has 2 missing value(s) (NaN or None); give every row its patient id, or "
                            "drop those rows"),
])
def test_bad_group_labels_are_refused_with_their_reason(labels, message):
    with pytest.raises(InputError) as info:
        _resample.codes(labels, 3, "groups")
    assert str(info.value) == message


def test_each_kind_of_label_is_named_in_the_missing_value_message():
    with pytest.raises(InputError, match=r"^strata has 1 missing value\(s\) \(NaN or None\); give every row its "
                                         r"stratum, or drop those rows$"):
        _resample.check_no_missing(np.array(["a", None], dtype=object), "strata")
    with pytest.raises(InputError, match=r"give every row its label, or drop"):
        _resample.check_no_missing(np.array([None]), "y")
    _resample.check_no_missing(np.array(["a", "b"]), "groups")  # nothing missing: no error


def test_labels_of_mixed_types_are_refused():
    with pytest.raises(InputError, match=r"^groups labels cannot be compared \(.*\); pass labels of one type$"):
        _resample.codes(np.array([1, "a", 2.5, "a"], dtype=object), 4, "groups")


def test_as_arrays_returns_the_arrays_and_their_rows():
    out, n = _resample.as_arrays([[1, 2, 3], np.zeros((3, 2))])
    assert n == 3 and [a.shape for a in out] == [(3,), (3, 2)]
    assert all(isinstance(a, np.ndarray) for a in out)


@pytest.mark.parametrize("arrays, message", [
    ([], "pass at least one array to resample (samples)"),
    ([np.zeros(3), 5.0], "samples[1] is a scalar; pass arrays with one row per sample"),
    ([np.zeros(3), np.zeros(2), np.zeros(4), np.zeros(3)],
     "all samples must have the same number of rows; first has 3, but [1] has 2, [2] has 4"),
    ([np.zeros(0), np.zeros(0)], "samples are empty: nothing to resample"),
])
def test_as_arrays_refuses_what_cannot_be_resampled(arrays, message):
    with pytest.raises(InputError) as info:
        _resample.as_arrays(arrays, "samples")
    assert str(info.value) == message


def test_as_arrays_names_arrays_by_default():
    with pytest.raises(InputError, match=r"^pass at least one array to resample \(arrays\)$"):
        _resample.as_arrays([])
