"""crslib.recall: the recall of an approximate search against exact neighbours, and its interval."""

from __future__ import annotations

import numpy as np
import pytest

from crslib import neighbors as nb
from crslib import recall
from crslib.errors import InputError


def _points(n=300, d=6, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d))


# --------------------------------------------------------------------------- the interval


def test_the_interval_is_the_wilson_interval_of_a_large_population():
    # 50 of 100: the textbook 95% Wilson interval is [0.4038, 0.5962]
    low, high = recall._recall_interval(0.5, 100, 10**12)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
    # 90 of 100: [0.8256, 0.9448]
    low, high = recall._recall_interval(0.9, 100, 10**12)
    assert low == pytest.approx(0.8256, abs=1e-4) and high == pytest.approx(0.9448, abs=1e-4)


def _wilson(p, m, z=1.959963984540054):
    centre = (p + z * z / (2 * m)) / (1 + z * z / m)
    half = z / (1 + z * z / m) * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m))
    return centre - half, centre + half


def test_the_interval_shrinks_by_the_finite_population_correction():
    # 100 of 200 rows: the sample counts as 100 * 199 / 100 = 199 draws with replacement
    assert recall._recall_interval(0.7, 100, 200) == pytest.approx(_wilson(0.7, 199.0))
    assert recall._recall_interval(0.7, 150, 200) == pytest.approx(_wilson(0.7, 150 * 199 / 50))
    wide, narrow = recall._recall_interval(0.7, 100, 10**9), recall._recall_interval(0.7, 100, 200)
    assert narrow[0] > wide[0] and narrow[1] < wide[1]
    # every row compared: the recall itself; more than every row: the same
    assert recall._recall_interval(0.7, 200, 200) == (0.7, 0.7)
    assert recall._recall_interval(0.7, 201, 200) == (0.7, 0.7)


def test_the_interval_stays_in_zero_one_and_is_not_zero_width_at_the_ends():
    low, high = recall._recall_interval(1.0, 300, 1000)
    assert high == 1.0 and low == pytest.approx(_wilson(1.0, 300 * 999 / 700)[0]) and low < 1.0
    low, high = recall._recall_interval(0.0, 300, 1000)
    assert low == 0.0 and high == pytest.approx(_wilson(0.0, 300 * 999 / 700)[1]) and high > 0.0
    for p in np.linspace(0, 1, 11):
        low, high = recall._recall_interval(float(p), 10, 10**6)
        assert 0.0 <= low <= p <= high <= 1.0
        assert isinstance(low, float) and isinstance(high, float)


# --------------------------------------------------------------------------- knn_recall


def test_recall_is_the_mean_share_of_exact_neighbours_found():
    X = _points()
    exact = nb.knn_indices(X, k=4)
    approx = exact.copy()
    for i in range(100):  # rows 0-99 swap their first neighbour for a row that is not one
        approx[i, 0] = next(j for j in range(300) if j != i and j not in exact[i])
    res = recall.knn_recall(X, approx)
    assert res.recall == pytest.approx(1 - 100 / 300 / 4)
    np.testing.assert_allclose(res.per_query, np.where(np.arange(300) < 100, 0.75, 1.0))
    assert (res.n, res.k, res.n_sample, res.confidence) == (300, 4, 300, 0.95)
    assert res.rows.dtype == np.int64 and res.rows.tolist() == list(range(300))
    # the first k columns only: the damaged column 0 counts, k=2 sees 1 of 2 for the damaged rows
    assert recall.knn_recall(X, approx, k=2).recall == pytest.approx(1 - 100 / 300 / 2)


def test_metric_and_excluded_groups_reach_the_exact_search():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3)) * rng.uniform(0.1, 10.0, size=(200, 1))  # norms matter to euclidean only
    euclid = nb.knn_indices(X, k=5, metric="euclidean")
    assert recall.knn_recall(X, euclid, metric="euclidean").recall == 1.0
    assert recall.knn_recall(X, euclid).recall < 0.8  # cosine by default
    groups = np.repeat(np.arange(50), 4)
    apart = nb.knn_indices(X, k=5, exclude_groups=groups)
    assert recall.knn_recall(X, apart, exclude_groups=groups).recall == 1.0
    assert recall.knn_recall(X, apart).recall < 1.0


