"""crslib.stats: exact error messages, documented defaults and brute-force references.

These tests pin what a user sees (the whole message of each input error, the
defaults the book relies on) and recompute permutation p-values by brute force,
so that a changed bound, default or message in ``crslib.stats`` fails a test
(``make mutation`` measures how many such changes the suite notices).
"""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from crslib import splits, stats
from crslib._validation import check_confidence, check_count
from assertions import error_message


def _sym(m: int, seed: int = 0) -> np.ndarray:
    P = np.random.default_rng(seed).random((m, m))
    A = P + P.T
    np.fill_diagonal(A, 0.0)
    return A


# --------------------------------------------------------------------------- square matrices


def test_square_pair_messages_name_the_matrix():
    A = _sym(5)
    assert error_message(stats.mantel_test, A[:, :4], A) == (
        "A must be a square matrix (models x models), got shape (5, 4)")
    assert error_message(stats.mantel_test, A, A[:, :4]) == (
        "B must be a square matrix (models x models), got shape (5, 4)")
    assert error_message(stats.pairwise_spearman, A, _sym(4)) == (
        "A and B must have the same shape, got (5, 5) and (4, 4)")
    assert error_message(stats.pairwise_spearman, A[:2, :2], A[:2, :2]) == (
        "need at least 3 models (3 pairs) for a matrix correlation, got 2")
    asym = A.copy()
    asym[0, 1] += 1.0
    assert error_message(stats.mantel_test, A, asym) == "B must be symmetric; symmetrise it, e.g. (A + A.T) / 2"
    assert error_message(stats.mantel_test, asym, A) == "A must be symmetric; symmetrise it, e.g. (A + A.T) / 2"


@pytest.mark.parametrize("where", [(0, 1), (1, 0), (3, 4)])
@pytest.mark.parametrize("side", ["A", "B"])
def test_square_pair_nan_anywhere_off_the_diagonal(where, side):
    A, B = _sym(5), _sym(5, 1)
    bad = (A if side == "A" else B).copy()
    bad[where] = np.nan  # one triangle only: still reported as NaN, not as asymmetry
    args = (bad, B) if side == "A" else (A, bad)
    assert error_message(stats.pairwise_spearman, *args) == (
        f"{side} has NaN or infinite off-diagonal entries; fill or drop those models")


@pytest.mark.parametrize("side", ["A", "B"])
def test_square_pair_missing_entries_from_lists(side):
    """Nested lists with None (a missing model pair) are read as NaN, not as objects."""
    good = _sym(4).tolist()
    missing = _sym(4).tolist()
    missing[1][2] = missing[2][1] = None
    args = (missing, good) if side == "A" else (good, missing)
    assert error_message(stats.mantel_test, *args) == (
        f"{side} has NaN or infinite off-diagonal entries; fill or drop those models")


def test_square_pair_tolerances_and_diagonal():
    A = _sym(4)
    assert stats.pairwise_spearman(A[:3, :3], A[:3, :3]) == pytest.approx(1.0)  # 3 models are enough
    # NaN on the diagonal is ignored (it is never used)
    D = A.copy()
    np.fill_diagonal(D, np.nan)
    assert stats.pairwise_spearman(D, A) == pytest.approx(1.0)
    # relative asymmetry of 2e-7 is rounding, of 5e-6 is not (rtol 1e-6)
    near = A.copy()
    near[0, 1] *= 1 + 2e-7
    assert stats.pairwise_spearman(near, A) == pytest.approx(1.0)
    far = A.copy()
    far[0, 1] *= 1 + 5e-6
    assert "must be symmetric" in error_message(stats.pairwise_spearman, far, A)
    # absolute asymmetry of entries near zero: 5e-10 passes, 5e-9 does not (atol 1e-9)
    Z = np.zeros((4, 4))
    Z[0, 1], Z[1, 0], Z[2, 3], Z[3, 2] = 1.0, 1.0, 2.0, 2.0
    tiny = Z.copy()
    tiny[2, 0] = 5e-10  # lower triangle: the upper one, which is correlated, is unchanged
    assert stats.pairwise_spearman(tiny, A) == pytest.approx(stats.pairwise_spearman(Z, A))
    small = Z.copy()
    small[2, 0] = 5e-9
    assert "must be symmetric" in error_message(stats.pairwise_spearman, small, A)


