"""Binary classification metrics, decision thresholds and calibration.

Three groups of pure functions (arrays in, numbers or DataFrames out):

* **Metrics at a decision threshold.** :func:`binary_metrics` and
  :func:`metric_score` compute the AUROC, the AUPRC (average precision) and,
  at a threshold, balanced accuracy, sensitivity, specificity and F1. A case
  is predicted positive when ``prob >= threshold``. The numbers equal
  scikit-learn's (``roc_auc_score``, ``average_precision_score``,
  ``balanced_accuracy_score``, ``recall_score``, ``f1_score``).
* **Threshold rules fitted on one split and applied to another.**
  :func:`fit_threshold` picks a threshold on the validation split by one of
  :data:`THRESHOLD_RULES`; :func:`threshold_transfer` reports how each
  metric moves when that threshold is carried over to the test split.
* **Calibration.** :func:`calibration_error` (expected calibration error,
  ECE), :func:`brier_loss`, :func:`reliability_curve` (with a bootstrap band)
  and post-hoc recalibration, temperature or Platt scaling, fitted on the
  validation split with :func:`fit_calibrator` and judged on the test split
  with :func:`calibration_transfer`.

Probabilities are validated: they must be finite and in [0, 1]; labels must
be 0/1 (or bool) without missing values. Bad input raises
:class:`~crslib.errors.InputError` with a message naming the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from crslib import stats
from crslib._validation import as_float, check_confidence, check_count
from crslib.errors import InputError

__all__ = [
    "METRICS",
    "THRESHOLD_RULES",
    "CALIBRATION_METHODS",
    "CALIBRATION_STRATEGIES",
    "Calibrator",
    "check_binary",
    "binary_metrics",
    "metric_score",
    "fit_threshold",
    "threshold_transfer",
    "calibration_error",
    "brier_loss",
    "reliability_curve",
    "fit_calibrator",
    "calibration_floor",
    "calibration_transfer",
]

METRICS = ("auroc", "auprc", "balanced_accuracy", "sensitivity", "specificity", "f1")
THRESHOLD_RULES = ("fixed_0.5", "youden", "f1_max", "sensitivity_0.9", "prevalence")
CALIBRATION_METHODS = ("temperature", "platt")
CALIBRATION_STRATEGIES = ("uniform", "quantile")

_EPS = 1e-7  # probabilities are clipped to [_EPS, 1 - _EPS] before the logit


# --------------------------------------------------------------------------- validation


def _as_1d(values: Any, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D array with one value per case, got shape {arr.shape}")
    return arr


def _check_prob(y_prob: Any, name: str = "y_prob") -> np.ndarray:
    """Probabilities as a float array; finite and in [0, 1]."""
    arr = _as_1d(y_prob, name)
    p = as_float(arr, f"{name} must hold numbers (probabilities in [0, 1])")
    bad = ~np.isfinite(p)
    if bad.any():
        raise InputError(
            f"{name} has {int(bad.sum())} NaN or infinite values; drop those cases or fill them "
            "before computing metrics"
        )
    outside = (p < 0.0) | (p > 1.0)
    if outside.any():
        raise InputError(
            f"{name} must be probabilities in [0, 1], but {int(outside.sum())} values lie outside "
            f"(range found [{p.min():.6g}, {p.max():.6g}]); pass probabilities, e.g. a sigmoid of "
            "the logits, not raw scores"
        )
    return p


def _check_labels(arr: np.ndarray) -> np.ndarray:
    """One-dimensional labels (``check_binary`` has shaped them) as 0/1 int64."""
    if arr.dtype == bool:
        return arr.astype(np.int64)
    if arr.dtype.kind in "iu":
        bad = (arr != 0) & (arr != 1)
    else:
        is_text = arr.dtype.kind in "US" or (
            arr.dtype.kind == "O" and any(isinstance(v, (str, bytes)) for v in arr.tolist())
        )
        try:
            if is_text:
                raise ValueError
            yf = arr.astype(float)
        except (TypeError, ValueError):
            found = sorted({str(v) for v in arr.tolist()})[:5]
            raise InputError(
                f"labels must be binary 0/1 (or bool), found values such as {found}; "
                "map them to 0 (negative) and 1 (positive)"
            ) from None
        missing = ~np.isfinite(yf)
        if missing.any():
            raise InputError(
                f"label column has {int(missing.sum())} missing values (NaN, None or inf); "
                "drop the unlabelled cases before computing metrics"
            )
        bad = (yf != 0) & (yf != 1)
    if bad.any():
        found = np.unique(arr[bad])[:5].tolist()
        raise InputError(
            f"labels must be binary 0/1 (or bool), but {int(bad.sum())} labels are not (e.g. {found}); "
            "map them to 0 (negative) and 1 (positive)"
        )
    return arr.astype(np.int64)


def check_binary(
    y_true: Any,
    y_prob: Any,
    *,
    name: str = "y_prob",
    require_both: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Validate binary labels and probabilities.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        0/1 or bool labels, no missing values.
    y_prob : array-like of shape (n,)
        Probabilities of the positive class, finite and in [0, 1].
    name : str
        Name of the probability array in error messages.
    require_both : bool
        Raise when ``y_true`` holds one class only.

    Returns
    -------
    y : ndarray of int64 (0/1)
    p : ndarray of float

    Raises
    ------
    InputError
        On different lengths, empty input, missing or non-binary labels,
        probabilities that are NaN, infinite or outside [0, 1], or (with
        ``require_both``) a single class.

    Examples
    --------
    >>> y, p = check_binary([True, False], [0.9, 0.2])
    >>> y.tolist(), p.tolist()
    ([1, 0], [0.9, 0.2])
    """
    y_arr = _as_1d(y_true, "y_true")
    p_arr = _as_1d(y_prob, name)
    if y_arr.shape[0] != p_arr.shape[0]:
        raise InputError(
            f"y_true and {name} must have the same length, got {y_arr.shape[0]} labels and "
            f"{p_arr.shape[0]} probabilities; pass one probability per case"
        )
    if y_arr.shape[0] == 0:
        raise InputError(f"y_true and {name} are empty: there are no cases to evaluate")
    y = _check_labels(y_arr)
    p = _check_prob(p_arr, name)
    if require_both:
        n_pos = int(y.sum())
        if n_pos == 0 or n_pos == y.size:
            present = "positive (1)" if n_pos else "negative (0)"
            raise InputError(
                f"y_true holds only the {present} class ({y.size} cases); a split needs both "
                "classes to compute these metrics, so use a larger or stratified split"
            )
    return y, p