def test_the_sample_is_seeded_sorted_and_drawn_without_replacement():
    X = _points()
    exact = nb.knn_indices(X, k=3)
    wrong = np.roll(exact, 7, axis=0)
    default = recall.knn_recall(X, wrong, sample=40)
    same = recall.knn_recall(X, wrong, sample=40, random_state=0)
    other = recall.knn_recall(X, wrong, sample=40, random_state=1)
    np.testing.assert_array_equal(default.rows, same.rows)
    assert default.recall == same.recall
    assert not np.array_equal(default.rows, other.rows)
    expected = np.sort(np.random.default_rng(0).choice(300, size=40, replace=False))
    np.testing.assert_array_equal(default.rows, expected)
    assert default.rows.dtype == np.int64 and len(set(default.rows.tolist())) == 40
    assert (default.ci_low, default.ci_high) == pytest.approx(recall._recall_interval(default.recall, 40, 300))


def test_the_default_sample_is_20000_queries():
    X = np.random.default_rng(2).normal(size=(20_001, 2)).astype(np.float32)
    approx = np.zeros((20_001, 1), dtype=np.int64)
    res = recall.knn_recall(X, approx, metric="euclidean")
    assert res.n_sample == 20_000 and res.n == 20_001


def test_held_out_rows_are_never_queries():
    X = _points()
    exact = nb.knn_indices(X, k=3)
    res = recall.knn_recall(X, exact, exclude_rows=np.array([], dtype=np.int64))
    assert res.n_sample == 300  # an empty exclusion excludes nothing
    res = recall.knn_recall(X, exact, exclude_rows=[0, 299], sample=1000)
    assert res.rows.tolist() == list(range(1, 299)) and res.n == 300
    assert res.ci_low < 1.0 == res.ci_high  # 298 of 300 rows: still a sample of the 300


@pytest.mark.parametrize("bad, message", [
    ([[1, 2]], "exclude_rows must be a 1-D array of row indices, got shape (1, 2), dtype int64"),
    ([0.5], "exclude_rows must be a 1-D array of row indices, got shape (1,), dtype float64"),
    ([True], "exclude_rows must be a 1-D array of row indices, got shape (1,), dtype bool"),
    ([3, 300], "exclude_rows must lie in [0, 300), got values from 3 to 300"),
    ([-2, 5], "exclude_rows must lie in [0, 300), got values from -2 to 5"),
    (np.arange(300), "exclude_rows leaves no row to sample"),
])
def test_bad_excluded_rows_are_refused_with_their_reason(bad, message):
    X = _points()
    exact = nb.knn_indices(X, k=3)
    with pytest.raises(InputError) as info:
        recall.knn_recall(X, exact, exclude_rows=bad)
    assert str(info.value) == message


def test_bad_arguments_are_refused():
    X = _points()
    exact = nb.knn_indices(X, k=3)
    with pytest.raises(InputError) as info:
        recall.knn_recall(X, exact, k=4)
    assert str(info.value) == "k=4 exceeds the 3 neighbour columns of approx_indices"
    for name in ["k", "sample"]:
        with pytest.raises(InputError) as info:
            recall.knn_recall(X, exact, **{name: 0})
        assert str(info.value) == f"{name} must be a positive integer, got 0"
    with pytest.raises(InputError, match="approx_indices"):
        recall.knn_recall(X, exact[:-1])


def test_the_messages_name_the_arguments():
    X = _points(30)
    exact = nb.knn_indices(X, k=3)
    with pytest.raises(InputError) as info:
        recall.knn_recall(X, exact[:-1])
    assert str(info.value).endswith("row counts differ (X: 30, approx_indices: 29)")
    with pytest.raises(InputError) as info:
        recall.knn_recall(X, exact.astype(float))
    assert str(info.value) == ("approx_indices must be a 2-D integer array of neighbour indices (N, k), "
                               "got float64 (30, 3)")
