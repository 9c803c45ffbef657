"""Representation risk: the encoder as a source of model uncertainty.

Study 3 (LOOKAGAIN-style) treats the choice of image encoder the way one
treats any other modelling choice: plausible encoders map the same images
into different spaces, and a conclusion drawn on one of them may not hold on
another. The workflow implemented here:

1. **Patient-grouped outer partitions.** The images are split into train,
   locked validation and locked test partitions by whole patients
   (:func:`outer_partition`); no patient is in two partitions.
2. **Common dimension control.** Every encoder's embeddings are standardised
   and reduced by PCA to a shared dimension (default 128), both fitted on the
   training rows only (:func:`reduce_dimensions`), so that no encoder wins by
   its width alone.
3. **Several heads per encoder.** A regularised linear model, k-nearest
   neighbours and a small MLP (:data:`HEADS`); their hyperparameters are
   chosen by patient-grouped cross-validation inside the training rows.
4. **Selection on locked validation data.** Every encoder x head candidate is
   scored on the validation partition; the best one is selected. The test
   partition is never read for any choice.
5. **Feature union only with validation evidence.** The reduced features of
   the ``union_size`` best encoders are concatenated and given a linear
   head; the union replaces the best single-encoder candidate only when a
   paired, patient-grouped bootstrap of the validation gain has a lower
   confidence bound above zero.
6. **Paired and split-level uncertainty.** Every candidate is compared with
   the selected one on the same test bootstrap resamples (paired), and the
   whole workflow is repeated on ``n_partitions`` re-drawn partitions
   (:func:`representation_risk`), which shows how much the test score, the
   selected encoder and the encoders' ranking depend on one split.

Everything here is pure: a mapping of precomputed embeddings (one row per
image, rows aligned across encoders), the target and patient ids in; tidy
DataFrames and dicts out. Nothing reads files or loads models.

Facts about the public LOOKAGAIN-ML software that this module follows (its
code is not copied) are in :data:`LOOKAGAIN_FACTS`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from crslib import stats
from crslib._compat import one_blas_thread
from crslib._io import json_ready
from crslib.config import progress_enabled
from crslib.errors import DataError, InputError
from crslib.metrics import metric_score
from crslib.stats import grouped_partition, resample_indices

log = logging.getLogger(__name__)

__all__ = [
    "TASKS",
    "HEADS",
    "METRIC_NAMES",
    "LOOKAGAIN_FACTS",
    "MIN_PATIENTS",
    "PartitionResult",
    "RiskResult",
    "outer_partition",
    "reduce_dimensions",
    "evaluate_partition",
    "representation_risk",
    "render_risk_html",
]

#: Prediction tasks: a binary label, or a continuous target (e.g. age).
TASKS = ("classification", "regression")

#: Heads fitted on every encoder's reduced features.
HEADS = ("linear", "knn", "mlp")

#: Primary (selection) and secondary metric of each task.
METRIC_NAMES = {"classification": ("auroc", "accuracy"), "regression": ("r2", "mae")}

#: Facts about the public LOOKAGAIN-ML software, quoted as its own settings.
LOOKAGAIN_FACTS: dict[str, Any] = {
    "n_encoders": 10,
    "pca_components": 128,
    "pca_fitted_on": "outer training set",
    "n_bootstrap": 2000,
    "cka": "linear CKA on 400 training samples",
    "feature_union": "only through nested validation selection",
}

#: Fewest patients :func:`outer_partition` accepts (per class for classification
#: it also needs enough patients to fill every partition).
MIN_PATIENTS = 10

#: Name of the feature-union candidate's ``encoder`` column.
UNION = "union"

# Hyperparameter grids searched by inner cross-validation on the training rows.
_C_GRID = (0.01, 0.1, 1.0, 10.0)  # LogisticRegression inverse regularisation
_ALPHA_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0)  # Ridge penalty
_K_GRID = (5, 15, 31)  # neighbours of the kNN head
_MLP_OPTIONS = {"hidden_layer_sizes": (64,), "solver": "lbfgs", "alpha": 1e-3, "max_iter": 200}
_DEFAULT_PARAM = {"linear_classification": 1.0, "linear_regression": 10.0, "knn": 15}


# --------------------------------------------------------------------------- validation


def _check_embeddings(embeddings: Any) -> tuple[dict[str, np.ndarray], int]:
    if not isinstance(embeddings, Mapping) or len(embeddings) == 0:
        raise InputError(
            "embeddings must be a non-empty mapping of encoder name -> array of shape (n_images, n_features), "
            f"e.g. {{'resnet50': X1, 'vit_b16': X2}}; got {type(embeddings).__name__}"
            + (" with no encoders" if isinstance(embeddings, Mapping) else "")
        )
    out: dict[str, np.ndarray] = {}
    for name, X in embeddings.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"encoder names must be non-empty strings, got {name!r}")
        if name == UNION:
            raise InputError(f"the encoder name {UNION!r} is reserved for the feature union; rename that encoder")
        try:
            arr = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"embeddings of {name!r} are not numeric ({exc}); pass a float array") from exc
        if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
            raise InputError(
                f"embeddings of {name!r} must be a 2-D array (n_images, n_features), got shape {arr.shape}"
            )
        bad = ~np.isfinite(arr)
        if bad.any():
            rows = np.flatnonzero(bad.any(axis=1))
            raise InputError(
                f"embeddings of {name!r} hold NaN or infinite values in {rows.size} row(s) "
                f"(first: {rows[:5].tolist()}); re-extract them or drop those images from every encoder, y and groups"
            )
        out[name] = arr
    sizes = {name: arr.shape[0] for name, arr in out.items()}
    if len(set(sizes.values())) > 1:
        raise InputError(
            f"encoders have different numbers of rows ({', '.join(f'{k}: {v}' for k, v in sizes.items())}); "
            "the embeddings must be row-aligned: one row per image, in the same order for every encoder"
        )
    return out, next(iter(sizes.values()))


def _check_target(y: Any, n: int, task: str) -> tuple[np.ndarray, str, list[Any] | None]:
    """Target as 0/1 int (classification) or float (regression), the task, the classes."""
    if task not in ("auto",) + TASKS:
        raise InputError(f"unknown task {task!r}; choose 'auto', {', '.join(repr(t) for t in TASKS)}")
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise InputError(f"y must be a 1-D array with one value per image, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise InputError(f"y has {arr.shape[0]} values but the embeddings have {n} rows; pass one target per image")
    missing = pd.isna(arr)
    if missing.any():
        raise InputError(
            f"y has {int(missing.sum())} missing value(s) (first at row {int(np.flatnonzero(missing)[0])}); "
            "drop those images from y, groups and every encoder's embeddings"
        )
    try:
        unique = np.unique(arr)
    except TypeError as exc:
        raise InputError(f"y mixes values that cannot be compared ({exc}); pass one type") from exc
    if unique.size < 2:
        raise InputError(f"y is constant (every value is {unique.tolist()[0]!r}): there is nothing to predict")
    if task == "auto":
        task = "classification" if unique.size == 2 else "regression"
    if task == "classification":
        if unique.size != 2:
            raise InputError(
                f"task='classification' needs a binary target, but y has {unique.size} distinct values; binarise "
                "it (one class against the rest) or use task='regression' for a continuous target"
            )
        return (arr == unique[1]).astype(np.int64), task, unique.tolist()
    try:
        values = arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"task='regression' needs a numeric target; y cannot be read as numbers ({exc})") from exc
    if not np.isfinite(values).all():
        raise InputError("y holds infinite values; a regression target must be finite")
    if not np.ptp(values) > 0:
        raise InputError("y has zero variance: there is nothing to predict")
    return values, task, None


def _check_groups(groups: Any, n: int) -> np.ndarray:
    if groups is None:
        return np.arange(n)
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != n:
        raise InputError(f"groups must hold one patient id per image ({n}), got shape {g.shape}")
    missing = pd.isna(g)
    if missing.any():
        raise InputError(f"groups has {int(missing.sum())} missing patient id(s); every image needs its patient id")
    try:
        np.unique(g)
    except TypeError:  # ids of mixed types (e.g. 3 and "3b") cannot be sorted: compare them as text
        g = g.astype(str)
    return g


def _check_heads(heads: Any) -> tuple[str, ...]:
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    unknown = [h for h in heads if h not in HEADS]
    if unknown or not heads:
        raise InputError(f"heads must be a non-empty subset of {', '.join(HEADS)}, got {list(heads)}")
    return tuple(dict.fromkeys(heads))


def _check_fractions(fractions: Any) -> tuple[float, float, float]:
    try:
        f = tuple(float(v) for v in fractions)
    except (TypeError, ValueError) as exc:
        raise InputError(f"fractions must be three numbers (train, validation, test), got {fractions!r}") from exc
    if len(f) != 3 or not all(math.isfinite(v) and v > 0 for v in f):
        raise InputError(
            f"fractions must be three positive numbers (train, validation, test), e.g. (0.6, 0.2, 0.2); got {fractions!r}"
        )
    return f


def _check_seed(random_state: Any) -> int:
    if isinstance(random_state, bool) or not isinstance(random_state, (int, np.integer)) or random_state < 0:
        raise InputError(f"random_state must be a non-negative integer, got {random_state!r}")
    return int(random_state)


def _check_union_size(union_size: Any) -> int:
    if isinstance(union_size, bool) or not isinstance(union_size, (int, np.integer)) or union_size in (1,) \
            or union_size < 0:
        raise InputError(f"union_size must be 0 (no feature union) or an integer >= 2, got {union_size!r}")
    return int(union_size)


# --------------------------------------------------------------------------- partitions


@lru_cache(maxsize=64)
def _min_patients(fractions: tuple[float, float, float]) -> int:
    """Fewest patients that fill every part (and at least 2 training patients)."""
    for m in range(3, 100_000):
        parts = grouped_partition(np.arange(m), fractions, random_state=0)
        if all(p.size > 0 for p in parts) and parts[0].size >= 2:
            return m
    raise InputError(f"fractions {fractions} leave a partition empty for any number of patients")  # pragma: no cover


def _partition(y: np.ndarray, g: np.ndarray, task: str, fractions: tuple[float, float, float],
               random_state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    need = _min_patients(fractions)
    patients, inverse = np.unique(g, return_inverse=True)
    inverse = inverse.ravel()
    if patients.size < max(need, MIN_PATIENTS):
        raise DataError(
            f"{patients.size} patients are too few for patient-grouped train / validation / test partitions "
            f"(fractions {fractions}); at least {max(need, MIN_PATIENTS)} patients are needed"
        )
    if task == "classification":
        # stratified by the patient's label (1 when any of their images is positive), so that every
        # partition holds patients of both classes; each stratum is split with grouped_partition
        patient_label = np.zeros(patients.size, dtype=np.int64)
        np.maximum.at(patient_label, inverse, y)
        strata = [np.flatnonzero(patient_label[inverse] == c) for c in (0, 1)]
        for c in (0, 1):
            n_c = int((patient_label == c).sum())
            if n_c < need:
                raise DataError(
                    f"only {n_c} patient(s) have class {c} (patient label: 1 if any image is positive); "
                    f"at least {need} patients of each class are needed so that train, validation and test "
                    f"(fractions {fractions}) all hold both classes; add patients or change the fractions"
                )
        parts: list[list[np.ndarray]] = [[], [], []]
        for rows in strata:
            for k, part in enumerate(grouped_partition(g[rows], fractions, random_state=random_state)):
                parts[k].append(rows[part])
        out = tuple(np.sort(np.concatenate(p)) for p in parts)
    else:
        out = tuple(grouped_partition(g, fractions, random_state=random_state))
    for name, idx in zip(("train", "validation", "test"), out):
        if idx.size == 0:  # pragma: no cover - excluded by the patient counts above
            raise DataError(f"the {name} partition is empty; at least {need} patients are needed")
        if np.unique(y[idx]).size < 2:
            raise DataError(
                f"the {name} partition holds a constant target ({y[idx].tolist()[0]!r}) with seed {random_state}; "
                "the metrics are undefined there: add patients or use other fractions"
            )
    return out  # type: ignore[return-value]


def outer_partition(
    y: Any,
    groups: Any,
    *,
    task: str = "auto",
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    random_state: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Patient-grouped train / locked validation / locked test row indices.

    All images of a patient land in one partition. For classification the
    patients are stratified by their label (1 when any of their images is
    positive) and each stratum is split by
    :func:`crslib.stats.grouped_partition` with the same fractions, so that
    every partition holds both classes; no retry with another seed is
    needed. Regression targets are split without strata.

    Parameters
    ----------
    y : array-like of shape (n_images,)
        Binary label or continuous target.
    groups : array-like of shape (n_images,)
        Patient id per image (``None``: every image is its own patient).
    task : {"auto", "classification", "regression"}
        ``"auto"``: classification when ``y`` holds two distinct values.
    fractions : sequence of 3 float
        Relative shares of patients in train, validation and test.
    random_state : int
        Seed of the patient shuffle.

    Returns
    -------
    train_idx, val_idx, test_idx : ndarray of int64
        Sorted row indices.

    Raises
    ------
    DataError
        Fewer than :data:`MIN_PATIENTS` patients, too few patients of a class
        to fill every partition, or a partition with a constant target; the
        message says how many patients are needed.

    Examples
    --------
    >>> y = np.tile([0, 1], 20)
    >>> tr, va, te = outer_partition(y, np.arange(40), random_state=0)
    >>> len(tr) + len(va) + len(te), sorted(set(y[va].tolist()))
    (40, [0, 1])
    """
    y_arr = np.asarray(y)
    yv, task, _ = _check_target(y_arr, y_arr.shape[0] if y_arr.ndim == 1 else -1, task)
    g = _check_groups(groups, yv.shape[0])
    return _partition(yv, g, task, _check_fractions(fractions), _check_seed(random_state))