def test_pairwise_spearman_uses_the_upper_triangle():
    A, B = _sym(6), _sym(6, 2)
    iu = np.triu_indices(6, 1)
    assert stats.pairwise_spearman(A, B) == pytest.approx(spearmanr(A[iu], B[iu]).statistic)


# --------------------------------------------------------------------------- Mantel


def _mantel_brute(A, B, method, alternative):
    m = len(A)
    iu = np.triu_indices(m, 1)
    corr = (lambda a, b: spearmanr(a, b).statistic) if method == "spearman" else (lambda a, b: pearsonr(a, b)[0])
    observed = corr(A[iu], B[iu])
    null = np.array([corr(A[np.ix_(p, p)][iu], B[iu]) for p in map(list, permutations(range(m)))])
    tol = 1e-9
    if alternative == "greater":
        hits = np.sum(null >= observed - tol)
    elif alternative == "less":
        hits = np.sum(null <= observed + tol)
    else:
        hits = np.sum(np.abs(null) >= abs(observed) - tol)
    return observed, hits / len(null)


@pytest.mark.parametrize("method", ["spearman", "pearson"])
@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_mantel_exact_p_value_equals_brute_force(method, alternative):
    A = _sym(5, 3)
    B = A + 0.8 * _sym(5, 4)
    res = stats.mantel_test(A, B, method=method, alternative=alternative)
    r, p = _mantel_brute(A, B, method, alternative)
    assert res.exact and res.n_permutations == 120
    assert res.r == pytest.approx(r) and res.p_value == pytest.approx(p)
    assert (res.method, res.alternative) == (method, alternative)


def test_mantel_random_permutations_defaults_and_p_formula():
    A = _sym(8, 5)
    B = A + 2.0 * _sym(8, 6)
    res = stats.mantel_test(A, B)
    assert res.n_permutations == 999 and not res.exact  # 8! > 999: sampled
    assert (res.method, res.alternative) == ("spearman", "two-sided")
    same = stats.mantel_test(A, B, n_permutations=999, random_state=0, method="spearman", alternative="two-sided")
    assert res == same
    # the sampled p-value has the +1 form and agrees with the exact one
    exact = stats.mantel_test(A, B, n_permutations=40320)
    assert exact.exact and exact.n_permutations == 40320
    assert res.p_value * 1000 == pytest.approx(round(res.p_value * 1000))
    assert res.p_value == pytest.approx(exact.p_value, abs=0.05)
    many = stats.mantel_test(A, B, n_permutations=5000, random_state=1)
    assert many.p_value == pytest.approx(exact.p_value, abs=0.02)


def test_mantel_messages():
    A = _sym(5)
    assert error_message(stats.mantel_test, A, A, method="kendall") == (
        "method must be 'spearman' or 'pearson', got 'kendall'")
    assert error_message(stats.mantel_test, A, A, alternative="both") == (
        "alternative must be 'two-sided', 'greater' or 'less', got 'both'")
    assert error_message(stats.mantel_test, A, A, n_permutations=0) == "n_permutations must be an integer >= 1, got 0"
    const = np.ones((5, 5))
    msg = "one matrix is constant over its off-diagonal entries; the correlation is undefined"
    assert error_message(stats.mantel_test, const, A) == msg
    assert error_message(stats.mantel_test, A, const) == msg
    # a 0/1 matrix has a range of exactly 1 and is fine
    binary = (A > np.median(A[np.triu_indices(5, 1)])).astype(float)
    np.fill_diagonal(binary, 0)
    res = stats.mantel_test(binary, A, method="pearson")
    assert res.r > 0.5


# --------------------------------------------------------------------------- permutation test


def test_permutation_test_defaults_and_p_values():
    rng = np.random.default_rng(9)
    x = rng.normal(size=25)
    y = x + rng.normal(size=25)
    corr = lambda a, b: float(np.corrcoef(a, b)[0, 1])  # noqa: E731
    res = stats.permutation_test(corr, x, y)
    assert res.n_permutations == 999 and res.null.shape == (999,)
    again = stats.permutation_test(corr, x, y, n_permutations=999, alternative="two-sided", random_state=0)
    assert res.p_value == again.p_value and np.array_equal(res.null, again.null)
    # the null is the statistic on y's rows permuted, seeded by random_state
    perm_rng = np.random.default_rng(0)
    assert res.null[:3] == pytest.approx([corr(x, y[perm_rng.permutation(25)]) for _ in range(3)])
    hits = np.sum(np.abs(res.null) >= abs(res.statistic) - 1e-12)
    assert res.p_value == pytest.approx((1 + hits) / 1000)
    greater = stats.permutation_test(corr, x, y, alternative="greater")
    assert greater.p_value == pytest.approx((1 + np.sum(greater.null >= greater.statistic - 1e-12)) / 1000)
    less = stats.permutation_test(corr, x, y, alternative="less")
    assert less.p_value == pytest.approx((1 + np.sum(less.null <= less.statistic + 1e-12)) / 1000)
    assert less.p_value > 0.9 > 0.1 > greater.p_value


