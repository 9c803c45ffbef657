"""Patient-grouped splits and folds: which rows go where.

The one home of every way ``crslib`` divides images into parts without
putting a patient in two of them:

- :func:`grouped_partition` splits by whole groups, aiming at shares of the
  *groups* (patients); :func:`patient_partition` applies it per class for the
  train / validation / test partitions of the representation-risk workflow
  (:func:`crslib.risk.outer_partition`), and :func:`min_patients` says how
  many patients that needs.
- :func:`grouped_split` splits by whole groups, aiming at shares of the
  *rows* (images), drawing from a caller's random generator
  (:func:`crslib.transfer.transfer_sweep`).
- :func:`stratified_group_kfold` assigns cross-validation folds exactly as
  scikit-learn's ``StratifiedGroupKFold(shuffle=True)`` does, fast enough for
  permutation tests; :func:`grouped_folds` adds the checks of the audits and
  :func:`inner_folds` the inner cross-validation of the representation-risk
  heads.
- :func:`check_pool_and_test` and :func:`pool_test_masks` read an official
  split column as a training pool and a test split (the audits of study 2).

Everything is pure and seeded: the same inputs give the same parts.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import pandas as pd

from crslib.errors import DataError, InputError

__all__ = [
    "MIN_PATIENTS",
    "grouped_partition",
    "grouped_split",
    "min_patients",
    "patient_partition",
    "stratified_group_kfold",
    "grouped_folds",
    "inner_folds",
    "check_pool_and_test",
    "pool_test_masks",
]

#: Fewest patients :func:`patient_partition` accepts (per class for classification
#: it also needs enough patients to fill every partition).
MIN_PATIENTS = 10


# --------------------------------------------------------------------------- partitions


def grouped_partition(groups: Any, fractions: Sequence[float], *, random_state: int = 0) -> list[np.ndarray]:
    """Split row indices into disjoint parts by whole groups (patients).

    The groups are shuffled with ``random_state`` and cut at the shares
    ``fractions`` of the *number of groups*; every part gets at least one
    group.

    Parameters
    ----------
    groups : array-like of shape (n_samples,)
        Group label per row; all rows of a group land in the same part.
    fractions : sequence of float
        Relative share of groups per part, e.g. ``(0.5, 0.25, 0.25)``.
    random_state : int
        Seed of the group shuffle.

    Returns
    -------
    list of ndarray
        Row indices of each part, in ascending order.

    Raises
    ------
    InputError
        A missing group id (NaN or None), fractions that are negative, not
        finite or sum to 0, or fewer groups than parts.

    Examples
    --------
    >>> parts = grouped_partition([0, 0, 1, 1, 2, 2, 3, 3], (0.5, 0.5))
    >>> sorted(len(p) for p in parts)
    [4, 4]
    """
    groups = np.asarray(groups)
    missing = pd.isna(groups)
    if missing.any():
        # np.unique keeps a NaN id that np.isin never matches: its part would come out empty
        raise InputError(
            f"groups has {int(missing.sum())} missing patient id(s) (NaN or None) among {groups.size} rows; "
            "give every row its patient id, or drop those rows before splitting"
        )
    rng = np.random.default_rng(random_state)
    unique = np.unique(groups)
    shares = np.asarray(fractions, dtype=float)
    if not (np.isfinite(shares).all() and (shares >= 0).all() and shares.sum() > 0):
        raise InputError(
            f"fractions must be non-negative numbers with a positive sum, got {fractions!r} ({len(unique)} "
            "patients); pass relative shares such as (0.6, 0.2, 0.2)"
        )
    if len(unique) < len(fractions):
        raise InputError(
            f"fractions {tuple(fractions)!r} need at least {len(fractions)} patients (one per part), "
            f"found {len(unique)}; add patients or pass fewer fractions"
        )
    order = rng.permutation(unique)
    bounds = np.round(np.cumsum(fractions) / np.sum(fractions) * len(order)).astype(int)
    parts, start = [], 0
    for i, end in enumerate(bounds):
        # at least one group per part, and one left for each part still to come
        end = min(max(end, start + 1), len(order) - (len(bounds) - 1 - i))
        members = set(order[start:end].tolist())
        parts.append(np.flatnonzero(np.isin(groups, list(members))))
        start = end
    return parts


def grouped_split(groups: Any, fractions: Sequence[float], rng: np.random.Generator) -> list[np.ndarray]:
    """Split rows into parts by whole groups, aiming at shares of the rows.

    The groups (in order of first appearance) are shuffled with ``rng``; a
    group goes to the part whose cumulative row share holds the middle of
    the group's rows. Unlike :func:`grouped_partition`, a part can be empty
    and the shares are of images, not of patients.

    Parameters
    ----------
    groups : array-like of shape (n_samples,)
        Patient id per row (no missing values).
    fractions : sequence of float
        Share of rows per part, summing to 1.
    rng : numpy.random.Generator
        Source of the shuffle (the caller may keep drawing from it).

    Returns
    -------
    list of ndarray
        Row indices of each part, in ascending order.

    Raises
    ------
    InputError
        A missing patient id.

    Examples
    --------
    >>> parts = grouped_split(np.repeat(np.arange(20), 2), (0.5, 0.5), np.random.default_rng(0))
    >>> [len(p) for p in parts]
    [20, 20]
    """
    codes, uniques = pd.factorize(pd.Series(groups))
    if (codes < 0).any():
        raise InputError("groups has missing patient ids; give every image a patient")
    order = rng.permutation(len(uniques))
    sizes = np.bincount(codes, minlength=len(uniques))[order]
    cum = np.cumsum(sizes) / sizes.sum()
    bounds = np.cumsum(fractions)[:-1]
    part_of_group = np.empty(len(uniques), dtype=int)
    part_of_group[order] = np.searchsorted(bounds, cum - sizes / sizes.sum() / 2, side="right")
    parts = [np.flatnonzero(part_of_group[codes] == p) for p in range(len(fractions))]
    return parts


@lru_cache(maxsize=64)
def min_patients(fractions: tuple[float, float, float]) -> int:
    """Fewest patients that fill every part of :func:`grouped_partition` (and at least 2 training patients).

    Parameters
    ----------
    fractions : tuple of 3 float
        Shares of patients in train, validation and test (hashable: a tuple).

    Returns
    -------
    int

    Examples
    --------
    >>> min_patients((0.6, 0.2, 0.2))
    4
    """
    for m in range(3, 100_000):
        parts = grouped_partition(np.arange(m), fractions, random_state=0)
        if all(p.size > 0 for p in parts) and parts[0].size >= 2:
            return m
    raise InputError(f"fractions {fractions} leave a partition empty for any number of patients")  # pragma: no cover


def patient_partition(y: np.ndarray, groups: np.ndarray, task: str, fractions: tuple[float, float, float],
                      random_state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Patient-grouped train / validation / test row indices (inputs already checked).

    For classification the patients are stratified by their label (1 when
    any of their images is positive) and each stratum is split by
    :func:`grouped_partition` with the same fractions, so that every part
    holds both classes; regression targets are split without strata. The
    public, checked entry point is :func:`crslib.risk.outer_partition`.

    Parameters
    ----------
    y : ndarray of shape (n_images,)
        0/1 labels (classification) or a continuous target.
    groups : ndarray of shape (n_images,)
        Patient id per image.
    task : {"classification", "regression"}
    fractions : tuple of 3 float
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
        Fewer than :data:`MIN_PATIENTS` (or :func:`min_patients`) patients,
        too few patients of a class, or a part with a constant target.

    Examples
    --------
    >>> y = np.tile([0, 1], 20)
    >>> tr, va, te = patient_partition(y, np.arange(40), "classification", (0.6, 0.2, 0.2), 0)
    >>> len(tr) + len(va) + len(te), sorted(set(y[te].tolist()))
    (40, [0, 1])
    """
    need = min_patients(fractions)
    patients, inverse = np.unique(groups, return_inverse=True)
    inverse = inverse.ravel()
    if patients.size < max(need, MIN_PATIENTS):
        raise DataError(
            f"{patients.size} patients are too few for patient-grouped train / validation / test partitions "
            f"(fractions {fractions}); at least {max(need, MIN_PATIENTS)} patients are needed"
        )
    if task == "classification" and not np.isin(y, (0, 1)).all():
        # any other value would fall in neither stratum and its patients would silently vanish
        raise InputError(f"classification labels must be 0/1 here, got values {sorted(set(np.unique(y).tolist()))}")
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
            for k, part in enumerate(grouped_partition(groups[rows], fractions, random_state=random_state)):
                parts[k].append(rows[part])
        out = tuple(np.sort(np.concatenate(p)) for p in parts)
    else:
        out = tuple(grouped_partition(groups, fractions, random_state=random_state))
    for name, idx in zip(("train", "validation", "test"), out):
        if idx.size == 0:  # pragma: no cover - excluded by the patient counts above
            raise DataError(f"the {name} partition is empty; at least {need} patients are needed")
        if np.unique(y[idx]).size < 2:
            raise DataError(
                f"the {name} partition holds a constant target ({y[idx].tolist()[0]!r}) with seed {random_state}; "
                "the metrics are undefined there: add patients or use other fractions"
            )
    return out  # type: ignore[return-value]


