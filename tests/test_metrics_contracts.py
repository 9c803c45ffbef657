"""crslib.metrics: exact input errors, boundaries and rule definitions.

Each test pins what a user sees or a documented edge (probabilities of exactly
0 and 1, a column vector, the largest of tied optimal thresholds), so that a
changed bound, default or message in ``crslib.metrics`` fails a test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score, balanced_accuracy_score, f1_score

from crslib import metrics as M
from crslib.errors import InputError
from crslib.stats import resample_indices
from assertions import error_message


# --------------------------------------------------------------------------- validation


def test_shapes_and_lengths():
    assert M.check_binary(np.array([[1], [0]]), np.array([[0.9], [0.2]]))[1].tolist() == [0.9, 0.2]
    assert error_message(M.check_binary, np.ones((2, 2)), [0.1, 0.2]) == (
        "y_true must be a 1-D array with one value per case, got shape (2, 2)")
    assert error_message(M.check_binary, [0, 1], np.ones((2, 2)) / 2, name="p_val") == (
        "p_val must be a 1-D array with one value per case, got shape (2, 2)")
    assert error_message(M.check_binary, [0, 1, 1], [0.1, 0.2], name="p_test") == (
        "y_true and p_test must have the same length, got 3 labels and 2 probabilities; "
        "pass one probability per case")
    assert error_message(M.check_binary, [], []) == "y_true and y_prob are empty: there are no cases to evaluate"


def test_probability_messages_and_bounds():
    y = [0, 1, 0, 1]
    y_out, p = M.check_binary(y, [0.0, 1.0, 0.5, 1])  # both ends are probabilities
    assert p.dtype == np.float64 and p.tolist() == [0.0, 1.0, 0.5, 1.0] and y_out.dtype == np.int64
    assert error_message(M.check_binary, y, [0.1, np.nan, np.inf, 0.2]) == (
        "y_prob has 2 NaN or infinite values; drop those cases or fill them before computing metrics")
    assert error_message(M.check_binary, y, [-0.5, 0.2, 1.5, 2.0], name="p_fit") == (
        "p_fit must be probabilities in [0, 1], but 3 values lie outside (range found [-0.5, 2]); "
        "pass probabilities, e.g. a sigmoid of the logits, not raw scores")
    assert error_message(M.check_binary, y, [0.1, 1 + 1e-9, 0.2, 0.3]).startswith(
        "y_prob must be probabilities in [0, 1], but 1 values lie outside")
    assert error_message(M.check_binary, y, [-1e-9, 0.5, 0.2, 0.3]).startswith(
        "y_prob must be probabilities in [0, 1], but 1 values lie outside")
    assert error_message(M.check_binary, y, ["0.1", "0.2", "a", "0.4"]) == (
        "y_prob must hold numbers (probabilities in [0, 1]); 'a' is not one")
    assert error_message(M.check_binary, y, [0.1, None, 0.3, 0.4]).startswith(  # None reads as missing
        "y_prob has 1 NaN or infinite values")


def test_label_messages():
    p = [0.1, 0.2, 0.3, 0.4]
    assert M.check_binary([True, False, True, False], p)[0].tolist() == [1, 0, 1, 0]
    assert M.check_binary(np.array([1.0, 0.0, 1.0, 0.0]), p)[0].tolist() == [1, 0, 1, 0]
    assert M.check_binary(np.array([1, 0, 1, 0], dtype=np.uint8), p)[0].dtype == np.int64
    assert error_message(M.check_binary, [0, 1, 2, 2], p) == (
        "labels must be binary 0/1 (or bool), but 2 labels are not (e.g. [2]); "
        "map them to 0 (negative) and 1 (positive)")
    assert error_message(M.check_binary, [0.0, 1.0, 0.5, -1.0], p) == (
        "labels must be binary 0/1 (or bool), but 2 labels are not (e.g. [-1.0, 0.5]); "
        "map them to 0 (negative) and 1 (positive)")
    assert error_message(M.check_binary, ["no", "yes", "no", "yes"], p) == (
        "labels must be binary 0/1 (or bool), found values such as ['no', 'yes']; "
        "map them to 0 (negative) and 1 (positive)")
    assert error_message(M.check_binary, np.array(["0", "1", "0", "1"], dtype=object), p).startswith(
        "labels must be binary 0/1 (or bool), found values such as ['0', '1']")
    assert error_message(M.check_binary, np.array([0, 1, None, np.nan], dtype=object), p) == (
        "label column has 2 missing values (NaN, None or inf); "
        "drop the unlabelled cases before computing metrics")
    assert error_message(M.check_binary, np.array([0, 1, {}, 1], dtype=object), p).startswith(
        "labels must be binary 0/1 (or bool), found values such as")
    assert error_message(M.check_binary, [1, 1, 1, 1], p) == (
        "y_true holds only the positive (1) class (4 cases); a split needs both classes to compute "
        "these metrics, so use a larger or stratified split")
    assert error_message(M.check_binary, [0, 0, 0, 0], p) == (
        "y_true holds only the negative (0) class (4 cases); a split needs both classes to compute "
        "these metrics, so use a larger or stratified split")
    assert M.check_binary([0, 0, 0, 0], p, require_both=False)[0].tolist() == [0, 0, 0, 0]


def test_name_and_threshold_messages():
    y, p = [0, 1, 0, 1], [0.1, 0.8, 0.3, 0.6]
    assert error_message(M.metric_score, y, p, metric="accuracy") == (
        f"unknown metric 'accuracy'; choose from {', '.join(M.METRICS)}")
    assert error_message(M.metric_score, y, p, metric="f1", threshold="high") == "threshold must be a number, got 'high'"
    assert error_message(M.binary_metrics, y, p, threshold=None) == "threshold must be a number, got None"
    assert error_message(M.binary_metrics, y, p, threshold=float("nan")) == "threshold must be finite, got nan"
    assert error_message(M.threshold_transfer, y, p, y, p, rules=["median"]) == (
        f"unknown threshold rule 'median'; choose from {', '.join(M.THRESHOLD_RULES)}")
    assert error_message(M.threshold_transfer, y, p, y, p, metrics=[]) == (
        f"pass at least one metric; choose from {', '.join(M.METRICS)}")
    assert error_message(M.threshold_transfer, y, p, y, p, metrics="kappa") == (
        f"unknown metric 'kappa'; choose from {', '.join(M.METRICS)}")
    one = M.threshold_transfer(y, p, y, p, rules="youden", metrics="f1")
    assert one[["rule", "metric"]].values.tolist() == [["youden", "f1"]]
    assert error_message(M.fit_threshold, y, p, rule="otsu") == (
        f"unknown threshold rule 'otsu'; choose from {', '.join(M.THRESHOLD_RULES)}")


# --------------------------------------------------------------------------- metrics


def test_metrics_against_scikit_learn_with_ties_and_threshold_edge():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 200)
    p = np.round(np.clip(0.3 * y + rng.random(200) * 0.7, 0, 1), 1)  # many ties
    for t in (0.5, 0.3, 0.7):
        m = M.binary_metrics(y, p, threshold=t)
        pred = (p >= t).astype(int)  # prob equal to the threshold is positive
        assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, pred))
        assert m["f1"] == pytest.approx(f1_score(y, pred))
        assert m["sensitivity"] == pytest.approx(np.mean(pred[y == 1]))
        assert m["specificity"] == pytest.approx(np.mean(1 - pred[y == 0]))
        assert m["auprc"] == pytest.approx(average_precision_score(y, p))
        for name, value in m.items():
            assert M.metric_score(y, p, metric=name, threshold=t) == pytest.approx(value)
    default = M.binary_metrics(y, p)
    assert default == M.binary_metrics(y, p, threshold=0.5)
    assert M.metric_score(y, p, metric="f1") == M.metric_score(y, p, metric="f1", threshold=0.5)
    assert list(default) == list(M.METRICS)


def test_single_class_metric_scores():
    assert np.isnan(M.metric_score([0, 0, 0], [0.1, 0.2, 0.3], metric="auprc"))
    assert np.isnan(M.metric_score([0, 0, 0], [0.1, 0.2, 0.9], metric="sensitivity"))
    assert M.metric_score([0, 0, 0], [0.1, 0.2, 0.9], metric="specificity") == pytest.approx(2 / 3)
    assert np.isnan(M.metric_score([1, 1], [0.1, 0.9], metric="balanced_accuracy"))
    assert M.metric_score([0, 0], [0.1, 0.2], metric="f1") == 0.0  # no positives at all: defined as 0
    assert M.metric_score([0, 0], [0.6, 0.2], metric="f1") == 0.0
    assert M.metric_score([1, 1], [0.6, 0.2], metric="f1") == pytest.approx(2 / 3)


# --------------------------------------------------------------------------- thresholds


def test_threshold_rules_known_answers():
    y = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    p = np.array([0.1, 0.2, 0.45, 0.6, 0.4, 0.7, 0.8, 0.9])
    assert M.fit_threshold(y, p, rule="fixed_0.5") == 0.5
    # Youden: J at 0.7 = 0.75 - 0 ; at 0.4 = 1 - 0.5 ; at 0.6 = 0.75 - 0.25 -> 0.7
    assert M.fit_threshold(y, p, rule="youden") == 0.7
    # F1: at 0.7: 2*3/(3+0+4) = 6/7 ; at 0.4: 8/(4+2+4) = 0.8 -> 0.7
    assert M.fit_threshold(y, p, rule="f1_max") == 0.7
    assert M.fit_threshold(y, p, rule="sensitivity_0.9") == 0.4  # the largest reaching 4/4
    assert M.fit_threshold(y, p, rule="sensitivity_0.9", min_sensitivity=0.75) == 0.7
    assert M.fit_threshold(y, p, rule="sensitivity_0.9", min_sensitivity=1.0) == 0.4
    assert M.fit_threshold(y, p, rule="prevalence") == 0.6  # 4 of 8 predicted positive
    assert M.fit_threshold(y, p, rule="prevalence", prevalence=0.25) == 0.8
    # ties in the optimum: the largest threshold wins
    assert M.fit_threshold([0, 1, 0, 1], [0.1, 0.6, 0.3, 0.9], rule="youden") == 0.6
    assert error_message(M.fit_threshold, y, p, rule="sensitivity_0.9", min_sensitivity=0.0) == (
        "min_sensitivity must be in (0, 1], got 0.0")
    assert error_message(M.fit_threshold, y, p, rule="sensitivity_0.9", min_sensitivity=1.01) == (
        "min_sensitivity must be in (0, 1], got 1.01")
    assert error_message(M.fit_threshold, y, p, rule="prevalence", prevalence=1.0) == (
        "prevalence must be in (0, 1), got 1.0")
    assert error_message(M.fit_threshold, y, p, rule="prevalence", prevalence=0.0) == (
        "prevalence must be in (0, 1), got 0.0")


def test_threshold_transfer_defaults_and_gap():
    y_fit, p_fit = [0, 0, 1, 1], [0.1, 0.4, 0.6, 0.9]
    y_eval, p_eval = [0, 1, 0, 1], [0.2, 0.3, 0.7, 0.8]
    table = M.threshold_transfer(y_fit, p_fit, y_eval, p_eval)
    assert table["rule"].unique().tolist() == list(M.THRESHOLD_RULES)
    assert table["metric"].unique().tolist() == ["balanced_accuracy", "sensitivity", "specificity", "f1"]
    assert np.allclose(table["gap"], table["eval_value"] - table["fit_value"])
    youden = table[(table["rule"] == "youden") & (table["metric"] == "sensitivity")].iloc[0]
    assert (youden["threshold"], youden["fit_value"], youden["eval_value"]) == (0.6, 1.0, 0.5)
    assert error_message(M.threshold_transfer, y_fit, p_fit, y_eval, [0.2, 0.3, 7, 0.8]).startswith(
        "p_eval must be probabilities in [0, 1]")
    assert error_message(M.threshold_transfer, y_fit, [0.1, 0.4, 0.6, 9], y_eval, p_eval).startswith(
        "p_fit must be probabilities in [0, 1]")


# --------------------------------------------------------------------------- calibration


def _ece_loop(y, p, edges_idx, n_bins):
    total = 0.0
    for b in range(n_bins):
        inside = edges_idx == b
        if inside.any():
            total += inside.sum() / len(y) * abs(p[inside].mean() - y[inside].mean())
    return total


def test_calibration_error_equals_a_plain_loop_and_bin_edges():
    rng = np.random.default_rng(21)
    y = rng.integers(0, 2, 300)
    p = np.clip(0.5 * y + 0.5 * rng.random(300), 0, 1)
    p[:3] = [0.0, 1.0, 0.5]
    for n_bins in (1, 2, 7, 10):
        uniform = np.minimum(np.floor(p * n_bins), n_bins - 1).astype(int)
        assert M.calibration_error(y, p, n_bins=n_bins) == pytest.approx(_ece_loop(y, p, uniform, n_bins))
    assert M.calibration_error(y, p) == M.calibration_error(y, p, n_bins=10, strategy="uniform")
    # one class is fine for calibration, not for ranking
    assert M.calibration_error([0, 0, 0], [0.1, 0.2, 0.3], n_bins=1) == pytest.approx(0.2)
    assert M.brier_loss([1, 1], [0.5, 1.0]) == pytest.approx(0.125)
    assert error_message(M.calibration_error, y, p, n_bins=0) == "n_bins must be an integer >= 1, got 0"
    assert error_message(M.calibration_error, y, p, n_bins=True) == "n_bins must be an integer >= 1, got True"
    assert error_message(M.calibration_error, y, p, n_bins=2.0) == "n_bins must be an integer >= 1, got 2.0"
    assert error_message(M.calibration_error, y, p, strategy="kmeans") == (
        f"unknown binning strategy 'kmeans'; choose from {', '.join(M.CALIBRATION_STRATEGIES)}")
    # quantile bins: more bins than cases leave trailing bins empty, not an error
    assert M.calibration_error([0, 1], [0.2, 0.9], n_bins=5, strategy="quantile") == pytest.approx(0.15)


def test_reliability_curve_values_band_and_defaults():
    rng = np.random.default_rng(22)
    y = rng.integers(0, 2, 200)
    p = np.clip(0.6 * y + 0.4 * rng.random(200), 0, 1)
    curve = M.reliability_curve(y, p, n_bins=4)
    bins = np.minimum(np.floor(p * 4), 3).astype(int)
    present = sorted(set(bins.tolist()))
    assert curve["bin"].tolist() == present
    for row in curve.itertuples():
        inside = bins == row.bin
        assert row.count == inside.sum()
        assert row.mean_prob == pytest.approx(p[inside].mean()) and row.frac_pos == pytest.approx(y[inside].mean())
        assert (row.low_edge, row.high_edge) == pytest.approx((row.bin / 4, (row.bin + 1) / 4))
        assert row.frac_pos_low <= row.frac_pos <= row.frac_pos_high
    # the band is a percentile bootstrap of each bin's fraction, 200 resamples, seed 0 by default
    expected = []
    for rows in resample_indices(200, n_resamples=200):
        c = np.bincount(bins[rows], minlength=4)
        with np.errstate(invalid="ignore", divide="ignore"):
            expected.append(np.bincount(bins[rows], weights=y[rows], minlength=4) / c)
    expected = np.array(expected)[:, present]
    assert curve["frac_pos_low"].to_numpy() == pytest.approx(np.nanpercentile(expected, 2.5, axis=0))
    assert curve["frac_pos_high"].to_numpy() == pytest.approx(np.nanpercentile(expected, 97.5, axis=0))
    same = M.reliability_curve(y, p, n_bins=4, n_resamples=200, random_state=0, confidence=0.95, strategy="uniform")
    pd.testing.assert_frame_equal(curve, same)
    single = M.reliability_curve([1, 1, 1], [0.2, 0.6, 0.9], n_bins=2, n_resamples=10)
    assert single["frac_pos"].tolist() == [1.0, 1.0]
    assert error_message(M.reliability_curve, y, p, n_resamples=0) == "n_resamples must be an integer >= 1, got 0"
    # a last bin that is empty in the data: bincount must still cover every bin
    low_only = M.reliability_curve([0, 1, 0], [0.05, 0.1, 0.2], n_bins=10, n_resamples=20)
    assert low_only["bin"].tolist() == [0, 1, 2]


def test_calibrators_known_maps_and_messages():
    from scipy.special import expit, logit

    z = np.linspace(-3, 3, 7)
    p = expit(z)
    platt = M.Calibrator("platt", {"a": 2.0, "b": -0.5})
    assert platt.transform(p) == pytest.approx(expit(2.0 * z - 0.5))
    temp = M.Calibrator("temperature", {"temperature": 2.0})
    assert temp.transform(p) == pytest.approx(expit(z / 2.0))
    assert M.Calibrator("platt", {"a": 1.0, "b": 0.0}).transform([0.0, 1.0]) == pytest.approx([1e-7, 1 - 1e-7])
    # a Platt fit recovers a known slope and intercept
    rng = np.random.default_rng(23)
    zz = rng.normal(0, 1.5, 20000)
    y = rng.random(20000) < expit(0.5 * zz + 0.8)
    fitted = M.fit_calibrator(y, expit(zz), method="platt")
    assert fitted.params["a"] == pytest.approx(0.5, abs=0.05) and fitted.params["b"] == pytest.approx(0.8, abs=0.05)
    t = M.fit_calibrator(y, expit(logit(expit(zz)) * 1.0), method="temperature")
    assert t.method == "temperature" and t.params["temperature"] > 0
    assert error_message(M.fit_calibrator, y, expit(zz), method="isotonic") == (
        f"unknown calibration method 'isotonic'; choose from {', '.join(M.CALIBRATION_METHODS)}")


def test_calibration_transfer_columns_and_defaults():
    from scipy.special import expit

    rng = np.random.default_rng(24)
    z = rng.normal(0, 2, 1200)
    y = rng.random(1200) < expit(z)
    p = expit(3 * z)
    table = M.calibration_transfer(y[:600], p[:600], y[600:], p[600:])
    assert table["method"].tolist() == ["none", "temperature", "platt"]
    assert set(table["fitted_on"]) == {"validation"}
    ye, pe = y[600:], p[600:]
    none = table.iloc[0]
    assert none["ece_uniform_before"] == pytest.approx(M.calibration_error(ye, pe, n_bins=10))
    assert none["ece_quantile_before"] == pytest.approx(M.calibration_error(ye, pe, n_bins=10, strategy="quantile"))
    assert none["brier_before"] == pytest.approx(M.brier_loss(ye, pe))
    assert none["ece_uniform_after"] == none["ece_uniform_before"] and none["params"] == {}
    for row in table.iloc[1:].itertuples():
        cal = M.fit_calibrator(y[:600], p[:600], method=row.method)
        after = cal.transform(pe)
        assert row.params == cal.params
        assert row.ece_uniform_after == pytest.approx(M.calibration_error(ye, after, n_bins=10))
        assert row.ece_quantile_after == pytest.approx(M.calibration_error(ye, after, n_bins=10, strategy="quantile"))
        assert row.brier_after == pytest.approx(M.brier_loss(ye, after))
    five = M.calibration_transfer(y[:600], p[:600], ye, pe, methods="platt", n_bins=5, fit_name="val split")
    assert five["method"].tolist() == ["none", "platt"] and set(five["fitted_on"]) == {"val split"}
    platt = M.fit_calibrator(y[:600], p[:600], method="platt").transform(pe)
    assert five.iloc[1]["ece_uniform_after"] == pytest.approx(M.calibration_error(ye, platt, n_bins=5))
    # n_bins reaches the uniform ECE too (calibrated probabilities miss on both sides, so merging bins changes it)
    assert five.iloc[1]["ece_uniform_after"] != pytest.approx(table.iloc[2]["ece_uniform_after"])
    assert five.iloc[1]["ece_quantile_after"] == pytest.approx(
        M.calibration_error(ye, M.fit_calibrator(y[:600], p[:600], method="platt").transform(pe), n_bins=5,
                            strategy="quantile"))
    # the evaluation split may hold one class; the fitting split may not
    one_class = M.calibration_transfer(y[:600], p[:600], np.ones(10), np.full(10, 0.9), methods=["temperature"])
    assert one_class.iloc[0]["brier_before"] == pytest.approx(0.01)
    assert error_message(M.calibration_transfer, np.ones(10), np.full(10, 0.9), ye, pe).startswith(
        "y_true holds only the positive (1) class (10 cases)")
    assert error_message(M.calibration_transfer, y[:600], p[:600], ye, pe * 2).startswith(
        "p_eval must be probabilities in [0, 1]")
    assert error_message(M.calibration_transfer, y[:600], p[:600] * 2, ye, pe).startswith(
        "p_fit must be probabilities in [0, 1]")
    assert list(table.columns) == ["method", "fitted_on", "ece_uniform_before", "ece_uniform_after",
                                   "ece_quantile_before", "ece_quantile_after", "brier_before", "brier_after",
                                   "params", "ece_uniform_floor_after"]
    for row, after in zip(table.itertuples(), [pe, *(M.fit_calibrator(y[:600], p[:600], method=m).transform(pe)
                                                       for m in ("temperature", "platt"))]):
        assert row.ece_uniform_floor_after == M.calibration_floor(after, n_bins=10)



def test_edge_cases_of_labels_ranks_and_thresholds():
    p = np.linspace(0.1, 0.9, 8)
    # numeric text is still text: rejected, not read as numbers
    assert error_message(M.check_binary, np.array(["0", "1"] * 4), p).startswith(
        "labels must be binary 0/1 (or bool), found values such as ['0', '1']")
    # at most five example values in a message
    assert "found values such as ['a', 'b', 'c', 'd', 'e']; map" in error_message(M.check_binary, list("abcdefgh"), p)
    assert "(e.g. [2, 3, 4, 5, 6]); map" in error_message(M.check_binary, [0, 1, 2, 3, 4, 5, 6, 7], p)
    # one positive case has an average precision
    assert M.metric_score([0, 0, 1, 0], [0.1, 0.2, 0.9, 0.3], metric="auprc") == 1.0
    assert M.metric_score([0, 1, 0, 0], [0.1, 0.2, 0.9, 0.3], metric="auprc") == pytest.approx(1 / 3)
    # the lowest probability is a candidate threshold too
    assert M.fit_threshold([1, 0, 0, 1], [0.1, 0.5, 0.6, 0.9], rule="sensitivity_0.9", min_sensitivity=1.0) == 0.1
    # Youden weighs false positives by the share of negatives: one FP of four costs 0.25
    y = [1, 1, 1, 1, 0, 0, 0, 0]
    assert M.fit_threshold(y, [0.9, 0.7, 0.6, 0.5, 0.8, 0.3, 0.2, 0.1], rule="youden") == 0.5
    # a column of probabilities straight into a calibrator
    cal = M.Calibrator("temperature", {"temperature": 1.0})
    assert error_message(cal.transform, np.ones((2, 2)) / 2) == (
        "y_prob must be a 1-D array with one value per case, got shape (2, 2)")


def test_calibration_floor_is_what_a_calibrated_model_shows_and_shrinks_with_the_test_set():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.95, 200)
    floor = M.calibration_floor(p)
    # labels drawn from p: p is calibrated, and its ECE stays below the 95th percentile in about 95% of draws
    below = np.mean([M.calibration_error((rng.random(200) < p).astype(int), p) <= floor for _ in range(400)])
    assert 0.9 <= below <= 0.99
    # a miscalibrated model (probabilities 0.2 too high) lies above it
    y = (rng.random(200) < p).astype(int)
    assert M.calibration_error(y, np.clip(p + 0.2, 0, 1)) > M.calibration_floor(np.clip(p + 0.2, 0, 1))
    # ECE of a calibrated model falls like 1 / sqrt(N): four times the images, about half the floor
    big = M.calibration_floor(np.tile(p, 4))
    assert 0.35 < big / floor < 0.65
    assert M.calibration_floor(p, quantile=0.5) < floor
    assert M.calibration_floor(p, random_state=0) == M.calibration_floor(p, random_state=0)
    with pytest.raises(InputError, match="quantile"):
        M.calibration_floor(p, quantile=1.0)
    with pytest.raises(InputError, match="probabilities"):
        M.calibration_floor(p * 2)
