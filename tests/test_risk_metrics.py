"""The representation-risk metric panel (crslib.risk_metrics): values against scikit-learn and numpy,
calibration known answers, patient-grouped intervals, undefined resamples, and input errors."""

import warnings

import numpy as np
import pytest
from sklearn.metrics import (accuracy_score, balanced_accuracy_score, f1_score, log_loss, mean_absolute_error,
                             mean_squared_error, r2_score, roc_auc_score)

from crslib.errors import InputError
from assertions import error_message
from crslib.metrics import brier_loss, calibration_error
from crslib.risk_metrics import PANEL_METRICS, _macro_f1, _samples, metric_panel
from crslib.risk_scores import count_matrix, row_losses


def _binary(n=200, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = np.clip(0.35 * y + 0.65 * rng.random(n), 0.0, 1.0)
    return y, p


def _multiclass(n=240, k=3, seed=1):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) + 1.2 * np.eye(k)[y]
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return y, proba


def _regression(n=200, seed=2):
    rng = np.random.default_rng(seed)
    y = rng.normal(size=n)
    return y, 0.7 * y + rng.normal(scale=0.6, size=n) + 0.2


def _values(panel):
    return dict(zip(panel["metric"], panel["value"]))


def test_binary_values_equal_sklearn():
    y, p = _binary()
    panel = metric_panel("classification", y, p, None, n_resamples=50)
    assert list(panel.columns) == ["metric", "value", "low", "high", "n_undefined"]
    assert tuple(panel["metric"]) == PANEL_METRICS["classification"]
    v, label = _values(panel), (p >= 0.5).astype(int)
    assert v["accuracy"] == pytest.approx(accuracy_score(y, label), abs=1e-12)
    assert v["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, label), abs=1e-12)
    assert v["macro_f1"] == pytest.approx(f1_score(y, label, average="macro"), abs=1e-12)
    assert v["log_loss"] == pytest.approx(log_loss(y, y_proba=p), abs=1e-12)
    assert v["ece"] == pytest.approx(calibration_error(y, p, n_bins=10), abs=1e-12)
    assert v["brier"] == pytest.approx(brier_loss(y, p), abs=1e-12)
    assert v["auroc"] == pytest.approx(roc_auc_score(y, p), abs=1e-12)


def test_multiclass_values_equal_sklearn_and_definitions():
    y, proba = _multiclass()
    v = _values(metric_panel("multiclass", y, proba, None, n_resamples=50))
    label = proba.argmax(axis=1)
    assert v["accuracy"] == pytest.approx(accuracy_score(y, label), abs=1e-12)
    assert v["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, label), abs=1e-12)
    assert v["macro_f1"] == pytest.approx(f1_score(y, label, average="macro"), abs=1e-12)
    assert v["log_loss"] == pytest.approx(log_loss(y, y_proba=proba, labels=[0, 1, 2]), abs=1e-12)
    assert v["macro_auroc"] == pytest.approx(roc_auc_score(y, proba, multi_class="ovr", average="macro"), abs=1e-12)
    assert v["brier"] == pytest.approx(np.mean(np.sum((proba - np.eye(3)[y]) ** 2, axis=1)), abs=1e-12)
    assert v["ece"] == pytest.approx(calibration_error((label == y).astype(int), proba.max(axis=1), n_bins=10))


def test_regression_values_equal_sklearn_and_numpy():
    y, pred = _regression()
    v = _values(metric_panel("regression", y, pred, None, n_resamples=50))
    assert v["r2"] == pytest.approx(r2_score(y, pred), abs=1e-12)
    assert v["mse"] == pytest.approx(mean_squared_error(y, pred), abs=1e-12)
    assert v["mae"] == pytest.approx(mean_absolute_error(y, pred), abs=1e-12)
    assert v["correlation"] == pytest.approx(np.corrcoef(y, pred)[0, 1], abs=1e-12)
    assert v["calibration_slope"] == pytest.approx(np.polyfit(pred, y, 1)[0], abs=1e-10)


@pytest.mark.parametrize("task, data", [("classification", _binary(60)), ("multiclass", _multiclass(60)),
                                        ("regression", _regression(60))])
def test_every_resample_equals_the_metric_on_its_repeated_rows(task, data):
    y, pred = data
    groups = np.repeat(np.arange(30), 2)
    counts = count_matrix(groups, 4, 7)
    samples = _samples(task, y, pred, counts, 10)
    for r in range(counts.shape[0]):
        rows = np.repeat(np.arange(y.size), counts[r].astype(int))
        on_rows = metric_panel(task, y[rows], pred[rows], None, n_resamples=1)["value"].to_numpy()
        np.testing.assert_allclose(samples[r], on_rows, rtol=1e-10, atol=1e-12)


def test_ece_near_zero_when_calibrated_and_large_when_pushed_to_extremes():
    # 400 rows at 0.25 with 100 positives, 400 at 0.75 with 300 positives: calibrated exactly
    y = np.r_[np.ones(100), np.zeros(300), np.ones(300), np.zeros(100)].astype(int)
    calibrated = np.r_[np.full(400, 0.25), np.full(400, 0.75)]
    pushed = np.r_[np.full(400, 0.01), np.full(400, 0.99)]
    ece_cal = _values(metric_panel("classification", y, calibrated, None, n_resamples=20))["ece"]
    ece_pushed = _values(metric_panel("classification", y, pushed, None, n_resamples=20))["ece"]
    assert ece_cal == pytest.approx(0.0, abs=1e-12)
    assert ece_pushed == pytest.approx(0.24, abs=1e-12)  # each half off by |0.01 - 0.25| = |0.99 - 0.75|


def test_calibration_slope_known_answers():
    y = np.random.default_rng(3).normal(size=100)
    assert _values(metric_panel("regression", y, 2 * y, None, n_resamples=20))["calibration_slope"] == 0.5
    assert _values(metric_panel("regression", y, y, None, n_resamples=20))["calibration_slope"] == 1.0
    constant = metric_panel("regression", y, np.full(100, 0.3), None, n_resamples=20).set_index("metric")
    assert np.isnan(constant.loc["calibration_slope", "value"])
    assert constant.loc["calibration_slope", "n_undefined"] == 20
    assert constant.loc["correlation", "n_undefined"] == 20
    assert constant.loc["mse", "n_undefined"] == 0


def test_whole_patients_widen_the_interval():
    # 20 patients of 10 identical rows: only 20 independent units, not 200
    rng = np.random.default_rng(4)
    y_pat, p_pat = rng.integers(0, 2, 20), rng.random(20)
    y, p = np.repeat(y_pat, 10), np.repeat(p_pat, 10)
    by_patient = metric_panel("classification", y, p, np.repeat(np.arange(20), 10), n_resamples=500)
    by_row = metric_panel("classification", y, p, None, n_resamples=500)
    width_patient = (by_patient["high"] - by_patient["low"]).to_numpy()
    width_row = (by_row["high"] - by_row["low"]).to_numpy()
    assert np.all(width_patient > 1.5 * width_row)


def test_one_class_resamples_are_counted_and_left_out():
    # 3 patients: A (two negatives), B (two positives), C (one positive); a third of resamples have one class
    y = np.array([0, 0, 1, 1, 1])
    p = np.array([0.2, 0.6, 0.4, 0.9, 0.7])
    groups = np.array(["A", "A", "B", "B", "C"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an undefined recall or AUROC is NaN without a 0/0 warning
        panel = metric_panel("classification", y, p, groups, n_resamples=300, random_state=5).set_index("metric")

    counts = count_matrix(groups, 300, 5)
    one_class = (counts[:, y == 0].sum(axis=1) == 0) | (counts[:, y == 1].sum(axis=1) == 0)
    assert 50 < one_class.sum() < 150
    assert panel.loc["auroc", "n_undefined"] == one_class.sum()
    assert panel.loc["balanced_accuracy", "n_undefined"] == one_class.sum()
    assert panel.loc["accuracy", "n_undefined"] == 0

    aurocs = []
    for r in np.flatnonzero(~one_class):
        rows = np.repeat(np.arange(5), counts[r].astype(int))
        aurocs.append(roc_auc_score(y[rows], p[rows]))
    assert panel.loc["auroc", "low"] == pytest.approx(np.percentile(aurocs, 2.5), abs=1e-12)
    assert panel.loc["auroc", "high"] == pytest.approx(np.percentile(aurocs, 97.5), abs=1e-12)


@pytest.mark.parametrize("task, data", [("classification", _binary()), ("multiclass", _multiclass()),
                                        ("regression", _regression())])
def test_interval_contains_value_and_narrows_with_confidence(task, data):
    y, pred = data
    groups = np.repeat(np.arange(y.size // 2), 2)
    wide = metric_panel(task, y, pred, groups, n_resamples=400, confidence=0.95)
    narrow = metric_panel(task, y, pred, groups, n_resamples=400, confidence=0.5)
    assert np.all((wide["low"] <= wide["value"]) & (wide["value"] <= wide["high"]))
    assert np.all(narrow["high"] - narrow["low"] < wide["high"] - wide["low"])
    assert np.all(wide["n_undefined"] == 0)
    again = metric_panel(task, y, pred, groups, n_resamples=400, confidence=0.95)
    assert again.equals(wide)


def test_bad_inputs_raise_input_error_with_clear_messages():
    y, p = _binary(20)
    with pytest.raises(InputError, match=r"^unknown task 'survival'; choose from 'classification', 'multiclass', "
                                         r"'regression'$"):
        metric_panel("survival", y, p, None)
    with pytest.raises(InputError, match=r"pred for task 'multiclass' must have shape \(n_rows, n_classes\) .* "
                                         r"got shape \(20,\)"):
        metric_panel("multiclass", y, p, None)
    with pytest.raises(InputError, match=r"groups must hold one patient id per image \(20\), got shape \(19,\)"):
        metric_panel("classification", y, p, np.arange(19))
    with pytest.raises(InputError, match=r"for class-probability columns use task='multiclass'"):
        metric_panel("classification", y, np.c_[1 - p, p], None)
    yk, proba = _multiclass(30)
    with pytest.raises(InputError, match=r"must hold class codes 0 \.\. 2 .* got values in \[0, 3\]"):
        metric_panel("multiclass", np.r_[yk[:-1], 3], proba, None)
    with pytest.raises(InputError, match=r"each row of pred must sum to 1"):
        metric_panel("multiclass", yk, proba * 0.9, None)
    with pytest.raises(InputError, match=r"y and pred must have one entry per row: y has 20 rows, pred has 19"):
        metric_panel("regression", y.astype(float), p[:19], None)
    with pytest.raises(InputError, match=r"n_resamples must be an integer >= 1, got 0"):
        metric_panel("regression", y.astype(float), p, None, n_resamples=0)


def test_multiclass_log_loss_clips_a_zero_probability_of_the_true_class():
    y = np.array([0, 1, 2, 0])
    proba = np.array([[0.0, 0.5, 0.5], [0.0, 1.0, 0.0], [0.1, 0.1, 0.8], [1.0, 0.0, 0.0]])
    v = _values(metric_panel("multiclass", y, proba, None, n_resamples=20))
    # row 0 gives its true class 0: -log(1e-15); a sure, right row adds -log(1 - 1e-15), about 1e-15
    expected = (-np.log(1e-15) - np.log(1 - 1e-15) - np.log(0.8) - np.log(1 - 1e-15)) / 4
    assert np.isfinite(v["log_loss"]) and v["log_loss"] == pytest.approx(expected, rel=1e-12)
    # (scikit-learn's log_loss clips at the float's eps instead, so it differs here by design)


def test_two_probability_columns_are_a_valid_multiclass_prediction():
    y, p = _binary(n=60)
    proba = np.column_stack([1 - p, p])
    v = _values(metric_panel("multiclass", y, proba, None, n_resamples=20))
    assert v["macro_auroc"] == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert v["accuracy"] == pytest.approx(accuracy_score(y, proba.argmax(axis=1)), abs=1e-12)


@pytest.mark.parametrize("y, proba, message", [
    ([0, 1], [[1.0], [1.0]], r"pred for task 'multiclass' must have shape \(n_rows, n_classes\) with one "
                              r"probability column per class \(at least 2\), got shape \(2, 1\)"),
    ([0, 1, 1], [[0.5, 0.5], [0.5, 0.5]], r"y and pred must have one entry per row: y has 3 rows, pred has 2$"),
    ([0, 2], [[0.5, 0.5], [0.5, 0.5]], r"y for task 'multiclass' must hold class codes 0 \.\. 1 \(one per column "
                                       r"of pred\), got values in \[0, 2\]"),
    ([0, -1], [[0.5, 0.5], [0.5, 0.5]], r"got values in \[-1, 0\]"),
    ([0, 0.5], [[0.5, 0.5], [0.5, 0.5]], r"must hold class codes 0 \.\. 1"),
    ([0, np.nan], [[0.5, 0.5], [0.5, 0.5]], r"\by\b.*finite"),
])
def test_multiclass_input_errors_name_the_problem(y, proba, message):
    with pytest.raises(InputError, match=message):
        metric_panel("multiclass", np.asarray(y), np.asarray(proba), None, n_resamples=10)


def test_integer_one_hot_predictions_are_probabilities():
    y = np.array([0, 1, 2, 1])
    proba = np.eye(3, dtype=int)[[0, 1, 2, 2]]
    v = _values(metric_panel("multiclass", y, proba, None, n_resamples=10))
    assert v["accuracy"] == pytest.approx(0.75) and v["brier"] == pytest.approx(0.5)


def test_small_scale_targets_and_predictions_still_vary():
    # sums of squares far below 1 are variation, not rounding noise: the test is relative to the raw sums
    y, pred = _regression()
    unit = metric_panel("regression", y, pred, None, n_resamples=30).set_index("metric")
    for scale in (1e-3, 1e-7):
        small = metric_panel("regression", scale * y, scale * pred, None, n_resamples=30).set_index("metric")
        assert small.loc["correlation", "value"] == pytest.approx(np.corrcoef(y, pred)[0, 1], abs=1e-9)
        assert small.loc["calibration_slope", "value"] == pytest.approx(np.polyfit(pred, y, 1)[0], abs=1e-8)
        assert small.loc["r2", "value"] == pytest.approx(r2_score(y, pred), abs=1e-9)
        assert small.loc[["r2", "correlation", "calibration_slope"], "n_undefined"].tolist() == [0, 0, 0]
        np.testing.assert_allclose(small.loc[["r2", "correlation", "calibration_slope"], ["low", "high"]],
                                   unit.loc[["r2", "correlation", "calibration_slope"], ["low", "high"]], rtol=1e-9)


def test_a_large_offset_changes_no_regression_metric():
    # y = 1e8 + noise: sums of squares taken without centring would lose every digit of the variation
    y, pred = _regression()
    unit = metric_panel("regression", y, pred, None, n_resamples=40).set_index("metric")
    for offset_y, offset_pred in [(1e8, 1e8), (0.0, 1e8), (1e8, 0.0)]:
        shifted = metric_panel("regression", y + offset_y, pred + offset_pred, None, n_resamples=40)
        shifted = shifted.set_index("metric")
        for metric in ("correlation", "calibration_slope"):
            np.testing.assert_allclose(shifted.loc[metric, ["value", "low", "high"]].to_numpy(float),
                                       unit.loc[metric, ["value", "low", "high"]].to_numpy(float), rtol=1e-6)
        assert shifted.loc[["correlation", "calibration_slope"], "n_undefined"].tolist() == [0, 0]
    both = metric_panel("regression", y + 1e8, pred + 1e8, None, n_resamples=40).set_index("metric")
    np.testing.assert_allclose(both.loc["r2", ["value", "low", "high"]].to_numpy(float),
                               unit.loc["r2", ["value", "low", "high"]].to_numpy(float), rtol=1e-6)


def test_a_resample_that_draws_one_target_value_has_no_correlation_or_r2():
    # y varies, but the first resample draws only its three 0.1s (their sums of squares are rounding noise,
    # not 0); the second draws only equal predictions, the third varies in both
    y = np.array([0.1, 0.1, 0.1, 0.7, 1.3, 2.9])
    pred = np.array([0.2, 0.5, 0.9, 0.4, 0.4, 0.4])
    counts = np.array([[1.0, 2.0, 4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 2.0, 4.0], [1.0, 0.0, 1.0, 1.0, 0.0, 2.0]])
    r2, mse, mae, corr, slope = _samples("regression", y, pred, counts, 10).T
    assert np.isnan(r2[:1]).all() and np.isnan(corr[:2]).all() and np.isnan(slope[1])
    assert np.isfinite([r2[1], r2[2], corr[2], slope[0], slope[2]]).all()
    rows = np.repeat(np.arange(6), counts[0].astype(int))
    assert slope[0] == pytest.approx(0.0, abs=1e-9) and mse[0] == pytest.approx(np.mean((y[rows] - pred[rows]) ** 2))
    rows = np.repeat(np.arange(6), counts[2].astype(int))
    assert corr[2] == pytest.approx(np.corrcoef(y[rows], pred[rows])[0, 1], rel=1e-12)
    assert slope[2] == pytest.approx(np.polyfit(pred[rows], y[rows], 1)[0], rel=1e-9)
    assert r2[2] == pytest.approx(r2_score(y[rows], pred[rows]), rel=1e-12)


def test_the_binary_panel_predicts_class_1_at_one_half_and_clips_the_log_loss():
    y = np.array([1, 1, 0, 0])
    v = _values(metric_panel("classification", y, np.array([0.5, 0.5, 0.1, 0.1]), None, n_resamples=10))
    assert v["accuracy"] == 1.0 and v["balanced_accuracy"] == 1.0 and v["macro_f1"] == 1.0  # 0.5 predicts class 1
    # sure and right: the true class gets probability 1 on every row, clipped to 1 - 1e-15: about 1.1e-15, not 0
    sure = _values(metric_panel("classification", y, y.astype(float), None, n_resamples=10))
    assert sure["log_loss"] == pytest.approx(-np.log(1 - 1e-15), rel=1e-9, abs=0)
    # sure and wrong: the true class gets probability 0 on every row, clipped to 1e-15: -log(1e-15) each,
    # exactly what the selection's row losses give (one clipping rule for both)
    wrong = _values(metric_panel("classification", y, 1.0 - y, None, n_resamples=10))
    assert wrong["log_loss"] == pytest.approx(-np.log(1e-15), rel=1e-12)
    assert wrong["log_loss"] == row_losses("classification", y, 1.0 - y, "log_loss").mean()
    assert _values(metric_panel("classification", np.array([1, 0]), np.array([0.0, 0.0]), None,
                                n_resamples=10))["log_loss"] == pytest.approx((-np.log(1e-15) - np.log(1 - 1e-15)) / 2,
                                                                              rel=1e-12)


def test_a_sure_and_right_multiclass_prediction_has_the_clipped_log_loss():
    y = np.array([0, 1, 2, 1])
    v = _values(metric_panel("multiclass", y, np.eye(3)[y], None, n_resamples=10))
    assert v["log_loss"] == pytest.approx(-np.log(1 - 1e-15), rel=1e-6, abs=0) and v["accuracy"] == 1.0


@pytest.mark.parametrize("task, y, pred, message", [
    ("regression", np.zeros((2, 2)), np.zeros(2),
     "y for task 'regression' must be 1-D with one value per row, got shape (2, 2)"),
    ("regression", np.array(["0.5", "a", "b"]), np.zeros(3),
     "y for task 'regression' must hold numbers; 'a' is not one"),
    ("regression", np.zeros(5), np.array([0.0, np.nan, np.inf, 1.0, 2.0]),
     "pred has 2 NaN or infinite values; drop or fill those rows"),
    ("multiclass", np.array(["cat", "dog"]), np.full((2, 2), 0.5),
     "y for task 'multiclass' must hold numbers; 'cat' is not one"),
    ("multiclass", np.array([0, 1, 1]), np.full((2, 3), 1 / 3), "y and pred must have one entry per row: y has 3 rows, "
     "pred has 2"),
    ("multiclass", np.array([0, 1]), np.array([[None, 1.0], [0.5, 0.5]], dtype=object),
     "pred for task 'multiclass' must hold finite probabilities in [0, 1]"),
    ("multiclass", np.array([0, 1]), np.array([[np.nan, 1.0], [0.5, 0.5]]),
     "pred for task 'multiclass' must hold finite probabilities in [0, 1]"),
    ("multiclass", np.array([0, 1]), np.array([[-0.2, 1.0, 0.2], [0.5, 0.5, 0.0]]),
     "pred for task 'multiclass' must hold finite probabilities in [0, 1]"),
    ("multiclass", np.array([0, 1]), np.array([[1.2, 0.0], [0.5, 0.5]]),
     "pred for task 'multiclass' must hold finite probabilities in [0, 1]"),
    ("multiclass", np.array([0, 1]), np.array([[0.5, 0.4], [0.5, 0.5]]),
     "each row of pred must sum to 1 (class probabilities), but a row misses 1 by 0.1; pass probabilities, e.g. a "
     "softmax of the logits"),
    ("regression", np.array([0.0, 2.0, 1.0]), np.zeros((3, 2)),
     "pred for task 'regression' must be 1-D with one value per row (P(y=1) for 'classification'), got shape (3, 2)"),
    ("classification", np.array([0, 1, 1]), np.zeros((3, 2)),
     "pred for task 'classification' must be 1-D with one value per row (P(y=1) for 'classification'), got shape "
     "(3, 2); for class-probability columns use task='multiclass'"),
    ("classification", np.array([0, 1, 1]), np.array([0.2, 1.3, 0.5]),
     "pred must be probabilities in [0, 1], but 1 values lie outside (range found [0.2, 1.3]); pass probabilities, "
     "e.g. a sigmoid of the logits, not raw scores"),
    ("classification", np.array([0, 2, 1]), np.array([0.2, 0.3, 0.5]),
     "labels must be binary 0/1 (or bool), but 1 labels are not (e.g. [2]); map them to 0 (negative) and 1 "
     "(positive)"),
    ("regression", np.zeros(3), np.array(["0.5", "1.5", "x"]),
     "pred for task 'regression' must hold numbers; 'x' is not one"),
    ("regression", np.zeros(0), np.zeros(0), "y and pred are empty: there are no rows to evaluate"),
])
def test_input_errors_are_read_whole(task, y, pred, message):
    assert error_message(metric_panel, task, y, pred, None, n_resamples=10) == message


def test_a_constant_target_leaves_the_slope_defined_and_the_correlation_undefined():
    y, pred = _regression(n=50)
    panel = metric_panel("regression", np.full(50, 2.0), pred, None, n_resamples=20).set_index("metric")
    assert np.isnan(panel.loc["correlation", "value"]) and panel.loc["correlation", "n_undefined"] == 20
    assert panel.loc["calibration_slope", "value"] == pytest.approx(0.0, abs=1e-12)
    assert panel.loc["calibration_slope", "n_undefined"] == 0


def test_macro_f1_leaves_out_a_class_neither_drawn_nor_predicted_on_a_resample():
    # three classes; the first resample draws no row of class 2 and predicts none, the second draws one row of
    # class 2 that is predicted as class 0 (its F1 is 0 and counts)
    y = np.array([0, 1, 0, 1, 2])
    proba = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.3, 0.6, 0.1], [0.1, 0.8, 0.1], [0.5, 0.2, 0.3]])
    counts = np.array([[1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0, 1.0]])
    macro_f1 = _samples("multiclass", y, proba, counts, 10)[:, PANEL_METRICS["multiclass"].index("macro_f1")]
    label = proba.argmax(axis=1)
    for r in range(2):
        rows = np.repeat(np.arange(5), counts[r].astype(int))
        assert macro_f1[r] == pytest.approx(f1_score(y[rows], label[rows], average="macro"), rel=1e-12)
    assert macro_f1.tolist() == pytest.approx([(2 / 3 + 0.8) / 2, (2 / 3 + 1.0 + 0.0) / 3])


def test_macro_f1_counts_a_left_out_class_as_nothing_whatever_memory_it_gets():
    # np.divide(..., where=) leaves the skipped cells as it found them, and numpy hands a small array
    # the memory of one just freed: the F1 of a class left out must be written, not found
    y = np.array([0, 1, 0, 1, 2])
    label = np.array([0, 1, 1, 1, 0])
    counts = np.array([[1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0, 1.0]])
    for _ in range(3):
        dirty = [np.full((2, 3), 7.0) for _ in range(6)]
        del dirty
        assert _macro_f1(y, label, counts, 3).tolist() == pytest.approx([(2 / 3 + 0.8) / 2, (2 / 3 + 1.0 + 0.0) / 3])


def test_a_binary_panel_of_one_class_is_computed_with_its_undefined_metrics_counted():
    panel = metric_panel("classification", np.array([1, 1, 1]), np.array([0.2, 0.7, 0.9]), None,
                         n_resamples=5).set_index("metric")
    assert panel.loc["accuracy", "value"] == pytest.approx(2 / 3)
    assert np.isnan(panel.loc["auroc", "value"]) and panel.loc["auroc", "n_undefined"] == 5
    assert panel.loc["balanced_accuracy", "n_undefined"] == 5 and panel.loc["log_loss", "n_undefined"] == 0


def test_the_defaults_are_2000_resamples_of_seed_0_and_n_bins_is_checked():
    y, pred = _regression(n=40)
    constant = np.full(40, 0.3)
    default = metric_panel("regression", y, constant, np.arange(40))
    assert default.equals(metric_panel("regression", y, constant, np.arange(40), n_resamples=2000, random_state=0))
    assert default.set_index("metric").loc["calibration_slope", "n_undefined"] == 2000
    assert error_message(metric_panel, "regression", y, pred, None, n_bins=0) == "n_bins must be an integer >= 1, got 0"


@pytest.mark.parametrize("n_bins", [3, 10])
def test_the_ece_of_the_panel_uses_its_bins_on_predictions_at_bin_edges(n_bins):
    # Predictions on a grid of 0.05 sit on many bin edges (0, 1/3, 0.5, 1 ...): the panel's ECE, computed
    # on the all-ones resample, must bin them as metrics.calibration_error does.
    rng = np.random.default_rng(5)
    p = rng.choice(np.linspace(0.0, 1.0, 21), 60)
    y = (rng.random(60) < p).astype(int)
    panel = metric_panel("classification", y, p, None, n_resamples=5, n_bins=n_bins)
    v = _values(panel)
    assert v["ece"] == pytest.approx(calibration_error(y, p, n_bins=n_bins), abs=1e-12)
    assert v["brier"] == pytest.approx(brier_loss(y, p), abs=1e-12)
    assert panel["n_undefined"].dtype == np.int64
    top = rng.choice(np.linspace(0.4, 1.0, 13), 60)  # the top class's probability, on a grid of 0.05
    proba = np.c_[top, (1.0 - top) / 2, (1.0 - top) / 2]
    label = np.where(rng.random(60) < top, 0, rng.integers(1, 3, 60))
    multi = _values(metric_panel("multiclass", label, proba, None, n_resamples=5, n_bins=n_bins))
    correct = (proba.argmax(axis=1) == label).astype(int)
    assert multi["ece"] == pytest.approx(calibration_error(correct, proba.max(axis=1), n_bins=n_bins), abs=1e-12)
    if n_bins == 3:  # the bins matter here: ten bins give another ECE
        assert v["ece"] != pytest.approx(calibration_error(y, p, n_bins=10), abs=1e-6)
        assert multi["ece"] != pytest.approx(calibration_error(correct, proba.max(axis=1), n_bins=10), abs=1e-6)