def _check_names(values: Sequence[str], allowed: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    values = tuple(values)
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise InputError(f"unknown {what} {unknown[0]!r}; choose from {', '.join(allowed)}")
    if not values:
        raise InputError(f"pass at least one {what}; choose from {', '.join(allowed)}")
    return values


# --------------------------------------------------------------------------- metrics


def _average_precision(y: np.ndarray, p: np.ndarray) -> float:
    """Average precision as scikit-learn computes it (step-wise, no interpolation)."""
    n_pos = int(y.sum())
    if n_pos == 0:
        return float("nan")
    order = np.argsort(-p, kind="mergesort")
    p_sorted = p[order]
    y_sorted = y[order]
    # last index of each run of equal probabilities = one threshold
    last = np.r_[np.flatnonzero(np.diff(p_sorted)), p_sorted.size - 1]
    tp = np.cumsum(y_sorted)[last]
    predicted = last + 1
    precision = tp / predicted
    recall = tp / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def _confusion(y: np.ndarray, p: np.ndarray, threshold: float) -> tuple[int, int, int, int]:
    pred = p >= threshold
    tp = int(np.count_nonzero(pred & (y == 1)))
    fp = int(np.count_nonzero(pred)) - tp
    n_pos = int(y.sum())
    fn = n_pos - tp
    tn = y.size - n_pos - fp
    return tp, fp, fn, tn


def _threshold_metric(name: str, tp: int, fp: int, fn: int, tn: int) -> float:
    nan = float("nan")
    sens = tp / (tp + fn) if tp + fn else nan
    spec = tn / (tn + fp) if tn + fp else nan
    if name == "sensitivity":
        return sens
    if name == "specificity":
        return spec
    if name == "balanced_accuracy":
        return (sens + spec) / 2.0
    # f1 = 2TP / (2TP + FP + FN); 0.0 when nothing is positive in truth or prediction
    denom = 2 * tp + fp + fn
    return 2.0 * tp / denom if denom else 0.0


def _check_threshold(threshold: float) -> float:
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise InputError(f"threshold must be a number, got {threshold!r}") from None
    if not np.isfinite(t):
        raise InputError(f"threshold must be finite, got {threshold!r}")
    return t


def metric_score(y_true: Any, y_prob: Any, *, metric: str, threshold: float = 0.5) -> float:
    """One metric of :data:`METRICS`, fast enough for a bootstrap loop.

    Unlike :func:`binary_metrics`, a single class does not raise: metrics
    that need the missing class (AUROC, AUPRC, sensitivity, specificity,
    balanced accuracy) return NaN, which :func:`crslib.stats.bootstrap_ci`
    leaves out of its interval. F1 stays defined (0.0 when there are neither
    true nor predicted positives).

    Parameters
    ----------
    y_true : array-like of 0/1
    y_prob : array-like of float in [0, 1]
    metric : str
        One of :data:`METRICS`.
    threshold : float
        Cases with ``prob >= threshold`` are predicted positive (ignored by
        ``"auroc"`` and ``"auprc"``).

    Returns
    -------
    float

    Examples
    --------
    >>> metric_score([0, 1, 1, 1], [0.2, 0.4, 0.6, 0.9], metric="sensitivity")
    0.6666666666666666
    >>> metric_score([1, 1], [0.2, 0.7], metric="auroc")
    nan
    """
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    y, p = check_binary(y_true, y_prob, require_both=False)
    if metric == "auroc":
        return stats.auroc(y, p)
    if metric == "auprc":
        return _average_precision(y, p)
    return _threshold_metric(metric, *_confusion(y, p, _check_threshold(threshold)))


def binary_metrics(y_true: Any, y_prob: Any, *, threshold: float = 0.5) -> dict[str, float]:
    """All :data:`METRICS` of binary predictions at a threshold.

    Parameters
    ----------
    y_true : array-like of 0/1 (or bool)
        Both classes must be present.
    y_prob : array-like of float in [0, 1]
        Probability of the positive class.
    threshold : float
        Cases with ``prob >= threshold`` are predicted positive.

    Returns
    -------
    dict
        ``auroc`` (ties count half), ``auprc`` (average precision, as
        ``sklearn.metrics.average_precision_score``), ``balanced_accuracy``,
        ``sensitivity`` (recall of class 1), ``specificity`` (recall of
        class 0) and ``f1`` (0.0 when there are no predicted and no true
        positives, like scikit-learn's ``zero_division=0``).

    Examples
    --------
    >>> m = binary_metrics([0, 0, 1, 1], [0.1, 0.6, 0.4, 0.8])
    >>> m["auroc"], m["sensitivity"], m["specificity"], m["f1"]
    (0.75, 0.5, 0.5, 0.5)
    """
    y, p = check_binary(y_true, y_prob)
    t = _check_threshold(threshold)
    counts = _confusion(y, p, t)
    out = {"auroc": stats.auroc(y, p), "auprc": _average_precision(y, p)}
    for name in METRICS[2:]:
        out[name] = _threshold_metric(name, *counts)
    return out


# --------------------------------------------------------------------------- thresholds


def _threshold_curve(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate thresholds (unique probabilities, descending) with TP and FP
    counts when predicting positive at ``prob >= threshold``."""
    order = np.argsort(-p, kind="mergesort")
    p_sorted = p[order]
    last = np.r_[np.flatnonzero(np.diff(p_sorted)), p_sorted.size - 1]
    tp = np.cumsum(y[order])[last]
    fp = last + 1 - tp
    return p_sorted[last], tp.astype(float), fp.astype(float)


def fit_threshold(
    y_true: Any,
    y_prob: Any,
    *,
    rule: str,
    min_sensitivity: float = 0.9,
    prevalence: float | None = None,
) -> float:
    """Fit a decision threshold on one split (e.g. validation) by a rule.

    Candidate thresholds are the unique observed probabilities; a case is
    predicted positive when ``prob >= threshold``. When several candidates
    reach the same optimum, the LARGEST is returned (no midpoints between
    observed values are used), so the threshold is always an observed
    probability.

    Parameters
    ----------
    y_true : array-like of 0/1
        Both classes must be present.
    y_prob : array-like of float in [0, 1]
    rule : str
        One of :data:`THRESHOLD_RULES`:

        ``"fixed_0.5"``
            0.5, whatever the data.
        ``"youden"``
            Maximises Youden's J = sensitivity + specificity - 1.
        ``"f1_max"``
            Maximises F1.
        ``"sensitivity_0.9"``
            The largest threshold whose sensitivity on these data is at
            least ``min_sensitivity`` (0.9 unless changed).
        ``"prevalence"``
            The threshold whose predicted-positive share on these data is
            closest to ``prevalence``: the empirical ``1 - prevalence``
            quantile of the probabilities. Without ties and with
            ``prevalence * n`` a whole number ``k``, it is the ``k``-th
            largest probability and exactly ``k`` cases are predicted
            positive. The prevalence meant is the one the model was
            trained at: pass the share of positives among its *training*
            rows (as :func:`crslib.protocol.protocol_grid` and
            :func:`crslib.protocol.validation_to_test` do); only when it is
            not passed is the share of positives in ``y_true`` (the rows
            the threshold is fitted on) used instead.
    min_sensitivity : float in (0, 1]
        Target of the ``"sensitivity_0.9"`` rule.
    prevalence : float in (0, 1), optional
        Target share of predicted positives for the ``"prevalence"`` rule:
        the training rows' share of positives; defaults to the share of
        positives in ``y_true``.

    Returns
    -------
    float

    Examples
    --------
    >>> y, p = [0, 0, 0, 1, 1], [0.1, 0.3, 0.35, 0.4, 0.8]
    >>> fit_threshold(y, p, rule="youden")
    0.4
    >>> fit_threshold(y, p, rule="prevalence", prevalence=0.6)
    0.35
    """
    if rule not in THRESHOLD_RULES:
        raise InputError(f"unknown threshold rule {rule!r}; choose from {', '.join(THRESHOLD_RULES)}")
    y, p = check_binary(y_true, y_prob)
    if rule == "fixed_0.5":
        return 0.5
    thresholds, tp, fp = _threshold_curve(y, p)
    n_pos = float(y.sum())
    n_neg = y.size - n_pos
    if rule == "youden":
        score = tp / n_pos - fp / n_neg
    elif rule == "f1_max":
        score = 2 * tp / (tp + fp + n_pos)
    elif rule == "sensitivity_0.9":
        target = float(min_sensitivity)
        if not 0.0 < target <= 1.0:
            raise InputError(f"min_sensitivity must be in (0, 1], got {min_sensitivity!r}")
        # sensitivity grows as the threshold falls; the first (largest) reaching it wins
        ok = tp / n_pos >= target - 1e-12
        return float(thresholds[np.argmax(ok)])
    else:  # prevalence
        target = float(n_pos / y.size if prevalence is None else prevalence)
        if not 0.0 < target < 1.0:
            raise InputError(f"prevalence must be in (0, 1), got {prevalence!r}")
        score = -np.abs((tp + fp) / y.size - target)
    # thresholds are descending: argmax of the first maximum = the largest threshold
    best = np.flatnonzero(score >= score.max() - 1e-12)[0]
    return float(thresholds[best])


def threshold_transfer(
    y_fit: Any,
    p_fit: Any,
    y_eval: Any,
    p_eval: Any,
    *,
    rules: Sequence[str] = THRESHOLD_RULES,
    metrics: Sequence[str] = ("balanced_accuracy", "sensitivity", "specificity", "f1"),
    prevalence: float | None = None,
) -> pd.DataFrame:
    """Fit thresholds on one split and evaluate them on another.

    Each rule's threshold is fitted on the validation split (``y_fit``,
    ``p_fit``) and then applied, unchanged, to the test split (``y_eval``,
    ``p_eval``). The gap shows how optimistic the validation number was.

    Parameters
    ----------
    y_fit, p_fit : array-like
        Labels and probabilities of the split the threshold is fitted on
        (validation).
    y_eval, p_eval : array-like
        Labels and probabilities of the split it is evaluated on (test).
    rules : sequence of str
        Subset of :data:`THRESHOLD_RULES` (default rule options).
    metrics : sequence of str
        Subset of :data:`METRICS`.
    prevalence : float in (0, 1), optional
        Target of the ``"prevalence"`` rule (see :func:`fit_threshold`): the
        share of positives among the rows the model was trained on; by
        default the share of positives in ``y_fit``.

    Returns
    -------
    pandas.DataFrame
        One row per (rule, metric): ``rule, threshold, prevalence, metric,
        fit_value, eval_value, gap`` where ``gap = eval_value - fit_value``
        and ``prevalence`` is the predicted-positive share the
        ``"prevalence"`` rule aimed at (NaN for the other rules).

    Examples
    --------
    >>> y, p = [0, 0, 1, 1], [0.1, 0.4, 0.6, 0.9]
    >>> table = threshold_transfer(y, p, [0, 1, 0, 1], [0.2, 0.3, 0.7, 0.8],
    ...                            rules=["youden"], metrics=["sensitivity"])
    >>> table[["threshold", "fit_value", "eval_value", "gap"]].values.tolist()
    [[0.6, 1.0, 0.5, -0.5]]
    """
    rules = _check_names(rules, THRESHOLD_RULES, "threshold rule")
    metrics = _check_names(metrics, METRICS, "metric")
    yf, pf = check_binary(y_fit, p_fit, name="p_fit")
    ye, pe = check_binary(y_eval, p_eval, name="p_eval")
    target = float(yf.mean() if prevalence is None else prevalence)
    rows = []
    for rule in rules:
        t = fit_threshold(yf, pf, rule=rule, prevalence=prevalence)
        fit_m = binary_metrics(yf, pf, threshold=t)
        eval_m = binary_metrics(ye, pe, threshold=t)
        for m in metrics:
            rows.append({
                "rule": rule,
                "threshold": t,
                "prevalence": target if rule == "prevalence" else np.nan,
                "metric": m,
                "fit_value": fit_m[m],
                "eval_value": eval_m[m],
                "gap": eval_m[m] - fit_m[m],
            })
    return pd.DataFrame(rows, columns=["rule", "threshold", "prevalence", "metric", "fit_value", "eval_value", "gap"])


# --------------------------------------------------------------------------- calibration


def _bins(p: np.ndarray, n_bins: int, strategy: str) -> tuple[np.ndarray, np.ndarray]:
    """Bin index per case and the ``n_bins + 1`` bin edges.

    ``uniform``: bin k holds ``k/n_bins <= p < (k+1)/n_bins`` (computed as
    ``floor(p * n_bins)``), with p = 1.0 in the last bin.
    ``quantile``: the sorted probabilities are cut into ``n_bins`` groups
    of nearly equal size as ``np.array_split`` would (the first
    ``n % n_bins`` groups one larger); each cut becomes a value edge, so a
    run of tied probabilities straddling a cut moves WHOLE into the upper
    bin. Ties are never split and the result does not depend on row order;
    bins may then be empty or unequal. Edges are 0, the first value of each
    group after the first, and 1.
    """
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise InputError(f"n_bins must be an integer >= 1, got {n_bins!r}")
    n_bins = int(n_bins)
    if strategy == "uniform":
        idx = np.clip(np.floor(p * n_bins).astype(np.int64), 0, n_bins - 1)
        return idx, np.linspace(0.0, 1.0, n_bins + 1)
    if strategy == "quantile":
        sizes = np.full(n_bins, p.size // n_bins)
        sizes[: p.size % n_bins] += 1
        starts = np.cumsum(sizes)[:-1]
        p_sorted = np.sort(p)
        cuts = p_sorted[np.minimum(starts, p.size - 1)]
        cuts[starts >= p.size] = np.inf  # more bins than cases: trailing bins stay empty
        idx = np.searchsorted(cuts, p, side="right")
        edges = np.r_[0.0, np.minimum(cuts, 1.0), 1.0]
        return idx.astype(np.int64), edges
    raise InputError(
        f"unknown binning strategy {strategy!r}; choose from {', '.join(CALIBRATION_STRATEGIES)}"
    )


def calibration_error(
    y_true: Any,
    y_prob: Any,
    *,
    n_bins: int = 10,
    strategy: str = "uniform",
) -> float:
    """Expected calibration error (ECE) of binary probabilities; lower is better.

    ``ECE = sum over non-empty bins of (count / N) * |mean prob - fraction
    positive|``.

    Parameters
    ----------
    y_true : array-like of 0/1
    y_prob : array-like of float in [0, 1]
    n_bins : int
    strategy : {"uniform", "quantile"}
        ``"uniform"``: equal-width bins over [0, 1]; bin k holds
        ``k/n_bins <= p < (k+1)/n_bins``, a probability of exactly 0.0 lands
        in the first bin and 1.0 in the last. ``"quantile"``: equal-mass
        bins, the sorted probabilities cut into ``n_bins`` nearly equal
        groups (sizes as ``np.array_split``) with tied probabilities kept in
        one bin (a tie run crossing a cut joins the upper bin).

    Returns
    -------
    float

    Examples
    --------
    >>> calibration_error([0, 1, 1, 1], [0.2, 0.6, 0.8, 1.0], n_bins=2)
    0.2
    """
    y, p = check_binary(y_true, y_prob, require_both=False)
    idx, edges = _bins(p, n_bins, strategy)
    sum_p = np.bincount(idx, weights=p, minlength=edges.size - 1)
    sum_y = np.bincount(idx, weights=y, minlength=edges.size - 1)
    # sum_k (n_k / N) |mean_p_k - frac_k| = sum_k |sum_p_k - sum_y_k| / N; empty bins add 0
    return float(np.sum(np.abs(sum_p - sum_y)) / y.size)


def calibration_floor(
    y_prob: Any,
    *,
    n_bins: int = 10,
    quantile: float = 0.95,
    n_simulations: int = 200,
    random_state: int | None = 0,
) -> float:
    """The ECE a perfectly calibrated model shows on a test set of this size: a quantile over simulations.

    ECE is above 0 on a finite sample even when the probabilities are right.
    Each simulation draws labels ``y ~ Bernoulli(y_prob)``, for which
    ``y_prob`` is calibrated by construction, and computes
    :func:`calibration_error` (uniform bins); the ``quantile`` of those ECEs
    is the largest a calibrated model plausibly shows here. An observed ECE
    above it is miscalibration, not sampling noise.

    Parameters
    ----------
    y_prob : array-like of float in [0, 1]
        The probabilities whose calibration is judged (e.g. after calibration, on test).
    n_bins : int
        Bins of the ECE, as in :func:`calibration_error`.
    quantile : float
        In (0, 1).
    n_simulations : int
    random_state : int or None

    Returns
    -------
    float

    Examples
    --------
    >>> floor = calibration_floor(np.full(100, 0.3))
    >>> 0.05 < floor < 0.2  # 100 images: about 0.08 by chance alone
    True
    """
    p = check_binary(np.zeros(np.size(y_prob)), y_prob, require_both=False)[1]
    if not 0 < quantile < 1:
        raise InputError(f"quantile must lie in (0, 1), got {quantile!r}")
    idx, edges = _bins(p, n_bins, "uniform")
    rng = np.random.default_rng(random_state)
    sum_p = np.bincount(idx, weights=p, minlength=edges.size - 1)
    eces = np.empty(check_count(n_simulations, "n_simulations"))
    for i in range(eces.size):
        # the positives drawn per bin; ECE = sum_k |sum_p_k - sum_y_k| / N, as in calibration_error
        sum_y = np.bincount(idx, weights=(rng.random(p.size) < p).astype(float), minlength=edges.size - 1)
        eces[i] = np.abs(sum_p - sum_y).sum() / p.size
    return float(np.quantile(eces, quantile))


def brier_loss(y_true: Any, y_prob: Any) -> float:
    """Brier score: mean squared difference between probability and label.

    Equals ``sklearn.metrics.brier_score_loss``; lower is better.

    Examples
    --------
    >>> brier_loss([0, 1], [0.25, 0.75])
    0.0625
    """
    y, p = check_binary(y_true, y_prob, require_both=False)
    return float(np.mean((p - y) ** 2))


def reliability_curve(
    y_true: Any,
    y_prob: Any,
    *,
    n_bins: int = 10,
    strategy: str = "uniform",
    n_resamples: int = 200,
    confidence: float = 0.95,
    groups: Any = None,
    random_state: int | None = 0,
) -> pd.DataFrame:
    """Reliability curve: observed fraction positive per probability bin.

    The bins are fixed from the original data (as in
    :func:`calibration_error`); the band of each bin's observed fraction is
    a percentile bootstrap over rows, or over whole ``groups`` (patients),
    drawn by :func:`crslib.stats.resample_indices`. Resamples in which a bin
    is empty are left out of that bin's band.

    Parameters
    ----------
    y_true : array-like of 0/1
    y_prob : array-like of float in [0, 1]
    n_bins : int
    strategy : {"uniform", "quantile"}
    n_resamples : int
        Bootstrap resamples for the band.
    confidence : float
        Coverage of the band.
    groups : array-like, optional
        Group label per case (e.g. patient id); whole groups are resampled.
    random_state : int
        Seed; the same seed gives the same band.

    Returns
    -------
    pandas.DataFrame
        One row per non-empty bin: ``bin, low_edge, high_edge, count,
        mean_prob, frac_pos, frac_pos_low, frac_pos_high``.

    Examples
    --------
    >>> curve = reliability_curve([0, 0, 1, 1], [0.1, 0.2, 0.7, 0.9], n_bins=2, n_resamples=50)
    >>> curve[["bin", "count", "frac_pos"]].values.tolist()
    [[0.0, 2.0, 0.0], [1.0, 2.0, 1.0]]
    """
    y, p = check_binary(y_true, y_prob, require_both=False)
    n_resamples = check_count(n_resamples, "n_resamples")
    confidence = check_confidence(confidence)
    idx, edges = _bins(p, n_bins, strategy)
    n_b = edges.size - 1
    count = np.bincount(idx, minlength=n_b)
    sum_p = np.bincount(idx, weights=p, minlength=n_b)
    sum_y = np.bincount(idx, weights=y, minlength=n_b)
    keep = np.flatnonzero(count > 0)
    samples = np.empty((n_resamples, n_b))
    resampler = stats.resample_indices(
        y.size, n_resamples=n_resamples, groups=groups, random_state=random_state
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        for r, rows in enumerate(resampler):
            c = np.bincount(idx[rows], minlength=n_b)
            samples[r] = np.bincount(idx[rows], weights=y[rows], minlength=n_b) / c
    low, high, _ = stats.percentile_interval(samples[:, keep], confidence)
    return pd.DataFrame({
        "bin": keep,
        "low_edge": edges[keep],
        "high_edge": edges[keep + 1],
        "count": count[keep],
        "mean_prob": sum_p[keep] / count[keep],
        "frac_pos": sum_y[keep] / count[keep],
        "frac_pos_low": low,
        "frac_pos_high": high,
    })


# --------------------------------------------------------------------------- recalibration


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


def _nll(z: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-likelihood of labels under probabilities sigmoid(z)."""
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


@dataclass(frozen=True)
class Calibrator:
    """A fitted post-hoc calibration map of probabilities.

    Attributes
    ----------
    method : {"temperature", "platt"}
    params : dict
        ``{"temperature": T}`` (``p' = sigmoid(logit(p) / T)``) or
        ``{"a": a, "b": b}`` (``p' = sigmoid(a * logit(p) + b)``).
    """

    method: str
    params: dict = field(default_factory=dict)

    def transform(self, y_prob: Any) -> np.ndarray:
        """Recalibrate probabilities (clipped to [1e-7, 1 - 1e-7] before the logit)."""
        from scipy.special import expit

        z = _logit(_check_prob(y_prob))
        if self.method == "temperature":
            return expit(z / self.params["temperature"])
        if self.method == "platt":
            return expit(self.params["a"] * z + self.params["b"])
        raise InputError(f"unknown calibration method {self.method!r}; choose from {', '.join(CALIBRATION_METHODS)}")


def fit_calibrator(y_true: Any, y_prob: Any, *, method: str) -> Calibrator:
    """Fit temperature or Platt scaling on one split (e.g. validation).

    Both minimise the mean negative log-likelihood of the labels, without
    regularisation, on ``z = logit(p)`` with ``p`` clipped to
    [1e-7, 1 - 1e-7].

    * ``"temperature"``: one parameter ``T > 0``, ``p' = sigmoid(z / T)``,
      fitted over ``log T`` in [-7, 7] (bounded scalar search). It rescales
      confidence but never changes the ranking or which side of 0.5 a case
      falls on. ``T > 1`` means the model was overconfident.
    * ``"platt"``: ``p' = sigmoid(a * z + b)``, a logistic regression on the
      logit. On perfectly separable data ``a`` grows until the optimiser
      stops.

    Parameters
    ----------
    y_true : array-like of 0/1
        Both classes must be present.
    y_prob : array-like of float in [0, 1]
    method : {"temperature", "platt"}

    Returns
    -------
    Calibrator
        Apply it to another split with ``calibrator.transform(p_test)``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(0, 2, 4000)
    >>> y = rng.random(4000) < 1 / (1 + np.exp(-z))
    >>> overconfident = 1 / (1 + np.exp(-3 * z))
    >>> cal = fit_calibrator(y, overconfident, method="temperature")
    >>> 2.7 < cal.params["temperature"] < 3.3
    True
    """
    from scipy.optimize import minimize, minimize_scalar

    if method not in CALIBRATION_METHODS:
        raise InputError(f"unknown calibration method {method!r}; choose from {', '.join(CALIBRATION_METHODS)}")
    y, p = check_binary(y_true, y_prob)
    z = _logit(p)
    yf = y.astype(float)
    if method == "temperature":
        res = minimize_scalar(lambda log_t: _nll(z * np.exp(-log_t), yf), bounds=(-7.0, 7.0),
                              method="bounded", options={"xatol": 1e-8})
        return Calibrator("temperature", {"temperature": float(np.exp(res.x))})

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        from scipy.special import expit

        s = theta[0] * z + theta[1]
        resid = expit(s) - yf
        return _nll(s, yf), np.array([np.mean(resid * z), np.mean(resid)])

    res = minimize(loss, x0=np.array([1.0, 0.0]), jac=True, method="BFGS", options={"gtol": 1e-10})
    return Calibrator("platt", {"a": float(res.x[0]), "b": float(res.x[1])})


def calibration_transfer(
    y_fit: Any,
    p_fit: Any,
    y_eval: Any,
    p_eval: Any,
    *,
    methods: Sequence[str] = CALIBRATION_METHODS,
    n_bins: int = 10,
    fit_name: str = "validation",
) -> pd.DataFrame:
    """Fit calibrators on one split and compare calibration on another.

    Each method is fitted on (``y_fit``, ``p_fit``), usually validation,
    and all numbers are computed on (``y_eval``, ``p_eval``), usually test,
    before and after the map. A row ``method="none"`` repeats the
    uncalibrated numbers.

    Parameters
    ----------
    y_fit, p_fit, y_eval, p_eval : array-like
    methods : sequence of str
        Subset of :data:`CALIBRATION_METHODS`.
    n_bins : int
        Bins of both ECE variants.
    fit_name : str
        Written in the ``fitted_on`` column.

    Returns
    -------
    pandas.DataFrame
        ``method, fitted_on, ece_uniform_before, ece_uniform_after,
        ece_quantile_before, ece_quantile_after, brier_before, brier_after,
        params, ece_uniform_floor_after``; the last is the uniform-bin ECE a
        perfectly calibrated model with the calibrated probabilities would
        still show on the evaluation split (:func:`calibration_floor`, 95th
        percentile).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> z = rng.normal(0, 2, 2000)
    >>> y = rng.random(2000) < 1 / (1 + np.exp(-z))
    >>> p = 1 / (1 + np.exp(-3 * z))
    >>> t = calibration_transfer(y[:1000], p[:1000], y[1000:], p[1000:])
    >>> t["method"].tolist()
    ['none', 'temperature', 'platt']
    >>> bool((t["ece_uniform_after"][1:] < t["ece_uniform_before"][1:]).all())
    True
    """
    methods = _check_names(methods, CALIBRATION_METHODS, "calibration method")
    yf, pf = check_binary(y_fit, p_fit, name="p_fit")
    ye, pe = check_binary(y_eval, p_eval, name="p_eval", require_both=False)

    def scores(p: np.ndarray) -> tuple[float, float, float]:
        return (calibration_error(ye, p, n_bins=n_bins, strategy="uniform"),
                calibration_error(ye, p, n_bins=n_bins, strategy="quantile"),
                brier_loss(ye, p))

    before = scores(pe)
    rows = [("none", before, {}, calibration_floor(pe, n_bins=n_bins))]
    for method in methods:
        cal = fit_calibrator(yf, pf, method=method)
        after = cal.transform(pe)
        rows.append((method, scores(after), dict(cal.params), calibration_floor(after, n_bins=n_bins)))
    return pd.DataFrame([{
        "method": method,
        "fitted_on": fit_name,
        "ece_uniform_before": before[0],
        "ece_uniform_after": after[0],
        "ece_quantile_before": before[1],
        "ece_quantile_after": after[1],
        "brier_before": before[2],
        "brier_after": after[2],
        "params": params,
        "ece_uniform_floor_after": floor,
    } for method, after, params, floor in rows])
