"""File-property shortcut audit: do file properties alone predict the label?

Study 2's second question of a data set's official split. A *shortcut
classifier* sees only file properties (size, dimensions, container, bit depth,
JPEG settings, metadata; :func:`crslib.data.file_properties`), encoded as a
numeric design matrix by :func:`property_matrix`, and predicts the label:
within the training pool by patient-grouped cross-validation, and on the
official test split by a model fitted on the whole pool
(:func:`shortcut_audit`). High balanced accuracy in the pool but chance on the
test split means the archive's file encoding is coupled with the label in the
pool only: a shortcut a model can learn and the test split does not reward.
The paper reports 0.992 in the pool and 0.496 on the test split of the Kermany
pediatric chest X-rays (:data:`crslib.audit.PAPER_NUMBERS`).

Everything here is pure: DataFrames and arrays in, result objects out. The
partition classifier, split provenance and the combined audit are in
:mod:`crslib.audit`; the HTML report in :mod:`crslib.reports`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from crslib._compat import one_blas_thread
from crslib._io import JsonResult, json_ready
from crslib._validation import as_feature_matrix, as_row_values, check_count
from crslib.errors import InputError
from crslib.probes import (
    class_codes,
    class_proba,
    classifier_name,
    fit_classifier,
    make_classifier,
    out_of_fold_proba,
)
from crslib.splits import check_pool_and_test, grouped_folds, pool_test_masks
from crslib.stats import bootstrap_ci, group_permuter, permutation_p_value

__all__ = [
    "ALPHA",
    "DEFAULT_EXCLUDE",
    "MIN_PERMUTATIONS",
    "MISSING_SENTINEL",
    "MULTI_VALUED",
    "PropertyMatrix",
    "ShortcutAuditResult",
    "permutation_note",
    "permutation_summary",
    "property_matrix",
    "shortcut_audit",
]

#: Columns :func:`property_matrix` drops by default: identifiers, and the split
#: and label should a merged manifest be passed by mistake.
DEFAULT_EXCLUDE = ("image_id", "path", "patient_id", "split", "label")

#: Columns holding ``|``-joined sets (one indicator per member).
MULTI_VALUED = ("png_chunks", "png_text_keys")

#: Value written where a property is missing (next to a ``<name>_missing`` indicator).
MISSING_SENTINEL = -1.0

#: Level below which a permutation p-value counts as evidence (one-sided).
ALPHA = 0.05

#: Fewest permutations that can give p < :data:`ALPHA`: the smallest possible
#: p-value is 1 / (n_permutations + 1), and 1/20 is not below 0.05.
MIN_PERMUTATIONS = 20


# --------------------------------------------------------------------------- permutation verdicts


def permutation_summary(observed: float, null: Any, *, confidence: float = 0.95) -> dict[str, Any]:
    """A permutation test's p-value, its null distribution in brief, and the verdict.

    Parameters
    ----------
    observed : float
        The statistic on the data (higher means more evidence).
    null : array-like of shape (n_permutations,)
        The statistic under the permutations (NaN entries are left out).
    confidence : float
        Coverage of the null's central range (``null_low`` to ``null_high``).

    Returns
    -------
    dict
        ``p_value`` (:func:`crslib.stats.permutation_p_value`), ``null_mean``,
        ``null_low``, ``null_high`` (NaN without permutations) and
        ``evidence``: ``"yes"`` (p < :data:`ALPHA`), ``"no"`` (p >= ALPHA with
        at least :data:`MIN_PERMUTATIONS` valid permutations), ``"too few
        permutations"`` (p >= ALPHA when fewer could not have gone below it) or
        ``"no permutation test"``.

    Examples
    --------
    >>> import numpy as np
    >>> permutation_summary(0.9, np.linspace(0.4, 0.6, 29))["evidence"]
    'yes'
    >>> permutation_summary(0.9, np.linspace(0.4, 0.6, 10))["evidence"]
    'too few permutations'
    """
    values = np.asarray(null, dtype=float).ravel()
    valid = values[np.isfinite(values)]
    p = permutation_p_value(float(observed), values)
    out = {"p_value": p, "null_mean": float("nan"), "null_low": float("nan"), "null_high": float("nan")}
    if valid.size:
        tail = (1.0 - confidence) / 2.0
        low, high = np.quantile(valid, [tail, 1.0 - tail])
        out.update(null_mean=float(valid.mean()), null_low=float(low), null_high=float(high))
    if not np.isfinite(p):
        out["evidence"] = "no permutation test"
    elif p < ALPHA:
        out["evidence"] = "yes"
    else:
        out["evidence"] = "no" if valid.size >= MIN_PERMUTATIONS else "too few permutations"
    return out


def permutation_note(n_permutations: int) -> str:
    """Why a permutation test of ``n_permutations`` cannot decide anything; ``""`` when it can (or none ran).

    Examples
    --------
    >>> permutation_note(10)
    'with 10 permutations the smallest possible p is 0.091: too few to decide; use at least 20'
    >>> permutation_note(0), permutation_note(100)
    ('', '')
    """
    n = int(n_permutations)
    if n <= 0 or n >= MIN_PERMUTATIONS:
        return ""
    return (f"with {n} permutations the smallest possible p is {1.0 / (n + 1):.3f}: too few to decide; "
            f"use at least {MIN_PERMUTATIONS}")


# --------------------------------------------------------------------------- result


@dataclass
class ShortcutAuditResult:
    """File properties -> label: within the pool and on the official test split.

    Attributes
    ----------
    table : DataFrame
        Two rows, ``scope`` ``"pool"`` (patient-grouped cross-validation,
        out-of-fold predictions) and ``"test"`` (a model fitted on the whole
        pool, predicting the test split): ``balanced_accuracy``, ``low``,
        ``high`` (patient-grouped bootstrap CI; too narrow for the pool's
        cross-validated number, see :func:`crslib.audit.partition_audit`), ``p_value``
        (permutation test, NaN without one), ``null_mean``, ``null_low``,
        ``null_high`` (mean and central ``confidence`` range of the
        balanced accuracies under the permutations), ``evidence`` (the
        test's verdict, see :func:`permutation_summary`), ``chance`` (1 /
        number of classes), ``n_images``, ``n_patients``.
    importances : DataFrame
        ``feature``, ``importance_mean``, ``importance_std``: permutation
        importance of each file property for the pool's out-of-fold balanced
        accuracy; ``alone``: the pool's out-of-fold balanced accuracy with
        that property only. Sorted by ``importance_mean``, then ``alone``
        (descending).
    classes : list
        Label values, in the order of the class codes.
    pool_predictions, test_predictions : ndarray
        Predicted labels (out-of-fold in the pool; from the pool fit on test).
    folds : ndarray of shape (n_rows,)
        CV fold of each pool row (-1 for test and left-out rows).
    model : str
    n_splits, n_repeats : int
    confidence : float
    n_permutations : int
    null : ndarray of shape (n_permutations, 2)
        Balanced accuracies (pool, test) under the permutations.
    """

    table: pd.DataFrame
    importances: pd.DataFrame
    classes: list[Any]
    pool_predictions: np.ndarray = field(repr=False)
    test_predictions: np.ndarray = field(repr=False)
    folds: np.ndarray = field(repr=False)
    model: str = "logistic"
    n_splits: int = 5
    n_repeats: int = 10
    confidence: float = 0.95
    n_permutations: int = 0
    null: np.ndarray = field(default_factory=lambda: np.empty((0, 2)), repr=False)

    def _value(self, scope: str, column: str) -> float:
        return float(self.table.loc[self.table["scope"] == scope, column].iloc[0])

    @property
    def pool_balanced_accuracy(self) -> float:
        return self._value("pool", "balanced_accuracy")

    @property
    def test_balanced_accuracy(self) -> float:
        return self._value("test", "balanced_accuracy")

    def to_dict(self, *, top: int = 20) -> dict[str, Any]:
        """JSON-ready summary (the ``top`` most important properties); ``permutation_note`` says why the
        permutation tests decide nothing when they had too few permutations (:func:`permutation_note`)."""
        return json_ready(digits=4, obj={
            "model": self.model,
            "n_splits": self.n_splits,
            "n_repeats": self.n_repeats,
            "n_permutations": self.n_permutations,
            "permutation_note": permutation_note(self.n_permutations),
            "confidence": self.confidence,
            "classes": [str(c) for c in self.classes],
            "table": self.table.to_dict(orient="records"),
            "importances": self.importances.head(top).to_dict(orient="records"),
        })


# --------------------------------------------------------------------------- design matrix


@dataclass(frozen=True, eq=False)
class PropertyMatrix(JsonResult):
    """Numeric design matrix of file properties (:func:`property_matrix`).

    :func:`shortcut_audit` and :func:`crslib.audit.partition_audit` take it
    as it is; :func:`shortcut_audit` then permutes the columns of one
    property together (a plain DataFrame has no groups: each column is its
    own feature).

    Attributes
    ----------
    features : DataFrame of float
        One row per image (same index as the properties), one column per
        encoded feature (``format=PNG``, ``jpeg_quality``,
        ``jpeg_quality_missing``, ``png_chunks:tEXt``, ...).
    feature_groups : dict of str -> str
        Each column of :attr:`features` -> the property it came from.

    Examples
    --------
    >>> import pandas as pd
    >>> pm = property_matrix(pd.DataFrame({"format": ["PNG", "JPEG"], "width": [64, 64]}))
    >>> pm.to_dict()
    {'features': ['format=JPEG', 'format=PNG'], 'feature_groups': {'format=JPEG': 'format', 'format=PNG': 'format'}, 'n_rows': 2}
    """

    features: pd.DataFrame
    feature_groups: dict[str, str] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """A copy of :attr:`features` (changing it leaves this result as it is)."""
        return self.features.copy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the feature names (column order), their property groups and the row count."""
        return json_ready({
            "features": [str(c) for c in self.features.columns],
            "feature_groups": dict(self.feature_groups),
            "n_rows": len(self.features),
        })