def _check_partition(partition: Any, n: int, g: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    try:
        parts = tuple(np.asarray(p) for p in partition)
    except TypeError as exc:
        raise InputError("partition must be three arrays of row indices (train, validation, test)") from exc
    if len(parts) != 3:
        raise InputError(f"partition must be three arrays of row indices (train, validation, test), got {len(parts)}")
    out = []
    for name, p in zip(("train", "validation", "test"), parts):
        if p.dtype == bool:
            p = np.flatnonzero(p)
        if p.ndim != 1 or p.size == 0 or not np.issubdtype(p.dtype, np.integer) or p.min() < 0 or p.max() >= n:
            raise InputError(f"the {name} partition must be a non-empty 1-D array of row indices in [0, {n})")
        out.append(np.sort(p.astype(np.int64)))
    seen = [set(g[p].tolist()) for p in out]
    for (a, sa), (b, sb) in combinations(zip(("train", "validation", "test"), seen), 2):
        shared = sa & sb
        if shared:
            raise InputError(
                f"{len(shared)} patient(s) are in both the {a} and the {b} partition "
                f"(e.g. {sorted(map(str, shared))[:3]}); partitions must be patient-disjoint"
            )
    for name, p in zip(("train", "validation", "test"), out):
        if np.unique(y[p]).size < 2:
            raise DataError(f"the {name} partition holds a constant target; the metrics are undefined there")
    return tuple(out)


# --------------------------------------------------------------------------- dimension control


def reduce_dimensions(
    X: Any,
    train_idx: Any,
    *,
    n_components: int = 128,
    random_state: int = 0,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Standardise and PCA-reduce embeddings, both fitted on the training rows only.

    The common dimension control of the workflow: every encoder is mapped to
    the same number of dimensions, ``min(n_components, n_train - 1,
    n_features)``, so that no encoder wins by its width. Means, scales and
    principal axes come from ``X[train_idx]`` alone; the other rows are only
    transformed, so changing them cannot change the training rows' features.

    Parameters
    ----------
    X : array-like of shape (n_images, n_features)
        Embeddings of one encoder.
    train_idx : array-like of int (or bool mask)
        Training rows.
    n_components : int
        Shared target dimension (LOOKAGAIN-ML uses 128).
    random_state : int
        Seed of the randomised SVD that scikit-learn's PCA picks for wide
        inputs (the same seed gives the same components).

    Returns
    -------
    Z : ndarray of shape (n_images, k)
        PCA scores of every row (not whitened).
    info : dict
        ``n_components`` (k), ``n_features``, ``n_train``,
        ``explained_variance`` (share of the training rows' standardised
        variance kept), ``mean``, ``scale``, ``components`` (k x
        n_features), and the fitted ``scaler`` and ``pca`` objects.

    Examples
    --------
    >>> X = np.random.default_rng(0).normal(size=(50, 20))
    >>> Z, info = reduce_dimensions(X, np.arange(30), n_components=8)
    >>> Z.shape, info["n_components"], info["n_train"]
    ((50, 8), 8, 30)
    """
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    X, _ = _check_embeddings({"X": X})
    X = X["X"]
    tr = np.asarray(train_idx)
    if tr.dtype == bool:
        if tr.shape != (X.shape[0],):
            raise InputError(f"a boolean train_idx needs one entry per row ({X.shape[0]}), got shape {tr.shape}")
        tr = np.flatnonzero(tr)
    if tr.ndim != 1 or not np.issubdtype(tr.dtype, np.integer) or (tr.size and (tr.min() < 0 or tr.max() >= X.shape[0])):
        raise InputError(f"train_idx must be a 1-D array of row indices in [0, {X.shape[0]})")
    if np.unique(tr).size < 2:
        raise InputError(f"PCA needs at least 2 training rows, got {np.unique(tr).size}")
    n_components = stats._check_count(n_components, "n_components")
    k = int(min(n_components, np.unique(tr).size - 1, X.shape[1]))
    scaler = StandardScaler().fit(X[tr])
    S = scaler.transform(X)
    pca = PCA(n_components=k, random_state=_check_seed(random_state)).fit(S[tr])
    Z = pca.transform(S)
    info = {
        "n_components": k,
        "n_features": int(X.shape[1]),
        "n_train": int(tr.size),
        "explained_variance": float(np.sum(pca.explained_variance_ratio_)),
        "mean": scaler.mean_,
        "scale": scaler.scale_,
        "components": pca.components_,
        "scaler": scaler,
        "pca": pca,
    }
    return Z, info


# --------------------------------------------------------------------------- metrics


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else float("nan")


def _scores(task: str, y: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """(primary, secondary) metric on one partition."""
    if task == "classification":
        return metric_score("auroc", y, pred), float(np.mean((pred >= 0.5) == (y == 1)))
    return _r2(y, pred), float(np.mean(np.abs(y - pred)))


def _count_matrix(groups: np.ndarray, n_resamples: int, random_state: int) -> np.ndarray:
    """Patient-grouped bootstrap resamples as counts: row r = how often each image was drawn."""
    n = groups.shape[0]
    counts = np.zeros((n_resamples, n))
    draws = resample_indices(n, n_resamples=n_resamples, groups=groups, random_state=random_state)
    for r, idx in enumerate(draws):
        counts[r] = np.bincount(idx, minlength=n)
    return counts


def _weighted_auroc(y: np.ndarray, score: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """AUROC on every resample at once (Mann-Whitney with ties counted half).

    Equals :func:`crslib.stats.auroc` on the resampled rows: a row drawn c
    times counts c times in every pair. NaN where a resample has one class.
    """
    order = np.argsort(score, kind="stable")
    s, pos_mask = score[order], y[order] == 1
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    c = counts[:, order]
    pos = np.add.reduceat(np.where(pos_mask, c, 0.0), starts, axis=1)
    neg = np.add.reduceat(np.where(pos_mask, 0.0, c), starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg
    num = np.einsum("ru,ru->r", pos, below + 0.5 * neg)
    den = pos.sum(axis=1) * neg.sum(axis=1)
    out = np.full(counts.shape[0], np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _weighted_r2(y: np.ndarray, pred: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """R^2 on every resample at once (equals R^2 on the resampled rows)."""
    w = counts.sum(axis=1)
    mean = counts @ y / w
    ss_tot = counts @ (y * y) - w * mean * mean
    ss_res = counts @ ((y - pred) ** 2)
    out = np.full(counts.shape[0], np.nan)
    ok = ss_tot > 1e-12 * np.maximum(1.0, counts @ (y * y))
    out[ok] = 1.0 - ss_res[ok] / ss_tot[ok]
    return out


def _resampled_primary(task: str, y: np.ndarray, pred: np.ndarray, counts: np.ndarray) -> np.ndarray:
    if task == "classification":
        return _weighted_auroc(y, pred, counts)
    return _weighted_r2(y, pred, counts)


# --------------------------------------------------------------------------- heads


def _inner_folds(y: np.ndarray, g: np.ndarray, task: str, n_splits: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Patient-grouped CV folds inside the training rows (empty when too few patients)."""
    from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

    if task == "classification":
        k = min(n_splits, *(np.unique(g[y == c]).size for c in (0, 1)))
        cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed) if k >= 2 else None
    else:
        k = min(n_splits, np.unique(g).size)
        cv = GroupKFold(n_splits=k, shuffle=True, random_state=seed) if k >= 2 else None
    if cv is None:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the least populated class ..." on tiny data
        return [(a, b) for a, b in cv.split(np.zeros(y.size), y, g)]


def _primary(task: str, y: np.ndarray, pred: np.ndarray) -> float:
    return metric_score("auroc", y, pred) if task == "classification" else _r2(y, pred)


def _linear_model(task: str, value: float):
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if task == "classification":
        return make_pipeline(StandardScaler(), LogisticRegression(C=value, max_iter=2000))
    return make_pipeline(StandardScaler(), Ridge(alpha=value))


def _predict(model, task: str, Z: np.ndarray) -> np.ndarray:
    return model.predict_proba(Z)[:, 1] if task == "classification" else model.predict(Z)


def _fit_linear(Z, y, tr, folds, task):
    grid = _C_GRID if task == "classification" else _ALPHA_GRID
    name = "C" if task == "classification" else "alpha"
    best, inner = _DEFAULT_PARAM[f"linear_{task}"], float("nan")
    if folds:
        Zt, yt = Z[tr], y[tr]
        scores = []
        for value in grid:
            oof = np.zeros(yt.size)
            for fit, val in folds:
                oof[val] = _predict(_linear_model(task, value).fit(Zt[fit], yt[fit]), task, Zt[val])
            scores.append(_primary(task, yt, oof))
        if np.isfinite(scores).any():
            i = int(np.nanargmax(scores))
            best, inner = grid[i], float(scores[i])
    model = _linear_model(task, best).fit(Z[tr], y[tr])
    return _predict(model, task, Z), f"{name}={best:g}", inner


def _knn_means(Z_fit: np.ndarray, y_fit: np.ndarray, Z_query: np.ndarray, ks: Sequence[int]) -> dict[int, np.ndarray]:
    """Mean target of the k nearest fitting rows (Euclidean) for every k, from one neighbour search.

    Exact brute-force search with one matrix product (faster here than
    scikit-learn's threaded search on small inputs); ties in distance are
    broken by row order.
    """
    k_max = min(max(ks), y_fit.size)
    d2 = (Z_query * Z_query).sum(axis=1)[:, None] - 2.0 * (Z_query @ Z_fit.T) + (Z_fit * Z_fit).sum(axis=1)[None, :]
    if k_max < y_fit.size:
        near = np.argpartition(d2, k_max - 1, axis=1)[:, :k_max]
    else:
        near = np.broadcast_to(np.arange(y_fit.size), d2.shape)
    order = np.argsort(np.take_along_axis(d2, near, axis=1), axis=1, kind="stable")
    ind = np.take_along_axis(near, order, axis=1)
    cum = np.cumsum(y_fit[ind].astype(float), axis=1)
    return {k: cum[:, min(k, k_max) - 1] / min(k, k_max) for k in ks}


def _fit_knn(Z, y, tr, folds, task):
    best, inner = _DEFAULT_PARAM["knn"], float("nan")
    Zt, yt = Z[tr], y[tr]
    if folds:
        oof = {k: np.zeros(yt.size) for k in _K_GRID}
        for fit, val in folds:
            for k, pred in _knn_means(Zt[fit], yt[fit], Zt[val], _K_GRID).items():
                oof[k][val] = pred
        scores = [_primary(task, yt, oof[k]) for k in _K_GRID]
        if np.isfinite(scores).any():
            i = int(np.nanargmax(scores))
            best, inner = _K_GRID[i], float(scores[i])
    k = min(best, yt.size)
    return _knn_means(Zt, yt, Z, [k])[k], f"k={k}", inner


def _fit_mlp(Z, y, tr, folds, task, seed):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if task == "classification":
            model = make_pipeline(StandardScaler(), MLPClassifier(**_MLP_OPTIONS, random_state=seed))
            pred = model.fit(Z[tr], y[tr]).predict_proba(Z)[:, 1]
        else:
            mu, sd = float(y[tr].mean()), float(y[tr].std()) or 1.0
            model = make_pipeline(StandardScaler(), MLPRegressor(**_MLP_OPTIONS, random_state=seed))
            pred = model.fit(Z[tr], (y[tr] - mu) / sd).predict(Z) * sd + mu
    return pred, "hidden=64", float("nan")


def _fit_head(head: str, Z, y, tr, folds, task, seed):
    if head == "linear":
        return _fit_linear(Z, y, tr, folds, task)
    if head == "knn":
        return _fit_knn(Z, y, tr, folds, task)
    return _fit_mlp(Z, y, tr, folds, task, seed)


# --------------------------------------------------------------------------- results


@dataclass
class PartitionResult:
    """The workflow on one patient-grouped train / validation / test partition.

    Attributes
    ----------
    candidates : DataFrame
        One row per candidate (encoder x head, then the feature union):
        ``candidate`` (``"encoder/head"``; the union is ``"union/linear"``),
        ``encoder``, ``head``, ``members`` (encoders whose features it uses),
        ``n_features`` (input dimension of the head), ``param`` (the
        hyperparameter chosen by inner CV), ``inner_score`` (its inner-CV
        primary metric on the training rows; NaN for the MLP, whose settings
        are fixed), ``val_score``, ``val_low``, ``val_high``,
        ``val_secondary``, ``val_rank`` (1 = best on validation),
        ``test_score``, ``test_low``, ``test_high``, ``test_secondary`` and
        ``selected``. ``*_score`` is the primary metric (AUROC or R^2),
        ``*_low``/``*_high`` its percentile interval from a patient-grouped
        bootstrap, ``*_secondary`` accuracy at 0.5 or mean absolute error.
    selected : str
        The selected candidate (chosen on validation only).
    union : dict
        The feature-union decision: ``evaluated``, ``members``,
        ``candidate``, ``best_single``, ``gain`` (validation score of the
        union minus that of the best single-encoder candidate), ``low``,
        ``high``, ``share_positive`` (paired bootstrap on validation),
        ``chosen`` (``low > 0``) and ``reason``.
    comparisons : DataFrame
        Paired test bootstrap of every other candidate against the selected
        one: ``candidate``, ``encoder``, ``head``, ``difference``
        (candidate minus selected), ``low``, ``high``, ``share_positive``
        (share of resamples where the candidate beats the selected one).
    reduction : DataFrame
        Per encoder: ``encoder``, ``n_features``, ``n_components``,
        ``explained_variance``, ``n_train``.
    train_idx, val_idx, test_idx : ndarray
        Row indices of the partitions.
    predictions : dict
        Candidate -> prediction for every row (probability or value).
    task, metric, secondary_metric : str
    classes : list or None
        The two label values (the second is the positive class).
    partition : int
        Index of the partition in :func:`representation_risk`.
    random_state : int
        Seed of this partition.
    n_resamples : int
    confidence : float
    """

    candidates: pd.DataFrame
    selected: str
    union: dict[str, Any]
    comparisons: pd.DataFrame
    reduction: pd.DataFrame
    train_idx: np.ndarray = field(repr=False)
    val_idx: np.ndarray = field(repr=False)
    test_idx: np.ndarray = field(repr=False)
    predictions: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    task: str = "classification"
    metric: str = "auroc"
    secondary_metric: str = "accuracy"
    classes: list[Any] | None = None
    partition: int = 0
    random_state: int = 0
    n_resamples: int = 2000
    confidence: float = 0.95

    @property
    def selected_row(self) -> pd.Series:
        """The selected candidate's row of :attr:`candidates`."""
        return self.candidates.loc[self.candidates["candidate"] == self.selected].iloc[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (floats rounded to 4 digits, NaN as None)."""
        return json_ready(digits=4, obj={
            "partition": self.partition,
            "random_state": self.random_state,
            "task": self.task,
            "metric": self.metric,
            "secondary_metric": self.secondary_metric,
            "classes": None if self.classes is None else [str(c) for c in self.classes],
            "n_train": int(self.train_idx.size),
            "n_val": int(self.val_idx.size),
            "n_test": int(self.test_idx.size),
            "n_resamples": self.n_resamples,
            "confidence": self.confidence,
            "selected": self.selected,
            "union": self.union,
            "candidates": self.candidates,
            "comparisons": self.comparisons,
            "reduction": self.reduction,
        })


@dataclass
class RiskResult:
    """The workflow repeated on ``n_partitions`` patient-grouped partitions.

    Attributes
    ----------
    primary : PartitionResult
        Partition 0, reported in full.
    partitions : list of PartitionResult
        Every partition (the first is :attr:`primary`).
    all_partitions : DataFrame
        Every partition's candidates table with a ``partition`` column.
    spread : DataFrame
        Per candidate: ``candidate``, ``encoder``, ``head``, ``val_mean``,
        and the test score's ``mean``, ``sd``, ``min``, ``max`` over
        partitions, ``n_partitions`` and ``times_selected``.
    selection_counts : DataFrame
        ``encoder`` (each encoder, then ``"union"``), ``count`` (partitions
        in which a candidate of it was selected) and ``share``.
    rank_stability : DataFrame
        Per encoder, scored in each partition by its validation-best head:
        ``mean_val_rank``, ``mean_test_rank`` (1 = best), ``share_first_val``
        and ``share_first_test`` (share of partitions where it ranks first).
    rank_correlation : dict
        ``validation`` and ``test``: mean Spearman correlation of the
        encoders' scores between every pair of partitions (NaN with one
        partition or fewer than two encoders).
    task, metric, secondary_metric : str
    settings : dict
        The options of the run.
    """

    primary: PartitionResult
    partitions: list[PartitionResult] = field(repr=False)
    all_partitions: pd.DataFrame = field(repr=False)
    spread: pd.DataFrame
    selection_counts: pd.DataFrame
    rank_stability: pd.DataFrame
    rank_correlation: dict[str, float]
    task: str = "classification"
    metric: str = "auroc"
    secondary_metric: str = "accuracy"
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def selected_test_scores(self) -> pd.Series:
        """The selected candidate's test score in each partition (the workflow's result)."""
        sel = self.all_partitions[self.all_partitions["selected"]]
        return sel.set_index("partition")["test_score"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (floats rounded to 4 digits, NaN as None)."""
        scores = self.selected_test_scores
        return json_ready(digits=4, obj={
            "task": self.task,
            "metric": self.metric,
            "secondary_metric": self.secondary_metric,
            "settings": self.settings,
            "primary": self.primary.to_dict(),
            "selected_per_partition": [p.selected for p in self.partitions],
            "selected_test_score": {
                "mean": float(scores.mean()), "sd": float(scores.std(ddof=1)) if scores.size > 1 else None,
                "min": float(scores.min()), "max": float(scores.max()),
            },
            "spread": self.spread,
            "selection_counts": self.selection_counts,
            "rank_stability": self.rank_stability,
            "rank_correlation": self.rank_correlation,
            "lookagain_facts": LOOKAGAIN_FACTS,
        })


