"""Protocol audit: split provenance, partition (adversarial validation) and
file-property shortcut classifiers.

Study 2 asks two questions of a data set's official split before any model
is trained on it:

1. **Can the official test split be told apart from the training pool?** A
   *partition classifier* is trained to predict, for each image, whether it
   belongs to the test split or to the pool (train + val). With patient-grouped
   cross-validation its out-of-fold AUC is 0.5 when the two are exchangeable and
   rises towards 1 when the test split comes from a different acquisition batch,
   site mix or archive. On Kermany the paper reports 0.697 overall and 0.898
   among normal images.
2. **Do file properties predict the label?** A *shortcut classifier* sees only
   file properties (size, dimensions, container, bit depth, JPEG settings,
   metadata; :func:`crslib.data.file_properties`) and predicts the label. High
   balanced accuracy in the pool but chance on the test split means the
   archive's file encoding is coupled with the label in the pool only: a
   shortcut a model can learn and the test split does not reward. The paper
   reports 0.992 in the pool and 0.496 on the test split.

Everything here is pure: DataFrames and arrays in, result objects out; no file
is read (compute file properties with :func:`crslib.data.file_properties` and
embeddings with :mod:`crslib.embed` first). Cross-validation is grouped by
patient (:class:`sklearn.model_selection.StratifiedGroupKFold`) and every
confidence interval is a patient-grouped percentile bootstrap
(:func:`crslib.stats.bootstrap_ci`). :func:`render_audit_html` writes a
self-contained HTML report.
"""

from __future__ import annotations

import html
import json
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from crslib._compat import one_blas_thread
from crslib._io import json_ready
from crslib.errors import DataError, InputError
from crslib.stats import auroc, bootstrap_ci

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PERMUTATIONS",
    "EMBEDDING_PERMUTATION_LIMIT",
    "PAPER_NUMBERS",
    "AuditResult",
    "PartitionAuditResult",
    "ShortcutAuditResult",
    "partition_audit",
    "property_matrix",
    "render_audit_html",
    "run_audit",
    "shortcut_audit",
    "split_provenance",
]

#: The numbers study 2 reports on the Kermany pediatric chest X-ray data (quoted
#: in reports as the paper's numbers, never as this data's).
PAPER_NUMBERS: dict[str, float] = {
    "partition_auc": 0.697,
    "partition_auc_normal": 0.898,
    "shortcut_pool": 0.992,
    "shortcut_test": 0.496,
}

#: Columns :func:`property_matrix` drops by default: identifiers, and the split
#: and label should a merged manifest be passed by mistake.
DEFAULT_EXCLUDE = ("image_id", "path", "patient_id", "split", "label")
#: Columns holding ``|``-joined sets (one indicator per member).
MULTI_VALUED = ("png_chunks", "png_text_keys")
#: Value written where a property is missing (next to a ``<name>_missing`` indicator).
MISSING_SENTINEL = -1.0
#: Permutations :func:`run_audit` runs by default.
DEFAULT_PERMUTATIONS = 100
#: Largest embedding matrix (rows x dimensions) :func:`run_audit` runs a
#: permutation test on by default (each needs ``n_splits`` refits).
EMBEDDING_PERMUTATION_LIMIT = 1_000_000
# Widest input the built-in logistic model fits with Newton-Cholesky rather than lbfgs.
_NEWTON_MAX_FEATURES = 1024


# --------------------------------------------------------------------------- results


