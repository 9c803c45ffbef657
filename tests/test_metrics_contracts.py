"""crslib.metrics: exact input errors, boundaries and rule definitions.

Each test pins what a user sees or a documented edge (probabilities of exactly
0 and 1, a column vector, the largest of tied optimal thresholds), so that a
changed bound, default or message in ``crslib.metrics`` fails a test.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, balanced_accuracy_score, f1_score

from crslib import metrics as M
from crslib.errors import InputError


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    return str(info.value)


# --------------------------------------------------------------------------- validation


def test_shapes_and_lengths():
    assert M.check_binary(np.array([[1], [0]]), np.array([[0.9], [0.2]]))[1].tolist() == [0.9, 0.2]
    assert _message(M.check_binary, np.ones((2, 2)), [0.1, 0.2]) == (
        "y_true must be a 1-D array with one value per case, got shape (2, 2)")
    assert _message(M.check_binary, [0, 1], np.ones((2, 2)) / 2, name="p_val") == (
        "p_val must be a 1-D array with one value per case, got shape (2, 2)")
    assert _message(M.check_binary, [0, 1, 1], [0.1, 0.2], name="p_test") == (
        "y_true and p_test must have the same length, got 3 labels and 2 probabilities; "
        "pass one probability per case")
    assert _message(M.check_binary, [], []) == "y_true and y_prob are empty: there are no cases to evaluate"


def test_probability_messages_and_bounds():
    y = [0, 1, 0, 1]
    y_out, p = M.check_binary(y, [0.0, 1.0, 0.5, 1])  # both ends are probabilities
    assert p.dtype == np.float64 and p.tolist() == [0.0, 1.0, 0.5, 1.0] and y_out.dtype == np.int64
    assert _message(M.check_binary, y, [0.1, np.nan, np.inf, 0.2]) == (
        "y_prob has 2 NaN or infinite values; drop those cases or fill them before computing metrics")
    assert _message(M.check_binary, y, [-0.5, 0.2, 1.5, 2.0], name="p_fit") == (
        "p_fit must be probabilities in [0, 1], but 3 values lie outside (range found [-0.5, 2]); "
        "pass probabilities, e.g. a sigmoid of the logits, not raw scores")
    assert _message(M.check_binary, y, [0.1, 1 + 1e-9, 0.2, 0.3]).startswith(
        "y_prob must be probabilities in [0, 1], but 1 values lie outside")
    assert _message(M.check_binary, y, [-1e-9, 0.5, 0.2, 0.3]).startswith(
        "y_prob must be probabilities in [0, 1], but 1 values lie outside")
    msg = _message(M.check_binary, y, ["a", "0.2", "0.3", "0.4"])
    assert msg.startswith("y_prob must hold numbers (probabilities in [0, 1]): could not convert")


def test_label_messages():
    p = [0.1, 0.2, 0.3, 0.4]
    assert M.check_binary([True, False, True, False], p)[0].tolist() == [1, 0, 1, 0]
    assert M.check_binary(np.array([1.0, 0.0, 1.0, 0.0]), p)[0].tolist() == [1, 0, 1, 0]
    assert M.check_binary(np.array([1, 0, 1, 0], dtype=np.uint8), p)[0].dtype == np.int64
    assert _message(M.check_binary, [0, 1, 2, 2], p) == (
        "labels must be binary 0/1 (or bool), but 2 labels are not (e.g. [2]); "
        "map them to 0 (negative) and 1 (positive)")
    assert _message(M.check_binary, [0.0, 1.0, 0.5, -1.0], p) == (
        "labels must be binary 0/1 (or bool), but 2 labels are not (e.g. [-1.0, 0.5]); "
        "map them to 0 (negative) and 1 (positive)")
    assert _message(M.check_binary, ["no", "yes", "no", "yes"], p) == (
        "labels must be binary 0/1 (or bool), found values such as ['no', 'yes']; "
        "map them to 0 (negative) and 1 (positive)")
    assert _message(M.check_binary, np.array(["0", "1", "0", "1"], dtype=object), p).startswith(
        "labels must be binary 0/1 (or bool), found values such as ['0', '1']")
    assert _message(M.check_binary, np.array([0, 1, None, np.nan], dtype=object), p) == (
        "label column has 2 missing values (NaN, None or inf); "
        "drop the unlabelled cases before computing metrics")
    assert _message(M.check_binary, np.array([0, 1, {}, 1], dtype=object), p).startswith(
        "labels must be binary 0/1 (or bool), found values such as")
    assert _message(M.check_binary, [1, 1, 1, 1], p) == (
        "y_true holds only the positive (1) class (4 cases); a split needs both classes to compute "
        "these metrics, so use a larger or stratified split")
    assert _message(M.check_binary, [0, 0, 0, 0], p) == (
        "y_true holds only the negative (0) class (4 cases); a split needs both classes to compute "
        "these metrics, so use a larger or stratified split")
    assert M.check_binary([0, 0, 0, 0], p, require_both=False)[0].tolist() == [0, 0, 0, 0]


def test_name_and_threshold_messages():
    y, p = [0, 1, 0, 1], [0.1, 0.8, 0.3, 0.6]
    assert _message(M.metric_score, "accuracy", y, p) == (
        f"unknown metric 'accuracy'; choose from {', '.join(M.METRICS)}")
    assert _message(M.metric_score, "f1", y, p, threshold="high") == "threshold must be a number, got 'high'"
    assert _message(M.binary_metrics, y, p, threshold=None) == "threshold must be a number, got None"
    assert _message(M.binary_metrics, y, p, threshold=float("nan")) == "threshold must be finite, got nan"
    assert _message(M.threshold_transfer, y, p, y, p, rules=["median"]) == (
        f"unknown threshold rule 'median'; choose from {', '.join(M.THRESHOLD_RULES)}")
    assert _message(M.threshold_transfer, y, p, y, p, metrics=[]) == (
        f"pass at least one metric; choose from {', '.join(M.METRICS)}")
    assert _message(M.threshold_transfer, y, p, y, p, metrics="kappa") == (
        f"unknown metric 'kappa'; choose from {', '.join(M.METRICS)}")
    one = M.threshold_transfer(y, p, y, p, rules="youden", metrics="f1")
    assert one[["rule", "metric"]].values.tolist() == [["youden", "f1"]]
    assert _message(M.fit_threshold, y, p, rule="otsu") == (
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
            assert M.metric_score(name, y, p, threshold=t) == pytest.approx(value)
    default = M.binary_metrics(y, p)
    assert default == M.binary_metrics(y, p, threshold=0.5)
    assert M.metric_score("f1", y, p) == M.metric_score("f1", y, p, threshold=0.5)
    assert list(default) == list(M.METRICS)


def test_single_class_metric_scores():
    assert np.isnan(M.metric_score("auprc", [0, 0, 0], [0.1, 0.2, 0.3]))
    assert np.isnan(M.metric_score("sensitivity", [0, 0, 0], [0.1, 0.2, 0.9]))
    assert M.metric_score("specificity", [0, 0, 0], [0.1, 0.2, 0.9]) == pytest.approx(2 / 3)
    assert np.isnan(M.metric_score("balanced_accuracy", [1, 1], [0.1, 0.9]))
    assert M.metric_score("f1", [0, 0], [0.1, 0.2]) == 0.0  # no positives at all: defined as 0
    assert M.metric_score("f1", [0, 0], [0.6, 0.2]) == 0.0
    assert M.metric_score("f1", [1, 1], [0.6, 0.2]) == pytest.approx(2 / 3)


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
    assert _message(M.fit_threshold, y, p, rule="sensitivity_0.9", min_sensitivity=0.0) == (
        "min_sensitivity must be in (0, 1], got 0.0")
    assert _message(M.fit_threshold, y, p, rule="sensitivity_0.9", min_sensitivity=1.01) == (
        "min_sensitivity must be in (0, 1], got 1.01")
    assert _message(M.fit_threshold, y, p, rule="prevalence", prevalence=1.0) == (
        "prevalence must be in (0, 1), got 1.0")
    assert _message(M.fit_threshold, y, p, rule="prevalence", prevalence=0.0) == (
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
    assert _message(M.threshold_transfer, y_fit, p_fit, y_eval, [0.2, 0.3, 7, 0.8]).startswith(
        "p_eval must be probabilities in [0, 1]")
    assert _message(M.threshold_transfer, y_fit, [0.1, 0.4, 0.6, 9], y_eval, p_eval).startswith(
        "p_fit must be probabilities in [0, 1]")