# --------------------------------------------------------------------------- one partition


def _add_scores(table: pd.DataFrame, part: str, task: str, y: np.ndarray, preds: dict[str, np.ndarray],
                samples: dict[str, np.ndarray], confidence: float) -> None:
    """Add ``{part}_score``, ``_low``, ``_high`` (primary metric) and ``_secondary`` columns in place."""
    names = table["candidate"].tolist()
    point = [_scores(task, y, preds[c]) for c in names]
    low, high, _ = stats._percentile_interval(np.column_stack([samples[c] for c in names]), confidence)
    table[f"{part}_score"] = [p[0] for p in point]
    table[f"{part}_low"], table[f"{part}_high"] = low, high
    table[f"{part}_secondary"] = [p[1] for p in point]


def _union_verdict(diffs: np.ndarray, gain: float, confidence: float) -> dict[str, Any]:
    """The feature-union rule: selected only when its gain's interval lies above zero.

    ``diffs`` are the union's validation score minus the best single
    candidate's on the same resamples; ``gain`` is that difference on the
    validation rows themselves. A positive ``gain`` alone is not enough: the
    lower percentile bound at ``confidence`` must be above 0.
    """
    low, high, _ = stats._percentile_interval(diffs, confidence)
    valid = diffs[np.isfinite(diffs)]
    chosen = bool(np.isfinite(low) and low > 0)
    return {"gain": gain, "low": float(low), "high": float(high),
            "share_positive": float(np.mean(valid > 0)) if valid.size else float("nan"), "chosen": chosen,
            "reason": (f"validation gain {gain:+.4f} [{float(low):+.4f}, {float(high):+.4f}]: "
                       + ("lower bound > 0, the union is selected" if chosen
                          else "interval reaches 0 or below, the best single encoder is kept"))}