@dataclass
class PartitionAuditResult:
    """Adversarial validation: how well the official test split can be told
    from the training pool.

    Attributes
    ----------
    table : DataFrame
        One row per scope: ``scope`` (``"all"`` or ``"class=<c>"``), ``auc``,
        ``low``, ``high`` (percentile bootstrap CI, patients resampled),
        ``p_value`` (permutation test; NaN without one), ``n_pool``,
        ``n_test`` (images), ``n_pool_patients``, ``n_test_patients``.
    scores : ndarray of shape (n_rows,)
        Out-of-fold probability that a row is in the test split (NaN for rows
        in neither the pool nor the test split).
    folds : ndarray of shape (n_rows,)
        Cross-validation fold of each row (-1 for rows left out). All rows of
        a patient share a fold.
    is_test : ndarray of bool, shape (n_rows,)
    used : ndarray of bool, shape (n_rows,)
        Rows in the pool or the test split.
    model : str
    n_splits : int
    shared_patients : list of str
        Patients with images in both the pool and the test split (a leak; the
        CV keeps each in one fold).
    confidence : float
    n_permutations : int
    null : ndarray of shape (n_permutations, n_scopes)
        AUCs with the test/pool assignment shuffled between patients (the
        ``p_value`` column compares each scope with its column).
    """

    table: pd.DataFrame
    scores: np.ndarray = field(repr=False)
    folds: np.ndarray = field(repr=False)
    is_test: np.ndarray = field(repr=False)
    used: np.ndarray = field(repr=False)
    model: str = "logistic"
    n_splits: int = 5
    shared_patients: list[str] = field(default_factory=list)
    confidence: float = 0.95
    n_permutations: int = 0
    null: np.ndarray = field(default_factory=lambda: np.empty((0, 0)), repr=False)

    @property
    def auc(self) -> float:
        """Overall out-of-fold AUC."""
        return float(self.table.loc[self.table["scope"] == "all", "auc"].iloc[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (floats rounded to 4 digits, NaN as None)."""
        return json_ready(digits=4, obj={
            "model": self.model,
            "n_splits": self.n_splits,
            "confidence": self.confidence,
            "n_permutations": self.n_permutations,
            "n_excluded": int((~self.used).sum()),
            "n_shared_patients": len(self.shared_patients),
            "shared_patients": self.shared_patients[:20],
            "table": self.table.to_dict(orient="records"),
        })


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
        cross-validated number, see :func:`partition_audit`), ``p_value``
        (permutation test, NaN without one), ``chance`` (1 / number of
        classes), ``n_images``, ``n_patients``.
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
        """JSON-ready summary (the ``top`` most important properties)."""
        return json_ready(digits=4, obj={
            "model": self.model,
            "n_splits": self.n_splits,
            "n_repeats": self.n_repeats,
            "n_permutations": self.n_permutations,
            "confidence": self.confidence,
            "classes": [str(c) for c in self.classes],
            "table": self.table.to_dict(orient="records"),
            "importances": self.importances.head(top).to_dict(orient="records"),
        })


@dataclass
class AuditResult:
    """Everything :func:`run_audit` found; render with :func:`render_audit_html`.

    Attributes
    ----------
    n_images : int
    label_column : str
    pool : tuple of str
    test : str
    provenance : dict
        From :func:`split_provenance`.
    partition_properties : PartitionAuditResult
        Partition classifier on file properties.
    shortcut : ShortcutAuditResult
        File properties -> label.
    partition_embeddings : PartitionAuditResult or None
        Partition classifier on embeddings, when given.
    embedding_name : str or None
    property_columns : list of str
        Columns of the property design matrix.
    notes : list of str
        Caveats found while auditing (e.g. no patient ids).
    """

    n_images: int
    label_column: str
    pool: tuple[str, ...]
    test: str
    provenance: dict[str, Any]
    partition_properties: PartitionAuditResult
    shortcut: ShortcutAuditResult
    partition_embeddings: PartitionAuditResult | None = None
    embedding_name: str | None = None
    property_columns: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (floats rounded to 4 digits, NaN as None)."""
        return json_ready(digits=4, obj={
            "n_images": self.n_images,
            "label_column": self.label_column,
            "pool": list(self.pool),
            "test": self.test,
            "provenance": self.provenance,
            "partition_properties": self.partition_properties.to_dict(),
            "partition_embeddings": (self.partition_embeddings.to_dict()
                                     if self.partition_embeddings is not None else None),
            "embedding_name": self.embedding_name,
            "shortcut": self.shortcut.to_dict(),
            "property_columns": self.property_columns,
            "notes": self.notes,
            "paper": PAPER_NUMBERS,
        })

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


# --------------------------------------------------------------------------- design matrix


def _is_missing(value: Any) -> bool:
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def property_matrix(
    properties: pd.DataFrame,
    *,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    multi_valued: Sequence[str] = MULTI_VALUED,
    max_categories: int = 50,
) -> pd.DataFrame:
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
    DataFrame of float
        Same index as ``properties``. ``attrs["feature_groups"]`` maps each
        output column to the property it came from (used to permute a
        property's columns together in :func:`shortcut_audit`).

    Raises
    ------
    InputError
        ``properties`` is not a DataFrame, or no column varies.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> props = pd.DataFrame({"image_id": ["a", "b", "c"], "format": ["PNG", "JPEG", "PNG"],
    ...                       "jpeg_quality": [np.nan, 90.0, np.nan], "has_exif": [False, True, False]})
    >>> X = property_matrix(props)
    >>> list(X.columns)
    ['format=JPEG', 'format=PNG', 'jpeg_quality', 'jpeg_quality_missing', 'has_exif']
    >>> X["jpeg_quality"].tolist()
    [-1.0, 90.0, -1.0]
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
        missing = series.map(_is_missing).to_numpy(dtype=bool) if series.dtype == object else series.isna().to_numpy()
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
    frame = frame[varying]
    frame.attrs["feature_groups"] = {c: groups[c] for c in varying}
    return frame


# --------------------------------------------------------------------------- validation


def _as_matrix(X: Any, name: str) -> np.ndarray:
    if isinstance(X, pd.DataFrame):
        non_numeric = [str(c) for c in X.columns if not pd.api.types.is_numeric_dtype(X[c].dtype)]
        if non_numeric:
            raise InputError(
                f"{name} has non-numeric columns {non_numeric[:5]}; encode file properties with "
                "property_matrix() first"
            )
        X = X.to_numpy(dtype=float)
    try:
        X = np.asarray(X, dtype=float)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be a numeric array (rows = images), got {exc}") from None
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise InputError(f"{name} must be 2-D (images x features), got shape {X.shape}")
    if X.shape[1] == 0:
        raise InputError(f"{name} has no columns")
    bad = ~np.isfinite(X).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{name} has NaN or infinite values in {bad.sum()} row(s) (first: {rows[:5].tolist()}); "
            "fill them (property_matrix() does for file properties) or drop those images"
        )
    return X


def _as_vector(values: Any, n: int, name: str, what: str) -> np.ndarray:
    if values is None:
        raise InputError(f"{name} is required: pass {what}")
    if isinstance(values, (pd.Series, pd.Index)):
        values = values.to_numpy()
    arr = np.asarray(values, dtype=object)
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-D with one value per row, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise InputError(f"{name} has {arr.shape[0]} values but X has {n} rows; pass one value per row, aligned with X")
    missing = np.array([_is_missing(v) for v in arr], dtype=bool)
    if missing.any():
        raise InputError(
            f"{name} is missing (NaN/None) in {missing.sum()} row(s) (first: {np.flatnonzero(missing)[:5].tolist()}); "
            "fill them in or drop those rows"
        )
    return arr


def _pool_tuple(pool: Any, test: Any) -> tuple[tuple[str, ...], str]:
    pool_t = (pool,) if isinstance(pool, str) else tuple(pool)
    if not pool_t or not all(isinstance(p, str) for p in pool_t):
        raise InputError(f"pool must be a split name or a sequence of split names, got {pool!r}")
    if not isinstance(test, str):
        raise InputError(f"test must be a split name, got {test!r}")
    if test in pool_t:
        raise InputError(f"the test split {test!r} is also in pool={pool_t}; the pool must exclude it")
    return pool_t, test


def _split_masks(split: np.ndarray, pool: tuple[str, ...], test: str) -> tuple[np.ndarray, np.ndarray]:
    text = np.array([str(s) for s in split], dtype=object)
    in_test = text == test
    in_pool = np.isin(text, list(pool))
    present = sorted(set(text.tolist()))
    if not in_test.any():
        raise DataError(
            f"no row has split == {test!r} (splits present: {present}): the audit compares the official "
            f"test split with the training pool. Mark the official test images with split='{test}' "
            "(e.g. the test/ folder of a Kermany-style layout), or pass test=<name> if it is named differently"
        )
    if not in_pool.any():
        raise DataError(
            f"no row is in the training pool {list(pool)} (splits present: {present}); mark training images "
            "with split='train' (and 'val'), or pass pool=<names>"
        )
    return in_pool, in_test


def _check_count(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _codes(values: np.ndarray) -> tuple[list[Any], np.ndarray]:
    text = np.array([str(v) for v in values], dtype=object)
    keys, first = np.unique(text, return_index=True)
    classes = [values[i] for i in first]
    order = sorted(range(len(keys)), key=lambda i: _sort_key(classes[i]))
    classes = [classes[i] for i in order]
    lookup = {str(c): k for k, c in enumerate(classes)}
    return classes, np.array([lookup[t] for t in text], dtype=np.int64)


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (0, float(value))
    return (1, str(value))


# --------------------------------------------------------------------------- models and CV


def _make_model(model: Any, random_state: int, n_features: int = 0):
    from sklearn.base import clone

    if isinstance(model, str):
        if model == "logistic":
            from sklearn.linear_model import LogisticRegression
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler

            # Same objective either way. Newton converges in 4-8 steps of cost n*d^2; lbfgs needs 100-170
            # steps on shuffled labels (the permutation tests). On 1,560 x d phantom embeddings, 2 cores:
            # d = 512 0.2 s vs 1.5 s, d = 1,024 0.65 s vs 1.2 s; above that lbfgs catches up.
            solver = "newton-cholesky" if 0 < n_features <= _NEWTON_MAX_FEATURES else "lbfgs"
            return make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000, class_weight="balanced",
                                                                      solver=solver))
        if model == "forest":
            from sklearn.ensemble import RandomForestClassifier

            return RandomForestClassifier(n_estimators=200, min_samples_leaf=2, class_weight="balanced",
                                          random_state=random_state, n_jobs=1)
        raise InputError(f"model must be 'logistic', 'forest' or a scikit-learn classifier, got {model!r}")
    if not (hasattr(model, "fit") and hasattr(model, "predict_proba")):
        raise InputError(
            f"model must be 'logistic', 'forest' or a scikit-learn classifier with predict_proba, got {type(model).__name__}"
        )
    return clone(model)


def _model_name(model: Any) -> str:
    return model if isinstance(model, str) else type(model).__name__


def _stratified_group_kfold(y: np.ndarray, groups: np.ndarray, n_splits: int, random_state: int) -> np.ndarray:
    """Fold per row, as ``StratifiedGroupKFold(n_splits, shuffle=True,
    random_state=random_state)`` assigns them (same algorithm, same random
    draws), with the candidate folds of each group scored at once instead of
    in a Python loop: the permutation tests call it hundreds of times."""
    _, y_inv, y_cnt = np.unique(y, return_inverse=True, return_counts=True)
    _, groups_inv, groups_cnt = np.unique(groups, return_inverse=True, return_counts=True)
    y_inv, groups_inv = y_inv.ravel(), groups_inv.ravel()
    n_groups, n_classes = len(groups_cnt), len(y_cnt)
    counts_per_group = np.zeros((n_groups, n_classes))
    np.add.at(counts_per_group, (groups_inv, y_inv), 1)
    rng = np.random.RandomState(random_state)
    perm = np.arange(n_groups)
    rng.shuffle(perm)
    counts_per_group = counts_per_group[perm]
    inv_perm = np.empty_like(perm)
    inv_perm[perm] = np.arange(perm.size)
    groups_inv = inv_perm[groups_inv]
    order = np.argsort(-np.std(counts_per_group, axis=1), kind="stable")
    counts_per_fold = np.zeros((n_splits, n_classes))
    eye = np.eye(n_splits)[:, :, None]
    fold_of_group = np.empty(n_groups, dtype=np.int64)
    for g in order:
        group_counts = counts_per_group[g]
        candidates = counts_per_fold[None, :, :] + eye * group_counts[None, None, :]
        evals = np.std(candidates / y_cnt[None, None, :], axis=1).mean(axis=1).tolist()
        sizes = counts_per_fold.sum(axis=1).tolist()
        best, min_eval, min_size = 0, math.inf, math.inf
        for i in range(n_splits):  # sklearn's rule: lowest spread, near-ties to the smaller fold
            close = min_eval != math.inf and abs(evals[i] - min_eval) <= 1e-8 + 1e-5 * abs(min_eval)
            if evals[i] < min_eval or (close and sizes[i] < min_size):
                best, min_eval, min_size = i, evals[i], sizes[i]
        counts_per_fold[best] += group_counts
        fold_of_group[g] = best
    return fold_of_group[groups_inv]


def _grouped_folds(y: np.ndarray, groups: np.ndarray, n_splits: int, random_state: int, what: str) -> np.ndarray:
    """Fold per row (scikit-learn's StratifiedGroupKFold assignment, shuffled
    with ``random_state``): all rows of a group share a fold."""
    group_text = np.array([str(g) for g in groups], dtype=object)
    for c in np.unique(y):
        n_groups = len(set(group_text[y == c].tolist()))
        if n_groups < n_splits:
            raise InputError(
                f"{what}: class {c!r} has only {n_groups} patient(s), fewer than n_splits={n_splits}; "
                f"pass a smaller n_splits (at least 2) or audit more images"
            )
    folds = _stratified_group_kfold(np.asarray(y), group_text, n_splits, random_state)
    for k in range(n_splits):
        train = folds != k
        if len(np.unique(y[train])) < len(np.unique(y)):
            raise InputError(
                f"{what}: fold {k} leaves a class out of its training rows (too few patients per class); "
                "pass a smaller n_splits"
            )
    return folds


def _fit(model: Any, X: np.ndarray, y: np.ndarray, random_state: int):
    from sklearn.exceptions import ConvergenceWarning

    estimator = _make_model(model, random_state, X.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator.fit(X, y)
    return estimator


def _proba(estimator: Any, X: np.ndarray, n_classes: int) -> np.ndarray:
    """Class probabilities with one column per class code 0..n_classes-1."""
    raw = estimator.predict_proba(X)
    out = np.zeros((X.shape[0], n_classes))
    out[:, np.asarray(estimator.classes_, dtype=np.int64)] = raw
    return out


def _oof(model: Any, X: np.ndarray, y: np.ndarray, folds: np.ndarray, n_classes: int, random_state: int):
    proba = np.full((len(y), n_classes), np.nan)
    fitted = []
    for k in range(int(folds.max()) + 1):
        held = folds == k
        estimator = _fit(model, X[~held], y[~held], random_state)
        proba[held] = _proba(estimator, X[held], n_classes)
        fitted.append(estimator)
    return proba, fitted


def _group_permuter(groups: np.ndarray):
    """A function ``permute(values, rng)`` that moves whole groups' value
    sequences between groups of the same size (rows of one patient move
    together, so the permutation respects the patient structure)."""
    _, inverse = np.unique(np.array([str(g) for g in groups], dtype=object), return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    by_size = [np.flatnonzero(sizes == size) for size in np.unique(sizes)]

    def permute(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = values.copy()
        for members in by_size:
            shuffled = rng.permutation(members)
            for offset in range(int(sizes[members[0]])):
                out[order[starts[members] + offset]] = values[order[starts[shuffled] + offset]]
        return out

    return permute


def _p_value(observed: float, null: np.ndarray) -> float:
    """One-sided permutation p-value, (1 + #{null >= observed}) / (1 + #valid)."""
    valid = null[np.isfinite(null)]
    if not math.isfinite(observed) or valid.size == 0:
        return float("nan")
    return float((1 + np.sum(valid >= observed - 1e-12)) / (1 + valid.size))


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


# --------------------------------------------------------------------------- partition audit


def partition_audit(
    X: Any,
    split: Any,
    *,
    groups: Any,
    labels: Any = None,
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
    n_splits: int = 5,
    n_resamples: int = 1000,
    n_permutations: int = 0,
    confidence: float = 0.95,
    random_state: int = 0,
    model: Any = "logistic",
) -> PartitionAuditResult:
    """Adversarial validation: can a classifier tell the test split from the pool?

    The target is 1 for rows in the official ``test`` split and 0 for rows in
    the ``pool`` (train + val); rows of other splits are left out. Out-of-fold
    probabilities come from patient-grouped, stratified K-fold
    cross-validation (:class:`~sklearn.model_selection.StratifiedGroupKFold`:
    no patient in two folds), the AUC from :func:`crslib.stats.auroc` and its
    interval from a bootstrap that resamples patients
    (:func:`crslib.stats.bootstrap_ci` with ``groups``). With ``labels`` the
    AUC is also computed among the rows of each class separately (same
    out-of-fold scores): Kermany's split is far easier to spot among normal
    images (0.898 in the paper) than overall (0.697).

    Parameters
    ----------
    X : array-like of shape (n_rows, n_features)
        Embeddings, or a property design matrix (:func:`property_matrix`).
        No NaN.
    split : array-like of shape (n_rows,)
        Split name per row.
    groups : array-like of shape (n_rows,)
        Patient id per row (required; pass image ids only if every image is
        a different patient).
    labels : array-like of shape (n_rows,), optional
        Class per row, for the per-class AUCs.
    pool : str or sequence of str
        Splits forming the training pool.
    test : str
        The official test split.
    n_splits : int
        Cross-validation folds (each class needs at least this many patients).
    n_resamples : int
        Bootstrap resamples for the intervals.
    n_permutations : int
        When > 0, a permutation test: the test/pool assignment is shuffled
        between whole patients (among patients with the same number of
        images) and the whole cross-validation rerun, ``n_permutations``
        times; ``p_value`` is the share of shuffles with an AUC at least as
        high (one-sided). Costs ``n_permutations * n_splits`` model fits.
    confidence : float
        Interval coverage.
    random_state : int
        Seed of the folds, the model, the bootstrap and the permutations.
    model : {"logistic", "forest"} or estimator
        ``"logistic"`` (default): standardisation + L2 logistic regression
        (C=0.1, balanced class weights), for embeddings and file properties;
        ``"forest"``: a random forest (200 trees, leaves of at least 2 rows,
        balanced class weights), which also finds interactions; or any
        scikit-learn classifier with ``predict_proba`` (cloned per fold).
        See Notes on why logistic is the default.

    Returns
    -------
    PartitionAuditResult

    Notes
    -----
    The interval resamples patients with the out-of-fold scores held fixed,
    so it leaves out the variability of fitting the classifiers: it is too
    narrow. With no difference between the splits, 95% intervals covered
    0.5 in 47 of 60 synthetic data sets (400 images, 8 random features,
    logistic), in 19 of 20 phantom data sets for file properties with
    logistic regression and in only 15 of 20 with the random forest. Use
    the permutation test (``n_permutations``) to decide whether the splits
    differ at all; it is exact under the null. The interval then describes
    the size of a difference, optimistically.

    Raises
    ------
    DataError
        No row is in the test split, or none in the pool.
    InputError
        Misaligned lengths, NaN in ``X``, ``labels`` or ``groups``, a bad
        option, or too few patients for ``n_splits``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> split = np.where(np.arange(300) % 4 == 0, "test", "train")
    >>> X = rng.normal(size=(300, 3)) + (split == "test")[:, None] * 2.0
    >>> res = partition_audit(X, split, groups=np.arange(300), n_resamples=100)
    >>> res.auc > 0.9, list(res.table.columns[:4])
    (True, ['scope', 'auc', 'low', 'high'])
    """
    X = _as_matrix(X, "X")
    n = X.shape[0]
    split_arr = _as_vector(split, n, "split", "the split name of each row")
    group_arr = _as_vector(groups, n, "groups", "patient ids (groups=manifest['patient_id'])")
    label_arr = _as_vector(labels, n, "labels", "the class of each row") if labels is not None else None
    pool_t, test = _pool_tuple(pool, test)
    n_splits = _check_count(n_splits, "n_splits", 2)
    n_resamples = _check_count(n_resamples, "n_resamples", 1)
    n_permutations = _check_count(n_permutations, "n_permutations", 0)
    model_name = _model_name(model)
    _make_model(model, random_state)  # validate before any work
    in_pool, in_test = _split_masks(split_arr, pool_t, test)
    used = in_pool | in_test
    if (~used).any():
        logger.info("partition audit: %d row(s) in neither the pool %s nor %r are left out",
                    int((~used).sum()), list(pool_t), test)
    Xu = X[used]
    y = in_test[used].astype(np.int64)
    g = np.array([str(v) for v in group_arr[used]], dtype=object)
    shared = sorted(set(g[y == 1].tolist()) & set(g[y == 0].tolist()))
    if shared:
        logger.warning("%d patient(s) have images in both the pool and the %r split (first: %s)",
                       len(shared), test, shared[:3])
    # hundreds of small fits: one BLAS thread is about twice as fast as two here
    with one_blas_thread():
        folds_u = _grouped_folds(y, g, n_splits, random_state, "partition audit")
        proba, _ = _oof(model, Xu, y, folds_u, 2, random_state)
        score = proba[:, 1]

        rows = []

        def scope_row(scope: str, mask: np.ndarray) -> dict[str, Any]:
            yy, ss, gg = y[mask], score[mask], g[mask]
            n_pool, n_test = int((yy == 0).sum()), int((yy == 1).sum())
            row = {"scope": scope, "auc": float("nan"), "low": float("nan"), "high": float("nan"),
                   "p_value": float("nan"), "n_pool": n_pool, "n_test": n_test,
                   "n_pool_patients": len(set(gg[yy == 0].tolist())), "n_test_patients": len(set(gg[yy == 1].tolist()))}
            if n_pool and n_test:
                ci = bootstrap_ci(auroc, yy, ss, groups=gg, n_resamples=n_resamples, confidence=confidence,
                                  random_state=random_state)
                row.update(auc=float(ci.estimate), low=float(ci.low), high=float(ci.high))
            return row

        masks = [("all", np.ones(len(y), dtype=bool))]
        if label_arr is not None:
            classes, codes = _codes(label_arr[used])
            masks += [(f"class={c}", codes == k) for k, c in enumerate(classes)]
        rows = [scope_row(scope, mask) for scope, mask in masks]
        null = np.full((n_permutations, len(masks)), np.nan)
        if n_permutations:
            permute = _group_permuter(g)
            rng = np.random.default_rng(random_state)
            for b in range(n_permutations):
                y_b = permute(y, rng)
                folds_b = _grouped_folds(y_b, g, n_splits, random_state + 1 + b, "partition audit (permutation)")
                score_b = _oof(model, Xu, y_b, folds_b, 2, random_state)[0][:, 1]
                null[b] = [auroc(y_b[mask], score_b[mask]) for _, mask in masks]
            for j, row in enumerate(rows):
                row["p_value"] = _p_value(row["auc"], null[:, j])
    table = pd.DataFrame(rows, columns=["scope", "auc", "low", "high", "p_value", "n_pool", "n_test",
                                        "n_pool_patients", "n_test_patients"])
    scores = np.full(n, np.nan)
    scores[used] = score
    folds = np.full(n, -1, dtype=np.int64)
    folds[used] = folds_u
    return PartitionAuditResult(table=table, scores=scores, folds=folds, is_test=in_test, used=used,
                                model=model_name, n_splits=n_splits, shared_patients=shared,
                                confidence=float(confidence), n_permutations=n_permutations, null=null)


# --------------------------------------------------------------------------- shortcut audit


def _feature_groups(X: Any, n_columns: int) -> dict[str, list[int]]:
    """Property name -> column indices (columns of one property are permuted together)."""
    if isinstance(X, pd.DataFrame):
        names = [str(c) for c in X.columns]
        mapping = X.attrs.get("feature_groups") or {}
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
        base_pred[held] = np.argmax(_proba(estimator, Xk, n_classes), axis=1)
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
            pred = np.argmax(_proba(estimator, np.vstack(blocks), n_classes), axis=1).reshape(len(batch), len(held))
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
        proba, _ = _oof(model, Xj, y, folds, n_classes, random_state)
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
    ``format``, say; see ``attrs["feature_groups"]`` of
    :func:`property_matrix`) are permuted among that fold's held-out rows and
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
    properties_X : DataFrame or array-like of shape (n_rows, n_features)
        File-property design matrix (:func:`property_matrix`); a DataFrame
        keeps feature names.
    labels : array-like of shape (n_rows,)
        Class per row (two or more classes; no NaN).
    split : array-like of shape (n_rows,)
        Split name per row.
    groups : array-like of shape (n_rows,)
        Patient id per row.
    pool, test, n_splits, n_resamples, confidence, random_state
        As in :func:`partition_audit`.
    n_repeats : int
        Permutations per property for the importances.
    n_permutations : int
        When > 0, permutation tests (one-sided, ``p_value``): in the pool the
        labels are shuffled between whole patients and the cross-validation
        rerun (``n_permutations * n_splits`` fits); on the test split the
        test labels are shuffled between patients against the fixed
        predictions of the pool fit (no refit).
    model : {"logistic", "forest"} or estimator
        Classifier, as in :func:`partition_audit` (default: regularised
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
    Xa = _as_matrix(properties_X, "properties_X")
    n = Xa.shape[0]
    label_arr = _as_vector(labels, n, "labels", "the class of each row")
    split_arr = _as_vector(split, n, "split", "the split name of each row")
    group_arr = _as_vector(groups, n, "groups", "patient ids (groups=manifest['patient_id'])")
    pool_t, test = _pool_tuple(pool, test)
    n_splits = _check_count(n_splits, "n_splits", 2)
    n_resamples = _check_count(n_resamples, "n_resamples", 1)
    n_repeats = _check_count(n_repeats, "n_repeats", 1)
    n_permutations = _check_count(n_permutations, "n_permutations", 0)
    model_name = _model_name(model)
    _make_model(model, random_state)
    in_pool, in_test = _split_masks(split_arr, pool_t, test)
    classes, codes = _codes(label_arr)
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
        folds_p = _grouped_folds(yp, gp, n_splits, random_state, "shortcut audit (pool)")
        proba, fitted = _oof(model, Xp, yp, folds_p, n_classes, random_state)
        pool_pred = np.argmax(proba, axis=1)
        final = _fit(model, Xp, yp, random_state)
        test_pred = np.argmax(_proba(final, Xt, n_classes), axis=1)

        rows = []
        for scope, yy, pp, gg in (("pool", yp, pool_pred, gp), ("test", yt, test_pred, gt)):
            ci = bootstrap_ci(_balanced_accuracy, yy, pp, groups=gg, n_resamples=n_resamples,
                              confidence=confidence, random_state=random_state)
            rows.append({"scope": scope, "balanced_accuracy": float(ci.estimate), "low": float(ci.low),
                         "high": float(ci.high), "p_value": float("nan"), "chance": 1.0 / n_classes,
                         "n_images": len(yy), "n_patients": len(set(gg.tolist()))})
        null = np.full((n_permutations, 2), np.nan)
        if n_permutations:
            rng = np.random.default_rng(random_state)
            permute_pool, permute_test = _group_permuter(gp), _group_permuter(gt)
            for b in range(n_permutations):
                y_b = permute_pool(yp, rng)
                folds_b = _grouped_folds(y_b, gp, n_splits, random_state + 1 + b, "shortcut audit (permutation)")
                proba_b = _oof(model, Xp, y_b, folds_b, n_classes, random_state)[0]
                null[b, 0] = _balanced_accuracy(y_b, np.argmax(proba_b, axis=1))
                null[b, 1] = _balanced_accuracy(permute_test(yt, rng), test_pred)
            for j, row in enumerate(rows):
                row["p_value"] = _p_value(row["balanced_accuracy"], null[:, j])
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


# --------------------------------------------------------------------------- provenance and run_audit


def split_provenance(
    manifest: pd.DataFrame,
    *,
    label_column: str | None = "label",
    groups: Any = None,
) -> dict[str, Any]:
    """Facts about the splits: images, patients and classes per split, and
    patients found in more than one split.

    Parameters
    ----------
    manifest : DataFrame
        With a ``split`` column.
    label_column : str or None
        Column whose classes are counted per split (skipped when None or absent).
    groups : array-like, optional
        Patient id per row (default: the ``patient_id`` column, else ``image_id``).

    Returns
    -------
    dict
        ``splits``: list of ``{"split", "images", "patients", "classes": {class: images}}``;
        ``n_patients_in_several_splits`` and ``patients_in_several_splits``
        (the first 20, with their splits).

    Examples
    --------
    >>> import pandas as pd
    >>> m = pd.DataFrame({"image_id": list("abcd"), "patient_id": ["p1", "p1", "p2", "p3"],
    ...                   "split": ["train", "test", "train", "test"], "label": [0, 1, 0, 1]})
    >>> facts = split_provenance(m)
    >>> facts["n_patients_in_several_splits"], facts["splits"][0]["patients"]
    (1, 2)
    """
    if "split" not in manifest.columns:
        raise DataError(f"manifest has no 'split' column; columns present: {list(map(str, manifest.columns))}")
    if groups is None:
        groups = manifest["patient_id"] if "patient_id" in manifest.columns else manifest["image_id"]
    g = pd.Series(np.asarray(groups, dtype=object), index=manifest.index).astype(str)
    split = manifest["split"].astype(str)
    has_labels = label_column is not None and label_column in manifest.columns
    order = [s for s in ("train", "val", "test") if s in set(split)] + sorted(set(split) - {"train", "val", "test"})
    splits = []
    for name in order:
        mask = split == name
        entry: dict[str, Any] = {"split": name, "images": int(mask.sum()), "patients": int(g[mask].nunique())}
        if has_labels:
            counts = manifest.loc[mask, label_column].value_counts()
            entry["classes"] = {str(k): int(counts[k]) for k in sorted(counts.index, key=_sort_key)}
        splits.append(entry)
    per_patient = pd.DataFrame({"g": g, "split": split}).groupby("g")["split"].agg(lambda s: sorted(set(s)))
    several = per_patient[per_patient.map(len) > 1]
    return {
        "splits": splits,
        "n_patients": int(g.nunique()),
        "n_patients_in_several_splits": int(len(several)),
        "patients_in_several_splits": [{"patient_id": str(p), "splits": list(s)} for p, s in several.head(20).items()],
    }


def run_audit(
    manifest: pd.DataFrame,
    properties: pd.DataFrame,
    *,
    embeddings: Any = None,
    embedding_name: str | None = None,
    label_column: str = "label",
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
    n_splits: int = 5,
    n_resamples: int = 1000,
    n_repeats: int = 10,
    n_permutations: int | None = None,
    random_state: int = 0,
    model: Any = "logistic",
) -> AuditResult:
    """The study-2 audit of a data set's official split, in one call.

    Combines :func:`split_provenance`, a partition audit on file properties,
    a partition audit on embeddings (when ``embeddings`` are given) and a
    shortcut audit (file properties -> label), all with ``model`` (default:
    regularised logistic regression; see :func:`partition_audit`). Patients come from the manifest's ``patient_id``; without one,
    images are treated as independent patients and a warning is logged (and
    noted in the result), since images of one patient in different folds
    inflate every number here.

    Parameters
    ----------
    manifest : DataFrame
        With ``split``, ``label_column`` and ideally ``patient_id``.
    properties : DataFrame
        :func:`crslib.data.file_properties` of the same rows, same order.
    embeddings : array-like of shape (n_images, d), optional
        Embeddings of the same rows.
    embedding_name : str, optional
        Name of the model that made them (for the report).
    label_column : str
        The label column.
    pool, test, n_splits, n_resamples, random_state
        As in :func:`partition_audit`.
    n_repeats : int
        Permutations per property for the shortcut importances.
    n_permutations : int, optional
        Permutation tests of every audit (see :func:`partition_audit`); the
        report decides "differs from chance" by them. Each costs
        ``n_permutations * n_splits`` model fits. Default (None): 100 for
        the file-property audits, and 100 for the embeddings when they have
        at most :data:`EMBEDDING_PERMUTATION_LIMIT` values (rows x
        dimensions), else none (noted in the result; the report then falls
        back on the interval, which is too narrow). 0 turns them off.
    model : {"logistic", "forest"} or estimator
        The classifier of all three audits.

    Returns
    -------
    AuditResult

    Raises
    ------
    DataError
        The manifest has no ``split`` column or no row in the test split or
        the pool; the label column is missing, has missing values, or a split
        holds a single class; ``properties`` are not aligned with the manifest.
    InputError
        ``embeddings`` do not have one row per image or contain NaN; a bad option.

    Examples
    --------
    >>> import tempfile
    >>> from crslib.data import file_properties
    >>> from crslib.phantom import generate_phantom
    >>> m = generate_phantom(tempfile.mkdtemp(), n_patients=80, image_size=32, shortcut_strength=1.0)
    >>> result = run_audit(m, file_properties(m), n_splits=3, n_resamples=100, n_repeats=2, n_permutations=10)
    >>> result.shortcut.pool_balanced_accuracy > 0.9
    True
    >>> render_audit_html(result).startswith("<!DOCTYPE html>")
    True
    """
    if not isinstance(manifest, pd.DataFrame):
        raise DataError(f"manifest must be a pandas DataFrame, got {type(manifest).__name__}")
    if not isinstance(properties, pd.DataFrame):
        raise DataError(
            f"properties must be a DataFrame from crslib.data.file_properties(manifest), got {type(properties).__name__}"
        )
    notes: list[str] = []
    filled = manifest.attrs.get("filled_columns") or []
    if "split" not in manifest.columns or "split" in filled:
        raise DataError(
            "manifest has no 'split' column (or it was filled with 'unspecified'): the audit compares the "
            "official test split with the training pool. Add a 'split' column with train/val/test, or load a "
            "folder laid out as {train,val,test}/{CLASS}/ (e.g. Kermany's chest_xray)"
        )
    if label_column not in manifest.columns:
        raise DataError(
            f"manifest has no label column {label_column!r}; columns present: {list(map(str, manifest.columns))}. "
            "Pass label_column=<name>"
        )
    n = len(manifest)
    labels = manifest[label_column]
    if labels.isna().any():
        bad = np.flatnonzero(labels.isna().to_numpy())
        raise DataError(
            f"label column {label_column!r} is missing in {len(bad)} row(s) (first rows: {bad[:5].tolist()}); "
            "fill in the labels or drop those rows"
        )
    if len(properties) != n:
        raise DataError(
            f"properties have {len(properties)} rows but the manifest has {n}; compute them with "
            "crslib.data.file_properties(manifest) for the same manifest"
        )
    if "image_id" in properties.columns and "image_id" in manifest.columns:
        mismatch = properties["image_id"].astype(str).to_numpy() != manifest["image_id"].astype(str).to_numpy()
        if mismatch.any():
            first = int(np.flatnonzero(mismatch)[0])
            raise DataError(
                f"properties are not aligned with the manifest: row {first} has image_id "
                f"{properties['image_id'].iloc[first]!r} vs {manifest['image_id'].iloc[first]!r}; compute them with "
                "crslib.data.file_properties(manifest) and keep the row order"
            )
    pool_t, test = _pool_tuple(pool, test)
    split = manifest["split"].astype(str).to_numpy(dtype=object)
    _split_masks(split, pool_t, test)
    for name, mask in ((f"the pool {list(pool_t)}", np.isin(split, list(pool_t))), (f"the {test!r} split", split == test)):
        present = sorted(set(labels[mask].astype(str)))
        if len(present) < 2:
            raise DataError(
                f"{name} holds a single class ({present[0]!r}) in {label_column!r}; the shortcut audit needs "
                "both classes in the pool and in the test split"
            )
    if "patient_id" in manifest.columns and "patient_id" not in filled:
        groups = manifest["patient_id"].astype(str).to_numpy(dtype=object)
    else:
        ids = manifest["image_id"] if "image_id" in manifest.columns else pd.Series(np.arange(n))
        groups = ids.astype(str).to_numpy(dtype=object)
        message = ("the manifest has no patient_id: every image is treated as its own patient, so images of one "
                   "patient may sit in different CV folds and the numbers can be optimistic")
        logger.warning(message)
        notes.append(message)
    emb = None
    if embeddings is not None:
        emb = np.asarray(embeddings)
        if emb.ndim != 2 or emb.shape[0] != n:
            raise InputError(
                f"embeddings have shape {emb.shape} but the manifest has {n} rows; pass one embedding row per "
                "manifest row, in the same order"
            )
        emb = _as_matrix(emb, "embeddings")
    if "readable" in properties.columns:
        unreadable = int((~properties["readable"].astype(bool)).sum())
        if unreadable:
            notes.append(f"{unreadable} file(s) could not be read; their properties are missing (kept as rows)")
    X_props = property_matrix(properties)
    provenance = split_provenance(manifest, label_column=label_column, groups=groups)
    if provenance["n_patients_in_several_splits"]:
        notes.append(f"{provenance['n_patients_in_several_splits']} patient(s) have images in more than one split")
    if n_permutations is None:
        n_perm_props = DEFAULT_PERMUTATIONS
        n_perm_emb = DEFAULT_PERMUTATIONS if emb is None or emb.size <= EMBEDDING_PERMUTATION_LIMIT else 0
        if emb is not None and not n_perm_emb:
            notes.append(
                f"no permutation test for the embeddings ({emb.shape[0]} x {emb.shape[1]} values would need "
                f"{DEFAULT_PERMUTATIONS * n_splits} refits); pass n_permutations to run one"
            )
    else:
        n_perm_props = n_perm_emb = _check_count(n_permutations, "n_permutations", 0)
    common = dict(pool=pool_t, test=test, n_splits=n_splits, n_resamples=n_resamples, random_state=random_state,
                  model=model)
    label_values = labels.to_numpy(dtype=object)
    part_props = partition_audit(X_props, split, groups=groups, labels=label_values, n_permutations=n_perm_props,
                                 **common)
    part_emb = None
    if emb is not None:
        part_emb = partition_audit(emb, split, groups=groups, labels=label_values, n_permutations=n_perm_emb,
                                   **common)
    shortcut = shortcut_audit(X_props, label_values, split, groups=groups, n_repeats=n_repeats,
                              n_permutations=n_perm_props, **common)
    return AuditResult(
        n_images=n, label_column=label_column, pool=pool_t, test=test, provenance=provenance,
        partition_properties=part_props, shortcut=shortcut, partition_embeddings=part_emb,
        embedding_name=embedding_name if embeddings is not None else None,
        property_columns=list(X_props.columns), notes=notes,
    )


# --------------------------------------------------------------------------- HTML report

_CSS = """body{font-family:system-ui,sans-serif;max-width:62em;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
table{border-collapse:collapse;margin:.8em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.reading{background:#f7f9fc;border-left:4px solid #4a78b5;padding:.6em 1em;margin:.8em 0}
.paper{color:#555}.note{background:#fff6e0;border-left:4px solid #d9a400;padding:.5em 1em}"""


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, (float, np.floating)):
        return "n/a" if not math.isfinite(float(value)) else f"{float(value):.{digits}f}"
    return str(value)


def _html_table(frame: pd.DataFrame, digits: int = 3) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for _, row in frame.iterrows():
        cells = []
        for value in row:
            numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            cls = ' class="num"' if numeric else ""
            cells.append(f"<td{cls}>{html.escape(_fmt(value, digits))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _ci(value: float, low: float, high: float) -> str:
    return f"{_fmt(value)} (95% CI {_fmt(low)} to {_fmt(high)})"


def _evidence(low: float, p_value: float, chance: float, n_permutations: int) -> bool | None:
    """Is the number above chance? Decided by the permutation test when there
    is one, else by the (too narrow) interval. Appends nothing; see callers."""
    if n_permutations and math.isfinite(p_value):
        return p_value < 0.05
    if not math.isfinite(low):
        return None
    return low > chance


def _evidence_text(low: float, p_value: float, chance: float, n_permutations: int) -> str:
    if n_permutations and math.isfinite(p_value):
        verdict = "above chance" if p_value < 0.05 else "indistinguishable from chance"
        return (f"a permutation test ({n_permutations} shuffles of whole patients) finds it {verdict} "
                f"(p = {p_value:.3f}). ")
    if not math.isfinite(low):
        return ""
    if low > chance:
        return (f"the interval lies above {chance:.3g}, but it leaves out the variability of refitting the "
                "classifier and is too narrow, so a lower bound close to it is weak evidence (run with "
                "n_permutations for a test). ")
    return f"the interval includes {chance:.3g}. "


def _read_partition(result: PartitionAuditResult, what: str, test: str) -> str:
    row = result.table.iloc[0]
    auc, low, high = float(row["auc"]), float(row["low"]), float(row["high"])
    text = (f"A classifier given only {what} tells an image of the official {test} split from an image of the "
            f"training pool with an AUC of {_ci(auc, low, high)}, estimated out of fold with patient-grouped "
            f"cross-validation. An AUC of 0.5 means the two cannot be told apart; 1.0 means every test image "
            f"can be picked out. ")
    sentence = _evidence_text(low, float(row["p_value"]), 0.5, result.n_permutations)
    text += sentence[:1].upper() + sentence[1:]
    differs = _evidence(low, float(row["p_value"]), 0.5, result.n_permutations)
    if differs is None:
        pass
    elif differs:
        text += ("So the test split differs from the pool in these respects: a test score measures transfer to "
                 "a shifted batch as well as performance on the training distribution. ")
    else:
        text += ("So these data give no evidence that the test split differs from the pool in these respects "
                 "(which is not proof that it does not). ")
    per_class = result.table.iloc[1:]
    if len(per_class):
        parts = [f"{r['scope'].removeprefix('class=')}: {_fmt(r['auc'])}" for _, r in per_class.iterrows()]
        text += f"Within each class the AUC is {'; '.join(parts)}. "
    text += (f'<span class="paper">For comparison, the paper reports a partition AUC of '
             f"{PAPER_NUMBERS['partition_auc']:.3f} on the Kermany pediatric chest X-rays overall and "
             f"{PAPER_NUMBERS['partition_auc_normal']:.3f} among normal images (the paper's numbers, not this "
             "data's).</span>")
    return text


def _read_shortcut(result: ShortcutAuditResult, test: str) -> str:
    pool = result.table.set_index("scope").loc["pool"]
    tst = result.table.set_index("scope").loc["test"]
    chance = float(pool["chance"])
    text = (f"A classifier that sees only file properties (size, dimensions, container, bit depth, JPEG "
            f"settings, metadata), never what the image shows, predicts the label with a balanced accuracy of "
            f"{_ci(pool['balanced_accuracy'], pool['low'], pool['high'])} in the training pool (patient-grouped "
            f"cross-validation) and {_ci(tst['balanced_accuracy'], tst['low'], tst['high'])} on the official "
            f"{test} split (a model fitted on the whole pool). Chance is {chance:.3f}. ")
    text += "In the pool, " + _evidence_text(float(pool["low"]), float(pool["p_value"]), chance, result.n_permutations)
    pool_above = bool(_evidence(float(pool["low"]), float(pool["p_value"]), chance, result.n_permutations))
    text += "On the test split, " + _evidence_text(float(tst["low"]), float(tst["p_value"]), chance,
                                                   result.n_permutations)
    test_above = _evidence(float(tst["low"]), float(tst["p_value"]), chance, result.n_permutations)
    test_at_chance = not test_above
    if pool_above and test_at_chance:
        text += ("File encoding carries the label in the pool but not in the test split: a model can learn "
                 "this shortcut during training and the test split will not reveal it, nor reward it. ")
    elif pool_above:
        text += ("File encoding carries label information in the pool and, to a degree, on the test split "
                 "too; a model may use it, and the test score would partly credit that. ")
    else:
        text += "These data give no evidence that file properties carry the label in the pool. "
    imp = result.importances
    if len(imp):
        top = imp[imp["importance_mean"] > 0.005].head(3)
        if len(top):
            text += ("The properties the pool classifier relies on most (drop of out-of-fold balanced accuracy "
                     "when permuted): " + ", ".join(f"{html.escape(str(r.feature))} ({r.importance_mean:.3f})"
                                                  for r in top.itertuples()) + ". ")
        else:
            text += ("Permuting any single property barely changes the pool's balanced accuracy: the "
                     "information is spread over several properties that carry it redundantly. ")
        alone = imp.dropna(subset=["alone"]).sort_values("alone", ascending=False, kind="stable")
        strong = alone[alone["alone"] >= chance + 0.5 * (1.0 - chance)]
        if len(strong):
            shown = ", ".join(f"{html.escape(str(r.feature))} ({r.alone:.3f})" for r in strong.head(6).itertuples())
            more = f" and {len(strong) - 6} more" if len(strong) > 6 else ""
            text += f"Properties that predict the label in the pool by themselves (balanced accuracy alone): {shown}{more}. "
    text += (f'<span class="paper">For comparison, the paper reports {PAPER_NUMBERS["shortcut_pool"]:.3f} in the '
             f"pool and {PAPER_NUMBERS['shortcut_test']:.3f} on the test split of the Kermany pediatric chest "
             "X-rays (the paper's numbers, not this data's).</span>")
    return text


def render_audit_html(result: AuditResult) -> str:
    """A self-contained HTML report of an audit (inline CSS, no external assets).

    Parameters
    ----------
    result : AuditResult
        From :func:`run_audit`.

    Returns
    -------
    str
        A complete HTML document: split facts, the partition and shortcut
        tables, the most important file properties, and a plain-language
        reading of each number next to the paper's numbers (quoted as the
        paper's).

    Examples
    --------
    >>> html_text = render_audit_html(result)  # doctest: +SKIP
    """
    if not isinstance(result, AuditResult):
        raise InputError(f"render_audit_html needs an AuditResult from run_audit, got {type(result).__name__}")
    prov = result.provenance
    split_rows = []
    for entry in prov["splits"]:
        classes = ", ".join(f"{k}: {v}" for k, v in entry.get("classes", {}).items())
        split_rows.append({"split": entry["split"], "images": entry["images"], "patients": entry["patients"],
                           f"images per {result.label_column}": classes})
    split_table = _html_table(pd.DataFrame(split_rows))
    n_shared = prov["n_patients_in_several_splits"]
    if n_shared:
        shown = ", ".join(f"{p['patient_id']} ({'/'.join(p['splits'])})" for p in prov["patients_in_several_splits"][:10])
        leak = (f"<p><b>{n_shared} patient(s) have images in more than one split</b> (e.g. {html.escape(shown)}). "
                "Images of one patient in both the training pool and the test split let a model recognise the "
                "patient rather than the finding.</p>")
    else:
        leak = "<p>No patient has images in more than one split.</p>"
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in result.notes)
    sections = [
        f"<h2>Splits</h2>{split_table}{leak}",
        "<h2>Partition classifier on file properties</h2>"
        f'<p class="reading">{_read_partition(result.partition_properties, "file properties", result.test)}</p>'
        + _html_table(result.partition_properties.table),
    ]
    if result.partition_embeddings is not None:
        name = result.embedding_name or "an encoder"
        sections.append(
            f"<h2>Partition classifier on embeddings ({html.escape(name)})</h2>"
            f'<p class="reading">{_read_partition(result.partition_embeddings, f"the embeddings of {html.escape(name)}", result.test)}</p>'
            + _html_table(result.partition_embeddings.table)
        )
    sections.append(
        "<h2>Shortcut classifier: file properties to label</h2>"
        f'<p class="reading">{_read_shortcut(result.shortcut, result.test)}</p>'
        + _html_table(result.shortcut.table)
        + "<h3>Most important file properties (pool, out of fold)</h3>"
        + _html_table(result.shortcut.importances.head(15))
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/>
<title>crs audit: split and file-property audit</title>
<style>{_CSS}</style>
</head><body>
<h1>Split and file-property audit</h1>
<p>{result.n_images:,} images; label column <code>{html.escape(result.label_column)}</code>; training pool
{html.escape(' + '.join(result.pool))}, official test split {html.escape(result.test)}. Every interval is a 95%
percentile bootstrap over patients; every classifier is evaluated on patients it was not fitted on.</p>
{notes}
{''.join(sections)}
</body></html>
"""
