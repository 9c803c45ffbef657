"""crslib.metrics: metrics vs scikit-learn, threshold rules, ECE, calibration."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit
from sklearn import metrics as skm

from crslib import metrics
from crslib.errors import InputError


def _tied_data(seed: int, n: int = 300, levels: int = 12):
    """Labels and probabilities rounded to few levels, so there are many ties."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    # both classes at every level, including exactly 0.0 and 1.0
    p = np.round(expit(1.5 * rng.normal(size=n) + y) * levels) / levels
    return y, p


# --------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("threshold", [0.0, 0.25, 0.5, 0.5833333333333334, 0.9, 1.0])
def test_binary_metrics_match_sklearn_with_ties(seed, threshold):
    y, p = _tied_data(seed)
    assert np.unique(p).size < 20  # ties really present
    got = metrics.binary_metrics(y, p, threshold=threshold)
    pred = (p >= threshold).astype(int)
    expected = {
        "auroc": skm.roc_auc_score(y, p),
        "auprc": skm.average_precision_score(y, p),
        "balanced_accuracy": skm.balanced_accuracy_score(y, pred),
        "sensitivity": skm.recall_score(y, pred),
        "specificity": skm.recall_score(y, pred, pos_label=0),
        "f1": skm.f1_score(y, pred, zero_division=0),
    }
    assert set(got) == set(metrics.METRICS)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
        assert metrics.metric_score(y, p, metric=name, threshold=threshold) == pytest.approx(value, abs=1e-12)


def test_auprc_matches_sklearn_on_continuous_and_heavily_tied_scores():
    rng = np.random.default_rng(5)
    for n, levels in [(50, None), (500, 3), (200, 2)]:
        y = rng.integers(0, 2, n)
        p = rng.random(n)
        if levels:
            p = np.round(p * levels) / levels
        assert metrics.metric_score(y, p, metric="auprc") == pytest.approx(skm.average_precision_score(y, p), abs=1e-12)


def test_f1_is_zero_without_predicted_or_true_positives():
    y = np.array([0, 0, 1, 1])
    p = np.array([0.1, 0.2, 0.3, 0.4])
    assert metrics.binary_metrics(y, p, threshold=0.9)["f1"] == 0.0
    assert metrics.metric_score([0, 0], [0.1, 0.2], metric="f1") == 0.0
    assert np.isnan(metrics.metric_score([0, 0], [0.1, 0.2], metric="sensitivity"))
    assert np.isnan(metrics.metric_score([0, 0], [0.1, 0.2], metric="auroc"))


def test_metric_score_unknown_name_lists_metrics():
    with pytest.raises(InputError, match="unknown metric 'accuracy'.*auroc.*f1"):
        metrics.metric_score([0, 1], [0.2, 0.8], metric="accuracy")


# --------------------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    "y, p, pattern",
    [
        ([0, 0, 0], [0.1, 0.2, 0.3], "only the negative \\(0\\) class.*needs both classes"),
        ([1, 1], [0.1, 0.2], "only the positive \\(1\\) class"),
        ([0, np.nan, 1], [0.1, 0.2, 0.3], "label column has 1 missing values"),
        (np.array([0, None, 1, None], dtype=object), [0.1, 0.2, 0.3, 0.4], "label column has 2 missing"),
        ([0, 1, 2], [0.1, 0.2, 0.3], "binary 0/1.*1 labels are not"),
        (["a", "b"], [0.1, 0.2], "binary 0/1"),
        ([0, 1], [0.2, 1.2], "outside.*\\[0.2, 1.2\\]"),
        ([0, 1, 1], [-0.1, 0.5, 0.7], "1 values lie outside.*-0.1"),
        ([0, 1], [0.2, np.nan], "1 NaN or infinite"),
        ([0, 1], [0.2, np.inf], "NaN or infinite"),
        ([0, 1, 1], [0.2, 0.5], "same length.*3 labels and 2"),
        ([], [], "empty"),
    ],
)
def test_check_binary_rejects_bad_input_with_useful_message(y, p, pattern):
    with pytest.raises(InputError, match=pattern):
        metrics.check_binary(y, p)
    with pytest.raises(InputError, match=pattern):
        metrics.binary_metrics(y, p)