# --------------------------------------------------------------------------- folds


def stratified_group_kfold(y: np.ndarray, groups: np.ndarray, n_splits: int, random_state: int) -> np.ndarray:
    """Fold of each row, as ``StratifiedGroupKFold(n_splits, shuffle=True, random_state=random_state)`` assigns them.

    Same algorithm and same random draws as scikit-learn's, with the
    candidate folds of each group scored at once instead of in a Python loop:
    the permutation tests of the audits call it hundreds of times. No checks
    (see :func:`grouped_folds`).

    Parameters
    ----------
    y : ndarray of shape (n_rows,)
        Class per row.
    groups : ndarray of shape (n_rows,)
        Group (patient) per row; all rows of a group share a fold.
    n_splits : int
    random_state : int
        Seed of the group shuffle (a ``numpy.random.RandomState`` seed).

    Returns
    -------
    ndarray of int64, shape (n_rows,)
        Fold index in ``0 .. n_splits - 1``.

    Examples
    --------
    >>> folds = stratified_group_kfold(np.tile([0, 1], 10), np.arange(20) // 2, 2, 0)
    >>> np.bincount(folds).tolist()
    [10, 10]
    """
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


def grouped_folds(y: np.ndarray, groups: np.ndarray, n_splits: int, random_state: int, what: str) -> np.ndarray:
    """Fold of each row for the audits' patient-grouped, stratified cross-validation.

    :func:`stratified_group_kfold` on the groups as text, after checking
    that every class has at least ``n_splits`` patients and that no fold's
    training rows lack a class.

    Parameters
    ----------
    y : ndarray of shape (n_rows,)
        Class code per row.
    groups : array-like of shape (n_rows,)
        Patient id per row.
    n_splits : int
    random_state : int
    what : str
        Name of the calling audit, for the error messages.

    Returns
    -------
    ndarray of int64, shape (n_rows,)

    Raises
    ------
    InputError
        Too few patients of a class for ``n_splits`` folds.

    Examples
    --------
    >>> y = np.tile([0, 1], 20)
    >>> folds = grouped_folds(y, np.arange(40) // 2, 4, 0, "example")
    >>> sorted(set(folds.tolist()))
    [0, 1, 2, 3]
    """
    group_text = np.array([str(g) for g in groups], dtype=object)
    for c in np.unique(y):
        n_groups = len(set(group_text[y == c].tolist()))
        if n_groups < n_splits:
            raise InputError(
                f"{what}: class {c.item()!r} has only {n_groups} patient(s), fewer than n_splits={n_splits}; "
                f"pass a smaller n_splits (at least 2) or audit more images"
            )
    folds = stratified_group_kfold(np.asarray(y), group_text, n_splits, random_state)
    for k in range(n_splits):
        train = folds != k
        if len(np.unique(y[train])) < len(np.unique(y)):
            raise InputError(
                f"{what}: fold {k} leaves a class out of its training rows (too few patients per class); "
                "pass a smaller n_splits"
            )
    return folds


