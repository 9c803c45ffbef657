"""crslib.stats: bootstrap (row, grouped, stratified, paired), AUROC, Mantel."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from crslib import stats
from crslib.errors import CRSError, InputError
from assertions import error_message


def test_bootstrap_ci_mean_contains_truth_and_is_reproducible():
    x = np.random.default_rng(0).normal(loc=2.0, size=400)
    a = stats.bootstrap_ci(np.mean, x, n_resamples=300, random_state=1)
    b = stats.bootstrap_ci(np.mean, x, n_resamples=300, random_state=1)
    c = stats.bootstrap_ci(np.mean, x, n_resamples=300, random_state=2)
    assert a.estimate == pytest.approx(x.mean())
    assert a.low < x.mean() < a.high
    assert a.low < 2.0 < a.high
    assert np.array_equal(a.samples, b.samples) and (a.low, a.high) == (b.low, b.high)
    assert not np.array_equal(a.samples, c.samples)
    # standard error of the mean ~ 1/sqrt(400) = 0.05: 95% interval ~ +-0.1
    assert 0.15 < a.high - a.low < 0.25


def test_grouped_bootstrap_resamples_whole_groups():
    groups = np.repeat(np.arange(30), 4)
    groups[:8] = 99  # one larger group
    for idx in stats.resample_indices(len(groups), n_resamples=20, groups=groups, random_state=0):
        counts = np.bincount(idx, minlength=len(groups))
        for g in np.unique(groups):
            c = counts[groups == g]
            assert np.all(c == c[0]), "rows of one group must be drawn together"


def test_grouped_ci_wider_when_groups_are_internally_correlated():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(40), 10)
    x = np.repeat(rng.normal(size=40), 10)  # perfectly correlated within a group
    rows = stats.bootstrap_ci(np.mean, x, n_resamples=400, random_state=0)
    grouped = stats.bootstrap_ci(np.mean, x, n_resamples=400, groups=groups, random_state=0)
    assert rows.estimate == grouped.estimate
    # effective sample size is 40, not 400: about sqrt(10) ~ 3.2 times wider
    ratio = (grouped.high - grouped.low) / (rows.high - rows.low)
    assert 2.0 < ratio < 5.0


def test_stratified_bootstrap_keeps_stratum_sizes():
    strata = np.array([0] * 10 + [1] * 30 + [2] * 5)
    for idx in stats.resample_indices(len(strata), n_resamples=10, strata=strata, random_state=3):
        assert np.bincount(strata[idx]).tolist() == [10, 30, 5]
    groups = np.arange(45) // 5  # nested in strata: rows 0-9 | 10-39 | 40-44
    groups_ok = np.concatenate([np.arange(10) // 5, 2 + np.arange(30) // 5, [99] * 5])
    for idx in stats.resample_indices(45, n_resamples=10, strata=strata, groups=groups_ok, random_state=0):
        assert np.bincount(strata[idx], minlength=3)[2] == 5  # the single-group stratum is redrawn whole
    with pytest.raises(InputError, match="span several strata"):
        stats.bootstrap_ci(np.mean, np.arange(45.0), strata=strata, groups=np.r_[groups[:-1], 0])


def test_vector_statistic_and_nan_resamples_are_counted():
    y = np.r_[np.zeros(19), 1.0]
    s = np.arange(20.0)
    res = stats.bootstrap_ci(lambda a, b: [stats.auroc(a, b), np.mean(b)], y, s, n_resamples=200, random_state=0)
    assert res.samples.shape == (200, 2)
    assert res.estimate[0] == 1.0
    # about (19/20)**20 = 36% of resamples miss the one positive: AUROC NaN, counted and excluded
    assert 40 < res.n_invalid[0] < 110 and res.n_invalid[1] == 0
    assert np.isfinite(res.low).all()


def test_paired_bootstrap_difference():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    good = y + rng.normal(0, 0.5, 300)
    bad = y + rng.normal(0, 2.0, 300)
    res = stats.paired_bootstrap(stats.auroc, (y, good), (y, bad), n_resamples=300, random_state=0)
    assert res.estimate == pytest.approx(res.estimate_a - res.estimate_b)
    assert res.estimate_a == pytest.approx(roc_auc_score(y, good))
    assert res.low > 0 and res.share_positive > 0.99
    same = stats.paired_bootstrap(stats.auroc, (y, good), (y, good), n_resamples=50)
    assert same.estimate == 0 and same.low == 0 and same.high == 0 and same.share_positive == 0


def test_share_positive_counts_only_defined_differences_above_zero():
    import warnings

    # a tie is not positive, a NaN is not counted: 2 of the 4 defined differences are above 0
    assert stats.share_positive([0.3, 0.0, -0.2, np.nan, 1e-12]) == 0.5
    # a difference that could not be computed may come as None (a list built from records, an
    # object column): it is undefined like NaN, not an error
    assert stats.share_positive([0.3, None, -0.2]) == 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert np.isnan(stats.share_positive([np.nan, np.nan]))
        assert np.isnan(stats.share_positive([]))
    # paired_bootstrap reports the share of its own resampled differences, NaN resamples left out
    y = np.r_[np.zeros(3), np.ones(3)]
    res = stats.paired_bootstrap(stats.auroc, (y, np.arange(6.0)), (y, np.arange(6.0)[::-1]), n_resamples=40,
                                 random_state=1)
    assert np.isnan(res.samples).any() and res.share_positive == 1.0


def test_auroc_matches_sklearn_with_ties_and_nan_for_one_class():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.normal(size=200) + y, 1)  # many ties
    assert stats.auroc(y, s) == pytest.approx(roc_auc_score(y, s))
    import warnings

    # one class (a bootstrap resample can draw one): NaN, quietly; a 0 / 0 would warn on the book's pages
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(stats.auroc(np.ones(5), np.arange(5.0)))
        assert np.isnan(stats.auroc(np.zeros(3), np.arange(3.0)))


def test_bootstrap_bad_input():
    with pytest.raises(InputError, match="same number of rows"):
        stats.bootstrap_ci(np.mean, np.arange(5.0), np.arange(4.0))
    with pytest.raises(InputError, match="confidence"):
        stats.bootstrap_ci(np.mean, np.arange(5.0), confidence=95)
    with pytest.raises(InputError, match="n_resamples"):
        stats.bootstrap_ci(np.mean, np.arange(5.0), n_resamples=0)
    with pytest.raises(InputError, match="groups"):
        stats.bootstrap_ci(np.mean, np.arange(5.0), groups=[1, 2])
    assert issubclass(InputError, CRSError) and issubclass(InputError, ValueError)


def _sym(rng, m):
    P = rng.random((m, m))
    A = P + P.T
    np.fill_diagonal(A, 1.0)
    return A


def test_mantel_identical_matrices():
    A = _sym(np.random.default_rng(0), 8)
    res = stats.mantel_test(A, A, n_permutations=999, random_state=0)
    assert res.r == pytest.approx(1.0)
    assert res.p_value <= 0.002 and not res.exact
    pear = stats.mantel_test(A, 2 * A + 1, method="pearson", random_state=0)
    assert pear.r == pytest.approx(1.0) and pear.p_value <= 0.002


def test_mantel_random_matrices_not_significant_and_reproducible():
    rng = np.random.default_rng(5)
    A, B = _sym(rng, 9), _sym(rng, 9)
    r1 = stats.mantel_test(A, B, n_permutations=499, random_state=3)
    r2 = stats.mantel_test(A, B, n_permutations=499, random_state=3)
    assert r1 == r2
    assert r1.p_value > 0.05
    assert abs(r1.r) < 0.5


def test_mantel_exact_enumeration_for_few_models():
    A = _sym(np.random.default_rng(1), 5)
    res = stats.mantel_test(A, A, n_permutations=999)
    assert res.exact and res.n_permutations == 120
    assert res.p_value == pytest.approx(1 / 120)  # only the identity matches this well
    less = stats.mantel_test(A, -A, alternative="less")
    assert less.r == pytest.approx(-1.0) and less.p_value == pytest.approx(1 / 120)


def test_pairwise_spearman_and_mantel_statistic_agree_with_scipy():
    rng = np.random.default_rng(2)
    A, B = _sym(rng, 7), _sym(rng, 7)
    iu = np.triu_indices(7, 1)
    expected = spearmanr(A[iu], B[iu]).statistic
    assert stats.pairwise_spearman(A, B) == pytest.approx(expected)
    assert stats.mantel_test(A, B, n_permutations=99).r == pytest.approx(expected)


def test_mantel_bad_input():
    A = _sym(np.random.default_rng(0), 5)
    with pytest.raises(InputError, match="symmetric"):
        stats.mantel_test(A + np.triu(np.ones((5, 5)), 1), A)
    with pytest.raises(InputError, match="square"):
        stats.mantel_test(A[:, :4], A[:, :4])
    with pytest.raises(InputError, match="same shape"):
        stats.mantel_test(A, A[:4, :4])
    with pytest.raises(InputError, match="method"):
        stats.mantel_test(A, A, method="kendall")


def test_permutation_test():
    x = np.arange(40.0)
    res = stats.permutation_test(lambda a, b: np.corrcoef(a, b)[0, 1], x, x, n_permutations=199)
    assert res.statistic == pytest.approx(1.0) and res.p_value == pytest.approx(1 / 200)
    rng = np.random.default_rng(0)
    res = stats.permutation_test(lambda a, b: np.corrcoef(a, b)[0, 1], rng.normal(size=40), rng.normal(size=40))
    assert res.p_value > 0.05


def test_grouped_partition_keeps_groups_whole_and_disjoint() -> None:
    from crslib.splits import grouped_partition

    groups = np.repeat(np.arange(40), 3)
    parts = grouped_partition(groups, (0.5, 0.25, 0.25), random_state=1)
    assert sum(len(p) for p in parts) == len(groups)
    seen = [set(groups[p]) for p in parts]
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    assert [len(s) for s in seen] == [20, 10, 10]
    assert all(np.array_equal(a, b) for a, b in zip(parts, grouped_partition(groups, (0.5, 0.25, 0.25), random_state=1)))


# --------------------------------------------------------------------------- DeLong
# No published data set (Hanley & McNeil 1983, DeLong 1988) could be obtained
# reliably here, so the variance is checked against an independent brute-force
# implementation of the structural components (double loops), plus sklearn for
# the AUCs and a paired bootstrap for the standard error.


def _delong_brute_force(y, a, b):
    """Textbook DeLong (1988): psi-kernel double loops, covariance with divisor m-1, n-1."""
    y = np.asarray(y).astype(bool)
    out = []
    for s in (np.asarray(a, float), np.asarray(b, float)):
        X, Y = s[y], s[~y]
        psi = [[1.0 if x > v else 0.5 if x == v else 0.0 for v in Y] for x in X]
        v10 = [sum(row) / len(Y) for row in psi]
        v01 = [sum(psi[i][j] for i in range(len(X))) / len(X) for j in range(len(Y))]
        out.append((sum(v10) / len(X), v10, v01))
    (auc_a, v10a, v01a), (auc_b, v10b, v01b) = out
    m, n = len(v10a), len(v01a)

    def cov(u, w):
        mu, mw = sum(u) / len(u), sum(w) / len(w)
        return sum((ui - mu) * (wi - mw) for ui, wi in zip(u, w)) / (len(u) - 1)

    var_a = cov(v10a, v10a) / m + cov(v01a, v01a) / n
    var_b = cov(v10b, v10b) / m + cov(v01b, v01b) / n
    cov_ab = cov(v10a, v10b) / m + cov(v01a, v01b) / n
    return auc_a, auc_b, var_a + var_b - 2 * cov_ab


def test_delong_aucs_match_sklearn_and_variance_matches_brute_force():
    rng = np.random.default_rng(0)
    y = np.r_[np.zeros(14, int), np.ones(16, int)]
    rng.shuffle(y)
    a = np.round(y + rng.normal(0, 1, 30), 1)  # rounding -> ties within and across classes
    b = np.round(0.5 * y + rng.normal(0, 1, 30) + 0.3 * a, 0)
    assert len(np.unique(b)) < 10
    res = stats.delong_test(y, a, b)
    auc_a, auc_b, var = _delong_brute_force(y, a, b)
    assert res.auc_a == pytest.approx(roc_auc_score(y, a), abs=1e-12)
    assert res.auc_b == pytest.approx(roc_auc_score(y, b), abs=1e-12)
    assert (res.auc_a, res.auc_b) == pytest.approx((auc_a, auc_b), abs=1e-12)
    assert res.difference == pytest.approx(auc_a - auc_b, abs=1e-12)
    assert res.se == pytest.approx(np.sqrt(var), rel=1e-10)
    assert res.z == pytest.approx(res.difference / res.se)
    from scipy.stats import norm

    assert res.p_value == pytest.approx(2 * norm.sf(abs(res.z)))
    assert (res.low, res.high) == pytest.approx(
        (res.difference - 1.959964 * res.se, res.difference + 1.959964 * res.se), rel=1e-5)
    narrow = stats.delong_test(y, a, b, confidence=0.5)
    assert narrow.high - narrow.low < res.high - res.low and narrow.confidence == 0.5


def test_delong_identical_scores_give_zero_difference_and_p_one():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 80)
    a = rng.normal(size=80) + y
    for b in (a.copy(), 3 * a + 1):  # equal, or a monotone transform: same ranks
        res = stats.delong_test(y, a, b)
        assert res.difference == 0.0 and res.se == 0.0
        assert res.z == 0.0 and res.p_value == 1.0
        assert res.low == res.high == 0.0


def test_delong_rejects_for_better_score_and_is_calibrated_under_null():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 200)
    strong = stats.delong_test(y, y + rng.normal(0, 0.6, 200), y + rng.normal(0, 2.5, 200))
    assert strong.difference > 0 and strong.p_value < 0.01 and strong.low > 0
    p_values = []
    for _ in range(200):
        y = rng.integers(0, 2, 150)
        a = y + rng.normal(0, 1.5, 150)
        b = y + rng.normal(0, 1.5, 150)  # equally informative, independent noise
        p_values.append(stats.delong_test(y, a, b).p_value)
    p_values = np.array(p_values)
    assert 0.01 <= np.mean(p_values < 0.05) <= 0.12
    assert 0.35 < np.median(p_values) < 0.65  # roughly uniform


def test_delong_se_agrees_with_paired_bootstrap():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 400)
    a = y + rng.normal(0, 1.0, 400)
    b = 0.7 * y + 0.5 * a + rng.normal(0, 1.0, 400)  # correlated with a
    res = stats.delong_test(y, a, b)
    boot = stats.paired_bootstrap(stats.auroc, (y, a), (y, b), n_resamples=1000, random_state=0)
    assert boot.estimate == pytest.approx(res.difference)
    assert np.std(boot.samples, ddof=1) == pytest.approx(res.se, rel=0.15)


def test_delong_bad_input():
    y = np.array([0, 1, 0, 1, 1])
    s = np.arange(5.0)
    with pytest.raises(InputError, match="single class"):
        stats.delong_test(np.ones(5), s, s)
    with pytest.raises(InputError, match="same length"):
        stats.delong_test(y, s, s[:4])
    with pytest.raises(InputError, match="NaN"):
        stats.delong_test(y, s, np.r_[s[:4], np.nan])
    with pytest.raises(InputError, match="0/1"):
        stats.delong_test([0, 1, 2, 1, 0], s, s)
    with pytest.raises(InputError, match="confidence"):
        stats.delong_test(y, s, s, confidence=95)


# --------------------------------------------------------------------------- interval coverage known answers


@pytest.mark.parametrize("confidence", [0.95, 0.8])
def test_percentile_interval_cuts_half_of_alpha_on_each_side(confidence):
    x = np.random.default_rng(7).normal(size=200)
    res = stats.bootstrap_ci(np.mean, x, n_resamples=2000, confidence=confidence, random_state=1)
    alpha = (1 - confidence) / 2
    assert res.low == pytest.approx(np.percentile(res.samples, 100 * alpha))
    assert res.high == pytest.approx(np.percentile(res.samples, 100 * (1 - alpha)))
    inside = np.mean((res.samples >= res.low) & (res.samples <= res.high))
    assert inside == pytest.approx(confidence, abs=0.005)
    # a normal mean: the percentile interval is about mean +- z * sd / sqrt(n)
    z = {0.95: 1.96, 0.8: 1.2816}[confidence]
    half = z * x.std(ddof=1) / np.sqrt(len(x))
    assert (res.high - res.low) / 2 == pytest.approx(half, rel=0.1)


def test_paired_interval_cuts_half_of_alpha_on_each_side():
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=150), rng.normal(size=150)
    res = stats.paired_bootstrap(np.mean, a, b, n_resamples=1000, confidence=0.9, random_state=2)
    assert res.low == pytest.approx(np.percentile(res.samples, 5))
    assert res.high == pytest.approx(np.percentile(res.samples, 95))
    assert np.mean((res.samples >= res.low) & (res.samples <= res.high)) == pytest.approx(0.9, abs=0.005)


def test_permutation_p_value_known_answers():
    from crslib.stats import permutation_p_value

    assert permutation_p_value(0.5, np.array([0.1, 0.5, 0.9])) == pytest.approx(3 / 4)  # ties count as extreme
    assert permutation_p_value(1.0, np.array([0.1, 0.2, 0.3])) == pytest.approx(1 / 4)  # never below 1/(n+1)
    assert permutation_p_value(0.0, np.array([0.1, 0.2, 0.3])) == 1.0
    assert permutation_p_value(0.5, np.array([0.9, np.nan, 0.1, np.inf])) == pytest.approx(2 / 3)  # non-finite left out
    assert permutation_p_value(0.3 + 1e-13, np.array([0.3])) == 1.0  # float noise is a tie
    assert np.isnan(permutation_p_value(np.nan, np.array([0.1])))
    assert np.isnan(permutation_p_value(0.5, np.array([np.nan, np.nan])))
    assert np.isnan(permutation_p_value(0.5, np.array([])))


def test_group_permuter_moves_whole_groups_between_groups_of_one_size():
    from crslib.stats import group_permuter

    groups = np.array(["a", "a", "b", "b", "c", "c", "d", "e", "f", 7, "7"])  # 7 and "7" are one group (as text)
    values = np.arange(len(groups)) * 10
    permute = group_permuter(groups)
    rng = np.random.default_rng(0)
    blocks = {"a": (0, 10), "b": (20, 30), "c": (40, 50), "7": (90, 100)}
    seen_pairs, seen_single = set(), set()
    for _ in range(300):
        out = permute(values, rng)
        assert sorted(out) == sorted(values) and out is not values
        pairs = [tuple(out[groups.astype(str) == g]) for g in ("a", "b", "c", "7")]
        assert sorted(pairs) == sorted(blocks.values())  # each pair block lands whole, in order, on a pair group
        seen_pairs.add(tuple(pairs))
        seen_single.add(tuple(out[6:9]))
        assert set(out[6:9]) == {60, 70, 80}  # single rows trade only with single rows
    assert len(seen_pairs) == 24 and len(seen_single) == 6  # every arrangement of the blocks is drawn
    np.testing.assert_array_equal(values, np.arange(len(groups)) * 10)  # the input is left alone
    same = group_permuter(groups)(values, np.random.default_rng(5))
    np.testing.assert_array_equal(same, permute(values, np.random.default_rng(5)))


def test_mantel_sampled_null_is_every_drawn_relabelling_across_chunks():
    """Above 1,024 permutations the null is drawn in chunks; every draw counts, in the order drawn."""
    rng = np.random.default_rng(7)
    m = 12  # 12! orderings: sampled, not enumerated
    pts = rng.normal(size=(m, 2))
    A = np.linalg.norm(pts[:, None] - pts[None, :], axis=-1)
    B = A + rng.normal(scale=4.0, size=(m, m))
    B = (B + B.T) / 2
    res = stats.mantel_test(A, B, n_permutations=2100, alternative="greater", random_state=11)
    draws = np.argsort(np.random.default_rng(11).random((2100, m)), axis=1)
    null = np.array([stats.pairwise_spearman(A[p][:, p], B) for p in draws])
    assert res.r == pytest.approx(stats.pairwise_spearman(A, B))
    assert res.p_value == pytest.approx((1 + np.sum(null >= res.r - 1e-12)) / 2101)
    assert 1 / 2101 < res.p_value < 1  # neither extreme: the check sees the null's values


def test_group_permuter_keeps_a_group_without_a_same_size_partner_in_place():
    from crslib.stats import group_permuter

    # sizes 1, 1, 2, 2 and a lone group of 3: the lone group cannot trade with anyone
    groups = np.array(["s1", "s2", "p1", "p1", "p2", "p2", "t", "t", "t"])
    values = np.arange(9) * 10
    permute = group_permuter(groups)
    rng = np.random.default_rng(1)
    drawn = set()
    for _ in range(50):
        out = permute(values, rng)
        np.testing.assert_array_equal(out[6:], [60, 70, 80])
        assert set(out[:2]) == {0, 10} and sorted([tuple(out[2:4]), tuple(out[4:6])]) == [(20, 30), (40, 50)]
        drawn.add(tuple(out[:6]))
    assert len(drawn) == 4  # both singles and both pairs are exchanged


def test_group_permuter_refuses_a_nan_among_text_group_ids():
    from crslib.stats import group_permuter

    with pytest.raises(InputError, match=r"^groups has 1 missing value\(s\) \(NaN or None\)"):
        group_permuter(["a", "a", np.nan, "b"])  # as text it would read "nan", one more patient


def test_percentile_interval_counts_a_none_statistic_as_invalid():
    from crslib.stats import percentile_interval

    low, high, n_invalid = percentile_interval([0.0, None, 10.0], 0.5)
    assert (float(low), float(high), int(n_invalid)) == (2.5, 7.5, 1)


def test_permutation_p_value_counts_a_null_value_within_1e_12_below_as_a_tie():
    from crslib.stats import permutation_p_value

    assert permutation_p_value(1.0, np.array([1.0 - 1e-12])) == 1.0
    assert permutation_p_value(1.0, np.array([1.0 - 1e-11])) == 0.5


def test_auroc_label_errors_read_whole():
    from crslib.stats import auroc

    assert error_message(auroc, ["yes", "no"], [0.2, 0.8]) == (
        "y_true must hold 0/1 (or bool) labels; map them to 0 (negative) and 1 (positive)")
    assert error_message(auroc, [0, 1, 5, 4, 3, 2], np.linspace(0, 1, 6)) == (
        "y_true must hold 0/1 (or bool) labels, but 4 labels are not (e.g. [2, 3, 4]); map them to 0 (negative) "
        "and 1 (positive)")




def test_sum_of_squares_equals_the_resampled_rows_and_tells_rounding_noise_from_variation():
    rng = np.random.default_rng(11)
    values = rng.normal(size=12)
    counts = rng.integers(0, 4, size=(6, 12)).astype(float)
    counts[:, 0] += 1  # every resample draws something
    ss, varies = stats.sum_of_squares(values, counts)
    for r in range(6):
        drawn = np.repeat(values, counts[r].astype(int))
        assert ss[r] == pytest.approx(np.sum((drawn - drawn.mean()) ** 2), rel=1e-12)
    assert varies.tolist() == [True] * 6
    # no counts: one resample of every value once
    one, one_varies = stats.sum_of_squares(values)
    assert one.shape == (1,) and one[0] == pytest.approx(11 * values.var(ddof=1), rel=1e-12) and one_varies[0]

    # a large offset: centring first keeps the sum exact where a one-pass sum would lose it all
    ss, varies = stats.sum_of_squares(1e8 + np.array([-1.0, 0.0, 1.0]), np.array([[1.0, 1.0, 1.0], [2.0, 0.0, 2.0]]))
    assert ss.tolist() == [2.0, 4.0] and varies.tolist() == [True, True]
    # variation at a tiny scale is variation: the test is relative, not absolute
    ss, varies = stats.sum_of_squares(1e-7 * values)
    assert varies[0] and ss[0] == pytest.approx(1e-14 * 11 * values.var(ddof=1), rel=1e-9)

    # constants: 0.1s whose computed mean is not 0.1, and a resample that draws only equal values of a varying
    # column (its sum is rounding noise, not 0)
    assert not stats.sum_of_squares(np.full(3, 0.1))[1][0]
    exact, exact_varies = stats.sum_of_squares(np.full(4, 2.0), np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 3.0, 0.0, 1.0]]))
    assert exact.tolist() == [0.0, 0.0] and exact_varies.tolist() == [False, False]  # no noise at all: still constant
    y = np.array([0.1, 0.1, 0.1, 0.7, 1.3, 2.9])
    ss, varies = stats.sum_of_squares(y, np.array([[1.0, 2.0, 4.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]]))
    assert 0 < ss[0] < 1e-14 and varies.tolist() == [False, True]
    assert ss[1] == pytest.approx(0.18, rel=1e-12)