def test_check_binary_accepts_bool_float_and_single_class_when_allowed():
    y, p = metrics.check_binary(np.array([True, False]), [1, 0])
    assert y.dtype == np.int64 and y.tolist() == [1, 0] and p.dtype == float
    y, _ = metrics.check_binary([1.0, 0.0], [0.5, 0.5])
    assert y.tolist() == [1, 0]
    y, _ = metrics.check_binary([1, 1], [0.5, 0.6], require_both=False)
    assert y.tolist() == [1, 1]
    with pytest.raises(InputError, match="1-D"):
        metrics.check_binary([[0, 1], [1, 0]], [[0.1, 0.2], [0.3, 0.4]])


# --------------------------------------------------------------------------- thresholds


def test_fit_threshold_known_answers():
    y = np.array([0, 0, 0, 1, 1])
    separable = np.array([0.1, 0.2, 0.3, 0.7, 0.9])
    t = metrics.fit_threshold(y, separable, rule="youden")
    assert t == 0.7
    assert metrics.binary_metrics(y, separable, threshold=t)["balanced_accuracy"] == 1.0
    assert metrics.fit_threshold(y, separable, rule="f1_max") == 0.7
    assert metrics.fit_threshold(y, separable, rule="fixed_0.5") == 0.5
    # overlap: positives 0.35, 0.8; negatives 0.1, 0.4, 0.6
    y2 = np.array([0, 1, 0, 0, 1])
    p2 = np.array([0.1, 0.35, 0.4, 0.6, 0.8])
    # J at 0.8: 0.5-0=0.5; 0.6: 0.5-1/3; 0.4: 0.5-2/3; 0.35: 1-2/3=1/3 -> 0.8
    assert metrics.fit_threshold(y2, p2, rule="youden") == 0.8
    # F1 at 0.8: 2/3; at 0.35: 2*2/(2*2+2+0)=2/3 -> tie, the larger threshold wins
    assert metrics.fit_threshold(y2, p2, rule="f1_max") == 0.8
    # sensitivity >= 0.9 needs both positives: the largest such threshold is 0.35
    assert metrics.fit_threshold(y2, p2, rule="sensitivity_0.9") == 0.35
    assert metrics.fit_threshold(y2, p2, rule="sensitivity_0.9", min_sensitivity=0.5) == 0.8


def test_youden_ties_pick_the_largest_threshold():
    # J = 0.5 at 0.8 (1 of 2 positives, no negatives) and at 0.3 (2 positives, 1 of 2 negatives)
    y = np.array([0, 0, 1, 1])
    p = np.array([0.1, 0.5, 0.3, 0.8])
    assert metrics.fit_threshold(y, p, rule="youden") == 0.8


def test_sensitivity_rule_reaches_target_on_fit_data():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 500)
    p = expit(rng.normal(size=500) + 1.5 * y)
    for target in (0.9, 0.8, 0.95):
        t = metrics.fit_threshold(y, p, rule="sensitivity_0.9", min_sensitivity=target)
        assert metrics.metric_score(y, p, metric="sensitivity", threshold=t) >= target
        # the largest such threshold: the next observed probability above misses the target
        above = np.unique(p[p > t])
        if above.size:
            assert metrics.metric_score(y, p, metric="sensitivity", threshold=above[0]) < target


def test_prevalence_rule_matches_predicted_positive_share():
    rng = np.random.default_rng(1)
    y = (rng.random(400) < 0.25).astype(int)
    p = rng.random(400)
    t = metrics.fit_threshold(y, p, rule="prevalence")
    assert np.mean(p >= t) == pytest.approx(y.mean())
    t = metrics.fit_threshold(y, p, rule="prevalence", prevalence=0.1)
    assert np.mean(p >= t) == pytest.approx(0.1)
    assert t in p  # chosen from the observed probabilities