def test_permutation_p_counts_ties_with_the_observed():
    null = np.array([0.5, 0.5, -0.5, 0.1])
    assert stats._perm_p(0.5, null, "greater", include_observed=False) == 0.5
    assert stats._perm_p(0.5, null, "two-sided", include_observed=False) == 0.75
    assert stats._perm_p(-0.5, null, "less", include_observed=True) == pytest.approx(2 / 5)
    assert stats._perm_p(0.5 + 1e-14, null, "greater", include_observed=False) == 0.5  # within tolerance
    assert stats._perm_p(0.5 + 1e-6, null, "greater", include_observed=False) == 0.0
    # the tolerance is 1e-12 relative to the observed value, and absolute below 1
    assert stats._perm_p(1000.0, np.array([1000.0 - 5e-10]), "greater", include_observed=False) == 1.0
    assert stats._perm_p(0.5, np.array([0.5 - 1.5e-12]), "greater", include_observed=False) == 0.0
    assert stats._perm_p(0.5, np.array([0.5 - 0.5e-12]), "greater", include_observed=False) == 1.0
    assert stats._perm_p(-0.5, np.array([-0.5 + 0.5e-12]), "less", include_observed=False) == 1.0
    assert stats._perm_p(-0.5, np.array([-0.5 + 1.5e-12]), "less", include_observed=False) == 0.0
    assert stats._perm_p(0.5, np.array([-0.5 + 0.5e-12]), "two-sided", include_observed=False) == 1.0
    assert stats._perm_p(0.5, np.array([-0.5 + 1.5e-12]), "two-sided", include_observed=False) == 0.0
    assert error_message(stats._perm_p, 0.5, null, "GREATER", include_observed=False) == (
        "alternative must be 'two-sided', 'greater' or 'less', got 'GREATER'")


# --------------------------------------------------------------------------- helpers


def test_argument_messages():
    assert error_message(stats.bootstrap_ci, np.mean, np.arange(5.0), confidence=1.0) == (
        "confidence must be between 0 and 1 (e.g. 0.95), got 1.0")
    assert error_message(stats.bootstrap_ci, np.mean, np.arange(5.0), confidence=0.0) == (
        "confidence must be between 0 and 1 (e.g. 0.95), got 0.0")
    assert error_message(stats.bootstrap_ci, np.mean, np.arange(5.0), n_resamples=True) == (
        "n_resamples must be an integer >= 1, got True")
    assert error_message(stats.bootstrap_ci, np.mean, np.arange(5.0), n_resamples=2.0) == (
        "n_resamples must be an integer >= 1, got 2.0")
    assert error_message(stats.bootstrap_ci, np.mean) == "pass at least one array to resample (arrays)"
    assert error_message(stats.bootstrap_ci, np.mean, np.float64(1.0)) == (
        "arrays[0] is a scalar; pass arrays with one row per sample")
    assert error_message(stats.bootstrap_ci, np.mean, np.ones(3), np.ones(4), np.ones(5)) == (
        "all arrays must have the same number of rows; first has 3, but [1] has 4, [2] has 5")
    assert error_message(stats.bootstrap_ci, np.mean, np.ones(0)) == "arrays are empty: nothing to resample"
    assert error_message(stats.bootstrap_ci, "mean", np.ones(3)) == (
        "statistic must be a callable taking the resampled arrays")
    assert error_message(stats.paired_bootstrap, np.mean, np.ones(3), np.ones(4)) == (
        "all inputs must have the same number of rows; first has 3, but [1] has 4")
    assert error_message(stats.bootstrap_ci, np.mean, np.ones(4), groups=[0, 1, 2]) == (
        "groups must be a 1-D array with one label per row (4), got shape (3,)")
    assert error_message(stats.bootstrap_ci, np.mean, np.ones(4), strata=np.zeros((4, 1))) == (
        "strata must be a 1-D array with one label per row (4), got shape (4, 1)")
    assert error_message(stats.bootstrap_ci, np.mean, np.ones(4), groups=[0, 0, 1, 1], strata=[0, 1, 1, 1]) == (
        "1 group(s) span several strata; each group (e.g. patient) must belong to one stratum, "
        "or resample without strata")
    assert error_message(list, stats.resample_indices(0)) == "n must be an integer >= 1, got 0"
    assert check_count(0, "n_permutations", 0) == 0
    assert check_confidence(0.5) == 0.5 and isinstance(check_confidence(1 / 2), float)
    assert error_message(check_confidence, "high") == "confidence must be a number between 0 and 1 (e.g. 0.95), got 'high'"
    assert error_message(check_confidence, 1.0) == "confidence must be between 0 and 1 (e.g. 0.95), got 1.0"
    msg = error_message(stats.bootstrap_ci, np.mean, np.ones(4), groups=np.array([1, "a", 2.5, 3], dtype=object))
    assert msg.startswith("groups labels cannot be compared (") and msg.endswith("); pass labels of one type")