def inner_folds(y: np.ndarray, groups: np.ndarray, task: str, n_splits: int,
                random_state: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Patient-grouped (fit, validation) row indices for an inner cross-validation.

    Classification: :func:`stratified_group_kfold` (scikit-learn's
    ``StratifiedGroupKFold(shuffle=True)`` assignment) with at most as many
    folds as the rarer class has patients; regression:
    ``GroupKFold(shuffle=True)`` with at most one fold per patient.

    Parameters
    ----------
    y : ndarray of shape (n_rows,)
        0/1 labels or a continuous target.
    groups : ndarray of shape (n_rows,)
        Patient id per row.
    task : {"classification", "regression"}
    n_splits : int
        Folds wanted.
    random_state : int
        Seed of the fold assignment.

    Returns
    -------
    list of (ndarray, ndarray)
        ``(fit_idx, val_idx)`` per fold; empty when fewer than 2 folds fit.

    Examples
    --------
    >>> folds = inner_folds(np.tile([0, 1], 10), np.arange(20), "classification", 3, 0)
    >>> len(folds), sum(len(val) for _, val in folds)
    (3, 20)
    """
    if task == "classification":
        k = min(n_splits, *(np.unique(groups[y == c]).size for c in (0, 1)))
        if k < 2:
            return []
        fold = stratified_group_kfold(y, groups, k, random_state)
        return [(np.flatnonzero(fold != i), np.flatnonzero(fold == i)) for i in range(k)]
    from sklearn.model_selection import GroupKFold

    k = min(n_splits, np.unique(groups).size)
    if k < 2:
        return []
    cv = GroupKFold(n_splits=k, shuffle=True, random_state=random_state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return [(a, b) for a, b in cv.split(np.zeros(y.size), y, groups)]


# --------------------------------------------------------------------------- official splits


def check_pool_and_test(pool: Any, test: Any) -> tuple[tuple[str, ...], str]:
    """The training pool as a tuple of split names, and the test split's name.

    Parameters
    ----------
    pool : str or sequence of str
        Split name(s) forming the training pool.
    test : str
        The official test split; not in ``pool``.

    Returns
    -------
    pool : tuple of str
    test : str

    Raises
    ------
    InputError
        A name is not a string, or the test split is in the pool.

    Examples
    --------
    >>> check_pool_and_test("train", "test")
    (('train',), 'test')
    """
    pool_t = (pool,) if isinstance(pool, str) else tuple(pool)
    if not pool_t or not all(isinstance(p, str) for p in pool_t):
        raise InputError(f"pool must be a split name or a sequence of split names, got {pool!r}")
    if not isinstance(test, str):
        raise InputError(f"test must be a split name, got {test!r}")
    if test in pool_t:
        raise InputError(f"the test split {test!r} is also in pool={pool_t}; the pool must exclude it")
    return pool_t, test


def pool_test_masks(split: Any, pool: tuple[str, ...], test: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the training pool and of the official test split.

    Parameters
    ----------
    split : array-like of shape (n_rows,)
        Split name per row (compared as text).
    pool : tuple of str
    test : str

    Returns
    -------
    in_pool, in_test : ndarray of bool

    Raises
    ------
    DataError
        No row in the test split, or none in the pool.

    Examples
    --------
    >>> in_pool, in_test = pool_test_masks(np.array(["train", "val", "test"]), ("train", "val"), "test")
    >>> in_pool.tolist(), in_test.tolist()
    ([True, True, False], [False, False, True])
    """
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