def test_fit_threshold_unknown_rule_and_bad_options():
    with pytest.raises(InputError, match="unknown threshold rule 'otsu'.*youden.*prevalence"):
        metrics.fit_threshold([0, 1], [0.2, 0.8], rule="otsu")
    with pytest.raises(InputError, match="prevalence must be in"):
        metrics.fit_threshold([0, 1], [0.2, 0.8], rule="prevalence", prevalence=1.5)
    with pytest.raises(InputError, match="min_sensitivity"):
        metrics.fit_threshold([0, 1], [0.2, 0.8], rule="sensitivity_0.9", min_sensitivity=0)
    with pytest.raises(InputError, match="needs both classes"):
        metrics.fit_threshold([1, 1], [0.2, 0.8], rule="youden")


def test_threshold_transfer_gap_is_eval_minus_fit():
    rng = np.random.default_rng(2)
    yf, ye = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    pf = expit(rng.normal(size=300) + 2 * yf)
    pe = expit(rng.normal(size=300) + 1 * ye - 0.5)
    table = metrics.threshold_transfer(yf, pf, ye, pe)
    assert list(table.columns) == ["rule", "threshold", "prevalence", "metric", "fit_value", "eval_value", "gap"]
    assert len(table) == len(metrics.THRESHOLD_RULES) * 4
    assert np.allclose(table["gap"], table["eval_value"] - table["fit_value"])
    for row in table.itertuples():
        assert row.threshold == metrics.fit_threshold(yf, pf, rule=row.rule)
        assert row.fit_value == pytest.approx(metrics.metric_score(yf, pf, metric=row.metric, threshold=row.threshold))
        assert row.eval_value == pytest.approx(metrics.metric_score(ye, pe, metric=row.metric, threshold=row.threshold))
    # a Youden threshold fitted on the easier split is optimistic there
    youden = table[(table["rule"] == "youden") & (table["metric"] == "balanced_accuracy")].iloc[0]
    assert youden["gap"] < 0
    with pytest.raises(InputError, match="unknown metric"):
        metrics.threshold_transfer(yf, pf, ye, pe, metrics=["accuracy"])
    with pytest.raises(InputError, match="unknown threshold rule"):
        metrics.threshold_transfer(yf, pf, ye, pe, rules=["youden", "bogus"])


def test_threshold_transfer_prevalence_rule_uses_the_prevalence_passed():
    rng = np.random.default_rng(4)
    yf, ye = np.tile([0, 1], 100), np.tile([0, 1], 100)
    pf, pe = rng.random(200), rng.random(200)
    table = metrics.threshold_transfer(yf, pf, ye, pe, rules=["prevalence", "youden"], metrics=["sensitivity"],
                                       prevalence=0.1)
    row = table.set_index("rule").loc["prevalence"]
    assert row["threshold"] == metrics.fit_threshold(yf, pf, rule="prevalence", prevalence=0.1)
    assert np.mean(pf >= row["threshold"]) == pytest.approx(0.1) and row["prevalence"] == 0.1
    assert np.isnan(table.set_index("rule").loc["youden", "prevalence"])
    # without it, the fitting rows' share of positives (as fit_threshold's default)
    default = metrics.threshold_transfer(yf, pf, ye, pe, rules=["prevalence"], metrics=["sensitivity"]).iloc[0]
    assert default["prevalence"] == 0.5
    assert default["threshold"] == metrics.fit_threshold(yf, pf, rule="prevalence")


# --------------------------------------------------------------------------- calibration error


def test_ece_uniform_hand_computed_with_edges():
    # 4 bins of width 0.25: 0.0 -> bin 0, 0.25 -> bin 1, 0.5 -> bin 2, 1.0 -> bin 3 (last)
    y = np.array([0, 1, 1, 1, 0])
    p = np.array([0.0, 0.25, 0.5, 1.0, 0.99])
    # bin0: |0-0|=0; bin1: |0.25-1|=0.75 (n=1); bin2: |0.5-1|=0.5 (n=1);
    # bin3: mean 0.995, frac 0.5 -> 0.495 (n=2)
    expected = (0 + 0.75 + 0.5 + 2 * 0.495) / 5
    assert metrics.calibration_error(y, p, n_bins=4) == pytest.approx(expected)
    curve = metrics.reliability_curve(y, p, n_bins=4, n_resamples=20)
    assert curve["bin"].tolist() == [0, 1, 2, 3]
    assert curve["count"].tolist() == [1, 1, 1, 2]
    assert curve.loc[curve["bin"] == 3, "mean_prob"].item() == pytest.approx(0.995)
    # 1.0 alone is in the last bin (not an extra 11th bin) and 0.0 in the first
    assert metrics.calibration_error([1], [1.0], n_bins=10) == 0.0
    assert metrics.calibration_error([0], [0.0], n_bins=10) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eight empty bins: their 0/0 fractions stay out of sight, not on the page
        assert metrics.reliability_curve([1, 0], [1.0, 0.0], n_bins=10, n_resamples=5)["bin"].tolist() == [0, 9]