def test_resampler_draws_whole_groups_within_strata():
    groups = np.array([5, 5, 5, 2, 2, 9, 7, 7, 7, 7])
    strata = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    for idx in stats.resample_indices(10, n_resamples=50, groups=groups, strata=strata, random_state=4):
        drawn = groups[idx]
        # each drawn group comes with all its rows, contiguous
        for g in np.unique(drawn):
            assert np.sum(drawn == g) % np.sum(groups == g) == 0
        # as many group draws per stratum as the stratum has groups (two each)
        draws = {g: np.sum(drawn == g) // np.sum(groups == g) for g in np.unique(drawn)}
        for s in (0, 1):
            assert sum(d for g, d in draws.items() if strata[groups == g][0] == s) == 2
    plain = list(stats.resample_indices(6, n_resamples=3, random_state=1))
    assert [len(p) for p in plain] == [6, 6, 6]
    first = np.random.default_rng(1).integers(0, 6, 6)
    assert np.array_equal(plain[0], first)  # rows drawn uniformly with replacement, in draw order


def test_grouped_partition_fractions_and_messages():
    groups = np.repeat(np.arange(20), 3)
    parts = splits.grouped_partition(groups, (0.5, 0.25, 0.25))
    assert [len(np.unique(groups[p])) for p in parts] == [10, 5, 5]
    assert sorted(np.concatenate(parts).tolist()) == list(range(60))
    assert all(np.all(np.diff(p) > 0) for p in parts)
    default = splits.grouped_partition(groups, (0.5, 0.5))
    assert all(np.array_equal(a, b) for a, b in zip(default, splits.grouped_partition(groups, (0.5, 0.5),
                                                                                       random_state=0)))
    # a part never comes out empty, even for a tiny fraction
    tiny = splits.grouped_partition(np.arange(10), (0.98, 0.01, 0.01))
    assert [len(p) for p in tiny] == [8, 1, 1]
    assert error_message(splits.grouped_partition, [0, 0, 1], (0.4, 0.3, 0.3)) == (
        "fractions (0.4, 0.3, 0.3) need at least 3 patients (one per part), found 2; add patients or pass fewer "
        "fractions")


# --------------------------------------------------------------------------- DeLong


def test_delong_formulas_and_boundaries():
    from scipy.stats import norm

    rng = np.random.default_rng(12)
    y = rng.integers(0, 2, 80)
    a, b = y + rng.normal(0, 0.8, 80), y + rng.normal(0, 1.5, 80)
    res = stats.delong_test(y, a, b)
    assert res.confidence == 0.95
    assert res.difference == pytest.approx(res.auc_a - res.auc_b)
    assert res.auc_a == pytest.approx(stats.auroc(y, a)) and res.auc_b == pytest.approx(stats.auroc(y, b))
    assert res.z == pytest.approx(res.difference / res.se)
    assert res.p_value == pytest.approx(2 * norm.sf(abs(res.z)))
    half = norm.ppf(0.975) * res.se
    assert (res.low, res.high) == pytest.approx((res.difference - half, res.difference + half))
    as_bool = stats.delong_test(y.astype(bool), a, b)
    assert as_bool == res
    # two cases per class are enough
    tiny = stats.delong_test([0, 0, 1, 1], [0.1, 0.3, 0.2, 0.9], [0.2, 0.1, 0.4, 0.3])
    assert tiny.auc_a == pytest.approx(0.75) and tiny.auc_b == pytest.approx(1.0)
    # identical scores: no difference, p = 1; perfect against inverted: se 0, z infinite, p = 0
    same = stats.delong_test(y, a, a)
    assert (same.difference, same.se, same.z, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    flip = stats.delong_test(y, y + 0.0, -y + 0.0)
    assert (flip.difference, flip.se, flip.z, flip.p_value) == (1.0, 0.0, np.inf, 0.0)
    back = stats.delong_test(y, -y + 0.0, y + 0.0)
    assert (back.z, back.p_value) == (-np.inf, 0.0)


def test_delong_messages():
    y, s = np.array([0, 1, 0, 1, 1, 0]), np.arange(6.0)
    assert error_message(stats.delong_test, y[:, None], s, s) == (
        "y_true must be a 1-D array with one label per case, got shape (6, 1)")
    assert error_message(stats.delong_test, y, s[:5], s) == (
        "y_true and score_a must have the same length (one score per case), got 6 labels and 5 scores")
    assert error_message(stats.delong_test, y, s, s[:, None]) == (
        "y_true and score_b must have the same length (one score per case), got 6 labels and 6 scores")
    bad = s.copy()
    bad[[1, 2]] = [np.nan, np.inf]
    assert error_message(stats.delong_test, y, bad, s) == (
        "score_a has 2 NaN or infinite values; drop those cases")
    assert error_message(stats.delong_test, y, s, bad) == (
        "score_b has 2 NaN or infinite values; drop those cases")
    assert error_message(stats.delong_test, np.array(list("ababab")), s, s) == "y_true must hold 0/1 (or bool) labels"
    assert error_message(stats.delong_test, y * 2, s, s) == (
        "y_true must hold 0/1 (or bool) labels without missing values")
    assert stats.delong_test([0, 1, 1, 1, 1, 0], s, s).p_value == 1.0  # 2 negatives are enough
    assert error_message(stats.delong_test, [0, 1, 1, 1, 1, 1], s, s) == (
        "need at least 2 positive and 2 negative cases for the DeLong test, got 5 positive and 1 negative; "
        "a single class has no AUROC")
    assert error_message(stats.delong_test, [1, 0, 0, 0, 0, 0], s, s) == (
        "need at least 2 positive and 2 negative cases for the DeLong test, got 1 positive and 5 negative; "
        "a single class has no AUROC")
    assert error_message(stats.delong_test, y, s, s, confidence=1.5) == (
        "confidence must be between 0 and 1 (e.g. 0.95), got 1.5")


def test_auroc_known_answers_and_length_message():
    assert stats.auroc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert stats.auroc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5  # ties count half
    assert stats.auroc([True, False, True], [3.0, 1.0, 2.0]) == 1.0
    assert np.isnan(stats.auroc([1, 1, 1], [0.1, 0.2, 0.3])) and np.isnan(stats.auroc([0, 0], [0.1, 0.2]))
    assert error_message(stats.auroc, [0, 1, 1], [0.1, 0.2]) == (
        "y_true and y_score must have the same length, got 3 and 2")


# --------------------------------------------------------------------------- bootstrap against a plain loop


def _loop(statistic, arrays, **kwargs):
    n = len(arrays[0])
    return np.array([statistic(*(a[idx] for a in arrays)) for idx in stats.resample_indices(n, **kwargs)])


@pytest.mark.parametrize("design", ["rows", "groups", "strata", "groups+strata"])
def test_bootstrap_and_paired_bootstrap_equal_a_plain_loop(design):
    rng = np.random.default_rng(13)
    n = 60
    groups = np.repeat(np.arange(20), 3)
    strata = (groups % 2).astype(int)
    options = {"rows": {}, "groups": {"groups": groups}, "strata": {"strata": strata},
               "groups+strata": {"groups": groups, "strata": strata}}[design]
    a, b = rng.normal(size=n), rng.normal(size=n)
    res = stats.bootstrap_ci(np.mean, a, n_resamples=50, random_state=4, **options)
    assert np.array_equal(res.samples, _loop(np.mean, [a], n_resamples=50, random_state=4, **options))
    paired = stats.paired_bootstrap(np.mean, a, b, n_resamples=50, random_state=4, **options)
    expected = _loop(lambda x, y: np.mean(x) - np.mean(y), [a, b], n_resamples=50, random_state=4, **options)
    assert np.allclose(paired.samples, expected)
    assert paired.share_positive == pytest.approx(np.mean(expected > 0))


def test_bootstrap_defaults_and_invalid_resamples():
    rng = np.random.default_rng(14)
    a, b = rng.normal(size=30), rng.normal(size=30)
    res = stats.bootstrap_ci(np.mean, a)
    assert res.samples.shape == (1000,) and res.confidence == 0.95 and res.n_invalid == 0
    assert np.array_equal(res.samples, stats.bootstrap_ci(np.mean, a, n_resamples=1000, random_state=0).samples)
    paired = stats.paired_bootstrap(np.mean, a, b)
    assert paired.samples.shape == (1000,) and paired.confidence == 0.95 and paired.n_invalid == 0
    assert np.array_equal(paired.samples,
                          stats.paired_bootstrap(np.mean, a, b, n_resamples=1000, random_state=0).samples)
    assert (paired.estimate_a, paired.estimate_b) == (pytest.approx(a.mean()), pytest.approx(b.mean()))
    assert error_message(stats.paired_bootstrap, np.mean, a, b, n_resamples=0) == (
        "n_resamples must be an integer >= 1, got 0")
    # resamples where the statistic is undefined are counted and left out
    y = np.r_[np.zeros(27), np.ones(3)]
    half = stats.paired_bootstrap(stats.auroc, (y, a), (y, b), n_resamples=200, confidence=0.9, random_state=1)
    n_nan = int(np.isnan(half.samples).sum())
    assert half.n_invalid == n_nan > 0 and isinstance(half.n_invalid, int) and half.confidence == 0.9
    valid = half.samples[~np.isnan(half.samples)]
    assert half.share_positive == pytest.approx(np.mean(valid > 0))
    assert half.low == pytest.approx(np.percentile(valid, 5))
    nowhere = stats.paired_bootstrap(lambda x: np.nan, a, b, n_resamples=5)
    assert nowhere.n_invalid == 5 and np.isnan(nowhere.share_positive) and np.isnan(nowhere.low)
    vector = stats.bootstrap_ci(lambda x: np.array([x.mean(), np.nan]), a, n_resamples=20)
    assert vector.n_invalid.tolist() == [0, 20] and vector.estimate.shape == (2,)
    assert isinstance(stats.bootstrap_ci(np.mean, np.arange(5)).estimate, float)  # integer data, float estimate
    assert isinstance(stats.bootstrap_ci(lambda x: 1, np.arange(5)).estimate, float)
    counts = stats.bootstrap_ci(lambda x: np.array([1, 2]), np.arange(5), n_resamples=3)
    assert counts.estimate.dtype == np.float64 and counts.estimate.tolist() == [1.0, 2.0]


# --------------------------------------------------------------------------- resampling details


def test_resampled_groups_keep_their_rows_in_order_and_defaults():
    rng = np.random.default_rng(15)
    groups = rng.permutation(np.repeat(np.arange(10), 20))  # 200 rows, groups interleaved
    for idx in stats.resample_indices(200, n_resamples=5, groups=groups):
        blocks = np.split(idx, np.flatnonzero(np.diff(groups[idx]) != 0) + 1)
        for block in blocks:  # a drawn group: all its rows, ascending (a stable sort of the codes)
            assert np.array_equal(np.sort(block), block) or len(block) % 20 == 0
            for start in range(0, len(block), 20):
                assert np.array_equal(block[start:start + 20], np.flatnonzero(groups == groups[block[0]]))
    default = list(stats.resample_indices(10))
    assert len(default) == 1000
    assert all(np.array_equal(a, b) for a, b in zip(default[:5], stats.resample_indices(10, random_state=0)))
    assert error_message(list, stats.resample_indices(10, n_resamples=0)) == "n_resamples must be an integer >= 1, got 0"
    assert error_message(stats.permutation_test, np.subtract, np.ones(3), np.ones(3), n_permutations=0) == (
        "n_permutations must be an integer >= 1, got 0")


def test_interval_results_keep_their_settings_and_types():
    x = np.random.default_rng(16).normal(size=40)
    res = stats.bootstrap_ci(np.mean, x, n_resamples=50, confidence=0.9)
    assert res.confidence == 0.9 and type(res.n_invalid) is int
    vector = stats.bootstrap_ci(lambda v: np.array([v.mean(), v.std()]), x, n_resamples=50)
    assert vector.low.shape == (2,) and vector.high.shape == (2,)
    assert vector.low == pytest.approx(np.percentile(vector.samples, 2.5, axis=0))
    assert vector.high == pytest.approx(np.percentile(vector.samples, 97.5, axis=0))
    A = _sym(8, 7)
    sampled = stats.mantel_test(A, A + _sym(8, 8), n_permutations=50, alternative="less", method="pearson")
    assert sampled.exact is False and (sampled.method, sampled.alternative) == ("pearson", "less")
    exact = stats.mantel_test(A, A + _sym(8, 8), n_permutations=40320)
    assert exact.exact is True and exact.n_permutations == 40320
    assert exact.p_value * 40320 == pytest.approx(round(exact.p_value * 40320))  # hits over all 8! relabellings


def test_delong_missing_scores_from_lists():
    y = [0, 1, 0, 1, 1, 0]
    assert error_message(stats.delong_test, y, [0.1, None, 0.3, 0.8, 0.7, 0.2], np.arange(6.0)) == (
        "score_a has 1 NaN or infinite values; drop those cases")


def test_grouped_partition_relative_shares_and_small_parts():
    groups = np.arange(10)
    parts = splits.grouped_partition(groups, (2, 1, 1))  # shares, not fractions
    assert [len(p) for p in parts] == [5, 3, 2]  # bounds round(10 * [2, 3, 4] / 4) = [5, 8, 10]
    assert [len(p) for p in splits.grouped_partition(groups, (0.5, 0.001, 0.499))] == [5, 1, 4]
    assert [len(p) for p in splits.grouped_partition([7, 8, 9], (1, 1, 1))] == [1, 1, 1]


# --------------------------------------------------------------------------- missing values and bad labels are refused


def test_missing_group_or_stratum_ids_are_refused_not_merged_into_one_patient():
    x = np.arange(6.0)
    groups = np.array([np.nan, np.nan, 1.0, 1.0, 2.0, np.nan])
    assert error_message(stats.bootstrap_ci, np.mean, x, groups=groups, n_resamples=5) == (
        "groups has 3 missing value(s) (NaN or None); give every row its patient id, or drop those rows")
    assert error_message(lambda: list(stats.resample_indices(6, n_resamples=2, groups=[None, "a", "a", "b", "b", "c"]))) == (
        "groups has 1 missing value(s) (NaN or None); give every row its patient id, or drop those rows")
    assert error_message(stats.paired_bootstrap, np.mean, x, x, strata=[0, 0, 1, 1, np.nan, 1], n_resamples=5) == (
        "strata has 1 missing value(s) (NaN or None); give every row its stratum, or drop those rows")
    assert error_message(stats.group_permuter, ["a", None, "b"]) == (
        "groups has 1 missing value(s) (NaN or None); give every row its patient id, or drop those rows")


def test_auroc_refuses_labels_other_than_0_1_and_missing_scores():
    assert error_message(stats.auroc, [-1, 1, -1, 1], [0.1, 0.8, 0.3, 0.9]) == (
        "y_true must hold 0/1 (or bool) labels, but 2 labels are not (e.g. [-1]); map them to 0 (negative) "
        "and 1 (positive)")
    assert error_message(stats.auroc, [0, 1, np.nan, 1], [0.1, 0.8, 0.3, 0.9]) == (
        "y_true has 1 missing value(s) (NaN or None); give every row its label, or drop those rows")
    assert error_message(stats.auroc, [0, 1, 0, 1], [0.1, np.nan, 0.3, np.inf]) == (
        "y_score has 2 NaN or infinite value(s); drop those cases")
    # a score given as None (an object column with a missing score) is missing like NaN, not a TypeError
    assert error_message(stats.auroc, [0, 1, 0, 1], [0.1, None, 0.3, 0.9]) == (
        "y_score has 1 NaN or infinite value(s); drop those cases")
    assert stats.auroc(np.array([0.0, 1.0, 0.0, 1.0]), [0.1, 0.8, 0.3, 0.9]) == 1.0  # 0/1 as float is fine
