"""Recall of an approximate neighbour search and the overlap error it can cause.

:func:`knn_recall` compares approximate neighbours with the exact ones on a
sample of queries (the exact search of a sample costs ``sample x N``, not
``N x N``) and gives the recall a Wilson interval; :func:`overlap_error_bound`
turns the recalls of two models into a guaranteed bound on the error of
their mean kNN overlap. :func:`crslib.ann.knn_search` uses both, and also
re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crslib._validation import check_positive_int, check_random_state, check_same_rows
from crslib.errors import InputError
from crslib.neighbors import _check_index_array, _intersections, knn_indices

__all__ = ["RecallResult", "knn_recall", "overlap_error_bound"]

_Z95 = 1.959963984540054  # two-sided 95% standard normal quantile


@dataclass(frozen=True)
class RecallResult:
    """Share of the exact k nearest neighbours an approximate search found.

    Attributes
    ----------
    recall : float
        Mean over the sampled queries of ``|approx(i) & exact(i)| / k``.
    ci_low, ci_high : float
        Interval for the recall over all N rows at ``confidence`` (see
        :func:`knn_recall`); ``[recall, recall]`` when every row was sampled.
    n_sample : int
        Queries compared.
    k : int
    per_query : ndarray of shape (n_sample,)
        Recall of each sampled query.
    rows : ndarray of shape (n_sample,)
        The sampled row indices (ascending).
    n : int
        Rows in the data.
    confidence : float
    """

    recall: float
    ci_low: float
    ci_high: float
    n_sample: int
    k: int
    per_query: np.ndarray = field(repr=False)
    rows: np.ndarray = field(repr=False)
    n: int = 0
    confidence: float = 0.95


def _check_rows(rows: Any, n: int) -> np.ndarray:
    """Row indices as int64, each in [0, n)."""
    arr = np.asarray(rows)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError(f"exclude_rows must be a 1-D array of row indices, got shape {arr.shape}, dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= n):
        raise InputError(f"exclude_rows must lie in [0, {n}), got values from {arr.min()} to {arr.max()}")
    return arr


def _recall_interval(p: float, n_sample: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval for a mean of [0, 1] values, finite-population corrected."""
    if n_sample >= n:
        return p, p  # every row compared: no sampling error
    # Sampling without replacement: the variance shrinks by (N - n)/(N - 1),
    # i.e. the sample counts as n (N - 1)/(N - n) draws with replacement.
    m = n_sample * (n - 1) / (n - n_sample)
    z2 = _Z95**2
    centre = (p + z2 / (2 * m)) / (1 + z2 / m)
    half = _Z95 * np.sqrt(p * (1 - p) / m + z2 / (4 * m * m)) / (1 + z2 / m)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def knn_recall(
    X: Any,
    approx_indices: Any,
    *,
    k: int | None = None,
    metric: str = "cosine",
    exclude_groups: Any = None,
    sample: int = 20_000,
    random_state: int | None = 0,
    exclude_rows: Any = None,
) -> RecallResult:
    """Recall@k of approximate neighbours against the exact ones, on a sample of queries.

    The exact neighbours of the sampled rows come from
    :func:`knn_indices` with ``queries=``: the cost is ``sample x N``, not
    ``N x N``. Use the same ``metric`` and ``exclude_groups`` as the
    approximate search, or correct neighbours count as misses.

    Parameters
    ----------
    X : array-like of shape (N, d)
        The embeddings that were searched.
    approx_indices : array-like of shape (N, k_approx), integer
        Approximate neighbours, closest first (e.g. from
        :func:`approximate_knn_indices`).
    k : int, optional
        Compare the first k columns; default all of them.
    metric : {"cosine", "ip", "euclidean"}
    exclude_groups : array-like of shape (N,), optional
    sample : int
        Queries to compare, drawn without replacement; all rows when
        ``sample >= N``.
    random_state : int or None
        Seed of the query sample.
    exclude_rows : array-like of int, optional
        Rows never drawn as queries, e.g. those a search was tuned on
        (:func:`crslib.ann.knn_search` with ``target_recall``), so that the
        recall is measured on held-out queries. The sample is then drawn
        from the other rows, and the interval still describes all N rows.

    Returns
    -------
    RecallResult
        ``recall`` is the mean over sampled queries of
        ``|approx(i) & exact(i)| / k``. The 95% interval is a Wilson score
        interval: the per-query recalls lie in [0, 1], so their variance is
        at most ``p (1 - p)``, which the interval uses in place of the
        sample variance. That is conservative, and a sample in which every
        query happens to be perfect does not claim a zero-width interval. A
        finite-population correction applies (sampling without replacement),
        so when all rows are compared the interval is the recall itself.

    Raises
    ------
    InputError
        Shapes that do not match, ``k`` larger than the columns given, or
        the errors of :func:`knn_indices`.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(500, 8))
    >>> knn_recall(X, knn_indices(X, k=5)).recall
    1.0
    """
    A = _check_index_array(approx_indices, "approx_indices")
    n = check_same_rows({"X": X, "approx_indices": A})
    k = A.shape[1] if k is None else check_positive_int(k, "k")
    if k > A.shape[1]:
        raise InputError(f"k={k} exceeds the {A.shape[1]} neighbour columns of approx_indices")
    sample = check_positive_int(sample, "sample")
    seed = check_random_state(random_state)
    pool = np.arange(n, dtype=np.int64)
    if exclude_rows is not None:
        pool = np.setdiff1d(pool, _check_rows(exclude_rows, n))
        if pool.size == 0:
            raise InputError("exclude_rows leaves no row to sample")
    if sample >= pool.size:
        rows = pool
    else:
        rows = np.sort(np.random.default_rng(seed).choice(pool, size=sample, replace=False)).astype(np.int64)
    exact = knn_indices(X, k=k, metric=metric, exclude_groups=exclude_groups, queries=rows)
    per_query = _intersections(A[rows, :k], exact) / k
    recall = float(per_query.mean())
    low, high = _recall_interval(recall, rows.size, n)
    return RecallResult(
        recall=recall, ci_low=low, ci_high=high, n_sample=int(rows.size), k=k,
        per_query=per_query, rows=rows, n=n,
    )


