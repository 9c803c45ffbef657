"""Multi-class tasks of the representation-risk workflow: partitions, inner folds and heads for k classes.

:mod:`crslib.risk` runs one workflow for every task type; for a binary or a
regression target it uses :func:`crslib.splits.patient_partition`,
:func:`crslib.splits.inner_folds` and the heads of :mod:`crslib.probes`
directly, and for a multi-class target (class codes 0 .. k-1) the
functions here, which keep the same rules with k classes:

- partitions stratified by each patient's class (of the classes among their
  images, the one fewest patients have, ties to the lower code: the
  multi-class form of the binary rule "positive when any image is"), every
  stratum split by :func:`crslib.splits.grouped_partition` with the same
  fractions, so that train, validation and test each hold every class; the
  strata of fewer than three patients (too few for one per part: a class
  whose patients mostly also have a rarer class) are pooled, and a pool
  still too small joins the smallest stratum that is large enough;
- inner folds by :func:`crslib.splits.stratified_group_kfold`, at most as
  many as the rarest class has patients;
- the same three heads with the same grids (:mod:`crslib.probes`), each
  predicting one probability per class: multinomial logistic regression,
  the class shares among the k nearest neighbours, an MLP classifier.
  Hyperparameters are chosen by the inner-CV macro one-vs-rest AUROC.

The dispatching functions (:func:`partition`, :func:`folds`, :func:`head`)
take every task and pass the others through.
"""

from __future__ import annotations

import warnings

import numpy as np

from crslib.errors import DataError, InputError
from crslib.probes import _C_GRID, _DEFAULT_PARAM, _MLP_OPTIONS, class_proba, fit_head, fit_knn_head
from crslib.probes import linear_head as _probe_linear_head
from crslib.risk_scores import MULTICLASS, primary_score
from crslib.splits import MIN_PATIENTS, grouped_partition, inner_folds, min_patients, patient_partition

__all__ = ["MAX_CLASSES", "class_patients", "patient_classes", "partition", "folds", "head"]

#: Most distinct values an integer-like column may have to be guessed a multi-class task (``task="auto"``);
#: a numeric column with more values is a regression target. Text columns are classes at any count.
MAX_CLASSES = 20