def _evaluate(
    X: dict[str, np.ndarray],
    y: np.ndarray,
    g: np.ndarray,
    task: str,
    parts: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    heads: tuple[str, ...],
    n_components: int,
    union_size: int,
    inner_splits: int,
    n_resamples: int,
    confidence: float,
    random_state: int,
    classes: list[Any] | None,
    partition: int = 0,
) -> PartitionResult:
    tr, va, te = parts
    seed_cv, seed_model, seed_val, seed_test = (int(s) for s in np.random.SeedSequence(random_state).generate_state(4))
    folds = _inner_folds(y[tr], g[tr], task, inner_splits, seed_cv)
    metric, secondary = METRIC_NAMES[task]

    rows: list[dict[str, Any]] = []
    preds: dict[str, np.ndarray] = {}
    reduced: dict[str, np.ndarray] = {}
    reduction = []
    for name, Xe in X.items():
        Z, info = reduce_dimensions(Xe, tr, n_components=n_components, random_state=seed_model)
        reduced[name] = Z
        reduction.append({"encoder": name, "n_features": info["n_features"], "n_components": info["n_components"],
                          "explained_variance": info["explained_variance"], "n_train": info["n_train"]})
        for head in heads:
            pred, param, inner = _fit_head(head, Z, y, tr, folds, task, seed_model)
            cand = f"{name}/{head}"
            preds[cand] = pred
            rows.append({"candidate": cand, "encoder": name, "head": head, "members": name,
                         "n_features": Z.shape[1], "param": param, "inner_score": inner})

    def val_score(cand: str) -> float:
        return _primary(task, y[va], preds[cand][va])

    # feature union of the best encoders (each scored by its validation-best head), with a linear head
    k_union = min(union_size, len(X))
    union_members: list[str] = []
    if k_union >= 2:
        best_by_encoder = {name: max(val_score(f"{name}/{h}") for h in heads) for name in X}
        ranked = sorted(X, key=lambda name: -np.nan_to_num(best_by_encoder[name], nan=-np.inf))
        union_members = ranked[:k_union]
        Zu = np.hstack([reduced[m] for m in union_members])
        pred, param, inner = _fit_linear(Zu, y, tr, folds, task)
        cand = f"{UNION}/linear"
        preds[cand] = pred
        rows.append({"candidate": cand, "encoder": UNION, "head": "linear", "members": "+".join(union_members),
                     "n_features": Zu.shape[1], "param": param, "inner_score": inner})

    table = pd.DataFrame(rows)
    names = table["candidate"].tolist()
    # validation only: scores, CIs and the selection; the same patient-grouped resamples serve every
    # candidate, so the union's gain over the best single candidate is paired
    counts_val = _count_matrix(g[va], n_resamples, seed_val)
    val_samples = {c: _resampled_primary(task, y[va], preds[c][va], counts_val) for c in names}
    _add_scores(table, "val", task, y[va], {c: p[va] for c, p in preds.items()}, val_samples, confidence)
    table["val_rank"] = table["val_score"].rank(ascending=False, method="first", na_option="bottom").astype(int)

    single = table[table["encoder"] != UNION]
    if not np.isfinite(single["val_score"]).any():  # pragma: no cover - partitions hold both classes
        raise DataError("no candidate has a defined validation score; check the target and the partitions")
    best_single = str(single["candidate"].iloc[int(np.nanargmax(single["val_score"].to_numpy()))])
    selected = best_single
    if union_members:
        cand = f"{UNION}/linear"
        gain = float(table.loc[table["candidate"] == cand, "val_score"].iloc[0] - single["val_score"].max())
        union = {"evaluated": True, "members": union_members, "candidate": cand, "best_single": best_single,
                 **_union_verdict(val_samples[cand] - val_samples[best_single], gain, confidence)}
        if union["chosen"]:
            selected = cand
    else:
        reason = ("union_size is 0" if union_size == 0 else
                  f"only {len(X)} encoder(s): a feature union needs at least 2")
        union = {"evaluated": False, "members": [], "candidate": None, "best_single": best_single, "gain": float("nan"),
                 "low": float("nan"), "high": float("nan"), "share_positive": float("nan"), "chosen": False,
                 "reason": reason}

    # the selection is final: now the test labels are read, for every candidate (reporting only)
    counts_test = _count_matrix(g[te], n_resamples, seed_test)
    test_samples = {c: _resampled_primary(task, y[te], preds[c][te], counts_test) for c in names}
    _add_scores(table, "test", task, y[te], {c: p[te] for c, p in preds.items()}, test_samples, confidence)
    table["selected"] = table["candidate"] == selected

    sel_test = float(table.loc[table["selected"], "test_score"].iloc[0])
    comp_rows = []
    for c, enc, head, score in table[["candidate", "encoder", "head", "test_score"]].itertuples(index=False):
        if c == selected:
            continue
        diffs = test_samples[c] - test_samples[selected]
        low, high, _ = stats._percentile_interval(diffs, confidence)
        valid = diffs[np.isfinite(diffs)]
        comp_rows.append({"candidate": c, "encoder": enc, "head": head, "difference": float(score - sel_test),
                          "low": float(low), "high": float(high),
                          "share_positive": float(np.mean(valid > 0)) if valid.size else float("nan")})
    comparisons = pd.DataFrame(comp_rows, columns=["candidate", "encoder", "head", "difference", "low", "high",
                                                   "share_positive"])
    return PartitionResult(
        candidates=table, selected=selected, union=union, comparisons=comparisons,
        reduction=pd.DataFrame(reduction), train_idx=tr, val_idx=va, test_idx=te, predictions=preds,
        task=task, metric=metric, secondary_metric=secondary, classes=classes, partition=partition,
        random_state=random_state, n_resamples=n_resamples, confidence=confidence,
    )