def test_ece_quantile_hand_computed_and_ties_kept_together():
    y = np.array([0, 0, 1, 0, 1, 1])
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.8, 0.9])
    # 3 bins of 2: {0.1,0.2}: |0.15-0|; {0.3,0.4}: |0.35-0.5|; {0.8,0.9}: |0.85-1|
    expected = (2 * 0.15 + 2 * 0.15 + 2 * 0.15) / 6
    assert metrics.calibration_error(y, p, n_bins=3, strategy="quantile") == pytest.approx(expected)
    # uniform with 3 bins: [0,1/3): 0.1,0.2,0.3 -> |0.2-1/3|; [1/3,2/3): 0.4 -> 0.4; [2/3,1]: 0.85 vs 1
    expected_u = (3 * abs(0.2 - 1 / 3) + 0.4 + 2 * 0.15) / 6
    assert metrics.calibration_error(y, p, n_bins=3) == pytest.approx(expected_u)
    # 5 cases in 2 bins: np.array_split sizes (3, 2)
    curve = metrics.reliability_curve([0, 0, 1, 1, 1], [0.1, 0.2, 0.3, 0.6, 0.7], n_bins=2,
                                      strategy="quantile", n_resamples=5)
    assert curve["count"].tolist() == [3, 2]
    assert curve["low_edge"].tolist() == [0.0, 0.6] and curve["high_edge"].tolist() == [0.6, 1.0]
    # a tie run across the cut joins the upper bin, whatever the row order
    y_t = np.array([0, 1, 0, 1, 1, 1])
    p_t = np.array([0.1, 0.5, 0.5, 0.5, 0.5, 0.9])
    curve = metrics.reliability_curve(y_t, p_t, n_bins=2, strategy="quantile", n_resamples=5)
    assert curve["count"].tolist() == [1, 5]
    perm = np.array([5, 3, 0, 2, 4, 1])
    assert metrics.calibration_error(y_t, p_t, n_bins=2, strategy="quantile") == pytest.approx(
        metrics.calibration_error(y_t[perm], p_t[perm], n_bins=2, strategy="quantile"))
    # more bins than cases: sizes (1, 1, 1, 0, 0); each case keeps its own bin and the empty trailing
    # bins close at 1.0, so the last case's bin still ends at 1.0
    curve = metrics.reliability_curve([0, 1, 1], [0.2, 0.5, 0.9], n_bins=5, strategy="quantile", n_resamples=5)
    assert curve["bin"].tolist() == [0, 1, 2] and curve["count"].tolist() == [1, 1, 1]
    assert curve["low_edge"].tolist() == [0.0, 0.5, 0.9] and curve["high_edge"].tolist() == [0.5, 0.9, 1.0]


def test_ece_small_for_calibrated_data_and_large_for_distorted():
    rng = np.random.default_rng(0)
    p = rng.random(20000)
    y = (rng.random(20000) < p).astype(int)
    for strategy in ("uniform", "quantile"):
        good = metrics.calibration_error(y, p, strategy=strategy)
        bad = metrics.calibration_error(y, p**3, strategy=strategy)
        assert good < 0.02
        assert bad > 0.15 and bad > 10 * good


def test_brier_matches_sklearn():
    y, p = _tied_data(3)
    assert metrics.brier_loss(y, p) == pytest.approx(skm.brier_score_loss(y, p), abs=1e-15)


