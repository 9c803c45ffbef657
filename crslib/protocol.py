"""Protocol sensitivity: one headline number, many evaluation choices.

Study 2 (Kermany pediatric chest radiographs) shows that a reported score
depends on choices that papers rarely report: which backbone (eight
pretrained backbones differed by only 0.026 AUROC), frozen or fine-tuned
(0.044 AUROC), which decision threshold (0.090 balanced accuracy), where the
threshold and the calibration were fitted. This module turns those choices
into a grid and measures, on one run, how much each one moves the headline
number.

The grid's input is one tidy table of predictions, one row per (backbone,
training policy, seed, image), with the image's ``split`` (``train``,
``val``, ``test``), ``patient_id``, ``y_true`` and ``prob``. Frozen
predictions come from :func:`linear_probe` on cached embeddings, fine-tuned
ones from :func:`crslib.models.finetune_classifier`; :func:`protocol_grid`
fits every threshold rule on the validation rows, scores every metric on the
test rows with a patient-grouped bootstrap CI, and :func:`effect_summary`
averages, for each factor, the absolute change of the headline number when
only that factor changes.

Everything here is pure: DataFrames and arrays in, DataFrames out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from crslib import paper
from crslib._compat import one_blas_thread
from crslib.errors import DataError, InputError
from crslib.metrics import (
    METRICS,
    THRESHOLD_RULES,
    calibration_transfer,
    check_binary,
    fit_threshold,
    metric_score,
    threshold_transfer,
)
from crslib.splits import grouped_partition
from crslib.stats import percentile_interval, resample_indices

log = logging.getLogger(__name__)

__all__ = [
    "POLICIES",
    "PREDICTION_COLUMNS",
    "PAPER_EFFECTS",
    "protocol_splits",
    "linear_probe",
    "protocol_grid",
    "effect_summary",
    "headline_table",
    "validation_to_test",
    "transfer_gaps",
    "calibration_excess",
    "repeated_partitions",
    "checklist_evidence",
]

#: Training policies compared by the grid.
POLICIES = ("frozen", "finetuned")

#: Columns a predictions table needs.
PREDICTION_COLUMNS = ("backbone", "policy", "seed", "image_id", "patient_id", "split", "y_true", "prob")

#: The study's measured effects (Kermany), quoted as the paper's.
PAPER_EFFECTS: dict[str, dict[str, Any]] = {
    "backbone": {"metric": "auroc", "value": paper.value("backbone_spread"),
                 "text": f"eight pretrained backbones differ by {paper.value('backbone_spread'):.3f} AUROC"},
    "policy": {"metric": "auroc", "value": paper.value("policy_effect"),
               "text": f"frozen vs fine-tuned moves AUROC by {paper.value('policy_effect'):.3f}"},
    "rule": {"metric": "balanced_accuracy", "value": paper.value("threshold_effect"),
             "text": f"the decision threshold moves balanced accuracy by {paper.value('threshold_effect'):.3f}"},
    "seed": {"metric": "auroc", "value": None, "text": "not reported as a single number"},
}

#: The headline metric of each factor (as in the paper's comparison).
HEADLINE_METRIC = {"backbone": "auroc", "policy": "auroc", "rule": "balanced_accuracy", "seed": "auroc"}


# --------------------------------------------------------------------------- splits


def _refuse_multiclass(labels: Any, what: str) -> None:
    """The protocol tools are binary: a label with more than two classes is a user error, said plainly."""
    values = pd.unique(pd.Series(np.asarray(labels, dtype=object).ravel()).dropna())
    if len(values) > 2:
        shown = ", ".join(repr(v) for v in sorted(values, key=str)[:5]) + (", ..." if len(values) > 5 else "")
        raise InputError(
            f"{what} has {len(values)} classes ({shown}); the protocol tools are binary: map it to 0 (negative) "
            "and 1 (positive), e.g. one class against the rest"
        )


def protocol_splits(
    split: Any,
    labels: Any,
    *,
    groups: Any,
    min_validation: int = 50,
    validation_fraction: float = 0.15,
    train: str = "train",
    validation: str = "val",
    test: str = "test",
    random_state: int = 0,
) -> tuple[np.ndarray, str]:
    """The train / validation / test assignment the protocol evaluates on.

    The official test split is kept as it is. The official validation split
    is used when it holds at least ``min_validation`` images of both classes;
    otherwise (Kermany's official ``val`` holds 16 images) the official
    validation images go back into the training pool (every row outside the
    test split) and a validation partition of ``validation_fraction`` of
    that pool's *patients* is carved out of it (patient-grouped, so no child
    is in both; stratified by each patient's first label). The rest of the
    pool are the training rows, so an official validation image ends up in
    the carved validation partition or in the training rows, with its
    patient.

    Parameters
    ----------
    split : array-like of str
        The manifest's ``split`` column.
    labels : array-like of 0/1
        The label per row (used to check both classes are present).
    groups : array-like
        Patient id per row.
    min_validation : int
        Smallest official validation split that is used as it is.
    validation_fraction : float
        Share of the pool's patients (official train and validation images)
        carved out when the official validation split is not used.
    train, validation, test : str
        Split names. Every row must carry one of them: a row of any other
        split (``"validation"`` where ``validation="val"``, say) would
        otherwise be trained on without anyone noticing.
    random_state : int
        Seed of the carve-out.

    Returns
    -------
    assignment : ndarray of str
        ``"train"``, ``"val"`` or ``"test"`` per row.
    provenance : str
        One sentence saying where each partition came from.

    Raises
    ------
    DataError
        No rows in the official test split, rows of a split that is none of
        ``train``, ``validation``, ``test``, or a partition with one class.

    Examples
    --------
    >>> split = ["train"] * 8 + ["test"] * 4
    >>> a, how = protocol_splits(split, [0, 1] * 6, groups=range(12), min_validation=1)
    >>> sorted(set(a.tolist())), "carved" in how
    (['test', 'train', 'val'], True)

    An official validation split that is too small is not kept apart: its
    images (rows 8 to 11 here) are carved like the training images.

    >>> split = ["train"] * 8 + ["val"] * 4 + ["test"] * 4
    >>> a, _ = protocol_splits(split, [0, 1] * 8, groups=range(16), min_validation=5, validation_fraction=0.5)
    >>> a[8:12].tolist()
    ['val', 'val', 'train', 'train']
    """
    split = np.asarray(split).astype(str)
    groups = np.asarray(groups)
    labels = np.asarray(labels)
    _refuse_multiclass(labels, "labels")
    if not (split.shape == groups.shape == labels.shape):
        raise InputError(f"split, groups and labels must have one entry per row, got {split.size}, {groups.size}, {labels.size}")
    if not (0.0 < validation_fraction < 1.0):
        raise InputError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    unknown = sorted(set(np.unique(split).tolist()) - {train, validation, test})
    if unknown:
        raise DataError(
            f"split has values {unknown} that are none of train={train!r}, validation={validation!r}, "
            f"test={test!r}; rename them in the manifest or pass the split names"
        )
    is_test = split == test
    if not is_test.any():
        raise DataError(
            f"no rows with split == {test!r}: the protocol evaluates on the official test split; "
            "add a split column with train/val/test values (patients must not cross splits)"
        )
    is_val = split == validation
    val_ok = is_val.sum() >= min_validation and len(np.unique(labels[is_val])) == 2
    assignment = np.where(is_test, "test", "train").astype(object)
    n_official_val = int(is_val.sum())
    if val_ok:
        assignment[is_val] = "val"
        provenance = (f"official test split ({int(is_test.sum())} images); official validation split "
                      f"({n_official_val} images); training pool ({int((assignment == 'train').sum())} images)")
    else:
        pool = np.flatnonzero(~is_test)
        # stratified by each patient's first label, so that both classes reach the validation part
        first_label = pd.Series(labels[pool]).groupby(groups[pool]).transform("first").to_numpy()
        val_part = []
        for value in np.unique(first_label):
            members = pool[first_label == value]
            if len(np.unique(groups[members])) < 2:
                continue
            _, part = grouped_partition(groups[members], (1.0 - validation_fraction, validation_fraction),
                                        random_state=random_state)
            val_part += members[part].tolist()
        assignment[val_part] = "val"
        train_part = np.flatnonzero(assignment == "train")
        provenance = (f"official test split ({int(is_test.sum())} images); validation carved from the training pool "
                      f"by patient ({len(val_part)} images, {validation_fraction:.0%} of the pool's patients, seed "
                      f"{random_state}) because the official validation split has {n_official_val} images; "
                      f"training rows: the rest of the pool ({len(train_part)} images)")
    for name in ("train", "val", "test"):
        present = np.unique(labels[assignment == name])
        if len(present) < 2:
            raise DataError(
                f"the {name} partition holds a single class ({present.tolist()}); the protocol needs both classes "
                "in train, validation and test"
            )
    return assignment.astype(str), provenance


# --------------------------------------------------------------------------- frozen policy


def linear_probe(
    X: Any,
    y: Any,
    split: Any,
    *,
    groups: Any = None,
    Cs: Sequence[float] = (0.01, 0.1, 1.0, 10.0),
    n_splits: int = 5,
    train: str = "train",
    random_state: int = 0,
) -> tuple[np.ndarray, float]:
    """The frozen policy: a logistic-regression probe on fixed embeddings.

    Standardisation and the probe are fitted on the ``train`` rows only; the
    inverse regularisation ``C`` is chosen from ``Cs`` by patient-grouped
    cross-validated AUROC inside the training rows (never on validation or
    test rows).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Embeddings of every row.
    y : array-like of 0/1
        Labels (only the training rows' are read).
    split : array-like of str
        Partition per row.
    groups : array-like, optional
        Patient id per row for the grouped inner CV (default: rows).
    Cs : sequence of float
        Candidate ``C`` values.
    n_splits : int
        Inner CV folds.
    train : str
        The training partition's name.
    random_state : int
        Seed of the fold assignment.

    Returns
    -------
    prob : ndarray of shape (n_samples,)
        Predicted probability of the positive class for every row.
    C : float
        The chosen ``C``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 50)
    >>> X = rng.normal(size=(100, 3)) + y[:, None]
    >>> prob, C = linear_probe(X, y, ["train"] * 80 + ["test"] * 20)
    >>> prob.shape, bool(0 < prob.min() < prob.max() < 1)
    ((100,), True)
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedGroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.asarray(X, dtype=np.float64)
    split = np.asarray(split).astype(str)
    if X.ndim != 2 or X.shape[0] != split.size:
        raise InputError(f"X must be (n_samples, n_features) with one row per split entry, got {X.shape} and {split.size}")
    if not np.isfinite(X).all():
        raise InputError(f"X holds {int((~np.isfinite(X)).sum())} NaN or infinite values; the embeddings are broken")
    _refuse_multiclass(y, "y")
    tr = split == train
    y_tr, _ = check_binary(np.asarray(y)[tr], np.full(int(tr.sum()), 0.5), name="labels of the training rows")
    g = np.arange(X.shape[0]) if groups is None else np.asarray(groups)
    g_tr = g[tr]

    def model(C: float):
        return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=5000))

    folds = min(n_splits, int(np.bincount(y_tr).min()), len(np.unique(g_tr)))
    best_C = float(Cs[0])
    with one_blas_thread():  # ~20 small fits per probe
        if len(Cs) > 1 and folds >= 2:
            cv = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=random_state)
            scores = []
            for C in Cs:
                oof = np.zeros(y_tr.size)
                for fit_idx, val_idx in cv.split(X[tr], y_tr, g_tr):
                    oof[val_idx] = model(C).fit(X[tr][fit_idx], y_tr[fit_idx]).predict_proba(X[tr][val_idx])[:, 1]
                scores.append(metric_score(y_tr, oof, metric="auroc"))
            best_C = float(Cs[int(np.nanargmax(scores))])
        fitted = model(best_C).fit(X[tr], y_tr)
    return fitted.predict_proba(X)[:, 1], best_C


