"""The representation-risk study's metric panel, each metric with a patient-grouped bootstrap interval.

The study reports, per task type:

============== ===========================================================================
task           metrics (in this order)
============== ===========================================================================
classification accuracy, balanced_accuracy, macro_f1, log_loss, ece, brier, auroc
multiclass     accuracy, balanced_accuracy, macro_f1, log_loss, ece, brier, macro_auroc
regression     r2, mse, mae, correlation, calibration_slope
============== ===========================================================================

:func:`metric_panel` computes them on the given rows and on every resample of
a patient-grouped bootstrap (:func:`crslib.risk_scores.count_matrix`: whole
patients are drawn with replacement, so a patient's images move together).
Every metric is evaluated on all resamples at once from the count matrix, with
exactly the value it has on the resampled rows (a row drawn c times counts c
times). Resamples on which a metric is undefined (NaN) are left out of its
interval by :func:`crslib.stats.percentile_interval` and counted in
``n_undefined``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from crslib._validation import as_float, check_confidence, check_count, check_groups, check_random_state
from crslib.errors import InputError
from crslib.metrics import _bins, check_binary
from crslib.risk_scores import (LOG_LOSS_EPS, MULTICLASS, count_matrix, row_losses, weighted_auroc, weighted_macro_auroc,
                                weighted_r2)
from crslib.stats import percentile_interval, sum_of_squares

__all__ = ["PANEL_METRICS", "LOG_LOSS_EPS", "metric_panel"]

#: The panel's metrics per task, in the order of :func:`metric_panel`'s rows.
PANEL_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece", "brier", "auroc"),
    MULTICLASS: ("accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece", "brier", "macro_auroc"),
    "regression": ("r2", "mse", "mae", "correlation", "calibration_slope"),
}


# a row-probability sum may miss 1 by float32 softmax rounding, not by more
_SUM_TOLERANCE = 1e-6


# --------------------------------------------------------------------------- weighted building blocks


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, NaN where den is 0."""
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _mean_recall(y: np.ndarray, hit: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """Balanced accuracy per resample: NaN when a class is absent (its recall is undefined)."""
    recalls = [_ratio(counts @ (hit & (y == c)).astype(float), counts @ (y == c).astype(float)) for c in range(k)]
    return np.mean(recalls, axis=0)


def _macro_f1(y: np.ndarray, label: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """Mean F1 over the classes present among the labels or predictions of each resample.

    That is ``sklearn.metrics.f1_score(average="macro")``'s rule: a class
    neither present nor predicted is left out of the mean, so it is always
    defined.
    """
    num = np.zeros((counts.shape[0], k))
    den = np.zeros((counts.shape[0], k))
    for c in range(k):
        tp = counts @ ((label == c) & (y == c)).astype(float)
        den[:, c] = counts @ ((label == c).astype(float) + (y == c).astype(float))  # 2 tp + fp + fn
        num[:, c] = 2.0 * tp
    present = den > 0
    f1 = np.divide(num, den, out=np.zeros_like(num), where=present)
    return f1.sum(axis=1) / present.sum(axis=1)


def _ece(correct: np.ndarray, conf: np.ndarray, counts: np.ndarray, n_bins: int) -> np.ndarray:
    """Uniform-bin ECE per resample, binned by :func:`crslib.metrics.calibration_error`'s own rule."""
    idx, _ = _bins(conf, n_bins, "uniform")
    onehot = np.zeros((conf.size, n_bins))
    onehot[np.arange(conf.size), idx] = 1.0
    gap = counts @ (onehot * (conf - correct)[:, None])  # per bin: sum of probability minus sum of outcome
    return np.abs(gap).sum(axis=1) / counts.sum(axis=1)


def _moments(y: np.ndarray, pred: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Weighted co-moments (s_yy, s_pp, s_yp) per resample and whether y and pred vary."""
    s_yy, y_varies = sum_of_squares(y, counts)
    s_pp, p_varies = sum_of_squares(pred, counts)
    # centred as sum_of_squares centres, for the same accuracy under a large offset
    yc, pc = y - y.mean(), pred - pred.mean()
    s_yp = counts @ (yc * pc) - (counts @ yc) * (counts @ pc) / counts.sum(axis=1)
    return s_yy, s_pp, s_yp, y_varies, p_varies


# --------------------------------------------------------------------------- panels on all resamples


def _classification_samples(y: np.ndarray, p: np.ndarray, counts: np.ndarray, n_bins: int) -> np.ndarray:
    w = counts.sum(axis=1)
    label = (p >= 0.5).astype(np.int64)
    hit = label == y
    nll = row_losses("classification", y, p, "log_loss")
    return np.column_stack([
        counts @ hit.astype(float) / w,
        _mean_recall(y, hit, counts, 2),
        _macro_f1(y, label, counts, 2),
        counts @ nll / w,
        _ece(y.astype(float), p, counts, n_bins),
        counts @ ((p - y) ** 2) / w,
        weighted_auroc(y, p, counts),
    ])


def _multiclass_samples(y: np.ndarray, proba: np.ndarray, counts: np.ndarray, n_bins: int) -> np.ndarray:
    w = counts.sum(axis=1)
    k = proba.shape[1]
    label = proba.argmax(axis=1)
    hit = label == y
    nll = row_losses(MULTICLASS, y, proba, "log_loss")
    sq = ((proba - np.eye(k)[y]) ** 2).sum(axis=1)
    return np.column_stack([
        counts @ hit.astype(float) / w,
        _mean_recall(y, hit, counts, k),
        _macro_f1(y, label, counts, k),
        counts @ nll / w,
        _ece(hit.astype(float), proba.max(axis=1), counts, n_bins),  # top-label confidence vs correctness
        counts @ sq / w,
        weighted_macro_auroc(y, proba, counts),
    ])


def _regression_samples(y: np.ndarray, pred: np.ndarray, counts: np.ndarray) -> np.ndarray:
    w = counts.sum(axis=1)
    s_yy, s_pp, s_yp, y_varies, p_varies = _moments(y, pred, counts)
    corr = np.full(counts.shape[0], np.nan)
    both = y_varies & p_varies
    corr[both] = s_yp[both] / np.sqrt(s_yy[both] * s_pp[both])
    slope = np.full(counts.shape[0], np.nan)
    slope[p_varies] = s_yp[p_varies] / s_pp[p_varies]
    return np.column_stack([
        weighted_r2(y, pred, counts),
        counts @ ((y - pred) ** 2) / w,
        counts @ np.abs(y - pred) / w,
        corr,
        slope,
    ])


def _samples(task: str, y: np.ndarray, pred: np.ndarray, counts: np.ndarray, n_bins: int) -> np.ndarray:
    """The task's panel on every resample: shape (n_resamples, n_metrics), NaN where undefined."""
    if task == "classification":
        return _classification_samples(y, pred, counts, n_bins)
    if task == MULTICLASS:
        return _multiclass_samples(y, pred, counts, n_bins)
    return _regression_samples(y, pred, counts)


# --------------------------------------------------------------------------- input checks


def _finite_1d(values: Any, name: str, task: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InputError(f"{name} for task {task!r} must be 1-D with one value per row, got shape {arr.shape}")
    arr = as_float(arr, f"{name} for task {task!r} must hold numbers")
    if not np.isfinite(arr).all():
        raise InputError(f"{name} has {int((~np.isfinite(arr)).sum())} NaN or infinite values; drop or fill those rows")
    return arr


def _check_multiclass(y: Any, pred: Any) -> tuple[np.ndarray, np.ndarray]:
    proba = np.asarray(pred, dtype=float)
    if proba.ndim != 2 or proba.shape[1] < 2:
        raise InputError("pred for task 'multiclass' must have shape (n_rows, n_classes) with one probability "
                         f"column per class (at least 2), got shape {proba.shape}")
    codes = _finite_1d(y, "y", MULTICLASS)
    if codes.shape[0] != proba.shape[0]:
        raise InputError(f"y and pred must have one entry per row: y has {codes.shape[0]} rows, "
                         f"pred has {proba.shape[0]}")
    k = proba.shape[1]
    if np.any(codes != np.round(codes)) or codes.min() < 0 or codes.max() > k - 1:
        raise InputError(f"y for task 'multiclass' must hold class codes 0 .. {k - 1} (one per column of pred), "
                         f"got values in [{codes.min():g}, {codes.max():g}]")
    if not np.isfinite(proba).all() or proba.min() < 0.0 or proba.max() > 1.0:
        raise InputError("pred for task 'multiclass' must hold finite probabilities in [0, 1]")
    worst = float(np.abs(proba.sum(axis=1) - 1.0).max())
    if worst > _SUM_TOLERANCE:
        raise InputError(f"each row of pred must sum to 1 (class probabilities), but a row misses 1 by {worst:.3g}; "
                         "pass probabilities, e.g. a softmax of the logits")
    return codes.astype(np.int64), proba


def _check_inputs(task: Any, y: Any, pred: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validated (y, pred) for ``task``; InputError naming what was expected."""
    if task not in PANEL_METRICS:
        raise InputError(f"unknown task {task!r}; choose from {', '.join(repr(t) for t in PANEL_METRICS)}")
    if task == MULTICLASS:
        return _check_multiclass(y, pred)
    pred_arr = np.asarray(pred)
    if pred_arr.ndim != 1:
        hint = "; for class-probability columns use task='multiclass'" if task == "classification" else ""
        raise InputError(f"pred for task {task!r} must be 1-D with one value per row "
                         f"(P(y=1) for 'classification'), got shape {pred_arr.shape}{hint}")
    if task == "classification":
        return check_binary(y, pred_arr, name="pred", require_both=False)
    y_arr, p_arr = _finite_1d(y, "y", task), _finite_1d(pred_arr, "pred", task)
    if y_arr.shape[0] != p_arr.shape[0]:
        raise InputError(f"y and pred must have one entry per row: y has {y_arr.shape[0]} rows, pred has {p_arr.shape[0]}")
    if y_arr.shape[0] == 0:
        raise InputError("y and pred are empty: there are no rows to evaluate")
    return y_arr, p_arr


# --------------------------------------------------------------------------- the panel


def metric_panel(task: str, y: np.ndarray, pred: np.ndarray, groups: np.ndarray | None, *,
                 n_resamples: int = 2000, confidence: float = 0.95, random_state: int = 0,
                 n_bins: int = 10) -> pd.DataFrame:
    """The study's metrics on a set of rows, each with a patient-grouped bootstrap interval.

    Parameters
    ----------
    task : {"classification", "multiclass", "regression"}
    y : ndarray of shape (n_rows,)
        Labels 0/1 (classification), class codes 0 .. k-1 (multiclass) or
        numbers (regression).
    pred : ndarray of shape (n_rows,) or (n_rows, k)
        P(y=1) (classification), class probabilities with rows summing to 1
        (multiclass) or predicted values (regression).
    groups : ndarray of shape (n_rows,) or None
        Patient id per row; a resample draws whole patients with replacement.
        None: every row is its own patient.
    n_resamples : int
        Bootstrap resamples.
    confidence : float
        Level of the percentile interval, between 0 and 1.
    random_state : int
        Seed of the resampling; the same seed gives the same intervals.
    n_bins : int
        Equal-width probability bins of the ECE.

    Returns
    -------
    DataFrame
        One row per metric of :data:`PANEL_METRICS` ``[task]``, in that order,
        with columns ``metric``, ``value`` (on the given rows), ``low``,
        ``high`` (the percentile interval over resamples) and
        ``n_undefined`` (resamples on which the metric is undefined, left
        out of the interval).

    Notes
    -----
    Accuracy and F1 predict class 1 when ``P(y=1) >= 0.5`` (binary) or the
    argmax class (multiclass; ties to the lower code). Balanced accuracy is
    the mean recall over all classes and is undefined (NaN) when a class is
    absent; macro-F1 averages over the classes present among the labels or
    the predictions, as scikit-learn does, so it is always defined. The log
    loss clips probabilities to ``[1e-15, 1 - 1e-15]`` (:data:`LOG_LOSS_EPS`).
    The ECE uses ``n_bins`` uniform bins (:func:`crslib.metrics.calibration_error`);
    for multiclass it bins the top-label confidence against correctness. The
    multi-class Brier score is the mean over rows of the sum over classes of
    the squared difference to the one-hot label. AUROC (macro one-vs-rest for
    multiclass) is undefined on a resample missing a class. The calibration
    slope is the OLS slope of ``y`` on ``pred`` (1: calibrated; below 1:
    predictions too spread out), undefined when ``pred`` is constant;
    correlation (Pearson) is also undefined when ``y`` is constant.

    Raises
    ------
    InputError
        For an unknown task, shapes that do not fit the task, labels or
        probabilities out of range, or ``groups`` of the wrong length.

    Examples
    --------
    A perfect classifier with confident probabilities 0.1 and 0.9:

    >>> y = np.array([0, 1] * 10)
    >>> panel = metric_panel("classification", y, 0.1 + 0.8 * y, np.arange(20), n_resamples=200)
    >>> panel["metric"].tolist()
    ['accuracy', 'balanced_accuracy', 'macro_f1', 'log_loss', 'ece', 'brier', 'auroc']
    >>> panel["value"].round(4).tolist(), panel["n_undefined"].tolist()
    ([1.0, 1.0, 1.0, 0.1054, 0.1, 0.01, 1.0], [0, 0, 0, 0, 0, 0, 0])
    >>> bool(np.allclose(panel["low"], panel["value"]) and np.allclose(panel["high"], panel["value"]))
    True
    """
    y_arr, pred_arr = _check_inputs(task, y, pred)
    n = y_arr.shape[0]
    groups_arr = check_groups(groups, n)
    n_resamples = check_count(n_resamples, "n_resamples")
    confidence = check_confidence(confidence)
    random_state = check_random_state(random_state)
    n_bins = check_count(n_bins, "n_bins")

    # The point estimate is the resampled statistic on the all-ones draw: its ECE and Brier score
    # equal metrics.calibration_error and brier_loss to rounding (tests/test_risk_metrics.py).
    value = _samples(task, y_arr, pred_arr, np.ones((1, n)), n_bins)[0]
    names = PANEL_METRICS[task]
    samples = _samples(task, y_arr, pred_arr, count_matrix(groups_arr, n_resamples, random_state), n_bins)
    low, high, n_undefined = percentile_interval(samples, confidence)
    return pd.DataFrame({"metric": list(names), "value": value, "low": low, "high": high,
                         "n_undefined": n_undefined.astype(np.int64)})