def test_unknown_strategy_and_bad_bins():
    with pytest.raises(InputError, match="unknown binning strategy 'equal'.*uniform, quantile"):
        metrics.calibration_error([0, 1], [0.2, 0.8], strategy="equal")
    with pytest.raises(InputError, match="n_bins"):
        metrics.calibration_error([0, 1], [0.2, 0.8], n_bins=0)
    with pytest.raises(InputError, match="outside"):
        metrics.calibration_error([0, 1], [0.2, 1.2])


# --------------------------------------------------------------------------- reliability curve


def test_reliability_curve_band_contains_estimate_and_is_reproducible():
    rng = np.random.default_rng(4)
    p = rng.random(2000)
    y = (rng.random(2000) < p).astype(int)
    a = metrics.reliability_curve(y, p, n_resamples=100, random_state=3)
    b = metrics.reliability_curve(y, p, n_resamples=100, random_state=3)
    c = metrics.reliability_curve(y, p, n_resamples=100, random_state=4)
    pd.testing.assert_frame_equal(a, b)
    assert not np.array_equal(a["frac_pos_low"], c["frac_pos_low"])
    assert list(a.columns) == ["bin", "low_edge", "high_edge", "count", "mean_prob", "frac_pos",
                               "frac_pos_low", "frac_pos_high"]
    assert ((a["frac_pos_low"] <= a["frac_pos"]) & (a["frac_pos"] <= a["frac_pos_high"])).all()
    assert (a["frac_pos_high"] - a["frac_pos_low"] > 0).all()
    assert ((a["low_edge"] <= a["mean_prob"]) & (a["mean_prob"] < a["high_edge"])).all()
    assert a["count"].sum() == 2000
    # the documented defaults: 200 resamples, random_state 0
    pd.testing.assert_frame_equal(metrics.reliability_curve(y[:300], p[:300]),
                                  metrics.reliability_curve(y[:300], p[:300], n_resamples=200, random_state=0))
    for other in ({"n_resamples": 201}, {"random_state": 1}):
        changed = metrics.reliability_curve(y[:300], p[:300], n_resamples=other.get("n_resamples", 200),
                                            random_state=other.get("random_state", 0))
        assert not changed["frac_pos_low"].equals(metrics.reliability_curve(y[:300], p[:300])["frac_pos_low"])
    # bins are fixed from the data: the quantile curve has ~equal counts
    q = metrics.reliability_curve(y, p, strategy="quantile", n_resamples=20)
    assert q["count"].tolist() == [200] * 10


def test_reliability_curve_grouped_band_is_wider():
    rng = np.random.default_rng(6)
    n_groups = 150
    groups = np.repeat(np.arange(n_groups), 8)
    p = np.repeat(rng.random(n_groups), 8)
    y = np.repeat((rng.random(n_groups) < p[::8]).astype(int), 8)  # whole group shares its label
    rows = metrics.reliability_curve(y, p, n_bins=5, n_resamples=200)
    grouped = metrics.reliability_curve(y, p, n_bins=5, n_resamples=200, groups=groups)
    width_rows = (rows["frac_pos_high"] - rows["frac_pos_low"]).mean()
    width_groups = (grouped["frac_pos_high"] - grouped["frac_pos_low"]).mean()
    assert width_groups > 1.8 * width_rows


# --------------------------------------------------------------------------- recalibration


def _overconfident(seed: int, n: int, factor: float = 3.0):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1.5, n)
    y = (rng.random(n) < expit(z)).astype(int)
    return y, expit(factor * z)


def test_temperature_scaling_recovers_t_and_reduces_test_ece():
    y_val, p_val = _overconfident(0, 5000)
    y_test, p_test = _overconfident(1, 5000)
    cal = metrics.fit_calibrator(y_val, p_val, method="temperature")
    assert cal.method == "temperature"
    assert cal.params["temperature"] == pytest.approx(3.0, rel=0.1)
    p_new = cal.transform(p_test)
    before = metrics.calibration_error(y_test, p_test)
    after = metrics.calibration_error(y_test, p_new)
    assert before > 0.08 and after < 0.03
    # temperature keeps the ranking
    assert metrics.metric_score(y_test, p_new, metric="auroc") == pytest.approx(metrics.metric_score(y_test, p_test, metric="auroc"))
    # frozen: Python's dataclass guard, not a user-input error, so not a crslib exception
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'method'"):
        cal.method = "platt"
    assert cal.method == "temperature"
    # a hand-made calibrator with an unknown method is a crslib error when used
    with pytest.raises(InputError, match="unknown calibration method 'isotonic'; choose from temperature, platt"):
        metrics.Calibrator("isotonic", {}).transform(p_test)