def _design(X: Any) -> Any:
    """The feature matrix of a :class:`PropertyMatrix`; anything else as given."""
    return X.features if isinstance(X, PropertyMatrix) else X


def property_matrix(
    properties: pd.DataFrame,
    *,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    multi_valued: Sequence[str] = MULTI_VALUED,
    max_categories: int = 50,
) -> PropertyMatrix:
    """Numeric design matrix from file properties.

    Column by column, in the order of ``properties``:

    - numbers stay numbers; booleans become 0/1;
    - text columns are one-hot encoded as ``<column>=<value>`` (values in
      sorted order; beyond the ``max_categories`` most frequent values the
      rest share ``<column>=<other>``);
    - ``|``-joined set columns (``png_chunks``, ``png_text_keys``) get one
      0/1 column per member, ``<column>:<member>``;
    - a missing value becomes :data:`MISSING_SENTINEL` (-1) for numbers and
      booleans and all zeros for text, and every column with a missing value
      gets a 0/1 indicator ``<column>_missing`` (for file properties, missing
      mostly means "not this format": ``jpeg_quality`` of a PNG);
    - identifiers and columns in ``exclude`` are dropped, and so are columns
      that end up constant (they cannot separate anything).

    Parameters
    ----------
    properties : DataFrame
        Typically :func:`crslib.data.file_properties`.
    exclude : sequence of str
        Columns to drop (default: ``image_id``, ``path``, ``patient_id``,
        ``split``, ``label``).
    multi_valued : sequence of str
        Columns holding ``|``-joined sets.
    max_categories : int
        Most one-hot columns per text column.

    Returns
    -------
    PropertyMatrix
        ``features``: DataFrame of float with the same index as
        ``properties``; ``feature_groups`` maps each of its columns to the
        property it came from (used to permute a property's columns together
        in :func:`shortcut_audit`).

    Raises
    ------
    InputError
        ``properties`` is not a DataFrame, or no column varies.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> props = pd.DataFrame({"image_id": ["a", "b", "c"], "format": ["PNG", "JPEG", "PNG"],
    ...                       "jpeg_quality": [np.nan, 90.0, np.nan], "has_exif": [False, True, False]})
    >>> pm = property_matrix(props)
    >>> list(pm.features.columns)
    ['format=JPEG', 'format=PNG', 'jpeg_quality', 'jpeg_quality_missing', 'has_exif']
    >>> pm.features["jpeg_quality"].tolist(), pm.feature_groups["jpeg_quality_missing"]
    ([-1.0, 90.0, -1.0], 'jpeg_quality')
    """
    if not isinstance(properties, pd.DataFrame):
        raise InputError(f"properties must be a DataFrame (see crslib.data.file_properties), got {type(properties).__name__}")
    if isinstance(max_categories, bool) or not isinstance(max_categories, (int, np.integer)) or max_categories < 1:
        raise InputError(f"max_categories must be an integer >= 1, got {max_categories!r}")
    excluded = set(exclude)
    columns: dict[str, np.ndarray] = {}
    groups: dict[str, str] = {}

    def add(name: str, values: np.ndarray, group: str) -> None:
        columns[name] = np.asarray(values, dtype=float)
        groups[name] = group

    for column in properties.columns:
        name = str(column)
        if name in excluded:
            continue
        series = properties[column]
        # for object columns pandas treats a cell as _validation.is_missing does: lists and sets are present
        missing = series.isna().to_numpy()
        present = series[~missing]
        if series.dtype == bool or (len(present) and all(isinstance(v, (bool, np.bool_)) for v in present)):
            values = np.where(missing, MISSING_SENTINEL, series.where(~missing, False).astype(bool).astype(float))
            add(name, values, name)
        elif pd.api.types.is_numeric_dtype(series.dtype) or (
            len(present) and pd.to_numeric(present, errors="coerce").notna().all()
            and not any(isinstance(v, str) for v in present)
        ):
            values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
            missing = missing | ~np.isfinite(values)
            add(name, np.where(missing, MISSING_SENTINEL, values), name)
        elif name in multi_valued:
            members = sorted({m for v in present for m in str(v).split("|") if m})
            sets = [set(str(v).split("|")) if not miss else set() for v, miss in zip(series, missing)]
            for member in members:
                add(f"{name}:{member}", np.array([member in s for s in sets], dtype=float), name)
        else:
            text = present.astype(str)
            counts = text.value_counts()
            kept = sorted(counts.index[:max_categories]) if len(counts) > max_categories else sorted(counts.index)
            as_text = series.astype(str).to_numpy()
            for value in kept:
                add(f"{name}={value}", (as_text == value) & ~missing, name)
            if len(counts) > max_categories:
                add(f"{name}=<other>", ~np.isin(as_text, kept) & ~missing, name)
        if missing.any():
            add(f"{name}_missing", missing.astype(float), name)
    frame = pd.DataFrame(columns, index=properties.index)
    varying = [c for c in frame.columns if np.ptp(frame[c].to_numpy()) > 0] if len(frame) else []
    if not varying:
        raise InputError(
            "no file property varies across these images, so there is nothing to classify with; "
            "pass the output of crslib.data.file_properties for the whole data set"
        )
    return PropertyMatrix(features=frame[varying], feature_groups={c: groups[c] for c in varying})