def class_patients(y: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which patients have an image of each class (patients x classes, bool), and each row's patient.

    Examples
    --------
    >>> has, _ = class_patients(np.array([2, 1, 1, 0]), np.array(["a", "a", "a", "b"]))
    >>> has.sum(axis=0).tolist()
    [1, 1, 1]
    """
    patients, inverse = np.unique(groups, return_inverse=True)
    inverse = inverse.ravel()
    has = np.zeros((patients.size, int(y.max()) + 1), dtype=bool)
    has[inverse, y] = True
    return has, inverse


def patient_classes(y: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each patient's stratum: of the classes among their images, the one fewest patients have (ties: lower code).

    Examples
    --------
    >>> patient_classes(np.array([2, 1, 1, 0, 1]), np.array(["a", "a", "a", "b", "c"]))[0].tolist()
    [2, 0, 1]
    """
    has, inverse = class_patients(y, groups)
    rarity = np.where(has, has.sum(axis=0)[None, :], np.iinfo(np.int64).max)
    return rarity.argmin(axis=1), inverse


def _pooled_strata(label: np.ndarray, minimum: int) -> np.ndarray:
    """Each patient's stratum: their class, with the classes of fewer than ``minimum`` patients pooled.

    A pool still smaller than ``minimum`` joins the smallest stratum of at
    least ``minimum`` patients (there is one: the caller has checked that
    there are more patients than that).

    Examples
    --------
    >>> _pooled_strata(np.array([0, 0, 0, 1, 1, 1, 1, 2, 3]), 3).tolist()
    [0, 0, 0, 1, 1, 1, 1, 0, 0]
    """
    classes, counts = np.unique(label, return_counts=True)
    small = counts < minimum
    if not small.any():
        return label
    strata = label.copy()
    pooled = np.isin(label, classes[small])
    large = np.flatnonzero(~small)
    joins = pooled.sum() < minimum and large.size
    strata[pooled] = classes[large[np.argmin(counts[large])]] if joins else classes[small][0]
    return strata


def _multiclass_partition(y: np.ndarray, groups: np.ndarray, fractions: tuple[float, float, float],
                          random_state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    need = min_patients(fractions)
    label, inverse = patient_classes(y, groups)
    if label.size < max(need, MIN_PATIENTS):
        raise DataError(
            f"{label.size} patients are too few for patient-grouped train / validation / test partitions "
            f"(fractions {fractions}); at least {max(need, MIN_PATIENTS)} patients are needed")
    n_classes = int(y.max()) + 1
    counts = class_patients(y, groups)[0].sum(axis=0)
    if counts.min() < need:
        c = int(counts.argmin())
        raise DataError(
            f"only {int(counts[c])} patient(s) have an image of class {c}; at least {need} patients of each class "
            f"are needed so that train, validation and test (fractions {fractions}) all hold every class; add "
            "patients or change the fractions")
    strata = _pooled_strata(label, len(fractions))  # grouped_partition needs one patient per part
    parts: list[list[np.ndarray]] = [[], [], []]
    for c in np.unique(strata):
        rows = np.flatnonzero(strata[inverse] == c)
        for k, part in enumerate(grouped_partition(groups[rows], fractions, random_state=random_state)):
            parts[k].append(rows[part])
    out = tuple(np.sort(np.concatenate(p)) for p in parts)
    for name, idx in zip(("train", "validation", "test"), out):
        absent = sorted(set(range(n_classes)) - set(np.unique(y[idx]).tolist()))
        if absent:
            raise DataError(f"the {name} partition lacks class code(s) {absent} with seed {random_state} (their "
                            "images are in too few patients); add patients of those classes or use other fractions")
    return out  # type: ignore[return-value]


def partition(y: np.ndarray, groups: np.ndarray, task: str, fractions: tuple[float, float, float],
              random_state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Patient-grouped train / validation / test rows; a multi-class task is stratified by the patients' classes.

    Raises
    ------
    DataError
        Too few patients, or too few patients of a class.

    Examples
    --------
    >>> y = np.tile([0, 1, 2], 20)
    >>> tr, va, te = partition(y, np.arange(60), "multiclass", (0.6, 0.2, 0.2), 0)
    >>> len(tr) + len(va) + len(te), sorted(set(y[va].tolist()))
    (60, [0, 1, 2])
    """
    if task != MULTICLASS:
        return patient_partition(y, groups, task, fractions, random_state)
    return _multiclass_partition(y, groups, fractions, random_state)


def folds(y: np.ndarray, groups: np.ndarray, task: str, n_splits: int,
          random_state: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Patient-grouped inner folds; for a multi-class task stratified by class, at most one per patient of the rarest.

    Examples
    --------
    >>> f = folds(np.tile([0, 1, 2], 10), np.arange(30), "multiclass", 3, 0)
    >>> len(f), sum(len(val) for _, val in f)
    (3, 30)
    """
    if task != MULTICLASS:
        return inner_folds(y, groups, task, n_splits, random_state)
    from crslib.splits import stratified_group_kfold

    k = min(n_splits, *(np.unique(groups[y == c]).size for c in np.unique(y)))
    if k < 2:
        return []
    fold = stratified_group_kfold(y, groups, k, random_state)
    return [(np.flatnonzero(fold != i), np.flatnonzero(fold == i)) for i in range(k)]


def _n_classes(y: np.ndarray) -> int:
    return int(y.max()) + 1


def _linear_proba(value: float, Z_fit: np.ndarray, y_fit: np.ndarray, Z: np.ndarray, n_classes: int) -> np.ndarray:
    with warnings.catch_warnings():
        from sklearn.exceptions import ConvergenceWarning

        warnings.simplefilter("ignore", ConvergenceWarning)
        model = _probe_linear_head("classification", value).fit(Z_fit, y_fit)
    return class_proba(model, Z, n_classes)


def _multiclass_linear(Z, y, tr, inner, seed=None, *, fold_features=None, param=None, score=None):
    """Multinomial logistic regression, C by inner-CV macro AUROC: (probabilities, ``"C=.."``, inner score)."""
    k = _n_classes(y)
    best, inner_score = _DEFAULT_PARAM["linear_classification"], float("nan")
    if param is not None:
        best = param
    elif inner:
        yt = y[tr]
        scores = []
        for value in _C_GRID:
            oof = np.zeros((yt.size, k))
            for i, (fit, val) in enumerate(inner):
                Zt = Z[tr] if fold_features is None else fold_features[i]
                oof[val] = _linear_proba(value, Zt[fit], yt[fit], Zt[val], k)
            scores.append(score(yt, oof) if score else primary_score(MULTICLASS, yt, oof))
        if np.isfinite(scores).any():
            i = int(np.nanargmax(scores))
            best, inner_score = _C_GRID[i], float(scores[i])
    return _linear_proba(best, Z[tr], y[tr], Z, k), f"C={best:g}", inner_score


def _multiclass_knn(Z, y, tr, inner, seed=None, *, fold_features=None, param=None, score=None):
    """Class shares among the k nearest training rows, k by inner-CV macro AUROC (or ``score``)."""
    onehot = np.eye(_n_classes(y))[y]
    return fit_knn_head(Z, y, tr, inner, MULTICLASS, targets=onehot, fold_features=fold_features, param=param,
                        score=score or (lambda truth, pred: primary_score(MULTICLASS, truth, pred)))


def _multiclass_mlp(Z, y, tr, inner, seed=0, *, fold_features=None, param=None, score=None):
    """MLP classifier with the fixed settings of the binary head (no inner CV)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = make_pipeline(StandardScaler(), MLPClassifier(**_MLP_OPTIONS, random_state=seed)).fit(Z[tr], y[tr])
    return class_proba(model, Z, _n_classes(y)), "hidden=64", float("nan")


_HEADS = {"linear": _multiclass_linear, "knn": _multiclass_knn, "mlp": _multiclass_mlp}


def head(name: str, Z: np.ndarray, y: np.ndarray, tr: np.ndarray, inner: list, task: str, seed: int, *,
         fold_features: list[np.ndarray] | None = None, param: float | None = None, score=None):
    """Fit one head on the training rows ``tr``: (prediction for every row, hyperparameter, inner-CV score).

    A multi-class prediction is an (n_rows, k) array of class probabilities;
    other tasks go to :func:`crslib.probes.fit_head`. ``fold_features`` and
    ``param`` as there: per inner fold the training rows' features reduced
    on that fold's fitting rows, a fixed hyperparameter value (no inner
    CV), and ``score(y, pred)`` (higher is better) that ranks the inner-CV
    settings (default: the task's primary metric).
    """
    if name not in _HEADS:
        raise InputError(f"unknown head {name!r}; choose {', '.join(_HEADS)}")
    if task != MULTICLASS:
        return fit_head(name, Z, y, tr, inner, task, seed, fold_features=fold_features, param=param, score=score)
    return _HEADS[name](Z, y, tr, inner, seed, fold_features=fold_features, param=param, score=score)