def test_platt_recovers_slope_and_intercept():
    rng = np.random.default_rng(2)
    z = rng.normal(0, 2, 20000)
    a_true, b_true = 0.5, -0.8
    y = (rng.random(20000) < expit(a_true * z + b_true)).astype(int)
    cal = metrics.fit_calibrator(y, expit(z), method="platt")
    assert cal.params["a"] == pytest.approx(a_true, abs=0.05)
    assert cal.params["b"] == pytest.approx(b_true, abs=0.05)
    # agrees with an unregularised logistic regression on the logit
    from sklearn.linear_model import LogisticRegression

    lr = LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(z[:, None], y)
    assert cal.params["a"] == pytest.approx(lr.coef_[0, 0], abs=1e-3)
    assert cal.params["b"] == pytest.approx(lr.intercept_[0], abs=1e-3)


def test_calibrator_clips_extreme_probabilities_and_rejects_unknown_method():
    y, p = _overconfident(3, 500)
    cal = metrics.fit_calibrator(y, p, method="temperature")
    out = cal.transform(np.array([0.0, 1.0, 0.5]))
    assert np.isfinite(out).all() and 0 < out[0] < 0.5 < out[2] + 1e-12 and out[1] < 1
    with pytest.raises(InputError, match="unknown calibration method 'isotonic'.*temperature, platt"):
        metrics.fit_calibrator(y, p, method="isotonic")
    with pytest.raises(InputError, match="outside"):
        cal.transform([0.5, 1.2])


def test_calibration_transfer_table():
    y_val, p_val = _overconfident(4, 3000)
    y_test, p_test = _overconfident(5, 3000)
    table = metrics.calibration_transfer(y_val, p_val, y_test, p_test, fit_name="val")
    assert table["method"].tolist() == ["none", "temperature", "platt"]
    assert (table["fitted_on"] == "val").all()
    none = table.iloc[0]
    assert none["ece_uniform_after"] == none["ece_uniform_before"] == pytest.approx(
        metrics.calibration_error(y_test, p_test))
    assert none["brier_before"] == pytest.approx(skm.brier_score_loss(y_test, p_test))
    for _, row in table.iloc[1:].iterrows():
        assert row["ece_uniform_after"] < row["ece_uniform_before"] / 2
        assert row["ece_quantile_after"] < row["ece_quantile_before"] / 2
        assert row["brier_after"] < row["brier_before"]
    temp = table.iloc[1]
    cal = metrics.fit_calibrator(y_val, p_val, method="temperature")
    assert temp["params"] == cal.params
    assert temp["ece_quantile_after"] == pytest.approx(
        metrics.calibration_error(y_test, cal.transform(p_test), strategy="quantile"))
    with pytest.raises(InputError, match="unknown calibration method"):
        metrics.calibration_transfer(y_val, p_val, y_test, p_test, methods=["beta"])


def test_reliability_diagram_draws_curves():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from crslib.plots import reliability_diagram

    y, p = _overconfident(7, 1000)
    cal = metrics.fit_calibrator(y, p, method="temperature")
    curves = pd.concat([
        metrics.reliability_curve(y, p, n_resamples=20).assign(stage="before"),
        metrics.reliability_curve(y, cal.transform(p), n_resamples=20).assign(stage="after"),
    ])
    ax = reliability_diagram(curves, label_col="stage")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "before" in labels and "after" in labels
    assert ax.get_ylabel() == "observed fraction positive"
    assert tuple(float(v) for v in ax.get_ylim()) == (0.0, 1.0)
    plt.close(ax.figure)