def _recall_value(recall: Any, name: str) -> float:
    if isinstance(recall, RecallResult):
        return float(recall.ci_low)
    if isinstance(recall, bool) or not isinstance(recall, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a recall in [0, 1] or a RecallResult, got {recall!r}")
    value = float(recall)
    if not 0.0 <= value <= 1.0:
        raise InputError(f"{name}={value} must lie in [0, 1]")
    return value


def overlap_error_bound(recall_a: float | RecallResult, recall_b: float | RecallResult) -> float:
    """Largest possible error of a mean kNN overlap computed from approximate neighbours.

    ``|mean approximate overlap - mean exact overlap| <= (1 - recall_a) + (1 - recall_b)``,
    capped at 1 (an overlap lies in [0, 1]).

    Why: for one image let A, B be the exact neighbour lists of models a and
    b and A', B' the approximate ones, all of size k, and
    ``miss_a = k - |A' & A|``, ``miss_b = k - |B' & B|``. An element of
    ``A' & B'`` is in ``A & B``, or in ``A' - A`` (at most miss_a of them), or
    in ``A - B`` and so in ``B' - B`` (at most miss_b). Hence
    ``|A' & B'| <= |A & B| + miss_a + miss_b``, and by the same argument the
    other way round ``|A & B| <= |A' & B'| + miss_a + miss_b``. The
    per-image overlap (divided by k) thus changes by at most
    ``(miss_a + miss_b) / k``, and averaging over images gives the bound,
    since the mean of ``miss / k`` is one minus the recall. It holds for any
    data, with no assumption on which neighbours are missed; it is tight
    only when every miss changes the overlap.

    Parameters
    ----------
    recall_a, recall_b : float or RecallResult
        Recall@k of each model's neighbours over all images (1.0 for an
        exact search). For a :class:`RecallResult`, measured on a sample,
        the lower end of its 95% interval is used (a 97.5% one-sided lower
        bound of the recall), which makes the result a conservative upper
        bound of the error rather than an estimate: it holds with at least
        95% confidence even when both recalls were sampled.

    Returns
    -------
    float

    Examples
    --------
    >>> round(overlap_error_bound(0.97, 0.95), 6)
    0.08
    >>> overlap_error_bound(1.0, 1.0)
    0.0
    """
    a = _recall_value(recall_a, "recall_a")
    b = _recall_value(recall_b, "recall_b")
    return float(min(1.0, (1.0 - a) + (1.0 - b)))