def _check_options(heads, n_components, union_size, fractions, inner_splits, n_resamples, confidence, random_state):
    return dict(
        heads=_check_heads(heads),
        n_components=stats._check_count(n_components, "n_components"),
        union_size=_check_union_size(union_size),
        fractions=_check_fractions(fractions),
        inner_splits=stats._check_count(inner_splits, "inner_splits", minimum=2),
        n_resamples=stats._check_count(n_resamples, "n_resamples"),
        confidence=stats._check_confidence(confidence),
        random_state=_check_seed(random_state),
    )


def evaluate_partition(
    embeddings: Mapping[str, Any],
    y: Any,
    groups: Any,
    *,
    task: str = "auto",
    heads: Sequence[str] = HEADS,
    n_components: int = 128,
    union_size: int = 2,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    partition: Sequence[Any] | None = None,
    inner_splits: int = 3,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    random_state: int = 0,
) -> PartitionResult:
    """Benchmark, select and compare encoder x head candidates on one partition.

    Steps: a patient-grouped train / validation / test partition
    (:func:`outer_partition`, or ``partition``); per encoder, standardisation
    and PCA fitted on the training rows (:func:`reduce_dimensions`); per
    head, hyperparameters chosen by patient-grouped inner CV on the
    training rows; the feature union of the ``union_size`` encoders with the
    best validation scores, with a linear head; selection of the best
    single-encoder candidate by validation score, replaced by the union only
    when the paired validation bootstrap of its gain has a lower bound > 0;
    test scores of every candidate with CIs and paired comparisons against
    the selected one. Test labels are read only after the selection.

    Heads (all fitted on the training rows only):

    * ``"linear"``: standardised features, then ``LogisticRegression``
      (``C`` in 0.01, 0.1, 1, 10) or ``Ridge`` (``alpha`` in 0.1 ... 1000),
      chosen by inner-CV AUROC or R^2;
    * ``"knn"``: mean label (the share of positives, for classification) or
      mean target of the k nearest training rows in the reduced space
      (Euclidean), ``k`` in 5, 15, 31 chosen by inner CV;
    * ``"mlp"``: standardised features, one hidden layer of 64 units, L-BFGS,
      ``alpha=1e-3``, ``max_iter=200``, no early stopping, fixed settings (no
      inner CV); regression targets are standardised on the training rows.

    The inner CV uses ``inner_splits`` patient-grouped folds
    (``StratifiedGroupKFold`` for classification, ``GroupKFold`` for
    regression), the same for every encoder; with fewer patients than folds
    the defaults (``C=1``, ``alpha=10``, ``k=15``) are used.

    Parameters
    ----------
    embeddings : mapping of str -> array-like of shape (n_images, n_features)
        Precomputed embeddings per encoder, rows aligned across encoders.
    y : array-like of shape (n_images,)
        A binary label (two distinct values; the second in sorted order is
        the positive class) or a continuous target. Multi-class labels are
        not supported: binarise them (one class against the rest).
    groups : array-like of shape (n_images,)
        Patient id per image (``None``: every image is its own patient).
    task : {"auto", "classification", "regression"}
        ``"auto"``: classification when ``y`` holds two distinct values.
        Classification is scored by AUROC (primary, used for selection) and
        accuracy at 0.5; regression by R^2 (primary) and mean absolute error.
    heads : sequence of str
        Subset of :data:`HEADS`.
    n_components : int
        Shared PCA dimension (capped by the training rows and each encoder's
        width).
    union_size : int
        Encoders in the feature union; 0 disables it.
    fractions : sequence of 3 float
        Shares of patients in train, validation and test.
    partition : tuple of 3 arrays, optional
        Precomputed (train, validation, test) row indices, e.g. an official
        split; they must be patient-disjoint. Default: :func:`outer_partition`.
    inner_splits : int
        Folds of the inner CV.
    n_resamples : int
        Patient-grouped bootstrap resamples (drawn once per partition and
        shared by every candidate, so comparisons are paired).
    confidence : float
        CI level.
    random_state : int
        Seed of the partition; the inner folds, the models, and the
        bootstraps use seeds derived from it.

    Returns
    -------
    PartitionResult

    Notes
    -----
    The union's members are picked on the same validation rows on which its
    gain is then tested, which favours the union a little; the best single
    candidate is the maximum of many validation scores, which favours it.
    Requiring a lower confidence bound above zero keeps the union out unless
    its gain is clear. BLAS and OpenMP run single-threaded during the call
    (small matrices; measured faster on the 2-core reference machine).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 60)
    >>> emb = {"good": rng.normal(size=(120, 5)) + y[:, None], "noise": rng.normal(size=(120, 5))}
    >>> res = evaluate_partition(emb, y, np.arange(120), heads=["linear"], n_resamples=100)
    >>> res.selected, res.candidates["candidate"].tolist()
    ('good/linear', ['good/linear', 'noise/linear', 'union/linear'])
    """
    X, n = _check_embeddings(embeddings)
    yv, task, classes = _check_target(y, n, task)
    g = _check_groups(groups, n)
    opts = _check_options(heads, n_components, union_size, fractions, inner_splits, n_resamples, confidence,
                          random_state)
    if partition is None:
        parts = _partition(yv, g, task, opts.pop("fractions"), opts["random_state"])
    else:
        opts.pop("fractions")
        parts = _check_partition(partition, n, g, yv)
    with one_blas_thread():
        return _evaluate(X, yv, g, task, parts, classes=classes, **opts)