# --------------------------------------------------------------------------- grid


def _check_predictions(predictions: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(predictions, pd.DataFrame):
        raise InputError(f"predictions must be a DataFrame with columns {', '.join(PREDICTION_COLUMNS)}")
    missing = [c for c in PREDICTION_COLUMNS if c not in predictions.columns]
    if missing:
        raise InputError(f"predictions lack column(s) {', '.join(missing)}; need {', '.join(PREDICTION_COLUMNS)}")
    bad_policy = sorted(set(predictions["policy"].astype(str)) - set(POLICIES))
    if bad_policy:
        raise InputError(f"unknown training policy {bad_policy}; use {', '.join(POLICIES)}")
    check_binary(predictions["y_true"].to_numpy(), predictions["prob"].to_numpy(), require_both=False)
    return predictions


def _training_prevalence(y: np.ndarray, splits: np.ndarray, fit: np.ndarray) -> float:
    """The ``prevalence`` rule's target for one model, the same in every table: the share of
    positives among its ``train`` rows (the fitting rows' share when there are none)."""
    train = splits == "train"
    return float(y[train].mean()) if train.any() else float(y[fit].mean())


def protocol_grid(
    predictions: pd.DataFrame,
    *,
    rules: Sequence[str] = THRESHOLD_RULES,
    metrics: Sequence[str] = METRICS,
    fit_on: str = "val",
    evaluate_on: str = "test",
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int = 0,
) -> pd.DataFrame:
    """Every (backbone, policy, seed, threshold rule, metric) cell with a CI.

    For each model (backbone x policy x seed) every threshold rule is fitted
    on the ``fit_on`` rows and every metric is computed on the
    ``evaluate_on`` rows. The ``prevalence`` rule makes the predicted-positive
    share on the ``fit_on`` rows equal the share of positives among the
    model's ``train`` rows (the ``fit_on`` rows' share when the table has no
    ``train`` rows), as in :func:`validation_to_test`.
    CIs are percentile intervals of a patient-grouped bootstrap of the test
    rows; the same resamples are used for every rule and metric of one
    model, so differences between rules are paired. Threshold-free metrics
    (AUROC, AUPRC) are the same for every rule and repeated on each rule's
    rows so that the table stays tidy.

    Parameters
    ----------
    predictions : DataFrame
        Columns :data:`PREDICTION_COLUMNS`.
    rules : sequence of str
        Threshold rules (:data:`crslib.metrics.THRESHOLD_RULES`).
    metrics : sequence of str
        Metrics (:data:`crslib.metrics.METRICS`).
    fit_on, evaluate_on : str
        Partitions the thresholds are fitted on and the metrics computed on.
    n_resamples : int
        Bootstrap resamples per model.
    confidence : float
        CI level.
    random_state : int
        Seed of the bootstrap.

    Returns
    -------
    DataFrame
        Columns ``backbone``, ``policy``, ``seed``, ``rule``, ``threshold``,
        ``prevalence`` (the training prevalence the ``prevalence`` rule
        aimed at; NaN for the other rules), ``metric``, ``value``, ``low``,
        ``high``, ``n_test``, ``fit_value`` (the metric on the rows the
        threshold was fitted on).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 100)
    >>> p = np.clip(0.5 + 0.3 * (y - 0.5) + rng.normal(0, 0.2, 200), 0, 1)
    >>> preds = pd.DataFrame({"backbone": "b", "policy": "frozen", "seed": 0, "image_id": range(200),
    ...                       "patient_id": range(200), "split": ["train"] * 100 + ["val"] * 50 + ["test"] * 50,
    ...                       "y_true": y, "prob": p})
    >>> grid = protocol_grid(preds, rules=["fixed_0.5"], metrics=["auroc"], n_resamples=50)
    >>> grid[["rule", "metric"]].values.tolist()
    [['fixed_0.5', 'auroc']]
    """
    predictions = _check_predictions(predictions)
    unknown_rules = [r for r in rules if r not in THRESHOLD_RULES]
    if unknown_rules:
        raise InputError(f"unknown threshold rule(s) {unknown_rules}; use {', '.join(THRESHOLD_RULES)}")
    unknown_metrics = [m for m in metrics if m not in METRICS]
    if unknown_metrics:
        raise InputError(f"unknown metric(s) {unknown_metrics}; use {', '.join(METRICS)}")
    rows: list[dict[str, Any]] = []
    for (backbone, policy, seed), model in predictions.groupby(["backbone", "policy", "seed"], sort=True):
        splits = model["split"].astype(str).to_numpy()
        y = model["y_true"].to_numpy().astype(int)
        p = model["prob"].to_numpy(dtype=float)
        fit, ev = splits == fit_on, splits == evaluate_on
        where = f"{backbone} / {policy} / seed {seed}"
        for mask, name in ((fit, fit_on), (ev, evaluate_on)):
            check_binary(y[mask], p[mask], name=f"probabilities of {where} on {name!r}")
        prevalence = _training_prevalence(y, splits, fit)
        y_ev, p_ev = y[ev], p[ev]
        g_ev = model["patient_id"].to_numpy()[ev]
        draws = list(resample_indices(int(ev.sum()), n_resamples=n_resamples, groups=g_ev, random_state=random_state))
        free = {m: np.array([metric_score(y_ev[i], p_ev[i], metric=m) for i in draws])
                for m in metrics if m in ("auroc", "auprc")}
        for rule in rules:
            t = fit_threshold(y[fit], p[fit], rule=rule, prevalence=prevalence)
            for metric in metrics:
                if metric in free:
                    samples = free[metric]
                else:
                    samples = np.array([metric_score(y_ev[i], p_ev[i], metric=metric, threshold=t) for i in draws])
                low, high, _ = percentile_interval(samples, confidence)
                rows.append({
                    "backbone": backbone, "policy": policy, "seed": seed, "rule": rule, "threshold": t,
                    "prevalence": prevalence if rule == "prevalence" else np.nan, "metric": metric,
                    "value": metric_score(y_ev, p_ev, metric=metric, threshold=t),
                    "low": float(low), "high": float(high), "n_test": int(ev.sum()),
                    "fit_value": metric_score(y[fit], p[fit], metric=metric, threshold=t),
                })
    return pd.DataFrame(rows)


def effect_summary(
    grid: pd.DataFrame,
    *,
    factors: Sequence[str] = ("backbone", "policy", "rule", "seed"),
    headline: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """How much the headline number moves when only one factor changes.

    For a factor (say ``policy``) the grid's cells are grouped by every
    *other* factor; within a group, every pair of levels of the factor
    (frozen vs fine-tuned for one backbone, seed and rule) gives one absolute
    difference of the headline metric. ``mean_abs_change`` averages them
    over all groups and pairs; ``mean_range`` averages each group's
    max - min. Groups with a single level (an ONNX backbone has no
    fine-tuned cells) contribute nothing.

    Parameters
    ----------
    grid : DataFrame
        From :func:`protocol_grid`.
    factors : sequence of str
        Factors to summarise.
    headline : mapping, optional
        Factor -> metric; default :data:`HEADLINE_METRIC` (AUROC for
        backbone, policy and seed; balanced accuracy for the threshold rule,
        which cannot move AUROC), as in the paper's comparison.

    Returns
    -------
    DataFrame
        ``factor``, ``metric``, ``mean_abs_change``, ``mean_range``,
        ``max_abs_change``, ``n_pairs``, ``n_levels``, ``paper_value``,
        ``paper_text`` (the paper's effect, quoted as the paper's).

    Examples
    --------
    >>> grid = pd.DataFrame({"backbone": ["a", "a", "b", "b"], "policy": ["frozen", "finetuned"] * 2,
    ...                      "seed": 0, "rule": "youden", "metric": "auroc", "value": [0.8, 0.9, 0.7, 0.7]})
    >>> effect_summary(grid, factors=["policy"])["mean_abs_change"].round(3).tolist()
    [0.05]
    """
    headline = dict(HEADLINE_METRIC if headline is None else headline)
    keys = ["backbone", "policy", "seed", "rule"]
    missing = [c for c in keys + ["metric", "value"] if c not in grid.columns]
    if missing:
        raise InputError(f"grid lacks column(s) {', '.join(missing)}; pass the output of protocol_grid")
    rows = []
    for factor in factors:
        if factor not in keys:
            raise InputError(f"unknown factor {factor!r}; use {', '.join(keys)}")
        metric = headline.get(factor, "auroc")
        cells = grid[grid["metric"] == metric]
        others = [k for k in keys if k != factor]
        diffs, ranges = [], []
        for _, group in cells.groupby(others, sort=True):
            values = group.drop_duplicates(factor)["value"].to_numpy(dtype=float)
            values = values[np.isfinite(values)]
            if values.size < 2:
                continue
            diffs += [abs(a - b) for a, b in combinations(values, 2)]
            ranges.append(values.max() - values.min())
        paper = PAPER_EFFECTS.get(factor, {})
        rows.append({
            "factor": factor, "metric": metric,
            "mean_abs_change": float(np.mean(diffs)) if diffs else np.nan,
            "mean_range": float(np.mean(ranges)) if ranges else np.nan,
            "max_abs_change": float(np.max(diffs)) if diffs else np.nan,
            "n_pairs": len(diffs), "n_levels": int(cells[factor].nunique()),
            "paper_value": paper.get("value") if paper.get("metric") == metric else None,
            "paper_text": paper.get("text", ""),
        })
    return pd.DataFrame(rows)


def headline_table(grid: pd.DataFrame, *, rule: str = "youden", metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """One row per (backbone, policy), metrics as columns, averaged over seeds.

    Parameters
    ----------
    grid : DataFrame
        From :func:`protocol_grid`.
    rule : str
        The threshold rule whose cells are shown.
    metrics : sequence of str
        Metric columns, in order.

    Returns
    -------
    DataFrame
        Indexed by ``backbone`` and ``policy``; values ``"0.912 [0.88, 0.94]"``
        strings are left to the caller: this returns the numbers, with
        ``<metric>_low``/``<metric>_high`` columns (seed means).

    Examples
    --------
    >>> grid = pd.DataFrame({"backbone": "a", "policy": "frozen", "seed": [0, 1], "rule": "youden",
    ...                      "metric": "auroc", "value": [0.8, 0.9], "low": 0.7, "high": 1.0})
    >>> headline_table(grid, metrics=["auroc"])["auroc"].round(2).tolist()
    [0.85]
    """
    cells = grid[(grid["rule"] == rule) & grid["metric"].isin(list(metrics))]
    if cells.empty:
        raise InputError(f"the grid has no cells for rule {rule!r} and metrics {list(metrics)}")
    mean = cells.groupby(["backbone", "policy", "metric"])[["value", "low", "high"]].mean().unstack("metric")
    out = pd.DataFrame(index=mean.index)
    for m in metrics:
        if ("value", m) in mean.columns:
            out[m] = mean[("value", m)]
            out[f"{m}_low"] = mean[("low", m)]
            out[f"{m}_high"] = mean[("high", m)]
    return out


def validation_to_test(
    predictions: pd.DataFrame,
    *,
    what: str = "threshold",
    fit_on: str = "val",
    evaluate_on: str = "test",
) -> pd.DataFrame:
    """Thresholds or calibrators fitted on validation and evaluated on test, per model.

    Runs :func:`crslib.metrics.threshold_transfer` (``what="threshold"``) or
    :func:`crslib.metrics.calibration_transfer` (``what="calibration"``) for
    every (backbone, policy, seed) of a predictions table. The
    ``prevalence`` rule aims at the share of positives among the model's
    ``train`` rows, as in :func:`protocol_grid`, so both tables hold the same
    threshold for it (its ``prevalence`` column says which share).

    Parameters
    ----------
    predictions : DataFrame
        Columns :data:`PREDICTION_COLUMNS`.
    what : {"threshold", "calibration"}
    fit_on, evaluate_on : str
        Partitions fitted on and evaluated on.

    Returns
    -------
    DataFrame
        The metrics function's table with ``backbone``, ``policy`` and
        ``seed`` columns added (a calibration table's ``params`` column is
        dropped: the fitted parameters are in the calibrator).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 100)
    >>> preds = pd.DataFrame({"backbone": "b", "policy": "frozen", "seed": 0, "image_id": range(200),
    ...                       "patient_id": range(200), "split": ["val"] * 100 + ["test"] * 100,
    ...                       "y_true": y, "prob": np.clip(0.3 + 0.4 * y + rng.normal(0, 0.2, 200), 0, 1)})
    >>> sorted(validation_to_test(preds, what="calibration")["method"])
    ['none', 'platt', 'temperature']
    """
    predictions = _check_predictions(predictions)
    if what not in ("threshold", "calibration"):
        raise InputError(f"what must be 'threshold' or 'calibration', got {what!r}")
    tables = []
    for (backbone, policy, seed), model in predictions.groupby(["backbone", "policy", "seed"], sort=True):
        splits = model["split"].astype(str).to_numpy()
        fit, ev = model[splits == fit_on], model[splits == evaluate_on]
        args = (fit["y_true"].to_numpy(), fit["prob"].to_numpy(), ev["y_true"].to_numpy(), ev["prob"].to_numpy())
        if what == "threshold":
            y = model["y_true"].to_numpy().astype(int)
            table = threshold_transfer(*args, prevalence=_training_prevalence(y, splits, splits == fit_on))
        else:
            table = calibration_transfer(*args)
        tables.append(table.drop(columns="params", errors="ignore").assign(backbone=backbone, policy=policy, seed=seed))
    return pd.concat(tables, ignore_index=True)


# --------------------------------------------------------------------------- split-level uncertainty


def transfer_gaps(transfers: pd.DataFrame, metric: str = "balanced_accuracy") -> pd.Series:
    """|test - validation| of ``metric`` for each validation-fitted threshold of a :func:`validation_to_test`
    table: every model and rule except the fixed ones (``fixed_*``), which nothing fitted.

    Their mean is the run's validation-to-test gap that chapter 04 states and the claims ledger tests; one
    computation, so both quote the same number.

    Examples
    --------
    >>> t = pd.DataFrame({"rule": ["fixed_0.5", "youden", "youden"], "metric": ["balanced_accuracy"] * 3,
    ...                   "gap": [0.9, -0.1, 0.05]})
    >>> transfer_gaps(t).tolist()
    [0.1, 0.05]
    """
    missing = [c for c in ("rule", "metric", "gap") if c not in transfers.columns]
    if missing:
        raise InputError(f"transfers needs the columns rule, metric and gap; missing {', '.join(missing)}")
    rows = transfers[(transfers["metric"] == metric) & ~transfers["rule"].astype(str).str.startswith("fixed")]
    return pd.to_numeric(rows["gap"], errors="coerce").abs().reset_index(drop=True)


def calibration_excess(calibration: pd.DataFrame) -> pd.DataFrame:
    """Each validation-fitted calibration of a :func:`validation_to_test` table (``what="calibration"``; the
    ``none`` rows left out): test ECE ``before`` and ``after`` it, the ECE a perfectly calibrated model shows on
    the same test set (``floor``, :func:`crslib.metrics.calibration_floor`) and ``excess = after - floor``.

    Chapter 04 states their means and the claims ledger tests the excess: one computation, one number.

    Examples
    --------
    >>> c = pd.DataFrame({"method": ["none", "platt"], "ece_uniform_before": [0.2, 0.2],
    ...                   "ece_uniform_after": [0.2, 0.12], "ece_uniform_floor_after": [0.08, 0.07]})
    >>> calibration_excess(c).round(3).to_dict("records")
    [{'before': 0.2, 'after': 0.12, 'floor': 0.07, 'excess': 0.05}]
    """
    need = ("method", "ece_uniform_before", "ece_uniform_after", "ece_uniform_floor_after")
    missing = [c for c in need if c not in calibration.columns]
    if missing:
        raise InputError(f"calibration needs the columns {', '.join(need)}; missing {', '.join(missing)}")
    rows = calibration[calibration["method"] != "none"]
    out = pd.DataFrame({"before": pd.to_numeric(rows["ece_uniform_before"], errors="coerce"),
                        "after": pd.to_numeric(rows["ece_uniform_after"], errors="coerce"),
                        "floor": pd.to_numeric(rows["ece_uniform_floor_after"], errors="coerce")})
    return out.assign(excess=out["after"] - out["floor"]).reset_index(drop=True)


def repeated_partitions(
    X: Any,
    y: Any,
    *,
    groups: Any,
    n_partitions: int = 5,
    test_fraction: float = 0.2,
    rule: str = "youden",
    validation_fraction: float = 0.15,
    random_state: int = 0,
) -> pd.DataFrame:
    """Split-level uncertainty: the frozen probe on repeated patient-grouped partitions.

    Each partition draws new train / validation / test patients from the
    rows given (the official split is ignored), fits :func:`linear_probe`
    (with a fixed ``C = 1`` to keep it cheap), fits the threshold ``rule`` on
    validation and scores the test rows. The spread across partitions is the
    uncertainty that one fixed split hides.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of 0/1
    groups : array-like
        Patient id per row.
    n_partitions : int
        Number of partitions (at least 2).
    test_fraction, validation_fraction : float
        Shares of patients.
    rule : str
        Threshold rule fitted on validation.
    random_state : int
        Seed of the first partition (partition ``i`` uses ``random_state + i``).

    Returns
    -------
    DataFrame
        ``partition``, ``auroc``, ``balanced_accuracy``, ``n_test``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 100)
    >>> X = rng.normal(size=(200, 2)) + y[:, None]
    >>> repeated_partitions(X, y, groups=np.arange(200), n_partitions=3).shape
    (3, 4)
    """
    if isinstance(n_partitions, bool) or int(n_partitions) < 2:
        raise InputError(f"n_partitions must be at least 2, got {n_partitions!r}")
    _refuse_multiclass(y, "y")
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y).astype(int)
    groups = np.asarray(groups)
    rows = []
    for i in range(int(n_partitions)):
        fractions = (1.0 - test_fraction - validation_fraction, validation_fraction, test_fraction)
        tr, va, te = grouped_partition(groups, fractions, random_state=random_state + i)
        split = np.empty(y.size, dtype=object)
        split[tr], split[va], split[te] = "train", "val", "test"
        if any(len(np.unique(y[idx])) < 2 for idx in (tr, va, te)):
            raise DataError(
                f"partition {i} has a single class in one part; use more patients or a smaller n_partitions"
            )
        prob, _ = linear_probe(X, y, split.astype(str), Cs=(1.0,))  # one C: no inner CV, so no groups to keep apart
        t = fit_threshold(y[va], prob[va], rule=rule, prevalence=float(y[tr].mean()))
        rows.append({"partition": i, "auroc": metric_score(y[te], prob[te], metric="auroc"),
                     "balanced_accuracy": metric_score(y[te], prob[te], metric="balanced_accuracy", threshold=t),
                     "n_test": len(te)})
    return pd.DataFrame(rows)


def _reported_rows(frame: pd.DataFrame, where: dict[str, Any], name: str) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for column, wanted in where.items():
        mask &= (frame[column] == wanted).to_numpy()
    if not mask.any():
        raise InputError(f"{name} has no rows for the reported model {where}")
    return frame[mask]


def checklist_evidence(
    grid: pd.DataFrame,
    effects: pd.DataFrame,
    *,
    predictions: pd.DataFrame,
    calibration: pd.DataFrame,
    transfers: pd.DataFrame,
    partitions: pd.DataFrame,
    reported: Mapping[str, Any],
    calibration_method: str,
    finetune_epochs: int,
    provenance: Any,
    n_resamples: int,
    confidence: float = 0.95,
    source: str = "04_protocol_sensitivity",
) -> dict[str, dict[str, Any]]:
    """The reporting-checklist evidence of one protocol study (items 2-6).

    Turns the tables of a protocol study into the fields that
    :func:`crslib.checklist.build_checklist` reads for the items
    ``training_policy``, ``threshold``, ``metrics``, ``calibration`` and
    ``uncertainty``; each item's ``effect`` quotes this run's measured effect
    next to the paper's (:mod:`crslib.paper`).

    Parameters
    ----------
    grid : DataFrame
        From :func:`protocol_grid`.
    effects : DataFrame
        From :func:`effect_summary`.
    predictions : DataFrame
        The test predictions the grid was computed from (:data:`PREDICTION_COLUMNS`).
    calibration, transfers : DataFrame
        From :func:`validation_to_test` with calibrators and with threshold rules.
    partitions : DataFrame
        From :func:`repeated_partitions`.
    reported : mapping
        The model the headline number uses: ``backbone``, ``policy``, ``seed``
        (the seed of the reported cells), ``rule`` (threshold rule),
        ``backbones`` (all backbones compared, in order) and ``seeds`` (all
        seeds).
    calibration_method : str
        The calibrator whose before/after ECE is reported.
    finetune_epochs : int
    provenance : any JSON value
        Where the validation split comes from (recorded as is).
    n_resamples : int
        Bootstrap resamples of the grid's intervals.
    confidence : float
    source : str
        Name of the producing notebook or command, recorded with each effect.

    Returns
    -------
    dict
        Item id -> fields.
    """
    by = effects.set_index("factor")
    backbone, policy, seed, rule = (reported[key] for key in ("backbone", "policy", "seed", "rule"))
    model = {"backbone": backbone, "policy": policy, "seed": seed}
    rep_cells = _reported_rows(grid, {**model, "rule": rule}, "grid").set_index("metric")
    same_rule = grid[grid.rule == rule]
    rank_auc = same_rule[same_rule.metric == "auroc"].groupby(["backbone", "policy"])["value"].mean()
    rank_ba = same_rule[same_rule.metric == "balanced_accuracy"].groupby(["backbone", "policy"])["value"].mean()
    rho = float(rank_auc.rank().corr(rank_ba.rank()))
    rep_cal = _reported_rows(calibration, model, "calibration").set_index("method")
    rep_gap = _reported_rows(transfers, {**model, "rule": rule}, "transfers").set_index("metric")
    half_widths = (grid["high"] - grid["low"])[grid.metric == "auroc"] / 2
    auroc_range = float(partitions["auroc"].max() - partitions["auroc"].min())
    ece_before = float(rep_cal.loc[calibration_method, "ece_uniform_before"])
    ece_after = float(rep_cal.loc[calibration_method, "ece_uniform_after"])

    def effect(description: str, value: float, unit: str, paper_value: float | None) -> dict[str, Any]:
        return {"description": description, "value": value, "unit": unit, "paper": paper_value, "source": source}

    return {
        "training_policy": {
            "policies_compared": sorted(predictions["policy"].unique().tolist()),
            "reported_policy": policy,
            "backbones": list(reported["backbones"]),
            "finetune_epochs": int(finetune_epochs),
            "backbone_effect_auroc": float(by.loc["backbone", "mean_abs_change"]),
            "effect": effect("mean |change| of test AUROC, frozen vs fine-tuned (same backbone, seed, rule)",
                             float(by.loc["policy", "mean_abs_change"]), "AUROC", paper.value("policy_effect")),
        },
        "threshold": {
            "rule": rule,
            "fitted_on": "validation",
            "validation_provenance": provenance,
            "rules_compared": list(THRESHOLD_RULES),
            "reported_threshold": float(rep_cells.loc["balanced_accuracy", "threshold"]),
            "validation_to_test_gap_balanced_accuracy": float(rep_gap.loc["balanced_accuracy", "gap"]),
            "effect": effect("mean |change| of test balanced accuracy between threshold rules (same model)",
                             float(by.loc["rule", "mean_abs_change"]), "balanced accuracy",
                             paper.value("threshold_effect")),
        },
        "metrics": {
            "reported": list(METRICS),
            "reported_values": {m: float(rep_cells.loc[m, "value"]) for m in METRICS},
            "effect": effect("Spearman correlation of the models' ranking by AUROC and by balanced accuracy "
                             f"({rule} threshold); below 1 means the metrics order models differently",
                             rho, "Spearman rho", None),
        },
        "calibration": {
            "method": calibration_method,
            "fitted_on": "validation",
            "ece_before": ece_before,
            "ece_after": ece_after,
            "effect": effect(f"test ECE (10 equal-width bins) of the reported model after validation-fitted "
                             f"{calibration_method} scaling minus before", ece_after - ece_before, "ECE", None),
        },
        "uncertainty": {
            "confidence": float(confidence),
            "n_resamples": int(n_resamples),
            "resampling": "patient-grouped bootstrap of the official test split",
            "seeds": list(reported["seeds"]),
            "split_level": {"n_partitions": int(len(partitions)), "auroc_sd": float(partitions["auroc"].std()),
                            "auroc_range": auroc_range},
            "median_auroc_ci_half_width": float(half_widths.median()),
            "effect": effect("range of the reported backbone's frozen test AUROC over repeated patient-grouped "
                             "partitions", auroc_range, "AUROC", None),
        },
    }