# --------------------------------------------------------------------------- shortcut audit


def _balanced_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean recall over the classes present in ``y_true``; NaN with fewer than two."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    k = int(max(y_true.max(initial=0), y_pred.max(initial=0))) + 1
    counts = np.bincount(y_true, minlength=k)
    present = counts > 0
    if present.sum() < 2:
        return float("nan")
    hits = np.bincount(y_true[y_true == y_pred], minlength=k)
    return float(np.mean(hits[present] / counts[present]))


def _feature_groups(X: Any, n_columns: int) -> dict[str, list[int]]:
    """Property name -> column indices (columns of one property are permuted together).

    A :class:`PropertyMatrix` brings its groups; a DataFrame's columns are
    features of their own; an array's columns are ``x0``, ``x1``, ...
    """
    mapping: dict[str, str] = {}
    if isinstance(X, PropertyMatrix):
        X, mapping = X.features, X.feature_groups
    if isinstance(X, pd.DataFrame):
        names = [str(c) for c in X.columns]
        out: dict[str, list[int]] = {}
        for j, name in enumerate(names):
            out.setdefault(str(mapping.get(name, name)), []).append(j)
        return out
    return {f"x{j}": [j] for j in range(n_columns)}


def _permutation_importance(fitted: list[Any], X: np.ndarray, y: np.ndarray, folds: np.ndarray,
                            feature_groups: dict[str, list[int]], n_classes: int, n_repeats: int,
                            random_state: int) -> pd.DataFrame:
    """Drop of the pool's out-of-fold balanced accuracy when one property is
    permuted among the held-out rows of each fold (each fold's own model)."""
    rng = np.random.default_rng(random_state)
    names = list(feature_groups)
    base_pred = np.empty(len(y), dtype=np.int64)
    permuted = np.empty((len(names), n_repeats, len(y)), dtype=np.int64)
    for k, estimator in enumerate(fitted):
        held = np.flatnonzero(folds == k)
        Xk = X[held]
        base_pred[held] = np.argmax(class_proba(estimator, Xk, n_classes), axis=1)
        # stack many permuted copies and predict once per batch (a forest's per-call overhead dominates)
        per_batch = max(1, 200_000 // max(1, len(held)))
        jobs = [(j, r) for j in range(len(names)) for r in range(n_repeats)]
        for start in range(0, len(jobs), per_batch):
            batch = jobs[start:start + per_batch]
            blocks = []
            for j, _ in batch:
                block = Xk.copy()
                cols = feature_groups[names[j]]
                block[:, cols] = Xk[rng.permutation(len(held))][:, cols]
                blocks.append(block)
            pred = np.argmax(class_proba(estimator, np.vstack(blocks), n_classes), axis=1).reshape(len(batch), len(held))
            for (j, r), p in zip(batch, pred):
                permuted[j, r, held] = p
    base = _balanced_accuracy(y, base_pred)
    drops = np.array([[base - _balanced_accuracy(y, permuted[j, r]) for r in range(n_repeats)]
                      for j in range(len(names))])
    return pd.DataFrame({
        "feature": names,
        "importance_mean": drops.mean(axis=1),
        "importance_std": drops.std(axis=1, ddof=1) if n_repeats > 1 else np.zeros(len(names)),
    })


def _alone_scores(model: Any, X: np.ndarray, y: np.ndarray, folds: np.ndarray,
                  feature_groups: dict[str, list[int]], n_classes: int, random_state: int) -> list[float]:
    """Out-of-fold balanced accuracy of the model given one property's columns only."""
    out = []
    for cols in feature_groups.values():
        Xj = X[:, cols]
        if np.ptp(Xj, axis=0).max() == 0:
            out.append(float("nan"))
            continue
        proba, _ = out_of_fold_proba(model, Xj, y, folds, n_classes, random_state)
        out.append(_balanced_accuracy(y, np.argmax(proba, axis=1)))
    return out


def shortcut_audit(
    properties_X: Any,
    labels: Any,
    split: Any,
    *,
    groups: Any,
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
    n_splits: int = 5,
    n_resamples: int = 1000,
    n_repeats: int = 10,
    n_permutations: int = 0,
    confidence: float = 0.95,
    random_state: int = 0,
    model: Any = "logistic",
) -> ShortcutAuditResult:
    """Do file properties alone predict the label, in the pool and on the test split?

    Two numbers: the pool's balanced accuracy from patient-grouped
    cross-validation (out-of-fold predictions), and the test split's balanced
    accuracy from a model refitted on the whole pool. Both intervals come
    from a patient-grouped bootstrap. Pool high and test at chance is the
    pattern of a shortcut confined to the training pool (paper, Kermany:
    0.992 pool, 0.496 test).

    Permutation importances are computed **within the pool, out of fold**:
    for each fold, the columns of one property (all one-hot columns of
    ``format``, say; see ``feature_groups`` of the :class:`PropertyMatrix`
    from :func:`property_matrix`) are permuted among that fold's held-out rows and
    predicted by that fold's model; the importance is the drop of the pool's
    out-of-fold balanced accuracy, averaged over ``n_repeats`` permutations
    (std across them). They say what the pool classifier relies on, on rows
    it did not see, without touching the test split. Properties that carry
    the same information (``format``, ``mode``, ``bit_depth``) share it, so
    each can look unimportant when permuted alone; the ``alone`` column
    therefore adds the pool's out-of-fold balanced accuracy of the same kind
    of classifier given that property only (same folds), which shows every
    property that separates the classes by itself.

    Parameters
    ----------
    properties_X : PropertyMatrix, DataFrame or array-like of shape (n_rows, n_features)
        File-property design matrix (:func:`property_matrix`), whose
        ``feature_groups`` make a property's columns one feature for the
        importances; a DataFrame keeps feature names (one feature per
        column); an array's columns are named ``x0``, ``x1``, ...
    labels : array-like of shape (n_rows,)
        Class per row (two or more classes; no NaN).
    split : array-like of shape (n_rows,)
        Split name per row.
    groups : array-like of shape (n_rows,)
        Patient id per row.
    pool, test, n_splits, n_resamples, confidence, random_state
        As in :func:`crslib.audit.partition_audit`.
    n_repeats : int
        Permutations per property for the importances.
    n_permutations : int
        When > 0, permutation tests (one-sided, ``p_value``): in the pool the
        labels are shuffled between whole patients and the cross-validation
        rerun (``n_permutations * n_splits`` fits); on the test split the
        test labels are shuffled between patients against the fixed
        predictions of the pool fit (no refit). Below
        :data:`MIN_PERMUTATIONS` no p-value can fall below :data:`ALPHA`,
        and ``evidence`` says ``"too few permutations"``.
    model : {"logistic", "forest"} or estimator
        Classifier, as in :func:`crslib.audit.partition_audit` (default: regularised
        logistic regression with balanced class weights, whose intervals hold
        their coverage; see the Notes there).

    Returns
    -------
    ShortcutAuditResult

    Raises
    ------
    DataError
        No row is in the test split, or none in the pool.
    InputError
        Misaligned lengths, NaN, a single class in the pool or the test
        split, a test class never seen in the pool, a bad option.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> split = np.where(np.arange(400) % 4 == 0, "test", "train")
    >>> y = rng.integers(0, 2, 400)
    >>> X = np.where(split == "train", y, rng.integers(0, 2, 400))[:, None] + 0.0
    >>> res = shortcut_audit(X, y, split, groups=np.arange(400), n_resamples=100, n_repeats=2)
    >>> res.pool_balanced_accuracy > 0.95, abs(res.test_balanced_accuracy - 0.5) < 0.15
    (True, True)
    """
    Xa = as_feature_matrix(_design(properties_X), "properties_X")
    n = Xa.shape[0]
    label_arr = as_row_values(labels, n, "labels", "the class of each row")
    split_arr = as_row_values(split, n, "split", "the split name of each row")
    group_arr = as_row_values(groups, n, "groups", "patient ids (groups=manifest['patient_id'])")
    pool_t, test = check_pool_and_test(pool, test)
    n_splits = check_count(n_splits, "n_splits", 2)
    n_resamples = check_count(n_resamples, "n_resamples", 1)
    n_repeats = check_count(n_repeats, "n_repeats", 1)
    n_permutations = check_count(n_permutations, "n_permutations", 0)
    model_name = classifier_name(model)
    make_classifier(model, random_state)
    in_pool, in_test = pool_test_masks(split_arr, pool_t, test)
    classes, codes = class_codes(label_arr)
    g = np.array([str(v) for v in group_arr], dtype=object)
    for name, mask in ((f"the pool {list(pool_t)}", in_pool), (f"the {test!r} split", in_test)):
        present = sorted(set(codes[mask].tolist()))
        if len(present) < 2:
            raise InputError(
                f"{name} holds a single class ({classes[present[0]]!r}); balanced accuracy needs at least "
                "two classes in both the pool and the test split"
            )
    unseen = sorted(set(codes[in_test].tolist()) - set(codes[in_pool].tolist()))
    if unseen:
        raise InputError(
            f"class(es) {[classes[u] for u in unseen]} occur in the {test!r} split but never in the pool; "
            "a classifier fitted on the pool cannot predict them"
        )
    n_classes = len(classes)
    Xp, yp, gp = Xa[in_pool], codes[in_pool], g[in_pool]
    Xt, yt, gt = Xa[in_test], codes[in_test], g[in_test]

    # hundreds of small fits: one BLAS thread is about twice as fast as two here
    with one_blas_thread():
        folds_p = grouped_folds(yp, gp, n_splits, random_state, "shortcut audit (pool)")
        proba, fitted = out_of_fold_proba(model, Xp, yp, folds_p, n_classes, random_state)
        pool_pred = np.argmax(proba, axis=1)
        final = fit_classifier(model, Xp, yp, random_state)
        test_pred = np.argmax(class_proba(final, Xt, n_classes), axis=1)

        rows = []
        for scope, yy, pp, gg in (("pool", yp, pool_pred, gp), ("test", yt, test_pred, gt)):
            ci = bootstrap_ci(_balanced_accuracy, yy, pp, groups=gg, n_resamples=n_resamples,
                              confidence=confidence, random_state=random_state)
            rows.append({"scope": scope, "balanced_accuracy": float(ci.estimate), "low": float(ci.low),
                         "high": float(ci.high), **permutation_summary(float("nan"), []),
                         "chance": 1.0 / n_classes, "n_images": len(yy), "n_patients": len(set(gg.tolist()))})
        null = np.full((n_permutations, 2), np.nan)
        if n_permutations:
            rng = np.random.default_rng(random_state)
            permute_pool, permute_test = group_permuter(gp), group_permuter(gt)
            for b in range(n_permutations):
                y_b = permute_pool(yp, rng)
                folds_b = grouped_folds(y_b, gp, n_splits, random_state + 1 + b, "shortcut audit (permutation)")
                proba_b = out_of_fold_proba(model, Xp, y_b, folds_b, n_classes, random_state)[0]
                null[b, 0] = _balanced_accuracy(y_b, np.argmax(proba_b, axis=1))
                null[b, 1] = _balanced_accuracy(permute_test(yt, rng), test_pred)
            for j, row in enumerate(rows):
                row.update(permutation_summary(row["balanced_accuracy"], null[:, j], confidence=confidence))
        table = pd.DataFrame(rows)
        feature_groups = _feature_groups(properties_X, Xa.shape[1])
        importances = _permutation_importance(fitted, Xp, yp, folds_p, feature_groups, n_classes, n_repeats,
                                              random_state)
        importances["alone"] = _alone_scores(model, Xp, yp, folds_p, feature_groups, n_classes, random_state)
    importances = importances.sort_values(["importance_mean", "alone", "feature"], ascending=[False, False, True],
                                          kind="stable", na_position="last").reset_index(drop=True)
    folds = np.full(n, -1, dtype=np.int64)
    folds[in_pool] = folds_p
    return ShortcutAuditResult(
        table=table, importances=importances, classes=list(classes),
        pool_predictions=np.array([classes[c] for c in pool_pred], dtype=object),
        test_predictions=np.array([classes[c] for c in test_pred], dtype=object),
        folds=folds, model=model_name, n_splits=n_splits, n_repeats=n_repeats, confidence=float(confidence),
        n_permutations=n_permutations, null=null,
    )