# --------------------------------------------------------------------------- repeated partitions


def _mean_spearman(matrix: np.ndarray) -> float:
    """Mean Spearman correlation between the rows of a (partitions x encoders) score matrix."""
    from scipy.stats import rankdata

    if matrix.shape[0] < 2 or matrix.shape[1] < 2:
        return float("nan")
    ranks = rankdata(matrix, axis=1)
    values = []
    for a, b in combinations(range(ranks.shape[0]), 2):
        if np.ptp(ranks[a]) > 0 and np.ptp(ranks[b]) > 0:
            values.append(float(np.corrcoef(ranks[a], ranks[b])[0, 1]))
    return float(np.mean(values)) if values else float("nan")


def representation_risk(
    embeddings: Mapping[str, Any],
    y: Any,
    groups: Any,
    *,
    task: str = "auto",
    heads: Sequence[str] = HEADS,
    n_components: int = 128,
    union_size: int = 2,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    n_partitions: int = 10,
    inner_splits: int = 3,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    random_state: int = 0,
    progress: bool | None = None,
) -> RiskResult:
    """The representation-risk workflow on repeated patient-grouped partitions.

    Runs :func:`evaluate_partition` on ``n_partitions`` partitions; partition
    ``i`` re-draws train / validation / test with seed ``random_state + i``
    (partition 0 is the primary one, reported in full). Across partitions it
    reports the spread of every candidate's test score, how often each
    encoder (or the union) is selected, and how stable the encoders' ranking
    is.

    Parameters
    ----------
    embeddings, y, groups, task, heads, n_components, union_size, fractions, inner_splits, n_resamples, confidence
        As in :func:`evaluate_partition`.
    n_partitions : int
        Number of partitions (LOOKAGAIN-style default: 10).
    random_state : int
        Seed of partition 0.
    progress : bool, optional
        Show a tqdm bar over partitions; default: only when stderr is a
        terminal and not in CI.

    Returns
    -------
    RiskResult

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 60)
    >>> emb = {"good": rng.normal(size=(120, 5)) + y[:, None], "noise": rng.normal(size=(120, 5))}
    >>> res = representation_risk(emb, y, np.arange(120), heads=["linear"], n_partitions=3, n_resamples=100)
    >>> res.selection_counts[["encoder", "count"]].values.tolist()
    [['good', 3], ['noise', 0], ['union', 0]]
    """
    from tqdm import tqdm

    X, n = _check_embeddings(embeddings)
    yv, task, classes = _check_target(y, n, task)
    g = _check_groups(groups, n)
    opts = _check_options(heads, n_components, union_size, fractions, inner_splits, n_resamples, confidence,
                          random_state)
    n_partitions = stats._check_count(n_partitions, "n_partitions")
    fractions_, seed = opts.pop("fractions"), opts.pop("random_state")
    results = []
    with one_blas_thread():
        for i in tqdm(range(n_partitions), desc="representation risk", unit="partition",
                      disable=not progress_enabled(progress), leave=False):
            parts = _partition(yv, g, task, fractions_, seed + i)
            results.append(_evaluate(X, yv, g, task, parts, classes=classes, random_state=seed + i, partition=i,
                                     **opts))
            log.info("partition %d: selected %s", i, results[-1].selected)

    all_partitions = pd.concat([r.candidates.assign(partition=r.partition) for r in results], ignore_index=True)
    all_partitions = all_partitions[["partition"] + [c for c in all_partitions.columns if c != "partition"]]
    spread = all_partitions.groupby("candidate", sort=False).agg(
        encoder=("encoder", "first"), head=("head", "first"), val_mean=("val_score", "mean"),
        mean=("test_score", "mean"), sd=("test_score", "std"), min=("test_score", "min"),
        max=("test_score", "max"), n_partitions=("test_score", "size"), times_selected=("selected", "sum"),
    ).reset_index()
    spread["times_selected"] = spread["times_selected"].astype(int)

    encoders = list(X) + ([UNION] if any(r.union["evaluated"] for r in results) else [])
    chosen = pd.Series([r.selected_row["encoder"] for r in results])
    counts = [int((chosen == e).sum()) for e in encoders]
    selection_counts = pd.DataFrame({"encoder": encoders, "count": counts,
                                     "share": [c / n_partitions for c in counts]})

    # each encoder scored by its validation-best head (its test score is that head's: no test-based choice)
    val_m = np.empty((n_partitions, len(X)))
    test_m = np.empty((n_partitions, len(X)))
    for i, r in enumerate(results):
        single = r.candidates[r.candidates["encoder"] != UNION]
        for j, name in enumerate(X):
            rows = single[single["encoder"] == name]
            best = rows.iloc[int(np.nanargmax(rows["val_score"].to_numpy()))] if rows["val_score"].notna().any() \
                else rows.iloc[0]
            val_m[i, j], test_m[i, j] = best["val_score"], best["test_score"]
    from scipy.stats import rankdata

    val_rank = rankdata(-np.nan_to_num(val_m, nan=-np.inf), axis=1, method="min")
    test_rank = rankdata(-np.nan_to_num(test_m, nan=-np.inf), axis=1, method="min")
    rank_stability = pd.DataFrame({
        "encoder": list(X),
        "mean_val_rank": val_rank.mean(axis=0),
        "mean_test_rank": test_rank.mean(axis=0),
        "share_first_val": (val_rank == 1).mean(axis=0),
        "share_first_test": (test_rank == 1).mean(axis=0),
    })
    rank_correlation = {"validation": _mean_spearman(val_m), "test": _mean_spearman(test_m)}
    metric, secondary = METRIC_NAMES[task]
    settings = {"heads": list(opts["heads"]), "n_components": opts["n_components"], "union_size": opts["union_size"],
                "fractions": list(fractions_), "n_partitions": n_partitions, "inner_splits": opts["inner_splits"],
                "n_resamples": opts["n_resamples"], "confidence": opts["confidence"], "random_state": seed,
                "n_images": n, "n_patients": int(np.unique(g).size), "encoders": list(X),
                "classes": None if classes is None else [str(c) for c in classes]}
    return RiskResult(
        primary=results[0], partitions=results, all_partitions=all_partitions, spread=spread,
        selection_counts=selection_counts, rank_stability=rank_stability, rank_correlation=rank_correlation,
        task=task, metric=metric, secondary_metric=secondary, settings=settings,
    )


# --------------------------------------------------------------------------- report


def render_risk_html(outcomes: Mapping[str, RiskResult]) -> str:
    """A self-contained HTML summary of :func:`representation_risk` results.

    Parameters
    ----------
    outcomes : mapping of task name -> RiskResult

    Returns
    -------
    str
        One HTML page (inline CSS, tables only, no external assets).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(np.tile([0, 1], 30), 2)
    >>> emb = {"a": rng.normal(size=(120, 4)) + y[:, None], "b": rng.normal(size=(120, 4))}
    >>> res = representation_risk(emb, y, np.repeat(np.arange(60), 2), heads=("linear",), n_partitions=2,
    ...                           n_resamples=50)
    >>> render_risk_html({"y": res}).startswith("<!DOCTYPE html>")
    True
    """
    import html

    if not isinstance(outcomes, Mapping) or not outcomes:
        raise InputError("render_risk_html needs a non-empty mapping of task name -> RiskResult")
    sections = []
    for task, result in outcomes.items():
        if not isinstance(result, RiskResult):
            raise InputError(f"outcome of task {task!r} is a {type(result).__name__}, not a RiskResult")
        primary = result.primary
        union = primary.union
        scores = result.selected_test_scores
        columns = ["candidate", "val_score", "val_low", "val_high", "test_score", "test_low", "test_high",
                   "test_secondary", "selected"]
        candidates = primary.candidates.sort_values("val_rank")[columns]
        sections.append(
            f"<h2>{html.escape(str(task))} ({html.escape(result.task)}, {html.escape(result.metric)})</h2>"
            f"<p>Selected on validation (first partition): <b>{html.escape(primary.selected)}</b>, test "
            f"{html.escape(result.metric)} {primary.selected_row['test_score']:.3f} "
            f"[{primary.selected_row['test_low']:.3f}, {primary.selected_row['test_high']:.3f}]. "
            f"Feature union: {'chosen' if union.get('chosen') else 'not chosen'} "
            f"({html.escape(str(union.get('reason', '')))}). Over {len(result.partitions)} partitions the "
            f"selected candidate's test score ranged {scores.min():.3f}-{scores.max():.3f} "
            f"(mean {scores.mean():.3f}).</p>"
            "<h3>Candidates (first partition)</h3>" + candidates.round(4).to_html(index=False)
            + "<h3>Paired test comparisons with the selected candidate</h3>"
            + primary.comparisons.round(4).to_html(index=False)
            + "<h3>Selection over repeated partitions</h3>" + result.selection_counts.round(3).to_html(index=False)
            + "<h3>Test score spread over partitions</h3>" + result.spread.round(4).to_html(index=False)
        )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>crs risk</title>"
        "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto;} table{border-collapse:collapse;"
        "margin:1em 0;font-size:90%} td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}</style>"
        "</head><body><h1>Representation risk</h1><p>Encoders benchmarked under common dimension control (PCA "
        "fitted on training rows), several heads, selection on a locked validation partition, feature union "
        "only with validation evidence, paired and split-level uncertainty (patient-grouped).</p>"
        + "".join(sections) + "</body></html>\n"
    )
